/* SPDX-License-Identifier: MIT */
/*
 * test_engine.c - requests and the progress engine (src/request.c,
 * src/progress.c, src/coll.c) against the in-process fake transport
 * (fake_tp.c): completion order, fr_test on finished requests, timeouts
 * that fail every pending request, the failed communicator's later calls,
 * fr_progress with nothing to do, the progress thread, blocking calls from
 * one thread per rank, All-Reduce results on 1, 2, 3 and 5 ranks
 * against a reference, and collectives that complete although a rank that
 * had finished its part failed at its next call and left (the double
 * binary tree, broadcast, reduce).
 *
 * A job of N communicators lives in this process (fake_job_create: the
 * real fr_comm_create over transport "fake").  Most tests drive all ranks'
 * non-blocking calls from this thread, round-robin (deterministic); the
 * progress-thread and blocking tests use threads, as their subject does.
 * Nothing here reads struct fr_comm: the public API, fr_comm_stats and the
 * fake's counters say what happened.
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

#include "fake_fixture.h"
#include "fake_tp.h"
#include "fastreduce.h"
#include "log.h"
#include "peer.h" /* FR_IMM_MSG */
#include "reference.h"

#define DRIVE_MS 30000 /* a hang is a failure, never a stuck test */

static uint64_t collectives(fr_comm_t *c)
{
	fr_stats_t s;

	memset(&s, 0, sizeof(s));
	s.size = sizeof(s);
	assert_int_equal(fr_comm_stats(c, &s), 0);
	return s.collectives;
}

/* Element i of rank r's input for collective k: small integers, so f32
 * sums are exact in any order. */
static float val(int r, int k, size_t i)
{
	return (float)((r + 1) * (int)((i + (size_t)k) % 11) + k);
}

static void fill(float *b, int r, int k, size_t count)
{
	for (size_t i = 0; i < count; i++)
		b[i] = val(r, k, i);
}

static void check_sum(const float *b, int n, int k, size_t count,
		      const char *who)
{
	for (size_t i = 0; i < count; i++) {
		float want = 0;

		for (int q = 0; q < n; q++)
			want += val(q, k, i);
		if (b[i] != want)
			fail_msg("%s: collective %d, element %zu is %g, not %g",
				 who, k, i, (double)b[i], (double)want);
	}
}

/* ---- order and fr_test -----------------------------------------------------
 */

/*
 * Five All-Reduces of different sizes in flight on each of 3 ranks,
 * tested newest first: a request is never reported done before an older
 * one, when one is done every older one is done already (fr_test says so
 * without further progress, and the completed-collectives counter has
 * counted them), and every result is right.
 */
static void test_completion_order(void **state)
{
	enum { N = 3, K = 5 };
	static const size_t counts[K] = {1, 5000, 37, 20000, 300};
	fr_config_t cfg = config(20000, FR_ALGO_AUTO);
	fr_request_t *rq[N][K];
	float *b[N][K];
	bool done[N][K];
	uint64_t base[N], end = 0;

	(void)state;
	cfg.segment_bytes = 4096; /* several segments for the large ones */
	job(N, &cfg);
	for (int r = 0; r < N; r++) {
		base[r] = collectives(comms[r]);
		for (int k = 0; k < K; k++) {
			b[r][k] = tbuf(counts[k] * sizeof(float));
			fill(b[r][k], r, k, counts[k]);
			done[r][k] = false;
			assert_int_equal(fr_iallreduce(comms[r], b[r][k],
						       b[r][k], counts[k],
						       FR_F32, FR_SUM,
						       &rq[r][k]),
					 0);
		}
	}
	end = now_ms() + DRIVE_MS;
	for (int left = N * K; left;) {
		if (now_ms() > end)
			fail_msg("%d requests still pending", left);
		for (int r = 0; r < N; r++)
			for (int k = K - 1; k >= 0; k--) {
				int d = 0, rc;

				if (done[r][k])
					continue;
				rc = fr_test(&rq[r][k], &d);
				if (!d)
					continue;
				if (rc)
					fail_msg("rank %d, request %d: %s: %s",
						 r, k, fr_errname(rc),
						 fr_comm_last_error(comms[r]));
				assert_null(rq[r][k]);
				done[r][k] = true;
				left--;
				assert_true(collectives(comms[r]) >=
					    base[r] + (uint64_t)k + 1);
				/* the older ones are done already */
				for (int j = 0; j < k; j++) {
					if (done[r][j])
						continue;
					assert_int_equal(fr_test(&rq[r][j], &d),
							 0);
					if (!d)
						fail_msg(
							"rank %d: request %d done before request %d",
							r, k, j);
					done[r][j] = true;
					left--;
				}
			}
	}
	for (int r = 0; r < N; r++) {
		assert_int_equal(collectives(comms[r]), base[r] + K);
		for (int k = 0; k < K; k++)
			check_sum(b[r][k], N, k, counts[k], "order");
	}
}

/*
 * fr_test on a request that finished while only fr_progress ran: done at
 * the first call, with its result, the handle cleared; the cleared handle
 * (and NULL arguments) are FR_EINVAL, not a crash; fr_wait likewise.
 */
static void test_test_finished(void **state)
{
	enum { N = 2, COUNT = 1000 };
	fr_config_t cfg = config(20000, FR_ALGO_AUTO);
	fr_request_t *rq[N], *kept;
	float *b[N];
	uint64_t end;
	int d;

	(void)state;
	job(N, &cfg);
	for (int r = 0; r < N; r++) {
		b[r] = tbuf(COUNT * sizeof(float));
		fill(b[r], r, 3, COUNT);
		assert_int_equal(fr_iallreduce(comms[r], b[r], b[r], COUNT,
					       FR_F32, FR_SUM, &rq[r]),
				 0);
	}
	end = now_ms() + DRIVE_MS;
	while (collectives(comms[0]) < 1 || collectives(comms[1]) < 1) {
		if (now_ms() > end)
			fail_msg("fr_progress never finished the collective");
		for (int r = 0; r < N; r++)
			assert_int_equal(fr_progress(comms[r]), 0);
	}
	for (int r = 0; r < N; r++) {
		d = -1;
		assert_int_equal(fr_test(&rq[r], &d), 0);
		assert_int_equal(d, 1);
		assert_null(rq[r]);
		check_sum(b[r], N, 3, COUNT, "finished");
		/* the handle is gone now */
		d = -1;
		assert_int_equal(fr_test(&rq[r], &d), FR_EINVAL);
		assert_int_equal(fr_wait(&rq[r]), FR_EINVAL);
	}
	assert_int_equal(fr_test(NULL, &d), FR_EINVAL);
	/* a pending request and no `done`: refused, and still pending */
	assert_int_equal(fr_iallreduce(comms[0], b[0], b[0], COUNT, FR_F32,
				       FR_SUM, &kept),
			 0);
	assert_int_equal(fr_test(&kept, NULL), FR_EINVAL);
	assert_non_null(kept);
	assert_int_equal(fr_iallreduce(comms[1], b[1], b[1], COUNT, FR_F32,
				       FR_SUM, &rq[1]),
			 0);
	rq[0] = kept;
	{
		int rc[N] = {1, 1};

		assert_int_equal(fake_job_drive(comms, N, rq, rc, N, DRIVE_MS),
				 0);
		assert_int_equal(rc[0], 0);
		assert_int_equal(rc[1], 0);
	}
}

/* fr_progress with nothing pending: 0, no writes, no connections, no
 * timeout however long nothing happens. */
static void test_progress_idle(void **state)
{
	fr_config_t cfg = config(1000, FR_ALGO_AUTO);
	fr_comm_t *one = NULL;
	float x = 2.5f;
	uint64_t w;

	(void)state;
	assert_int_equal(fr_progress(NULL), FR_EINVAL);
	job(2, &cfg);
	for (int i = 0; i < 100; i++)
		for (int r = 0; r < 2; r++)
			assert_int_equal(fr_progress(comms[r]), 0);
	assert_int_equal(fake_tp_writes(-1, -1, -1), 0);
	assert_int_equal(fake_tp_connects_total(), 0);
	sleep_ms(2200); /* two timeouts of nothing pending */
	for (int r = 0; r < 2; r++)
		assert_int_equal(fr_progress(comms[r]), 0);
	assert_string_equal(fr_comm_last_error(comms[0]), "");

	/* after a collective: progress is quiet again */
	{
		fr_request_t *rq[2];
		float *b[2];
		int rc[2] = {1, 1};

		for (int r = 0; r < 2; r++) {
			b[r] = tbuf(64 * sizeof(float));
			fill(b[r], r, 0, 64);
			assert_int_equal(fr_iallreduce(comms[r], b[r], b[r], 64,
						       FR_F32, FR_SUM, &rq[r]),
					 0);
		}
		assert_int_equal(fake_job_drive(comms, 2, rq, rc, 2, DRIVE_MS),
				 0);
		assert_int_equal(rc[0], 0);
		assert_int_equal(rc[1], 0);
	}
	for (int i = 0; i < 20; i++)
		for (int r = 0; r < 2; r++)
			assert_int_equal(fr_progress(comms[r]), 0);
	w = fake_tp_writes(-1, -1, -1);
	for (int i = 0; i < 100; i++)
		for (int r = 0; r < 2; r++)
			assert_int_equal(fr_progress(comms[r]), 0);
	assert_int_equal(fake_tp_writes(-1, -1, -1), w);

	/* one rank: nothing to progress, ever */
	fr_config_init(&cfg);
	cfg.rank = 0;
	cfg.nranks = 1;
	cfg.transport = "fake";
	assert_int_equal(fr_comm_create(&cfg, &one), 0);
	assert_int_equal(fr_progress(one), 0);
	assert_int_equal(fr_allreduce(one, &x, &x, 1, FR_F32, FR_SUM), 0);
	assert_true(x == 2.5f);
	assert_int_equal(fr_progress(one), 0);
	assert_int_equal(fr_comm_destroy(one), 0);
}

/* ---- timeouts and failure ---------------------------------------------------
 */

/*
 * Rank 1 hangs (the fake holds back everything of its endpoint) with
 * three All-Reduces in flight on rank 0: after the 1 s timeout, all
 * three fail with FR_ETIMEDOUT, and the message names rank 1 as the one
 * waited on.  From then on every call on rank 0 returns FR_ETIMEDOUT and
 * the first message stays.
 */
static void test_timeout_fails_all(void **state)
{
	enum { K = 3, COUNT = 4096 };
	fr_config_t cfg = config(1000, FR_ALGO_RING);
	fr_request_t *rq[K];
	int rc[K];
	float *b[2][K];
	char first[512];
	uint64_t t0;

	(void)state;
	job(2, &cfg);
	{
		/* connected and working first */
		fr_request_t *r2[2];
		int c2[2] = {1, 1};

		for (int r = 0; r < 2; r++) {
			b[r][0] = tbuf(COUNT * sizeof(float));
			fill(b[r][0], r, 0, COUNT);
			assert_int_equal(fr_iallreduce(comms[r], b[r][0],
						       b[r][0], COUNT, FR_F32,
						       FR_SUM, &r2[r]),
					 0);
		}
		assert_int_equal(fake_job_drive(comms, 2, r2, c2, 2, DRIVE_MS),
				 0);
		assert_int_equal(c2[0] | c2[1], 0);
	}
	fake_tp_freeze(1, true);
	t0 = now_ms();
	for (int k = 0; k < K; k++) {
		b[0][k] = tbuf(COUNT * sizeof(float));
		fill(b[0][k], 0, k, COUNT);
		rc[k] = 1;
		assert_int_equal(fr_iallreduce(comms[0], b[0][k], b[0][k],
					       COUNT, FR_F32, FR_SUM, &rq[k]),
				 0);
	}
	/* only rank 0 runs: rank 1 is hung */
	assert_int_equal(fake_job_drive(comms, 1, rq, rc, K, DRIVE_MS), 0);
	assert_true(now_ms() - t0 >= 900);
	for (int k = 0; k < K; k++)
		if (rc[k] != FR_ETIMEDOUT)
			fail_msg("request %d: %s (%s)", k, fr_errname(rc[k]),
				 fr_comm_last_error(comms[0]));
	assert_contains(fr_comm_last_error(comms[0]),
			"waiting on rank 1, which does not answer");
	assert_contains(fr_comm_last_error(comms[0]), "rank 0: collective #1");
	snprintf(first, sizeof(first), "%s", fr_comm_last_error(comms[0]));

	/* every later call: the same error, the first message kept */
	{
		fr_request_t *r = (fr_request_t *)1;
		float x = 1;

		assert_int_equal(
			fr_iallreduce(comms[0], &x, &x, 1, FR_F32, FR_SUM, &r),
			FR_ETIMEDOUT);
		assert_null(r);
		assert_int_equal(
			fr_allreduce(comms[0], &x, &x, 1, FR_F32, FR_SUM),
			FR_ETIMEDOUT);
		assert_int_equal(fr_barrier(comms[0]), FR_ETIMEDOUT);
		assert_int_equal(fr_broadcast(comms[0], &x, 1, FR_F32, 0),
				 FR_ETIMEDOUT);
		assert_int_equal(fr_progress(comms[0]), FR_ETIMEDOUT);
		assert_string_equal(fr_comm_last_error(comms[0]), first);
	}
	fake_tp_freeze(1, false);
}

/*
 * The same with a hung rank of three, blocking: the two others' blocking
 * fr_allreduce (one thread each) return FR_ETIMEDOUT within a few
 * timeouts instead of hanging.
 */
struct blocker {
	fr_comm_t *comm;
	size_t count;
	int colls;
	int rank, n;
	int rc;
	uint64_t took_ms;
};

static void *blocking_main(void *arg)
{
	struct blocker *bl = arg;
	float *b = malloc(bl->count * sizeof(float) + 1);
	uint64_t t0 = now_ms();

	bl->rc = b ? 0 : FR_ENOMEM;
	for (int k = 0; k < bl->colls && !bl->rc; k++) {
		fill(b, bl->rank, k, bl->count);
		bl->rc =
			fr_allreduce(bl->comm, b, b, bl->count, FR_F32, FR_SUM);
		for (size_t i = 0; i < bl->count && !bl->rc; i++) {
			float want = 0;

			for (int q = 0; q < bl->n; q++)
				want += val(q, k, i);
			if (b[i] != want)
				bl->rc = 1; /* wrong result */
		}
	}
	bl->took_ms = now_ms() - t0;
	free(b);
	return NULL;
}

static void test_timeout_blocking(void **state)
{
	enum { N = 3 };
	fr_config_t cfg = config(1000, FR_ALGO_RING);
	struct blocker bl[N];
	pthread_t t[N];
	int timed_out = 0;

	(void)state;
	job(N, &cfg);
	fake_tp_freeze(2, true);
	for (int r = 0; r < 2; r++) {
		bl[r] = (struct blocker){.comm = comms[r],
					 .count = 1000,
					 .colls = 1,
					 .rank = r,
					 .n = N};
		assert_int_equal(
			pthread_create(&t[r], NULL, blocking_main, &bl[r]), 0);
	}
	for (int r = 0; r < 2; r++)
		pthread_join(t[r], NULL);
	for (int r = 0; r < 2; r++) {
		bool told = strstr(fr_comm_last_error(comms[r]), "aborted");

		if (bl[r].rc != FR_ETIMEDOUT)
			fail_msg("rank %d: %s (%s)", r, fr_errname(bl[r].rc),
				 fr_comm_last_error(comms[r]));
		/* a rank that timed out itself waited the timeout; one that
		 * heard the other's ABORT may have started its call later
		 * (under valgrind the threads run one at a time: CI saw
		 * one of them start late and fail the bound) */
		if (!told)
			assert_true(bl[r].took_ms >= 900);
		timed_out += !told;
		assert_true(bl[r].took_ms < 20000);
	}
	assert_true(timed_out >= 1);
	/* the rank that waited on the hung one says so (the other may
	 * have timed out waiting on it, or heard its ABORT) */
	assert_contains(fr_comm_last_error(comms[0]), "rank 2");
	fake_tp_freeze(2, false);
}

/* ---- threads ----------------------------------------------------------------
 */

/*
 * With the progress thread (config progress = thread), All-Reduces started
 * on every rank complete while the application makes no call that drives
 * them (only fr_comm_stats, which takes the lock but progresses nothing);
 * fr_test then finds them done at once, and fr_wait works too.
 */
static void test_progress_thread(void **state)
{
	enum { N = 3, COUNT = 20000 };
	fr_config_t cfg = config(20000, FR_ALGO_AUTO);
	fr_request_t *rq[N];
	float *b[N];
	uint64_t end;

	(void)state;
	cfg.progress = FR_PROGRESS_THREAD;
	job(N, &cfg);
	for (int r = 0; r < N; r++) {
		b[r] = tbuf(COUNT * sizeof(float));
		fill(b[r], r, 1, COUNT);
		assert_int_equal(fr_iallreduce(comms[r], b[r], b[r], COUNT,
					       FR_F32, FR_SUM, &rq[r]),
				 0);
	}
	end = now_ms() + DRIVE_MS;
	for (int r = 0; r < N; r++)
		while (collectives(comms[r]) < 1) {
			if (now_ms() > end)
				fail_msg(
					"rank %d: the progress thread did not finish the collective",
					r);
			sleep_ms(1);
		}
	for (int r = 0; r < N; r++) {
		int d = 0;

		assert_int_equal(fr_test(&rq[r], &d), 0);
		assert_int_equal(d, 1);
		check_sum(b[r], N, 1, COUNT, "progress thread");
	}
	/* and fr_wait, each rank waiting in turn from this one thread: the
	 * progress threads of the others move them meanwhile */
	for (int r = 0; r < N; r++) {
		fill(b[r], r, 2, COUNT);
		assert_int_equal(fr_iallreduce(comms[r], b[r], b[r], COUNT,
					       FR_F32, FR_SUM, &rq[r]),
				 0);
	}
	for (int r = 0; r < N; r++) {
		assert_int_equal(fr_wait(&rq[r]), 0);
		assert_null(rq[r]);
		check_sum(b[r], N, 2, COUNT, "fr_wait");
	}
}

/* Blocking All-Reduces, one thread per rank, ten in a row of growing
 * sizes: the fake's wait() and wake() under the engine's sleep. */
static void test_blocking_threads(void **state)
{
	enum { N = 4 };
	static const size_t counts[] = {1, 100, 3000, 50000};
	fr_config_t cfg = config(20000, FR_ALGO_AUTO);
	struct blocker bl[N];
	pthread_t t[N];

	(void)state;
	cfg.segment_bytes = 8192;
	job(N, &cfg);
	for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
		for (int r = 0; r < N; r++) {
			bl[r] = (struct blocker){.comm = comms[r],
						 .count = counts[c],
						 .colls = 3,
						 .rank = r,
						 .n = N};
			assert_int_equal(pthread_create(&t[r], NULL,
							blocking_main, &bl[r]),
					 0);
		}
		for (int r = 0; r < N; r++)
			pthread_join(t[r], NULL);
		for (int r = 0; r < N; r++)
			if (bl[r].rc)
				fail_msg("count %zu, rank %d: %s (%s)",
					 counts[c], r,
					 bl[r].rc == 1 ? "wrong result"
						       : fr_errname(bl[r].rc),
					 fr_comm_last_error(comms[r]));
	}
	for (int r = 0; r < N; r++)
		assert_int_equal(collectives(comms[r]),
				 3 * sizeof(counts) / sizeof(counts[0]));
}

/* ---- results ----------------------------------------------------------------
 */

/* Reference: rank 0's input combined with rank 1's, ..., in rank order
 * (exact for the inputs and operations used here). */
static void reference(fr_dtype_t dt, fr_op_t op, int n, size_t count,
		      uint32_t seed, void *out, void *tmp)
{
	ref_fill(dt, out, count, 0, seed);
	for (int r = 1; r < n; r++) {
		ref_fill(dt, tmp, count, r, seed);
		ref_combine(dt, op, out, out, tmp, count);
	}
}

/*
 * All-Reduce over 1, 2, 3 and 5 ranks, for each algorithm, several
 * datatypes and operations whose result does not depend on the order of
 * the reduction (integer-valued floats, wrapping integers, max/min), sizes
 * from one element to several pipeline segments, in place and not: every
 * rank's result equals the reference bit for bit (so all ranks agree).
 */
static void test_results_reference(void **state)
{
	static const int sizes[] = {1, 2, 3, 5};
	static const int algos[] = {FR_ALGO_AUTO, FR_ALGO_RING, FR_ALGO_RD,
				    FR_ALGO_RABENSEIFNER};
	static const struct {
		fr_dtype_t dt;
		fr_op_t op;
	} cases[] = {
		{FR_F32, FR_SUM}, {FR_BF16, FR_SUM}, {FR_I32, FR_SUM},
		{FR_U8, FR_PROD}, {FR_F64, FR_MAX},  {FR_I64, FR_MIN},
		{FR_F16, FR_SUM},
	};
	static const size_t counts[] = {1, 7, 1000, 12345};
	uint32_t seed = 1;

	(void)state;
	for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++)
		for (size_t ai = 0; ai < sizeof(algos) / sizeof(algos[0]);
		     ai++) {
			const int n = sizes[si];
			fr_config_t cfg = config(20000, algos[ai]);

			if (n == 1 && ai > 0)
				continue; /* nothing to choose */
			cfg.segment_bytes = 2048;
			setup(NULL);
			job(n, &cfg);
			for (size_t ci = 0;
			     ci < sizeof(cases) / sizeof(cases[0]); ci++)
				for (size_t ki = 0;
				     ki < sizeof(counts) / sizeof(counts[0]);
				     ki++) {
					fr_dtype_t dt = cases[ci].dt;
					fr_op_t op = cases[ci].op;
					size_t count = counts[ki];
					size_t bytes =
						count * fr_dtype_size(dt);
					bool inplace = (ki + ci) % 2 == 0;
					uint8_t *want = malloc(bytes),
						*tmp = malloc(bytes);
					uint8_t *in[MAXN], *out[MAXN];
					fr_request_t *rq[MAXN];
					int rc[MAXN];
					char diff[256];

					assert_non_null(want);
					assert_non_null(tmp);
					seed++;
					reference(dt, op, n, count, seed, want,
						  tmp);
					for (int r = 0; r < n; r++) {
						in[r] = malloc(bytes);
						out[r] =
							inplace ? in[r]
								: malloc(bytes);
						assert_non_null(in[r]);
						assert_non_null(out[r]);
						ref_fill(dt, in[r], count, r,
							 seed);
						if (!inplace)
							memset(out[r], 0x5c,
							       bytes);
						rc[r] = 1;
						assert_int_equal(
							fr_iallreduce(
								comms[r], in[r],
								out[r], count,
								dt, op, &rq[r]),
							0);
					}
					assert_int_equal(
						fake_job_drive(comms, n, rq, rc,
							       n, DRIVE_MS),
						0);
					for (int r = 0; r < n; r++) {
						if (rc[r])
							fail_msg(
								"%d ranks, %s: %s %s x %zu: rank %d: %s (%s)",
								n,
								fr_algo_name(
									algos[ai]),
								fr_dtype_name(
									dt),
								fr_op_name(op),
								count, r,
								fr_errname(
									rc[r]),
								fr_comm_last_error(
									comms[r]));
						if (memcmp(out[r], want, bytes))
							fail_msg(
								"%d ranks, %s: %s %s x %zu (%s): rank %d differs from the reference at %s",
								n,
								fr_algo_name(
									algos[ai]),
								fr_dtype_name(
									dt),
								fr_op_name(op),
								count,
								inplace ? "in place"
									: "out of place",
								r,
								ref_first_diff(
									dt,
									out[r],
									want,
									count,
									diff,
									sizeof(diff)));
						/* out of place: the input
						 * is untouched */
						if (!inplace) {
							ref_fill(dt, tmp, count,
								 r, seed);
							assert_memory_equal(
								in[r], tmp,
								bytes);
						}
					}
					for (int r = 0; r < n; r++) {
						if (!inplace)
							free(out[r]);
						free(in[r]);
					}
					free(want);
					free(tmp);
				}
			/* the algorithm asked for ran (auto and 1 rank aside)
			 */
			if (n > 1 && algos[ai] != FR_ALGO_AUTO)
				assert_int_equal(fr_comm_last_algo(comms[0]),
						 algos[ai]);
			teardown(NULL);
		}
}

/* ---- arguments -----------------------------------------------------------
 */

/*
 * All-Reduce's and all-to-all's buffers (coll.c, plain_bufs): the same
 * pointer twice is in place and runs; with data, a NULL buffer or buffers
 * that overlap without being equal are FR_EINVAL with a message naming the
 * collective; with no data, NULL is fine.  (One rank: a refusal fails a
 * larger communicator.)
 */
static void test_plain_buffers(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_AUTO);
	float b[8] = {1, 2, 3, 4, 5, 6, 7, 8};

	(void)state;
	job(1, &cfg);
	assert_int_equal(fr_allreduce(comms[0], b, b, 8, FR_F32, FR_SUM), 0);
	assert_true(b[7] == 8);
	assert_int_equal(fr_alltoall(comms[0], b, b, 8, FR_F32), 0);
	assert_int_equal(fr_allreduce(comms[0], NULL, NULL, 0, FR_F32, FR_SUM),
			 0);
	assert_int_equal(fr_alltoall(comms[0], NULL, NULL, 0, FR_F32), 0);
	assert_int_equal(fr_allreduce(comms[0], b, NULL, 8, FR_F32, FR_SUM),
			 FR_EINVAL);
	assert_contains(fr_comm_last_error(comms[0]),
			"allreduce: NULL buffer with count 8");
	assert_int_equal(fr_alltoall(comms[0], NULL, b, 8, FR_F32), FR_EINVAL);
	assert_contains(fr_comm_last_error(comms[0]),
			"alltoall: NULL buffer with count 8");
	assert_int_equal(fr_allreduce(comms[0], b, b + 1, 4, FR_F32, FR_SUM),
			 FR_EINVAL);
	assert_contains(fr_comm_last_error(comms[0]),
			"allreduce: send and receive buffers overlap");
	assert_int_equal(fr_alltoall(comms[0], b + 1, b, 4, FR_F32), FR_EINVAL);
	assert_contains(fr_comm_last_error(comms[0]),
			"alltoall: send and receive buffers overlap");
	/* adjacent is not overlapping */
	assert_int_equal(fr_allreduce(comms[0], b, b + 4, 4, FR_F32, FR_SUM),
			 0);
	assert_true(b[4] == 1 && b[7] == 4);
}

/*
 * All-to-all's buffers are n blocks long: on 2 ranks, buffers 4 elements
 * apart overlap (8 each), though one block (4) would not.
 */
static void test_plain_buffers_alltoall(void **state)
{
	fr_config_t cfg = config(20000, FR_ALGO_AUTO);
	float b[12] = {0};

	(void)state;
	job(2, &cfg);
	assert_int_equal(fr_alltoall(comms[0], b, b + 4, 4, FR_F32), FR_EINVAL);
	assert_contains(fr_comm_last_error(comms[0]),
			"alltoall: send and receive buffers overlap");
}

/* ---- a rank that finished and left ----------------------------------------
 */

/* fr_test on every rank of ranks[] not done yet; a failure fails the test. */
static void drive_some(fr_request_t **rq, int *done, const int *ranks, int k)
{
	for (int i = 0; i < k; i++) {
		int r = ranks[i], rc;

		if (done[r])
			continue;
		rc = fr_test(&rq[r], &done[r]);
		if (rc)
			fail_msg("rank %d failed: %s (%s)", r, fr_errname(rc),
				 fr_comm_last_error(comms[r]));
	}
}

/* Rank r fails at its next call (avg on integers, refused) and leaves. */
static void fail_and_leave(int r)
{
	uint8_t u8 = 1;

	assert_int_equal(fr_allreduce(comms[r], &u8, &u8, 1, FR_U8, FR_AVG),
			 FR_EINVAL);
	fr_comm_destroy(comms[r]);
	comms[r] = NULL;
}

/*
 * A rank that has finished a collective may leave (here: a refused call
 * fails its communicator, and it destroys it) while the others still
 * finish theirs; what they still need comes from ranks that stay, so
 * they must complete, and fail only at their next collective.
 *
 * The double binary tree on 5 ranks: rank 1 is tree 1's root, rank 0 its
 * only child, which passes that half down to rank 3.  Rank 3 sends all it
 * has to send up, then hangs (frozen) without taking what comes down:
 * rank 0 has all it receives and only sends to rank 3 left, waiting for
 * credits, when rank 1 finishes and leaves (before rank 0 has read its
 * last messages, most likely).  Rank 0 must neither take rank 1 for the
 * rank it waits on, nor fail because rank 1's connection closed or its
 * last messages are still unread.
 */
static void test_peer_left_early(void **state)
{
	const int n = 5, all[] = {0, 1, 2, 3, 4}, most[] = {0, 2, 4};
	const size_t count = 16 * 1024; /* 64 KiB of f32: 2 x 256 fragments */
	fr_config_t cfg = config(20000, FR_ALGO_TREE);
	float *b[MAXN];
	fr_request_t *rq[MAXN];
	int rc[MAXN], done[MAXN] = {0};
	uint64_t deadline, up3;

	(void)state;
	setenv("FR_EAGER_BYTES", "128", 1);
	job(n, &cfg);
	for (int r = 0; r < n; r++)
		b[r] = tbuf(count * sizeof(float));
	/* a first run counts rank 3's messages up to rank 0 (tree 1's only
	 * traffic between them) */
	for (int r = 0; r < n; r++) {
		fill(b[r], r, 2, count);
		rc[r] = 1;
		assert_int_equal(fr_iallreduce(comms[r], FR_IN_PLACE, b[r],
					       count, FR_F32, FR_SUM, &rq[r]),
				 0);
	}
	assert_int_equal(fake_job_drive(comms, n, rq, rc, n, DRIVE_MS), 0);
	for (int r = 0; r < n; r++)
		assert_int_equal(rc[r], 0);
	assert_int_equal(fr_comm_last_algo(comms[0]), FR_ALGO_TREE);
	up3 = fake_tp_writes(3, 0, FR_IMM_MSG);
	assert_true(up3 >= 64);

	fake_tp_reset();
	for (int r = 0; r < n; r++) {
		fill(b[r], r, 3, count);
		assert_int_equal(fr_iallreduce(comms[r], FR_IN_PLACE, b[r],
					       count, FR_F32, FR_SUM, &rq[r]),
				 0);
	}
	/* rank 1 (the root of tree 1) one round in 16, so that the half
	 * coming down lags; rank 3 until all its messages up have left */
	deadline = now_ms() + DRIVE_MS;
	for (int round = 0; fake_tp_writes(3, 0, FR_IMM_MSG) < up3; round++) {
		assert_true(now_ms() < deadline);
		for (int r = 0; r < n; r++)
			if (r != 1 || round % 16 == 0)
				drive_some(rq, done, &all[r], 1);
	}
	drive_some(rq, done, &all[3], 1); /* its last writes leave */
	fake_tp_freeze(3, true);
	/* rank 0 one round in 4: rank 1's last messages to it are likely
	 * still unread when rank 1 leaves */
	for (int round = 0; !done[1]; round++) {
		assert_true(now_ms() < deadline);
		for (int r = 0; r < n; r++)
			if (r != 0 || round % 4 == 0)
				drive_some(rq, done, &all[r], 1);
	}
	check_sum(b[1], n, 3, count, "rank 1");
	assert_false(done[0]); /* its sends to rank 3 wait */
	assert_false(done[3]);
	fail_and_leave(1);
	for (int round = 0; round < 2000; round++)
		drive_some(rq, done, most, 3);
	assert_false(done[0]); /* still waiting for rank 3, not failed */
	fake_tp_freeze(3, false);
	while (!done[0] || !done[2] || !done[3] || !done[4]) {
		assert_true(now_ms() < deadline);
		drive_some(rq, done, most, 3);
		drive_some(rq, done, &all[3], 1);
	}
	for (int r = 0; r < n; r++) {
		char who[16];

		if (r == 1)
			continue;
		snprintf(who, sizeof(who), "rank %d", r);
		check_sum(b[r], n, 3, count, who);
		/* the job has failed: the next collective says so */
		assert_int_equal(fr_barrier(comms[r]), FR_EPEER);
		assert_contains(fr_comm_last_error(comms[r]),
				"rank 1 failed first");
	}
}

/*
 * The same for broadcast and reduce down and up the binomial tree
 * (FR_ALGO_TREE) on 4 ranks, rooted at 0: 0 -> {2, 1}, 2 -> 3.  Rank 3
 * hangs.  Broadcast: rank 2 still passes the message down to it when the
 * root has sent all and leaves.  Reduce (the root folds rank 1's in
 * first): the root still waits for rank 2's when rank 1 has sent all up
 * and leaves.  Neither may fail for the rank that left.
 */
static void tree_partner_left(bool reduce)
{
	const int n = 4, leaver = reduce ? 1 : 0, hung = 3;
	const size_t count = 16 * 1024;
	fr_config_t cfg = config(20000, FR_ALGO_TREE);
	float *b[MAXN], *in[MAXN];
	fr_request_t *rq[MAXN];
	int rc[MAXN], done[MAXN] = {0}, rest[2], k = 0;
	uint64_t deadline;

	setenv("FR_EAGER_BYTES", "128", 1);
	job(n, &cfg);
	for (int r = 0; r < n; r++) {
		b[r] = tbuf(count * sizeof(float));
		in[r] = tbuf(count * sizeof(float));
		if (r != leaver && r != hung)
			rest[k++] = r;
	}
	for (int round = 2; round <= 3; round++) {
		for (int r = 0; r < n; r++) {
			fill(in[r], r, round, count);
			/* broadcast: the root's message, zeros elsewhere */
			if (!reduce && r)
				memset(b[r], 0, count * sizeof(float));
			else
				fill(b[r], 0, round, count);
			rc[r] = 1;
			done[r] = 0;
			assert_int_equal(
				reduce ? fr_ireduce(comms[r], in[r], b[r],
						    count, FR_F32, FR_SUM, 0,
						    &rq[r])
				       : fr_ibroadcast(comms[r], b[r], count,
						       FR_F32, 0, &rq[r]),
				0);
		}
		if (round == 2) {
			/* the first connects everyone */
			assert_int_equal(
				fake_job_drive(comms, n, rq, rc, n, DRIVE_MS),
				0);
			for (int r = 0; r < n; r++)
				assert_int_equal(rc[r], 0);
			assert_int_equal(fr_comm_last_algo(comms[0]),
					 FR_ALGO_TREE);
		}
	}
	fake_tp_freeze(hung, true);
	deadline = now_ms() + DRIVE_MS;
	while (!done[leaver]) {
		assert_true(now_ms() < deadline);
		for (int r = 0; r < n; r++)
			if (r != hung)
				drive_some(rq, done, &r, 1);
	}
	fail_and_leave(leaver);
	for (int round = 0; round < 2000; round++)
		drive_some(rq, done, rest, 2);
	assert_false(done[reduce ? 0 : 2]); /* waits for the hung rank */
	fake_tp_freeze(hung, false);
	for (int r = 0; r < n; r++)
		while (r != leaver && !done[r]) {
			assert_true(now_ms() < deadline);
			drive_some(rq, done, rest, 2);
			drive_some(rq, done, &hung, 1);
		}
	for (int r = 0; r < n; r++) {
		if (r == leaver)
			continue;
		if (!reduce)
			for (size_t i = 0; i < count; i++)
				if (b[r][i] != val(0, 3, i))
					fail_msg("rank %d: element %zu differs",
						 r, i);
		if (reduce && r == 0)
			check_sum(b[0], n, 3, count, "root");
		assert_int_equal(fr_barrier(comms[r]), FR_EPEER);
	}
}

static void test_bcast_root_left(void **state)
{
	(void)state;
	tree_partner_left(false);
}

static void test_reduce_child_left(void **state)
{
	(void)state;
	tree_partner_left(true);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
		T(test_completion_order),  T(test_test_finished),
		T(test_progress_idle),	   T(test_timeout_fails_all),
		T(test_timeout_blocking),  T(test_progress_thread),
		T(test_blocking_threads),  T(test_results_reference),
		T(test_plain_buffers),	   T(test_plain_buffers_alltoall),
		T(test_peer_left_early),   T(test_bcast_root_left),
		T(test_reduce_child_left),
#undef T
	};

	fixture_init("FR_PROGRESS_CPU");
	return cmocka_run_group_tests(tests, NULL, NULL);
}
