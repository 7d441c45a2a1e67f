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

int main(int argc, char **argv)
{
	fr_comm_t *world;
	int rc;

	if (argc < 2) {
		fprintf(stderr, "usage: mp_recover revoke\n");
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
	if (!strcmp(argv[1], "revoke")) {
		if (nranks < 2)
			mode_revoke_alone(world);
		else
			mode_revoke(world);
	} else {
		fprintf(stderr, "unknown mode %s\n", argv[1]);
		fails++;
	}
	fr_comm_destroy(world);
	if (fails)
		fprintf(stderr, "rank %d: %d failures\n", rank, fails);
	return fails ? 1 : 0;
}
