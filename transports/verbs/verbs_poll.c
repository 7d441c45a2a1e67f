/* SPDX-License-Identifier: MIT */
/*
 * verbs_poll.c - poll() and the sleep (wait, wait_prepare / wait_fd /
 * wait_finish): one pass of everything a connection needs (cm events,
 * timers, the CQ, peers gone, drained resumes, stalls, what is owed to the
 * caller, notifications, fences, the sweep), from verbs_data.c's pieces,
 * and when to look at the cm channel and for stalls.  The rules are at
 * the top of fr_verbs.c.
 */

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "fastreduce.h"
#include "log.h"
#include "tp_cqring.h"
#include "util.h"
#include "verbs.h"

/* ---- poll and wait ------------------------------------------------------- */

/*
 * Does poll() look at the connection-manager channel now?  Each look is a
 * system call (rdma_get_cm_event), which on the latency path costs as much
 * as the message itself, and what the channel brings is not urgent for a
 * rank that polls once its connections are up (a new peer's request, a
 * peer's DISCONNECTED: timeouts are seconds).  So: on every pass while a
 * connection is being set up, after a wait() (it may have woken for a cm
 * event), else once per tick of the coarse clock (a few milliseconds).
 * The shm transport does the same with its sockets.
 */
static bool verbs_cm_due(struct fr_tp *tp)
{
	for (const struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next)
		if (c->b.state != VERBS_UP && c->b.state != VERBS_FAILED)
			return true;
	return fr_coarse_tick_new(&tp->cm_ms);
}

/* Does c wait for a send completion (a signalled WR in a ring)? */
static bool verbs_sends_pending(const struct fr_tp_conn *c)
{
	for (unsigned int i = 0; i < c->nqps; i++) {
		const struct verbs_lane *l = &c->lane[i];

		if (l->qp && l->sq_tail - l->sq_head > l->unsignaled)
			return true;
	}
	return false;
}

/*
 * Stalls: a connection waiting for a send completion that has seen none
 * for tp->stall_ms fails (and so resumes).  Looked at once per coarse tick,
 * after the CQ was drained; a gap between looks (the caller was away)
 * starts the count again, since what completed meanwhile was not seen.
 */
static void verbs_stall_scan(struct fr_tp *tp)
{
	uint64_t now;

	if (!tp->stall_ms || !fr_coarse_tick_new(&tp->stall_tick))
		return;
	now = tp->stall_tick;
	for (struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next) {
		if (c->b.state != VERBS_UP)
			continue;
		if (!verbs_sends_pending(c) || c->sends_done != c->stall_seen ||
		    now - c->stall_look_ms > tp->stall_ms / 2) {
			c->stall_seen = c->sends_done;
			c->stall_ms = now;
		} else if (now - c->stall_ms >= tp->stall_ms) {
			verbs_conn_broke(
				c, FR_EPEER, true,
				"no send to rank %d acknowledged for %llu ms",
				c->b.peer,
				(unsigned long long)(now - c->stall_ms));
		}
		c->stall_look_ms = now;
	}
}

int verbs_poll(struct fr_tp *tp, struct fr_tp_cqe *cqe, int max)
{
	int n = 0, rc;

	if (!tp || max < 0 || (max && !cqe))
		return FR_EINVAL;
	if (tp->fatal)
		return tp->fatal;
	if (verbs_cm_due(tp))
		verbs_cm_drain(tp);
	verbs_timers(tp);
	rc = verbs_cq_drain(tp);
	if (rc < 0)
		return rc;
	verbs_lines_poll(tp);
	verbs_apply_peer_gone(tp);
	verbs_resume_drains(tp);
	verbs_stall_scan(tp);
	verbs_flush_owed(tp);
	verbs_notes_post_all(tp);
	verbs_post_fences(tp);
	verbs_sweep(tp);
	tp->woke = false;
	n = fr_cqring_pop(tp->b.cq, cqe, max);
	return n;
}

/* How long wait() may sleep before a retry or deadline is due. */
static int verbs_wait_cap(const struct fr_tp *tp, int t)
{
	uint64_t now = fr_now_ms();

	for (const struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next) {
		t = fr_tpb_due(c, t, now);
		/* Wake to complete what a failed QP did not flush. */
		if (c->b.state == VERBS_FAILED && !c->synth &&
		    !verbs_rings_empty(c) && (t < 0 || t > VERBS_DRAIN_MS))
			t = VERBS_DRAIN_MS;
		/* Wake to look for a stall (see verbs_stall_scan). */
		if (tp->stall_ms && c->b.state == VERBS_UP &&
		    verbs_sends_pending(c) &&
		    (t < 0 || (unsigned int)t > tp->stall_ms / 4))
			t = (int)(tp->stall_ms / 4);
	}
	return t;
}

/*
 * The sleep, split in three so that the mixed transport (shm+verbs) can
 * sleep on us and on shm at once (transport.h): prepare arms the CQ and
 * looks once more, the caller sleeps on the completion channel, the cm
 * event channel and the wake eventfd (wait_fd(): one epoll descriptor
 * holding the three), finish takes the CQ event and the wake.
 */
int verbs_wait_prepare(struct fr_tp *tp, int *timeout_ms)
{
	int rc;

	if (!tp || !timeout_ms)
		return FR_EINVAL;
	if (tp->opt.spin || verbs_owes(tp))
		return 1;
	/* Peers that send us polled lines must know we may sleep (their
	 * next line then wakes us), before we look for the last time. */
	if (verbs_ll_sleep(tp))
		return 1;
	/* A notification left unposted (its parts completed in a drain
	 * outside poll) or an uncovered tail would never raise the
	 * completion we sleep on. */
	verbs_notes_post_all(tp);
	verbs_post_fences(tp);
	*timeout_ms = verbs_wait_cap(tp, *timeout_ms < 0 ? -1 : *timeout_ms);
	/* Arm, then look once more: a completion that arrived before the
	 * arming raises no event. */
	rc = ibv_req_notify_cq(tp->cq, 0);
	if (rc) {
		fr_tpb_seterr(&tp->b, FR_LOG_ERROR, "ibv_req_notify_cq: %s",
			      strerror(rc));
		return FR_ESYS;
	}
	rc = verbs_cq_drain(tp);
	if (rc < 0)
		return rc;
	return rc > 0 || verbs_owes(tp) ? 1 : 0;
}

void verbs_wait_finish(struct fr_tp *tp)
{
	struct ibv_cq *ecq;
	void *ectx;

	/* The channel is non-blocking (open): no event is EAGAIN. */
	if (!ibv_get_cq_event(tp->cc, &ecq, &ectx)) {
		/* Acknowledging takes a lock: do it in batches. */
		if (++tp->cq_unacked >= VERBS_CQ_ACK_BATCH) {
			ibv_ack_cq_events(tp->cq, tp->cq_unacked);
			tp->cq_unacked = 0;
		}
	}
	fr_tpb_wake_drain(&tp->b);
	tp->cm_ms = 0; /* the wake may have been a cm event */
	tp->woke = true;
}

int verbs_wait_fd(struct fr_tp *tp)
{
	const int fds[3] = {tp->cc->fd, tp->ec->fd, tp->b.wfd};

	if (tp->b.epfd >= 0)
		return tp->b.epfd;
	tp->b.epfd = epoll_create1(EPOLL_CLOEXEC);
	if (tp->b.epfd < 0) {
		fr_tpb_seterr(&tp->b, FR_LOG_ERROR, "epoll_create1: %s",
			      fr_syserr(errno));
		tp->b.epfd = -1;
		return FR_ESYS;
	}
	for (int i = 0; i < 3; i++)
		if (fr_tpb_watch(&tp->b, fds[i], EPOLLIN, NULL)) {
			fr_tpb_seterr(&tp->b, FR_LOG_ERROR, "epoll_ctl: %s",
				      fr_syserr(errno));
			close(tp->b.epfd);
			tp->b.epfd = -1;
			return FR_ESYS;
		}
	return tp->b.epfd;
}

int verbs_wait(struct fr_tp *tp, int timeout_ms)
{
	struct pollfd pfd[3];
	int t = timeout_ms, rc;

	if (!tp)
		return FR_EINVAL;
	rc = verbs_wait_prepare(tp, &t);
	if (rc)
		return rc < 0 ? rc : 0;
	pfd[0].fd = tp->cc->fd;
	pfd[0].events = POLLIN;
	pfd[1].fd = tp->ec->fd;
	pfd[1].events = POLLIN;
	pfd[2].fd = tp->b.wfd;
	pfd[2].events = POLLIN;
	if (poll(pfd, 3, t) < 0 && errno != EINTR) {
		fr_tpb_seterr(&tp->b, FR_LOG_ERROR, "poll: %s",
			      fr_syserr(errno));
		return FR_ESYS;
	}
	verbs_wait_finish(tp);
	return 0;
}
