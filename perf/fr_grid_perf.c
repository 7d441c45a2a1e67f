/* SPDX-License-Identifier: MIT */
/*
 * fr_grid_perf - rows and columns of a 2-D grid reducing at once.
 *
 *   frrun -n 8 ./fr_grid_perf [-r ROWS] [-b BYTES] [-n ITERS] [-w WARMUP]
 *
 * The job is split (fr_comm_split) into ROWS rows of n / ROWS ranks and
 * n / ROWS columns of ROWS ranks, as tensor- and data-parallel groups are.
 * Each iteration times, alternating which goes first:
 *   - one after the other: the row's All-Reduce of BYTES of f32, then the
 *     column's, from one thread;
 *   - at once: the two from two threads, started together;
 * each as the slowest rank's time (an All-Reduce of MAX after the timed
 * part), so both sides have the same statistic.  Every result is checked
 * (sums of small integers, exact).  Prints median, p99 and min of both and
 * the ratio of the medians (at once / one after the other): at most 1.05
 * means running them at once loses no throughput on links they share.
 * perf/bench/grid.sh runs it over the emulated 1 Gbit/s cluster.
 */
#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fastreduce.h"

struct side {
	fr_comm_t *comm;
	float *buf;
	size_t count;
	int round, rc;
	pthread_barrier_t *go;
};

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void fill(struct side *s)
{
	int me = fr_comm_rank(s->comm);

	for (size_t i = 0; i < s->count; i++)
		s->buf[i] = (float)((me + s->round + (int)(i % 7)) % 5);
}

static int check(const struct side *s)
{
	int n = fr_comm_size(s->comm);

	for (size_t i = 0; i < s->count; i += 997) {
		float want = 0;

		for (int r = 0; r < n; r++)
			want += (float)((r + s->round + (int)(i % 7)) % 5);
		if (s->buf[i] != want)
			return 1;
	}
	return 0;
}

static void *side_main(void *arg)
{
	struct side *s = arg;

	pthread_barrier_wait(s->go);
	s->rc = fr_allreduce(s->comm, s->buf, s->buf, s->count, FR_F32, FR_SUM);
	return NULL;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static void stats(double *v, int n, double *med, double *p99, double *min)
{
	qsort(v, (size_t)n, sizeof(*v), cmp);
	*med = v[n / 2];
	*p99 = v[(int)((n - 1) * 0.99)];
	*min = v[0];
}

int main(int argc, char **argv)
{
	int rows = 2, iters = 10, warmup = 2, rank, n, cols, ch, rc, bad = 0;
	size_t bytes = 16u << 20;
	fr_comm_t *world, *row, *col;
	struct side sr, sc;
	double *seq, *conc, m1, p1, n1, m2, p2, n2;
	pthread_barrier_t go;

	while ((ch = getopt(argc, argv, "r:b:n:w:h")) != -1) {
		switch (ch) {
		case 'r':
			rows = atoi(optarg);
			break;
		case 'b':
			bytes = strtoull(optarg, NULL, 0);
			break;
		case 'n':
			iters = atoi(optarg);
			break;
		case 'w':
			warmup = atoi(optarg);
			break;
		default:
			fprintf(stderr,
				"usage: fr_grid_perf [-r ROWS] [-b BYTES] [-n ITERS] [-w WARMUP]\n");
			return ch == 'h' ? 0 : 2;
		}
	}
	rc = fr_comm_create_from_env(NULL, &world);
	if (rc) {
		fprintf(stderr, "fr_grid_perf: %s: %s\n", fr_strerror(rc),
			fr_comm_last_error(NULL));
		return 1;
	}
	rank = fr_comm_rank(world);
	n = fr_comm_size(world);
	if (rows < 1 || n % rows || iters < 1 || bytes < 4) {
		if (!rank)
			fprintf(stderr,
				"fr_grid_perf: %d ranks do not make %d rows\n",
				n, rows);
		return 2;
	}
	cols = n / rows;
	rc = fr_comm_split(world, rank / cols, rank, &row);
	if (!rc)
		rc = fr_comm_split(world, rank % cols, rank, &col);
	if (rc) {
		fprintf(stderr, "fr_grid_perf: split: %s\n",
			fr_comm_last_error(world));
		return 1;
	}
	sr = (struct side){.comm = row, .count = bytes / 4, .go = &go};
	sc = (struct side){.comm = col, .count = bytes / 4, .go = &go};
	sr.buf = malloc(bytes);
	sc.buf = malloc(bytes);
	seq = calloc((size_t)iters, sizeof(double));
	conc = calloc((size_t)iters, sizeof(double));
	pthread_barrier_init(&go, NULL, 3);
	if (!rank)
		printf("# fr_grid_perf: %d ranks, %d rows x %d columns, %zu bytes of f32 a row and a column, over %s\n",
		       n, rows, cols, bytes, fr_comm_transport(world));
	for (int k = -warmup; k < iters; k++) {
		for (int pass = 0; pass < 2; pass++) {
			/* alternate which of the two goes first */
			bool together = (pass == 0) == (k % 2 == 0);
			pthread_t t[2];
			double t0, dt, worst;

			sr.round = sc.round = k + 100 * pass;
			fill(&sr);
			fill(&sc);
			rc = fr_barrier(world);
			t0 = now_us();
			if (together) {
				pthread_create(&t[0], NULL, side_main, &sr);
				pthread_create(&t[1], NULL, side_main, &sc);
				pthread_barrier_wait(&go);
				pthread_join(t[0], NULL);
				pthread_join(t[1], NULL);
			} else {
				sr.rc = fr_allreduce(row, sr.buf, sr.buf,
						     sr.count, FR_F32, FR_SUM);
				sc.rc = fr_allreduce(col, sc.buf, sc.buf,
						     sc.count, FR_F32, FR_SUM);
			}
			dt = now_us() - t0;
			rc |= sr.rc | sc.rc;
			rc |= fr_allreduce(world, &dt, &worst, 1, FR_F64,
					   FR_MAX);
			if (rc) {
				fprintf(stderr, "rank %d: %s / %s / %s\n", rank,
					fr_comm_last_error(row),
					fr_comm_last_error(col),
					fr_comm_last_error(world));
				return 1;
			}
			bad += check(&sr) + check(&sc);
			if (k >= 0)
				(together ? conc : seq)[k] = worst;
		}
	}
	rc = fr_allreduce(world, FR_IN_PLACE, &bad, 1, FR_I32, FR_SUM);
	stats(seq, iters, &m1, &p1, &n1);
	stats(conc, iters, &m2, &p2, &n2);
	if (!rank) {
		printf("# time of both, slowest rank, microseconds; %d iterations\n",
		       iters);
		printf("%-22s %12s %12s %12s\n", "#", "median", "p99", "min");
		printf("%-22s %12.0f %12.0f %12.0f\n", "one after the other",
		       m1, p1, n1);
		printf("%-22s %12.0f %12.0f %12.0f\n", "at once (2 threads)",
		       m2, p2, n2);
		printf("ratio at once / one after the other (median): %.3f; wrong results: %d\n",
		       m2 / m1, bad);
	}
	fr_comm_destroy(row);
	fr_comm_destroy(col);
	fr_comm_destroy(world);
	pthread_barrier_destroy(&go);
	free(seq);
	free(conc);
	free(sr.buf);
	free(sc.buf);
	return rc || bad ? 1 : 0;
}
