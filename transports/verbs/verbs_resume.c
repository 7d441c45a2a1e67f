/* SPDX-License-Identifier: MIT */
/*
 * verbs_resume.c - a connection that was up, re-established after one of
 * its QPs failed (a link flap), with the writes the peer did not get sent
 * again; the design is at the top of fr_verbs.c ("Link flaps").  Called by
 * verbs_poll.c and verbs_data.c (verbs_conn_broke: a work completion in
 * error or a stall; the drain is over; a message on an accepted dial's
 * QP) and verbs_cm.c (the resume's requests, events and timers); calls
 * verbs_conn.c (QPs, ids, failure) only.  The next poll completes and
 * re-posts the log once the connection is up again.
 *
 * The steps, on each side:
 *   drain   every QP of the connection to the error state (not
 *           rdma_disconnect(): the peer would take it for a close), and
 *           wait for the flushes: then the count of messages received
 *           (c->rx_msgs) is final, and no WR reads our memory;
 *   swap    destroy the QPs; the old cm id is kept until the new
 *           connection is up (destroying it sends the peer a DREQ, which
 *           it would take for a close while still on it);
 *   meet    the side that noticed dials the peer's listener with a RESUME
 *           request (both connection ids, our count), which the peer
 *           accepts once drained, replying with its count; the peer, if
 *           still up, starts its own drain on that request.  When both
 *           dial, the connection's original connector's dial wins: the
 *           original acceptor takes it and drops its own, and the
 *           connector refuses the acceptor's (FR_EBUSY: wait for me);
 *   settle  on ESTABLISHED, the writes the peer counted complete, the
 *           others are posted again (verbs_log_settle), one QP only.
 * Dials that fail are retried with back-off (10 .. 500 ms); all of it is
 * bounded by 3/4 of the timeout from the first failure, after which the
 * connection fails as it would have without a resume.
 */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "fastreduce.h"
#include "log.h"
#include "util.h"
#include "verbs.h"

/* May c resume (instead of failing)? */
static bool verbs_resumable(const struct fr_tp_conn *c)
{
	const struct fr_tp *tp = c->b.tp;

	return tp->opt.resume && c->peer_cid && !c->peer_gone && !tp->fatal &&
	       (c->b.state == VERBS_UP || c->b.state == VERBS_RESUME);
}

/* The next time the resume needs us: `due`, or its end if sooner. */
static void rs_due(struct fr_tp_conn *c, uint64_t due)
{
	c->b.deadline_ms = FR_MIN(due, c->rs_deadline);
}

/* Give up: the connection fails as it would have without a resume. */
static void __attribute__((format(printf, 2, 3)))
rs_fail(struct fr_tp_conn *c, const char *fmt, ...)
{
	char why[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	verbs_conn_fail(c, FR_EPEER, "%s (the connection had failed: %s)", why,
			c->rs_why);
}

static void verbs_resume_enter(struct fr_tp_conn *c, const char *why)
{
	uint64_t now = fr_now_ms();
	struct fr_tp *tp = c->b.tp;

	if (c->b.state == VERBS_RESUME)
		return;
	snprintf(c->rs_why, sizeof(c->rs_why), "%s", why);
	fr_warn("verbs: rank %d: the connection with rank %d failed (%s); re-establishing it",
		tp->b.rank, c->b.peer, why);
	c->b.state = VERBS_RESUME;
	c->rs = VERBS_RS_DRAIN;
	c->rs_lost = false;
	/* No more polled lines, either way: the log sends what is left as
	 * writes, the peer's lines are taken in the drain (fr_verbs.c,
	 * "Small writes"); nothing of theirs is owed or told any more. */
	c->ll_off = true;
	c->ll_tx = false;
	c->ll_ring_owed = c->ll_credit_owed = c->ll_awake_owed = false;
	/* Back-to-back resumes with nothing done in between (an error that
	 * comes back with the replay) share one deadline. */
	if (c->rs_progress || !c->rs_deadline)
		c->rs_deadline = now + (uint64_t)tp->b.timeout_ms * 3 / 4;
	c->rs_progress = false;
	c->b.backoff_ms = VERBS_BACKOFF_MIN_MS;
	rs_due(c, now + VERBS_DRAIN_MS);
	/* The log sends the waiting notifications' writes again. */
	c->note_head = c->note_tail;
	verbs_lanes_stop(c);
}

void __attribute__((format(printf, 4, 5)))
verbs_conn_broke(struct fr_tp_conn *c, int err, bool net, const char *fmt, ...)
{
	char why[128];
	va_list ap;

	if (c->b.state == VERBS_FAILED)
		return;
	va_start(ap, fmt);
	if (net && verbs_resumable(c)) {
		/* One failing while we resume is part of it. */
		if (c->b.state != VERBS_RESUME) {
			vsnprintf(why, sizeof(why), fmt, ap);
			verbs_resume_enter(c, why);
		}
	} else {
		verbs_conn_vfail(c, err, fmt, ap);
	}
	va_end(ap);
}

/* Drop the attempt at hand (our dial or the request we accepted): its QP
 * and its id; the old id stays. */
static void rs_drop_attempt(struct fr_tp_conn *c)
{
	verbs_drop_lanes(c);
	if (c->id) {
		rdma_destroy_id(c->id);
		c->id = NULL;
	}
}

static void rs_backoff(struct fr_tp_conn *c, const char *why)
{
	uint64_t now = fr_now_ms();

	fr_dbg("verbs: rank %d: re-establishing with rank %d: %s; again in %d ms",
	       c->b.tp->b.rank, c->b.peer, why, c->b.backoff_ms);
	rs_drop_attempt(c);
	c->rs = VERBS_RS_BACKOFF;
	c->b.retry_ms = now + (uint64_t)c->b.backoff_ms;
	c->b.backoff_ms = FR_MIN(c->b.backoff_ms * 2, VERBS_BACKOFF_MAX_MS);
	rs_due(c, c->b.retry_ms);
}

static void rs_wait(struct fr_tp_conn *c)
{
	rs_drop_attempt(c);
	c->rs = VERBS_RS_WAIT;
	rs_due(c, fr_now_ms() + VERBS_RESUME_WAIT_MS);
}

static int rs_ms_left(const struct fr_tp_conn *c)
{
	uint64_t now = fr_now_ms();

	return (int)FR_MAX(
		FR_MIN(c->rs_deadline > now ? c->rs_deadline - now : 1,
		       (uint64_t)VERBS_RESOLVE_MS),
		(uint64_t)1);
}

/* Dial the peer's listener: a fresh id, then address resolution. */
static void rs_dial(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	struct sockaddr_storage src = tp->addr;

	c->rs = VERBS_RS_DIAL;
	rs_due(c, fr_now_ms() + VERBS_RESUME_DIAL_MS);
	if (rdma_create_id(tp->ec, &c->id, c, RDMA_PS_TCP)) {
		c->id = NULL;
		rs_backoff(c, "rdma_create_id failed");
		return;
	}
	verbs_sa_set_port(&src, 0);
	if (rdma_resolve_addr(c->id, (struct sockaddr *)&src,
			      (struct sockaddr *)&c->dst, rs_ms_left(c)))
		rs_backoff(c, "rdma_resolve_addr failed");
}

/* Route resolved: a QP, then the RESUME request. */
static void rs_connect(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	struct rdma_conn_param param;
	uint8_t hello[VERBS_RESUME_LEN];
	int rc;

	c->nqps = 1;
	rc = verbs_qp_create(c);
	if (rc) {
		rs_backoff(c, "cannot create a queue pair");
		return;
	}
	verbs_put_reply(hello, VERBS_KIND_RESUME, tp->b.rank);
	fr_put_le16(hello + 12, 0);
	fr_put_le16(hello + 14, verbs_sa_port(&tp->addr));
	fr_put_le64(hello + 16, tp->b.nonce);
	fr_put_le32(hello + 24, c->cid);
	fr_put_le32(hello + 28, c->peer_cid);
	fr_put_le64(hello + 32, c->rx_msgs);
	memset(&param, 0, sizeof(param));
	param.private_data = hello;
	param.private_data_len = VERBS_RESUME_LEN;
	param.retry_count = tp->opt.retry_cnt;
	param.rnr_retry_count = VERBS_CM_RETRY;
	verbs_set_ack_timeout(tp, c->id);
	if (rdma_connect(c->id, &param))
		rs_backoff(c, "rdma_connect failed");
}

/* Accept the peer's request held in c->rs_req (we are drained). */
static void rs_accept(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	struct rdma_conn_param param;
	uint8_t reply[VERBS_ACCEPT_LEN];
	int rc;

	c->id = c->rs_req;
	c->rs_req = NULL;
	/* Until ESTABLISHED, or the dialer's next request if it gave this one
	 * up (dropping an accepted id would close the connection for a
	 * dialer that is already on it). */
	c->rs = VERBS_RS_ACCEPT;
	rs_due(c, c->rs_deadline);
	c->nqps = 1;
	rc = verbs_qp_create(c);
	if (rc) {
		/* A request its dialer gave up while we drained (its id is
		 * dead: EINVAL); a live dialer dials again on FR_EBUSY, and we
		 * dial ourselves after a while (rs_wait). */
		fr_dbg("verbs: rank %d: accepting rank %d's resume: %s",
		       tp->b.rank, c->b.peer, tp->b.errbuf);
		verbs_refuse(c->id, FR_EBUSY);
		c->id = NULL;
		rs_wait(c);
		return;
	}
	verbs_set_ack_timeout(tp, c->id);
	memset(reply, 0, sizeof(reply));
	verbs_put_reply(reply, VERBS_KIND_ACCEPT, tp->b.rank);
	fr_put_le32(reply + 16, c->cid);
	fr_put_le64(reply + 20, c->rx_msgs);
	memset(&param, 0, sizeof(param));
	param.private_data = reply;
	param.private_data_len = sizeof(reply);
	param.retry_count = tp->opt.retry_cnt;
	param.rnr_retry_count = VERBS_CM_RETRY;
	if (rdma_accept(c->id, &param))
		rs_wait(c); /* the dialer tries again */
}

/* Drained (verbs_poll.c saw to it): the old QPs go, the old id waits;
 * then meet the peer. */
void verbs_resume_drained(struct fr_tp_conn *c)
{
	verbs_drop_lanes(c);
	if (c->old_id)
		rdma_destroy_id(c->old_id); /* an earlier resume's */
	c->old_id = c->id;
	c->id = NULL;
	if (c->rs_req)
		rs_accept(c);
	else if (c->rs_lost)
		rs_wait(c);
	else
		rs_dial(c);
}

/* Established again: the peer has peer_rx of our messages. */
static void rs_done(struct fr_tp_conn *c, uint64_t peer_rx)
{
	struct fr_tp *tp = c->b.tp;

	if (peer_rx < c->msg_head || peer_rx > c->msg_tail) {
		rs_fail(c,
			"rank %d counts %llu of our messages, we sent %llu and know of %llu",
			c->b.peer, (unsigned long long)peer_rx,
			(unsigned long long)c->msg_tail,
			(unsigned long long)c->msg_head);
		return;
	}
	/* Both sides are on the new connection: the old id's DREQ reaches
	 * an id the peer no longer listens to. */
	if (c->old_id) {
		rdma_destroy_id(c->old_id);
		c->old_id = NULL;
	}
	c->ack_upto = peer_rx;
	c->replay_next = peer_rx;
	c->bad_msg = 0;
	c->rs_progress = false;
	c->b.state = VERBS_UP;
	c->nresumes++;
	fr_warn("verbs: rank %d: the connection with rank %d is re-established (%llu ms); %llu message(s) to send again",
		tp->b.rank, c->b.peer,
		(unsigned long long)(fr_now_ms() +
				     (uint64_t)tp->b.timeout_ms * 3 / 4 -
				     c->rs_deadline),
		(unsigned long long)(c->msg_tail - peer_rx));
	/* verbs_data.c's next poll completes and sends the log. */
}

void verbs_resume_request(struct fr_tp *tp, struct rdma_cm_id *id,
			  const uint8_t *pd, size_t pdlen)
{
	struct fr_tp_conn *c;
	int rank;

	if (pdlen < VERBS_RESUME_LEN) {
		verbs_refuse(id, FR_EPROTO);
		return;
	}
	if (verbs_hello_rank(tp, id, pd, &rank))
		return;
	c = verbs_conn_by_cid(tp, fr_get_le32(pd + 28));
	if (!c || c->b.peer != rank || c->peer_cid != fr_get_le32(pd + 24) ||
	    (c->b.state != VERBS_UP && c->b.state != VERBS_RESUME) ||
	    !tp->opt.resume) {
		/* Gone, or never ours: the dialer fails for real. */
		fr_dbg("verbs: rank %d: refused rank %d's resume of a connection we do not have",
		       tp->b.rank, rank);
		verbs_refuse(id, FR_EPEER);
		return;
	}
	if (c->b.state == VERBS_UP)
		verbs_resume_enter(c, "the peer is re-establishing it");
	switch (c->rs) {
	case VERBS_RS_DIAL:
	case VERBS_RS_BACKOFF:
		/* Both dial: the original connector's dial wins. */
		if (!c->b.incoming) {
			verbs_refuse(id, FR_EBUSY);
			return;
		}
		rs_drop_attempt(c);
		break;
	case VERBS_RS_ACCEPT:
		/* The dialer gave up on the one we took and dials again. */
		rs_drop_attempt(c);
		break;
	default:
		break;
	}
	if (c->rs_req)
		verbs_refuse(c->rs_req, FR_EBUSY);
	id->context = c;
	c->rs_req = id;
	c->rs_peer_rx = fr_get_le64(pd + 32);
	if (c->rs != VERBS_RS_DRAIN)
		rs_accept(c);
}

bool verbs_resume_event(struct fr_tp_conn *c, enum rdma_cm_event_type type,
			int status, struct rdma_cm_id *id, const uint8_t *pd,
			size_t pdlen)
{
	if (type == RDMA_CM_EVENT_DEVICE_REMOVAL)
		return false;
	/*
	 * The old connection's DREQ: the peer closed it, or died (its kernel
	 * closes its ids), unless we are accepting its dial (then it is the
	 * peer dropping its old id, once on the new connection).  During the
	 * drain the old id is still c->id.
	 */
	if (type == RDMA_CM_EVENT_DISCONNECTED && c->rs != VERBS_RS_ACCEPT &&
	    (id == c->old_id || (id == c->id && c->rs == VERBS_RS_DRAIN))) {
		rs_fail(c, "rank %d closed the connection", c->b.peer);
		return true;
	}
	/* Other events of the old id, a request we hold: nothing to do. */
	if (id != c->id || c->rs == VERBS_RS_DRAIN)
		return true;
	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (c->rs == VERBS_RS_DIAL &&
		    rdma_resolve_route(c->id, rs_ms_left(c)))
			rs_backoff(c, "rdma_resolve_route failed");
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (c->rs == VERBS_RS_DIAL)
			rs_connect(c);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (c->rs == VERBS_RS_ACCEPT) {
			rs_done(c, c->rs_peer_rx);
			break;
		}
		if (c->rs != VERBS_RS_DIAL)
			break;
		if (pdlen < VERBS_ACCEPT_LEN ||
		    fr_get_le32(pd) != VERBS_MAGIC ||
		    fr_get_le16(pd + 4) != VERBS_VERSION ||
		    fr_get_le16(pd + 6) != VERBS_KIND_ACCEPT ||
		    (int32_t)fr_get_le32(pd + 8) != c->b.peer ||
		    fr_get_le16(pd + 12) ||
		    fr_get_le32(pd + 16) != c->peer_cid) {
			rs_fail(c,
				"rank %d answered the resume with a malformed reply",
				c->b.peer);
			break;
		}
		rs_done(c, fr_get_le64(pd + 20));
		break;
	case RDMA_CM_EVENT_REJECTED:
		if (c->rs != VERBS_RS_DIAL)
			break;
		/* Nobody listens there any more: its endpoint is gone (it
		 * listened for as long as the connection lived). */
		if (status == VERBS_REJ_NO_LISTENER) {
			rs_fail(c, "rank %d no longer listens", c->b.peer);
			break;
		}
		if (pdlen >= VERBS_REPLY_LEN &&
		    fr_get_le32(pd) == VERBS_MAGIC &&
		    fr_get_le16(pd + 6) == VERBS_KIND_REJECT) {
			int st = (int32_t)fr_get_le32(pd + 8);

			if (st == FR_EBUSY) {
				/* Its own dial is on the way: wait for it. */
				c->rs_lost = true;
				rs_wait(c);
				break;
			}
			rs_fail(c, "rank %d refused to re-establish it (%s)",
				c->b.peer, fr_strerror(st));
			break;
		}
		rs_backoff(c, "rejected");
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
	case RDMA_CM_EVENT_DISCONNECTED:
		/* An accepted dial stays until it is established or the
		 * dialer dials again: dropping it would close the connection
		 * for a dialer already on it (its RTU lost). */
		if (c->rs == VERBS_RS_DIAL)
			rs_backoff(c, rdma_event_str(type));
		break;
	default:
		break;
	}
	return true;
}

/* A message arrived on the QP of a dial we accepted: the dialer is on the
 * new connection, whether or not our ESTABLISHED comes (its RTU lost). */
void verbs_resume_arrived(struct fr_tp_conn *c)
{
	if (c->b.state == VERBS_RESUME && c->rs == VERBS_RS_ACCEPT)
		rs_done(c, c->rs_peer_rx);
}

void verbs_resume_timers(struct fr_tp_conn *c, uint64_t now)
{
	if (now >= c->rs_deadline) {
		rs_fail(c,
			"could not re-establish the connection with rank %d within %d ms",
			c->b.peer, c->b.tp->b.timeout_ms * 3 / 4);
		return;
	}
	switch (c->rs) {
	case VERBS_RS_DRAIN:
		break; /* verbs_poll.c's poll ends it */
	case VERBS_RS_BACKOFF:
		if (now >= c->b.retry_ms)
			rs_dial(c);
		break;
	case VERBS_RS_DIAL:
		if (now >= c->b.deadline_ms)
			rs_backoff(c, "no answer");
		break;
	case VERBS_RS_ACCEPT:
		break;
	case VERBS_RS_WAIT:
		/* Nobody came: dial (a crossing is settled as before). */
		if (now >= c->b.deadline_ms) {
			c->rs_lost = false;
			rs_dial(c);
		}
		break;
	}
}
