/* SPDX-License-Identifier: MIT */
/*
 * test_ring.c - the ring schedule arithmetic of src/ring.h, simulated
 * symbolically, the control message codec of src/ring.c, and the ring's
 * order over the nodes (src/topo.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "peer.h"
#include "ring.h"
#include "topo.h"

/* ---- chunks ------------------------------------------------------------------------ */

static void check_partition(size_t count, int n)
{
	size_t next = 0, base = count / (size_t)n, rem = count % (size_t)n;
	size_t mn = (size_t)-1, mx = 0;

	for (int c = 0; c < n; c++) {
		size_t off = 12345, cnt = 12345;

		fr_ring_chunk(count, n, c, &off, &cnt);
		if (off != next)
			fail_msg("count %zu n %d chunk %d: offset %zu, want %zu",
				 count, n, c, off, next);
		/* The first count % n chunks are the larger ones. */
		if (cnt != base + ((size_t)c < rem ? 1 : 0))
			fail_msg("count %zu n %d chunk %d: %zu elements, want %zu",
				 count, n, c, cnt,
				 base + ((size_t)c < rem ? 1 : 0));
		mn = cnt < mn ? cnt : mn;
		mx = cnt > mx ? cnt : mx;
		next = off + cnt;
		assert_true(next <= count);
	}
	if (next != count)
		fail_msg("count %zu n %d: chunks cover %zu elements", count, n,
			 next);
	assert_true(mx - mn <= 1);
}

static void test_chunk_partition(void **state)
{
	(void)state;
	for (int n = 1; n <= 17; n++) {
		const size_t counts[] = { 0,
					  1,
					  (size_t)n - 1,
					  (size_t)n,
					  (size_t)n + 1,
					  2 * (size_t)n + 1,
					  101,
					  1048577,
					  (size_t)1 << 40 };

		for (size_t i = 0; i < sizeof(counts) / sizeof(counts[0]); i++)
			check_partition(counts[i], n);
	}
	/* A few spot values. */
	size_t off, cnt;

	fr_ring_chunk(10, 3, 0, &off, &cnt);
	assert_int_equal(off, 0);
	assert_int_equal(cnt, 4);
	fr_ring_chunk(10, 3, 1, &off, &cnt);
	assert_int_equal(off, 4);
	assert_int_equal(cnt, 3);
	fr_ring_chunk(10, 3, 2, &off, &cnt);
	assert_int_equal(off, 7);
	assert_int_equal(cnt, 3);
	fr_ring_chunk(2, 4, 3, &off, &cnt);
	assert_int_equal(off, 2);
	assert_int_equal(cnt, 0);
}

static void test_mod(void **state)
{
	(void)state;
	for (int n = 1; n <= 9; n++)
		for (long a = -3L * n; a <= 3L * n; a++) {
			int m = fr_ring_mod(a, n);

			assert_true(m >= 0 && m < n);
			assert_true(((a - m) % n) == 0);
		}
	assert_int_equal(fr_ring_mod(-1, 5), 4);
	assert_int_equal(fr_ring_mod(-5, 5), 0);
	assert_int_equal(fr_ring_mod(-6, 5), 4);
	assert_int_equal(fr_ring_mod(7, 5), 2);
}

/* ---- the schedule, simulated ----------------------------------------------------------- */

#define NMAX 9

/*
 * held[r][c][s]: how many times rank r's buffer for chunk c includes the
 * contribution of rank s.  A rank starts with its own input (1 of itself);
 * the reduce-scatter adds, the all-gather overwrites.
 */
static int held[NMAX][NMAX][NMAX];

static void test_reduce_scatter(void **state)
{
	(void)state;
	for (int n = 1; n <= NMAX; n++) {
		int msg[NMAX][NMAX]; /* what rank r sends at this step */
		int chunk[NMAX];     /* and which chunk it is */

		memset(held, 0, sizeof(held));
		for (int r = 0; r < n; r++)
			for (int c = 0; c < n; c++)
				held[r][c][r] = 1;
		for (int k = 0; k < n - 1; k++) {
			/* Every rank sends at once... */
			for (int r = 0; r < n; r++) {
				chunk[r] = fr_ring_rs_send_chunk(r, k, n);
				assert_true(chunk[r] >= 0 && chunk[r] < n);
				memcpy(msg[r], held[r][chunk[r]],
				       sizeof(msg[r]));
			}
			/* ... and every rank receives from its previous one
			 * and adds its own input. */
			for (int q = 0; q < n; q++) {
				int from = (q + n - 1) % n;
				int c = fr_ring_rs_recv_chunk(q, k, n);

				if (c != chunk[from])
					fail_msg("n %d step %d: rank %d sends chunk %d, rank %d expects chunk %d",
						 n, k, from, chunk[from], q, c);
				/* Never counted twice: our own is not in. */
				assert_int_equal(msg[from][q], 0);
				for (int s = 0; s < n; s++)
					held[q][c][s] = msg[from][s] +
							(s == q ? 1 : 0);
			}
			/* What a rank receives at step k it sends at k+1. */
			if (k + 1 < n - 1)
				for (int r = 0; r < n; r++)
					assert_int_equal(
						fr_ring_rs_send_chunk(r, k + 1, n),
						fr_ring_rs_recv_chunk(r, k, n));
		}
		/* Each rank holds every contribution, once, of its chunk. */
		for (int r = 0; r < n; r++) {
			int o = fr_ring_owned_chunk(r, n);

			assert_true(o >= 0 && o < n);
			for (int s = 0; s < n; s++)
				if (held[r][o][s] != 1)
					fail_msg("n %d: rank %d owns chunk %d with %d contributions of rank %d",
						 n, r, o, held[r][o][s], s);
			/* The owned chunks are distinct. */
			for (int q = 0; q < r; q++)
				assert_int_not_equal(o, fr_ring_owned_chunk(q, n));
			/* The last chunk a rank receives is the one it owns. */
			if (n > 1)
				assert_int_equal(fr_ring_rs_recv_chunk(r, n - 2, n),
						 o);
		}
	}
}

static void test_all_gather(void **state)
{
	(void)state;
	for (int n = 1; n <= NMAX; n++) {
		bool have[NMAX][NMAX];
		int recvd[NMAX][NMAX];
		int chunk[NMAX];

		memset(have, 0, sizeof(have));
		memset(recvd, 0, sizeof(recvd));
		/* After the reduce-scatter each rank has its owned chunk. */
		for (int r = 0; r < n; r++)
			have[r][fr_ring_owned_chunk(r, n)] = true;
		for (int k = 0; k < n - 1; k++) {
			for (int r = 0; r < n; r++) {
				chunk[r] = fr_ring_ag_send_chunk(r, k, n);
				if (!have[r][chunk[r]])
					fail_msg("n %d step %d: rank %d sends chunk %d it does not have",
						 n, k, r, chunk[r]);
			}
			for (int q = 0; q < n; q++) {
				int from = (q + n - 1) % n;
				int c = fr_ring_ag_recv_chunk(q, k, n);

				if (c != chunk[from])
					fail_msg("n %d step %d: rank %d sends chunk %d, rank %d expects chunk %d",
						 n, k, from, chunk[from], q, c);
				assert_int_not_equal(c, fr_ring_owned_chunk(q, n));
				assert_false(have[q][c]);
				recvd[q][c]++;
			}
			for (int q = 0; q < n; q++)
				have[q][fr_ring_ag_recv_chunk(q, k, n)] = true;
			if (k + 1 < n - 1)
				for (int r = 0; r < n; r++)
					assert_int_equal(
						fr_ring_ag_send_chunk(r, k + 1, n),
						fr_ring_ag_recv_chunk(r, k, n));
		}
		for (int r = 0; r < n; r++) {
			if (n > 1)
				assert_int_equal(fr_ring_ag_send_chunk(r, 0, n),
						 fr_ring_owned_chunk(r, n));
			for (int c = 0; c < n; c++) {
				assert_true(have[r][c]);
				assert_int_equal(recvd[r][c],
						 c == fr_ring_owned_chunk(r, n) ?
							 0 :
							 1);
			}
		}
	}
}

/* Both phases end to end: every rank ends with every chunk fully reduced. */
static void test_allreduce_schedule(void **state)
{
	(void)state;
	for (int n = 1; n <= NMAX; n++) {
		int msg[NMAX][NMAX], chunk[NMAX];

		memset(held, 0, sizeof(held));
		for (int r = 0; r < n; r++)
			for (int c = 0; c < n; c++)
				held[r][c][r] = 1;
		for (int k = 0; k < n - 1; k++) {
			for (int r = 0; r < n; r++) {
				chunk[r] = fr_ring_rs_send_chunk(r, k, n);
				memcpy(msg[r], held[r][chunk[r]], sizeof(msg[r]));
			}
			for (int q = 0; q < n; q++) {
				int c = fr_ring_rs_recv_chunk(q, k, n);
				int from = (q + n - 1) % n;

				for (int s = 0; s < n; s++)
					held[q][c][s] =
						msg[from][s] + (s == q ? 1 : 0);
			}
		}
		for (int k = 0; k < n - 1; k++) {
			for (int r = 0; r < n; r++) {
				chunk[r] = fr_ring_ag_send_chunk(r, k, n);
				memcpy(msg[r], held[r][chunk[r]], sizeof(msg[r]));
			}
			for (int q = 0; q < n; q++) {
				int c = fr_ring_ag_recv_chunk(q, k, n);

				memcpy(held[q][c], msg[(q + n - 1) % n],
				       sizeof(msg[0]));
			}
		}
		for (int r = 0; r < n; r++)
			for (int c = 0; c < n; c++)
				for (int s = 0; s < n; s++)
					if (held[r][c][s] != 1)
						fail_msg("n %d: rank %d chunk %d has %d contributions of rank %d",
							 n, r, c, held[r][c][s], s);
	}
}

/* ---- segments and immediates ---------------------------------------------------------- */

static void test_nsegs(void **state)
{
	(void)state;
	assert_int_equal(fr_ring_nsegs(0, 1), 0);
	assert_int_equal(fr_ring_nsegs(0, 4096), 0);
	assert_int_equal(fr_ring_nsegs(1, 1), 1);
	assert_int_equal(fr_ring_nsegs(1, 4096), 1);
	assert_int_equal(fr_ring_nsegs(9, 3), 3);
	assert_int_equal(fr_ring_nsegs(10, 3), 4);
	assert_int_equal(fr_ring_nsegs(11, 10), 2);
	assert_int_equal(fr_ring_nsegs(131072, 131072), 1);
	assert_int_equal(fr_ring_nsegs(131073, 131072), 2);
	for (size_t seg = 1; seg <= 20; seg++)
		for (size_t cnt = 0; cnt <= 200; cnt++) {
			size_t s = fr_ring_nsegs(cnt, seg);

			/* Enough segments, and not one too many. */
			assert_true(s * seg >= cnt);
			assert_true(s == 0 || (s - 1) * seg < cnt);
		}
}

static void test_imm(void **state)
{
	static const uint32_t payloads[] = {0,	     1,	      0x7f,
					    0x12345, 0x0ffff, 0x0fffff};

	(void)state;
	for (uint32_t t = 0; t < 16; t++)
		for (size_t i = 0; i < sizeof(payloads) / sizeof(payloads[0]);
		     i++) {
			uint32_t imm = FR_IMM(t, payloads[i]);

			assert_int_equal(FR_IMM_TYPE(imm), t);
			assert_int_equal(FR_IMM_PAYLOAD(imm), payloads[i]);
			/* the shared endpoint's id bits stay clear */
			assert_int_equal(imm & FR_TP_IMM_ID_MASK, 0);
		}
	/* A payload wider than 20 bits never leaks into the id or the type. */
	assert_int_equal(FR_IMM_TYPE(FR_IMM(FR_IMM_CREDIT, 0xffffffffu)),
			 FR_IMM_CREDIT);
	assert_int_equal(FR_IMM_PAYLOAD(FR_IMM(FR_IMM_CREDIT, 0xffffffffu)),
			 0x000fffffu);
	assert_int_equal(FR_IMM(FR_IMM_CREDIT, 0xffffffffu) & FR_TP_IMM_ID_MASK,
			 0);
	assert_int_equal(FR_IMM_TYPE(FR_IMM(FR_IMM_AG, 0x10000005u)),
			 FR_IMM_AG);
	assert_int_equal(FR_IMM_PAYLOAD(FR_IMM(FR_IMM_AG, 0x10000005u)), 5);
	/* The types are distinct and fit in 4 bits. */
	const uint32_t types[] = { FR_IMM_MSG, FR_IMM_CREDIT, FR_IMM_RS,
				   FR_IMM_AG, FR_IMM_RCREDIT };
	for (int i = 0; i < 5; i++) {
		assert_true(types[i] > 0 && types[i] < 16);
		for (int j = i + 1; j < 5; j++)
			assert_int_not_equal(types[i], types[j]);
	}
	/* A reduce-scatter immediate: 12-bit serial, 8-bit slot. */
	for (uint32_t serial = 0; serial <= 0xfff; serial += 0x133)
		for (uint32_t slot = 0; slot < 64; slot += 7) {
			uint32_t imm = FR_IMM(FR_IMM_RS, serial << 8 | slot);

			assert_int_equal(FR_IMM_TYPE(imm), FR_IMM_RS);
			assert_int_equal(FR_IMM_PAYLOAD(imm) >> 8, serial);
			assert_int_equal(FR_IMM_PAYLOAD(imm) & 0xff, slot);
		}
	uint32_t imm = FR_IMM(FR_IMM_RS, 0xfffu << 8 | 0xffu);

	assert_int_equal(FR_IMM_TYPE(imm), FR_IMM_RS);
	assert_int_equal(FR_IMM_PAYLOAD(imm), 0x000fffffu);
}

/* ---- mailbox message headers ------------------------------------------------------ */

static void test_msg_roundtrip(void **state)
{
	uint8_t buf[FR_MSG_HDR + 16];
	struct fr_msg in;

	/* field by field, so that the padding is zero too */
	memset(&in, 0, sizeof(in));
	in.type = FR_MSG_READY;
	in.coll = FR_COLL_ALLGATHER;
	in.algo = FR_ALGO_RABENSEIFNER;
	in.dtype = FR_BF16;
	in.op = FR_AVG;
	in.step = 0xfffe;
	in.seq = 0xdeadbeefu;
	in.count = 0x123456789abcdef0ull;
	in.root = 7;
	in.credits = 8;
	in.offset = 0x0102030405060708ull;
	in.len = 100;
	in.err = FR_EPEER;
	in.origin = 3;
	in.aux = 0xfeedfaceu;
	in.hdr = FR_MSG_HDR;
	struct fr_msg out;

	(void)state;
	memset(buf, 0xee, sizeof(buf));
	fr_msg_encode(&in, buf);
	/* exactly the header, little-endian magic "FRM1" first */
	for (size_t i = FR_MSG_HDR; i < sizeof(buf); i++)
		assert_int_equal(buf[i], 0xee);
	assert_memory_equal(buf, "FRM1", 4);
	assert_int_equal(fr_msg_decode(buf, 100, &out), 0);
	assert_memory_equal(&in, &out, sizeof(in));
	/* a payload longer than the slot, a bad type, a bad magic */
	assert_int_equal(fr_msg_decode(buf, 99, &out), FR_EPROTO);
	in.type = 0;
	fr_msg_encode(&in, buf);
	assert_int_equal(fr_msg_decode(buf, 100, &out), FR_EPROTO);
	in.type = FR_MSG_TYPE_MAX + 1;
	fr_msg_encode(&in, buf);
	assert_int_equal(fr_msg_decode(buf, 100, &out), FR_EPROTO);
	in.type = FR_MSG_DATA;
	fr_msg_encode(&in, buf);
	buf[0] ^= 1;
	assert_int_equal(fr_msg_decode(buf, 100, &out), FR_EPROTO);
	/* random bytes never crash the decoder */
	srand(7);
	for (int i = 0; i < 100000; i++) {
		for (size_t j = 0; j < FR_MSG_HDR; j++)
			buf[j] = (uint8_t)rand();
		if (i % 2)
			memcpy(buf, "FRM1", 4);
		if (!fr_msg_decode(buf, 1000, &out))
			assert_true(out.type >= FR_MSG_DATA &&
				    out.type <= FR_MSG_BYE && out.len <= 1000);
	}
}

/*
 * The small messages' 16-byte header (peer.c): what fits it round-trips
 * with its payload right behind; what does not fit it is refused with
 * nothing written; decode refuses a bad type or length, and random bytes
 * after its magic never crash it.
 */
static void test_msg_compact(void **state)
{
	uint8_t buf[FR_MSG_HDR + 64], pay[FR_MSG_COMPACT_MAX + 1];
	struct fr_msg in, out, bad;

	(void)state;
	for (size_t i = 0; i < sizeof(pay); i++)
		pay[i] = (uint8_t)(0x40 + i);
	memset(&in, 0, sizeof(in));
	in.type = FR_MSG_DATA;
	in.coll = FR_COLL_BROADCAST;
	in.algo = FR_ALGO_RD | 2 << 4;
	in.dtype = FR_F64;
	in.op = FR_MAX;
	in.step = 0xfffe;
	in.seq = 0xdeadbeefu;
	in.count = 0xffff;
	in.root = 254;
	in.credits = 15;
	in.len = FR_MSG_COMPACT_MAX;
	in.hdr = FR_MSG_COMPACT;
	memset(buf, 0xee, sizeof(buf));
	assert_true(fr_msg_encode_compact(&in, pay, FR_MSG_COMPACT_MAX, buf));
	for (size_t i = FR_MSG_COMPACT + FR_MSG_COMPACT_MAX; i < sizeof(buf);
	     i++)
		assert_int_equal(buf[i], 0xee);
	assert_memory_equal(buf + FR_MSG_COMPACT, pay, FR_MSG_COMPACT_MAX);
	assert_int_equal(fr_msg_decode(buf, 100, &out), 0);
	assert_memory_equal(&in, &out, sizeof(in));
	/* the other extremes: READY, root -1, nothing after the header */
	in.type = FR_MSG_READY;
	in.root = -1;
	in.count = 0;
	in.credits = 0;
	in.len = 0;
	assert_true(fr_msg_encode_compact(&in, NULL, 0, buf));
	assert_int_equal(fr_msg_decode(buf, 100, &out), 0);
	assert_memory_equal(&in, &out, sizeof(in));
	/* a payload longer than the receiver's slot */
	in.len = 8;
	assert_true(fr_msg_encode_compact(&in, pay, 8, buf));
	assert_int_equal(fr_msg_decode(buf, 7, &out), FR_EPROTO);
	/* what does not fit: nothing written */
	memset(buf, 0xee, sizeof(buf));
	bad = in;
	assert_false(
		fr_msg_encode_compact(&bad, pay, FR_MSG_COMPACT_MAX + 1, buf));
	bad.offset = 8;
	assert_false(fr_msg_encode_compact(&bad, pay, 8, buf));
	bad = in;
	bad.count = 0x10000;
	assert_false(fr_msg_encode_compact(&bad, pay, 8, buf));
	bad = in;
	bad.root = 255;
	assert_false(fr_msg_encode_compact(&bad, pay, 8, buf));
	bad.root = -2;
	assert_false(fr_msg_encode_compact(&bad, pay, 8, buf));
	bad = in;
	bad.credits = 16;
	assert_false(fr_msg_encode_compact(&bad, pay, 8, buf));
	bad = in;
	bad.aux = 1;
	assert_false(fr_msg_encode_compact(&bad, pay, 8, buf));
	bad = in;
	bad.type = FR_MSG_ABORT; /* ABORT and BYE keep their own slots */
	assert_false(fr_msg_encode_compact(&bad, pay, 8, buf));
	bad.type = FR_MSG_BYE;
	assert_false(fr_msg_encode_compact(&bad, pay, 8, buf));
	for (size_t i = 0; i < sizeof(buf); i++)
		assert_int_equal(buf[i], 0xee);
	/* decode: a bad type, a length past the compact maximum */
	assert_true(fr_msg_encode_compact(&in, pay, 8, buf));
	buf[1] = (uint8_t)(FR_MSG_ABORT << 4);
	assert_int_equal(fr_msg_decode(buf, 1000, &out), FR_EPROTO);
	buf[1] = 0;
	assert_int_equal(fr_msg_decode(buf, 1000, &out), FR_EPROTO);
	buf[1] = (uint8_t)(FR_MSG_DATA << 4);
	buf[6] = FR_MSG_COMPACT_MAX + 1;
	assert_int_equal(fr_msg_decode(buf, 1000, &out), FR_EPROTO);
	srand(11);
	for (int i = 0; i < 100000; i++) {
		for (size_t j = 1; j < FR_MSG_COMPACT; j++)
			buf[j] = (uint8_t)rand();
		if (!fr_msg_decode(buf, 1000, &out))
			assert_true((out.type == FR_MSG_DATA ||
				     out.type == FR_MSG_READY) &&
				    out.len <= FR_MSG_COMPACT_MAX &&
				    out.hdr == FR_MSG_COMPACT &&
				    out.credits <= 15 && !out.offset);
	}
}

/* ---- the hypercube of recursive doubling / Rabenseifner ---------------------------- */

static void test_hcube(void **state)
{
	(void)state;
	for (int n = 1; n <= 70; n++) {
		bool seen[128] = { false };
		struct fr_hcube h0;
		int active = 0;

		fr_hcube_init(&h0, 0, n);
		assert_true(h0.pof2 <= n && h0.pof2 * 2 > n);
		assert_int_equal(1 << h0.steps, h0.pof2);
		for (int r = 0; r < n; r++) {
			struct fr_hcube h;

			fr_hcube_init(&h, r, n);
			if (h.vrank < 0) {
				/* folded out: an even rank with an odd partner */
				assert_true(r % 2 == 0 && r + 1 < 2 * h.rem);
				continue;
			}
			active++;
			assert_true(h.vrank < h.pof2);
			assert_false(seen[h.vrank]);
			seen[h.vrank] = true;
			assert_int_equal(fr_hcube_real(&h, h.vrank), r);
		}
		assert_int_equal(active, h0.pof2);
	}
}

/* ---- the ring's order over nodes ---------------------------------------- */

/* order for ids[0..n-1], checked against want (NULL: rank order) and for
 * being a permutation that keeps every node's ranks adjacent, in rank
 * order; returns node 0's crossings */
static int check_order(const uint64_t *ids, int n, bool by_rank,
		       const int *want, int want_nnodes)
{
	int node[16], count[16], order[16], seen[16] = { 0 }, nn;

	nn = fr_topo_nodes(ids, n, node, count);
	assert_int_equal(nn, want_nnodes);
	assert_int_equal(fr_topo_ring_order(node, count, nn, n, by_rank, order),
			 0);
	for (int i = 0; i < n; i++) {
		assert_true(order[i] >= 0 && order[i] < n);
		assert_int_equal(seen[order[i]]++, 0);
		if (want)
			assert_int_equal(order[i], want[i]);
		else
			assert_int_equal(order[i], i);
		/* within a node, rank order; a node's ranks in one run */
		if (!by_rank && i > 0 && node[order[i]] == node[order[i - 1]])
			assert_true(order[i] > order[i - 1]);
		if (!by_rank && i > 1 && node[order[i]] == node[order[i - 2]])
			assert_int_equal(node[order[i - 1]], node[order[i]]);
	}
	return fr_topo_ring_crossings(order, node, n, 0);
}

/* FR_TOPO's grammar: sizes from 1 to 65536 joined by x, at most four. */
static void test_topo_grid_parse(void **state)
{
	static const char *const bad[] = {
		"", "x", "2x", "x2", "2xx2", "0", "2x0", "-2", "+2", "2 x2",
		"2x3x4x5x6", "65537", "2,3", "2x3 ", "abc", " 2", "2x 3"};
	int d[FR_TOPO_MAX_DIMS];

	(void)state;
	assert_int_equal(fr_topo_grid_parse("2x4", d), 2);
	assert_int_equal(d[0], 2);
	assert_int_equal(d[1], 4);
	assert_int_equal(fr_topo_grid_parse("8", d), 1);
	assert_int_equal(d[0], 8);
	assert_int_equal(fr_topo_grid_parse("1x65536x3x2", d), 4);
	assert_int_equal(d[1], 65536);
	assert_int_equal(d[3], 2);
	assert_int_equal(fr_topo_grid_parse(NULL, d), -1);
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		if (fr_topo_grid_parse(bad[i], d) != -1)
			fail_msg("\"%s\" taken for a grid", bad[i]);
}

/*
 * The levels of a grid of nodes: every rank's levels against the
 * definition (the ranks with its local index on the nodes whose
 * coordinates are its own but one, in order of that one), for a 3 x 1 x 4
 * grid of 12 nodes of 2 ranks placed round robin (rank r on node r % 12);
 * sizes of 1 make no level; a grid of the wrong size or an irregular
 * layout gives none.
 */
static void test_topo_levels(void **state)
{
	enum { N = 24, M = 12 };
	static const int dims[3] = {3, 1, 4};
	int node[N], ranks[M + 8], nlevel[FR_TOPO_MAX_DIMS];
	int index[FR_TOPO_MAX_DIMS];

	(void)state;
	for (int r = 0; r < N; r++)
		node[r] = r % M;
	for (int me = 0; me < N; me++) {
		int nd = node[me], li = me / M, x = nd % 3, z = nd / 3;

		assert_int_equal(fr_topo_levels(node, N, M, me, dims, 3, ranks,
						 nlevel, index),
				 2);
		assert_int_equal(nlevel[0], 3);
		assert_int_equal(nlevel[1], 4);
		assert_int_equal(index[0], x);
		assert_int_equal(index[1], z);
		for (int v = 0; v < 3; v++)
			assert_int_equal(ranks[v], (v + 3 * z) + M * li);
		for (int v = 0; v < 4; v++)
			assert_int_equal(ranks[3 + v], (x + 3 * v) + M * li);
	}
	/* 12 cells for 11 nodes, 6 for 12 */
	assert_int_equal(fr_topo_levels(node, 22, 11, 0, dims, 3, ranks,
					 nlevel, index),
			 0);
	assert_int_equal(fr_topo_levels(node, N, M, 0, (const int[]){3, 2}, 2,
					 ranks, nlevel, index),
			 0);
	/* node 0 holds three ranks, node 11 one */
	node[11] = 0;
	assert_int_equal(fr_topo_levels(node, N, M, 5, dims, 3, ranks, nlevel,
					 index),
			 0);
}

/* A group numbers the nodes as its job does when it holds them all, first
 * met in order; else a grid of the job's nodes would not fit it. */
static void test_topo_same_nodes(void **state)
{
	(void)state;
	assert_true(fr_topo_same_nodes((const uint64_t[]){0, 0, 1, 2, 1}, 5,
				       3));
	assert_true(fr_topo_same_nodes((const uint64_t[]){0, 1, 2, 0}, 4, 3));
	/* node 2 met before node 1 (a split with keys reversed) */
	assert_false(fr_topo_same_nodes((const uint64_t[]){0, 2, 1}, 3, 3));
	/* node 2 missing */
	assert_false(fr_topo_same_nodes((const uint64_t[]){0, 1, 1}, 3, 3));
	/* node 0 missing: the group's first node would be its 0 */
	assert_false(fr_topo_same_nodes((const uint64_t[]){1, 2}, 2, 3));
	assert_true(fr_topo_same_nodes(NULL, 0, 0));
}

/* fr_topo_nodes on thousands of ranks (its hash) against the plain
 * definition: nodes numbered in order of their lowest rank, for ids that
 * are small and consecutive, powers of two (the same low bits) and
 * random, with nodes of one rank to a thousand. */
static void test_topo_nodes_large(void **state)
{
	const int n = 3001;
	uint64_t *ids = malloc(n * sizeof(*ids));
	int *node = malloc(n * sizeof(int)), *count = malloc(n * sizeof(int));
	int *want = malloc(n * sizeof(int));
	uint64_t x = 88172645463325252ull;

	(void)state;
	assert_non_null(ids);
	assert_non_null(node);
	assert_non_null(count);
	assert_non_null(want);
	for (int pattern = 0; pattern < 5; pattern++) {
		int nn = 0, got;

		for (int r = 0; r < n; r++) {
			switch (pattern) {
			case 0:
				ids[r] = (uint64_t)(r / 8);
				break;
			case 1:
				ids[r] = 1ull << (r % 64);
				break;
			case 2:
				ids[r] = (uint64_t)r << 40;
				break;
			case 3: /* xorshift64: random ids, 37 nodes */
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				ids[r] = r < 37 ? x : ids[r % 37];
				break;
			default:
				ids[r] = (uint64_t)(r / 1000) * 0x100000000ull;
			}
		}
		for (int r = 0; r < n; r++) {
			int k;

			for (k = 0; k < r && ids[k] != ids[r]; k++)
				;
			want[r] = k < r ? want[k] : nn++;
		}
		got = fr_topo_nodes(ids, n, node, count);
		assert_int_equal(got, nn);
		for (int r = 0; r < n; r++)
			assert_int_equal(node[r], want[r]);
		for (int k = 0; k < nn; k++) {
			int c = 0;

			for (int r = 0; r < n; r++)
				c += want[r] == k;
			assert_int_equal(count[k], c);
		}
	}
	free(want);
	free(count);
	free(node);
	free(ids);
}

static void test_ring_order(void **state)
{
	/* block placement, 3 nodes of 2: the order is rank order */
	const uint64_t block[] = { 7, 7, 9, 9, 4, 4 };
	/* round robin over 2 nodes (mpirun --map-by node) */
	const uint64_t rr[] = { 5, 8, 5, 8, 5, 8 };
	const int rr_want[] = { 0, 2, 4, 1, 3, 5 };
	/* irregular round robin: 7 ranks over 3 nodes */
	const uint64_t rr7[] = { 1, 2, 3, 1, 2, 3, 1 };
	const int rr7_want[] = { 0, 3, 6, 1, 4, 2, 5 };
	/* one node; a node per rank */
	const uint64_t one[] = { 3, 3, 3, 3 }, each[] = { 1, 2, 3, 4 };

	(void)state;
	assert_int_equal(check_order(block, 6, false, NULL, 3), 1);
	assert_int_equal(check_order(rr, 6, false, rr_want, 2), 1);
	/* rank order over round robin: every rank of node 0 crosses */
	assert_int_equal(check_order(rr, 6, true, NULL, 2), 3);
	assert_int_equal(check_order(rr7, 7, false, rr7_want, 3), 1);
	assert_int_equal(check_order(one, 4, false, NULL, 1), 0);
	assert_int_equal(check_order(each, 4, false, NULL, 4), 1);
	assert_int_equal(check_order(each, 1, false, NULL, 1), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chunk_partition),
		cmocka_unit_test(test_mod),
		cmocka_unit_test(test_reduce_scatter),
		cmocka_unit_test(test_all_gather),
		cmocka_unit_test(test_allreduce_schedule),
		cmocka_unit_test(test_nsegs),
		cmocka_unit_test(test_imm),
		cmocka_unit_test(test_msg_roundtrip),
		cmocka_unit_test(test_msg_compact),
		cmocka_unit_test(test_hcube),
		cmocka_unit_test(test_topo_nodes_large),
		cmocka_unit_test(test_topo_grid_parse),
		cmocka_unit_test(test_topo_levels),
		cmocka_unit_test(test_topo_same_nodes),
		cmocka_unit_test(test_ring_order),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
