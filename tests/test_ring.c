/* SPDX-License-Identifier: MIT */
/*
 * test_ring.c - the ring schedule arithmetic of src/ring.h, simulated
 * symbolically, and the control message codec of src/ring.c.
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

#include "ring.h"

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
	static const uint32_t payloads[] = { 0, 1, 0x7f, 0x12345, 0x0ffffff,
					     0x0fffffff };

	(void)state;
	for (uint32_t t = 0; t < 16; t++)
		for (size_t i = 0; i < sizeof(payloads) / sizeof(payloads[0]);
		     i++) {
			uint32_t imm = FR_IMM(t, payloads[i]);

			assert_int_equal(FR_IMM_TYPE(imm), t);
			assert_int_equal(FR_IMM_PAYLOAD(imm), payloads[i]);
		}
	/* A payload wider than 28 bits never leaks into the type. */
	assert_int_equal(FR_IMM_TYPE(FR_IMM(FR_IMM_CREDIT, 0xffffffffu)),
			 FR_IMM_CREDIT);
	assert_int_equal(FR_IMM_PAYLOAD(FR_IMM(FR_IMM_CREDIT, 0xffffffffu)),
			 0x0fffffffu);
	assert_int_equal(FR_IMM_TYPE(FR_IMM(FR_IMM_AG, 0x10000005u)),
			 FR_IMM_AG);
	assert_int_equal(FR_IMM_PAYLOAD(FR_IMM(FR_IMM_AG, 0x10000005u)), 5);
	/* The types are distinct and fit in 4 bits. */
	const uint32_t types[] = { FR_IMM_CTRL, FR_IMM_CREDIT, FR_IMM_RS,
				   FR_IMM_AG };
	for (int i = 0; i < 4; i++) {
		assert_true(types[i] > 0 && types[i] < 16);
		for (int j = i + 1; j < 4; j++)
			assert_int_not_equal(types[i], types[j]);
	}
	/* A reduce-scatter immediate: 20-bit serial, 8-bit slot. */
	for (uint32_t serial = 0; serial <= 0xfffff; serial += 0x3333)
		for (uint32_t slot = 0; slot < 64; slot += 7) {
			uint32_t imm = FR_IMM(FR_IMM_RS, serial << 8 | slot);

			assert_int_equal(FR_IMM_TYPE(imm), FR_IMM_RS);
			assert_int_equal(FR_IMM_PAYLOAD(imm) >> 8, serial);
			assert_int_equal(FR_IMM_PAYLOAD(imm) & 0xff, slot);
		}
	uint32_t imm = FR_IMM(FR_IMM_RS, 0xfffffu << 8 | 0xffu);

	assert_int_equal(FR_IMM_TYPE(imm), FR_IMM_RS);
	assert_int_equal(FR_IMM_PAYLOAD(imm), 0x0fffffffu);
}

/* ---- control messages ---------------------------------------------------------------- */

#define GUARD 64
#define GUARD_BYTE 0xee

/* Encode into a FR_CTRL_MSG_SIZE message followed by guard bytes that
 * must stay untouched. */
static void encode_guarded(const struct fr_ctrl *m, uint8_t *buf)
{
	memset(buf, GUARD_BYTE, FR_CTRL_MSG_SIZE + GUARD);
	fr_ctrl_encode(m, buf);
	for (size_t i = FR_CTRL_MSG_SIZE; i < FR_CTRL_MSG_SIZE + GUARD; i++)
		if (buf[i] != GUARD_BYTE)
			fail_msg("fr_ctrl_encode wrote byte %zu of a %d-byte message",
				 i, FR_CTRL_MSG_SIZE);
}

/* Decode a copy that is exactly FR_CTRL_MSG_SIZE bytes, followed by bytes
 * that are not part of the message: they must not matter. */
static int decode_exact(const uint8_t *msg, struct fr_ctrl *m)
{
	uint8_t a[FR_CTRL_MSG_SIZE + GUARD], b[FR_CTRL_MSG_SIZE + GUARD];
	struct fr_ctrl ma, mb;
	int ra, rb;

	memcpy(a, msg, FR_CTRL_MSG_SIZE);
	memcpy(b, msg, FR_CTRL_MSG_SIZE);
	memset(a + FR_CTRL_MSG_SIZE, 0x00, GUARD);
	memset(b + FR_CTRL_MSG_SIZE, 0xff, GUARD);
	ra = fr_ctrl_decode(a, &ma);
	rb = fr_ctrl_decode(b, &mb);
	assert_int_equal(ra, rb);
	if (!ra && memcmp(&ma, &mb, sizeof(ma)))
		fail_msg("fr_ctrl_decode reads past the %d-byte message",
			 FR_CTRL_MSG_SIZE);
	*m = ma;
	return ra;
}

static void check_same(const struct fr_ctrl *a, const struct fr_ctrl *b)
{
	assert_int_equal(a->type, b->type);
	assert_int_equal(a->has_key, b->has_key);
	assert_int_equal(a->seq, b->seq);
	assert_int_equal(a->err, b->err);
	assert_int_equal(a->origin, b->origin);
	assert_true(a->count == b->count);
	assert_int_equal(a->dtype, b->dtype);
	assert_int_equal(a->op, b->op);
	assert_int_equal(a->keylen, b->keylen);
	assert_int_equal(a->mem_id, b->mem_id);
	assert_true(a->dest_off == b->dest_off);
	assert_memory_equal(a->key, b->key, a->keylen);
}

static void test_ctrl_roundtrip(void **state)
{
	uint8_t buf[FR_CTRL_MSG_SIZE + GUARD], again[FR_CTRL_MSG_SIZE + GUARD];
	struct fr_ctrl in, out;

	(void)state;
	/* READY with a full-length key and every field set. */
	memset(&in, 0, sizeof(in));
	in.type = FR_CTRL_READY;
	in.has_key = 1;
	in.seq = 0xdeadbeefu;
	in.count = 0x123456789abcdef0ull;
	in.dtype = FR_BF16;
	in.op = FR_AVG;
	in.keylen = FR_TP_RKEY_MAX;
	in.mem_id = 0xfeedfaceu;
	in.dest_off = 0x0102030405060708ull;
	for (int i = 0; i < FR_TP_RKEY_MAX; i++)
		in.key[i] = (uint8_t)(i * 7 + 3);
	encode_guarded(&in, buf);
	/* Little-endian magic "FRC1" first. */
	assert_memory_equal(buf, "FRC1", 4);
	assert_int_equal(decode_exact(buf, &out), 0);
	check_same(&in, &out);
	/* Deterministic. */
	encode_guarded(&in, again);
	assert_memory_equal(buf, again, FR_CTRL_MSG_SIZE);

	/* READY without a key, small key. */
	memset(&in, 0, sizeof(in));
	in.type = FR_CTRL_READY;
	in.seq = 1;
	in.count = 1;
	in.dtype = FR_U64;
	in.op = FR_MIN;
	in.mem_id = 3;
	encode_guarded(&in, buf);
	assert_int_equal(decode_exact(buf, &out), 0);
	check_same(&in, &out);
	in.has_key = 1;
	in.keylen = 5;
	memcpy(in.key, "\x01\x02\x03\x04\x05", 5);
	encode_guarded(&in, buf);
	assert_int_equal(decode_exact(buf, &out), 0);
	check_same(&in, &out);

	/* ABORT carries a negative error and the origin. */
	memset(&in, 0, sizeof(in));
	in.type = FR_CTRL_ABORT;
	in.seq = 77;
	in.err = FR_EMISMATCH;
	in.origin = 5;
	encode_guarded(&in, buf);
	assert_int_equal(decode_exact(buf, &out), 0);
	check_same(&in, &out);
	assert_int_equal(out.err, FR_EMISMATCH);
	in.err = FR_ETIMEDOUT;
	in.origin = 0x7fffffff;
	encode_guarded(&in, buf);
	assert_int_equal(decode_exact(buf, &out), 0);
	check_same(&in, &out);

	/* BYE. */
	memset(&in, 0, sizeof(in));
	in.type = FR_CTRL_BYE;
	in.seq = 0xffffffffu;
	encode_guarded(&in, buf);
	assert_int_equal(decode_exact(buf, &out), 0);
	check_same(&in, &out);
}

static void expect_rejected(const struct fr_ctrl *in, const char *what)
{
	uint8_t buf[FR_CTRL_MSG_SIZE + GUARD];
	struct fr_ctrl out;

	encode_guarded(in, buf);
	if (decode_exact(buf, &out) != FR_EPROTO)
		fail_msg("fr_ctrl_decode accepted %s", what);
}

static void test_ctrl_reject(void **state)
{
	uint8_t buf[FR_CTRL_MSG_SIZE + GUARD];
	struct fr_ctrl good, bad, out;

	(void)state;
	memset(&good, 0, sizeof(good));
	good.type = FR_CTRL_READY;
	good.seq = 9;
	good.count = 100;
	good.has_key = 1;
	good.keylen = 8;
	encode_guarded(&good, buf);
	assert_int_equal(decode_exact(buf, &out), 0);

	/* Any change to the magic. */
	for (int i = 0; i < 4; i++)
		for (int bit = 0; bit < 8; bit++) {
			uint8_t m[FR_CTRL_MSG_SIZE + GUARD];

			memcpy(m, buf, sizeof(m));
			m[i] ^= (uint8_t)(1u << bit);
			assert_int_equal(decode_exact(m, &out), FR_EPROTO);
		}
	/* All zeros (an inbox slot never written). */
	memset(buf, 0, sizeof(buf));
	assert_int_equal(decode_exact(buf, &out), FR_EPROTO);

	bad = good;
	bad.type = 0;
	expect_rejected(&bad, "type 0");
	bad.type = FR_CTRL_BYE + 1;
	expect_rejected(&bad, "type BYE+1");
	bad.type = 0xffff;
	expect_rejected(&bad, "type 0xffff");
	bad = good;
	bad.has_key = 2;
	expect_rejected(&bad, "has_key 2");
	bad.has_key = 0xffff;
	expect_rejected(&bad, "has_key 0xffff");
	bad = good;
	bad.keylen = FR_TP_RKEY_MAX + 1;
	expect_rejected(&bad, "keylen FR_TP_RKEY_MAX+1");
	bad.keylen = 255;
	expect_rejected(&bad, "keylen 255");
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
		cmocka_unit_test(test_ctrl_roundtrip),
		cmocka_unit_test(test_ctrl_reject),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
