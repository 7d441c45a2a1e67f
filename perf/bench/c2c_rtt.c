/* SPDX-License-Identifier: MIT */
/*
 * c2c_rtt.c - the machine's core-to-core round trip, for compare.sh.
 *
 * Two threads, pinned to the first two CPUs this process may use, hand a
 * counter back and forth through two cache lines.  Prints the median over
 * 20 windows of the nanoseconds per round trip, one number, or "-" where
 * there are fewer than two CPUs or a thread cannot be pinned.
 *
 * Why: a shared-memory collective is a chain of transfers between cores.
 * Under a hypervisor that chain's speed depends on where the host puts the
 * virtual CPUs, and that changes between runs seconds apart (272-457 ns
 * on the 2-CPU development machine).  compare.sh runs this before every
 * job, so that the spread of a library over separate jobs can be read
 * against the spread of the machine itself.
 *
 *   c2c_rtt [ROUND_TRIPS]     default 200000 (about 60 ms here)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define WINDOWS 20

static _Alignas(64) _Atomic uint64_t ping;
static _Alignas(64) _Atomic uint64_t pong;
static _Atomic int echo_state; /* 0 starting, 1 pinned, -1 cannot pin */
static uint64_t trips;
static int cpu_b;

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static int pin(int cpu)
{
	cpu_set_t s;

	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	return pthread_setaffinity_np(pthread_self(), sizeof(s), &s);
}

static inline void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

static void *echo(void *arg)
{
	(void)arg;
	if (pin(cpu_b)) {
		atomic_store(&echo_state, -1);
		return NULL;
	}
	atomic_store(&echo_state, 1);
	for (uint64_t i = 1; i <= trips; i++) {
		while (atomic_load_explicit(&ping, memory_order_acquire) != i)
			relax();
		atomic_store_explicit(&pong, i, memory_order_release);
	}
	return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	uint64_t win[WINDOWS], per, t0;
	int cpus[2], n = 0;
	cpu_set_t mine;
	pthread_t th;

	trips = argc > 1 ? strtoull(argv[1], NULL, 10) : 200000;
	if (trips < WINDOWS) {
		fprintf(stderr, "usage: c2c_rtt [ROUND_TRIPS >= %d]\n",
			WINDOWS);
		return 2;
	}
	per = trips / WINDOWS;
	trips = per * WINDOWS;
	if (sched_getaffinity(0, sizeof(mine), &mine))
		goto none;
	for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
		if (CPU_ISSET(c, &mine))
			cpus[n++] = c;
	if (n < 2)
		goto none;
	cpu_b = cpus[1];
	if (pin(cpus[0]) || pthread_create(&th, NULL, echo, NULL))
		goto none;
	while (!atomic_load(&echo_state))
		relax();
	if (atomic_load(&echo_state) < 0) {
		pthread_join(th, NULL);
		goto none;
	}
	t0 = now_ns();
	for (uint64_t i = 1; i <= trips; i++) {
		atomic_store_explicit(&ping, i, memory_order_release);
		while (atomic_load_explicit(&pong, memory_order_acquire) != i)
			relax();
		if (i % per == 0) {
			uint64_t t1 = now_ns();

			win[i / per - 1] = (t1 - t0) / per;
			t0 = t1;
		}
	}
	pthread_join(th, NULL);
	qsort(win, WINDOWS, sizeof(win[0]), cmp_u64);
	printf("%llu\n", (unsigned long long)win[WINDOWS / 2]);
	return 0;
none:
	printf("-\n");
	return 0;
}
