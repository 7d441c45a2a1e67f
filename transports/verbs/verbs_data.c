/* SPDX-License-Identifier: MIT */
/*
 * verbs_data.c - the data path: write_imm() (one write with immediate, or
 * parts striped over the lanes and a notification after them) and
 * write_inline() (a polled line, or a write with immediate inlined),
 * fences, the work completions and what connections owe the caller, the
 * message log (sent again by a resume, verbs_resume.c), and the pieces
 * of a poll that verbs_poll.c puts together.  The rules are at the top of
 * fr_verbs.c.  It posts through verbs_post.c, takes the polled lines
 * through verbs_lines.c, and calls the establishment (verbs_cm.c) and a
 * resume's steps, so it sits above them all.
 */

#include <arpa/inet.h>
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
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

/* ---- small helpers ------------------------------------------------------- */

/* The FR status of a failed work completion. */
static int verbs_wc_status(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_LOC_PROT_ERR:
		return FR_ERANGE;
	default:
		return FR_EPEER;
	}
}

/*
 * Is a failed work completion the network's doing, worth a resume (a link
 * that went down: the retries ran out, the QP could not send, or it was
 * stopped)?  Others (a request the peer refused, a length, a protection
 * error) would fail the same way again.
 */
static bool verbs_wc_resumable(enum ibv_wc_status s)
{
	return s == IBV_WC_RETRY_EXC_ERR || s == IBV_WC_RNR_RETRY_EXC_ERR ||
	       s == IBV_WC_LOC_QP_OP_ERR || s == IBV_WC_WR_FLUSH_ERR;
}

/* ---- data path: completions ---------------------------------------------- */

/*
 * Retire a lane's ring up to seq s: the WRs before it completed without
 * error (RC completes in order), s itself with `status`.  A write with
 * immediate that completed has reached the peer: its FR_CQE_SEND, and its
 * message leaves the log.  One that failed owes nothing here: its message
 * stays in the log, to be sent again by a resume or failed from the log
 * (verbs_log_fail), so that every write gets its one completion whatever
 * way it ends.
 */
static void verbs_sq_retire(struct fr_tp_conn *c, struct verbs_lane *l,
			    uint64_t s, int status)
{
	struct fr_tp *tp = c->b.tp;

	while (l->sq_head <= s) {
		struct verbs_sqe *e = &l->sq[l->sq_head % c->sq_cap];
		bool ok = l->sq_head != s || !status;

		if (e->mr) {
			e->mr->inflight--;
			e->mr = NULL;
		}
		switch (e->kind) {
		case VERBS_SQE_USER:
		case VERBS_SQE_INLINE:
		case VERBS_SQE_LINE:
			if (!ok)
				break;
			if (e->kind == VERBS_SQE_USER) {
				fr_cqring_push(tp->b.cq, FR_CQE_SEND, 0, c,
					       e->ctx, 0, 0);
				c->user_inflight--;
			}
			/* A line is placed: is the peer asleep now? */
			if (e->kind == VERBS_SQE_LINE)
				c->ll_ring_owed = true;
			verbs_log_pop(c, e->seq + 1);
			c->rs_progress = true;
			break;
		case VERBS_SQE_PART:
			/* In error too: the notification's turn comes
			 * when its source is no longer read. */
			c->notes[e->seq % c->b.tp->b.sq_depth].parts_left--;
			break;
		default:
			break;
		}
		if (e->kind != VERBS_SQE_FENCE)
			l->nwr--;
		l->sq_head++;
	}
	if (l->sq_head == l->sq_tail)
		l->unsignaled = l->unsig_owed = 0;
}

/* Has every lane retired its ring (nothing reads a source any more)? */
bool verbs_rings_empty(const struct fr_tp_conn *c)
{
	for (unsigned int i = 0; i < c->nqps; i++)
		if (c->lane[i].sq_head != c->lane[i].sq_tail)
			return false;
	return true;
}

/*
 * A failed connection's writes not known to have arrived (the log): each
 * gets its FR_CQE_SEND, in order, once no lane reads a source any more:
 * 0 for those a resume found the peer had, the error for the rest (the
 * one whose WR failed first with its own status).  Returns false when the
 * ring is full.
 */
static bool verbs_log_fail(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;

	if (!verbs_rings_empty(c))
		return true;
	while (c->msg_head < c->msg_tail) {
		struct verbs_msg *m = &c->log[c->msg_head % c->log_cap];
		int st = c->was_up ? FR_EPEER : c->b.error;

		if (c->msg_head < c->ack_upto)
			st = 0;
		else if (c->bad_msg == c->msg_head + 1)
			st = c->bad_st;
		if (m->user) {
			if (!fr_cqring_room(tp->b.cq))
				return false;
			fr_cqring_push(tp->b.cq, FR_CQE_SEND, st, c, m->ctx, 0,
				       0);
			c->user_inflight--;
		}
		verbs_log_pop(c, c->msg_head + 1);
	}
	return true;
}

/*
 * After a resume: the messages the peer turned out to have get their
 * FR_CQE_SEND (their WRs failed with the old QP), then the others are
 * posted again, in order, whole, on lane 0, as room allows.  New writes
 * wait (FR_EAGAIN) until this is done, so that the order holds.
 */
static void verbs_log_settle(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	struct ibv_send_wr wr;
	struct ibv_sge sge;

	while (c->msg_head < c->ack_upto) {
		struct verbs_msg *m = &c->log[c->msg_head % c->log_cap];

		if (m->user) {
			if (!fr_cqring_room(tp->b.cq))
				return;
			fr_cqring_push(tp->b.cq, FR_CQE_SEND, 0, c, m->ctx, 0,
				       0);
			c->user_inflight--;
		}
		verbs_log_pop(c, c->msg_head + 1);
	}
	while (c->b.state == VERBS_UP && c->replay_next < c->msg_tail &&
	       verbs_lane_room(c, &c->lane[0], 1)) {
		struct verbs_msg *m = &c->log[c->replay_next % c->log_cap];

		memset(&wr, 0, sizeof(wr));
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.imm_data = htonl(m->imm);
		wr.wr.rdma.remote_addr = m->raddr;
		wr.wr.rdma.rkey = m->rkey;
		if (m->len) {
			sge.length = m->len;
			if (m->mr) {
				sge.addr = (uint64_t)(uintptr_t)(m->mr->base +
								 m->loff);
				sge.lkey = m->mr->mr->lkey;
			} else if (m->len <= c->lane[0].max_inline) {
				sge.addr = (uint64_t)(uintptr_t)m->data;
				sge.lkey = 0;
			} else {
				verbs_conn_fail(
					c, FR_EPEER,
					"the new queue pair with rank %d cannot inline %u bytes",
					c->b.peer, m->len);
				return;
			}
			wr.sg_list = &sge;
			wr.num_sge = 1;
		}
		if (verbs_lane_post(c, 0, &wr,
				    m->user ? VERBS_SQE_USER : VERBS_SQE_INLINE,
				    m->user ? m->ctx : 0, m->mr, c->replay_next,
				    false))
			return;
		c->replay_next++;
	}
}

/* Is a stopped connection's old QP done: its sends and lane 0's receives
 * (which tell what arrived) flushed, or the CQ polled a while after the
 * stop (see VERBS_DRAIN_MS)? */
static bool verbs_drained(const struct fr_tp_conn *c)
{
	return (verbs_rings_empty(c) && !c->rq_out) ||
	       fr_now_ms() >= c->stop_ms + VERBS_DRAIN_MS;
}

/* Resumes whose old QPs are drained go on (verbs_resume.c); only after a
 * drain that saw the CQ empty, so that every receive of the old QP was
 * counted. */
void verbs_resume_drains(struct fr_tp *tp)
{
	if (!tp->cq_empty)
		return;
	for (struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next) {
		if (c->b.state != VERBS_RESUME || c->rs != VERBS_RS_DRAIN ||
		    !verbs_drained(c))
			continue;
		/* The lines that landed are counted with what arrived; the
		 * connection takes none after (the peer sends them again as
		 * writes). */
		verbs_lines_take(c);
		c->ll_rx = false;
		if (c->b.state == VERBS_RESUME)
			verbs_resume_drained(c);
	}
}

/*
 * A receive on lane 0 that is not a write with immediate: a notification
 * (send with immediate; its payload holds the length of the whole striped
 * write), at the acceptor the connector's lanes-ready message, the peer's
 * polled-lines key, or a wake-up (fr_verbs.c, "Small writes").  Returns
 * the write's length, or -1 when it was handled here or the connection
 * failed (a malformed message).
 */
static int64_t verbs_recv_ctl(struct fr_tp_conn *c, const struct ibv_wc *wc)
{
	const uint8_t *b;
	uint32_t idx = (uint32_t)wc->wr_id % c->b.tp->rq_depth;

	if (wc->opcode != IBV_WC_RECV || wc->byte_len != VERBS_CTL_LEN) {
		verbs_conn_fail(
			c, FR_EPROTO,
			"rank %d sent a message that is neither a write with immediate nor a notification (opcode %d, %u bytes)",
			c->b.peer, (int)wc->opcode, wc->byte_len);
		return -1;
	}
	b = verbs_recv_buf(c, idx);
	if (wc->wc_flags & IBV_WC_WITH_IMM) {
		if (fr_get_le32(b + 4) != VERBS_NOTE_MAGIC) {
			verbs_conn_fail(c, FR_EPROTO,
					"rank %d sent a malformed notification",
					c->b.peer);
			return -1;
		}
		return fr_get_le32(b);
	}
	if (fr_get_le32(b) == VERBS_LLKEY_MAGIC) {
		/* Ours are sent from a new connection only: one that began
		 * a resume sends no lines (a key late from before it, taken
		 * in its drain, is not used). */
		if (c->b.tp->opt.ll && !c->ll_off) {
			c->ll_peer_rkey = fr_get_le32(b + 4);
			c->ll_peer_addr = fr_get_le64(b + 8);
			c->ll_tx = true;
		}
		verbs_repost(c);
		return -1;
	}
	if (fr_get_le32(b) == VERBS_WAKE_MAGIC) {
		/* It woke us; it raises no completion of its own. */
		verbs_repost(c);
		return -1;
	}
	if (!c->b.incoming || c->nqps < 2 || c->lanes_ready ||
	    fr_get_le32(b) != VERBS_READY_MAGIC ||
	    fr_get_le32(b + 4) != c->nqps) {
		verbs_conn_fail(c, FR_EPROTO,
				"rank %d sent an unexpected message (%u bytes)",
				c->b.peer, wc->byte_len);
		return -1;
	}
	c->lanes_ready = true;
	fr_dbg("verbs: rank %d: rank %d's %u queue pairs are ready",
	       c->b.tp->b.rank, c->b.peer, c->nqps);
	/* Not the caller's: its receive goes back at once. */
	verbs_repost(c);
	return -1;
}

static void verbs_wc_recv(struct fr_tp_conn *c, const struct ibv_wc *wc)
{
	int64_t len;
	int st;

	c->rq_out--;
	if (wc->status == IBV_WC_SUCCESS)
		c->rs_progress = true;
	if (wc->status != IBV_WC_SUCCESS) {
		/* Flushed receives (and any after the first error) say
		 * nothing new: the connection has its one error, or is
		 * resuming. */
		if (c->b.state == VERBS_FAILED || c->b.state == VERBS_RESUME)
			return;
		st = verbs_wc_status(wc->status);
		/* What the HCA says is worth seeing: the caller's message only
		 * has the error code. */
		if (wc->status != IBV_WC_WR_FLUSH_ERR && c->b.state == VERBS_UP)
			fr_warn("verbs: rank %d: receive from rank %d failed: %s",
				c->b.tp->b.rank, c->b.peer,
				ibv_wc_status_str(wc->status));
		/* This completion becomes the one error the caller is owed
		 * (after any held receives, which came first), unless the
		 * connection resumes. */
		verbs_conn_broke(
			c, st, verbs_wc_resumable(wc->status),
			"receive from rank %d failed: %s (vendor error 0x%x)",
			c->b.peer, ibv_wc_status_str(wc->status),
			wc->vendor_err);
		return;
	}
	if (c->b.state == VERBS_FAILED)
		return; /* landed before the failure; nobody reads it now */
	if (c->b.state == VERBS_RESUME && !c->lanes_stopped)
		verbs_resume_arrived(c);
	/* A message, counted for a resume (the lanes-ready one is not);
	 * the lines sent before it were placed before it: they go first. */
	if (wc->wc_flags & IBV_WC_WITH_IMM) {
		verbs_lines_take(c);
		if (c->b.state == VERBS_FAILED)
			return;
		c->rx_msgs++;
	}
	if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
		len = wc->byte_len;
	} else {
		len = verbs_recv_ctl(c, wc);
		if (len < 0)
			return;
	}
	/* A small write that came as a write while the peer thought we
	 * slept, and found us polling (not just woken: a rank that sleeps
	 * for every message would pay two words a message for nothing):
	 * tell the peer we poll. */
	if (len <= FR_TP_INLINE_MAX && !(c->ll_state & 1) && !c->b.tp->woke)
		verbs_ll_awake(c);
	verbs_deliver(c, ntohl(wc->imm_data), (uint32_t)len, false, false);
}

static void verbs_wc_send(struct fr_tp_conn *c, struct verbs_lane *l,
			  const struct ibv_wc *wc)
{
	uint32_t off = (uint32_t)wc->wr_id - (uint32_t)l->sq_head;
	uint64_t s;
	int st;

	/* Not in the ring: already completed (synthesised after a failure). */
	if (off >= l->sq_tail - l->sq_head)
		return;
	s = l->sq_head + off;
	if (wc->status == IBV_WC_SUCCESS) {
		c->sends_done++;
		verbs_sq_retire(c, l, s, 0);
		return;
	}
	st = wc->status == IBV_WC_WR_FLUSH_ERR ? FR_EPEER
					       : verbs_wc_status(wc->status);
	if (!c->bad_msg && wc->status != IBV_WC_WR_FLUSH_ERR) {
		const struct verbs_sqe *e = &l->sq[s % c->sq_cap];

		if (e->kind == VERBS_SQE_USER || e->kind == VERBS_SQE_INLINE ||
		    e->kind == VERBS_SQE_LINE) {
			c->bad_msg = e->seq + 1;
			c->bad_st = st;
		}
	}
	if (wc->status != IBV_WC_WR_FLUSH_ERR && c->b.state == VERBS_UP)
		fr_warn("verbs: rank %d: RDMA write to rank %d failed: %s",
			c->b.tp->b.rank, c->b.peer,
			ibv_wc_status_str(wc->status));
	if (c->b.state != VERBS_FAILED)
		verbs_conn_broke(
			c, st, verbs_wc_resumable(wc->status),
			"write to rank %d failed: %s (vendor error 0x%x)",
			c->b.peer, ibv_wc_status_str(wc->status),
			wc->vendor_err);
	verbs_sq_retire(c, l, s, st);
}

/*
 * The receive of an extra lane (QP i >= 1) completed.  The peer only
 * writes there, so it completes only when the QP stopped: with the
 * connection still up (we did not stop it, our own writes on it did not
 * fail first), the peer's part broke our registration (the HCA refused it
 * and stopped the QP, flushing the receive), which is FR_ERANGE as for a
 * write with immediate on QP 0.
 */
static void verbs_wc_lane_recv(struct fr_tp_conn *c, unsigned int i,
			       const struct ibv_wc *wc)
{
	if (c->b.state == VERBS_FAILED || c->b.state == VERBS_RESUME)
		return;
	if (wc->status == IBV_WC_SUCCESS) {
		verbs_conn_fail(c, FR_EPROTO,
				"rank %d sent a message on queue pair %u",
				c->b.peer, i + 1);
		return;
	}
	if (wc->status != IBV_WC_WR_FLUSH_ERR && c->b.state == VERBS_UP)
		fr_warn("verbs: rank %d: queue pair %u with rank %d failed: %s",
			c->b.tp->b.rank, i + 1, c->b.peer,
			ibv_wc_status_str(wc->status));
	/* A flush may also be the link's doing: a resume tells (a broken
	 * registration breaks the write again when it is sent again). */
	verbs_conn_broke(
		c,
		wc->status == IBV_WC_WR_FLUSH_ERR ? FR_ERANGE
						  : verbs_wc_status(wc->status),
		wc->status == IBV_WC_WR_FLUSH_ERR,
		"queue pair %u stopped: %s (a write by rank %d outside our registrations)",
		i + 1, ibv_wc_status_str(wc->status), c->b.peer);
}

static void verbs_wc(struct fr_tp *tp, const struct ibv_wc *wc)
{
	uint32_t slot = (uint32_t)(wc->wr_id >> 48);
	uint32_t gen = (uint32_t)(wc->wr_id >> 33) & 0x7fff;
	struct fr_tp_conn *c = slot < tp->nslots ? tp->slots[slot] : NULL;
	unsigned int i;

	if (!c || c->gen != gen)
		return;
	/* A QP destroyed meanwhile leaves its completions in the CQ. */
	for (i = 0; i < c->nqps; i++)
		if (c->lane[i].qp && c->lane[i].qp->qp_num == wc->qp_num)
			break;
	if (i == c->nqps)
		return;
	if (!(wc->wr_id & VERBS_WRID_RECV))
		verbs_wc_send(c, &c->lane[i], wc);
	else if (!i)
		verbs_wc_recv(c, wc);
	else
		verbs_wc_lane_recv(c, i, wc);
}

/* Poll the CQ while the ring has room for what a batch can produce.
 * Returns the number of work completions taken, or FR_ESYS; tp->cq_empty
 * says whether it saw the CQ empty. */
int verbs_cq_drain(struct fr_tp *tp)
{
	struct ibv_wc wc[VERBS_POLL_BATCH];
	int n, i, batch, total = 0;

	tp->cq_empty = false;
	for (;;) {
		batch = (int)FR_MIN(fr_cqring_room(tp->b.cq) / VERBS_WC_FANOUT,
				    (unsigned int)VERBS_POLL_BATCH);
		if (batch <= 0)
			return total;
		n = ibv_poll_cq(tp->cq, batch, wc);
		if (n < 0) {
			tp->fatal = FR_ESYS;
			fr_tpb_seterr(&tp->b, FR_LOG_ERROR,
				      "ibv_poll_cq failed (%d)", n);
			return FR_ESYS;
		}
		for (i = 0; i < n; i++)
			verbs_wc(tp, &wc[i]);
		total += n;
		if (n < batch) {
			/* Seen empty: destroyed QPs left nothing behind. */
			tp->cq_linger = 0;
			tp->cq_empty = true;
			return total;
		}
	}
}

/*
 * Signal the tail of every QP whose newest WR is unsignalled with a
 * zero-length RDMA WRITE: no immediate, so nothing happens at the peer; its
 * completion retires the writes before it.
 */
void verbs_post_fences(struct fr_tp *tp)
{
	struct ibv_send_wr wr, *bad;
	struct verbs_lane *l;
	struct verbs_sqe *e;
	struct fr_tp_conn *c;
	unsigned int i;
	int rc;

	for (c = tp->b.conns; c; c = c->b.next) {
		for (i = 0; i < c->nqps && c->b.state == VERBS_UP; i++) {
			l = &c->lane[i];
			if (!l->qp || !l->unsig_owed ||
			    l->sq_tail - l->sq_head +
					    verbs_lane_reserved(c, l) >=
				    c->sq_cap)
				continue;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = verbs_wrid(c, false, (uint32_t)l->sq_tail);
			wr.opcode = IBV_WR_RDMA_WRITE;
			wr.num_sge = 0;
			wr.send_flags = IBV_SEND_SIGNALED;
			/* Zero bytes need no valid key; give the last used
			 * one anyway, for devices that look at it. */
			wr.wr.rdma.remote_addr = l->last_raddr;
			wr.wr.rdma.rkey = l->last_rkey;
			rc = ibv_post_send(l->qp, &wr, &bad);
			if (rc) {
				char why[192];

				fr_warn("verbs: rank %d: ibv_post_send (fence) to rank %d: %s",
					tp->b.rank, c->b.peer,
					verbs_strerror(rc, why, sizeof(why)));
				verbs_conn_fail(c, FR_EPEER,
						"ibv_post_send (fence): %s",
						strerror(rc));
				break;
			}
			e = &l->sq[l->sq_tail % c->sq_cap];
			memset(e, 0, sizeof(*e));
			e->kind = VERBS_SQE_FENCE;
			l->sq_tail++;
			l->unsignaled = l->unsig_owed = 0;
		}
	}
}

void verbs_notes_post_all(struct fr_tp *tp)
{
	struct fr_tp_conn *c;

	for (c = tp->b.conns; c; c = c->b.next)
		if (c->b.state == VERBS_UP && c->note_head != c->note_tail)
			verbs_notes_post(c);
}

/* Apply the DISCONNECTED events of live connections (after the drain,
 * and after the lines that landed before it: they came first). */
void verbs_apply_peer_gone(struct fr_tp *tp)
{
	struct fr_tp_conn *c;

	for (c = tp->b.conns; c; c = c->b.next) {
		if (!c->peer_gone || c->b.state != VERBS_UP)
			continue;
		verbs_lines_take(c);
		if (c->b.state == VERBS_UP)
			verbs_conn_fail(c, FR_EPEER,
					"rank %d closed the connection",
					c->b.peer);
	}
}

/* Move what connections owe the caller into the ring, as room allows:
 * held receives first (they came first), then the error, then the
 * writes nobody else will complete. */
void verbs_flush_owed(struct fr_tp *tp)
{
	struct fr_tp_conn *c;
	unsigned int i;

	for (c = tp->b.conns; c; c = c->b.next) {
		if (!c->b.owned)
			continue;
		while (c->held_count && fr_cqring_room(tp->b.cq)) {
			struct verbs_held *h = &c->held[c->held_head];

			fr_cqring_push(tp->b.cq, FR_CQE_RECV, 0, c, 0, h->imm,
				       h->len);
			c->held_head = (c->held_head + 1) % c->held_cap;
			c->held_count--;
			verbs_delivered(c, h->line);
		}
		if (c->held_count)
			return;
		/* A failed connection whose QP left a WR unflushed (see
		 * VERBS_DRAIN_MS): complete its rings ourselves. */
		if (c->b.state == VERBS_FAILED && !c->synth &&
		    !verbs_rings_empty(c) &&
		    fr_now_ms() >= c->stop_ms + VERBS_DRAIN_MS)
			c->synth = true;
		if (c->b.err_owed) {
			if (!fr_cqring_room(tp->b.cq))
				return;
			fr_cqring_push(tp->b.cq, FR_CQE_RECV, c->b.error, c, 0,
				       0, 0);
			c->b.err_owed = false;
		}
		for (i = 0; c->synth && i < c->nqps; i++) {
			struct verbs_lane *l = &c->lane[i];

			while (l->sq_head < l->sq_tail) {
				if (fr_cqring_room(tp->b.cq) < VERBS_WC_FANOUT)
					return;
				verbs_sq_retire(c, l, l->sq_head, FR_EPEER);
			}
		}
		if (c->b.state == VERBS_FAILED && !verbs_log_fail(c))
			return;
		if (c->b.state == VERBS_UP)
			verbs_log_settle(c);
	}
}

bool verbs_owes(const struct fr_tp *tp)
{
	const struct fr_tp_conn *c;
	unsigned int i;

	if (tp->b.cq->count || tp->fatal)
		return true;
	for (c = tp->b.conns; c; c = c->b.next) {
		if (!c->b.owned)
			continue;
		if (c->held_count || c->b.err_owed || c->peer_gone)
			return true;
		/* A line to hand out, or something polled lines owe. */
		if (verbs_line_ready(c) ||
		    (c->b.state == VERBS_UP &&
		     (c->ll_ring_owed || c->ll_credit_owed ||
		      c->ll_awake_owed)))
			return true;
		/* A ready notification to post; messages to fail, to
		 * complete or to send again; a drained resume to go on. */
		if (c->b.state == VERBS_UP &&
		    (verbs_note_ready(c) || c->msg_head < c->ack_upto ||
		     (c->replay_next < c->msg_tail &&
		      verbs_lane_room(c, &c->lane[0], 1))))
			return true;
		if (c->b.state == VERBS_FAILED && c->msg_head < c->msg_tail &&
		    verbs_rings_empty(c))
			return true;
		if (c->b.state == VERBS_RESUME && c->rs == VERBS_RS_DRAIN &&
		    verbs_drained(c))
			return true;
		for (i = 0; c->synth && i < c->nqps; i++)
			if (c->lane[i].sq_head < c->lane[i].sq_tail)
				return true;
	}
	return false;
}

/*
 * Establishment progress for accept() and connect_done() (the class's
 * progress hook; every call is eager); poll() does the same and more.  A
 * peer's DISCONNECTED is applied here too (after a CQ drain, as in
 * poll()), so that wait() has nothing owed to spin on.
 */
void verbs_progress(struct fr_tp *tp, bool eager)
{
	struct fr_tp_conn *c;

	verbs_cm_drain(tp);
	verbs_timers(tp);
	for (c = tp->b.conns; c; c = c->b.next)
		if (c->peer_gone)
			break;
	if (c && verbs_cq_drain(tp) >= 0)
		verbs_apply_peer_gone(tp);
	verbs_sweep(tp);
}

/* ---- writes -------------------------------------------------------------- */

/*
 * How a write is cut: into up to nqps parts of `chunk` bytes (a multiple of
 * VERBS_PART_ALIGN; the last part is shorter), part i on lane i.  Returns
 * the number of parts; 1 or 0 (len 0): not striped.
 */
static unsigned int verbs_parts(const struct fr_tp_conn *c, size_t len,
				size_t *chunk)
{
	size_t k;

	*chunk = len;
	/* Lane 0 takes a part and a notification: with a queue of one
	 * write, a striped one could never be posted. */
	if (!c->lanes_ready || len < c->b.tp->opt.stripe ||
	    c->b.tp->b.sq_depth < 2)
		return len ? 1 : 0;
	k = (len + c->nqps - 1) / c->nqps;
	k = (k + VERBS_PART_ALIGN - 1) / VERBS_PART_ALIGN * VERBS_PART_ALIGN;
	*chunk = k;
	return (unsigned int)((len + k - 1) / k);
}

/* Can c take a write now: 0, FR_EAGAIN (not up yet, resuming, sending
 * the log again, the log full) or its failure. */
static int verbs_conn_writable(const struct fr_tp_conn *c)
{
	if (c->b.state == VERBS_FAILED)
		return c->was_up ? FR_EPEER : c->b.error;
	if (c->b.state != VERBS_UP || c->msg_head < c->ack_upto ||
	    c->replay_next < c->msg_tail ||
	    c->msg_tail - c->msg_head >= c->log_cap)
		return FR_EAGAIN;
	return 0;
}

/* Enter a message in the log (verbs_conn_writable() made room): its seq. */
static uint64_t verbs_log_add(struct fr_tp_conn *c, struct fr_tp_mr *mr,
			      size_t loff, uint64_t raddr, uint32_t rkey,
			      size_t len, uint32_t imm, uint64_t ctx, bool user)
{
	struct verbs_msg *m = &c->log[c->msg_tail % c->log_cap];

	m->ctx = ctx;
	m->mr = len ? mr : NULL;
	if (m->mr)
		m->mr->inflight++;
	m->loff = loff;
	m->raddr = raddr;
	m->rkey = rkey;
	m->len = (uint32_t)len;
	m->imm = imm;
	m->user = user;
	c->replay_next = c->msg_tail + 1;
	return c->msg_tail++;
}

/* Take back the newest message (its post failed at once). */
static void verbs_log_unadd(struct fr_tp_conn *c, uint64_t msg)
{
	struct verbs_msg *m = &c->log[msg % c->log_cap];

	if (m->mr) {
		m->mr->inflight--;
		m->mr = NULL;
	}
	c->replay_next = c->msg_tail = msg;
}

/* FR_IB_FAULT: every n-th write_imm() of the rank stops its connection's
 * QPs, as a link that went down does (tests). */
static void verbs_fault(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;

	if (!tp->opt.fault_every || tp->opt.fault_rank != tp->b.rank ||
	    ++tp->nwrites % tp->opt.fault_every)
		return;
	fr_info("verbs: rank %d: FR_IB_FAULT: stopping the queue pairs with rank %d",
		tp->b.rank, c->b.peer);
	verbs_lanes_stop(c);
}

/* len bytes at roff of the peer's region rkey: FR_EINVAL for a key not
 * ours, FR_ERANGE past its end (overflow-safe; the peer's HCA checks
 * again). */
static int verbs_remote_check(const struct fr_tp_rkey *rkey, uint64_t roff,
			      size_t len)
{
	if (rkey->d != VERBS_RKEY_TAG)
		return FR_EINVAL;
	return roff > rkey->b || len > rkey->b - roff ? FR_ERANGE : 0;
}

int verbs_write_imm(struct fr_tp_conn *c, struct fr_tp_mr *lmr, size_t loff,
		    const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		    uint32_t imm, uint64_t ctx)
{
	struct ibv_send_wr wr;
	struct verbs_note *n;
	struct ibv_sge sge;
	struct fr_tp *tp;
	unsigned int nparts, i;
	size_t chunk;
	uint64_t seq, msg;
	int rc;

	if (!c)
		return FR_EINVAL;
	tp = c->b.tp;
	rc = verbs_conn_writable(c);
	if (rc)
		return rc;
	/*
	 * One message as far as the port goes: the single-WR path (before
	 * the extra QPs are ready, below the stripe size) must work for
	 * every length, and the port caps a message at max_msg_sz.
	 */
	if (len > UINT32_MAX || len > tp->max_msg) {
		fr_tpb_seterr(
			&tp->b, FR_LOG_WARN,
			"a write of %zu bytes exceeds the port's maximum message size of %u bytes",
			len, tp->max_msg);
		return FR_EINVAL;
	}
	if (len) {
		if (!lmr || !rkey || lmr->tp != tp || !lmr->mr ||
		    rkey->d != VERBS_RKEY_TAG)
			return FR_EINVAL;
		if (loff > lmr->len || len > lmr->len - loff)
			return FR_ERANGE;
		rc = verbs_remote_check(rkey, roff, len);
		if (rc)
			return rc;
	}
	if (c->user_inflight >= tp->b.sq_depth)
		return FR_EAGAIN;
	nparts = verbs_parts(c, len, &chunk);

	memset(&wr, 0, sizeof(wr));
	if (len) {
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.wr.rdma.rkey = rkey->c;
		sge.lkey = lmr->mr->lkey;
	}
	/* The plain case: one write with immediate on lane 0, as long as no
	 * earlier notification waits (it must reach the peer first). */
	if (nparts <= 1 && c->note_head == c->note_tail) {
		if (!verbs_lane_room(c, &c->lane[0], 1))
			return FR_EAGAIN;
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.imm_data = htonl(imm);
		if (len) {
			sge.addr = (uint64_t)(uintptr_t)(lmr->base + loff);
			sge.length = (uint32_t)len;
			wr.wr.rdma.remote_addr = rkey->a + roff;
		}
		msg = verbs_log_add(c, lmr, loff, wr.wr.rdma.remote_addr,
				    wr.wr.rdma.rkey, len, imm, ctx, true);
		rc = verbs_lane_post(c, 0, &wr, VERBS_SQE_USER, ctx, lmr, msg,
				     false);
		if (rc) {
			/* The caller learns from rc: no completion owed. */
			verbs_log_unadd(c, msg);
			return rc;
		}
		c->user_inflight++;
		verbs_fault(c);
		return 0;
	}

	/*
	 * Parts now, notification later: lane 0 needs a slot for its part
	 * (if any) and one reserved for the notification; lanes 1.. one
	 * each.  All or nothing, so FR_EAGAIN leaves nothing behind.
	 */
	if (!verbs_lane_room(c, &c->lane[0], nparts ? 2 : 1))
		return FR_EAGAIN;
	for (i = 1; i < nparts; i++)
		if (!verbs_lane_room(c, &c->lane[i], 1))
			return FR_EAGAIN;
	if (nparts > 1)
		c->nstriped++;
	msg = verbs_log_add(c, lmr, loff, len ? rkey->a + roff : 0,
			    len ? rkey->c : 0, len, imm, ctx, true);
	seq = c->note_tail;
	n = &c->notes[seq % tp->b.sq_depth];
	n->msg = msg;
	n->ctx = ctx;
	n->imm = imm;
	n->len = (uint32_t)len;
	n->parts_left = nparts ? nparts - 1 : 0;
	c->note_tail++;
	c->user_inflight++;
	/* Lanes 1.. first, each part signalled: its completion (the data
	 * is placed at the peer) is what the notification waits for. */
	for (i = nparts; i-- > 0;) {
		size_t off = (size_t)i * chunk;

		sge.addr = (uint64_t)(uintptr_t)(lmr->base + loff + off);
		sge.length = (uint32_t)FR_MIN(chunk, len - off);
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.send_flags = 0;
		wr.wr.rdma.remote_addr = rkey->a + roff + off;
		rc = verbs_lane_post(c, i, &wr,
				     i ? VERBS_SQE_PART : VERBS_SQE_PLAIN, 0,
				     lmr, seq, i > 0);
		if (rc) {
			/* The parts not posted never count down; the
			 * caller learns from rc, not from a completion
			 * (the post failed the connection: no resume). */
			n->parts_left -= i ? i : 0;
			c->log[msg % c->log_cap].user = false;
			c->user_inflight--;
			return rc;
		}
	}
	verbs_notes_post(c);
	verbs_fault(c);
	return 0;
}

/*
 * A small write as a polled line (fr_verbs.c, "Small writes"): a plain RDMA
 * WRITE of one line into the peer's ring, which the peer polls: no
 * immediate, no receive consumed, no completion at the peer.  Only while
 * the peer says it polls (its state word odd) and our lines in its ring
 * are fewer than the ring holds (its credit).  Signalled: its completion
 * says the line is placed, and then we look whether the peer has gone to
 * sleep meanwhile (verbs_ll_ring).  1 posted, 0 not now (the caller sends
 * it another way), or the code of a failed post.
 */
static int verbs_line_post(struct fr_tp_conn *c, const void *buf,
			   const struct fr_tp_rkey *rkey, uint64_t roff,
			   size_t len, uint32_t imm)
{
	uint8_t pl[VERBS_LL_WORDS * 4] = {0};
	uint8_t *line = verbs_ll_out(c, c->ll_tail);
	uint32_t flag = (uint32_t)(c->ll_tail + 1);
	uint64_t raddr = rkey->a + roff, msg;
	struct ibv_send_wr wr;
	struct ibv_sge sge;
	int rc;

	if (!c->ll_tx || !(verbs_ll_word(c, VERBS_LL_STATE_OFF) & 1) ||
	    c->ll_tail - verbs_ll_word(c, VERBS_LL_CREDIT_OFF) >=
		    VERBS_LL_LINES)
		return 0;
	msg = verbs_log_add(c, NULL, 0, raddr, rkey->c, len, imm, 0, false);
	memcpy(c->log[msg % c->log_cap].data, buf, len);
	fr_put_le32(pl, (uint32_t)msg);
	fr_put_le32(pl + 4, imm);
	fr_put_le32(pl + 8, (uint32_t)len);
	fr_put_le32(pl + 12, rkey->c);
	fr_put_le64(pl + 16, raddr);
	memcpy(pl + 32, buf, len);
	for (unsigned int i = 0; i < VERBS_LL_WORDS; i++) {
		memcpy(line + 8 * i, pl + 4 * i, 4);
		fr_put_le32(line + 8 * i + 4, flag);
	}
	sge.addr = (uint64_t)(uintptr_t)line;
	sge.length = VERBS_LL_LINE;
	sge.lkey = c->ctl_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.wr.rdma.remote_addr =
		c->ll_peer_addr +
		(c->ll_tail % VERBS_LL_LINES) * (uint64_t)VERBS_LL_LINE;
	wr.wr.rdma.rkey = c->ll_peer_rkey;
	rc = verbs_lane_post(c, 0, &wr, VERBS_SQE_LINE, 0, NULL, msg, true);
	if (rc) {
		verbs_log_unadd(c, msg);
		return rc;
	}
	c->ll_tail++;
	c->ll_sent++;
	return 1;
}

/*
 * write_inline: a polled line where the peer takes them (above), else one
 * RDMA WRITE WITH IMM whose bytes travel inside the work request
 * (IBV_SEND_INLINE: copied at the post, no DMA read of the source, which
 * may be any memory), unsignalled and raising no FR_CQE_SEND: a later
 * signalled WR retires it (every VERBS_SIG_INTERVAL-th is), and it owes no
 * fence.  Only on lane 0 with no notification waiting (the order of
 * writes), and only as long as the device inlines that much; else
 * FR_EAGAIN and the caller uses write_imm.
 */
int verbs_write_inline(struct fr_tp_conn *c, const void *buf,
		       const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		       uint32_t imm)
{
	struct ibv_send_wr wr;
	struct ibv_sge sge;
	uint64_t msg;
	int rc;

	if (!c || !buf || !rkey || !len || len > FR_TP_INLINE_MAX)
		return FR_EINVAL;
	rc = verbs_conn_writable(c);
	if (!rc)
		rc = verbs_remote_check(rkey, roff, len);
	if (rc)
		return rc;
	/* A line too: a resume sends its bytes again inline. */
	if (len > c->lane[0].max_inline || c->note_head != c->note_tail ||
	    !verbs_lane_room(c, &c->lane[0], 1))
		return FR_EAGAIN;
	rc = verbs_line_post(c, buf, rkey, roff, len, imm);
	if (rc)
		return rc < 0 ? rc : 0;
	memset(&wr, 0, sizeof(wr));
	sge.addr = (uint64_t)(uintptr_t)buf;
	sge.length = (uint32_t)len;
	sge.lkey = 0; /* inline: not read by the device */
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	wr.imm_data = htonl(imm);
	wr.send_flags = IBV_SEND_INLINE;
	wr.wr.rdma.remote_addr = rkey->a + roff;
	wr.wr.rdma.rkey = rkey->c;
	msg = verbs_log_add(c, NULL, 0, wr.wr.rdma.remote_addr, rkey->c, len,
			    imm, 0, false);
	/* Kept for a resume: the caller may reuse buf at once. */
	memcpy(c->log[msg % c->log_cap].data, buf, len);
	rc = verbs_lane_post(c, 0, &wr, VERBS_SQE_INLINE, 0, NULL, msg, false);
	if (rc)
		verbs_log_unadd(c, msg);
	return rc;
}
