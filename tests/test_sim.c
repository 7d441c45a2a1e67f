/* SPDX-License-Identifier: MIT */
/*
 * test_sim.c - the simulator of perf/sim (sim.h):
 *   - the network model's times, exactly: a write's serialization and
 *     latency, a node's link shared by its ranks, both directions
 *     independent, copies within a node, bad parameters refused;
 *   - whole All-Reduces in virtual time: results equal to a reference on
 *     1 to 9 ranks and every algorithm that runs on any count, the ring's
 *     and recursive doubling's times against their closed forms
 *     (2(n-1)(alpha + S/(n B)) and log2(n) alpha), the same time on every
 *     run, nodes of several ranks;
 *   - a schedule that cannot finish (a frozen rank) is reported as
 *     stalled, never a hang.
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
#include "reduce.h"
#include "sim.h"

#define SMAX 9

static void test_net_times(void **state)
{
	/* 3 nodes of 2 ranks; 8 Gbit/s: a byte a nanosecond; 16 Gbit/s
	 * within a node */
	struct sim_net_params p = {.nranks = 6,
				   .ranks_per_node = 2,
				   .link_gbps = 8,
				   .link_lat_ns = 1000,
				   .shm_gbps = 16,
				   .shm_lat_ns = 100};
	struct sim_net net;
	char err[200];

	(void)state;
	assert_int_equal(sim_net_init(&net, &p, err, sizeof(err)), 0);
	/* rank 0 (node 0) to rank 2 (node 1): 1000 ns on each link, the
	 * far one from 1000 ns on: lands at 2000 */
	assert_int_equal(sim_net_due(&net, 0, 0, 2, 1000), 2000);
	/* rank 1 shares node 0's link: it leaves at 1000, lands at 3000 */
	assert_int_equal(sim_net_due(&net, 0, 1, 3, 1000), 3000);
	/* the other direction is free: full duplex */
	assert_int_equal(sim_net_due(&net, 0, 2, 0, 1000), 2000);
	/* later, nothing waits: 2 latency-bound microseconds */
	assert_int_equal(sim_net_due(&net, 5000, 0, 2, 1000), 7000);
	/* within node 0: a copy of 1000 bytes at 2 bytes/ns, plus 100 */
	assert_int_equal(sim_net_due(&net, 0, 0, 1, 1000), 600);
	/* the next copy by rank 0 waits for the first */
	assert_int_equal(sim_net_due(&net, 0, 0, 1, 1000), 1100);
	/* an empty write: the latency alone */
	assert_int_equal(sim_net_due(&net, 10000, 1, 2, 0), 11000);
	assert_int_equal(net.writes, 7);
	assert_int_equal(net.bytes_between, 4000);
	assert_int_equal(net.bytes_within, 2000);

	/* two nodes into one: node 1's receiving link takes them one
	 * after the other (the second's first bit could come at 1000, the
	 * link is free at 2000) */
	sim_net_reset(&net);
	assert_int_equal(sim_net_due(&net, 0, 0, 2, 1000), 2000);
	assert_int_equal(sim_net_due(&net, 0, 4, 3, 1000), 3000);

	/* headers count on the wire */
	sim_net_reset(&net);
	net.p.overhead_bytes = 24;
	assert_int_equal(sim_net_due(&net, 0, 0, 2, 1000), 2024);
	sim_net_fini(&net);

	p.nranks = 5; /* not whole nodes of 2 */
	assert_int_equal(sim_net_init(&net, &p, err, sizeof(err)), FR_EINVAL);
	assert_non_null(strstr(err, "nodes of 2"));
	p.nranks = 6;
	p.link_gbps = 0;
	assert_int_equal(sim_net_init(&net, &p, err, sizeof(err)), FR_EINVAL);
	assert_non_null(strstr(err, "bandwidths"));
}

static struct sim_net_params net_params(int n, int k)
{
	return (struct sim_net_params){.nranks = n,
				       .ranks_per_node = k,
				       .link_gbps = 100,
				       .link_lat_ns = 2000,
				       .shm_gbps = 200,
				       .shm_lat_ns = 500};
}

/* small integers: sums exact in f32 in any order */
static float val(int r, size_t i)
{
	return (float)((r % 5 + 1) * (int)(i % 7));
}

/* One All-Reduce of count floats on every rank, checked; its time. */
static uint64_t run_checked(struct sim *s, float **b, size_t count)
{
	uint64_t ns = 0;
	int rc;

	for (int r = 0; r < s->n; r++)
		for (size_t i = 0; i < count; i++)
			b[r][i] = val(r, i);
	rc = sim_allreduce(s, (void **)b, count, FR_F32, FR_SUM, &ns);
	if (rc)
		fail_msg("%d ranks, %zu floats, %s: %s: %s", s->n, count,
			 fr_algo_name(s->comms[0]->algo.forced), fr_errname(rc),
			 s->err);
	for (size_t i = 0; i < count; i++) {
		float want = 0;

		for (int r = 0; r < s->n; r++)
			want += val(r, i);
		for (int r = 0; r < s->n; r++)
			if (b[r][i] != want)
				fail_msg(
					"%d ranks, %zu floats, %s: rank %d element %zu: %g, want %g",
					s->n, count,
					fr_algo_name(s->comms[0]->algo.forced),
					r, i, (double)b[r][i], (double)want);
	}
	return ns;
}

/* After a sizes-only job: fr_reduce_kernel computes again. */
static void run_reduce_check(void)
{
	float a[3] = {1, 2, 3}, b[3] = {10, 20, 30}, d[3];
	fr_reduce_fn k = fr_reduce_kernel(FR_F32, FR_SUM);

	assert_non_null(k);
	k(d, a, b, 3);
	assert_true(d[0] == 11 && d[1] == 22 && d[2] == 33);
}

static float **bufs_new(int n, size_t count)
{
	float **b = calloc((size_t)n, sizeof(*b));

	assert_non_null(b);
	for (int r = 0; r < n; r++) {
		b[r] = malloc((count ? count : 1) * sizeof(float));
		assert_non_null(b[r]);
	}
	return b;
}

static void bufs_free(float **b, int n)
{
	for (int r = 0; r < n; r++)
		free(b[r]);
	free(b);
}

static void force(struct sim *s, int algo)
{
	for (int r = 0; r < s->n; r++)
		fr_algo_force(s->comms[r], algo);
}

/* Every rank count from 1 to 9, every algorithm that takes any count,
 * counts 0, 1, fewer than the ranks, a prime and a large prime (2^17 - 1). */
static void test_sim_results(void **state)
{
	static const int algos[] = {FR_ALGO_AUTO, FR_ALGO_RING, FR_ALGO_RD,
				    FR_ALGO_RABENSEIFNER, FR_ALGO_ONESHOT};
	static const size_t counts[] = {0, 1, 3, 1031, 131071};
	float **b = bufs_new(SMAX, 131071);

	(void)state;
	for (int n = 1; n <= SMAX; n++) {
		struct sim_net_params p = net_params(n, 1);
		struct sim s;

		if (sim_open(&s, &p, NULL, 0))
			fail_msg("%d ranks: %s", n, s.err);
		for (size_t a = 0; a < sizeof(algos) / sizeof(*algos); a++) {
			force(&s, algos[a]);
			for (size_t k = 0; k < sizeof(counts) / sizeof(*counts);
			     k++)
				run_checked(&s, b, counts[k]);
		}
		sim_close(&s);
		assert_int_equal(fake_tp_endpoints(), 0);
	}
	bufs_free(b, SMAX);
}

/*
 * The ring moves 2(n-1)/n S bytes through every link, one step after the
 * other: at least 2(n-1) S/(n B), and at most 2(n-1)(alpha + S/(n B))
 * when no step's latency is hidden (its segments pipeline, so most are);
 * the simulation is within those bounds (3 % for headers and the first
 * step's READY above the upper one).  Recursive doubling of a few bytes
 * takes log2(n) latencies.  A run takes the same time every time.
 */
static void test_sim_closed_forms(void **state)
{
	static const int ns[] = {2, 3, 5, 8};
	const size_t count = (4u << 20) / sizeof(float);
	float **b = bufs_new(8, count);

	(void)state;
	for (size_t i = 0; i < sizeof(ns) / sizeof(*ns); i++) {
		int n = ns[i];
		struct sim_net_params p = net_params(n, 1);
		double beta = 8.0 / p.link_gbps; /* ns per byte */
		double S = (double)count * sizeof(float), lo, hi, got, want;
		uint64_t t1, t2;
		struct sim s;

		if (sim_open(&s, &p, NULL, 0))
			fail_msg("%d ranks: %s", n, s.err);
		force(&s, FR_ALGO_RING);
		run_checked(&s, b, count); /* connections come up */
		t1 = run_checked(&s, b, count);
		t2 = run_checked(&s, b, count);
		assert_int_equal(t1, t2);
		lo = 2.0 * (n - 1) * S / n * beta;
		hi = 2.0 * (n - 1) * (p.link_lat_ns + S / n * beta);
		got = (double)t1;
		if (got < 0.999 * lo || got > 1.03 * hi)
			fail_msg(
				"ring, %d ranks, %g bytes: %.0f ns simulated, not within [%.0f, %.0f]",
				n, S, got, lo, hi);
		if (!(n & (n - 1))) {
			int steps = 0;

			for (int m = n; m > 1; m /= 2)
				steps++;
			force(&s, FR_ALGO_RD);
			run_checked(&s, b, 2);
			got = (double)run_checked(&s, b, 2);
			want = steps * p.link_lat_ns;
			if (got < want || got > 1.03 * want)
				fail_msg(
					"rd, %d ranks, 8 bytes: %.0f ns simulated, %.0f by the closed form",
					n, got, want);
		}
		sim_close(&s);
	}
	bufs_free(b, 8);
}

/* Nodes of 3 ranks: the layout the job sees, and the two-level
 * algorithm runs over them, correctly, with bytes both within the nodes
 * and between them. */
static void test_sim_nodes(void **state)
{
	const size_t count = 1u << 18;
	float **b = bufs_new(6, count);
	struct sim_net_params p = net_params(6, 3);
	struct sim s;

	(void)state;
	if (sim_open(&s, &p, NULL, 0))
		fail_msg("%s", s.err);
	assert_int_equal(s.comms[0]->topo.nnodes, 2);
	force(&s, FR_ALGO_HIER);
	run_checked(&s, b, 1031);
	run_checked(&s, b, count);
	assert_int_equal(fr_comm_last_algo(s.comms[0]), FR_ALGO_HIER);
	assert_true(s.net.bytes_within > 0);
	assert_true(s.net.bytes_between > 0);
	sim_close(&s);
	bufs_free(b, 6);
}

/* Sizes only (SIM_SIZES_ONLY): the same times as with the data, for
 * every algorithm, with every rank's buffer one and the same; nothing
 * summed: a buffer of ones holds ones, and zeros where a copy of a
 * message cut at SIM_COPY_MAX bytes landed, never the 5 or more of a
 * sum. */
static void test_sim_sizes_only(void **state)
{
	static const int algos[] = {FR_ALGO_AUTO, FR_ALGO_RING, FR_ALGO_RD,
				    FR_ALGO_RABENSEIFNER, FR_ALGO_ONESHOT};
	static const size_t counts[] = {1, 1031, 131071};
	const int n = 5;
	float **b = bufs_new(n, 131071);
	uint64_t with[5][3], ns;
	float *one = malloc(131071 * sizeof(float));
	void *same[5];

	(void)state;
	assert_non_null(one);
	for (int pass = 0; pass < 2; pass++) {
		struct sim_net_params p = net_params(n, 1);
		struct sim s;

		if (sim_open(&s, &p, NULL, pass ? SIM_SIZES_ONLY : 0))
			fail_msg("%s", s.err);
		for (int r = 0; r < n; r++)
			same[r] = one;
		for (size_t a = 0; a < sizeof(algos) / sizeof(*algos); a++) {
			force(&s, algos[a]);
			for (size_t k = 0; k < 3; k++) {
				if (!pass) {
					run_checked(&s, b, counts[k]);
					with[a][k] =
						run_checked(&s, b, counts[k]);
					continue;
				}
				for (size_t i = 0; i < counts[k]; i++)
					one[i] = 1;
				for (int it = 0; it < 2; it++)
					assert_int_equal(
						sim_allreduce(&s, same,
							      counts[k], FR_F32,
							      FR_SUM, &ns),
						0);
				if (ns != with[a][k])
					fail_msg(
						"%s, %zu floats: %llu ns with data, %llu sizes only",
						fr_algo_name(algos[a]),
						counts[k],
						(unsigned long long)with[a][k],
						(unsigned long long)ns);
				for (size_t i = 0; i < counts[k]; i++)
					if (one[i] != 1 && one[i] != 0)
						fail_msg(
							"%s, %zu floats: element %zu computed: %g",
							fr_algo_name(algos[a]),
							counts[k], i,
							(double)one[i]);
			}
		}
		sim_close(&s);
	}
	/* the real kernels again */
	run_reduce_check();
	free(one);
	bufs_free(b, n);
}

/* A rank that never answers: the driver runs out of events and says the
 * schedule stalled, naming the ranks left, instead of hanging. */
static void test_sim_stall(void **state)
{
	struct sim_net_params p = net_params(4, 1);
	float **b = bufs_new(4, 1000);
	uint64_t ns;
	struct sim s;

	(void)state;
	if (sim_open(&s, &p, NULL, 0))
		fail_msg("%s", s.err);
	run_checked(&s, b, 1000);
	fake_tp_freeze(2, true);
	assert_int_equal(
		sim_allreduce(&s, (void **)b, 1000, FR_F32, FR_SUM, &ns),
		FR_ETIMEDOUT);
	assert_non_null(strstr(s.err, "stalled"));
	fake_tp_freeze(2, false);
	sim_close(&s);
	assert_int_equal(fake_tp_endpoints(), 0);
	bufs_free(b, 4);
}

/* A network the model cannot have: an error with a message. */
static void test_sim_bad_params(void **state)
{
	struct sim_net_params p = net_params(5, 2);
	struct sim s;

	(void)state;
	assert_int_equal(sim_open(&s, &p, NULL, 0), FR_EINVAL);
	assert_non_null(strstr(s.err, "nodes of 2"));
	assert_int_equal(fake_tp_endpoints(), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_net_times),
		cmocka_unit_test(test_sim_results),
		cmocka_unit_test(test_sim_closed_forms),
		cmocka_unit_test(test_sim_nodes),
		cmocka_unit_test(test_sim_sizes_only),
		cmocka_unit_test(test_sim_stall),
		cmocka_unit_test(test_sim_bad_params),
	};

	fixture_init(NULL); /* the caller's FR_ALGO etc. would change times */
	return cmocka_run_group_tests(tests, NULL, NULL);
}
