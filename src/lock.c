/* SPDX-License-Identifier: MIT */
/*
 * lock.c - the communicator's lock, and how its holder sleeps.
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
 *
 * Layer: engine (its bottom).  The progress engine (request.c), the
 * progress thread (progress.c) and the entry points call it; it calls the
 * transport's wake() and wait() only.
 */
#include <pthread.h>

#include "internal.h"
#include "log.h"
#include "util.h"

void fr_lock(struct fr_comm *comm)
{
	if (!pthread_mutex_trylock(&comm->thr.lock))
		return;
	atomic_fetch_add(&comm->thr.lock_waiters, 1);
	if (atomic_load(&comm->thr.sleeping))
		comm->tp_ops->wake(comm->tp);
	pthread_mutex_lock(&comm->thr.lock);
	atomic_fetch_sub(&comm->thr.lock_waiters, 1);
}

void fr_unlock(struct fr_comm *comm)
{
	/* a leader may be waiting in fr_lock_yield() for us to finish */
	pthread_cond_broadcast(&comm->thr.yield_cv);
	pthread_mutex_unlock(&comm->thr.lock);
}

/*
 * Waiting for an event (a request done, the leader gone, stop) must not
 * reacquire the lock inside pthread_cond_wait(): a leader asleep in the
 * transport would not know we want it.  So the wait is on a small lock
 * of its own and a generation count, and the lock is then taken again
 * through fr_lock(), which wakes the sleeper.
 */
/*
 * Called with the communicator's lock held, as fr_cond_wait() counts
 * itself in ev_waiters: a waiter that has not counted itself yet has not
 * read ev_gen either, so it sees this event anyway.  Every finished
 * request signals: with nobody waiting that is two atomic operations and
 * a broadcast saved on every small collective.
 */
void fr_signal(struct fr_comm *comm)
{
	if (!atomic_load_explicit(&comm->thr.ev_waiters, memory_order_relaxed))
		return;
	pthread_mutex_lock(&comm->thr.ev_lock);
	comm->thr.ev_gen++;
	pthread_cond_broadcast(&comm->thr.ev_cv);
	pthread_mutex_unlock(&comm->thr.ev_lock);
}

void fr_cond_wait(struct fr_comm *comm)
{
	uint64_t gen;

	/* counted before the lock goes (fr_signal) */
	atomic_fetch_add(&comm->thr.ev_waiters, 1);
	pthread_mutex_lock(&comm->thr.ev_lock);
	gen = comm->thr.ev_gen;
	pthread_mutex_unlock(&comm->thr.ev_lock);
	fr_unlock(comm);
	pthread_mutex_lock(&comm->thr.ev_lock);
	while (comm->thr.ev_gen == gen)
		pthread_cond_wait(&comm->thr.ev_cv, &comm->thr.ev_lock);
	pthread_mutex_unlock(&comm->thr.ev_lock);
	atomic_fetch_sub(&comm->thr.ev_waiters, 1);
	fr_lock(comm);
}

void fr_lock_yield(struct fr_comm *comm)
{
	while (atomic_load(&comm->thr.lock_waiters) > 0)
		pthread_cond_wait(&comm->thr.yield_cv, &comm->thr.lock);
}

void fr_comm_sleep(struct fr_comm *comm, int ms)
{
	if (comm->nranks < 2)
		return;
	atomic_store(&comm->thr.sleeping, true);
	if (atomic_load(&comm->thr.lock_waiters) == 0)
		comm->tp_ops->wait(comm->tp, ms);
	atomic_store(&comm->thr.sleeping, false);
}

int fr_lock_init(struct fr_comm *comm)
{
	if (pthread_mutex_init(&comm->thr.lock, NULL))
		goto err_lock;
	if (pthread_cond_init(&comm->thr.yield_cv, NULL))
		goto err_yield;
	if (pthread_mutex_init(&comm->thr.ev_lock, NULL))
		goto err_ev_lock;
	if (pthread_cond_init(&comm->thr.ev_cv, NULL))
		goto err_ev_cv;
	atomic_init(&comm->thr.lock_waiters, 0);
	atomic_init(&comm->thr.ev_waiters, 0);
	atomic_init(&comm->thr.sleeping, false);
	return 0;

err_ev_cv:
	pthread_mutex_destroy(&comm->thr.ev_lock);
err_ev_lock:
	pthread_cond_destroy(&comm->thr.yield_cv);
err_yield:
	pthread_mutex_destroy(&comm->thr.lock);
err_lock:
	return FR_ENOMEM;
}

void fr_lock_fini(struct fr_comm *comm)
{
	pthread_cond_destroy(&comm->thr.ev_cv);
	pthread_mutex_destroy(&comm->thr.ev_lock);
	pthread_cond_destroy(&comm->thr.yield_cv);
	pthread_mutex_destroy(&comm->thr.lock);
}

/* How long the leader may sleep: until the timeout is due, at most 100 ms
 * (timeouts are checked between sleeps), a second when idle. */
int fr_sleep_ms(const struct fr_comm *comm, bool pending)
{
	uint64_t idle;

	if (!pending)
		return 1000;
	/* an agreement: its liveness checks come every few ms; a failed
	 * communicator in recovery only answers the others */
	if (fr_agree_running(&comm->agr) || fr_agree_owing(&comm->agr))
		return 10;
	if (comm->fail.failed)
		return 100;
	idle = fr_coarse_since(comm->peer.last_activity_ms);
	/* patient with a late rank: keep pinging it, do not spin */
	if (comm->peer.late_level)
		return 100;
	/* only point-to-point waits: a peer that answers PINGs may take as
	 * long as it likes to send (p2p.c); keep pinging, do not spin */
	if (idle >= (uint64_t)comm->peer.timeout_ms && !comm->eng.queue &&
	    comm->eng.p2p)
		return 100;
	if (idle >= (uint64_t)comm->peer.timeout_ms)
		return 0;
	return (int)FR_MIN((uint64_t)comm->peer.timeout_ms - idle,
			   (uint64_t)100);
}
