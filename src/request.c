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

#include "algo/algo.h"
#include "algo/ring.h"
#include "internal.h"
#include "log.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

#define CQE_BATCH 32

static void req_finish(struct fr_request *req, int result)
{
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
	int e = comm->failed;

	/* A failure of this rank's own (a system call, memory, its
	 * arguments) is invisible to the others, who would wait for it until
	 * the timeout, perhaps not even connected to us: tell them all.  A
	 * dead or silent peer they see for themselves. */
	if (comm->fail_origin < 0 &&
	    (e == FR_ESYS || e == FR_ENOMEM || e == FR_EINVAL))
		fr_peers_tell_all(comm);
	fr_peers_quiesce(comm);
	for (struct fr_request *q = comm->queue; q; q = q->next)
		if (q->state != FR_REQ_DONE)
			req_finish(q, comm->failed);
	/* nothing holds them now: no late write may land in them */
	fr_mem_cache_drop_idle(comm);
}

struct fr_request *fr_active_req(struct fr_comm *comm)
{
	struct fr_request *q = comm->queue;

	while (q && q->state == FR_REQ_DONE)
		q = q->next;
	return q && q->state == FR_REQ_ACTIVE ? q : NULL;
}

static struct fr_request *first_pending(struct fr_comm *comm)
{
	struct fr_request *q = comm->queue;

	while (q && q->state == FR_REQ_DONE)
		q = q->next;
	return q;
}

/* Drain the transport's completions (when poll), then start and advance
 * collectives back to back while they complete. */
static int progress(struct fr_comm *comm, bool *did_work, bool poll)
{
	struct fr_tp_cqe cqe[CQE_BATCH];
	struct fr_request *req;
	int n, rc = 0;

	if (comm->failed)
		goto failed;
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
				if (!fr_peers_cqe_is_liveness(&cqe[i])) {
					comm->last_activity_ms = fr_now_ms();
					comm->waiting_late = false;
				}
				fr_peers_on_cqe(comm, &cqe[i]);
			}
			if (comm->failed)
				goto failed;
		} while (n == CQE_BATCH);
		if (fr_peers_progress(comm, did_work) ||
		    fr_ring_progress(comm, did_work))
			goto failed;
	}
	/* Run collectives back to back while they complete. */
	while ((req = first_pending(comm))) {
		if (req->state == FR_REQ_QUEUED) {
			req->state = FR_REQ_ACTIVE;
			req->seq = comm->seq++;
			comm->last_activity_ms = fr_now_ms();
			if (comm->abort_pending &&
			    (int32_t)(req->seq - comm->abort_seq) >= 0) {
				comm->fail_origin = comm->abort_origin;
				fr_comm_fail(comm, comm->abort_err, "%s",
					     comm->abort_msg);
				goto failed;
			}
			req->algo = fr_algo_select(comm, req);
			comm->last_algo = req->algo->id;
			comm->errmsg[0] = '\0';
			rc = req->algo->start(comm, req);
			if (rc) {
				char why[FR_ERRMSG_MAX];

				/* errmsg may hold the cause (a registration):
				 * not formatted into itself */
				snprintf(why, sizeof(why), "%s",
					 comm->errmsg[0] ? comm->errmsg
							 : fr_strerror(rc));
				if (!comm->failed) {
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
		req_finish(req, 0);
		*did_work = true;
	}
	return 0;

failed:
	fail_all(comm);
	return comm->failed;
}

int fr_progress_internal(struct fr_comm *comm, bool *did_work)
{
	return progress(comm, did_work, true);
}

/*
 * Turn a silent neighbour into an error once the timeout has passed, or,
 * if it answers PINGs but has not entered the collective (or waits for a
 * rank that has not), once FR_SLOW_TIMEOUT_MS has (peer.c, "Slow or dead").
 */
static int check_timeout(struct fr_comm *comm)
{
	struct fr_request *req = first_pending(comm);
	uint64_t idle = fr_now_ms() - comm->last_activity_ms;
	const char *name;
	int peer, lv = -1;

	if (!req) {
		comm->waiting_late = false;
		return 0;
	}
	peer = req->algo && req->state == FR_REQ_ACTIVE
		       ? req->algo->waiting_on(comm, req)
		       : -1;
	if (peer >= 0 && peer < comm->nranks && peer != comm->rank)
		lv = fr_peer_liveness(comm, peer, req->seq, idle);
	if (lv == 1 && !comm->waiting_late) {
		comm->waiting_late = true;
		fr_peers_announce_late(comm);
	} else if (lv != 1 && comm->waiting_late) {
		/* the late rank has arrived (or stopped answering): it gets a
		 * whole timeout from now to send, as a rank that was never
		 * late does, not the rest of one that ran out meanwhile (its
		 * data may first need a connection to us) */
		comm->waiting_late = false;
		comm->last_activity_ms = fr_now_ms();
		return 0;
	}
	if (idle < (uint64_t)comm->timeout_ms ||
	    (lv == 1 && idle < (uint64_t)comm->slow_timeout_ms))
		return 0;
	name = fr_coll_name(req->coll);
	if (lv == 1 && comm->peers[peer].pong_late)
		fr_comm_fail(
			comm, FR_ETIMEDOUT,
			"rank %d: collective #%u (%s): rank %d is alive but itself waits for a rank that has not entered collective #%u after %.0f s (FR_SLOW_TIMEOUT_MS=%ld)",
			comm->rank, req->seq, name, peer, req->seq,
			(double)idle / 1000, comm->slow_timeout_ms);
	else if (lv == 1)
		fr_comm_fail(
			comm, FR_ETIMEDOUT,
			"rank %d: rank %d is alive but has not entered collective #%u (%s) after %.0f s (FR_SLOW_TIMEOUT_MS=%ld)",
			comm->rank, peer, req->seq, name, (double)idle / 1000,
			comm->slow_timeout_ms);
	else if (lv == 0)
		fr_comm_fail(
			comm, FR_ETIMEDOUT,
			"rank %d: collective #%u (%s): rank %d is alive and in it but sent nothing for %llu ms",
			comm->rank, req->seq, name, peer,
			(unsigned long long)idle);
	else if (peer >= 0)
		fr_comm_fail(
			comm, FR_ETIMEDOUT,
			"rank %d: collective #%u (%s): no progress for %llu ms waiting on rank %d, which does not answer (dead, hung, unreachable, or busy outside the library without a progress thread)",
			comm->rank, req->seq, name, (unsigned long long)idle,
			peer);
	else
		fr_comm_fail(
			comm, FR_ETIMEDOUT,
			"rank %d: collective #%u (%s): no progress for %llu ms",
			comm->rank, req->seq, name, (unsigned long long)idle);
	fail_all(comm);
	return FR_ETIMEDOUT;
}

/*
 * A peer we wait on said goodbye and left nothing unread: it will never
 * send what we wait for, so fail now instead of at the timeout.  Not while
 * writes of ours are in flight: then we may be waiting for those (a peer
 * that has all our data may well have left), and they complete or fail
 * on their own.
 */
static int check_gone(struct fr_comm *comm)
{
	struct fr_request *req = fr_active_req(comm);
	struct fr_peer *p;
	int peer;

	if (!req || !req->algo || comm->nranks < 2 || comm->outstanding > 0)
		return 0;
	peer = req->algo->waiting_on(comm, req);
	if (peer < 0 || peer >= comm->nranks || peer == comm->rank)
		return 0;
	p = &comm->peers[peer];
	if (!p->bye || p->recv_taken != p->recv_arrived)
		return 0;
	fr_comm_fail(
		comm, FR_EPEER,
		"rank %d: collective #%u (%s): rank %d has destroyed its communicator",
		comm->rank, req->seq, fr_coll_name(req->coll), peer);
	fail_all(comm);
	return FR_EPEER;
}

int fr_req_submit(struct fr_comm *comm, struct fr_request *tmpl,
		  fr_request_t **out)
{
	struct fr_request *req = malloc(sizeof(*req));
	bool work = false;

	if (!req)
		return FR_ENOMEM;
	*req = *tmpl;
	req->state = FR_REQ_QUEUED;
	req->next = NULL;
	if (comm->tail)
		comm->tail->next = req;
	else
		comm->queue = req;
	comm->tail = req;
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

	for (pp = &comm->queue; *pp && *pp != req; pp = &(*pp)->next)
		prev = *pp;
	if (*pp)
		*pp = req->next;
	if (comm->tail == req)
		comm->tail = prev;
	if (req->algo)
		req->algo->free(req);
	free(req);
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

bool fr_engine_step(struct fr_comm *comm, bool *did_work)
{
	fr_progress_internal(comm, did_work);
	if (!first_pending(comm))
		return false;
	if (!check_timeout(comm) && !*did_work)
		check_gone(comm);
	return first_pending(comm) != NULL;
}

/*
 * Progress until req is done, spinning briefly and then blocking.  One
 * thread drives (the leader); others, and everyone while a progress thread
 * runs, sleep in fr_cond_wait() until their request is done or the leader
 * leaves.
 */
static void wait_done(struct fr_request *req)
{
	struct fr_comm *comm = req->comm;
	uint64_t spin_until, idle_since;

	while (req->state != FR_REQ_DONE) {
		if (comm->poller_busy || comm->pt_running) {
			fr_cond_wait(comm);
			continue;
		}
		comm->poller_busy = true;
		idle_since = fr_now_ns();
		spin_until = idle_since + (uint64_t)comm->spin_us * 1000u;
		while (req->state != FR_REQ_DONE) {
			bool work = false;
			uint64_t now;

			fr_lock_yield(comm);
			fr_engine_step(comm, &work);
			if (req->state == FR_REQ_DONE)
				break;
			now = fr_now_ns();
			if (work) {
				idle_since = now;
				spin_until = now + (uint64_t)comm->spin_us * 1000u;
				continue;
			}
			if (comm->spin_us < 0 || now < spin_until) {
				fr_unlock(comm);
				fr_spin_turn(idle_since, now);
				fr_lock(comm);
				continue;
			}
			fr_comm_sleep(comm, fr_sleep_ms(comm, true));
		}
		comm->poller_busy = false;
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
	while (comm->queue) {
		struct fr_request *req = comm->queue;

		comm->queue = req->next;
		if (req->algo)
			req->algo->free(req);
		free(req);
	}
	comm->tail = NULL;
}
