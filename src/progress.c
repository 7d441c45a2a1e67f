/* SPDX-License-Identifier: MIT */
/*
 * progress.c - the communicator's lock and its progress thread.
 *
 * Every public call takes comm->lock, so application threads may share a
 * communicator, and the transport (single-threaded by contract) is only
 * ever driven by the thread that holds the lock.  That includes the thread
 * that sleeps in the transport's wait(): it sleeps holding the lock,
 * because wait() walks the transport's connections.  A thread that wants
 * the lock therefore first counts itself in lock_waiters and, if someone
 * sleeps, wakes it through the transport's wake() (an eventfd in its poll
 * set); the sleeper sees the count when it returns and gives the lock up
 * (fr_lock_yield) until the count drops to zero.  The count and the
 * `sleeping` flag are seq_cst atomics, written before the other is read
 * (Dekker), so either the sleeper sees the waiter and does not sleep, or
 * the waiter sees the sleeper and wakes it: a lock request never waits
 * for a wait() timeout.
 *
 * One thread at a time drives the engine while others wait for their
 * requests (leader/followers): poller_busy marks the leader, followers
 * sleep in fr_cond_wait(), which fr_signal() ends whenever a request finishes
 * or the leader leaves.  With FR_PROGRESS=thread the progress thread is the
 * leader for the communicator's whole life (pt_running, set before any
 * application call can come): it progresses, spins for
 * FR_SPIN_US after work and otherwise sleeps in wait(), so no core burns
 * between collectives, and the application's fr_wait() sleeps in
 * fr_cond_wait().
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

void fr_lock(struct fr_comm *comm)
{
	if (!pthread_mutex_trylock(&comm->lock))
		return;
	atomic_fetch_add(&comm->lock_waiters, 1);
	if (atomic_load(&comm->sleeping))
		comm->tp_ops->wake(comm->tp);
	pthread_mutex_lock(&comm->lock);
	atomic_fetch_sub(&comm->lock_waiters, 1);
}

void fr_unlock(struct fr_comm *comm)
{
	/* a leader may be waiting in fr_lock_yield() for us to finish */
	pthread_cond_broadcast(&comm->yield_cv);
	pthread_mutex_unlock(&comm->lock);
}

/*
 * Waiting for an event (a request done, the leader gone, stop) must not
 * reacquire the lock inside pthread_cond_wait(): a leader asleep in the
 * transport would not know we want it.  So the wait is on a small lock
 * of its own and a generation count, and the lock is then taken again
 * through fr_lock(), which wakes the sleeper.
 */
void fr_signal(struct fr_comm *comm)
{
	pthread_mutex_lock(&comm->ev_lock);
	comm->ev_gen++;
	pthread_cond_broadcast(&comm->ev_cv);
	pthread_mutex_unlock(&comm->ev_lock);
}

void fr_cond_wait(struct fr_comm *comm)
{
	uint64_t gen;

	pthread_mutex_lock(&comm->ev_lock);
	gen = comm->ev_gen;
	pthread_mutex_unlock(&comm->ev_lock);
	fr_unlock(comm);
	pthread_mutex_lock(&comm->ev_lock);
	while (comm->ev_gen == gen)
		pthread_cond_wait(&comm->ev_cv, &comm->ev_lock);
	pthread_mutex_unlock(&comm->ev_lock);
	fr_lock(comm);
}

void fr_lock_yield(struct fr_comm *comm)
{
	while (atomic_load(&comm->lock_waiters) > 0)
		pthread_cond_wait(&comm->yield_cv, &comm->lock);
}

void fr_comm_sleep(struct fr_comm *comm, int ms)
{
	if (comm->nranks < 2)
		return;
	atomic_store(&comm->sleeping, true);
	if (atomic_load(&comm->lock_waiters) == 0)
		comm->tp_ops->wait(comm->tp, ms);
	atomic_store(&comm->sleeping, false);
}

int fr_lock_init(struct fr_comm *comm)
{
	if (pthread_mutex_init(&comm->lock, NULL))
		goto err_lock;
	if (pthread_cond_init(&comm->yield_cv, NULL))
		goto err_yield;
	if (pthread_mutex_init(&comm->ev_lock, NULL))
		goto err_ev_lock;
	if (pthread_cond_init(&comm->ev_cv, NULL))
		goto err_ev_cv;
	atomic_init(&comm->lock_waiters, 0);
	atomic_init(&comm->sleeping, false);
	return 0;

err_ev_cv:
	pthread_mutex_destroy(&comm->ev_lock);
err_ev_lock:
	pthread_cond_destroy(&comm->yield_cv);
err_yield:
	pthread_mutex_destroy(&comm->lock);
err_lock:
	return FR_ENOMEM;
}

void fr_lock_fini(struct fr_comm *comm)
{
	pthread_cond_destroy(&comm->ev_cv);
	pthread_mutex_destroy(&comm->ev_lock);
	pthread_cond_destroy(&comm->yield_cv);
	pthread_mutex_destroy(&comm->lock);
}

/* How long the leader may sleep: until the timeout is due, at most 100 ms
 * (timeouts are checked between sleeps), a second when idle. */
int fr_sleep_ms(const struct fr_comm *comm, bool pending)
{
	uint64_t idle;

	if (!pending)
		return 1000;
	idle = fr_now_ms() - comm->last_activity_ms;
	/* patient with a late rank: keep pinging it, do not spin */
	if (comm->waiting_late)
		return 100;
	if (idle >= (uint64_t)comm->timeout_ms)
		return 0;
	return (int)FR_MIN((uint64_t)comm->timeout_ms - idle, (uint64_t)100);
}

static void *progress_main(void *arg)
{
	struct fr_comm *comm = arg;
	uint64_t spin_until = 0, idle_since = 0;

	fr_lock(comm);
	while (!comm->pt_stop) {
		bool work = false, pending;
		uint64_t now;

		fr_lock_yield(comm);
		if (comm->pt_stop)
			break;
		if (comm->failed) {
			/* nothing will move again: no polling, no spinning */
			fr_cond_wait(comm);
			continue;
		}
		pending = fr_engine_step(comm, &work);
		now = fr_now_ns();
		if (work) {
			idle_since = now;
			spin_until = now + (uint64_t)comm->spin_us * 1000u;
			continue;
		}
		if (pending && (comm->spin_us < 0 || now < spin_until)) {
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

	if (comm->pt_cpu_mode == FR_CPU_AUTO && ops->locality)
		have_dev = !ops->locality(comm->tp, &dev) && CPU_COUNT(&dev);
	fr_affinity_choose(comm->pt_cpu_mode, &comm->pt_cpus,
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
	comm->pt_running = true;
	rc = pthread_create(&comm->pt, &attr, progress_main, comm);
	if (rc == EINVAL && bind && comm->pt_cpu_mode == FR_CPU_AUTO) {
		/* the policy's choice cannot be had after all: inherit */
		fr_warn("rank %d: progress thread: cannot bind it as FR_PROGRESS_CPU=auto chose (%s); it inherits this thread's CPUs",
			comm->rank, why);
		bind = false;
		if (sched_getaffinity(0, sizeof(cpus), &cpus))
			CPU_ZERO(&cpus);
		snprintf(why, sizeof(why), "FR_PROGRESS_CPU=auto: inherited");
		/* default attributes: no binding */
		rc = pthread_create(&comm->pt, NULL, progress_main, comm);
	}
	pthread_attr_destroy(&attr);
	if (rc) {
		comm->pt_running = false;
		fr_cpulist_format(&cpus, list, sizeof(list));
		if (rc == EINVAL && bind) {
			/* glibc binds the new thread before it runs: a list
			 * with no CPU this process may use fails here */
			snprintf(err, errlen,
				 "FR_PROGRESS_CPU=%s: no CPU of these is available to this process (offline, or outside its cgroup's cpuset)",
				 list);
			return FR_EINVAL;
		}
		snprintf(err, errlen, "cannot start the progress thread: %s",
			 strerror(rc));
		return FR_ESYS;
	}
	/* "fr_progress" in top -H, ps -L and /proc/PID/task/TID/comm */
	pthread_setname_np(comm->pt, "fr_progress");
	if (fr_log_enabled(FR_LOG_INFO)) {
		fr_cpulist_format(&cpus, list, sizeof(list));
		fr_info("rank %d: progress thread on CPUs %s (%s)", comm->rank,
			list[0] ? list : "?", why);
	}
	return 0;
}

void fr_progress_thread_stop(struct fr_comm *comm)
{
	if (!comm->pt_running)
		return;
	fr_lock(comm);
	comm->pt_stop = true;
	fr_signal(comm);
	comm->tp_ops->wake(comm->tp);
	fr_unlock(comm);
	pthread_join(comm->pt, NULL);
	comm->pt_running = false;
}
