/* SPDX-License-Identifier: MIT */
/*
 * mp_recover.c - recovery (fastreduce(7), "Recovery"), one rank per process
 * under frrun.
 *
 *   mp_recover revoke
 *       On dups of the job's communicator, each revoked once:
 *       - collective: the last rank revokes while every other rank waits in
 *         an All-Reduce it never joins; they all fail with FR_EREVOKED, at
 *         once (well inside FR_TIMEOUT_MS, which the script sets to 60 s),
 *         their message saying who revoked; later calls fail the same way
 *         at once, on every rank;
 *       - point-to-point: the others wait in a receive from the last rank,
 *         which revokes instead of sending;
 *       - from another thread: rank 0 waits in its own nonblocking
 *         All-Reduce that nobody joins, a second thread revokes; the wait
 *         ends with FR_EREVOKED, the other ranks learn it at their next
 *         call;
 *       - after a failure: the last rank's own call is refused, which
 *         ends only the others' next collective, not the receive from it
 *         they wait in; its revoke ends that receive at once;
 *       - revoking a revoked communicator again returns 0 and changes
 *         nothing; NULL is FR_EINVAL;
 *       and throughout, the job's communicator and a dup nobody revoked
 *       reduce right (bit-identical sums on every rank).  On one rank: a
 *       revoked dup's calls fail with FR_EREVOKED, the job's go on.
 *
 *   mp_recover agree
 *       Agreements with no failure: every rank gets 0 and the AND of all
 *       the values, several in a row, between collectives, while a
 *       nonblocking All-Reduce is pending, and on a revoked dup; no rank is
 *       failed; NULL arguments are FR_EINVAL.
 *
 *   mp_recover kill V[,V...] [fault]
 *       (under frrun --keep-going) The victims die (SIGKILL) after a first
 *       All-Reduce; the survivors' next All-Reduce fails, then two
 *       agreements each give FR_EPEER, exactly the victims as failed, and
 *       the AND of the survivors' values.  Each survivor prints
 *       "AGREE<i> ..." lines, which the script finds the same on all.
 *       With "in-agree", the victims die inside the first agreement
 *       (FR_FAULT_AGREE on rank 0, the coordinator: "propose:K" or
 *       "commit:K" is the fourth argument), so only the second one's
 *       outcome is known in advance; the first must still be the same on
 *       every survivor.  Then the survivors shrink: a communicator of
 *       them, in order, whose All-Reduces and agreement are right; with
 *       "card:K" the victims die inside the shrink (after sending K of
 *       their cards), and the shrink leaves them out all the same.
 *
 *   mp_recover late V MS
 *       (FR_TIMEOUT_MS small, under --keep-going) Rank V sleeps MS ms
 *       outside the library, with no progress thread, before it agrees:
 *       the others (progress threads) count it out at the timeout, agree
 *       uniformly (FR_EPEER, failed = V), shrink without it, and keep the
 *       old communicator for MS ms more; rank V, waking, learns from them
 *       that it was counted out: FR_EPEER with itself among the failed,
 *       and its shrink fails with FR_EPEER.
 * Exit 0 when everything held; messages say what did not.
 */
#include <pthread.h>
#include <signal.h>
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

/* A revoke reaches every rank within this (the timeout is 60 s). */
#define AT_ONCE_MS 10000.0

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* comm still reduces right: the sum of (rank + 1) over its ranks. */
static void works(fr_comm_t *comm, const char *what)
{
	int n = fr_comm_size(comm);
	int64_t v = fr_comm_rank(comm) + 1;
	int rc = fr_allreduce(comm, &v, &v, 1, FR_I64, FR_SUM);

	CHECK(!rc && v == (int64_t)n * (n + 1) / 2, "%s: %s, sum %lld (%s)",
	      what, fr_strerror(rc), (long long)v, fr_comm_last_error(comm));
}

/* Every later call on comm fails with FR_EREVOKED, at once. */
static void stays_revoked(fr_comm_t *comm, const char *what)
{
	int32_t v = 1;
	double t = now_ms();
	int rc = fr_allreduce(comm, &v, &v, 1, FR_I32, FR_SUM);

	CHECK(rc == FR_EREVOKED, "%s: a later All-Reduce: %s (%s)", what,
	      fr_strerror(rc), fr_comm_last_error(comm));
	rc = fr_barrier(comm);
	CHECK(rc == FR_EREVOKED, "%s: a later barrier: %s", what,
	      fr_strerror(rc));
	CHECK(now_ms() - t < AT_ONCE_MS, "%s: later calls took %.0f ms", what,
	      now_ms() - t);
	CHECK(fr_comm_revoke(comm) == 0, "%s: revoking again", what);
	rc = fr_barrier(comm);
	CHECK(rc == FR_EREVOKED, "%s: after revoking again: %s", what,
	      fr_strerror(rc));
}

static void case_collective(fr_comm_t *comm)
{
	int last = nranks - 1;

	if (rank == last) {
		usleep(300 * 1000); /* the others are in the All-Reduce */
		CHECK(fr_comm_revoke(comm) == 0, "revoke");
		CHECK(strstr(fr_comm_last_error(comm), "revoked"),
		      "revoker's message: %s", fr_comm_last_error(comm));
	} else {
		int32_t v[1000];
		double t = now_ms();
		int rc;
		char who[32];

		for (int i = 0; i < 1000; i++)
			v[i] = i;
		rc = fr_allreduce(comm, v, v, 1000, FR_I32, FR_SUM);
		t = now_ms() - t;
		CHECK(rc == FR_EREVOKED,
		      "collective: All-Reduce ended with %s after %.0f ms (%s)",
		      fr_strerror(rc), t, fr_comm_last_error(comm));
		CHECK(t < AT_ONCE_MS, "collective: revoke took %.0f ms", t);
		snprintf(who, sizeof(who), "rank %d revoked", last);
		CHECK(strstr(fr_comm_last_error(comm), who),
		      "collective: message does not say \"%s\": %s", who,
		      fr_comm_last_error(comm));
	}
	stays_revoked(comm, "collective");
}

static void case_p2p(fr_comm_t *comm)
{
	int last = nranks - 1;

	if (rank == last) {
		usleep(300 * 1000); /* the others wait for our message */
		CHECK(fr_comm_revoke(comm) == 0, "revoke");
	} else {
		int32_t v[16];
		double t = now_ms();
		int rc = fr_recv(comm, v, 16, FR_I32, last, 7);

		t = now_ms() - t;
		CHECK(rc == FR_EREVOKED,
		      "point-to-point: receive ended with %s after %.0f ms (%s)",
		      fr_strerror(rc), t, fr_comm_last_error(comm));
		CHECK(t < AT_ONCE_MS, "point-to-point: revoke took %.0f ms",
		      t);
	}
	stays_revoked(comm, "point-to-point");
}

static void *revoker(void *arg)
{
	usleep(300 * 1000);
	CHECK(fr_comm_revoke(arg) == 0, "revoke from a thread");
	return NULL;
}

static void case_thread(fr_comm_t *comm, fr_comm_t *world)
{
	if (rank == 0) {
		fr_request_t *req = NULL;
		pthread_t th;
		int32_t v = 5;
		double t = now_ms();
		int rc = fr_iallreduce(comm, &v, &v, 1, FR_I32, FR_SUM, &req);

		CHECK(!rc && req, "iallreduce: %s", fr_strerror(rc));
		pthread_create(&th, NULL, revoker, comm);
		rc = req ? fr_wait(&req) : FR_EINVAL;
		t = now_ms() - t;
		pthread_join(th, NULL);
		CHECK(rc == FR_EREVOKED,
		      "thread: wait ended with %s after %.0f ms (%s)",
		      fr_strerror(rc), t, fr_comm_last_error(comm));
		CHECK(t < AT_ONCE_MS, "thread: revoke took %.0f ms", t);
	}
	/* the others call only now: the revoke is on its way or there */
	CHECK(!fr_barrier(world), "world barrier");
	stays_revoked(comm, "thread");
}

/*
 * The last rank's own call is refused (a bad datatype), which fails the
 * communicator everywhere: but the others wait in a receive from it, and a
 * refusal's notice ends only their next collective.  Its revoke ends the
 * receive at once.
 */
static void case_after_failure(fr_comm_t *comm)
{
	int last = nranks - 1, rc;

	if (rank == last) {
		int32_t v = 1;

		rc = fr_allreduce(comm, &v, &v, 1, (fr_dtype_t)999, FR_SUM);
		CHECK(rc == FR_EINVAL, "after failure: refused call: %s",
		      fr_strerror(rc));
		usleep(300 * 1000); /* the others still wait */
		CHECK(fr_comm_revoke(comm) == 0, "revoke");
		rc = fr_barrier(comm);
		CHECK(rc == FR_EINVAL,
		      "after failure: the revoker's later calls keep its own failure: %s",
		      fr_strerror(rc));
	} else {
		int32_t v[16];
		double t = now_ms();

		rc = fr_recv(comm, v, 16, FR_I32, last, 9);
		t = now_ms() - t;
		CHECK(rc == FR_EREVOKED,
		      "after failure: receive ended with %s after %.0f ms (%s)",
		      fr_strerror(rc), t, fr_comm_last_error(comm));
		CHECK(t < AT_ONCE_MS, "after failure: revoke took %.0f ms", t);
		stays_revoked(comm, "after failure");
	}
}

static int mode_revoke(fr_comm_t *world)
{
	fr_comm_t *d[4] = {NULL}, *keep = NULL;
	int rc;

	for (int i = 0; i < 4; i++) {
		rc = fr_comm_dup(world, &d[i]);
		CHECK(!rc, "dup %d: %s", i, fr_strerror(rc));
	}
	rc = fr_comm_dup(world, &keep);
	CHECK(!rc, "dup: %s", fr_strerror(rc));
	if (fails)
		return fails;
	CHECK(fr_comm_revoke(NULL) == FR_EINVAL, "revoke(NULL)");
	works(world, "world before");
	case_collective(d[0]);
	works(world, "world after a collective revoked");
	works(keep, "the dup nobody revoked");
	case_p2p(d[1]);
	works(world, "world after a receive revoked");
	case_thread(d[2], world);
	works(world, "world after a thread revoked");
	case_after_failure(d[3]);
	works(world, "world after a failed communicator revoked");
	works(keep, "the dup nobody revoked, at the end");
	for (int i = 0; i < 4; i++)
		fr_comm_destroy(d[i]);
	fr_comm_destroy(keep);
	return fails;
}

/* One rank: nobody to tell, but its own calls on the dup fail the same
 * way; the job's communicator goes on. */
static int mode_revoke_alone(fr_comm_t *world)
{
	fr_comm_t *d = NULL;
	int rc = fr_comm_dup(world, &d);

	CHECK(!rc, "dup: %s", fr_strerror(rc));
	if (rc)
		return fails;
	CHECK(fr_comm_revoke(NULL) == FR_EINVAL, "revoke(NULL)");
	works(d, "the dup before");
	CHECK(fr_comm_revoke(d) == 0, "revoke");
	CHECK(strstr(fr_comm_last_error(d), "revoked"), "message: %s",
	      fr_comm_last_error(d));
	stays_revoked(d, "one rank");
	works(world, "world after its dup was revoked");
	fr_comm_destroy(d);
	return fails;
}

/* ---- agreement ------------------------------------------------------------
 */

/* The value rank r passes to agreement i: every bit but one. */
static uint32_t agree_value(int r, int i)
{
	return ~(1u << ((unsigned)(r + 3 * i) % 32u));
}

/* The AND over n ranks but those in the victims' set. */
static uint32_t agree_and(int i, const bool *dead, int n)
{
	uint32_t v = ~0u;

	for (int r = 0; r < n; r++)
		if (!dead || !dead[r])
			v &= agree_value(r, i);
	return v;
}

static void agree_ok(fr_comm_t *comm, int i, const char *what)
{
	uint32_t f = agree_value(fr_comm_rank(comm), i);
	uint32_t want = agree_and(i, NULL, fr_comm_size(comm));
	int nf = -1, rc = fr_comm_agree(comm, &f);

	CHECK(!rc, "%s: agreement %d: %s (%s)", what, i, fr_strerror(rc),
	      fr_comm_last_error(comm));
	CHECK(f == want, "%s: agreement %d: 0x%08x, not 0x%08x", what, i, f,
	      want);
	rc = fr_comm_failed(comm, NULL, 0, &nf);
	CHECK(!rc && nf == 0, "%s: %d failed ranks (%s)", what, nf,
	      fr_strerror(rc));
}

static int mode_agree(fr_comm_t *world)
{
	fr_comm_t *d = NULL, *rv = NULL;
	fr_request_t *req = NULL;
	int64_t x;
	uint32_t f = 1;
	int rc, nf;

	CHECK(fr_comm_agree(NULL, &f) == FR_EINVAL, "agree(NULL comm)");
	CHECK(fr_comm_agree(world, NULL) == FR_EINVAL, "agree(NULL flags)");
	CHECK(fr_comm_failed(world, NULL, 1, &nf) == FR_EINVAL,
	      "failed(NULL ranks, max 1)");
	CHECK(fr_comm_failed(world, NULL, 0, NULL) == FR_EINVAL,
	      "failed(NULL count)");
	rc = fr_comm_dup(world, &d);
	CHECK(!rc, "dup: %s", fr_strerror(rc));
	rc = fr_comm_dup(world, &rv);
	CHECK(!rc, "dup: %s", fr_strerror(rc));
	if (rc || !d)
		return fails;
	for (int i = 0; i < 4; i++) {
		agree_ok(world, i, "world");
		works(world, "world between agreements");
		agree_ok(d, i, "dup");
	}
	/* with a collective pending, which completes after it */
	x = rank + 1;
	rc = fr_iallreduce(d, &x, &x, 1, FR_I64, FR_SUM, &req);
	CHECK(!rc, "iallreduce: %s", fr_strerror(rc));
	agree_ok(d, 5, "dup, an All-Reduce pending");
	rc = req ? fr_wait(&req) : rc;
	CHECK(!rc && x == (int64_t)nranks * (nranks + 1) / 2,
	      "the pending All-Reduce: %s, %lld", fr_strerror(rc),
	      (long long)x);
	/* on a revoked communicator: it is failed, nobody is dead */
	if (rank == nranks - 1)
		CHECK(fr_comm_revoke(rv) == 0, "revoke");
	agree_ok(rv, 6, "revoked dup");
	CHECK(fr_barrier(rv) == FR_EREVOKED, "revoked dup still revoked");
	works(d, "dup at the end");
	fr_comm_destroy(rv);
	fr_comm_destroy(d);
	return fails;
}

/* "1,2" into dead[] */
static int parse_victims(const char *s, bool *dead)
{
	int n = 0;

	for (const char *p = s; *p;) {
		char *end;
		long v = strtol(p, &end, 10);

		if (end == p || v < 0 || v >= nranks)
			return -1;
		dead[v] = true;
		n++;
		p = *end == ',' ? end + 1 : end;
		if (*end && *end != ',')
			return -1;
	}
	return n;
}

/* One agreement of a survivor: checked against what is known in advance
 * (known: the victims are dead before it), printed for the script. */
static void agree_after(fr_comm_t *world, int i, const bool *dead, int nv,
			bool known)
{
	uint32_t f = agree_value(rank, i);
	int ranks[64], nf = -1, rc;
	double t = now_ms();
	char list[256] = "";
	size_t at = 0;

	rc = fr_comm_agree(world, &f);
	t = now_ms() - t;
	CHECK(fr_comm_failed(world, ranks, 64, &nf) == 0, "failed()");
	for (int k = 0; k < nf && k < 64; k++)
		at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%d",
				       k ? "," : "", ranks[k]);
	printf("AGREE%d rc=%s flags=0x%08x failed=%s\n", i, fr_errname(rc), f,
	       list);
	fflush(stdout);
	/* the deaths are seen at once (closed connections), never by the
	 * timeout (60 s in the script) */
	CHECK(t < 20000, "agreement %d took %.0f ms", i, t);
	if (!known)
		return;
	CHECK(rc == FR_EPEER, "agreement %d: %s, not FR_EPEER (%s)", i,
	      fr_errname(rc), fr_comm_last_error(world));
	CHECK(f == agree_and(i, dead, nranks),
	      "agreement %d: 0x%08x, not 0x%08x", i, f,
	      agree_and(i, dead, nranks));
	CHECK(nf == nv, "agreement %d: %d failed ranks, not %d", i, nf, nv);
	for (int k = 0; k < nf && k < 64; k++)
		CHECK(dead[ranks[k]], "agreement %d: rank %d failed?", i,
		      ranks[k]);
}

/* The survivors shrink: a communicator of them, in order, that works
 * (sums bit-identical, agreements, no rank failed); printed for the
 * script. */
static void shrink_after(fr_comm_t *world, const bool *dead, int nv)
{
	fr_comm_t *s = NULL;
	int me = 0, nf = -1, rc;
	double t = now_ms();
	float v[1001];

	for (int r = 0; r < rank; r++)
		me += !dead[r];
	rc = fr_comm_shrink(world, &s);
	t = now_ms() - t;
	CHECK(!rc && s, "shrink: %s (%s)", fr_errname(rc),
	      fr_comm_last_error(world));
	if (!s)
		return;
	printf("SHRINK rc=%s size=%d\n", fr_errname(rc), fr_comm_size(s));
	fflush(stdout);
	CHECK(t < 20000, "shrink took %.0f ms", t);
	CHECK(fr_comm_size(s) == nranks - nv && fr_comm_rank(s) == me,
	      "shrunk: rank %d of %d, not %d of %d", fr_comm_rank(s),
	      fr_comm_size(s), me, nranks - nv);
	works(s, "shrunk");
	/* a vector whose sum is exact in floats, ring or not */
	for (int i = 0; i < 1001; i++)
		v[i] = (float)((fr_comm_rank(s) + 1) * (i % 7));
	rc = fr_allreduce(s, v, v, 1001, FR_F32, FR_SUM);
	for (int i = 0; i < 1001 && !rc; i++)
		if (v[i] != (float)(fr_comm_size(s) * (fr_comm_size(s) + 1) /
				    2 * (i % 7))) {
			CHECK(0, "shrunk: element %d is %g", i, (double)v[i]);
			break;
		}
	CHECK(!rc, "shrunk: All-Reduce of 1001: %s", fr_errname(rc));
	agree_ok(s, 7, "shrunk");
	rc = fr_comm_failed(s, NULL, 0, &nf);
	CHECK(!rc && nf == 0, "shrunk: %d failed", nf);
	CHECK(fr_comm_shrink(world, NULL) == FR_EINVAL, "shrink(NULL out)");
	{
		fr_comm_t *g = (fr_comm_t *)&rc; /* must come back NULL */

		CHECK(fr_comm_grow(s, 0, &g) == FR_EINVAL && !g,
		      "grow(0 newcomers)");
		CHECK(fr_comm_grow(s, 1, NULL) == FR_EINVAL, "grow(NULL out)");
		CHECK(fr_comm_grow(NULL, 1, &g) == FR_EINVAL, "grow(NULL)");
		CHECK(fr_comm_join(NULL, NULL) == FR_EINVAL, "join(NULL)");
	}
	fr_comm_destroy(s);
}

static int mode_kill(fr_comm_t *world, const char *victims, const char *fault)
{
	bool dead[1024] = {false};
	int nv = nranks <= 1024 ? parse_victims(victims, dead) : -1, rc = 0;
	int64_t x = 1;

	if (nv <= 0 || nv >= nranks) {
		fprintf(stderr, "bad victims %s for %d ranks\n", victims,
			nranks);
		return ++fails;
	}
	works(world, "before");
	if (fault) {
		/* the victims die inside the first agreement (the
		 * coordinator's faults) or in the shrink (card:K) */
		if (dead[rank])
			setenv("FR_FAULT_AGREE", fault, 1);
		if (!strncmp(fault, "card:", 5)) {
			shrink_after(world, dead, nv);
			if (dead[rank]) {
				fprintf(stderr, "rank %d: a victim survived\n",
					rank);
				fails++;
			}
			return fails;
		}
	} else {
		/* after the others have surely finished "before" */
		if (dead[rank]) {
			usleep(300 * 1000);
			raise(SIGKILL);
		}
		/* the survivors' next collective fails */
		for (int i = 0; i < 1000 && !rc; i++)
			rc = fr_allreduce(world, &x, &x, 1, FR_I64, FR_SUM);
		CHECK(rc, "the All-Reduces after the kill all succeeded");
	}
	agree_after(world, 1, dead, nv, !fault);
	if (dead[rank]) {
		fprintf(stderr, "rank %d: a victim survived\n", rank);
		return ++fails;
	}
	agree_after(world, 2, dead, nv, true);
	rc = fr_allreduce(world, &x, &x, 1, FR_I64, FR_SUM);
	CHECK(rc == FR_EPEER || rc == FR_ETIMEDOUT,
	      "an All-Reduce after the agreement: %s", fr_errname(rc));
	shrink_after(world, dead, nv);
	return fails;
}

static int mode_late(fr_comm_t *world, int v, int ms)
{
	bool dead[1024] = {false};
	uint32_t f = agree_value(rank, 1);
	int ranks[64], nf = -1, rc;
	fr_comm_t *s = NULL;

	if (v < 0 || v >= nranks || nranks < 3 || nranks > 1024) {
		fprintf(stderr, "late: bad victim %d of %d\n", v, nranks);
		return ++fails;
	}
	dead[v] = true;
	works(world, "before");
	if (rank != v) {
		agree_after(world, 1, dead, 1, true);
		shrink_after(world, dead, 1);
		/* the old communicator answers rank V from the progress
		 * thread until it has woken and asked */
		usleep((useconds_t)ms * 1000u + 2000000u);
		return fails;
	}
	usleep((useconds_t)ms * 1000u);
	rc = fr_comm_agree(world, &f);
	CHECK(rc == FR_EPEER, "late rank: agree %s (%s)", fr_errname(rc),
	      fr_comm_last_error(world));
	CHECK(fr_comm_failed(world, ranks, 64, &nf) == 0, "failed()");
	rc = 0;
	for (int k = 0; k < nf && k < 64; k++)
		rc |= ranks[k] == v;
	CHECK(rc, "late rank: not among the failed ranks (%d of them)", nf);
	rc = fr_comm_shrink(world, &s);
	CHECK(rc == FR_EPEER && !s, "late rank: shrink %s", fr_errname(rc));
	if (s)
		fr_comm_destroy(s);
	return fails;
}

int main(int argc, char **argv)
{
	fr_comm_t *world;
	fr_config_t cfg;
	const char *er = getenv("FR_RANK");
	int rc;

	if (argc < 2) {
		fprintf(stderr,
			"usage: mp_recover revoke|agree|kill V[,V...] [propose:K|commit:K]\n");
		return 2;
	}
	fr_config_init(&cfg);
	/* "late": the late rank has no progress thread (nothing answers
	 * for it while it sleeps), the others have one */
	if (!strcmp(argv[1], "late") && argc >= 4)
		cfg.progress = er && atoi(er) == atoi(argv[2])
				       ? FR_PROGRESS_CALLER
				       : FR_PROGRESS_THREAD;
	rc = fr_comm_create_from_env(&cfg, &world);
	if (rc) {
		fprintf(stderr, "fr_comm_create_from_env: %s: %s\n",
			fr_strerror(rc), fr_comm_last_error(NULL));
		return 1;
	}
	rank = fr_comm_rank(world);
	nranks = fr_comm_size(world);
	if (!strcmp(argv[1], "revoke")) {
		if (nranks < 2)
			mode_revoke_alone(world);
		else
			mode_revoke(world);
	} else if (!strcmp(argv[1], "agree")) {
		mode_agree(world);
	} else if (!strcmp(argv[1], "late") && argc >= 4) {
		mode_late(world, atoi(argv[2]), atoi(argv[3]));
	} else if (!strcmp(argv[1], "kill") && argc >= 3) {
		mode_kill(world, argv[2], argc >= 4 ? argv[3] : NULL);
	} else {
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		fails++;
	}
	fr_comm_destroy(world);
	if (fails)
		fprintf(stderr, "rank %d: %d failures\n", rank, fails);
	return fails ? 1 : 0;
}
