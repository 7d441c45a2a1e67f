/* SPDX-License-Identifier: MIT */
/*
 * fuzz_msg.c - libFuzzer harness: the mailbox message header (peer.c), which
 * every peer writes into our memory.  Whatever the bytes, decoding must not
 * crash or read past the slot, must refuse a payload length beyond the
 * slot, and what it accepts must encode back to the same header bytes
 * (the codec is symmetric, so nothing is silently dropped or changed).
 * The same for the 16-byte header of small messages (first byte 0xc1).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "peer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t hdr[FR_MSG_HDR], again[FR_MSG_HDR];
	struct fr_msg m;
	size_t maxlen;

	if (size < 2)
		return 0;
	/* the first byte picks the slot's payload room */
	maxlen = (size_t)data[0] * 64;
	memset(hdr, 0, sizeof(hdr));
	memcpy(hdr, data + 1, size - 1 < sizeof(hdr) ? size - 1 : sizeof(hdr));
	if (fr_msg_decode(hdr, maxlen, &m))
		return 0;
	if (m.len > maxlen || m.type < FR_MSG_DATA || m.type > FR_MSG_TYPE_MAX)
		abort();
	if (m.hdr == FR_MSG_COMPACT) {
		/* a small message's header: it must fit the compact form
		 * again, with the same bytes */
		if (m.len > FR_MSG_COMPACT_MAX ||
		    !fr_msg_encode_compact(&m, hdr + FR_MSG_COMPACT, m.len,
					   again) ||
		    memcmp(hdr, again, FR_MSG_COMPACT + m.len))
			abort();
		return 0;
	}
	if (m.hdr != FR_MSG_HDR)
		abort();
	fr_msg_encode(&m, again);
	/* byte 9 is padding and bytes 56.. are reserved: the rest must match */
	hdr[9] = again[9];
	memcpy(hdr + 56, again + 56, sizeof(hdr) - 56);
	if (memcmp(hdr, again, sizeof(hdr)))
		abort();
	return 0;
}
