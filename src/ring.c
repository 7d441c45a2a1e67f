/* SPDX-License-Identifier: MIT */
/*
 * ring.c - pipelined ring All-Reduce over one-sided write-with-immediate.
 *
 * Schedule (n ranks, rank r, count elements split into n chunks, chunk c
 * holding count/n elements plus one for the first count%n chunks):
 *
 *   reduce-scatter, steps k = 0 .. n-2:
 *     send chunk (r-k) mod n to the next rank, into its staging slots;
 *     receive chunk (r-k-1) mod n from the previous rank and reduce it with
 *     our own input into recvbuf.  What we receive at step k is what we
 *     send at step k+1, so after n-1 steps rank r holds the full reduction
 *     of chunk (r+1) mod n (for FR_AVG it divides it by n there).
 *   all-gather, steps k = 0 .. n-2:
 *     send chunk (r+1-k) mod n straight into the next rank's recvbuf (zero
 *     copy: no staging, no credits); receive chunk (r-k) mod n the same way
 *     from the previous rank and forward it at step k+1.
 *
 * Pipelining: every chunk is cut into segments of segment_bytes.  Segments
 * go out strictly in (step, segment) order on each stream, and segment j of
 * step k+1 is sent as soon as segment j of step k has arrived and been
 * reduced, so the transfer of one segment overlaps the reduction of the
 * next, and large messages stream around the ring.
 *
 * Flow control: the next rank owns `slots` staging slots of segment_bytes,
 * registered once per communicator; we may write one reduce-scatter segment
 * per credit, and it returns a credit (a zero-length write carrying only an
 * immediate) once it has reduced the slot.  Slot = serial mod slots, the
 * serial running on across collectives; immediates carry serial and slot so
 * that any disagreement is caught as FR_EPROTO instead of corrupting data.
 *
 * Agreement: when a collective starts, each rank sends a READY control
 * message to both neighbours with the collective's sequence number, count,
 * dtype and op; the one to the previous rank also names our recvbuf (its
 * registration id and offset, plus the remote key the first time that
 * registration is used).  Nothing is written into a neighbour's user
 * buffers before its READY has arrived, so they are never touched before it
 * entered the collective.  Reduce-scatter segments need not wait: they land
 * in the neighbour's own staging slots, behind our READY on the same FIFO
 * connection, and a neighbour that has not started yet keeps them (credits
 * bound how many) - which takes the READY's hop off the critical path of
 * small collectives.  Ranks that called with different arguments detect it
 * from the READY and fail with FR_EMISMATCH; the failure travels around the
 * ring as ABORT messages so that every rank reports it instead of hanging.
 *
 * Determinism: chunk c is accumulated in the fixed order c, c+1, ..., c-1
 * and then copied bit for bit to everybody, so all ranks end with identical
 * bits and the same inputs give the same bits on every run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "reduce.h"
#include "ring.h"
#include "util.h"

#define CTX_CTRL (1ull << 32) /* SEND ctx of a control message: | slot */

struct cursor {
	int k;    /* step */
	size_t j; /* segment within the step's chunk */
};

enum stream { RS_SEND, RS_RECV, AG_SEND, AG_RECV };

struct fr_ring_state {
	int n, r, nsteps;
	size_t count, es, seg; /* seg: elements per segment */
	const uint8_t *sbuf;
	uint8_t *rbuf;
	struct fr_mem *smem, *rmem;
	size_t soff, roff; /* of sbuf / rbuf inside their registrations */
	fr_reduce_fn kern;
	bool avg;
	bool sent_ready_prev, sent_ready_next;
	bool ready_prev, ready_next;
	const struct fr_tp_rkey *dst; /* next rank's recvbuf */
	uint64_t dst_off;
	struct cursor cur[4];
	uint32_t ag_sent, ag_recvd; /* segment serials in the all-gather */
};

static struct fr_request *active_req(struct fr_comm *comm);

/* ---- control messages --------------------------------------------------------- */

/* The layout below ends with the key at byte 44. */
_Static_assert(44 + FR_TP_RKEY_MAX <= FR_CTRL_MSG_SIZE,
	       "control message too small for a remote key");

void fr_ctrl_encode(const struct fr_ctrl *m, uint8_t *b)
{
	memset(b, 0, FR_CTRL_MSG_SIZE);
	fr_put_le32(b, FR_CTRL_MAGIC);
	fr_put_le16(b + 4, m->type);
	fr_put_le16(b + 6, m->has_key);
	fr_put_le32(b + 8, m->seq);
	fr_put_le32(b + 12, (uint32_t)m->err);
	fr_put_le32(b + 16, (uint32_t)m->origin);
	fr_put_le64(b + 20, m->count);
	b[28] = m->dtype;
	b[29] = m->op;
	b[30] = m->keylen;
	b[31] = m->credits;
	fr_put_le32(b + 32, m->mem_id);
	fr_put_le64(b + 36, m->dest_off);
	memcpy(b + 44, m->key, FR_TP_RKEY_MAX);
}

int fr_ctrl_decode(const uint8_t *b, struct fr_ctrl *m)
{
	memset(m, 0, sizeof(*m));
	if (fr_get_le32(b) != FR_CTRL_MAGIC)
		return FR_EPROTO;
	m->type = fr_get_le16(b + 4);
	m->has_key = fr_get_le16(b + 6);
	m->seq = fr_get_le32(b + 8);
	m->err = (int32_t)fr_get_le32(b + 12);
	m->origin = (int32_t)fr_get_le32(b + 16);
	m->count = fr_get_le64(b + 20);
	m->dtype = b[28];
	m->op = b[29];
	m->keylen = b[30];
	m->credits = b[31];
	m->mem_id = fr_get_le32(b + 32);
	m->dest_off = fr_get_le64(b + 36);
	memcpy(m->key, b + 44, FR_TP_RKEY_MAX);
	if (m->type < FR_CTRL_READY || m->type > FR_CTRL_BYE ||
	    m->has_key > 1 || m->keylen > FR_TP_RKEY_MAX ||
	    m->credits > FR_MAX_SLOTS)
		return FR_EPROTO;
	return 0;
}

/*
 * Write a control message to a neighbour's inbox.  Messages to our next
 * rank land in the half of its inbox reserved for its previous rank (0),
 * messages to our previous rank in the other half (1).
 */
static int ctrl_send(struct fr_comm *comm, struct fr_peer *peer, bool to_next,
		     const struct fr_ctrl *m)
{
	uint32_t slot = comm->ctrl_out_seq % FR_CTRL_SLOTS;
	uint32_t rslot = peer->ctrl_seq % FR_CTRL_SLOTS;
	uint64_t roff;
	int rc;

	if (comm->ctrl_out_busy & (1u << slot))
		return FR_EAGAIN;
	fr_ctrl_encode(m, comm->ctrl_out + slot * FR_CTRL_MSG_SIZE);
	roff = ((to_next ? 0 : 1) * FR_CTRL_SLOTS + rslot) * FR_CTRL_MSG_SIZE;
	rc = comm->tp_ops->write_imm(peer->conn, comm->ctrl_out_mem->tp_mr,
				     slot * FR_CTRL_MSG_SIZE, &peer->ctrl_rkey,
				     roff, FR_CTRL_MSG_SIZE,
				     FR_IMM(FR_IMM_CTRL, rslot),
				     CTX_CTRL | slot);
	if (rc)
		return rc;
	comm->ctrl_out_busy |= 1u << slot;
	comm->ctrl_out_seq++;
	peer->ctrl_seq++;
	comm->outstanding++;
	comm->stats.writes++;
	comm->stats.bytes_sent += FR_CTRL_MSG_SIZE;
	return 0;
}

void fr_ring_send_abort(struct fr_comm *comm, int err, int origin)
{
	struct fr_request *req = active_req(comm);
	struct fr_ctrl m = { .type = FR_CTRL_ABORT,
			     .seq = req ? req->seq : comm->seq, .err = err,
			     .origin = origin };

	if (comm->nranks < 2 || !comm->ctrl_out)
		return;
	/* Best effort: a neighbour that is gone cannot be told. */
	if (comm->next.conn)
		ctrl_send(comm, &comm->next, true, &m);
	if (comm->prev.conn)
		ctrl_send(comm, &comm->prev, false, &m);
}

int fr_ring_send_bye(struct fr_comm *comm, bool to_next)
{
	struct fr_ctrl m = { .type = FR_CTRL_BYE, .seq = comm->seq };

	return ctrl_send(comm, to_next ? &comm->next : &comm->prev, to_next,
			 &m);
}

/* ---- schedule helpers ---------------------------------------------------------- */

static int stream_chunk(const struct fr_ring_state *st, enum stream s, int k)
{
	switch (s) {
	case RS_SEND:
		return fr_ring_rs_send_chunk(st->r, k, st->n);
	case RS_RECV:
		return fr_ring_rs_recv_chunk(st->r, k, st->n);
	case AG_SEND:
		return fr_ring_ag_send_chunk(st->r, k, st->n);
	default:
		return fr_ring_ag_recv_chunk(st->r, k, st->n);
	}
}

/* Byte offset (in the user buffers) and length of segment (k, j). */
static void seg_range(const struct fr_ring_state *st, enum stream s,
		      const struct cursor *c, size_t *off, size_t *len)
{
	size_t coff, ccnt, e0;

	fr_ring_chunk(st->count, st->n, stream_chunk(st, s, c->k), &coff,
		      &ccnt);
	e0 = c->j * st->seg;
	*off = (coff + e0) * st->es;
	*len = FR_MIN(st->seg, ccnt - e0) * st->es;
}

/* Skip to the next existing segment (chunks may be empty). */
static void cur_norm(const struct fr_ring_state *st, enum stream s)
{
	struct cursor *c = (struct cursor *)&st->cur[s];

	while (c->k < st->nsteps) {
		size_t coff, ccnt;

		fr_ring_chunk(st->count, st->n, stream_chunk(st, s, c->k),
			      &coff, &ccnt);
		if (c->j < fr_ring_nsegs(ccnt, st->seg))
			return;
		c->k++;
		c->j = 0;
	}
}

static void cur_next(struct fr_ring_state *st, enum stream s)
{
	st->cur[s].j++;
	cur_norm(st, s);
}

static bool cur_done(const struct fr_ring_state *st, enum stream s)
{
	return st->cur[s].k >= st->nsteps;
}

/* Has stream s gone past segment (k, j)? */
static bool past(const struct fr_ring_state *st, enum stream s, int k,
		 size_t j)
{
	const struct cursor *c = &st->cur[s];

	return c->k > k || (c->k == k && c->j > j);
}

/* ---- start / finish --------------------------------------------------------------- */

static struct fr_request *active_req(struct fr_comm *comm)
{
	struct fr_request *q = comm->queue;

	while (q && q->state == FR_REQ_DONE)
		q = q->next;
	return q && q->state == FR_REQ_ACTIVE ? q : NULL;
}

static int apply_ready(struct fr_comm *comm, struct fr_request *req,
		       bool from_next, const struct fr_ctrl *m);
static int on_rs(struct fr_comm *comm, uint32_t payload, uint32_t len);

int fr_ring_start(struct fr_comm *comm, struct fr_request *req)
{
	struct fr_ring_state *st;
	size_t bytes;
	int rc;

	st = calloc(1, sizeof(*st));
	if (!st)
		return FR_ENOMEM;
	req->ring = st;
	st->n = comm->nranks;
	st->r = comm->rank;
	st->nsteps = st->n - 1;
	st->count = req->count;
	st->es = fr_dtype_size(req->dtype);
	st->seg = FR_MAX(comm->segment_bytes / st->es, (size_t)1);
	st->kern = fr_reduce_kernel(req->dtype, req->op);
	st->avg = req->op == FR_AVG;
	st->rbuf = req->recvbuf;
	st->sbuf = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	bytes = st->count * st->es;

	if (comm->abort_pending && req->seq >= comm->abort_seq)
		return fr_comm_fail(comm, comm->abort_err, "%s",
				    comm->abort_msg);
	if (comm->prev.bye || comm->next.bye)
		return fr_comm_fail(comm, FR_EPEER,
				    "rank %d: collective #%u: rank %d has destroyed its communicator",
				    comm->rank, req->seq,
				    comm->prev.bye ? comm->prev.rank :
						     comm->next.rank);
	if (st->n == 1) {
		/* Nothing to talk about: the result is our input. */
		if (bytes && st->sbuf != st->rbuf)
			memcpy(st->rbuf, st->sbuf, bytes);
		st->ready_prev = st->ready_next = true;
		st->sent_ready_prev = st->sent_ready_next = true;
		for (int s = 0; s < 4; s++)
			st->cur[s].k = st->nsteps;
		return 0;
	}
	if (bytes) {
		rc = fr_mem_acquire(comm, st->rbuf, bytes,
				    FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE |
					    FR_TP_REMOTE_WRITE,
				    &st->rmem);
		if (rc)
			return rc;
		st->roff = (uintptr_t)st->rbuf - st->rmem->base;
		if (st->sbuf == st->rbuf) {
			st->smem = st->rmem;
			st->rmem->refs++;
		} else {
			rc = fr_mem_acquire(comm, st->sbuf, bytes,
					    FR_TP_LOCAL_READ, &st->smem);
			if (rc)
				return rc;
		}
		st->soff = (uintptr_t)st->sbuf - st->smem->base;
	}
	for (int s = 0; s < 4; s++)
		cur_norm(st, (enum stream)s);

	/* READY messages that arrived before we started. */
	if (comm->prev.have_ready) {
		struct fr_ctrl m;

		comm->prev.have_ready = false;
		fr_ctrl_decode(comm->prev.ready, &m);
		rc = apply_ready(comm, req, false, &m);
		if (rc)
			return rc;
	}
	if (comm->next.have_ready) {
		struct fr_ctrl m;

		comm->next.have_ready = false;
		fr_ctrl_decode(comm->next.ready, &m);
		rc = apply_ready(comm, req, true, &m);
		if (rc)
			return rc;
	}
	/* Segments that arrived before we started. */
	for (int i = 0; i < comm->n_rs_early; i++) {
		rc = on_rs(comm, comm->rs_early[i].payload,
			   comm->rs_early[i].len);
		if (rc)
			return rc;
	}
	comm->n_rs_early = 0;
	return 0;
}

void fr_ring_free(struct fr_request *req)
{
	struct fr_ring_state *st = req->ring;

	if (!st)
		return;
	if (st->smem)
		fr_mem_release(st->smem);
	if (st->rmem)
		fr_mem_release(st->rmem);
	free(st);
	req->ring = NULL;
}

bool fr_ring_done(const struct fr_request *req)
{
	const struct fr_ring_state *st = req->ring;

	return st && st->ready_prev && st->ready_next && cur_done(st, RS_SEND) &&
	       cur_done(st, RS_RECV) && cur_done(st, AG_SEND) &&
	       cur_done(st, AG_RECV) && req->comm->outstanding == 0;
}

const char *fr_ring_waiting_on(const struct fr_comm *comm,
			       const struct fr_request *req, int *peer)
{
	const struct fr_ring_state *st = req->ring;

	if (st && (!st->ready_next ||
		   (!cur_done(st, RS_SEND) && comm->credits == 0))) {
		*peer = comm->next.rank;
		return "next";
	}
	*peer = comm->prev.rank;
	return "prev";
}

/* ---- sending ------------------------------------------------------------------------ */

static int send_ready(struct fr_comm *comm, struct fr_request *req,
		      bool to_next)
{
	struct fr_ring_state *st = req->ring;
	struct fr_peer *peer = to_next ? &comm->next : &comm->prev;
	struct fr_ctrl m = { .type = FR_CTRL_READY, .seq = req->seq,
			     .count = req->count, .dtype = (uint8_t)req->dtype,
			     .op = (uint8_t)req->op };
	uint32_t slot = 0;
	int rc;

	if (!to_next)
		m.credits = (uint8_t)comm->credits_owed;
	/* The previous rank writes the all-gather into our recvbuf. */
	if (!to_next && st->rmem) {
		m.mem_id = st->rmem->id;
		m.dest_off = st->roff;
		slot = st->rmem->id % FR_RKEY_CACHE;
		if (peer->rkey_sent[slot] != st->rmem->id) {
			size_t kl = FR_TP_RKEY_MAX;

			rc = comm->tp_ops->pack_rkey(st->rmem->tp_mr, m.key,
						     &kl);
			if (rc)
				return rc;
			m.has_key = 1;
			m.keylen = (uint8_t)kl;
		}
	}
	rc = ctrl_send(comm, peer, to_next, &m);
	if (rc)
		return rc;
	comm->credits_owed -= to_next ? 0 : m.credits;
	if (m.has_key) {
		peer->rkey_sent[slot] = st->rmem->id;
		comm->stats.rkeys_sent++;
	}
	return 0;
}

int fr_ring_flush_credits(struct fr_comm *comm, bool *did_work)
{
	int rc;

	/*
	 * Few credits owed ride on our next READY to prev instead of a
	 * message of their own (small collectives then send one message
	 * less); prev still holds more than half its slots meanwhile, so
	 * it is never held up by them.
	 */
	if (!comm->credits_owed ||
	    comm->credits_owed < FR_MAX(comm->slots / 2, 1))
		return 0;
	rc = comm->tp_ops->write_imm(comm->prev.conn, NULL, 0, NULL, 0, 0,
				     FR_IMM(FR_IMM_CREDIT,
					    (uint32_t)comm->credits_owed),
				     0);
	if (rc)
		return rc;
	comm->credits_owed = 0;
	comm->outstanding++;
	comm->stats.writes++;
	*did_work = true;
	return 0;
}

static int post(struct fr_comm *comm, struct fr_mem *lmem, size_t loff,
		const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		uint32_t imm)
{
	int rc = comm->tp_ops->write_imm(comm->next.conn, lmem->tp_mr, loff,
					 rkey, roff, len, imm, 0);

	if (rc)
		return rc;
	comm->outstanding++;
	comm->stats.writes++;
	comm->stats.bytes_sent += len;
	return 0;
}

/* Reduce-scatter segments, in order, while the next rank has free slots. */
static int send_rs(struct fr_comm *comm, struct fr_ring_state *st,
		   bool *did_work)
{
	while (!cur_done(st, RS_SEND) && comm->credits > 0) {
		struct cursor *c = &st->cur[RS_SEND];
		uint32_t slot = (uint32_t)(comm->rs_sent % (uint64_t)comm->slots);
		uint32_t serial = (uint32_t)(comm->rs_sent & 0xfffff);
		struct fr_mem *src;
		size_t off, len, loff;
		int rc;

		if (c->k > 0 && !past(st, RS_RECV, c->k - 1, c->j))
			break; /* not reduced here yet */
		seg_range(st, RS_SEND, c, &off, &len);
		/* Step 0 sends our input; later steps what we reduced. */
		if (c->k == 0) {
			src = st->smem;
			loff = st->soff + off;
		} else {
			src = st->rmem;
			loff = st->roff + off;
		}
		rc = post(comm, src, loff, &comm->next_staging_rkey,
			  (uint64_t)slot * comm->segment_bytes, len,
			  FR_IMM(FR_IMM_RS, serial << 8 | slot));
		if (rc == FR_EAGAIN)
			break;
		if (rc)
			return rc;
		comm->credits--;
		comm->rs_sent++;
		cur_next(st, RS_SEND);
		*did_work = true;
	}
	return 0;
}

/* All-gather segments, in order, straight into the next rank's recvbuf. */
static int send_ag(struct fr_comm *comm, struct fr_ring_state *st,
		   bool *did_work)
{
	while (!cur_done(st, AG_SEND)) {
		struct cursor *c = &st->cur[AG_SEND];
		size_t off, len;
		int rc;

		if (c->k == 0 ? !past(st, RS_RECV, st->nsteps - 1, c->j) :
				!past(st, AG_RECV, c->k - 1, c->j))
			break;
		seg_range(st, AG_SEND, c, &off, &len);
		rc = post(comm, st->rmem, st->roff + off, st->dst,
			  st->dst_off + off, len,
			  FR_IMM(FR_IMM_AG, st->ag_sent));
		if (rc == FR_EAGAIN)
			break;
		if (rc)
			return rc;
		st->ag_sent++;
		cur_next(st, AG_SEND);
		*did_work = true;
	}
	return 0;
}

int fr_ring_advance(struct fr_comm *comm, struct fr_request *req,
		    bool *did_work)
{
	struct fr_ring_state *st = req->ring;
	int rc;

	if (!st->sent_ready_next) {
		rc = send_ready(comm, req, true);
		if (rc == FR_EAGAIN)
			return 0;
		if (rc)
			return rc;
		st->sent_ready_next = true;
		*did_work = true;
	}
	if (!st->sent_ready_prev) {
		rc = send_ready(comm, req, false);
		if (rc == FR_EAGAIN)
			return 0;
		if (rc)
			return rc;
		st->sent_ready_prev = true;
		*did_work = true;
	}
	/*
	 * Reduce-scatter segments go into the next rank's staging slots,
	 * which are its communicator's, not its user buffers: they may go
	 * before its READY (it keeps them until it starts).  The all-gather
	 * writes into its recvbuf and waits for the READY naming it.
	 */
	rc = send_rs(comm, st, did_work);
	if (!rc && st->ready_next)
		rc = send_ag(comm, st, did_work);
	return rc;
}

/* ---- receiving ------------------------------------------------------------------ */

static int apply_ready(struct fr_comm *comm, struct fr_request *req,
		       bool from_next, const struct fr_ctrl *m)
{
	struct fr_ring_state *st = req->ring;
	struct fr_peer *peer = from_next ? &comm->next : &comm->prev;

	if (m->count != req->count || m->dtype != req->dtype ||
	    m->op != req->op)
		return fr_comm_fail(
			comm, FR_EMISMATCH,
			"rank %d: collective #%u: rank %d (%s) called allreduce(count=%llu, %s, %s) but this rank allreduce(count=%zu, %s, %s)",
			comm->rank, req->seq, peer->rank,
			from_next ? "next" : "prev",
			(unsigned long long)m->count,
			fr_dtype_name((fr_dtype_t)m->dtype),
			fr_op_name((fr_op_t)m->op), req->count,
			fr_dtype_name(req->dtype), fr_op_name(req->op));
	if (!from_next) {
		st->ready_prev = true;
		return 0;
	}
	if (req->count) {
		uint32_t slot = m->mem_id % FR_RKEY_CACHE;

		if (peer->rkey_id[slot] != m->mem_id || !m->mem_id)
			return fr_comm_fail(
				comm, FR_EPROTO,
				"rank %d: rank %d named a receive buffer whose key it never sent",
				comm->rank, peer->rank);
		st->dst = &peer->rkey[slot];
		st->dst_off = m->dest_off;
	}
	st->ready_next = true;
	return 0;
}

static int on_ctrl(struct fr_comm *comm, struct fr_peer *peer, bool from_next,
		   uint32_t slot)
{
	const uint8_t *msg;
	struct fr_ctrl m;
	struct fr_request *req;

	if (slot != peer->ctrl_recv_seq % FR_CTRL_SLOTS)
		return fr_comm_fail(comm, FR_EPROTO,
				    "rank %d: control message from rank %d out of order",
				    comm->rank, peer->rank);
	peer->ctrl_recv_seq++;
	msg = comm->ctrl_in +
	      ((from_next ? 1 : 0) * FR_CTRL_SLOTS + slot) * FR_CTRL_MSG_SIZE;
	if (fr_ctrl_decode(msg, &m))
		return fr_comm_fail(comm, FR_EPROTO,
				    "rank %d: malformed control message from rank %d",
				    comm->rank, peer->rank);
	req = active_req(comm);
	if (m.type == FR_CTRL_ABORT) {
		int err = m.err < 0 && m.err >= FR_ERANGE ? m.err : FR_EPEER;
		char text[FR_ERRMSG_MAX];

		snprintf(text, sizeof(text),
			 "rank %d: aborted at collective #%u: rank %d failed first (%s), as reported by rank %d",
			 comm->rank, m.seq, m.origin, fr_strerror(err),
			 peer->rank);
		/*
		 * A neighbour that failed in a later collective than ours
		 * had finished ours: let it complete, fail at the next one.
		 */
		if (req ? m.seq > req->seq : m.seq >= comm->seq) {
			if (!comm->abort_pending) {
				comm->abort_pending = true;
				comm->abort_seq = m.seq;
				comm->abort_err = err;
				memcpy(comm->abort_msg, text, sizeof(text));
			}
			return 0;
		}
		return fr_comm_fail(comm, err, "%s", text);
	}
	/*
	 * BYE travels on one connection and may overtake the last segments
	 * of a finished collective on the other, so it is no error here: a
	 * neighbour that left mid-collective is caught by its closed
	 * connection or the timeout, and new collectives by fr_ring_start.
	 */
	if (m.type == FR_CTRL_BYE) {
		peer->bye = true;
		return 0;
	}
	/* Credits and keys count on arrival, whichever collective the
	 * READY is for. */
	if (m.credits) {
		comm->credits += m.credits;
		if (!from_next || comm->credits > comm->slots)
			return fr_comm_fail(comm, FR_EPROTO,
					    "rank %d: rank %d returned more staging credits than it had",
					    comm->rank, peer->rank);
	}
	if (m.has_key) {
		uint32_t ks = m.mem_id % FR_RKEY_CACHE;
		int rc;

		if (!from_next || !m.mem_id)
			return fr_comm_fail(comm, FR_EPROTO,
					    "rank %d: unexpected remote key from rank %d",
					    comm->rank, peer->rank);
		rc = comm->tp_ops->unpack_rkey(comm->tp, m.key, m.keylen,
					       &peer->rkey[ks]);
		if (rc)
			return fr_comm_fail(comm, rc,
					    "rank %d: bad remote key from rank %d",
					    comm->rank, peer->rank);
		peer->rkey_id[ks] = m.mem_id;
	}
	if (req && req->seq == m.seq)
		return apply_ready(comm, req, from_next, &m);
	/* A neighbour already in the next collective: keep it for then. */
	if (!peer->have_ready && m.seq == (req ? req->seq + 1 : comm->seq)) {
		memcpy(peer->ready, msg, FR_CTRL_MSG_SIZE);
		peer->have_ready = true;
		return 0;
	}
	return fr_comm_fail(comm, FR_EMISMATCH,
			    "rank %d: rank %d (%s) is at collective #%u, this rank at #%u: ranks started different numbers of collectives",
			    comm->rank, peer->rank, from_next ? "next" : "prev",
			    m.seq, req ? req->seq : comm->seq);
}

static int on_rs(struct fr_comm *comm, uint32_t payload, uint32_t len)
{
	struct fr_request *req = active_req(comm);
	struct fr_ring_state *st = req ? req->ring : NULL;
	uint32_t slot = (uint32_t)(comm->rs_received % (uint64_t)comm->slots);
	uint32_t serial = (uint32_t)(comm->rs_received & 0xfffff);
	size_t off, n;
	const uint8_t *in;
	struct cursor *c;

	/* For a collective we have not started: keep it until we do. */
	if ((!st || cur_done(st, RS_RECV)) &&
	    comm->n_rs_early < comm->slots) {
		comm->rs_early[comm->n_rs_early].payload = payload;
		comm->rs_early[comm->n_rs_early++].len = len;
		return 0;
	}
	if (!st || cur_done(st, RS_RECV) || !st->ready_prev ||
	    payload != (serial << 8 | slot))
		return fr_comm_fail(comm, FR_EPROTO,
				    "rank %d: unexpected reduce-scatter segment from rank %d",
				    comm->rank, comm->prev.rank);
	c = &st->cur[RS_RECV];
	seg_range(st, RS_RECV, c, &off, &n);
	if (len != n)
		return fr_comm_fail(comm, FR_EPROTO,
				    "rank %d: segment of %u bytes from rank %d, expected %zu",
				    comm->rank, len, comm->prev.rank, n);
	in = (const uint8_t *)comm->staging + (size_t)slot * comm->segment_bytes;
	st->kern(st->rbuf + off, in, st->sbuf + off, n / st->es);
	if (st->avg && c->k == st->nsteps - 1)
		fr_reduce_scale_avg(req->dtype, st->rbuf + off, n / st->es,
				    st->n);
	comm->rs_received++;
	comm->credits_owed++;
	cur_next(st, RS_RECV);
	return 0;
}

static int on_ag(struct fr_comm *comm, uint32_t payload, uint32_t len)
{
	struct fr_request *req = active_req(comm);
	struct fr_ring_state *st = req ? req->ring : NULL;
	size_t off, n;

	if (!st || cur_done(st, AG_RECV) ||
	    payload != (st->ag_recvd & 0x0fffffffu))
		return fr_comm_fail(comm, FR_EPROTO,
				    "rank %d: unexpected all-gather segment from rank %d",
				    comm->rank, comm->prev.rank);
	seg_range(st, AG_RECV, &st->cur[AG_RECV], &off, &n);
	if (len != n)
		return fr_comm_fail(comm, FR_EPROTO,
				    "rank %d: segment of %u bytes from rank %d, expected %zu",
				    comm->rank, len, comm->prev.rank, n);
	st->ag_recvd++;
	cur_next(st, AG_RECV);
	return 0;
}

/* One of our writes is done: its control outbox slot may be reused. */
static void send_done(struct fr_comm *comm, const struct fr_tp_cqe *cqe)
{
	comm->outstanding--;
	if (cqe->ctx & CTX_CTRL)
		comm->ctrl_out_busy &= ~(1u << (cqe->ctx & 31));
}

int fr_ring_on_cqe(struct fr_comm *comm, const struct fr_tp_cqe *cqe)
{
	bool from_next = cqe->conn == comm->next.conn;
	struct fr_peer *peer = from_next ? &comm->next : &comm->prev;
	uint32_t type = FR_IMM_TYPE(cqe->imm), payload = FR_IMM_PAYLOAD(cqe->imm);

	if (cqe->status && peer->bye && !active_req(comm))
		return 0; /* it said goodbye: closing now is expected */
	if (cqe->status) {
		const char *what =
			cqe->status == FR_EPEER ?
				"closed the connection or died" :
				cqe->status == FR_ERANGE ?
				(cqe->kind == FR_CQE_SEND ?
					 "refused our write (outside its registered memory)" :
					 "wrote outside our registered memory") :
				fr_strerror(cqe->status);

		return fr_comm_fail(comm,
				    cqe->status == FR_ERANGE ? FR_EPROTO :
							       FR_EPEER,
				    "rank %d: peer rank %d (%s) %s", comm->rank,
				    peer->rank, from_next ? "next" : "prev",
				    what);
	}
	if (cqe->kind == FR_CQE_SEND) {
		send_done(comm, cqe);
		return 0;
	}
	comm->stats.bytes_received += cqe->len;
	switch (type) {
	case FR_IMM_CTRL:
		if (cqe->len != FR_CTRL_MSG_SIZE || payload >= FR_CTRL_SLOTS)
			break;
		return on_ctrl(comm, peer, from_next, payload);
	case FR_IMM_CREDIT:
		if (!from_next)
			break;
		comm->credits += (int)payload;
		if (comm->credits > comm->slots)
			break;
		return 0;
	case FR_IMM_RS:
		if (from_next)
			break;
		return on_rs(comm, payload, cqe->len);
	case FR_IMM_AG:
		if (from_next)
			break;
		return on_ag(comm, payload, cqe->len);
	}
	return fr_comm_fail(comm, FR_EPROTO,
			    "rank %d: unexpected message (immediate 0x%08x) from rank %d",
			    comm->rank, cqe->imm, peer->rank);
}

/*
 * While the communicator is destroyed: count our SEND completions, note
 * BYE (or a closed connection) from each neighbour, and read and drop
 * everything else, so that no connection is closed with unread data.
 */
void fr_ring_goodbye_cqe(struct fr_comm *comm, const struct fr_tp_cqe *cqe)
{
	bool from_next = cqe->conn == comm->next.conn;
	struct fr_peer *peer = from_next ? &comm->next : &comm->prev;
	uint32_t slot = FR_IMM_PAYLOAD(cqe->imm);
	struct fr_ctrl m;

	if (cqe->kind == FR_CQE_SEND) {
		send_done(comm, cqe);
		if (cqe->status)
			peer->bye = true;
		return;
	}
	if (cqe->status) {
		peer->bye = true; /* gone: nothing more will come */
		return;
	}
	if (FR_IMM_TYPE(cqe->imm) != FR_IMM_CTRL || slot >= FR_CTRL_SLOTS)
		return;
	peer->ctrl_recv_seq++;
	if (!fr_ctrl_decode(comm->ctrl_in + ((from_next ? 1 : 0) * FR_CTRL_SLOTS +
					     slot) * FR_CTRL_MSG_SIZE,
			    &m) &&
	    m.type == FR_CTRL_BYE)
		peer->bye = true;
}

