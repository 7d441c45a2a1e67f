/* SPDX-License-Identifier: MIT */
/*
 * verbs_post.c - posting on a connection's lanes: the room a lane's send
 * ring has (less what the notifications keep), one work request posted
 * with its ring entry and selective signalling, the notification FIFO
 * (a striped write's send with immediate, once every part is placed),
 * and the receives put back.  Called by the data path (verbs_data.c) and
 * the polled lines (verbs_lines.c); it calls only the connection below
 * it (verbs_conn.c).  The rules are at the top of fr_verbs.c.
 */

#include <arpa/inet.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "fastreduce.h"
#include "log.h"
#include "util.h"
#include "verbs.h"

/* Is the oldest unposted notification ready (its parts all done)? */
bool verbs_note_ready(const struct fr_tp_conn *c)
{
	return c->note_head != c->note_tail &&
	       !c->notes[c->note_head % c->b.tp->b.sq_depth].parts_left;
}

/* Slots of a lane spoken for: lane 0 keeps one per unposted notification. */
unsigned int verbs_lane_reserved(const struct fr_tp_conn *c,
				 const struct verbs_lane *l)
{
	return l == &c->lane[0] ? (unsigned int)(c->note_tail - c->note_head)
				: 0;
}

/* Can lane l take `need` more WRs beside what it has reserved?  At most
 * sq_depth WRs that are not fences, and never more than the HW queue. */
bool verbs_lane_room(const struct fr_tp_conn *c, const struct verbs_lane *l,
		     unsigned int need)
{
	unsigned int r = verbs_lane_reserved(c, l);

	return l->nwr + r + need <= c->b.tp->b.sq_depth &&
	       l->sq_tail - l->sq_head + r + need <= c->sq_cap;
}

/*
 * Post one WR on lane i and enter it in the lane's ring.  Signalled when
 * asked (sig), when it has a ctx (the caller wants to know when its source
 * is free), every VERBS_SIG_INTERVAL WRs, and when the lane or the
 * connection is about to fill (a full queue always has a completion
 * coming).  On failure the connection fails: FR_EPEER.
 */
int verbs_lane_post(struct fr_tp_conn *c, unsigned int i,
		    struct ibv_send_wr *wr, enum verbs_sqe_kind kind,
		    uint64_t ctx, struct fr_tp_mr *mr, uint64_t seq, bool sig)
{
	struct fr_tp *tp = c->b.tp;
	struct verbs_lane *l = &c->lane[i];
	unsigned int r = verbs_lane_reserved(c, l);
	struct ibv_send_wr *bad;
	struct verbs_sqe *e;
	int rc;

	sig = sig || ctx || l->unsignaled + 1 >= VERBS_SIG_INTERVAL ||
	      (wr->num_sge && wr->sg_list->length >= VERBS_SIG_BYTES) ||
	      c->user_inflight + 1 >= tp->b.sq_depth ||
	      l->nwr + r + 2 >= tp->b.sq_depth ||
	      l->sq_tail - l->sq_head + r + 1 >= c->sq_cap;
	wr->wr_id = verbs_wrid(c, false, (uint32_t)l->sq_tail);
	if (sig)
		wr->send_flags |= IBV_SEND_SIGNALED;
	/* Small payloads are copied into the WQE: no DMA read. */
	if (wr->num_sge && wr->sg_list->length <= l->max_inline)
		wr->send_flags |= IBV_SEND_INLINE;
	rc = ibv_post_send(l->qp, wr, &bad);
	if (rc) {
		char why[192];

		/* Our own failure, not the peer's: say so loudly. */
		fr_warn("verbs: rank %d: ibv_post_send to rank %d (queue pair %u): %s",
			tp->b.rank, c->b.peer, i + 1,
			verbs_strerror(rc, why, sizeof(why)));
		verbs_conn_fail(c, FR_EPEER, "ibv_post_send: %s", strerror(rc));
		return FR_EPEER;
	}
	e = &l->sq[l->sq_tail % c->sq_cap];
	e->ctx = ctx;
	e->kind = (uint8_t)kind;
	e->seq = seq;
	e->mr = mr && wr->num_sge && !(wr->send_flags & IBV_SEND_INLINE) ? mr
									 : NULL;
	if (e->mr)
		e->mr->inflight++;
	if (wr->num_sge && (wr->opcode == IBV_WR_RDMA_WRITE ||
			    wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)) {
		l->last_raddr = wr->wr.rdma.remote_addr;
		l->last_rkey = wr->wr.rdma.rkey;
	}
	l->sq_tail++;
	l->nwr++;
	l->unsignaled = sig ? 0 : l->unsignaled + 1;
	l->unsig_owed = sig ? 0
			    : l->unsig_owed + (kind != VERBS_SQE_INLINE &&
					       kind != VERBS_SQE_WORD);
	return 0;
}

/*
 * Post the notifications whose parts have all completed, oldest first, on
 * lane 0 as a send with immediate carrying the whole length (a receive
 * completion reports only its own WR's length).  Lane 0's slot was
 * reserved when the write was taken, so the queue has room.
 */
void verbs_notes_post(struct fr_tp_conn *c)
{
	struct verbs_lane *l0 = &c->lane[0];
	struct ibv_send_wr wr;
	struct ibv_sge sge;

	while (c->b.state == VERBS_UP && verbs_note_ready(c)) {
		struct verbs_note *n =
			&c->notes[c->note_head % c->b.tp->b.sq_depth];
		uint8_t *b = c->ctl +
			     (size_t)(l0->sq_tail % c->sq_cap) * VERBS_CTL_LEN;

		memset(b, 0, VERBS_CTL_LEN);
		fr_put_le32(b, n->len);
		fr_put_le32(b + 4, VERBS_NOTE_MAGIC);
		sge.addr = (uint64_t)(uintptr_t)b;
		sge.length = VERBS_CTL_LEN;
		sge.lkey = c->ctl_mr->lkey;
		memset(&wr, 0, sizeof(wr));
		wr.opcode = IBV_WR_SEND_WITH_IMM;
		wr.imm_data = htonl(n->imm);
		wr.sg_list = &sge;
		wr.num_sge = 1;
		/* The reservation becomes the WR. */
		c->note_head++;
		if (verbs_lane_post(c, 0, &wr, VERBS_SQE_USER, n->ctx, NULL,
				    n->msg, false)) {
			/* Still owed: it fails with the connection. */
			c->note_head--;
			return;
		}
	}
}

/* A consumed receive goes back on the queue, so that the peer always finds
 * one for its next write with immediate or send. */
void verbs_repost(struct fr_tp_conn *c)
{
	int rc;

	/* A stopped QP only flushes it; a resume's new QP posts what is
	 * missing. */
	if (c->b.state == VERBS_FAILED || !c->lane[0].qp || c->lanes_stopped)
		return;
	rc = verbs_post_recvs(c, 1);
	if (rc)
		verbs_conn_fail(c, FR_ESYS, "ibv_post_recv: %s", strerror(rc));
}
