/* SPDX-License-Identifier: MIT */
/*
 * request.c - collectives as requests, and the progress engine.
 *
 * Requests run one after another in the order they were started (every rank
 * starts them in the same order).  Progress means: drain the transport's
 * completions into the peer layer (peer.c), then let the active
 * collective's algorithm take what arrived and post what it can.  Waiting spins
 * for a short budget (FR_SPIN_US) and then blocks in the transport's wait
 * (epoll / completion channel), because tests and laptops run more ranks than
 * cores and pure busy-polling then steals the CPU from the very rank we are
 * waiting for.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "affinity.h"
#include "algo/algo.h"
#include "internal.h"
#include "log.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

#define CQE_BATCH 32
#define FR_BUSY_WATCH 64 /* fr_engine_step: watch every 64th busy step */
#define FR_IDLE_CLOCK 8	 /* wait_done: read the clock every 8th idle pass */
#define FR_IDLE_WATCH 8	 /* wait_done: watch every 8th idle pass */

static void req_finish(struct fr_request *req, int result)
{
	if (req->state == FR_REQ_ACTIVE)
		fr_peers_coll_end(req->comm);
	req->state = FR_REQ_DONE;
	req->result = result;
	if (req->algo)
		req->algo->free(req);
	if (!result)
		req->comm->stats.collectives++;
	/* its waiter may sleep in fr_cond_wait (a follower, or with the
	 * progress thread the application) */
	fr_signal(req->comm);
}

/* The failure reaches every request not yet finished. */
static void fail_all(struct fr_comm *comm)
{
	int e = comm->fail.failed;

	/* A failure of this rank's own (a system call, memory, its
	 * arguments) is invisible to the others, who would wait for it until
	 * the timeout, perhaps not even connected to us: tell them all.  A
	 * dead or silent peer they see for themselves. */
	if (comm->fail.fail_origin < 0 &&
	    (e == FR_ESYS || e == FR_ENOMEM || e == FR_EINVAL))
		fr_peers_tell_all(comm);
	fr_peers_quiesce(comm);
	for (struct fr_request *q = comm->eng.queue; q; q = q->next)
		if (q->state != FR_REQ_DONE)
			req_finish(q, comm->fail.failed);
	fr_p2p_fail_all(comm);
	/* nothing holds them now: no late write may land in them */
	fr_mem_cache_drop_idle(comm);
}

static struct fr_request *fr_active_req(struct fr_comm *comm)
{
	struct fr_request *q = comm->eng.queue;

	while (q && q->state == FR_REQ_DONE)
		q = q->next;
	return q && q->state == FR_REQ_ACTIVE ? q : NULL;
}

static struct fr_request *first_pending(struct fr_comm *comm)
{
	struct fr_request *q = comm->eng.queue;

	while (q && q->state == FR_REQ_DONE)
		q = q->next;
	return q;
}

/* An agreement runs, or its state is owed to a peer (agree.h). */
static bool agree_busy(const struct fr_comm *comm)
{
	return comm->agr.sets &&
	       (fr_agree_running(&comm->agr) || comm->peer.ctrl_new > 0 ||
		fr_agree_owing(&comm->agr));
}

static void agree_round(struct fr_comm *comm, bool *did_work)
{
	/* decided: its waiter may sleep in fr_cond_wait */
	if (fr_agree_progress(comm, did_work))
		fr_signal(comm);
}

/*
 * A failed communicator's round while an agreement runs (or still owes
 * its decision): nothing else moves, but the agreement's messages,
 * PINGs and PONGs must.  Completions go to the peer layer; the
 * algorithms' are dropped (every request has failed).
 */
static void recovery_round(struct fr_comm *comm, bool *did_work)
{
	struct fr_tp_cqe cqe[CQE_BATCH];
	int n;

	if (comm->nranks > 1) {
		do {
			n = comm->tp_ops->poll(comm->tp, cqe, CQE_BATCH);
			if (n < 0)
				break;
			if (n)
				*did_work = true;
			for (int i = 0; i < n; i++) {
				int from;

				(void)fr_peers_on_cqe(comm, &cqe[i], &from);
			}
		} while (n == CQE_BATCH);
		fr_peers_recovery_progress(comm, did_work);
	}
	agree_round(comm, did_work);
}

/* Drain the transport's completions (when poll), then start and advance
 * collectives back to back while they complete. */
static int progress(struct fr_comm *comm, bool *did_work, bool poll)
{
	struct fr_tp_cqe cqe[CQE_BATCH];
	struct fr_request *req;
	int n, rc = 0;

	/* once recovery has begun (an agreement), a failed communicator
	 * keeps polling: a rank still in an agreement this one has left
	 * needs its answers, and its PONGs */
	if (comm->fail.failed) {
		if (poll && comm->agr.sets)
			recovery_round(comm, did_work);
		goto failed;
	}
	if (comm->nranks > 1 && poll) {
		do {
			n = comm->tp_ops->poll(comm->tp, cqe, CQE_BATCH);
			if (n < 0) {
				fr_comm_fail(comm, n,
					     "rank %d: transport %s failed: %s",
					     comm->rank, comm->tp_ops->name,
					     fr_strerror(n));
				goto failed;
			}
			if (n)
				*did_work = true;
			/* every completion taken from the transport gets its
			 * bookkeeping (send slots, counters), failed or not;
			 * a PING or PONG is not progress of a collective */
			for (int i = 0; i < n; i++) {
				int from;

				if (fr_peers_on_cqe(comm, &cqe[i], &from) !=
				    FR_PEERS_FOR_ALGO)
					continue;
				if (FR_IMM_TYPE(cqe[i].imm) == FR_IMM_P2P)
					fr_p2p_on_cqe(comm, from, cqe[i].imm,
						      cqe[i].len);
				else
					fr_algos_on_cqe(comm,
							fr_active_req(comm),
							from, &cqe[i]);
			}
			if (comm->fail.failed)
				goto failed;
		} while (n == CQE_BATCH);
		if (fr_peers_progress(comm, did_work) ||
		    fr_algos_progress(comm, fr_active_req(comm), did_work))
			goto failed;
		if (agree_busy(comm))
			agree_round(comm, did_work);
	} else if (comm->nranks == 1 && agree_busy(comm)) {
		agree_round(comm, did_work);
	}
	/* point-to-point: what arrived, what can go */
	if ((comm->eng.p2p || comm->peer.p2p_unread) &&
	    fr_p2p_progress(comm, did_work))
		goto failed;
	/* Run collectives back to back while they complete. */
	while ((req = first_pending(comm))) {
		if (req->state == FR_REQ_QUEUED) {
			req->state = FR_REQ_ACTIVE;
			if (fr_peers_coll_begin(comm, &req->seq))
				goto failed;
			req->algo = fr_algo_select(comm, req);
			comm->eng.last_algo = req->algo->id;
			comm->errmsg[0] = '\0';
			rc = req->algo->start(comm, req);
			if (rc) {
				char why[FR_ERRMSG_MAX];

				/* errmsg may hold the cause (a registration):
				 * not formatted into itself */
				snprintf(why, sizeof(why), "%s",
					 comm->errmsg[0] ? comm->errmsg
							 : fr_strerror(rc));
				if (!comm->fail.failed) {
					fr_comm_fail(
						comm, rc,
						"rank %d: starting collective #%u: %s",
						comm->rank, req->seq, why);
					/* a local failure (memory, a
					 * registration): the partners may not
					 * be connected yet, tell everyone */
					fr_peers_tell_all(comm);
				}
				goto failed;
			}
			*did_work = true;
		}
		rc = req->algo->advance(comm, req, did_work);
		if (rc) {
			fr_comm_fail(comm, rc, "rank %d: collective #%u: %s",
				     comm->rank, req->seq, fr_strerror(rc));
			goto failed;
		}
		if (!req->algo->done(comm, req))
			break;
		if (comm->nranks > 1 && fr_msg_leftover(comm, req))
			goto failed;
		req_finish(req, 0);
		*did_work = true;
	}
	return 0;

failed:
	fail_all(comm);
	return comm->fail.failed;
}

int fr_progress_internal(struct fr_comm *comm, bool *did_work)
{
	return progress(comm, did_work, true);
}

/* The timeout and slow-or-dead checks of the peer layer, for the
 * collective that waits (the first pending one, on the rank its algorithm
 * names). */
static int check_timeout(struct fr_comm *comm)
{
	struct fr_request *req = first_pending(comm);
	int peer = req && req->algo && req->state == FR_REQ_ACTIVE
			   ? req->algo->waiting_on(comm, req)
			   : -1;
	int rc;

	/* only point-to-point waits: a peer that answers may take its time */
	if (!req && comm->eng.p2p)
		rc = fr_peers_watch_p2p(comm, fr_p2p_waiting_on(comm));
	else
		rc = fr_peers_watch(comm, req, peer);

	if (rc)
		fail_all(comm);
	return rc;
}

/* A peer the active collective waits on has left: fail now. */
static int check_gone(struct fr_comm *comm)
{
	struct fr_request *req = fr_active_req(comm);
	int rc;

	if (!req || !req->algo || comm->nranks < 2)
		return 0;
	rc = fr_peers_check_gone(comm, req, req->algo->waiting_on(comm, req));
	if (rc)
		fail_all(comm);
	return rc;
}

int fr_req_submit(struct fr_comm *comm, struct fr_request *tmpl,
		  fr_request_t **out)
{
	struct fr_request *req = comm->eng.spare;
	bool work = false;

	if (req)
		comm->eng.spare = NULL;
	else if (!(req = malloc(sizeof(*req)))) {
		free(tmpl->vec); /* the request owns it from here */
		return FR_ENOMEM;
	}
	memcpy(req, tmpl, FR_REQ_HEAD);
	req->state = FR_REQ_QUEUED;
	req->next = NULL;
	if (comm->eng.tail)
		comm->eng.tail->next = req;
	else
		comm->eng.queue = req;
	comm->eng.tail = req;
	*out = req;
	/*
	 * Start it now so that the peers hear about it early: its first
	 * messages go out before anything else, without first asking the
	 * transport for completions (a system call on the critical path of
	 * a small collective; the wait that follows polls anyway).
	 */
	progress(comm, &work, false);
	return 0;
}

static void req_unlink_free(struct fr_request *req)
{
	struct fr_comm *comm = req->comm;
	struct fr_request **pp, *prev = NULL;

	if (req->p2p.on) {
		fr_p2p_unlink(req);
		req->p2p.on = false;
		goto free;
	}
	for (pp = &comm->eng.queue; *pp && *pp != req; pp = &(*pp)->next)
		prev = *pp;
	if (*pp)
		*pp = req->next;
	if (comm->eng.tail == req)
		comm->eng.tail = prev;
	if (req->algo)
		req->algo->free(req);
	free(req->vec);
	req->vec = NULL;
free:
	if (comm->eng.spare)
		free(req);
	else
		comm->eng.spare = req;
}

int fr_test(fr_request_t **reqp, int *done)
{
	struct fr_request *req;
	struct fr_comm *comm;
	bool work = false;
	int rc;

	if (!reqp || !*reqp || !done)
		return FR_EINVAL;
	req = *reqp;
	comm = req->comm;
	*done = 0;
	fr_lock(comm);
	if (req->state != FR_REQ_DONE)
		fr_engine_step(comm, &work);
	if (req->state != FR_REQ_DONE) {
		fr_unlock(comm);
		return 0;
	}
	rc = req->result;
	*done = 1;
	req_unlink_free(req);
	*reqp = NULL;
	fr_unlock(comm);
	return rc;
}

/* fr_engine_step; watch_idle: an idle step watches too (see below) */
static bool engine_step(struct fr_comm *comm, bool *did_work, bool watch_idle)
{
	fr_progress_internal(comm, did_work);
	if (!first_pending(comm) && !comm->eng.p2p)
		return false;
	/* A step that did work has just seen progress: no timeout is due, and
	 * the watch (clock reads, liveness) is most of a small collective's
	 * step; every FR_BUSY_WATCH-th busy step looks anyway.  An idle step
	 * watches when the caller says: wait_done's spin watches every
	 * FR_IDLE_WATCH-th pass and the one after a sleep. */
	if (*did_work && (++comm->eng.busy_steps % FR_BUSY_WATCH))
		return true;
	if (!*did_work && !watch_idle)
		return true;
	if (!check_timeout(comm) && !*did_work)
		check_gone(comm);
	return first_pending(comm) != NULL || comm->eng.p2p;
}

bool fr_engine_agreeing(const struct fr_comm *comm)
{
	return agree_busy(comm);
}

bool fr_engine_busy(const struct fr_comm *comm)
{
	return agree_busy(comm) || (comm->fail.failed && comm->agr.sets);
}

/*
 * fr_comm_agree's wait: rounds of the engine until the agreement has
 * decided and its last messages are out (those for at most a second
 * more: a peer that cannot take them now asks again).  As wait_done, it
 * leaves the rounds to the leader (another waiting thread, the progress
 * thread) when there is one.
 */
void fr_engine_agree_wait(struct fr_comm *comm)
{
	uint64_t flush_until = 0;

	for (;;) {
		bool decided = !fr_agree_running(&comm->agr), work = false;

		if (decided) {
			if (!fr_agree_owing(&comm->agr))
				break;
			if (!flush_until)
				flush_until = fr_now_ms() + 1000;
			else if (fr_now_ms() >= flush_until)
				break;
		}
		if (comm->thr.poller_busy || comm->thr.pt_running) {
			if (decided)
				break; /* the leader sends them */
			fr_cond_wait(comm);
			continue;
		}
		comm->thr.poller_busy = true;
		fr_lock_yield(comm);
		progress(comm, &work, true);
		if (!work)
			fr_comm_sleep(comm, 10);
		comm->thr.poller_busy = false;
		/* a follower may take over */
		fr_signal(comm);
	}
}

bool fr_engine_step(struct fr_comm *comm, bool *did_work)
{
	return engine_step(comm, did_work, true);
}

/*
 * Our core is shared (fr_spin_turn, util.h) although the node has a CPU
 * for every rank we know of.  Two ranks that yield to each other on one
 * core stay there for good while the other cores idle (the scheduler
 * moves neither: neither sleeps, and both look cache-hot), and every
 * call then costs a trip through the scheduler: 24 against 4.6 us for 8
 * bytes at n = 2 between network namespaces, which each believe they are
 * a node of their own, in half the jobs.  Sleeping now and then does not
 * part them (the wake-up puts the sleeper back beside the waker), so move
 * to another CPU of our mask instead (affinity.c, fr_cpu_nudge), once
 * FR_NUDGE_STREAK waits in a row have found the core shared (a kernel
 * thread that ran once is no reason), each try with probability 1/2, so
 * that two ranks that see it at once do not just swap cores: one try in
 * two parts them, and the first FR_NUDGE_FAST tries come FR_NUDGE_MIN_NS
 * apart, so that even a job of a hundred 8-byte calls is parted early
 * (with tries doubling from the first, 2 jobs in 3 of a hundred calls
 * stayed stuck).  Where every core is busy (more ranks than the launcher
 * told of) moving does not help and costs a migration: after those the
 * interval between tries doubles up to FR_NUDGE_MAX_NS while our core
 * stays shared, and starts again once it has not been for
 * FR_NUDGE_RESET_NS.
 *
 * A move alone does not last where the waits sleep: a socket wakes its
 * reader with a synchronous wake-up, which tells the scheduler that the
 * waker is about to sleep, so the sleeper is woken onto the waker's core,
 * and two ranks that each sleep in every wait (their round trip longer
 * than FR_SPIN_US, as it is on one core) are put back together in every
 * round trip: 75 us for 8 bytes over TCP between network namespaces,
 * against 21 apart, in 4 jobs of 9.  Busy pollers (Open MPI) never sleep,
 * so the scheduler's balancing parts them once and for all.  So for
 * FR_NUDGE_RESET_NS after the core was last found shared, a wait spins
 * up to FR_SHARED_SPIN_US before it sleeps: no sleep, no wake-up to pull
 * us back, and once apart the round trip is short again and the core
 * unshared.  Only a wait that finds its core shared spins longer, and it
 * yields the core on every pass.
 */
#define FR_NUDGE_MIN_NS 100000ull
#define FR_NUDGE_MAX_NS 1000000000ull
#define FR_NUDGE_RESET_NS 100000000ull
#define FR_NUDGE_STREAK 4
#define FR_NUDGE_FAST 16
#define FR_SHARED_SPIN_US 1000
static void shared_core(struct fr_comm *comm, bool shared)
{
	struct fr_engine *e = &comm->eng;
	uint64_t now, x;

	if (!shared) {
		e->shared_streak = 0;
		return;
	}
	if (++e->shared_streak < FR_NUDGE_STREAK)
		return;
	now = fr_now_ns();
	e->spin_long_until = now + FR_NUDGE_RESET_NS;
	if (now - e->shared_ns > FR_NUDGE_RESET_NS || !e->nudge_gap) {
		e->nudge_gap = FR_NUDGE_MIN_NS;
		e->nudge_tries = 0;
	}
	e->shared_ns = now;
	if (now < e->nudge_at)
		return;
	e->nudge_at = now + e->nudge_gap;
	if (++e->nudge_tries > FR_NUDGE_FAST)
		e->nudge_gap = FR_MIN(2 * e->nudge_gap, FR_NUDGE_MAX_NS);
	x = now ^ ((uint64_t)comm->rank * 0x9e3779b97f4a7c15ull);
	/* splitmix64's finaliser: a fair coin and a CPU from the clock */
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	x ^= x >> 31;
	if (x & 1)
		(void)fr_cpu_nudge(x >> 1);
}

/* How long a wait spins before it sleeps (shared_core above). */
static int spin_budget_us(const struct fr_comm *comm, uint64_t now)
{
	int us = comm->eng.spin_us;

	if (us > 0 && us < FR_SHARED_SPIN_US && now < comm->eng.spin_long_until)
		return FR_SHARED_SPIN_US;
	return us;
}

static void wait_done(struct fr_request *req)
{
	struct fr_comm *comm = req->comm;
	uint64_t spin_until, idle_since;
	bool shared = false; /* a yield gave our core away */

	while (req->state != FR_REQ_DONE) {
		/* idle passes since the last one that did work; while only
		 * pausing (pure: the first FR_SPIN_PURE_NS, fr_spin_turn) the
		 * clock is read on every FR_IDLE_CLOCK-th, then on each, as
		 * each may yield the core.  Where ranks outnumber cores, on
		 * each from the start: the rank we wait for may need our
		 * core, and a few passes more before the first yield cost
		 * more there (22 against 27 us for 8 bytes, n = 4 on 2 CPUs)
		 * than the clock saves. */
		unsigned int every =
			comm->topo.oversub > 1.0 ? 1 : FR_IDLE_CLOCK;
		unsigned int idle = 0, unwatched = 0;
		bool timing = false, pure = true;
		/* this pass watches timeouts and liveness (engine_step) */
		bool watch = true;

		if (comm->thr.poller_busy || comm->thr.pt_running) {
			fr_cond_wait(comm);
			continue;
		}
		comm->thr.poller_busy = true;
		idle_since = spin_until = 0;
		while (req->state != FR_REQ_DONE) {
			bool work = false;
			uint64_t now;

			fr_lock_yield(comm);
			engine_step(comm, &work, watch);
			if (req->state == FR_REQ_DONE)
				break;
			if (work) {
				idle = 0;
				timing = false;
				pure = true;
				continue;
			}
			/*
			 * Waiting for the peer's message: the first passes
			 * only pause.  A clock read costs more than a pass
			 * (35 ns under this hypervisor), and so do giving
			 * the lock up and taking it again (fr_lock_yield()
			 * lets a thread that wants it in meanwhile) and the
			 * watch of timeouts and liveness: each makes the
			 * pass longer and the message's arrival noticed
			 * later.  Timeouts are milliseconds or more.
			 */
			watch = ++unwatched % FR_IDLE_WATCH == 0;
			if (pure && comm->eng.spin_us && ++idle % every) {
				fr_spin_pause();
				continue;
			}
			now = fr_now_ns();
			if (!timing) {
				idle_since = now;
				spin_until = now + (uint64_t)spin_budget_us(
							   comm, now) *
							   1000u;
				timing = true;
			}
			if (now - idle_since >= FR_SPIN_PURE_NS)
				pure = false;
			if (comm->eng.spin_us < 0 || now < spin_until) {
				fr_unlock(comm);
				if (fr_spin_turn(idle_since, now))
					shared = true;
				fr_lock(comm);
				continue;
			}
			fr_comm_sleep(comm, fr_sleep_ms(comm, true));
			watch = true;
		}
		if (comm->topo.oversub <= 1.0)
			shared_core(comm, shared);
		comm->thr.poller_busy = false;
		/* a follower may take over */
		fr_signal(comm);
	}
}

int fr_req_wait_locked(struct fr_request *req)
{
	int rc;

	wait_done(req);
	rc = req->result;
	req_unlink_free(req);
	return rc;
}

int fr_wait(fr_request_t **reqp)
{
	struct fr_comm *comm;
	int rc;

	if (!reqp || !*reqp)
		return FR_EINVAL;
	comm = (*reqp)->comm;
	fr_lock(comm);
	rc = fr_req_wait_locked(*reqp);
	*reqp = NULL;
	fr_unlock(comm);
	return rc;
}

int fr_progress(fr_comm_t *comm)
{
	bool work = false;
	int rc;

	if (!comm)
		return FR_EINVAL;
	fr_lock(comm);
	rc = fr_progress_internal(comm, &work);
	if (!rc)
		rc = check_timeout(comm);
	if (!rc && !work)
		rc = check_gone(comm);
	fr_unlock(comm);
	return rc;
}

void fr_requests_abandon(struct fr_comm *comm)
{
	while (comm->eng.queue) {
		struct fr_request *req = comm->eng.queue;

		comm->eng.queue = req->next;
		if (req->state == FR_REQ_ACTIVE)
			fr_peers_coll_end(comm); /* a BYE now is expected */
		if (req->algo)
			req->algo->free(req);
		free(req->vec);
		free(req);
	}
	comm->eng.tail = NULL;
	fr_p2p_abandon(comm);
	free(comm->eng.spare);
	comm->eng.spare = NULL;
}
