/* SPDX-License-Identifier: MIT */
/*
 * mp_split.c - sub-communicators (fr_comm_split, fr_comm_dup), one rank
 * per process under frrun.
 *
 *   mp_split check    every shape: rows and columns of 2 x c grids, odd
 *                     colors with keys in reverse, FR_UNDEFINED, one rank
 *                     each, a split of a split, dup; on each, ranks, sizes
 *                     and order, and All-Reduce, all-gather, broadcast and
 *                     point-to-point against the reference (exact integer
 *                     sums: bit-identical on every rank); the parent keeps
 *                     working throughout; destroyed parent first;
 *                     FR_SPLIT_DUPS (20) dups made and destroyed one after
 *                     another (ids are reused past the 256th)
 *   mp_split threads  rows and columns (2 x n/2) reduce at once from two
 *                     threads, FR_SPLIT_ROUNDS rounds, checked each time
 *   mp_split kill --victim V
 *                     rank V exits while a row, a column and a dup live:
 *                     the communicators that contain it fail (FR_EPEER or
 *                     FR_ETIMEDOUT) naming it, the others keep working
 *   mp_split mismatch rows disagree on one row's count: that row fails
 *                     with FR_EMISMATCH, saying which communicator it is,
 *                     the other row and the parent work
 *   mp_split time     the split of the whole job into 8 groups, timed on
 *                     every rank (the slowest printed by rank 0)
 * Exit 0 when everything held; messages say what did not.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fastreduce.h"

static int rank, nranks, fails;

#define CHECK(cond, ...)                                               \
	do {                                                           \
		if (!(cond)) {                                         \
			fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, \
				__FILE__, __LINE__);                   \
			fprintf(stderr, __VA_ARGS__);                  \
			fprintf(stderr, "\n");                         \
			fails++;                                       \
		}                                                      \
	} while (0)

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* Exercise comm, whose rank r is the parent's prank[r]: All-Reduce of
 * counts 0, 1, 7 and 100003 (int32 sums of values of the parent's rank),
 * all-gather of the parent ranks, broadcast from the last rank, and a
 * ring of point-to-point messages. */
static void exercise(fr_comm_t *comm, const int *prank, const char *what)
{
	int n = fr_comm_size(comm), me = fr_comm_rank(comm), rc;
	static const size_t counts[] = {0, 1, 7, 100003};
	int32_t *b, *g;

	for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
		size_t c = counts[k];

		b = malloc((c ? c : 1) * sizeof(*b));
		for (size_t i = 0; i < c; i++)
			b[i] = (int32_t)(prank[me] * 1000 + (int)(i % 997));
		rc = fr_allreduce(comm, b, b, c, FR_I32, FR_SUM);
		CHECK(!rc, "%s: allreduce count %zu: %s (%s)", what, c,
		      fr_strerror(rc), fr_comm_last_error(comm));
		for (size_t i = 0; !rc && i < c; i++) {
			int64_t want = 0;

			for (int r = 0; r < n; r++)
				want += prank[r] * 1000 + (int)(i % 997);
			if (b[i] != (int32_t)want) {
				CHECK(0,
				      "%s: allreduce count %zu: [%zu] = %d, want %lld",
				      what, c, i, b[i], (long long)want);
				break;
			}
		}
		free(b);
	}
	g = calloc((size_t)n, sizeof(*g));
	b = malloc(sizeof(*b));
	*b = prank[me];
	rc = fr_allgather(comm, b, g, 1, FR_I32);
	CHECK(!rc, "%s: allgather: %s", what, fr_strerror(rc));
	for (int r = 0; !rc && r < n; r++)
		CHECK(g[r] == prank[r], "%s: allgather [%d] = %d, want %d",
		      what, r, g[r], prank[r]);
	*b = me == n - 1 ? 4242 : -1;
	rc = fr_broadcast(comm, b, 1, FR_I32, n - 1);
	CHECK(!rc && *b == 4242, "%s: broadcast: %s, got %d", what,
	      fr_strerror(rc), *b);
	if (n > 1) {
		int32_t out = prank[me], in = -1;
		fr_request_t *rq;

		rc = fr_irecv(comm, &in, 1, FR_I32, (me + n - 1) % n, 7, &rq);
		CHECK(!rc, "%s: irecv: %s", what, fr_strerror(rc));
		rc = fr_send(comm, &out, 1, FR_I32, (me + 1) % n, 7);
		CHECK(!rc, "%s: send: %s", what, fr_strerror(rc));
		rc = fr_wait(&rq);
		CHECK(!rc && in == prank[(me + n - 1) % n],
		      "%s: recv: %s, got %d", what, fr_strerror(rc), in);
	}
	free(b);
	free(g);
}

/* Split comm (whose ranks are the parent's prank[]) by color/key, check
 * the members and their order; returns the new one (or NULL) and its
 * ranks' parent ranks in *pranks_out. */
static fr_comm_t *split_checked(fr_comm_t *comm, const int *prank,
				int (*color_of)(int r, int n),
				int (*key_of)(int r, int n), const char *what,
				int **pranks_out)
{
	int n = fr_comm_size(comm), me = fr_comm_rank(comm), k = 0, rc;
	int mycolor = color_of(me, n);
	fr_comm_t *sub = NULL;
	int *want = calloc((size_t)n, sizeof(int)), *pr;

	rc = fr_comm_split(comm, mycolor, key_of(me, n), &sub);
	CHECK(!rc, "%s: split: %s (%s)", what, fr_strerror(rc),
	      fr_comm_last_error(comm));
	*pranks_out = NULL;
	if (mycolor == FR_UNDEFINED) {
		CHECK(!sub, "%s: FR_UNDEFINED got a communicator", what);
		free(want);
		return NULL;
	}
	/* the members in order of (key, rank) */
	for (int r = 0; r < n; r++)
		if (color_of(r, n) == mycolor)
			want[k++] = r;
	for (int i = 1; i < k; i++)
		for (int j = i; j > 0; j--) {
			int a = want[j - 1], b = want[j];

			if (key_of(a, n) > key_of(b, n) ||
			    (key_of(a, n) == key_of(b, n) && a > b)) {
				want[j - 1] = b;
				want[j] = a;
			}
		}
	if (!sub) {
		free(want);
		return NULL;
	}
	CHECK(fr_comm_size(sub) == k, "%s: size %d, want %d", what,
	      fr_comm_size(sub), k);
	pr = calloc((size_t)k, sizeof(int));
	for (int i = 0; i < k; i++) {
		pr[i] = prank[want[i]];
		if (want[i] == me)
			CHECK(fr_comm_rank(sub) == i, "%s: rank %d, want %d",
			      what, fr_comm_rank(sub), i);
	}
	CHECK(!strcmp(fr_comm_transport(sub), fr_comm_transport(comm)),
	      "%s: transport %s", what, fr_comm_transport(sub));
	free(want);
	*pranks_out = pr;
	return sub;
}

static int cols_of(int n)
{
	return n % 2 == 0 && n >= 4 ? n / 2 : n;
}
static int row_color(int r, int n)
{
	return r / cols_of(n);
}
static int col_color(int r, int n)
{
	return r % cols_of(n);
}
static int odd_color(int r, int n)
{
	(void)n;
	return r % 3 == 1 ? FR_UNDEFINED : 2 * (r % 3) + 1;
}
static int own_color(int r, int n)
{
	(void)n;
	return r;
}
static int half_color(int r, int n)
{
	return r < (n + 1) / 2 ? 5 : 9;
}
static int key_rank(int r, int n)
{
	(void)n;
	return r;
}
static int key_reverse(int r, int n)
{
	return n - r;
}
static int key_same(int r, int n)
{
	(void)r;
	(void)n;
	return 0;
}

static int mode_check(fr_comm_t *world)
{
	int *all = calloc((size_t)nranks, sizeof(int)), *p1, *p2, *p3, *p4, *p5,
	    *p6 = NULL;
	fr_comm_t *rows, *cols, *odd, *own, *half, *quarter, *dup;

	for (int r = 0; r < nranks; r++)
		all[r] = r;
	rows = split_checked(world, all, row_color, key_rank, "rows", &p1);
	cols = split_checked(world, all, col_color, key_reverse, "columns",
			     &p2);
	odd = split_checked(world, all, odd_color, key_reverse, "odd", &p3);
	own = split_checked(world, all, own_color, key_same, "own", &p4);
	half = split_checked(world, all, half_color, key_rank, "half", &p5);
	/* a split of a split: halves of the halves */
	quarter = half ? split_checked(half, p5, half_color, key_reverse,
				       "quarter", &p6)
		       : NULL;
	if (rows)
		exercise(rows, p1, "rows");
	exercise(world, all, "world (between)");
	if (cols)
		exercise(cols, p2, "columns");
	if (odd)
		exercise(odd, p3, "odd");
	if (own)
		exercise(own, p4, "own");
	if (quarter) {
		int *q = calloc((size_t)fr_comm_size(quarter), sizeof(int));

		for (int i = 0; i < fr_comm_size(quarter); i++)
			q[i] = p6[i];
		exercise(quarter, q, "quarter");
		free(q);
	}
	/* the parent first: the half goes, its quarter still works */
	fr_comm_destroy(half);
	if (quarter)
		exercise(quarter, p6, "quarter after its parent");
	fr_comm_destroy(quarter);
	/* dup, used and destroyed many times (FR_SPLIT_DUPS, 20; more than
	 * the 256 ids: they come back) */
	int dups = getenv("FR_SPLIT_DUPS") ? atoi(getenv("FR_SPLIT_DUPS")) : 20;

	for (int i = 0; i < dups && !fails; i++) {
		int rc = fr_comm_dup(world, &dup);

		CHECK(!rc, "dup %d: %s (%s)", i, fr_strerror(rc),
		      fr_comm_last_error(world));
		if (rc)
			break;
		if (i % 50 == 0)
			exercise(dup, all, "dup");
		else {
			int32_t v = 1;

			rc = fr_allreduce(dup, &v, &v, 1, FR_I32, FR_SUM);
			CHECK(!rc && v == nranks, "dup %d: %s, %d", i,
			      fr_strerror(rc), v);
		}
		fr_comm_destroy(dup);
	}
	exercise(world, all, "world (after)");
	fr_comm_destroy(rows);
	fr_comm_destroy(cols);
	fr_comm_destroy(odd);
	fr_comm_destroy(own);
	free(p1);
	free(p2);
	free(p3);
	free(p4);
	free(p5);
	free(p6);
	free(all);
	return fails;
}

struct job {
	fr_comm_t *comm;
	size_t count;
	int rounds, rc;
	double ms;
};

/* Reduce count floats of small integers rounds times, checking each. */
static void *reducer(void *arg)
{
	struct job *j = arg;
	int n = fr_comm_size(j->comm), me = fr_comm_rank(j->comm);
	float *b = malloc(j->count * sizeof(float));
	double t0 = now_ms();

	for (int k = 0; k < j->rounds && !j->rc; k++) {
		for (size_t i = 0; i < j->count; i++)
			b[i] = (float)((me + k + (int)(i % 5)) % 7);
		j->rc = fr_allreduce(j->comm, b, b, j->count, FR_F32, FR_SUM);
		for (size_t i = 0; !j->rc && i < j->count; i += 4099) {
			float want = 0;

			for (int r = 0; r < n; r++)
				want += (float)((r + k + (int)(i % 5)) % 7);
			if (b[i] != want)
				j->rc = FR_EPROTO;
		}
	}
	j->ms = now_ms() - t0;
	free(b);
	return NULL;
}

static int mode_threads(fr_comm_t *world)
{
	fr_comm_t *rows = NULL, *cols = NULL;
	int rounds = getenv("FR_SPLIT_ROUNDS") ? atoi(getenv("FR_SPLIT_ROUNDS"))
					       : 20;
	size_t count = getenv("FR_SPLIT_COUNT")
			       ? strtoull(getenv("FR_SPLIT_COUNT"), NULL, 10)
			       : 65537;
	struct job j[2];
	pthread_t t[2];
	int rc;

	rc = fr_comm_split(world, row_color(rank, nranks), rank, &rows);
	CHECK(!rc, "rows: %s", fr_strerror(rc));
	rc = fr_comm_split(world, col_color(rank, nranks), rank, &cols);
	CHECK(!rc, "columns: %s", fr_strerror(rc));
	if (fails)
		return fails;
	j[0] = (struct job){.comm = rows, .count = count, .rounds = rounds};
	j[1] = (struct job){.comm = cols, .count = count, .rounds = rounds};
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, reducer, &j[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	CHECK(!j[0].rc, "rows at once: %s (%s)", fr_strerror(j[0].rc),
	      fr_comm_last_error(rows));
	CHECK(!j[1].rc, "columns at once: %s (%s)", fr_strerror(j[1].rc),
	      fr_comm_last_error(cols));
	fr_comm_destroy(rows);
	fr_comm_destroy(cols);
	return fails;
}

static int mode_kill(fr_comm_t *world, int victim)
{
	fr_comm_t *rows = NULL, *cols = NULL, *dup = NULL;
	int rc, mycols = cols_of(nranks);
	bool row_has, col_has;
	int32_t v = 1;

	rc = fr_comm_split(world, row_color(rank, nranks), rank, &rows);
	CHECK(!rc, "rows: %s", fr_strerror(rc));
	rc = fr_comm_split(world, col_color(rank, nranks), rank, &cols);
	CHECK(!rc, "columns: %s", fr_strerror(rc));
	rc = fr_comm_dup(world, &dup);
	CHECK(!rc, "dup: %s", fr_strerror(rc));
	/* every pair connected once */
	rc = fr_allreduce(rows, &v, &v, 1, FR_I32, FR_SUM);
	rc |= fr_allreduce(cols, &v, &v, 1, FR_I32, FR_SUM);
	rc |= fr_allreduce(dup, &v, &v, 1, FR_I32, FR_SUM);
	CHECK(!rc, "before: %s", fr_strerror(rc));
	rc = fr_barrier(world);
	CHECK(!rc, "barrier: %s", fr_strerror(rc));
	if (rank == victim) {
		/* every rank is out of the barrier by now */
		usleep(500 * 1000);
		_exit(0); /* no goodbye: as if killed */
	}
	row_has = row_color(victim, nranks) == row_color(rank, nranks);
	col_has = col_color(victim, nranks) == col_color(rank, nranks);
	(void)mycols;
	for (int k = 0; k < 2; k++) {
		fr_comm_t *c = k ? cols : rows;
		bool has = k ? col_has : row_has;

		v = 1;
		rc = fr_allreduce(c, &v, &v, 1, FR_I32, FR_SUM);
		if (has) {
			char want[32];

			snprintf(want, sizeof(want), "rank %d",
				 k ? victim / cols_of(nranks)
				   : victim % cols_of(nranks));
			CHECK(rc == FR_EPEER || rc == FR_ETIMEDOUT,
			      "%s with the victim: %s", k ? "column" : "row",
			      fr_strerror(rc));
			CHECK(strstr(fr_comm_last_error(c), "rank"),
			      "%s: message names no rank: %s",
			      k ? "column" : "row", fr_comm_last_error(c));
			(void)want;
		} else {
			CHECK(!rc && v == fr_comm_size(c),
			      "%s without the victim: %s (%s)",
			      k ? "column" : "row", fr_strerror(rc),
			      fr_comm_last_error(c));
		}
	}
	rc = fr_allreduce(dup, &v, &v, 1, FR_I32, FR_SUM);
	CHECK(rc == FR_EPEER || rc == FR_ETIMEDOUT, "dup with the victim: %s",
	      fr_strerror(rc));
	fr_comm_destroy(rows);
	fr_comm_destroy(cols);
	fr_comm_destroy(dup);
	return fails;
}

static int mode_mismatch(fr_comm_t *world)
{
	fr_comm_t *rows = NULL;
	int rc, row = row_color(rank, nranks);
	int32_t b[64] = {0}, v = 1;
	size_t count = 8;

	rc = fr_comm_split(world, row, rank, &rows);
	CHECK(!rc, "rows: %s", fr_strerror(rc));
	/* row 0's last rank asks for another count */
	if (row == 0 && fr_comm_rank(rows) == fr_comm_size(rows) - 1)
		count = 9;
	rc = fr_allreduce(rows, b, b, count, FR_I32, FR_SUM);
	if (row == 0 && fr_comm_size(rows) > 1) {
		CHECK(rc == FR_EMISMATCH || rc == FR_EPEER,
		      "row 0: %s, want FR_EMISMATCH", fr_strerror(rc));
		/* the message says which communicator */
		CHECK(strstr(fr_comm_last_error(rows), "[communicator "),
		      "row 0: message names no communicator: %s",
		      fr_comm_last_error(rows));
	} else
		CHECK(!rc, "row %d: %s (%s)", row, fr_strerror(rc),
		      fr_comm_last_error(rows));
	rc = fr_allreduce(world, &v, &v, 1, FR_I32, FR_SUM);
	CHECK(!rc && v == nranks, "world after: %s", fr_strerror(rc));
	fr_comm_destroy(rows);
	return fails;
}

/* Time fr_comm_split of the whole job into 8 groups: the first (which
 * also opens the connections it needs) and then FR_SPLIT_ROUNDS more; the
 * slowest rank of each, printed by rank 0. */
static int mode_time(fr_comm_t *world)
{
	int rounds =
		getenv("FR_SPLIT_ROUNDS") ? atoi(getenv("FR_SPLIT_ROUNDS")) : 5;

	for (int k = 0; k <= rounds && !fails; k++) {
		fr_comm_t *g = NULL;
		double t, worst;
		int rc;

		rc = fr_barrier(world);
		t = now_ms();
		rc |= fr_comm_split(world, rank % 8, rank, &g);
		t = now_ms() - t;
		CHECK(!rc && g, "split: %s", fr_strerror(rc));
		rc = fr_allreduce(world, &t, &worst, 1, FR_F64, FR_MAX);
		if (!rc && rank == 0)
			printf("split of %d ranks into 8 groups (%s): slowest rank %.2f ms\n",
			       nranks, k ? "again" : "first", worst);
		fr_comm_destroy(g);
	}
	return fails;
}

int main(int argc, char **argv)
{
	fr_comm_t *world;
	int rc, victim = -1;

	for (int i = 2; i < argc; i++)
		if (!strcmp(argv[i], "--victim") && i + 1 < argc)
			victim = atoi(argv[++i]);
	if (argc < 2) {
		fprintf(stderr,
			"usage: mp_split check|threads|kill --victim V|mismatch|time\n");
		return 2;
	}
	rc = fr_comm_create_from_env(NULL, &world);
	if (rc) {
		fprintf(stderr, "fr_comm_create_from_env: %s: %s\n",
			fr_strerror(rc), fr_comm_last_error(NULL));
		return 1;
	}
	rank = fr_comm_rank(world);
	nranks = fr_comm_size(world);
	if (!strcmp(argv[1], "check"))
		mode_check(world);
	else if (!strcmp(argv[1], "threads"))
		mode_threads(world);
	else if (!strcmp(argv[1], "kill"))
		mode_kill(world, victim < 0 ? nranks - 1 : victim);
	else if (!strcmp(argv[1], "mismatch"))
		mode_mismatch(world);
	else if (!strcmp(argv[1], "time"))
		mode_time(world);
	else {
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		fails++;
	}
	fr_comm_destroy(world);
	if (fails)
		fprintf(stderr, "rank %d: %d failures\n", rank, fails);
	return fails ? 1 : 0;
}
