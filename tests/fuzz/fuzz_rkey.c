/* SPDX-License-Identifier: MIT */
/*
 * fuzz_rkey.c - libFuzzer harness: remote-key and address blobs, which
 * every rank takes from the others at the rendezvous and in READY messages.
 * The first byte picks the decoder: the remote key of tcp, shm, the mixed
 * shm+tcp and (when built and a device is usable) verbs, or the socket
 * address blob.  Nothing may crash; a key or address that decodes must
 * re-encode to the same bytes where the format makes that possible.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "fastreduce.h"
#include "transport.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NTP 4
static const struct fr_tp_ops *ops[NTP];
static struct fr_tp *tps[NTP];

static void open_all(void)
{
	static int done;
	const struct fr_tp_ops *all[NTP] = { &fr_tcp_ops, &fr_shm_ops,
					     &fr_mux_ops,
#ifdef FR_HAVE_VERBS
					     &fr_verbs_ops
#else
					     NULL
#endif
	};

	if (done)
		return;
	done = 1;
	for (int i = 0; i < NTP; i++) {
		struct fr_tp_params p;
		uint8_t addr[FR_TP_ADDR_MAX];
		size_t alen = sizeof(addr);
		char err[256];

		if (!all[i])
			continue;
		memset(&p, 0, sizeof(p));
		p.size = sizeof(p);
		p.rank = 0;
		p.job_nonce = 42;
		p.local_ip = "127.0.0.1";
		p.timeout_ms = 1000;
		p.errbuf = err;
		p.errlen = sizeof(err);
		if (all[i]->open(&p, &tps[i], addr, &alen) == 0)
			ops[i] = all[i];
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fr_tp_rkey k;
	unsigned int which;

	if (!size)
		return 0;
	open_all();
	which = data[0] % (NTP + 1);
	data++;
	size--;
	if (which == NTP) {
		struct sockaddr_storage sa, sb;
		socklen_t sl, sl2;
		uint8_t again[FR_SOCKADDR_BLOB_LEN];
		uint8_t magic = size ? data[0] : 0;

		if (fr_sockaddr_decode(data, size, magic, &sa, &sl))
			return 0;
		if (sa.ss_family != AF_INET && sa.ss_family != AF_INET6)
			abort();
		fr_sockaddr_encode(again, magic, &sa);
		if (fr_sockaddr_decode(again, sizeof(again), magic, &sb, &sl2) ||
		    sl != sl2 || memcmp(&sa, &sb, sl))
			abort();
		return 0;
	}
	if (!ops[which])
		return 0;
	memset(&k, 0, sizeof(k));
	(void)ops[which]->unpack_rkey(tps[which], data, size, &k);
	/* and a key that is too short or NULL is refused, never read */
	if (ops[which]->unpack_rkey(tps[which], NULL, size, &k) == 0 ||
	    ops[which]->unpack_rkey(tps[which], data, 0, &k) == 0)
		abort();
	return 0;
}
