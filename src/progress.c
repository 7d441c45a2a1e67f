/* SPDX-License-Identifier: MIT */
/*
 * progress.c - the progress thread (FR_PROGRESS=thread) and its placement.
 *
 * The thread is the engine's leader for the communicator's whole life (see
 * lock.c for the lock and the leader/followers protocol): it steps the
 * engine (request.c), spins for FR_SPIN_US after work and otherwise sleeps
 * in the transport's wait(), so no core burns between collectives.
 *
 * Layer: engine (its top).  comm.c starts and stops it; it calls
 * request.c, lock.c and affinity.c.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "affinity.h"
#include "internal.h"
#include "log.h"
#include "util.h"

static void *progress_main(void *arg)
{
	struct fr_comm *comm = arg;
	uint64_t spin_until = 0, idle_since = 0;

	fr_lock(comm);
	while (!comm->thr.pt_stop) {
		bool work = false, pending;
		uint64_t now;

		fr_lock_yield(comm);
		if (comm->thr.pt_stop)
			break;
		if (comm->fail.failed && !fr_engine_busy(comm)) {
			/* nothing will move again, unless recovery begins (an
			 * agreement, which signals): no polling, no spinning */
			fr_cond_wait(comm);
			continue;
		}
		/* pending: spin before sleeping; not for a failed
		 * communicator that only answers late ranks (a sleep of
		 * fr_sleep_ms, woken by what arrives) */
		pending =
			fr_engine_step(comm, &work) || fr_engine_agreeing(comm);
		now = fr_now_ns();
		if (work) {
			idle_since = now;
			spin_until = now + (uint64_t)comm->eng.spin_us * 1000u;
			continue;
		}
		if (pending && (comm->eng.spin_us < 0 || now < spin_until)) {
			fr_unlock(comm);
			fr_spin_turn(idle_since, now);
			fr_lock(comm);
			continue;
		}
		fr_comm_sleep(comm, fr_sleep_ms(comm, pending));
	}
	fr_unlock(comm);
	return NULL;
}

/*
 * Where the thread runs: FR_PROGRESS_CPU's list, the creating thread's
 * CPUs (none), or by default those that affinity.c's policy picks near
 * the transport's device (auto).  The device's CPUs are asked for only
 * then.  FR_LOG=info says which CPUs and why.
 */
static void progress_place(struct fr_comm *comm, bool *bind, cpu_set_t *cpus,
			   char *why, size_t whylen)
{
	const struct fr_tp_ops *ops = comm->tp_ops;
	cpu_set_t dev;
	bool have_dev = false;

	if (comm->thr.pt_cpu_mode == FR_CPU_AUTO && ops->locality)
		have_dev = !ops->locality(comm->tp, &dev) && CPU_COUNT(&dev);
	fr_affinity_choose(comm->thr.pt_cpu_mode, &comm->thr.pt_cpus,
			   have_dev ? &dev : NULL, bind, cpus, why, whylen);
}

int fr_progress_thread_start(struct fr_comm *comm, char *err, size_t errlen)
{
	pthread_attr_t attr;
	cpu_set_t cpus;
	char why[512], list[256];
	bool bind;
	int rc;

	progress_place(comm, &bind, &cpus, why, sizeof(why));
	if (pthread_attr_init(&attr)) {
		snprintf(err, errlen, "pthread_attr_init failed");
		return FR_ENOMEM;
	}
	if (bind) {
		rc = pthread_attr_setaffinity_np(&attr, sizeof(cpus), &cpus);
		if (rc) {
			fr_cpulist_format(&cpus, list, sizeof(list));
			snprintf(err, errlen,
				 "progress thread: cannot bind to CPUs %s: %s",
				 list, strerror(rc));
			pthread_attr_destroy(&attr);
			return FR_EINVAL;
		}
	}
	comm->thr.pt_running = true;
	rc = pthread_create(&comm->thr.pt, &attr, progress_main, comm);
	if (rc == EINVAL && bind && comm->thr.pt_cpu_mode == FR_CPU_AUTO) {
		/* the policy's choice cannot be had after all: inherit */
		fr_warn("rank %d: progress thread: cannot bind it as FR_PROGRESS_CPU=auto chose (%s); it inherits this thread's CPUs",
			comm->rank, why);
		bind = false;
		if (sched_getaffinity(0, sizeof(cpus), &cpus))
			CPU_ZERO(&cpus);
		snprintf(why, sizeof(why), "FR_PROGRESS_CPU=auto: inherited");
		/* default attributes: no binding */
		rc = pthread_create(&comm->thr.pt, NULL, progress_main, comm);
	}
	pthread_attr_destroy(&attr);
	if (rc) {
		comm->thr.pt_running = false;
		fr_cpulist_format(&cpus, list, sizeof(list));
		if (rc == EINVAL && bind) {
			/* glibc binds the new thread before it runs: a list
			 * with no CPU this process may use fails here */
			snprintf(
				err, errlen,
				"FR_PROGRESS_CPU=%s: no CPU of these is available to this process (offline, or outside its cgroup's cpuset)",
				list);
			return FR_EINVAL;
		}
		snprintf(err, errlen, "cannot start the progress thread: %s",
			 strerror(rc));
		return FR_ESYS;
	}
	/* "fr_progress" in top -H, ps -L and /proc/PID/task/TID/comm */
	pthread_setname_np(comm->thr.pt, "fr_progress");
	if (fr_log_enabled(FR_LOG_INFO)) {
		fr_cpulist_format(&cpus, list, sizeof(list));
		fr_info("rank %d: progress thread on CPUs %s (%s)", comm->rank,
			list[0] ? list : "?", why);
	}
	return 0;
}

void fr_progress_thread_stop(struct fr_comm *comm)
{
	if (!comm->thr.pt_running)
		return;
	fr_lock(comm);
	comm->thr.pt_stop = true;
	fr_signal(comm);
	comm->tp_ops->wake(comm->tp);
	fr_unlock(comm);
	pthread_join(comm->thr.pt, NULL);
	comm->thr.pt_running = false;
}
