/* SPDX-License-Identifier: MIT */
/*
 * fake_fixture.c - the fixture of test_peer.c and test_engine.c (see
 * fake_fixture.h).
 */
/* cmocka.h needs these first, in this order. */
/* clang-format off */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
/* clang-format on */

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_fixture.h"
#include "fake_tp.h"

fr_comm_t *comms[MAXN];
int ncomms;
static void *bufs[256];
static int nbufs;

uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void sleep_ms(int ms)
{
	struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};

	nanosleep(&ts, NULL);
}

void *tbuf(size_t len)
{
	void *p = calloc(1, len ? len : 1);

	assert_non_null(p);
	assert_true(nbufs < (int)(sizeof(bufs) / sizeof(bufs[0])));
	bufs[nbufs++] = p;
	return p;
}

fr_config_t config(int timeout_ms, int algo)
{
	fr_config_t cfg;

	fr_config_init(&cfg);
	cfg.timeout_ms = timeout_ms;
	cfg.algo = algo;
	return cfg;
}

void job(int n, const fr_config_t *cfg)
{
	char err[600] = "";
	int rc;

	assert_true(n <= MAXN);
	rc = fake_job_create(n, cfg, comms, err, sizeof(err));
	if (rc)
		fail_msg("creating %d communicators over fake: %s", n, err);
	ncomms = n;
	for (int r = 0; r < n; r++) {
		assert_non_null(comms[r]);
		assert_int_equal(fr_comm_rank(comms[r]), r);
		assert_string_equal(fr_comm_transport(comms[r]), "fake");
	}
}

void assert_contains(const char *s, const char *sub)
{
	if (!s || !strstr(s, sub))
		fail_msg("\"%s\" does not say \"%s\"", s ? s : "(null)", sub);
}

int setup(void **state)
{
	(void)state;
	fake_tp_reset();
	ncomms = nbufs = 0;
	return 0;
}

int teardown(void **state)
{
	(void)state;
	fake_tp_reset(); /* unfreeze, so that the BYEs can cross */
	fake_job_destroy(ncomms, comms);
	ncomms = 0;
	for (int i = 0; i < nbufs; i++)
		free(bufs[i]);
	nbufs = 0;
	unsetenv("FR_EAGER_BYTES");
	fake_tp_reset();
	/* every endpoint closed with its communicator */
	assert_int_equal(fake_tp_endpoints(), 0);
	return 0;
}

void fixture_init(const char *extra)
{
	static const char *const vars[] = {
		"FR_TRANSPORT",	    "FR_ALGO",
		"FR_TIMEOUT_MS",    "FR_SLOW_TIMEOUT_MS",
		"FR_PROGRESS",	    "FR_EAGER_BYTES",
		"FR_SEGMENT_BYTES", "FR_SLOTS",
		"FR_POLL",	    "FR_SPIN_US",
		"FR_TUNE_FILE",	    "FR_RING_ORDER",
		"FR_NODE",	    "FR_JOB_TOKEN",
		"FR_TOPO",
	};

	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
	if (extra)
		unsetenv(extra);
	signal(SIGPIPE, SIG_IGN);
	fake_tp_install();
}
