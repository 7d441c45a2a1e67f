/* SPDX-License-Identifier: MIT */
/*
 * fake_fixture.h - the CMocka fixture that test_peer.c and test_engine.c
 * share: a job of up to MAXN communicators over the in-process fake
 * transport (fake_tp.h), buffers freed after each test, and the checks
 * every test makes at its end (every endpoint closed).
 */
#ifndef FR_FAKE_FIXTURE_H
#define FR_FAKE_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "fastreduce.h"

#define MAXN 8

/* The job of the running test: comms[0 .. ncomms). */
extern fr_comm_t *comms[MAXN];
extern int ncomms;

uint64_t now_ms(void);
void sleep_ms(int ms);
/* A zeroed buffer of len bytes (at least 1), freed by teardown(). */
void *tbuf(size_t len);
/* fr_config_init() with the timeout and the algorithm set. */
fr_config_t config(int timeout_ms, int algo);
/* n communicators over "fake" into comms[] (fake_job_create), each
 * checked for its rank and transport; a failure fails the test. */
void job(int n, const fr_config_t *cfg);
/* s contains sub, else the test fails naming both. */
void assert_contains(const char *s, const char *sub);
/* CMocka setup and teardown: a clean fake before, and after: the fake's
 * faults cleared (a frozen rank would hold up the BYEs), the job
 * destroyed, the buffers and FR_EAGER_BYTES gone, no endpoint left. */
int setup(void **state);
int teardown(void **state);
/* Before the tests: the caller's FR_* settings that would change the
 * job unset (and `extra` too, when not NULL), SIGPIPE ignored, the fake
 * transport installed. */
void fixture_init(const char *extra);

#endif
