/* SPDX-License-Identifier: MIT */
/*
 * test_local.c - a job in one process without a rendezvous
 * (fr_comm_create_local, fr_comm_destroy_local in src/comm.c; what the
 * simulator in perf/sim builds on), over the in-process fake transport:
 *   - 1 to 9 ranks, non-powers of two among them, each algorithm that
 *     takes any rank count: All-Reduce results equal to a reference, bit
 *     for bit on every rank, counts 0, 1, < ranks, prime and large odd;
 *   - the node ids given are the layout (ranks per node, the two-level
 *     algorithm over it);
 *   - the job is destroyed from one thread without waiting out the
 *     goodbyes, every endpoint closed, also with a collective unfinished;
 *   - bad arguments and an unusable transport: an error code, a message,
 *     nothing left behind.
 * Unlike test_engine.c, it reads struct fr_comm: the layout is the point.
 */
/* cmocka.h needs these first, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_fixture.h"
#include "fake_tp.h"
#include "fastreduce.h"
#include "internal.h"
#include "reference.h"

#define DRIVE_MS 30000 /* a hang is a failure, never a stuck test */
#define LMAX 9

static fr_config_t local_config(int algo)
{
	fr_config_t cfg = config(20000, algo);

	cfg.transport = "fake";
	return cfg;
}

/* Destroy the job from this thread; it must not wait out the goodbye
 * (the timeout is 20 s; a goodbye between ranks of this process that
 * are driven in turn takes milliseconds), every pair of ranks that
 * connected must have said goodbye both ways (a BYE is the message in
 * the mailbox's last slot), and every endpoint must be closed.  The
 * fake's counters count from the job's creation (fake_tp_reset). */
static void destroy_job(fr_comm_t **c, int n)
{
	const uint32_t bye = FR_IMM(FR_IMM_MSG, FR_MBX_SLOTS + 1);
	uint64_t t0 = now_ms();

	assert_int_equal(fr_comm_destroy_local(n, c), 0);
	if (now_ms() - t0 > 10000)
		fail_msg(
			"fr_comm_destroy_local took %llu ms: a goodbye was waited out",
			(unsigned long long)(now_ms() - t0));
	for (int a = 0; a < n; a++)
		for (int b = 0; b < n; b++)
			if (fake_tp_connects(a, b) &&
			    (!fake_tp_writes_imm(a, b, bye) ||
			     !fake_tp_writes_imm(b, a, bye)))
				fail_msg(
					"ranks %d and %d of %d connected but did not both say goodbye",
					a, b, n);
	for (int r = 0; r < n; r++)
		assert_null(c[r]);
	assert_int_equal(fake_tp_endpoints(), 0);
}

/* One All-Reduce on every rank of c, driven from this thread, checked
 * against the reference (rank 0's input combined with rank 1's, ...). */
static void allreduce_check(fr_comm_t **c, int n, fr_dtype_t dt, fr_op_t op,
			    size_t count, uint32_t seed)
{
	size_t bytes = count * fr_dtype_size(dt);
	uint8_t *want = malloc(bytes + 1), *tmp = malloc(bytes + 1);
	uint8_t *buf[LMAX];
	fr_request_t *rq[LMAX];
	int rc[LMAX];
	char diff[256];

	assert_non_null(want);
	assert_non_null(tmp);
	ref_fill(dt, want, count, 0, seed);
	for (int r = 1; r < n; r++) {
		ref_fill(dt, tmp, count, r, seed);
		ref_combine(dt, op, want, want, tmp, count);
	}
	for (int r = 0; r < n; r++) {
		buf[r] = malloc(bytes + 1);
		assert_non_null(buf[r]);
		ref_fill(dt, buf[r], count, r, seed);
		rc[r] = 1;
		assert_int_equal(fr_iallreduce(c[r], buf[r], buf[r], count, dt,
					       op, &rq[r]),
				 0);
	}
	assert_int_equal(fake_job_drive(c, n, rq, rc, n, DRIVE_MS), 0);
	for (int r = 0; r < n; r++) {
		if (rc[r])
			fail_msg("%d ranks, %s %s x %zu: rank %d: %s (%s)", n,
				 fr_dtype_name(dt), fr_op_name(op), count, r,
				 fr_errname(rc[r]), fr_comm_last_error(c[r]));
		if (memcmp(buf[r], want, bytes))
			fail_msg(
				"%d ranks, %s %s x %zu: rank %d differs from the reference at %s",
				n, fr_dtype_name(dt), fr_op_name(op), count, r,
				ref_first_diff(dt, buf[r], want, count, diff,
					       sizeof(diff)));
		free(buf[r]);
	}
	free(want);
	free(tmp);
}

/*
 * Every rank count from 1 to 9 and each algorithm that takes any count:
 * the job's ranks know their rank and size, and All-Reduce agrees with
 * the reference for counts 0, 1, fewer than the ranks, a prime and a
 * large odd one.
 */
static void test_local_results(void **state)
{
	static const int algos[] = {FR_ALGO_AUTO, FR_ALGO_RING, FR_ALGO_RD,
				    FR_ALGO_RABENSEIFNER};
	static const size_t counts[] = {0, 1, 3, 1031, 40001};
	uint32_t seed = 7;

	(void)state;
	for (int n = 1; n <= LMAX; n++)
		for (size_t ai = 0; ai < sizeof(algos) / sizeof(algos[0]);
		     ai++) {
			fr_config_t cfg = local_config(algos[ai]);
			fr_comm_t *c[LMAX];

			if (n == 1 && ai > 0)
				continue; /* nothing to choose */
			cfg.segment_bytes = 4096;
			fake_tp_reset();
			if (fr_comm_create_local(&cfg, n, NULL, c))
				fail_msg("%d ranks: %s", n,
					 fr_comm_last_error(NULL));
			for (int r = 0; r < n; r++) {
				assert_int_equal(fr_comm_rank(c[r]), r);
				assert_int_equal(fr_comm_size(c[r]), n);
				assert_string_equal(fr_comm_transport(c[r]),
						    "fake");
			}
			for (size_t k = 0; k < sizeof(counts) / sizeof(*counts);
			     k++) {
				allreduce_check(c, n, FR_F32, FR_SUM, counts[k],
						seed++);
				allreduce_check(c, n, FR_I32, FR_MAX, counts[k],
						seed++);
			}
			if (n > 1 && algos[ai] != FR_ALGO_AUTO)
				assert_int_equal(fr_comm_last_algo(c[0]),
						 algos[ai]);
			destroy_job(c, n);
		}
}

/* The node ids given are the job's layout: 3 nodes of 2 ranks, numbered
 * in order of their lowest rank, and the two-level algorithm runs over
 * them (any layout: the ranks of a node need not be adjacent). */
static void test_local_nodes(void **state)
{
	static const uint64_t ids[6] = {70, 90, 70, 50, 90, 50};
	fr_config_t cfg = local_config(FR_ALGO_HIER);
	fr_comm_t *c[6];

	(void)state;
	if (fr_comm_create_local(&cfg, 6, ids, c))
		fail_msg("%s", fr_comm_last_error(NULL));
	for (int r = 0; r < 6; r++) {
		assert_int_equal(c[r]->topo.nnodes, 3);
		assert_true(c[r]->topo.nodes_regular);
		assert_int_equal(c[r]->topo.nlocal, 2);
		for (int k = 0; k < c[r]->topo.nlocal; k++)
			assert_int_equal(ids[c[r]->topo.local[k]], ids[r]);
		assert_int_equal(c[r]->topo.node_of[r], ids[r] == 70   ? 0
							: ids[r] == 90 ? 1
								       : 2);
	}
	allreduce_check(c, 6, FR_F32, FR_SUM, 1031, 3);
	allreduce_check(c, 6, FR_I64, FR_MIN, 5, 4);
	assert_int_equal(fr_comm_last_algo(c[0]), FR_ALGO_HIER);
	destroy_job(c, 6);
}

/*
 * A grid of nodes (FR_TOPO=2x2: 4 nodes of 2 ranks, node j at (j % 2,
 * j / 2)): each rank's levels are the rings of the grid's dimensions, and
 * the hierarchical All-Reduce over the node and both of them (three
 * levels) gives the reference's results.  A grid that does not hold the
 * nodes leaves one level above the node; one that is not a grid is
 * refused with a message.
 */
static void test_local_grid(void **state)
{
	/* nodes in order of their lowest rank: 30 (ranks 0, 4), 10 (1, 5),
	 * 20 (2, 3), 40 (6, 7) */
	static const uint64_t ids[8] = {30, 10, 20, 20, 30, 10, 40, 40};
	fr_config_t cfg = local_config(FR_ALGO_HIER);
	const struct fr_topo *t;
	fr_comm_t *c[8];

	(void)state;
	setenv("FR_TOPO", "2x2", 1);
	if (fr_comm_create_local(&cfg, 8, ids, c))
		fail_msg("%s", fr_comm_last_error(NULL));
	/* rank 5: node 1 = (1, 0), local index 1 */
	t = &c[5]->topo;
	assert_int_equal(t->nlevels, 2);
	assert_int_equal(t->nlevel[0], 2);
	assert_int_equal(t->level[0][0], 4); /* node 0's second rank */
	assert_int_equal(t->level[0][1], 5);
	assert_int_equal(t->level_index[0], 1);
	assert_int_equal(t->level[1][0], 5); /* node 1, then node 3 */
	assert_int_equal(t->level[1][1], 7);
	assert_int_equal(t->level_index[1], 0);
	/* rank 2: node 2 = (0, 1), local index 0 */
	t = &c[2]->topo;
	assert_int_equal(t->level[0][0], 2);
	assert_int_equal(t->level[0][1], 6);
	assert_int_equal(t->level[1][0], 0);
	assert_int_equal(t->level[1][1], 2);
	assert_int_equal(t->level_index[1], 1);
	allreduce_check(c, 8, FR_F32, FR_SUM, 1031, 5);
	allreduce_check(c, 8, FR_F64, FR_SUM, 40001, 6);
	allreduce_check(c, 8, FR_I32, FR_MAX, 3, 7);
	assert_int_equal(fr_comm_last_algo(c[0]), FR_ALGO_HIER);
	destroy_job(c, 8);

	setenv("FR_TOPO", "3x1x2", 1); /* 6 cells for 4 nodes */
	if (fr_comm_create_local(&cfg, 8, ids, c))
		fail_msg("%s", fr_comm_last_error(NULL));
	assert_int_equal(c[0]->topo.nlevels, 0);
	assert_int_equal(c[0]->topo.ncross, 4);
	allreduce_check(c, 8, FR_F32, FR_SUM, 1031, 8);
	destroy_job(c, 8);

	setenv("FR_TOPO", "2xx2", 1);
	assert_int_equal(fr_comm_create_local(&cfg, 8, ids, c), FR_EINVAL);
	assert_contains(fr_comm_last_error(NULL), "FR_TOPO");
	assert_int_equal(fake_tp_endpoints(), 0);
	unsetenv("FR_TOPO");
}

/* Writes rank 0 posted for one All-Reduce of count f32 (its results
 * checked against the reference). */
static uint64_t allreduce_writes(fr_comm_t **c, int n, size_t count,
				 uint32_t seed)
{
	fr_stats_t a = {.size = sizeof(a)}, b = {.size = sizeof(b)};

	assert_int_equal(fr_comm_stats(c[0], &a), 0);
	allreduce_check(c, n, FR_F32, FR_SUM, count, seed);
	assert_int_equal(fr_comm_stats(c[0], &b), 0);
	return b.writes - a.writes;
}

/*
 * The hierarchical All-Reduce's lanes: a vector of 8 FR_SEGMENT_BYTES or
 * more runs as up to 4 lanes, each the whole schedule on its own range,
 * pipelined through the levels.  With segments of 256 bytes, 1031 f32
 * (4124 bytes) make 2 lanes: on the 2x2 grid every phase of a lane is one
 * step of one fragment, so rank 0 writes twice what it writes without
 * lanes (512 KiB segments: one lane), and the results stay the
 * reference's; 4 lanes (40001 f64) on the grid, and on two levels.
 */
static void test_local_lanes(void **state)
{
	static const uint64_t ids[8] = {30, 10, 20, 20, 30, 10, 40, 40};
	fr_config_t cfg = local_config(FR_ALGO_HIER);
	uint64_t one, two;
	fr_comm_t *c[8];

	(void)state;
	setenv("FR_TOPO", "2x2", 1);
	if (fr_comm_create_local(&cfg, 8, ids, c))
		fail_msg("%s", fr_comm_last_error(NULL));
	one = allreduce_writes(c, 8, 1031, 11);
	destroy_job(c, 8);
	cfg.segment_bytes = 256;
	if (fr_comm_create_local(&cfg, 8, ids, c))
		fail_msg("%s", fr_comm_last_error(NULL));
	two = allreduce_writes(c, 8, 1031, 11);
	assert_int_equal(fr_comm_last_algo(c[0]), FR_ALGO_HIER);
	if (two != 2 * one)
		fail_msg("2 lanes: %llu writes, one lane %llu: not twice",
			 (unsigned long long)two, (unsigned long long)one);
	allreduce_check(c, 8, FR_F64, FR_SUM, 40001, 12);
	allreduce_check(c, 8, FR_BF16, FR_MAX, 3001, 13);
	destroy_job(c, 8);
	unsetenv("FR_TOPO");
	if (fr_comm_create_local(&cfg, 8, ids, c))
		fail_msg("%s", fr_comm_last_error(NULL));
	allreduce_check(c, 8, FR_F32, FR_SUM, 40001, 15);
	allreduce_check(c, 8, FR_I32, FR_SUM, 1031, 16);
	assert_int_equal(fr_comm_last_algo(c[0]), FR_ALGO_HIER);
	destroy_job(c, 8);
}

/* A collective still running when the job is destroyed: its requests are
 * abandoned, the ranks still say goodbye, nothing is left open. */
static void test_local_destroy_unfinished(void **state)
{
	fr_config_t cfg = local_config(FR_ALGO_RING);
	fr_comm_t *c[5];
	fr_request_t *rq[5];
	float *buf[5];

	(void)state;
	if (fr_comm_create_local(&cfg, 5, NULL, c))
		fail_msg("%s", fr_comm_last_error(NULL));
	for (int r = 0; r < 5; r++) {
		buf[r] = tbuf(100000 * sizeof(float));
		assert_int_equal(fr_iallreduce(c[r], buf[r], buf[r], 100000,
					       FR_F32, FR_SUM, &rq[r]),
				 0);
	}
	/* one pass: started, far from done */
	for (int r = 0; r < 5; r++)
		fr_progress(c[r]);
	destroy_job(c, 5);
	/* the job's requests went with it (fr_comm_destroy's rule) */
}

/* Bad arguments and a transport that cannot be had: an error code, a
 * message, no communicator and no endpoint left. */
static void test_local_errors(void **state)
{
	fr_config_t cfg = local_config(FR_ALGO_AUTO);
	fr_comm_t *c[3] = {(fr_comm_t *)1, (fr_comm_t *)1, (fr_comm_t *)1};

	(void)state;
	assert_int_equal(fr_comm_create_local(NULL, 3, NULL, c), FR_EINVAL);
	assert_contains(fr_comm_last_error(NULL), "NULL argument");
	assert_int_equal(fr_comm_create_local(&cfg, 0, NULL, c), FR_EINVAL);
	assert_contains(fr_comm_last_error(NULL), "fewer than one rank");
	cfg.size = 4;
	assert_int_equal(fr_comm_create_local(&cfg, 3, NULL, c), FR_EINVAL);
	assert_contains(fr_comm_last_error(NULL), "config size");
	cfg = local_config(FR_ALGO_AUTO);
	cfg.transport = "no-such-transport";
	assert_int_equal(fr_comm_create_local(&cfg, 3, NULL, c), FR_EINVAL);
	assert_contains(fr_comm_last_error(NULL), "no-such-transport");
	for (int r = 0; r < 3; r++)
		assert_null(c[r]);
	cfg = local_config(FR_ALGO_AUTO);
	cfg.segment_bytes = 3; /* below the smallest segment */
	assert_true(fr_comm_create_local(&cfg, 3, NULL, c) < 0);
	assert_true(fr_comm_last_error(NULL)[0] != '\0');
	assert_int_equal(fake_tp_endpoints(), 0);
	/* nothing to destroy is no error */
	assert_int_equal(fr_comm_destroy_local(3, c), 0);
	assert_int_equal(fr_comm_destroy_local(0, NULL), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
		T(test_local_results),
		T(test_local_nodes),
		T(test_local_grid),
		T(test_local_lanes),
		T(test_local_destroy_unfinished),
		T(test_local_errors),
#undef T
	};

	fixture_init(NULL);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
