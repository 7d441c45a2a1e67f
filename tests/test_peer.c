/* SPDX-License-Identifier: MIT */
/*
 * test_peer.c - the peer layer (src/peer.c) against the in-process fake
 * transport (fake_tp.c): connections on first use, mailbox messages and
 * their credits, ABORT and BYE, dead peers, writes outside registered
 * memory and malformed messages.
 *
 * Each test creates a job of N communicators in this process through the
 * real fr_comm_create() (transport "fake", one thread per rank for the
 * rendezvous), then drives every rank's non-blocking collectives from this
 * thread, round-robin (fake_job_drive): deterministic, no sleeps.  What the
 * ranks put on the wire is read back from the fake's own counters and write
 * log, never from struct fr_comm; faults come from the fake too.
 */
/* cmocka.h needs these first, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_fixture.h"
#include "fake_tp.h"
#include "fastreduce.h"
#include "log.h"
#include "mem.h"
#include "peer.h"

#define DRIVE_MS 20000 /* a hang is a failure, never a stuck test */

/* Element i of rank r's input: small integers, exact in f32 sums. */
static float val(int r, size_t i)
{
	return (float)((r + 1) * (int)(i % 7));
}

/* In-place f32 sums of count elements on every rank; results checked. */
static void allreduce_all(int n, size_t count)
{
	fr_request_t *rq[MAXN];
	int rc[MAXN];
	float *b[MAXN];

	for (int r = 0; r < n; r++) {
		b[r] = tbuf(count * sizeof(float));
		for (size_t i = 0; i < count; i++)
			b[r][i] = val(r, i);
		rc[r] = 1;
		assert_int_equal(fr_iallreduce(comms[r], b[r], b[r], count,
					       FR_F32, FR_SUM, &rq[r]),
				 0);
	}
	assert_int_equal(fake_job_drive(comms, n, rq, rc, n, DRIVE_MS), 0);
	for (int r = 0; r < n; r++) {
		if (rc[r])
			fail_msg("rank %d: %s: %s", r, fr_errname(rc[r]),
				 fr_comm_last_error(comms[r]));
		for (size_t i = 0; i < count; i++) {
			float want = 0;

			for (int q = 0; q < n; q++)
				want += val(q, i);
			if (b[r][i] != want)
				fail_msg("rank %d: element %zu is %g, not %g",
					 r, i, (double)b[r][i], (double)want);
		}
	}
}

/* ---- connections ------------------------------------------------------------
 */

/*
 * Nothing is connected at creation; a ring All-Reduce connects each rank to
 * its two neighbours only, the lower rank of each pair connecting; a second
 * collective opens nothing new.
 */
static void test_connect_on_first_use(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RING);
	const int n = 5;

	(void)state;
	job(n, &cfg);
	assert_int_equal(fake_tp_connects_total(), 0);
	allreduce_all(n, 1000);
	assert_int_equal(fr_comm_last_algo(comms[0]), FR_ALGO_RING);
	for (int a = 0; a < n; a++)
		for (int b = a + 1; b < n; b++) {
			int ring = b == a + 1 || (a == 0 && b == n - 1);

			if (fake_tp_connects(a, b) != ring ||
			    fake_tp_connects(b, a) != 0)
				fail_msg(
					"pair %d-%d: %d + %d connections, want %d",
					a, b, fake_tp_connects(a, b),
					fake_tp_connects(b, a), ring);
		}
	assert_int_equal(fake_tp_connects_total(), n);
	allreduce_all(n, 100000);
	assert_int_equal(fake_tp_connects_total(), n);
	/* no data between non-neighbours either */
	assert_int_equal(fake_tp_writes(0, 2, -1), 0);
	assert_int_equal(fake_tp_writes(1, 3, -1), 0);
	assert_true(fake_tp_writes(0, 1, -1) > 0);
	assert_true(fake_tp_writes(4, 0, -1) > 0);
}

/*
 * A connection refused by the peer fails the connecting rank's collective
 * at once with the transport's error, naming the peer; the refusing rank,
 * which nobody can reach now, times out naming the rank it waited on.
 */
static void test_connect_refused(void **state)
{
	fr_config_t cfg = config(1000, FR_ALGO_RING);
	fr_request_t *rq[2];
	int rc[2] = {1, 1};
	float *b = tbuf(64 * sizeof(float)), *b1 = tbuf(64 * sizeof(float));

	(void)state;
	job(2, &cfg);
	fake_tp_refuse(1, FR_EAUTH);
	assert_int_equal(
		fr_iallreduce(comms[0], b, b, 64, FR_F32, FR_SUM, &rq[0]), 0);
	assert_int_equal(
		fr_iallreduce(comms[1], b1, b1, 64, FR_F32, FR_SUM, &rq[1]), 0);
	assert_int_equal(fake_job_drive(comms, 2, rq, rc, 2, DRIVE_MS), 0);
	assert_int_equal(rc[0], FR_EAUTH);
	assert_contains(fr_comm_last_error(comms[0]),
			"rank 0: connecting to rank 1 failed");
	/* rank 1 never got a connection, and rank 0 (failed) opened none
	 * to it */
	assert_int_equal(rc[1], FR_ETIMEDOUT);
	assert_contains(fr_comm_last_error(comms[1]),
			"waiting on rank 0, which does not answer");
	assert_int_equal(fake_tp_connects(0, 1), 0);
}

/* ---- messages and credits ---------------------------------------------------
 */

/*
 * A broadcast of 512 mailbox fragments (payload 128 bytes) from rank 0:
 * 64 times the 8 slots rank 1 has for rank 0, so rank 0 runs out of credits
 * again and again.  Every fragment arrives in order (the data is right, the
 * slots go round in order), and since rank 1 sends no data back, its
 * credits return by zero-length CREDIT writes only, each returning at least
 * half the slots: between 504 and 512 credits in 63 to 128 writes.
 */
static void test_credits_flow_control(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_TREE);
	const size_t len = 64 * 1024, frags = len / 128;
	uint8_t *b0 = tbuf(len), *b1 = tbuf(len);
	uint32_t *imms = tbuf(2 * frags * sizeof(uint32_t));
	fr_request_t *rq[2];
	int rc[2] = {1, 1};
	uint64_t credited = 0;
	size_t nmsg, ncred;

	(void)state;
	setenv("FR_EAGER_BYTES", "128", 1);
	job(2, &cfg);
	for (size_t i = 0; i < len; i++)
		b0[i] = (uint8_t)(i * 131 + (i >> 8));
	memset(b1, 0xee, len);
	assert_int_equal(fr_ibroadcast(comms[0], b0, len, FR_U8, 0, &rq[0]), 0);
	assert_int_equal(fr_ibroadcast(comms[1], b1, len, FR_U8, 0, &rq[1]), 0);
	assert_int_equal(fake_job_drive(comms, 2, rq, rc, 2, DRIVE_MS), 0);
	assert_int_equal(rc[0], 0);
	assert_int_equal(rc[1], 0);
	assert_int_equal(fr_comm_last_algo(comms[1]), FR_ALGO_TREE);
	assert_memory_equal(b1, b0, len);

	/* 512 messages into rank 1's data slots 0..7, round and round */
	nmsg = fake_tp_imms(0, 1, FR_IMM_MSG, imms, 2 * frags);
	assert_int_equal(nmsg, frags);
	for (size_t k = 0; k < nmsg; k++)
		if (imms[k] != FR_IMM(FR_IMM_MSG, k % FR_MBX_SLOTS))
			fail_msg("message %zu went to slot %u", k,
				 FR_IMM_PAYLOAD(imms[k]));
	assert_int_equal(fake_tp_writes(1, 0, FR_IMM_MSG), 0);
	/* the credits came back by CREDIT writes, half the slots or more */
	ncred = fake_tp_imms(1, 0, FR_IMM_CREDIT, imms, 2 * frags);
	for (size_t k = 0; k < ncred; k++) {
		assert_true(FR_IMM_PAYLOAD(imms[k]) >= FR_MBX_SLOTS / 2);
		assert_true(FR_IMM_PAYLOAD(imms[k]) <= FR_MBX_SLOTS);
		credited += FR_IMM_PAYLOAD(imms[k]);
	}
	if (credited < frags - FR_MBX_SLOTS || credited > frags ||
	    ncred < (frags - FR_MBX_SLOTS) / FR_MBX_SLOTS ||
	    ncred > frags / (FR_MBX_SLOTS / 2))
		fail_msg("%zu CREDIT writes returned %llu credits", ncred,
			 (unsigned long long)credited);
	assert_int_equal(fake_tp_writes(0, 1, FR_IMM_CREDIT), 0);
}

/* ---- ABORT ------------------------------------------------------------------
 */

/*
 * Rank 2 refuses its arguments (avg of integers): FR_EINVAL there, and the
 * ABORT it hands out (relayed by the ranks that got it) fails every other
 * rank with FR_EPEER, naming rank 2 as the first to fail and quoting its
 * message; the ABORTs on the wire carry origin 2.  Every later call fails
 * the same way.
 */
static void test_abort_reaches_everyone(void **state)
{
	fr_config_t cfg = config(5000, FR_ALGO_RING);
	const int n = 4;
	const uint32_t abort_imm = FR_IMM(FR_IMM_MSG, FR_MBX_SLOTS);
	fr_request_t *rq[MAXN] = {0};
	int rc[MAXN] = {1, 1, 1, 1}, got = 0;
	float *b[MAXN];
	uint8_t head[FR_MSG_HDR];

	(void)state;
	job(n, &cfg);
	for (int r = 0; r < n; r++)
		b[r] = tbuf(1000 * sizeof(float));
	for (int r = 0; r < n; r++)
		if (r != 2)
			assert_int_equal(fr_iallreduce(comms[r], b[r], b[r],
						       1000, FR_F32, FR_SUM,
						       &rq[r]),
					 0);
	assert_int_equal(fr_iallreduce(comms[2], b[2], b[2], 1000, FR_I32,
				       FR_AVG, &rq[2]),
			 FR_EINVAL);
	assert_null(rq[2]);
	assert_contains(fr_comm_last_error(comms[2]),
			"avg needs a floating type");
	assert_int_equal(fake_job_drive(comms, n, rq, rc, n, DRIVE_MS), 0);
	for (int r = 0; r < n; r++) {
		const char *e = fr_comm_last_error(comms[r]);

		if (r == 2)
			continue;
		if (rc[r] != FR_EPEER)
			fail_msg("rank %d: %s (%s)", r, fr_errname(rc[r]), e);
		assert_contains(e, "rank 2 failed first (invalid argument)");
		assert_contains(e, "avg needs a floating type");
		/* later calls: the same error, the message kept */
		assert_int_equal(
			fr_allreduce(comms[r], b[r], b[r], 10, FR_F32, FR_SUM),
			FR_EPEER);
		assert_int_equal(fr_barrier(comms[r]), FR_EPEER);
		assert_contains(fr_comm_last_error(comms[r]),
				"rank 2 failed first");
	}
	assert_int_equal(fr_barrier(comms[2]), FR_EINVAL);
	/* the ABORTs on the wire name rank 2 as their origin */
	for (int from = 0; from < n; from++)
		for (int to = 0; to < n; to++) {
			struct fr_msg m;

			if (fake_tp_write_head(from, to, abort_imm, 0, head,
					       sizeof(head)) != FR_MSG_HDR)
				continue;
			assert_int_equal(fr_msg_decode(head, 1u << 20, &m), 0);
			assert_int_equal(m.type, FR_MSG_ABORT);
			assert_int_equal(m.origin, 2);
			assert_int_equal(m.err, FR_EINVAL);
			got++;
		}
	assert_true(got >= n - 1);
	assert_true(fake_tp_writes(2, -1, FR_IMM_MSG) >= 1);
}

/* ---- BYE --------------------------------------------------------------------
 */

/*
 * Destroying the communicators sends one BYE to every connected peer and
 * none elsewhere; each rank waits for its peers' BYEs, not for the timeout.
 */
static void test_bye_at_destroy(void **state)
{
	fr_config_t cfg = config(30000, FR_ALGO_RING);
	const int n = 4;
	const uint32_t bye = FR_IMM(FR_IMM_MSG, FR_MBX_SLOTS + 1);
	uint8_t head[FR_MSG_HDR];
	uint64_t t0;

	(void)state;
	job(n, &cfg);
	allreduce_all(n, 4096);
	assert_int_equal(fake_tp_writes_imm(-1, -1, bye), 0);
	t0 = now_ms();
	fake_job_destroy(ncomms, comms);
	ncomms = 0;
	/* the timeout is 30 s: well under it means the BYEs did it */
	assert_true(now_ms() - t0 < 15000);
	for (int a = 0; a < n; a++)
		for (int b = 0; b < n; b++) {
			int d = (a - b + n) % n;
			uint64_t want = a != b && (d == 1 || d == n - 1);
			struct fr_msg m;

			if (fake_tp_writes_imm(a, b, bye) != want)
				fail_msg("rank %d sent %llu BYEs to rank %d", a,
					 (unsigned long long)fake_tp_writes_imm(
						 a, b, bye),
					 b);
			if (!want)
				continue;
			assert_int_equal(fake_tp_write_head(a, b, bye, 0, head,
							    sizeof(head)),
					 FR_MSG_HDR);
			assert_int_equal(fr_msg_decode(head, 1u << 20, &m), 0);
			assert_int_equal(m.type, FR_MSG_BYE);
		}
}

static void *destroy_main(void *arg)
{
	fr_comm_destroy(arg);
	return NULL;
}

/*
 * Rank 1 destroys its communicator (its BYE goes out, it waits for rank
 * 0's) while rank 0 starts another collective with it: rank 0 fails with
 * FR_EPEER saying that rank 1 destroyed its communicator, long before the
 * 20 s timeout.
 */
static void test_peer_destroyed(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RING);
	const uint32_t bye = FR_IMM(FR_IMM_MSG, FR_MBX_SLOTS + 1);
	fr_request_t *rq[1];
	int rc[1] = {1};
	float *b = tbuf(256 * sizeof(float));
	uint64_t t0;
	pthread_t t;

	(void)state;
	job(2, &cfg);
	allreduce_all(2, 256);
	t0 = now_ms();
	assert_int_equal(pthread_create(&t, NULL, destroy_main, comms[1]), 0);
	comms[1] = NULL;
	/* not a busy loop: the fake transport's lock, taken and dropped at
	 * once, starves the destroying thread under valgrind's scheduler */
	while (!fake_tp_writes_imm(1, 0, bye)) {
		if (now_ms() - t0 > DRIVE_MS)
			fail_msg("rank 1 sent no BYE");
		usleep(1000);
	}
	assert_int_equal(
		fr_iallreduce(comms[0], b, b, 256, FR_F32, FR_SUM, &rq[0]), 0);
	assert_int_equal(fake_job_drive(comms, 1, rq, rc, 1, DRIVE_MS), 0);
	assert_int_equal(rc[0], FR_EPEER);
	assert_contains(fr_comm_last_error(comms[0]),
			"rank 1 has destroyed its communicator");
	/* rank 0's own BYE lets rank 1's destroy finish */
	fake_job_destroy(1, &comms[0]);
	pthread_join(t, NULL);
	assert_true(now_ms() - t0 < 10000);
	assert_int_equal(fake_tp_writes_imm(1, 0, bye), 1);
	assert_int_equal(fake_tp_writes_imm(0, 1, bye), 1);
}

/* ---- dead peers -------------------------------------------------------------
 */

/*
 * Rank 2's process dies (its endpoint's connections close) between two
 * collectives: the next one fails on every survivor with FR_EPEER and a
 * message naming rank 2, long before the 20 s timeout.  Rank 0, not a
 * neighbour of 2, learns it from the ABORT of a rank that was.
 */
static void test_killed_peer(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RING);
	const int n = 4;
	fr_request_t *rq[MAXN] = {0};
	int rc[MAXN] = {1, 1, 1, 1};
	float *b[MAXN];
	uint64_t t0;

	(void)state;
	job(n, &cfg);
	allreduce_all(n, 1024);
	fake_tp_kill(2);
	t0 = now_ms();
	for (int r = 0; r < n; r++) {
		b[r] = tbuf(1024 * sizeof(float));
		if (r != 2)
			assert_int_equal(fr_iallreduce(comms[r], b[r], b[r],
						       1024, FR_F32, FR_SUM,
						       &rq[r]),
					 0);
	}
	/* rank 2 is dead: nobody drives it */
	{
		fr_comm_t *live[MAXN] = {comms[0], comms[1], NULL, comms[3]};

		assert_int_equal(fake_job_drive(live, n, rq, rc, n, DRIVE_MS),
				 0);
	}
	assert_true(now_ms() - t0 < 10000);
	for (int r = 0; r < n; r++) {
		if (r == 2)
			continue;
		if (rc[r] != FR_EPEER)
			fail_msg("rank %d: %s (%s)", r, fr_errname(rc[r]),
				 fr_comm_last_error(comms[r]));
		assert_contains(fr_comm_last_error(comms[r]),
				"peer rank 2 closed the connection");
	}
	assert_contains(fr_comm_last_error(comms[0]), "failed first");
}

/* One broken connection (not a dead process): both of its ranks fail with
 * FR_EPEER, the others through the ABORT. */
static void test_broken_connection(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RING);
	const int n = 3;
	fr_request_t *rq[MAXN] = {0};
	int rc[MAXN] = {1, 1, 1};
	float *b[MAXN];

	(void)state;
	job(n, &cfg);
	allreduce_all(n, 512);
	fake_tp_break(0, 1);
	for (int r = 0; r < n; r++) {
		b[r] = tbuf(512 * sizeof(float));
		assert_int_equal(fr_iallreduce(comms[r], b[r], b[r], 512,
					       FR_F32, FR_SUM, &rq[r]),
				 0);
	}
	assert_int_equal(fake_job_drive(comms, n, rq, rc, n, DRIVE_MS), 0);
	for (int r = 0; r < n; r++)
		assert_int_equal(rc[r], FR_EPEER);
	assert_contains(fr_comm_last_error(comms[0]), "peer rank 1");
	assert_contains(fr_comm_last_error(comms[1]), "peer rank 0");
}

/* ---- protocol errors --------------------------------------------------------
 */

/* Start `count` f32 sums on both ranks of a 2-rank job, drive them all. */
static void two_rank_round(size_t count, int ncoll, int *rc0, int *rc1)
{
	fr_request_t *rq[8];
	int rc[8];

	assert_true(ncoll <= 4);
	for (int k = 0; k < ncoll; k++)
		for (int r = 0; r < 2; r++) {
			float *b = tbuf(count * sizeof(float));

			for (size_t i = 0; i < count; i++)
				b[i] = val(r, i);
			rc[2 * k + r] = 1;
			assert_int_equal(fr_iallreduce(comms[r], b, b, count,
						       FR_F32, FR_SUM,
						       &rq[2 * k + r]),
					 0);
		}
	assert_int_equal(fake_job_drive(comms, 2, rq, rc, 2 * ncoll, DRIVE_MS),
			 0);
	*rc0 = rc[0];
	*rc1 = rc[1];
}

/*
 * A write outside the receiver's registered memory (the fake aims rank 0's
 * second zero-copy reduce-scatter write into rank 1 past the end of its
 * region): the receiver refuses it (FR_ERANGE from the transport) and
 * fails with FR_EPROTO; the writer sees its connection closed.  Nothing
 * crashes, nothing lands out of bounds (ASan / valgrind would say).
 */
static void test_write_outside_memory(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RING);
	int rc0, rc1;

	(void)state;
	cfg.segment_bytes = 4096;
	job(2, &cfg);
	fake_tp_fault(0, 1, FR_IMM_RS, 1, FAKE_OOB, 0, 0);
	two_rank_round(64 * 1024, 1, &rc0, &rc1);
	assert_true(fake_tp_fault_fired());
	assert_int_equal(rc1, FR_EPROTO);
	assert_contains(
		fr_comm_last_error(comms[1]),
		"rank 1: peer rank 0 wrote outside our registered memory");
	assert_int_equal(rc0, FR_EPEER);
	assert_contains(fr_comm_last_error(comms[0]), "peer rank 1");
}

/* One message header of rank 0's recursive-doubling exchange of `count`
 * floats (64: the 64-byte header; up to 4: the small one), damaged on the
 * way: byte `off` xor'ed with `x` (or the message lost). */
static void damaged_n(size_t count, enum fake_fault kind, size_t off, uint8_t x,
		      int want1, const char *what1)
{
	fr_config_t cfg = config(20000, FR_ALGO_RD);
	int rc0, rc1;

	job(2, &cfg);
	fake_tp_fault(0, 1, FR_IMM_MSG, 0, kind, off, x);
	two_rank_round(count, kind == FAKE_DROP ? 2 : 1, &rc0, &rc1);
	assert_true(fake_tp_fault_fired());
	if (rc1 != want1)
		fail_msg("rank 1: %s, not %s (%s)", fr_errname(rc1),
			 fr_errname(want1), fr_comm_last_error(comms[1]));
	assert_contains(fr_comm_last_error(comms[1]), what1);
	/*
	 * Rank 0 had everything it needed: its collective may have
	 * succeeded, but rank 1's ABORT fails its communicator with the
	 * job's error as it is (later calls say so).
	 */
	if (kind != FAKE_DROP) {
		uint64_t end = now_ms() + DRIVE_MS;
		int rc;

		assert_true(rc0 == 0 || rc0 == want1);
		while (!(rc = fr_progress(comms[0])))
			if (now_ms() > end)
				fail_msg("rank 0 never heard of the failure");
		assert_int_equal(rc, want1);
		assert_int_equal(fr_barrier(comms[0]), want1);
		assert_contains(fr_comm_last_error(comms[0]),
				"rank 1 failed first");
	}
}

static void damaged(enum fake_fault kind, size_t off, uint8_t x, int want1,
		    const char *what1)
{
	damaged_n(64, kind, off, x, want1, what1);
}

static void test_corrupt_magic(void **state)
{
	(void)state;
	damaged(FAKE_CORRUPT, 0, 0x5a, FR_EPROTO,
		"rank 1: malformed or out-of-order message from rank 0 (slot 0");
}

static void test_corrupt_type(void **state)
{
	(void)state;
	/* DATA (1) becomes ABORT (3) in a data slot */
	damaged(FAKE_CORRUPT, 4, 0x02, FR_EPROTO,
		"malformed or out-of-order message from rank 0");
}

static void test_corrupt_length(void **state)
{
	(void)state;
	/* the header's payload length no longer matches the write's */
	damaged(FAKE_CORRUPT, 40, 0x01, FR_EPROTO,
		"malformed or out-of-order message from rank 0");
}

static void test_corrupt_count(void **state)
{
	(void)state;
	/* a well-formed header that names another count: a mismatch */
	damaged(FAKE_CORRUPT, 16, 0x40, FR_EMISMATCH,
		"rank 0 called allreduce(count=0");
}

static void test_lost_message(void **state)
{
	(void)state;
	/* collective #0's message never lands; #1's then arrives in the
	 * wrong slot */
	damaged(FAKE_DROP, 0, 0, FR_EPROTO,
		"malformed or out-of-order message from rank 0 (slot 1");
}

/* The small header (peer.c): its magic, its length, its count. */
static void test_corrupt_compact(void **state)
{
	(void)state;
	damaged_n(
		2, FAKE_CORRUPT, 0, 0x5a, FR_EPROTO,
		"rank 1: malformed or out-of-order message from rank 0 (slot 0");
	teardown(NULL);
	setup(NULL);
	/* 8 bytes become 40: more than the small header carries */
	damaged_n(2, FAKE_CORRUPT, 6, 0x20, FR_EPROTO,
		  "malformed or out-of-order message from rank 0");
	teardown(NULL);
	setup(NULL);
	/* count 2 becomes 66: well-formed, but a mismatch */
	damaged_n(2, FAKE_CORRUPT, 10, 0x40, FR_EMISMATCH,
		  "rank 0 called allreduce(count=66");
}

/*
 * Small messages (FR_LL): an 8-byte sum goes under the 16-byte header by
 * write_inline; when the transport takes only every other one, the others
 * go by write_imm under the 64-byte header, in order, through the same
 * slots and credits; when it takes none, every message has the 64-byte
 * header.  The sums are right every way, on 2 and on 3 ranks (where
 * recursive doubling folds a rank in and out).
 */
/* ---- sub-communicators over the shared endpoint ----------------------------
 */

struct splitter {
	fr_comm_t *comm, *sub;
	int color, rc;
};

static void *split_main(void *arg)
{
	struct splitter *sp = arg;

	sp->rc = fr_comm_split(sp->comm, sp->color, 0, &sp->sub);
	return NULL;
}

/* Split comms[0..n) by color_of[r], one thread a rank (a split blocks). */
static void split_all(int n, const int *color_of, fr_comm_t **subs)
{
	struct splitter sp[MAXN];
	pthread_t t[MAXN];

	for (int r = 0; r < n; r++) {
		sp[r] = (struct splitter){.comm = comms[r],
					  .color = color_of[r]};
		assert_int_equal(
			pthread_create(&t[r], NULL, split_main, &sp[r]), 0);
	}
	for (int r = 0; r < n; r++) {
		assert_int_equal(pthread_join(t[r], NULL), 0);
		if (sp[r].rc)
			fail_msg("rank %d: split: %s (%s)", r,
				 fr_strerror(sp[r].rc),
				 fr_comm_last_error(comms[r]));
		subs[r] = sp[r].sub;
	}
}

/*
 * Two halves of a 4-rank job, split once every pair is connected: their
 * All-Reduces open no connection (they share the job's), every write they
 * make carries their id in bits 20..27 of the immediate (1: the lowest free
 * after the job's 0), the job's own carry 0, and the results are right on
 * both at once.  A dead rank then fails its half, naming it, and the other
 * half goes on.
 */
static void test_split_shares_connections(void **state)
{
	enum { N = 4 };
	static const int halves[N] = {0, 0, 1, 1};
	fr_comm_t *sub[N], *saved[N];
	fr_request_t *rq[N];
	int rc[N], got, n;
	uint32_t imms[4096];
	float *b[N];

	(void)state;
	job(N, NULL);
	/* every pair connected: a one-shot All-Reduce talks to everyone */
	setenv("FR_ALGO", "oneshot", 1);
	fake_job_destroy(N, comms);
	job(N, NULL);
	unsetenv("FR_ALGO");
	allreduce_all(N, 64);
	split_all(N, halves, sub);
	memcpy(saved, comms, sizeof(saved));
	memcpy(comms, sub, sizeof(sub));
	fake_tp_reset();
	/* both halves at once, driven together */
	for (int r = 0; r < N; r++) {
		assert_int_equal(fr_comm_size(sub[r]), 2);
		assert_int_equal(fr_comm_rank(sub[r]), r % 2);
		b[r] = tbuf(4096 * sizeof(float));
		for (size_t i = 0; i < 4096; i++)
			b[r][i] = val(r, i);
		rc[r] = 1;
		assert_int_equal(fr_iallreduce(sub[r], b[r], b[r], 4096, FR_F32,
					       FR_SUM, &rq[r]),
				 0);
	}
	assert_int_equal(fake_job_drive(sub, N, rq, rc, N, DRIVE_MS), 0);
	for (int r = 0; r < N; r++) {
		int o = r ^ 1;

		assert_int_equal(rc[r], 0);
		for (size_t i = 0; i < 4096; i += 97)
			assert_true(b[r][i] == val(r, i) + val(o, i));
	}
	/* not one connection more than the job had */
	assert_int_equal(fake_tp_connects_total(), 0);
	/* on the wire: the halves' id, and only between their ranks */
	got = 0;
	for (int r = 0; r < N; r++)
		for (int q = 0; q < N; q++) {
			n = (int)fake_tp_imms(r, q, -1, imms, 4096);
			if ((r ^ q) != 1) {
				assert_int_equal(n, 0);
				continue;
			}
			for (int k = 0; k < n; k++)
				assert_int_equal(imms[k] & FR_TP_IMM_ID_MASK,
						 1u << FR_TP_IMM_ID_SHIFT);
			got += n;
		}
	assert_true(got > 0);
	/* the job's own writes still carry id 0 */
	memcpy(comms, saved, sizeof(saved));
	fake_tp_reset();
	allreduce_all(N, 16);
	n = (int)fake_tp_imms(0, 1, -1, imms, 4096);
	assert_true(n > 0);
	for (int k = 0; k < n; k++)
		assert_int_equal(imms[k] & FR_TP_IMM_ID_MASK, 0);
	/* rank 3 dies: its half fails naming it, the other half works */
	fake_tp_kill(3);
	for (int r = 0; r < 3; r++) {
		b[r] = tbuf(8 * sizeof(float));
		rc[r] = 1;
		assert_int_equal(fr_iallreduce(sub[r], b[r], b[r], 8, FR_F32,
					       FR_SUM, &rq[r]),
				 0);
	}
	assert_int_equal(fake_job_drive(sub, 3, rq, rc, 3, DRIVE_MS), 0);
	assert_int_equal(rc[0], 0);
	assert_int_equal(rc[1], 0);
	assert_int_equal(rc[2], FR_EPEER);
	assert_contains(fr_comm_last_error(sub[2]), "rank 1");
	/* destroyed before their parent, which then goes as usual */
	fake_job_destroy(N, sub);
}

static void test_small_messages(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RD);
	uint8_t head[FR_MSG_HDR + 16];
	struct fr_msg m;

	(void)state;
	job(2, &cfg);
	allreduce_all(2, 2);
	assert_int_equal(fake_tp_write_head(0, 1, FR_IMM(FR_IMM_MSG, 0), 0,
					    head, sizeof(head)),
			 FR_MSG_COMPACT + 8);
	assert_int_equal(fr_msg_decode(head, 1u << 20, &m), 0);
	assert_int_equal(m.hdr, FR_MSG_COMPACT);
	assert_int_equal(m.len, 8);
	assert_int_equal(m.count, 2);
	assert_int_equal(m.coll, FR_COLL_ALLREDUCE);
	fake_tp_inline(2);
	for (int k = 1; k < 2 * FR_MBX_SLOTS; k++)
		allreduce_all(2, 1 + (size_t)k % 4);
	fake_tp_inline(0);
	allreduce_all(2, 2); /* collective #16: slot 0 again */
	/* (the log keeps a write's first FR_MSG_HDR bytes) */
	assert_int_equal(fake_tp_write_head(0, 1, FR_IMM(FR_IMM_MSG, 0), 2,
					    head, sizeof(head)),
			 FR_MSG_HDR);
	assert_int_equal(fr_msg_decode(head, 1u << 20, &m), 0);
	assert_int_equal(m.hdr, FR_MSG_HDR);
	assert_int_equal(m.len, 8);
	assert_int_equal(m.seq, 2 * FR_MBX_SLOTS);
	teardown(NULL);
	setup(NULL);
	job(3, &cfg);
	fake_tp_inline(2);
	for (int k = 0; k < 3 * FR_MBX_SLOTS; k++)
		allreduce_all(3, 1 + (size_t)k % 4);
}

/*
 * No patience in a circle (peer.c, "Slow or dead").  Rank 1's last ring
 * write of collective #0 is lost: rank 1 has finished #0 and waits in #1
 * for rank 0, which has not entered #1 - so rank 1 waits patiently, and
 * says so in its PONGs.  Rank 0 waits in #0 for rank 1, alive and waiting
 * for a late rank itself: but that late rank is rank 0, and rank 1 has
 * gone on to a later collective.  Rank 0 must fail at the timeout, not
 * wait FR_SLOW_TIMEOUT_MS for a rank that waits for it.
 */
static void test_no_patience_circle(void **state)
{
	fr_config_t cfg = config(400, FR_ALGO_RING);
	fr_request_t *rq[3];
	int rc[3] = {1, 1, 1};
	uint64_t t0;

	(void)state;
	setenv("FR_SLOW_TIMEOUT_MS", "600000", 1);
	job(2, &cfg);
	unsetenv("FR_SLOW_TIMEOUT_MS");
	allreduce_all(2, 64);
	fake_tp_fault(1, 0, FR_IMM_AG, 0, FAKE_DROP, 0, 0);
	for (int k = 0; k < 3; k++) {
		float *b = tbuf(64 * sizeof(float));

		assert_int_equal(fr_iallreduce(comms[k ? 1 : 0], b, b, 64,
					       FR_F32, FR_SUM, &rq[k]),
				 0);
	}
	t0 = now_ms();
	assert_int_equal(fake_job_drive(comms, 2, rq, rc, 3, DRIVE_MS), 0);
	assert_true(fake_tp_fault_fired());
	if (rc[1])
		fail_msg("rank 1's collective #1 failed: %s",
			 fr_comm_last_error(comms[1]));
	if (rc[0] != FR_ETIMEDOUT)
		fail_msg("rank 0: %s (%s)", fr_errname(rc[0]),
			 fr_comm_last_error(comms[0]));
	assert_contains(fr_comm_last_error(comms[0]),
			"rank 1 is alive and in it but sent nothing");
	assert_int_not_equal(rc[2], 0);
	assert_true(now_ms() - t0 < 10000);
}

/*
 * Rabenseifner's large steps go zero copy (xfer.c).  On 2 ranks a 1 MiB
 * All-Reduce (steps of 512 KiB: 8 payloads of 32 KiB or more) writes,
 * each way, the reduce-scatter's half in segments of FR_SEGMENT_BYTES (64
 * KiB here: 8 writes with immediate FR_IMM_ZX, slot 0, segments 0 to 7),
 * then the all-gather's the same way; a 64 KiB one (steps of 32 KiB) goes
 * through the mailbox.  Results checked, twice on the same job.  A
 * segment lost on the way: the next one names segment 3 where 2 is due,
 * and the receiver fails with FR_EPROTO instead of reducing a hole.
 */
static void test_zero_copy_steps(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RABENSEIFNER);
	uint32_t imms[64];
	int rc0, rc1;

	(void)state;
	cfg.segment_bytes = 64u << 10;
	job(2, &cfg);
	allreduce_all(2, (64u << 10) / 4);
	assert_int_equal(fake_tp_imms(0, 1, FR_IMM_ZX, imms, 64), 0);
	allreduce_all(2, (1u << 20) / 4);
	for (int from = 0; from < 2; from++) {
		assert_int_equal(
			fake_tp_imms(from, 1 - from, FR_IMM_ZX, imms, 64), 16);
		for (uint32_t i = 0; i < 16; i++)
			assert_int_equal(imms[i], FR_IMM(FR_IMM_ZX, i % 8));
	}
	allreduce_all(2, (1u << 20) / 4);
	assert_int_equal(fake_tp_imms(0, 1, FR_IMM_ZX, imms, 64), 32);
	fake_tp_fault(0, 1, FR_IMM_ZX, 2, FAKE_DROP, 0, 0);
	two_rank_round((1u << 20) / 4, 1, &rc0, &rc1);
	assert_true(fake_tp_fault_fired());
	if (rc1 != FR_EPROTO)
		fail_msg("rank 1: %s, not FR_EPROTO (%s)", fr_errname(rc1),
			 fr_comm_last_error(comms[1]));
	assert_contains(fr_comm_last_error(comms[1]),
			"unexpected zero-copy write");
	(void)rc0;
}

/*
 * On 3 ranks (not a power of two) rank 0 folds its whole vector into rank
 * 1 and gets the result back (hcube.c): zero copy too from 8 payloads up,
 * 1 MiB in 16 writes of 64 KiB each way, segments 0 to 15; rank 2 is
 * rank 1's only partner.
 */
static void test_zero_copy_fold(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RABENSEIFNER);
	uint32_t imms[32];

	(void)state;
	cfg.segment_bytes = 64u << 10;
	job(3, &cfg);
	allreduce_all(3, (1u << 20) / 4);
	for (int from = 0; from < 2; from++) {
		assert_int_equal(
			fake_tp_imms(from, 1 - from, FR_IMM_ZX, imms, 32), 16);
		for (uint32_t i = 0; i < 16; i++)
			assert_int_equal(imms[i], FR_IMM(FR_IMM_ZX, i));
	}
	assert_int_equal(fake_tp_imms(0, 2, FR_IMM_ZX, imms, 32), 0);
	assert_int_equal(fake_tp_imms(2, 0, FR_IMM_ZX, imms, 32), 0);
}

/*
 * A reduced half larger than the staging area (FR_ZX_STAGE_MAX, 16 MiB)
 * comes in chunks, a READY each: 40 MiB on 2 ranks in writes of 3 MiB is
 * 6 writes of the first 16 MiB of the 20 MiB half (the last of 1 MiB) and
 * 2 of the other 4 MiB, segments numbered on across the chunks (in one
 * piece it would be 7 writes); then the all-gather's 20 MiB in place, 7
 * writes; the sums are right.
 */
static void test_zero_copy_chunks(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RABENSEIFNER);
	uint32_t imms[32];

	(void)state;
	cfg.segment_bytes = 3u << 20;
	job(2, &cfg);
	allreduce_all(2, (40u << 20) / 4);
	for (int from = 0; from < 2; from++) {
		assert_int_equal(
			fake_tp_imms(from, 1 - from, FR_IMM_ZX, imms, 32), 15);
		for (uint32_t i = 0; i < 15; i++)
			assert_int_equal(imms[i],
					 FR_IMM(FR_IMM_ZX, i < 8 ? i : i - 8));
	}
}

/*
 * The registrations' keys traded with a peer (peer.c): a key is offered
 * until it was sent once; a key learnt is held by its id (the same key
 * each time, as the transport unpacks it); an id whose key never came is
 * a protocol error, id 0 and a key that does not unpack a malformed READY
 * (FR_EINVAL), and a bad key leaves the one held.
 */
static void test_peer_keys(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_RING);
	fr_stats_t s0 = {.size = sizeof(s0)}, s1 = {.size = sizeof(s1)};
	uint8_t key[FR_TP_RKEY_MAX], bad[FR_TP_RKEY_MAX];
	size_t kl = sizeof(key), kl2 = sizeof(key);
	const struct fr_tp_rkey *k = NULL, *k2 = NULL;
	struct fr_tp_rkey ref, held;
	void *buf = tbuf(4096);
	struct fr_mem *mem;

	(void)state;
	job(2, &cfg);
	assert_int_equal(fr_mem_user_register(comms[0], buf, 4096, &mem), 0);
	assert_int_equal(fr_comm_stats(comms[0], &s0), 0);
	assert_int_equal(fr_peer_key_offer(comms[0], 1, mem, key, &kl), 1);
	assert_true(kl > 0 && kl <= sizeof(key));
	/* not sent yet: offered again */
	assert_int_equal(fr_peer_key_offer(comms[0], 1, mem, key, &kl2), 1);
	assert_int_equal(kl2, kl);
	fr_peer_key_sent(comms[0], 1, mem);
	kl2 = sizeof(key);
	assert_int_equal(fr_peer_key_offer(comms[0], 1, mem, key, &kl2), 0);
	assert_int_equal(kl2, 0);
	assert_int_equal(fr_comm_stats(comms[0], &s1), 0);
	assert_int_equal(s1.rkeys_sent, s0.rkeys_sent + 1);

	/* rank 1 learns it */
	assert_int_equal(fr_peer_key_learn(comms[1], 0, mem->id, NULL, 0, &k),
			 FR_EPROTO);
	assert_int_equal(fr_peer_key_learn(comms[1], 0, 0, key, kl, NULL),
			 FR_EINVAL);
	assert_int_equal(fr_peer_key_learn(comms[1], 0, mem->id, key, kl, &k),
			 0);
	assert_non_null(k);
	memset(&ref, 0, sizeof(ref));
	assert_int_equal(fr_mem_unpack_key(comms[1], key, kl, &ref), 0);
	assert_memory_equal(k, &ref, sizeof(ref));
	held = *k;
	assert_int_equal(fr_peer_key_learn(comms[1], 0, mem->id, NULL, 0, &k2),
			 0);
	assert_ptr_equal(k2, k);
	memcpy(bad, key, kl);
	bad[0] ^= 0xff;
	assert_int_equal(fr_peer_key_learn(comms[1], 0, mem->id, bad, kl, &k2),
			 FR_EINVAL);
	k2 = NULL;
	assert_int_equal(fr_peer_key_learn(comms[1], 0, mem->id, NULL, 0, &k2),
			 0);
	assert_ptr_equal(k2, k);
	assert_memory_equal(k2, &held, sizeof(held));
	/* another id in the same slot is not this one */
	assert_int_equal(fr_peer_key_learn(comms[1], 0, mem->id + FR_RKEY_CACHE,
					   NULL, 0, &k2),
			 FR_EPROTO);
	assert_int_equal(fr_mem_user_deregister(mem), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
		T(test_connect_on_first_use), T(test_connect_refused),
		T(test_credits_flow_control), T(test_abort_reaches_everyone),
		T(test_bye_at_destroy),	      T(test_peer_destroyed),
		T(test_killed_peer),	      T(test_broken_connection),
		T(test_write_outside_memory), T(test_corrupt_magic),
		T(test_corrupt_type),	      T(test_corrupt_length),
		T(test_corrupt_count),	      T(test_lost_message),
		T(test_no_patience_circle),   T(test_corrupt_compact),
		T(test_small_messages),	      T(test_split_shares_connections),
		T(test_zero_copy_steps),      T(test_zero_copy_chunks),
		T(test_zero_copy_fold),	      T(test_peer_keys),
#undef T
	};

	fixture_init("FR_LOG");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
