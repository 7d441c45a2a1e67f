/* SPDX-License-Identifier: MIT */
/*
 * test_mem.c - registered memory and the registration cache (src/mem.c),
 * driven through the public API and fr_comm_stats(), plus the argument
 * checks of fr_allreduce/fr_iallreduce, fr_comm_stats and fr_comm_create.
 *
 * Most tests use a communicator of one rank over TCP.  One rank never needs
 * the transport to touch user buffers, so the collectives there do not go
 * through the cache; the cache itself is exercised on that communicator
 * through the internal fr_mem_acquire()/fr_mem_release() the ring engine
 * uses, and end to end (fr_allreduce on unregistered buffers) by a job of
 * two ranks: rank 0 here, rank 1 in a forked child running the same script.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fastreduce.h"
#include "internal.h"

#define REGCACHE 4
#define CHILD_WAIT_MS 30000

static size_t page(void)
{
	long p = sysconf(_SC_PAGESIZE);

	return p > 0 ? (size_t)p : 4096;
}

static fr_comm_t *one_rank(int regcache)
{
	fr_config_t cfg;
	fr_comm_t *c = NULL;
	int rc;

	fr_config_init(&cfg);
	cfg.rank = 0;
	cfg.nranks = 1;
	cfg.transport = "tcp";
	cfg.timeout_ms = 10000;
	cfg.regcache_entries = regcache;
	rc = fr_comm_create(&cfg, &c);
	if (rc)
		fail_msg("fr_comm_create (1 rank, tcp): %s: %s", fr_errname(rc),
			 fr_comm_last_error(NULL));
	assert_non_null(c);
	return c;
}

static int setup(void **state)
{
	*state = one_rank(REGCACHE);
	return 0;
}

static int teardown(void **state)
{
	assert_int_equal(fr_comm_destroy(*state), 0);
	return 0;
}

static fr_stats_t stats(const fr_comm_t *c)
{
	fr_stats_t s;

	memset(&s, 0, sizeof(s));
	s.size = sizeof(s);
	assert_int_equal(fr_comm_stats(c, &s), 0);
	return s;
}

static void *pages(size_t n)
{
	void *p = aligned_alloc(page(), n * page());

	assert_non_null(p);
	memset(p, 0, n * page());
	return p;
}

/* ---- registration ------------------------------------------------------------------ */

static void test_register_args(void **state)
{
	fr_comm_t *c = *state;
	fr_mem_t *m = NULL;
	char buf[256];
	fr_stats_t s0 = stats(c), s1;

	assert_int_equal(fr_mem_register(NULL, buf, sizeof(buf), &m), FR_EINVAL);
	assert_int_equal(fr_mem_register(c, buf, sizeof(buf), NULL), FR_EINVAL);
	assert_int_equal(fr_mem_register(c, NULL, sizeof(buf), &m), FR_EINVAL);
	assert_true(strlen(fr_comm_last_error(c)) > 0);
	assert_int_equal(fr_mem_register(c, buf, 0, &m), FR_EINVAL);
	assert_true(strlen(fr_comm_last_error(c)) > 0);
	assert_int_equal(fr_mem_register(c, (void *)(UINTPTR_MAX - 15), 64,
					 &m),
			 FR_EINVAL);
	/* Nothing was registered by the failures. */
	s1 = stats(c);
	assert_true(s1.mem_registrations == s0.mem_registrations);

	assert_int_equal(fr_mem_deregister(NULL), 0);
	assert_int_equal(fr_mem_register(c, buf, sizeof(buf), &m), 0);
	assert_non_null(m);
	s1 = stats(c);
	assert_true(s1.mem_registrations == s0.mem_registrations + 1);
	assert_int_equal(fr_mem_deregister(m), 0);
	/* Registered twice, deregistered one by one. */
	fr_mem_t *a, *b;

	assert_int_equal(fr_mem_register(c, buf, sizeof(buf), &a), 0);
	assert_int_equal(fr_mem_register(c, buf + 8, 8, &b), 0);
	assert_ptr_not_equal(a, b);
	assert_int_equal(fr_mem_deregister(a), 0);
	assert_int_equal(fr_mem_deregister(b), 0);
}

static void test_deregister_unknown(void **state)
{
	fr_comm_t *c = *state;
	struct fr_mem fake, *cached;
	char *buf = pages(2);

	/* Something that is no registration of this communicator. */
	memset(&fake, 0, sizeof(fake));
	fake.comm = c;
	fake.base = (uintptr_t)buf;
	fake.len = 64;
	fake.user = true;
	assert_int_not_equal(fr_mem_deregister(&fake), 0);
	assert_true(strlen(fr_comm_last_error(c)) > 0);
	/* A cache entry is not the caller's to deregister (and stays usable). */
	assert_int_equal(fr_mem_acquire(c, buf, 64, FR_TP_LOCAL_READ, &cached),
			 0);
	fr_mem_release(cached);
	assert_int_not_equal(fr_mem_deregister(cached), 0);
	fr_stats_t s0 = stats(c);

	assert_int_equal(fr_mem_acquire(c, buf, 64, FR_TP_LOCAL_READ, &cached),
			 0);
	fr_mem_release(cached);
	assert_true(stats(c).regcache_hits == s0.regcache_hits + 1);
	free(buf);
}

static void test_deregister_busy(void **state)
{
	fr_comm_t *c = *state;
	char *buf = pages(4);
	fr_mem_t *m;
	struct fr_mem *in;

	assert_int_equal(fr_mem_register(c, buf, 4 * page(), &m), 0);
	/* A collective using the registration holds a reference. */
	assert_int_equal(fr_mem_acquire(c, buf + 100, 100,
					FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE |
						FR_TP_REMOTE_WRITE,
					&in),
			 0);
	assert_ptr_equal(in, m);
	assert_int_equal(fr_mem_deregister(m), FR_EBUSY);
	assert_true(strlen(fr_comm_last_error(c)) > 0);
	fr_mem_release(in);
	assert_int_equal(fr_mem_deregister(m), 0);
	free(buf);
}

/* ---- the cache ------------------------------------------------------------------------- */

static void acq_rel(fr_comm_t *c, const void *p, size_t len, int access)
{
	struct fr_mem *m;

	assert_int_equal(fr_mem_acquire(c, p, len, access, &m), 0);
	assert_non_null(m);
	/* The registration covers the buffer. */
	assert_true(m->base <= (uintptr_t)p);
	assert_true((uintptr_t)p + len <= m->base + m->len);
	fr_mem_release(m);
}

static void test_cache_hits_and_misses(void **state)
{
	fr_comm_t *c = one_rank(64); /* room for all: no evictions here */
	const int R = FR_TP_LOCAL_READ;
	const int RW = FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE;
	char *buf = pages(8);
	fr_stats_t s0 = stats(c), s;

	acq_rel(c, buf + 10, 100, R);
	s = stats(c);
	assert_true(s.regcache_misses == s0.regcache_misses + 1);
	assert_true(s.regcache_hits == s0.regcache_hits);
	assert_true(s.mem_registrations == s0.mem_registrations + 1);
	/* Again, and anything else on the same page: hits, no registration. */
	acq_rel(c, buf + 10, 100, R);
	acq_rel(c, buf, page(), R);
	acq_rel(c, buf + page() / 2, 1, R);
	s = stats(c);
	assert_true(s.regcache_misses == s0.regcache_misses + 1);
	assert_true(s.regcache_hits == s0.regcache_hits + 3);
	assert_true(s.mem_registrations == s0.mem_registrations + 1);
	/* Another page is another range. */
	acq_rel(c, buf + 2 * page() + 8, 8, R);
	s = stats(c);
	assert_true(s.regcache_misses == s0.regcache_misses + 2);
	/* A range spilling over a page boundary covers both pages. */
	acq_rel(c, buf + 4 * page() - 8, 16, R);
	acq_rel(c, buf + 4 * page() - 100, 100, R);
	acq_rel(c, buf + 4 * page(), 100, R);
	s = stats(c);
	assert_true(s.regcache_misses == s0.regcache_misses + 3);
	assert_true(s.regcache_hits == s0.regcache_hits + 5);
	/* Read-only does not cover a receive buffer; the wider one then
	 * serves both ways. */
	acq_rel(c, buf + 6 * page(), 64, R);
	acq_rel(c, buf + 6 * page(), 64, RW);
	s = stats(c);
	assert_true(s.regcache_misses == s0.regcache_misses + 5);
	acq_rel(c, buf + 6 * page(), 64, RW);
	acq_rel(c, buf + 6 * page(), 64, R);
	s = stats(c);
	assert_true(s.regcache_misses == s0.regcache_misses + 5);
	assert_true(s.regcache_hits == s0.regcache_hits + 7);
	assert_true(s.regcache_evictions == s0.regcache_evictions);
	assert_true(s.mem_registrations == s0.mem_registrations + 5);
	free(buf);
	(void)state;
	assert_int_equal(fr_comm_destroy(c), 0);
}

static void test_cache_inside_registered(void **state)
{
	fr_comm_t *c = *state;
	char *buf = pages(4);
	fr_mem_t *m;
	struct fr_mem *got;
	fr_stats_t s0, s;

	assert_int_equal(fr_mem_register(c, buf + 100, 3 * page(), &m), 0);
	s0 = stats(c);
	assert_int_equal(fr_mem_acquire(c, buf + 100, 3 * page(),
					FR_TP_LOCAL_READ | FR_TP_REMOTE_WRITE,
					&got),
			 0);
	assert_ptr_equal(got, m);
	fr_mem_release(got);
	assert_int_equal(fr_mem_acquire(c, buf + 2 * page(), 64,
					FR_TP_LOCAL_READ, &got),
			 0);
	assert_ptr_equal(got, m);
	fr_mem_release(got);
	s = stats(c);
	assert_true(s.regcache_misses == s0.regcache_misses);
	assert_true(s.mem_registrations == s0.mem_registrations);
	/* One byte outside it is not inside it. */
	assert_int_equal(fr_mem_acquire(c, buf + 99, 64, FR_TP_LOCAL_READ,
					&got),
			 0);
	assert_ptr_not_equal(got, m);
	fr_mem_release(got);
	assert_int_equal(fr_mem_acquire(c, buf + 100 + 3 * page() - 8, 16,
					FR_TP_LOCAL_READ, &got),
			 0);
	assert_ptr_not_equal(got, m);
	fr_mem_release(got);
	s = stats(c);
	assert_true(s.regcache_misses == s0.regcache_misses + 2);
	assert_int_equal(fr_mem_deregister(m), 0);
	free(buf);
}

/* A collective moves the communicator's clock the cache's LRU runs on. */
static void tick(fr_comm_t *c)
{
	float x = 1.0f;

	assert_int_equal(fr_allreduce(c, &x, &x, 1, FR_F32, FR_SUM), 0);
}

static void test_cache_eviction(void **state)
{
	fr_comm_t *c = *state;
	const int N = 3 * REGCACHE;
	char *buf = pages((size_t)2 * N + 2);
	struct fr_mem *held;
	fr_stats_t s0 = stats(c), s;

	/* The oldest entry stays in use the whole time: it must survive. */
	assert_int_equal(fr_mem_acquire(c, buf, 8, FR_TP_LOCAL_READ, &held), 0);
	for (int i = 1; i <= N; i++) {
		tick(c);
		acq_rel(c, buf + (size_t)2 * i * page(), 64, FR_TP_LOCAL_READ);
		assert_true(c->mem.cache_entries <= REGCACHE);
	}
	s = stats(c);
	assert_true(s.regcache_misses == s0.regcache_misses + 1 + (uint64_t)N);
	assert_true(s.mem_registrations ==
		    s0.mem_registrations + 1 + (uint64_t)N);
	/* Exactly as many evictions as needed to stay within the bound. */
	assert_true(s.regcache_evictions ==
		    s0.regcache_evictions + 1 + (uint64_t)N - REGCACHE);
	assert_int_equal(c->mem.cache_entries, REGCACHE);
	/* The most recently used ones are the ones kept. */
	for (int i = N; i > N - (REGCACHE - 1); i--) {
		tick(c);
		acq_rel(c, buf + (size_t)2 * i * page(), 64, FR_TP_LOCAL_READ);
	}
	assert_true(stats(c).regcache_hits ==
		    s.regcache_hits + (uint64_t)REGCACHE - 1);
	assert_true(stats(c).regcache_misses == s.regcache_misses);
	/* The one in use was never evicted. */
	fr_mem_release(held);
	acq_rel(c, buf, 8, FR_TP_LOCAL_READ);
	assert_true(stats(c).regcache_hits ==
		    s.regcache_hits + (uint64_t)REGCACHE);
	/* And the first of the others is long gone. */
	acq_rel(c, buf + 2 * page(), 64, FR_TP_LOCAL_READ);
	assert_true(stats(c).regcache_misses == s.regcache_misses + 1);
	free(buf);
}

/* ---- results on one rank ---------------------------------------------------------------- */

static void test_one_rank_results(void **state)
{
	fr_comm_t *c = *state;
	float sf[1000], rf[1000], keep[1000];
	double sd[33], rd[33];
	int8_t si[7], ri[7];
	fr_stats_t s0 = stats(c);

	assert_int_equal(fr_comm_rank(c), 0);
	assert_int_equal(fr_comm_size(c), 1);
	assert_string_equal(fr_comm_transport(c), "tcp");
	for (int i = 0; i < 1000; i++) {
		sf[i] = (float)i * 0.25f - 100.0f;
		rf[i] = -1.0f;
	}
	memcpy(keep, sf, sizeof(sf));
	for (int op = 0; op < FR_OP_COUNT; op++) {
		memset(rf, 0, sizeof(rf));
		assert_int_equal(fr_allreduce(c, sf, rf, 1000, FR_F32,
					      (fr_op_t)op),
				 0);
		assert_memory_equal(rf, sf, sizeof(sf));
		assert_memory_equal(sf, keep, sizeof(sf)); /* input untouched */
	}
	for (int i = 0; i < 33; i++)
		sd[i] = 1e300 / (i + 1);
	assert_int_equal(fr_allreduce(c, sd, rd, 33, FR_F64, FR_AVG), 0);
	assert_memory_equal(rd, sd, sizeof(sd));
	for (int i = 0; i < 7; i++)
		si[i] = (int8_t)(i * 40 - 128);
	assert_int_equal(fr_allreduce(c, si, ri, 7, FR_I8, FR_PROD), 0);
	assert_memory_equal(ri, si, sizeof(si));
	/* In place, both spellings: unchanged. */
	assert_int_equal(fr_allreduce(c, rf, rf, 1000, FR_F32, FR_SUM), 0);
	assert_memory_equal(rf, keep, sizeof(rf));
	assert_int_equal(fr_allreduce(c, FR_IN_PLACE, rf, 1000, FR_F32,
				      FR_MAX),
			 0);
	assert_memory_equal(rf, keep, sizeof(rf));
	/* Count 0 is a valid, empty collective, NULL buffers included. */
	assert_int_equal(fr_allreduce(c, sf, rf, 0, FR_F32, FR_SUM), 0);
	assert_int_equal(fr_allreduce(c, NULL, NULL, 0, FR_F32, FR_SUM), 0);
	assert_true(stats(c).collectives ==
		    s0.collectives + FR_OP_COUNT + 2 + 2 + 2);
}

/* ---- argument checks -------------------------------------------------------------------- */

static void expect_einval(fr_comm_t *c, int rc, const char *word)
{
	const char *e = fr_comm_last_error(c);

	assert_int_equal(rc, FR_EINVAL);
	assert_non_null(e);
	assert_true(strlen(e) > 0);
	if (word && !strstr(e, word))
		fail_msg("\"%s\" does not mention \"%s\"", e, word);
}

static void test_allreduce_args(void **state)
{
	fr_comm_t *c = *state;
	float a[64], b[64];
	int32_t ia[8], ib[8];
	fr_stats_t s0 = stats(c);

	memset(a, 0, sizeof(a));
	memset(ia, 0, sizeof(ia));
	expect_einval(c, fr_allreduce(c, a, b, 8, FR_DTYPE_COUNT, FR_SUM),
		      NULL);
	expect_einval(c, fr_allreduce(c, a, b, 8, (fr_dtype_t)-1, FR_SUM),
		      NULL);
	expect_einval(c, fr_allreduce(c, a, b, 8, FR_F32, FR_OP_COUNT), NULL);
	expect_einval(c, fr_allreduce(c, a, b, 8, FR_F32, (fr_op_t)-1), NULL);
	/* avg of integers is refused, saying why. */
	expect_einval(c, fr_allreduce(c, ia, ib, 8, FR_I32, FR_AVG), "avg");
	expect_einval(c, fr_allreduce(c, ia, ib, 8, FR_U8, FR_AVG), "avg");
	/* NULL buffers with elements. */
	expect_einval(c, fr_allreduce(c, NULL, b, 8, FR_F32, FR_SUM), "NULL");
	expect_einval(c, fr_allreduce(c, a, NULL, 8, FR_F32, FR_SUM), "NULL");
	expect_einval(c, fr_allreduce(c, FR_IN_PLACE, NULL, 8, FR_F32, FR_SUM),
		      "NULL");
	/* Overlapping but different buffers, either way round. */
	expect_einval(c, fr_allreduce(c, a, a + 1, 8, FR_F32, FR_SUM),
		      "overlap");
	expect_einval(c, fr_allreduce(c, a + 1, a, 8, FR_F32, FR_SUM),
		      "overlap");
	expect_einval(c, fr_allreduce(c, a, a + 7, 8, FR_F32, FR_SUM),
		      "overlap");
	expect_einval(c, fr_allreduce(c, (char *)a + 1, a, 8, FR_F32, FR_SUM),
		      "overlap");
	/* A count whose byte size overflows. */
	expect_einval(c, fr_allreduce(c, a, b, SIZE_MAX / 2, FR_F32, FR_SUM),
		      NULL);
	expect_einval(c, fr_allreduce(NULL, a, b, 8, FR_F32, FR_SUM), NULL);
	/* None of that counted as a collective. */
	assert_true(stats(c).collectives == s0.collectives);
	/* Adjacent is not overlapping, and the communicator still works. */
	for (int i = 0; i < 16; i++)
		a[i] = (float)i;
	assert_int_equal(fr_allreduce(c, a, a + 8, 8, FR_F32, FR_SUM), 0);
	assert_memory_equal(a + 8, a, 8 * sizeof(float));
	assert_int_equal(fr_allreduce(c, a + 8, a, 8, FR_F32, FR_SUM), 0);
	assert_int_equal(fr_allreduce(c, ia, ib, 8, FR_I32, FR_SUM), 0);
	assert_true(stats(c).collectives == s0.collectives + 3);

	fr_request_t *req = NULL;

	expect_einval(c, fr_iallreduce(c, a, b, 8, FR_I32, FR_AVG, &req),
		      "avg");
	assert_int_equal(fr_iallreduce(c, a, b, 8, FR_F32, FR_SUM, NULL),
			 FR_EINVAL);
	assert_int_equal(fr_iallreduce(NULL, a, b, 8, FR_F32, FR_SUM, &req),
			 FR_EINVAL);
}

/* ---- non-blocking --------------------------------------------------------------------- */

static void test_iallreduce(void **state)
{
	fr_comm_t *c = *state;
	double s[3][100], r[3][100];
	fr_request_t *req[3];
	fr_stats_t s0 = stats(c);
	int done, rc;

	for (int k = 0; k < 3; k++)
		for (int i = 0; i < 100; i++) {
			s[k][i] = k * 1000 + i;
			r[k][i] = -1;
		}
	/* fr_test until done. */
	req[0] = NULL;
	assert_int_equal(fr_iallreduce(c, s[0], r[0], 100, FR_F64, FR_SUM,
				       &req[0]),
			 0);
	assert_non_null(req[0]);
	done = 0;
	rc = -999;
	for (int i = 0; i < 100000 && !done; i++)
		rc = fr_test(&req[0], &done);
	assert_int_equal(done, 1);
	assert_int_equal(rc, 0);
	assert_null(req[0]);
	assert_memory_equal(r[0], s[0], sizeof(s[0]));
	/* fr_wait. */
	assert_int_equal(fr_iallreduce(c, s[1], r[1], 100, FR_F64, FR_MIN,
				       &req[1]),
			 0);
	assert_non_null(req[1]);
	assert_int_equal(fr_wait(&req[1]), 0);
	assert_null(req[1]);
	assert_memory_equal(r[1], s[1], sizeof(s[1]));
	/* Several in flight, completed out of order. */
	for (int k = 0; k < 3; k++) {
		memset(r[k], 0, sizeof(r[k]));
		assert_int_equal(fr_iallreduce(c, s[k], r[k], 100, FR_F64,
					       FR_MAX, &req[k]),
				 0);
	}
	assert_int_equal(fr_progress(c), 0);
	assert_int_equal(fr_wait(&req[2]), 0);
	assert_int_equal(fr_wait(&req[0]), 0);
	done = 0;
	for (int i = 0; i < 100000 && !done; i++)
		assert_int_equal(fr_test(&req[1], &done), 0);
	assert_int_equal(done, 1);
	for (int k = 0; k < 3; k++) {
		assert_null(req[k]);
		assert_memory_equal(r[k], s[k], sizeof(s[k]));
	}
	assert_true(stats(c).collectives == s0.collectives + 5);
	/* Bad arguments. */
	fr_request_t *none = NULL;

	assert_int_equal(fr_test(NULL, &done), FR_EINVAL);
	assert_int_equal(fr_test(&none, &done), FR_EINVAL);
	assert_int_equal(fr_wait(NULL), FR_EINVAL);
	assert_int_equal(fr_wait(&none), FR_EINVAL);
	assert_int_equal(fr_progress(NULL), FR_EINVAL);
	assert_int_equal(fr_iallreduce(c, s[0], r[0], 4, FR_F64, FR_SUM,
				       &req[0]),
			 0);
	assert_int_equal(fr_test(&req[0], NULL), FR_EINVAL);
	assert_non_null(req[0]); /* still ours */
	assert_int_equal(fr_wait(&req[0]), 0);
	assert_null(req[0]);
}

static void test_destroy_with_pending(void **state)
{
	fr_comm_t *c = one_rank(0);
	float a[16] = { 0 }, b[16];
	fr_request_t *req;
	fr_mem_t *m;

	(void)state;
	assert_int_equal(fr_comm_destroy(NULL), 0);
	assert_int_equal(fr_mem_deregister(NULL), 0);
	/* Registrations and requests left behind are released (ASan). */
	assert_int_equal(fr_mem_register(c, a, sizeof(a), &m), 0);
	assert_int_equal(fr_iallreduce(c, a, b, 16, FR_F32, FR_SUM, &req), 0);
	assert_int_equal(fr_comm_destroy(c), 0);
}

/* ---- stats ------------------------------------------------------------------------------ */

static void test_stats_sizes(void **state)
{
	fr_comm_t *c = *state;
	float a[4] = { 1, 2, 3, 4 };
	fr_stats_t full;
	_Alignas(fr_stats_t) unsigned char buf[sizeof(fr_stats_t) + 64];
	fr_mem_t *m;

	assert_int_equal(fr_allreduce(c, a, a, 4, FR_F32, FR_SUM), 0);
	assert_int_equal(fr_mem_register(c, a, sizeof(a), &m), 0);
	full = stats(c);
	assert_true(full.collectives >= 1);
	assert_true(full.mem_registrations >= 1);
	assert_int_equal(full.size, sizeof(fr_stats_t));

	for (size_t sz = sizeof(size_t); sz <= sizeof(buf); sz++) {
		fr_stats_t *s = (fr_stats_t *)(void *)buf;
		size_t n = sz < sizeof(fr_stats_t) ? sz : sizeof(fr_stats_t);

		memset(buf, 0xab, sizeof(buf));
		s->size = sz;
		assert_int_equal(fr_comm_stats(c, s), 0);
		/* The caller's size is left as it is. */
		assert_int_equal(s->size, sz);
		/* What fits is the counters... */
		if (memcmp(buf + sizeof(size_t),
			   (unsigned char *)&full + sizeof(size_t),
			   n - sizeof(size_t)))
			fail_msg("size %zu: the counters that fit differ", sz);
		/* ... and nothing beyond the caller's struct is written. */
		for (size_t i = n; i < sizeof(buf); i++)
			if (buf[i] != 0xab)
				fail_msg("size %zu: byte %zu written", sz, i);
	}
	/* Field by field at the boundaries of older versions. */
	fr_stats_t s;

	memset(&s, 0xcd, sizeof(s));
	s.size = offsetof(fr_stats_t, writes);
	assert_int_equal(fr_comm_stats(c, &s), 0);
	assert_true(s.collectives == full.collectives);
	assert_true(s.bytes_sent == full.bytes_sent);
	assert_true(s.bytes_received == full.bytes_received);
	assert_true(s.writes == 0xcdcdcdcdcdcdcdcdull);
	assert_true(s.rkeys_sent == 0xcdcdcdcdcdcdcdcdull);

	memset(&s, 0, sizeof(s));
	s.size = sizeof(size_t) - 1;
	assert_int_equal(fr_comm_stats(c, &s), FR_EINVAL);
	s.size = 0;
	assert_int_equal(fr_comm_stats(c, &s), FR_EINVAL);
	assert_int_equal(fr_comm_stats(c, NULL), FR_EINVAL);
	s.size = sizeof(s);
	assert_int_equal(fr_comm_stats(NULL, &s), FR_EINVAL);
	assert_int_equal(fr_mem_deregister(m), 0);
}

/* ---- creation -------------------------------------------------------------------------- */

static void expect_create_einval(const fr_config_t *cfg, const char *word)
{
	fr_comm_t *c = NULL;
	int rc = fr_comm_create(cfg, &c);
	const char *e = fr_comm_last_error(NULL);

	if (rc != FR_EINVAL) {
		if (!rc)
			fr_comm_destroy(c);
		fail_msg("fr_comm_create returned %d, want FR_EINVAL", rc);
	}
	assert_non_null(e);
	assert_true(strlen(e) > 0);
	if (word && !strstr(e, word))
		fail_msg("\"%s\" does not mention \"%s\"", e, word);
}

static void test_create_bad_config(void **state)
{
	fr_config_t cfg;
	fr_comm_t *c = NULL;

	(void)state;
	assert_int_equal(fr_comm_create(NULL, &c), FR_EINVAL);
	assert_true(strlen(fr_comm_last_error(NULL)) > 0);
	fr_config_init(&cfg);
	cfg.nranks = 1;
	assert_int_equal(fr_comm_create(&cfg, NULL), FR_EINVAL);

	fr_config_init(&cfg);
	cfg.size = 0; /* not initialised */
	cfg.nranks = 1;
	expect_create_einval(&cfg, NULL);
	fr_config_init(&cfg);
	cfg.size = offsetof(fr_config_t, rendezvous);
	cfg.nranks = 1;
	expect_create_einval(&cfg, NULL);

	fr_config_init(&cfg); /* nranks 0 */
	expect_create_einval(&cfg, NULL);
	fr_config_init(&cfg);
	cfg.nranks = -3;
	expect_create_einval(&cfg, NULL);
	fr_config_init(&cfg);
	cfg.rank = 2;
	cfg.nranks = 2;
	cfg.rendezvous = "127.0.0.1:5000";
	expect_create_einval(&cfg, NULL);
	cfg.rank = -1;
	expect_create_einval(&cfg, NULL);

	static const char *const bad_rdv[] = { "", "nocolon", "host:0",
					       "host:65536", ":80", "host:x",
					       "::1:80" };
	fr_config_init(&cfg);
	cfg.rank = 1;
	cfg.nranks = 2;
	cfg.timeout_ms = 200;
	cfg.rendezvous = NULL;
	expect_create_einval(&cfg, "rendezvous");
	for (size_t i = 0; i < sizeof(bad_rdv) / sizeof(bad_rdv[0]); i++) {
		cfg.rendezvous = bad_rdv[i];
		expect_create_einval(&cfg, "rendezvous");
	}

	/* Settings out of range. */
	fr_config_init(&cfg);
	cfg.nranks = 1;
	cfg.transport = "carrier-pigeon";
	expect_create_einval(&cfg, "carrier-pigeon");
	fr_config_init(&cfg);
	cfg.nranks = 1;
	cfg.transport = "tcp";
	cfg.segment_bytes = 100;
	expect_create_einval(&cfg, NULL);
	cfg.segment_bytes = 1001; /* not a multiple of 8 */
	expect_create_einval(&cfg, NULL);
	cfg.segment_bytes = 0;
	cfg.slots = 1;
	expect_create_einval(&cfg, NULL);
	cfg.slots = FR_MAX_SLOTS + 1;
	expect_create_einval(&cfg, NULL);
	cfg.slots = 0;
	cfg.timeout_ms = -5;
	expect_create_einval(&cfg, NULL);

	/* And a good one still works afterwards. */
	fr_config_init(&cfg);
	cfg.nranks = 1;
	cfg.transport = "tcp";
	assert_int_equal(fr_comm_create(&cfg, &c), 0);
	assert_int_equal(fr_comm_destroy(c), 0);
}

static const char *const launcher_vars[] = {
	"FR_RANK", "FR_NRANKS", "FR_RENDEZVOUS", "FR_LOCAL_SIZE",
	"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	"OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE",
	"MPI_LOCALNRANKS", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NNODES",
	"SLURM_JOB_NUM_NODES", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
	"MASTER_ADDR", "MASTER_PORT",
	/* and settings that would change what these tests see */
	"FR_TRANSPORT", "FR_JOB_TOKEN", "FR_TIMEOUT_MS", "FR_SEGMENT_BYTES",
	"FR_SLOTS", "FR_REGCACHE_MAX", "FR_SPIN_US",
};

static void test_create_from_env(void **state)
{
	fr_comm_t *c = NULL;
	fr_config_t cfg;

	(void)state;
	/* No launcher at all. */
	assert_int_equal(fr_comm_create_from_env(NULL, &c), FR_EINVAL);
	assert_true(strlen(fr_comm_last_error(NULL)) > 0);
	assert_non_null(strstr(fr_comm_last_error(NULL), "FR_RANK"));
	assert_int_equal(fr_comm_create_from_env(NULL, NULL), FR_EINVAL);
	fr_config_init(&cfg);
	cfg.size = 4;
	assert_int_equal(fr_comm_create_from_env(&cfg, &c), FR_EINVAL);

	/* One rank from the environment needs nothing else. */
	assert_int_equal(setenv("FR_RANK", "0", 1), 0);
	assert_int_equal(setenv("FR_NRANKS", "1", 1), 0);
	assert_int_equal(setenv("FR_TRANSPORT", "tcp", 1), 0);
	int rc = fr_comm_create_from_env(NULL, &c);

	if (rc)
		fail_msg("from env: %s", fr_comm_last_error(NULL));
	assert_int_equal(fr_comm_rank(c), 0);
	assert_int_equal(fr_comm_size(c), 1);
	assert_int_equal(fr_comm_destroy(c), 0);
	/* A malformed setting in the environment is named. */
	assert_int_equal(setenv("FR_SEGMENT_BYTES", "lots", 1), 0);
	assert_int_equal(fr_comm_create_from_env(NULL, &c), FR_EINVAL);
	assert_non_null(strstr(fr_comm_last_error(NULL), "FR_SEGMENT_BYTES"));
	/* ... unless the config says otherwise. */
	fr_config_init(&cfg);
	cfg.segment_bytes = 4096;
	assert_int_equal(fr_comm_create_from_env(&cfg, &c), 0);
	assert_int_equal(fr_comm_destroy(c), 0);
	/* A rank that does not exist. */
	assert_int_equal(setenv("FR_RANK", "1", 1), 0);
	assert_int_equal(fr_comm_create_from_env(&cfg, &c), FR_EINVAL);
	assert_non_null(strstr(fr_comm_last_error(NULL), "FR_RANK"));
	for (size_t i = 0; i < sizeof(launcher_vars) / sizeof(launcher_vars[0]);
	     i++)
		unsetenv(launcher_vars[i]);
	assert_int_equal(fr_comm_create_from_env(NULL, &c), FR_EINVAL);
}

/* ---- two ranks: the cache behind fr_allreduce ------------------------------------------- */

static char why[512];

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			snprintf(why, sizeof(why), "rank %d, line %d: %s", rank, \
				 __LINE__, #cond);                              \
			return -1;                                             \
		}                                                              \
	} while (0)

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint16_t free_port(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	socklen_t al = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	uint16_t port = 0;

	if (fd < 0)
		return 0;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (!bind(fd, (struct sockaddr *)&a, sizeof(a)) &&
	    !getsockname(fd, (struct sockaddr *)&a, &al))
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

/* Neither asserts: the script also runs in the child. */
static int raw_stats(const fr_comm_t *c, fr_stats_t *s)
{
	memset(s, 0, sizeof(*s));
	s->size = sizeof(*s);
	return fr_comm_stats(c, s);
}

/* Fill with this rank's data; check the sum over both ranks. */
static void fill(float *p, size_t n, int rank, int step)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (float)(i % 97) * (float)(rank + 1) + (float)step;
}

static int summed(const float *p, size_t n, int step)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != (float)(i % 97) * 3.0f + 2.0f * (float)step)
			return 0;
	return 1;
}

static int inplace(fr_comm_t *c, float *p, size_t n, int rank, int step)
{
	fill(p, n, rank, step);
	if (fr_allreduce(c, p, p, n, FR_F32, FR_SUM))
		return 0;
	return summed(p, n, step);
}

/* The same script on both ranks; every check is symmetric. */
static int regcache_script(fr_comm_t *c, int rank)
{
	const size_t ps = page(), n = ps / sizeof(float);
	enum { ND = 10 };
	char *mem = aligned_alloc(ps, 64 * ps);
	float *A, *B, *C, *D[ND];
	fr_stats_t s0, s;
	fr_mem_t *cm;
	uint64_t colls = 0;
	int step = 0;

	CHECK(mem != NULL);
	A = (float *)(void *)mem;
	B = (float *)(void *)(mem + 2 * ps);
	C = (float *)(void *)(mem + 4 * ps);
	for (int i = 0; i < ND; i++)
		D[i] = (float *)(void *)(mem + (size_t)(10 + 2 * i) * ps);
	/* The ring registers its staging slots at its first collective. */
	CHECK(fr_allreduce(c, NULL, NULL, 0, FR_F32, FR_SUM) == 0);
	CHECK(raw_stats(c, &s0) == 0);
	CHECK(s0.regcache_hits == 0 && s0.regcache_misses == 0);

	/* An unregistered buffer: registered once, then found. */
	CHECK(inplace(c, A, n, rank, ++step));
	colls++;
	CHECK(raw_stats(c, &s) == 0);
	CHECK(s.regcache_misses == 1);
	CHECK(s.regcache_hits == 0);
	CHECK(s.mem_registrations == s0.mem_registrations + 1);
	CHECK(inplace(c, A, n, rank, ++step));
	CHECK(inplace(c, A, n, rank, ++step));
	colls += 2;
	CHECK(raw_stats(c, &s) == 0);
	CHECK(s.regcache_misses == 1);
	CHECK(s.regcache_hits == 2);
	CHECK(s.mem_registrations == s0.mem_registrations + 1);
	/* A part of it. */
	CHECK(inplace(c, A + n / 4, n / 2, rank, ++step));
	colls++;
	CHECK(raw_stats(c, &s) == 0);
	CHECK(s.regcache_misses == 1);
	CHECK(s.regcache_hits == 3);
	/* Out of place: the receive buffer is found, the send one is new. */
	fill(B, n, rank, ++step);
	CHECK(fr_allreduce(c, B, A, n, FR_F32, FR_SUM) == 0);
	CHECK(summed(A, n, step));
	colls++;
	CHECK(raw_stats(c, &s) == 0);
	CHECK(s.regcache_misses == 2);
	CHECK(s.regcache_hits == 4);
	CHECK(s.mem_registrations == s0.mem_registrations + 2);

	/* A registered buffer and anything inside it: no cache at all. */
	CHECK(fr_mem_register(c, C, 4 * ps, &cm) == 0);
	CHECK(inplace(c, C, 4 * n, rank, ++step));
	CHECK(inplace(c, C + n + 3, n, rank, ++step));
	fill(C, n, rank, ++step);
	CHECK(fr_allreduce(c, C, C + 2 * n, n, FR_F32, FR_SUM) == 0);
	CHECK(summed(C + 2 * n, n, step));
	colls += 3;
	CHECK(raw_stats(c, &s) == 0);
	CHECK(s.regcache_misses == 2);
	CHECK(s.regcache_hits == 4);
	CHECK(s.mem_registrations == s0.mem_registrations + 3);

	/* More buffers than the cache holds: bounded, LRU out. */
	for (int i = 0; i < ND; i++) {
		CHECK(inplace(c, D[i], n, rank, ++step));
		CHECK(c->mem.cache_entries <= REGCACHE);
	}
	colls += ND;
	CHECK(raw_stats(c, &s) == 0);
	CHECK(s.regcache_misses == 2 + ND);
	CHECK(s.regcache_hits == 4);
	CHECK(s.mem_registrations == s0.mem_registrations + 3 + ND);
	CHECK(s.regcache_evictions == (uint64_t)(2 + ND - REGCACHE));
	CHECK(c->mem.cache_entries == REGCACHE);
	/* The most recent ones are still there... */
	for (int i = ND - 1; i >= ND - REGCACHE; i--)
		CHECK(inplace(c, D[i], n, rank, ++step));
	colls += REGCACHE;
	CHECK(raw_stats(c, &s) == 0);
	CHECK(s.regcache_misses == 2 + ND);
	CHECK(s.regcache_hits == 4 + REGCACHE);
	/* ... the first one is not. */
	CHECK(inplace(c, A, n, rank, ++step));
	colls++;
	CHECK(raw_stats(c, &s) == 0);
	CHECK(s.regcache_misses == 3 + ND);
	CHECK(s.collectives == s0.collectives + colls);
	CHECK(fr_mem_deregister(cm) == 0);
	free(mem);
	return 0;
}

static int two_rank_create(int rank, const char *rdv, fr_comm_t **c)
{
	fr_config_t cfg;

	fr_config_init(&cfg);
	cfg.rank = rank;
	cfg.nranks = 2;
	cfg.rendezvous = rdv;
	cfg.transport = "tcp";
	cfg.timeout_ms = 15000;
	cfg.regcache_entries = REGCACHE;
	return fr_comm_create(&cfg, c);
}

static void test_two_ranks_regcache(void **state)
{
	char rdv[64];
	fr_comm_t *c = NULL;
	pid_t pid;
	int rc, st;

	(void)state;
	snprintf(rdv, sizeof(rdv), "127.0.0.1:%u", (unsigned)free_port());
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int code = 0;

		signal(SIGPIPE, SIG_IGN);
		alarm(CHILD_WAIT_MS / 1000);
		if (two_rank_create(1, rdv, &c)) {
			fprintf(stderr, "rank 1: create: %s\n",
				fr_comm_last_error(NULL));
			_exit(2);
		}
		if (regcache_script(c, 1)) {
			fprintf(stderr, "%s\n", why);
			code = 1;
		}
		if (fr_comm_destroy(c))
			code = 3;
		_exit(code);
	}
	rc = two_rank_create(0, rdv, &c);
	int script = -1;
	char mine[sizeof(why)] = "";

	if (!rc) {
		script = regcache_script(c, 0);
		snprintf(mine, sizeof(mine), "%s", why);
		fr_comm_destroy(c);
	} else {
		snprintf(mine, sizeof(mine), "rank 0: create: %s",
			 fr_comm_last_error(NULL));
	}
	/* Reap rank 1 within the bound. */
	uint64_t deadline = now_ms() + CHILD_WAIT_MS;

	while (waitpid(pid, &st, WNOHANG) != pid) {
		if (now_ms() > deadline) {
			kill(pid, SIGKILL);
			waitpid(pid, &st, 0);
			fail_msg("rank 1 did not finish in %d ms", CHILD_WAIT_MS);
		}
		usleep(5000);
	}
	if (rc || script)
		fail_msg("%s", mine);
	if (!WIFEXITED(st) || WEXITSTATUS(st))
		fail_msg("rank 1 failed (status 0x%x)", st);
}

int main(void)
{
	/* These tests count registrations, which only the zero-copy ring
	 * makes (recursive doubling copies through the mailbox): force it. */
	setenv("FR_ALGO", "ring", 1);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_register_args, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_deregister_unknown, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_deregister_busy, setup,
						teardown),
		cmocka_unit_test(test_cache_hits_and_misses),
		cmocka_unit_test_setup_teardown(test_cache_inside_registered,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_cache_eviction, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_one_rank_results, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_allreduce_args, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_iallreduce, setup,
						teardown),
		cmocka_unit_test(test_destroy_with_pending),
		cmocka_unit_test_setup_teardown(test_stats_sizes, setup,
						teardown),
		cmocka_unit_test(test_create_bad_config),
		cmocka_unit_test(test_create_from_env),
		cmocka_unit_test(test_two_ranks_regcache),
	};

	/* The tests set what they need: nothing from the caller's shell. */
	for (size_t i = 0; i < sizeof(launcher_vars) / sizeof(launcher_vars[0]);
	     i++)
		unsetenv(launcher_vars[i]);
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
