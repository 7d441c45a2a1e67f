/* SPDX-License-Identifier: MIT */
/*
 * fuzz_boot.c - libFuzzer harness: the rendezvous messages (bootstrap.c)
 * that rank 0 reads from any process that connects to its port, and that
 * every rank reads back from rank 0.  The first byte picks the message:
 *   0 the frame header, 1 HELLO, 2 WELCOME (for 1..16 ranks), 3 REJECT.
 * Nothing may crash or overrun; a HELLO that parses must build back to the
 * same bytes (so what rank 0 relays is what the rank sent); a REJECT's
 * text must come out printable and terminated, and its code negative.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "fastreduce.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct fr_boot_card cards[16];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t buf[FR_BOOT_HDR + 8 + 3 * 2 + FR_BOOT_TOKEN_MAX +
			   FR_BOOT_CONFIG_MAX + FR_BOOT_CARD_MAX];
	const uint8_t *p = data + 1;
	size_t len = size ? size - 1 : 0;

	if (!size)
		return 0;
	switch (data[0] % 4) {
	case 0: {
		uint16_t type;
		uint32_t plen;

		if (!fr_boot_parse_header(p, len, &type, &plen) &&
		    plen > FR_BOOT_PAYLOAD_MAX)
			abort();
		break;
	}
	case 1: {
		struct fr_boot_hello h;
		int n;

		if (fr_boot_parse_hello(p, len, &h))
			break;
		if (h.token[h.token_len] || h.config[h.config_len])
			abort();
		n = fr_boot_build_hello(&h, buf, sizeof(buf));
		if (n != (int)(FR_BOOT_HDR + len) ||
		    memcmp(buf + FR_BOOT_HDR, p, len))
			abort();
		break;
	}
	case 2: {
		uint32_t nranks = len ? (uint32_t)(p[0] % 16) + 1 : 1;
		uint64_t nonce;

		if (len)
			p++, len--;
		if (!fr_boot_parse_welcome(p, len, nranks, &nonce, cards))
			for (uint32_t i = 0; i < nranks; i++)
				if (cards[i].len > FR_BOOT_CARD_MAX)
					abort();
		break;
	}
	case 3: {
		char msg[64];
		int32_t code;

		if (fr_boot_parse_reject(p, len, &code, msg, sizeof(msg)))
			break;
		if (code >= 0 || strlen(msg) >= sizeof(msg))
			abort();
		for (const char *c = msg; *c; c++)
			if (*c < 0x20 || *c > 0x7e)
				abort();
		break;
	}
	}
	return 0;
}
