/* SPDX-License-Identifier: MIT */
/*
 * verbs_cm.c - establishment over rdma_cm: the connector's attempts
 * (address and route resolution, retries with back-off, deadlines), the
 * acceptor's judgement of a hello, the accept / reject replies, the lanes
 * handshake on ESTABLISHED, and DISCONNECTED; the wire formats are at the
 * top of fr_verbs.c.  Events are read from the non-blocking channel by
 * verbs_cm_drain(), which poll(), wait() and the establishment calls run;
 * connections and QPs themselves come from verbs_conn.c.
 */

#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "fastreduce.h"
#include "log.h"
#include "util.h"
#include "verbs.h"

/* ---- small helpers ------------------------------------------------------- */

/* ---- establishment ------------------------------------------------------- */

static bool verbs_outgoing_pending(const struct fr_tp_conn *c)
{
	return !c->b.incoming &&
	       (c->b.state == VERBS_RETRY || c->b.state == VERBS_ADDR ||
		c->b.state == VERBS_ROUTE || c->b.state == VERBS_CONNECTING);
}

/* Another attempt later: the peer may not be listening yet. */
static void __attribute__((format(printf, 2, 3)))
verbs_retry(struct fr_tp_conn *c, const char *fmt, ...)
{
	uint64_t now = fr_now_ms();
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->why, sizeof(c->why), fmt, ap);
	va_end(ap);
	fr_dbg("verbs: rank %d: connecting to rank %d: %s; again in %d ms",
	       c->b.tp->b.rank, c->b.peer, c->why, c->b.backoff_ms);
	verbs_drop_id(c);
	fr_tpb_retry(c, 0, now, VERBS_BACKOFF_MAX_MS);
}

static int verbs_resolve_ms(const struct fr_tp_conn *c)
{
	uint64_t now = fr_now_ms();
	uint64_t left = c->b.deadline_ms > now ? c->b.deadline_ms - now : 1;

	return (int)FR_MAX(FR_MIN(left, (uint64_t)VERBS_RESOLVE_MS),
			   (uint64_t)1);
}

/* One attempt: a fresh cm id, then address resolution from our address. */
void verbs_start_connect(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	struct sockaddr_storage src = tp->addr;

	if (rdma_create_id(tp->ec, &c->id, c, RDMA_PS_TCP)) {
		c->id = NULL;
		verbs_conn_fail(c, FR_ESYS, "rdma_create_id: %s",
				fr_syserr(errno));
		return;
	}
	/* Leave through the device we registered memory on. */
	verbs_sa_set_port(&src, 0);
	/* A link-local peer is reached through our own interface; the scope
	 * id in its blob is its interface index, meaningless here. */
	if (c->dst.ss_family == AF_INET6 && src.ss_family == AF_INET6 &&
	    IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)&c->dst)->sin6_addr))
		((struct sockaddr_in6 *)&c->dst)->sin6_scope_id =
			((struct sockaddr_in6 *)&src)->sin6_scope_id;
	if (rdma_resolve_addr(c->id, (struct sockaddr *)&src,
			      (struct sockaddr *)&c->dst,
			      verbs_resolve_ms(c))) {
		verbs_retry(c, "rdma_resolve_addr: %s", fr_syserr(errno));
		return;
	}
	c->b.state = VERBS_ADDR;
}

static void verbs_on_addr_resolved(struct fr_tp_conn *c)
{
	if (rdma_resolve_route(c->id, verbs_resolve_ms(c))) {
		verbs_retry(c, "rdma_resolve_route: %s", fr_syserr(errno));
		return;
	}
	c->b.state = VERBS_ROUTE;
}

static void verbs_on_route_resolved(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	struct rdma_conn_param param;
	uint8_t hello[VERBS_HELLO_LEN + 4 * (VERBS_MAX_QPS - 1)];
	unsigned int i;
	int rc;

	/* Propose every QP we want; the acceptor may take fewer. */
	c->nqps = tp->opt.nqps;
	rc = verbs_qp_create(c);
	if (rc) {
		verbs_conn_fail(c, rc, "cannot create a queue pair: %s",
				tp->b.errbuf);
		return;
	}
	verbs_put_reply(hello, VERBS_KIND_HELLO, tp->b.rank);
	fr_put_le16(hello + 12, (uint16_t)(c->nqps - 1));
	fr_put_le16(hello + 14, verbs_sa_port(&tp->addr));
	fr_put_le64(hello + 16, tp->b.nonce);
	fr_put_le32(hello + 24, c->cid);
	for (i = 1; i < c->nqps; i++)
		fr_put_le32(hello + VERBS_HELLO_LEN + 4 * (i - 1),
			    c->lane[i].qp->qp_num);
	memset(&param, 0, sizeof(param));
	param.private_data = hello;
	param.private_data_len = (uint8_t)(VERBS_HELLO_LEN + 4 * (c->nqps - 1));
	/* No RDMA READ or atomics either way: the QPs then allow remote
	 * writes only. */
	param.responder_resources = 0;
	param.initiator_depth = 0;
	param.retry_count = tp->opt.retry_cnt;
	param.rnr_retry_count = VERBS_CM_RETRY;
	verbs_set_ack_timeout(tp, c->id);
	if (rdma_connect(c->id, &param)) {
		verbs_retry(c, "rdma_connect: %s", fr_syserr(errno));
		return;
	}
	c->b.state = VERBS_CONNECTING;
}

/* Is qpn a QP number a peer may give (24 bits, not 0 or 1)? */
static bool verbs_qpn_ok(uint32_t qpn)
{
	return qpn > 1 && qpn <= 0xffffff;
}

/*
 * The connector's side, on ESTABLISHED: keep the first n lanes (the
 * acceptor's choice), connect lanes 1..n-1 to the acceptor's QPs listed at
 * qpns (its lanes are in RTS already: it connected them before replying),
 * destroy the rest, and tell the acceptor with a lanes-ready message on
 * lane 0 that ours can receive now.  The acceptor stripes nothing before
 * that message: its ESTABLISHED comes with our RTU, which librdmacm sends
 * before we see our own ESTABLISHED and get here.
 */
static int verbs_lanes_up(struct fr_tp_conn *c, unsigned int n,
			  const uint8_t *qpns)
{
	uint8_t pl[VERBS_CTL_LEN] = {0};
	unsigned int i;
	int rc;

	for (i = n; i < c->nqps; i++)
		verbs_drop_lane(c, i);
	c->nqps = n;
	if (n == 1)
		return 0;
	for (i = 1; i < n; i++) {
		uint32_t qpn = fr_get_le32(qpns + 4 * (i - 1));

		if (!verbs_qpn_ok(qpn)) {
			fr_tpb_seterr(&c->b.tp->b, FR_LOG_WARN,
				      "the peer gave QP number %u", qpn);
			return FR_EPROTO;
		}
		rc = verbs_lane_connect(c, i, qpn);
		if (rc)
			return rc;
	}
	/* Nothing has been posted yet: lane 0's ring is empty. */
	fr_put_le32(pl, VERBS_READY_MAGIC);
	fr_put_le32(pl + 4, n);
	rc = verbs_post_ctl(c, pl, "lanes ready");
	if (rc)
		return rc;
	c->lanes_ready = true;
	return 0;
}

static void verbs_on_established(struct fr_tp_conn *c, const uint8_t *pd,
				 size_t pdlen)
{
	unsigned int extra;
	char where[96];
	int rank, rc;

	if (c->b.state == VERBS_ACCEPTING) {
		rc = verbs_ll_send_key(c);
		if (rc) {
			verbs_conn_fail(c, rc, "%s", c->b.tp->b.errbuf);
			return;
		}
		c->b.state = VERBS_UP;
		fr_dbg("verbs: rank %d: connection from rank %d established",
		       c->b.tp->b.rank, c->b.peer);
		return;
	}
	if (c->b.state != VERBS_CONNECTING)
		return;
	fr_sockaddr_str((struct sockaddr *)&c->dst, where, sizeof(where));
	if (pdlen < VERBS_REPLY_LEN || fr_get_le32(pd) != VERBS_MAGIC ||
	    fr_get_le16(pd + 6) != VERBS_KIND_ACCEPT) {
		verbs_conn_fail(c, FR_EPROTO,
				"%s accepted without a fastreduce reply",
				where);
		return;
	}
	rank = (int32_t)fr_get_le32(pd + 8);
	if (fr_get_le16(pd + 4) != VERBS_VERSION || rank != c->b.peer ||
	    pdlen < VERBS_ACCEPT_LEN || !fr_get_le32(pd + 16)) {
		verbs_conn_fail(
			c, FR_EPROTO,
			"%s answered as rank %d (protocol version %u), expected rank %d",
			where, rank, fr_get_le16(pd + 4), c->b.peer);
		return;
	}
	c->peer_cid = fr_get_le32(pd + 16);
	extra = fr_get_le16(pd + 12);
	if (extra > c->nqps - 1 ||
	    (extra && pdlen < VERBS_ACCEPT_LEN + 4 * (size_t)extra)) {
		verbs_conn_fail(
			c, FR_EPROTO,
			"%s accepted %u extra queue pairs, we proposed %u",
			where, extra, c->nqps - 1);
		return;
	}
	rc = verbs_lanes_up(c, extra + 1, pd + VERBS_ACCEPT_LEN);
	if (rc) {
		verbs_conn_fail(c, rc,
				"cannot connect the extra queue pairs: %s",
				c->b.tp->b.errbuf);
		return;
	}
	rc = verbs_ll_send_key(c);
	if (rc) {
		verbs_conn_fail(c, rc, "%s", c->b.tp->b.errbuf);
		return;
	}
	c->b.state = VERBS_UP;
	fr_dbg("verbs: rank %d: connected to rank %d at %s", c->b.tp->b.rank,
	       c->b.peer, where);
}

static void verbs_on_rejected(struct fr_tp_conn *c, int status,
			      const uint8_t *pd, size_t pdlen)
{
	int st;

	if (!verbs_outgoing_pending(c))
		return;
	/* Our own refusal is final; anything else (nobody listening on
	 * that port yet) is worth another try. */
	if (pdlen >= VERBS_REPLY_LEN && fr_get_le32(pd) == VERBS_MAGIC &&
	    fr_get_le16(pd + 6) == VERBS_KIND_REJECT) {
		st = (int32_t)fr_get_le32(pd + 8);
		if (st != FR_EAUTH && st != FR_EBUSY && st != FR_EPROTO)
			st = FR_EPROTO;
		verbs_conn_fail(
			c, st, "rank %d refused the connection: %s", c->b.peer,
			st == FR_EAUTH ? "wrong job nonce"
			: st == FR_EBUSY
				? "it already has a connection from this rank"
				: "protocol mismatch");
		return;
	}
	verbs_retry(c, "rejected (reason %d)", status);
}

static struct fr_tp_conn *verbs_incoming_from(struct fr_tp *tp, int rank)
{
	struct fr_tp_conn *c;

	for (c = tp->b.conns; c; c = c->b.next)
		if (c->b.incoming && c->b.peer == rank &&
		    c->b.state != VERBS_FAILED)
			return c;
	return NULL;
}

/* A connection request: judge its hello, then accept it at once. */
static void verbs_on_request(struct fr_tp *tp, struct rdma_cm_id *id,
			     const uint8_t *pd, size_t pdlen)
{
	struct rdma_conn_param param;
	uint8_t reply[VERBS_ACCEPT_LEN + 4 * (VERBS_MAX_QPS - 1)];
	struct fr_tp_conn *c, *old;
	unsigned int extra, i;
	int rank, rc;

	if (pdlen >= VERBS_REPLY_LEN && fr_get_le32(pd) == VERBS_MAGIC &&
	    fr_get_le16(pd + 6) == VERBS_KIND_RESUME) {
		verbs_resume_request(tp, id, pd, pdlen);
		return;
	}
	if (pdlen < VERBS_HELLO_LEN || fr_get_le32(pd) != VERBS_MAGIC ||
	    fr_get_le16(pd + 6) != VERBS_KIND_HELLO) {
		fr_warn("verbs: rank %d: refused a connection request that is not a fastreduce hello",
			tp->b.rank);
		verbs_refuse(id, 0);
		return;
	}
	if (verbs_hello_rank(tp, id, pd, &rank))
		return;
	extra = fr_get_le16(pd + 12);
	if (rank < 0 || !fr_get_le32(pd + 24) || extra >= VERBS_MAX_QPS ||
	    pdlen < VERBS_HELLO_LEN + 4 * (size_t)extra) {
		fr_warn("verbs: rank %d: refused a malformed hello (rank %d, %u extra queue pairs)",
			tp->b.rank, rank, extra);
		verbs_refuse(id, FR_EPROTO);
		return;
	}
	for (i = 0; i < extra; i++) {
		if (!verbs_qpn_ok(fr_get_le32(pd + VERBS_HELLO_LEN + 4 * i))) {
			fr_warn("verbs: rank %d: refused a hello from rank %d with QP number %u",
				tp->b.rank, rank,
				fr_get_le32(pd + VERBS_HELLO_LEN + 4 * i));
			verbs_refuse(id, FR_EPROTO);
			return;
		}
	}
	old = verbs_incoming_from(tp, rank);
	if (old && (old->b.owned || old->b.state == VERBS_UP)) {
		fr_warn("verbs: rank %d: refused a second connection from rank %d",
			tp->b.rank, rank);
		verbs_refuse(id, FR_EBUSY);
		return;
	}
	/* An acceptance that never completed: the peer gave up on it and
	 * tries again, so the new request replaces it. */
	if (old)
		verbs_conn_fail(old, FR_EPEER, "superseded by a new request");
	if (tp->b.npending >= FR_TPB_MAX_PENDING) {
		fr_warn("verbs: rank %d: too many connections awaiting accept; refusing rank %d",
			tp->b.rank, rank);
		verbs_refuse(id, FR_EBUSY);
		return;
	}
	c = verbs_conn_new(tp);
	if (!c) {
		verbs_refuse(id, FR_EBUSY);
		return;
	}
	c->id = id;
	id->context = c;
	c->b.peer = rank;
	/* For a resume: who it is, and where it listens (from the address
	 * it connects from) should we have to dial it. */
	c->peer_cid = fr_get_le32(pd + 24);
	c->peer_port = fr_get_le16(pd + 14);
	memcpy(&c->dst, rdma_get_peer_addr(id),
	       rdma_get_peer_addr(id)->sa_family == AF_INET6
		       ? sizeof(struct sockaddr_in6)
		       : sizeof(struct sockaddr_in));
	verbs_sa_set_port(&c->dst, c->peer_port);
	/* linked, counted as parked until accept() takes it */
	fr_tpb_conn_park(c, VERBS_ACCEPTING, fr_now_ms());
	/* As many QPs as both want. */
	c->nqps = FR_MIN(tp->opt.nqps, extra + 1);
	rc = verbs_qp_create(c);
	/* Our extra lanes go to RTS now (the cm id holds the request's path),
	 * so they can receive before the connector learns their numbers. */
	verbs_set_ack_timeout(tp, id);
	for (i = 1; !rc && i < c->nqps; i++)
		rc = verbs_lane_connect(
			c, i, fr_get_le32(pd + VERBS_HELLO_LEN + 4 * (i - 1)));
	if (rc) {
		fr_warn("verbs: rank %d: refusing rank %d: %s", tp->b.rank,
			rank, tp->b.errbuf);
		verbs_drop_qp(c);
		c->id = NULL;
		fr_tpb_conn_free(c);
		verbs_refuse(id, FR_EBUSY);
		return;
	}
	verbs_put_reply(reply, VERBS_KIND_ACCEPT, tp->b.rank);
	fr_put_le16(reply + 12, (uint16_t)(c->nqps - 1));
	fr_put_le16(reply + 14, 0);
	fr_put_le32(reply + 16, c->cid);
	fr_put_le64(reply + 20, 0); /* messages received: none yet */
	for (i = 1; i < c->nqps; i++)
		fr_put_le32(reply + VERBS_ACCEPT_LEN + 4 * (i - 1),
			    c->lane[i].qp->qp_num);
	memset(&param, 0, sizeof(param));
	param.private_data = reply;
	param.private_data_len =
		(uint8_t)(VERBS_ACCEPT_LEN + 4 * (c->nqps - 1));
	param.responder_resources = 0;
	param.initiator_depth = 0;
	param.retry_count = tp->opt.retry_cnt;
	param.rnr_retry_count = VERBS_CM_RETRY;
	if (rdma_accept(id, &param)) {
		verbs_conn_fail(c, FR_ESYS, "rdma_accept: %s",
				fr_syserr(errno));
		return;
	}
	fr_dbg("verbs: rank %d: accepting a connection from rank %d",
	       tp->b.rank, rank);
}

static void verbs_on_disconnected(struct fr_tp_conn *c)
{
	switch (c->b.state) {
	case VERBS_UP:
		/* After the CQ is drained: what came before comes first. */
		c->peer_gone = true;
		break;
	case VERBS_FAILED:
		/* We failed it first; this is the peer's answer, or its own
		 * disconnect crossing ours: reply so it need not wait. */
		if (c->id && !c->disconnected && !rdma_disconnect(c->id))
			c->disconnected = true;
		break;
	default:
		if (verbs_outgoing_pending(c))
			verbs_retry(c, "disconnected during the handshake");
		else
			verbs_conn_fail(c, FR_EPEER,
					"disconnected during the handshake");
		break;
	}
}

/* One cm event, already acknowledged (pd is a copy of its private data). */
static void verbs_cm_event(struct fr_tp *tp, enum rdma_cm_event_type type,
			   int status, struct rdma_cm_id *id, const uint8_t *pd,
			   size_t pdlen)
{
	struct fr_tp_conn *c;

	if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
		verbs_on_request(tp, id, pd, pdlen);
		return;
	}
	c = id->context;
	/* A resume's ids, old and new, are its own business. */
	if (c && c->b.state == VERBS_RESUME &&
	    verbs_resume_event(c, type, status, id, pd, pdlen))
		return;
	if (!c || c->id != id) {
		/* The listener: only the loss of the device matters. */
		if (type == RDMA_CM_EVENT_DEVICE_REMOVAL && !tp->fatal) {
			tp->fatal = FR_ENODEV;
			fr_tpb_seterr(&tp->b, FR_LOG_ERROR,
				      "the RDMA device was removed");
		}
		return;
	}
	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (c->b.state == VERBS_ADDR)
			verbs_on_addr_resolved(c);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (c->b.state == VERBS_ROUTE)
			verbs_on_route_resolved(c);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		verbs_on_established(c, pd, pdlen);
		break;
	case RDMA_CM_EVENT_REJECTED:
		verbs_on_rejected(c, status, pd, pdlen);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		if (verbs_outgoing_pending(c))
			verbs_retry(c, "%s (status %d)", rdma_event_str(type),
				    status);
		else if (c->b.state != VERBS_FAILED)
			verbs_conn_fail(c, FR_EPEER, "%s (status %d)",
					rdma_event_str(type), status);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		verbs_on_disconnected(c);
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		verbs_conn_fail(c, FR_ENODEV, "the RDMA device was removed");
		if (!tp->fatal) {
			tp->fatal = FR_ENODEV;
			fr_tpb_seterr(&tp->b, FR_LOG_ERROR,
				      "the RDMA device was removed");
		}
		break;
	default:
		fr_dbg("verbs: rank %d: %s on the connection with rank %d",
		       tp->b.rank, rdma_event_str(type), c->b.peer);
		break;
	}
}

/* Read every cm event waiting on the (non-blocking) channel. */
void verbs_cm_drain(struct fr_tp *tp)
{
	struct rdma_cm_event *ev;
	enum rdma_cm_event_type type;
	struct rdma_cm_id *id;
	uint8_t pd[256];
	size_t pdlen;
	int status;

	for (;;) {
		if (rdma_get_cm_event(tp->ec, &ev)) {
			if (errno != EAGAIN && errno != EWOULDBLOCK &&
			    errno != EINTR)
				fr_dbg("verbs: rdma_get_cm_event: %s",
				       fr_syserr(errno));
			return;
		}
		type = ev->event;
		status = ev->status;
		id = ev->id;
		pdlen = 0;
		/* param.conn is meaningful for these only; copy its private
		 * data, since acknowledging the event frees it. */
		if ((type == RDMA_CM_EVENT_CONNECT_REQUEST ||
		     type == RDMA_CM_EVENT_ESTABLISHED ||
		     type == RDMA_CM_EVENT_REJECTED) &&
		    ev->param.conn.private_data) {
			pdlen = FR_MIN((size_t)ev->param.conn.private_data_len,
				       sizeof(pd));
			memcpy(pd, ev->param.conn.private_data, pdlen);
		}
		/* Acknowledge before acting: acting may destroy the id, and
		 * rdma_destroy_id() waits for its events to be acknowledged. */
		rdma_ack_cm_event(ev);
		verbs_cm_event(tp, type, status, id, pd, pdlen);
	}
}

/* Retries that are due, handshakes past their deadline. */
void verbs_timers(struct fr_tp *tp)
{
	struct fr_tp_conn *c, *next;
	uint64_t now = fr_now_ms();
	char where[96];

	for (c = tp->b.conns; c; c = next) {
		next = c->b.next;
		if (c->b.state == VERBS_RESUME) {
			verbs_resume_timers(c, now);
			continue;
		}
		if (c->b.state == VERBS_UP || c->b.state == VERBS_FAILED)
			continue;
		if (now >= c->b.deadline_ms) {
			if (c->b.incoming) {
				verbs_conn_fail(c, FR_ETIMEDOUT,
						"never established");
				continue;
			}
			fr_sockaddr_str((struct sockaddr *)&c->dst, where,
					sizeof(where));
			verbs_conn_fail(
				c, FR_ETIMEDOUT,
				"could not connect to rank %d at %s within %d ms%s%s",
				c->b.peer, where, c->b.tp->b.timeout_ms,
				c->why[0] ? ": " : "", c->why);
			continue;
		}
		if (c->b.state == VERBS_RETRY && now >= c->b.retry_ms)
			verbs_start_connect(c);
	}
}

/* Incoming connections that failed before anyone took them: free. */
void verbs_sweep(struct fr_tp *tp)
{
	struct fr_tp_conn *c, *next;

	for (c = tp->b.conns; c; c = next) {
		next = c->b.next;
		if (!c->b.owned && c->b.state == VERBS_FAILED) {
			fr_tpb_close_conn(c); /* purged from the ring, freed */
		}
	}
}
