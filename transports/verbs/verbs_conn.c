/* SPDX-License-Identifier: MIT */
/*
 * verbs_conn.c - a connection's objects and its queue pairs: the slot
 * and generation that wr_ids carry, the per-lane rings and buffers, the
 * room each QP takes in the shared CQ, creating the QPs (lane 0 through
 * rdma_cm, lanes 1.. by hand) and taking lanes 1.. to RTS, and failing,
 * stopping and releasing a connection (the hooks through which the
 * transport base, transports/common/tp_base.h, ends one: verbs_drop_id,
 * verbs_conn_release).  It calls nothing else of the transport: the
 * handshake (verbs_cm.c) and the data path (verbs_data.c) are built on
 * it.
 */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "fastreduce.h"
#include "log.h"
#include "util.h"
#include "verbs.h"

/* ---- small helpers ------------------------------------------------------- */

void verbs_sa_set_port(struct sockaddr_storage *sa, uint16_t port)
{
	if (sa->ss_family == AF_INET6)
		((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
	else
		((struct sockaddr_in *)sa)->sin_port = htons(port);
}

/* Before rdma_connect / rdma_accept: the QP's ACK timeout (see
 * VERBS_ACK_TIMEOUT).  A kernel that refuses the option keeps its own:
 * slower recovery from loss, nothing worse. */
void verbs_set_ack_timeout(struct fr_tp *tp, struct rdma_cm_id *id)
{
	uint8_t t = tp->opt.ack_timeout;

	if (t && rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT,
				 &t, sizeof(t)))
		fr_dbg("verbs: rank %d: RDMA_OPTION_ID_ACK_TIMEOUT %u: %s",
		       tp->b.rank, t, fr_syserr(errno));
}

/* The 12 bytes every reply starts with (fr_verbs.c, wire formats). */
void verbs_put_reply(uint8_t *b, int kind, int32_t value)
{
	fr_put_le32(b, VERBS_MAGIC);
	fr_put_le16(b + 4, VERBS_VERSION);
	fr_put_le16(b + 6, (uint16_t)kind);
	fr_put_le32(b + 8, (uint32_t)value);
}

/* Refuse a request; `status` 0 = without a reply (not our protocol). */
void verbs_refuse(struct rdma_cm_id *id, int status)
{
	uint8_t b[VERBS_REPLY_LEN];

	verbs_put_reply(b, VERBS_KIND_REJECT, status);
	if (rdma_reject(id, status ? b : NULL, status ? sizeof(b) : 0))
		fr_dbg("verbs: rdma_reject: %s", fr_syserr(errno));
	rdma_destroy_id(id);
}

/* A request's rank (hello and resume alike: rank, version, job nonce at
 * the same offsets), or the request refused and FR_E*. */
int verbs_hello_rank(struct fr_tp *tp, struct rdma_cm_id *id, const uint8_t *pd,
		     int *rank)
{
	int rc;

	*rank = (int32_t)fr_get_le32(pd + 8);
	rc = fr_tpb_hello_check(&tp->b, *rank, fr_get_le16(pd + 4),
				VERBS_VERSION, fr_get_le64(pd + 16));
	if (rc)
		verbs_refuse(id, rc);
	return rc;
}

uint16_t verbs_sa_port(const struct sockaddr_storage *sa)
{
	if (sa->ss_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
	return ntohs(((const struct sockaddr_in *)sa)->sin_port);
}

/*
 * strerror(), plus the likely cause of EACCES: librdmacm opens each device
 * once per process, and a child forked after that inherits the parent's
 * context, whose write()-based commands (rxe rings its send doorbell that
 * way) the kernel refuses to any other process.
 */
const char *verbs_strerror(int e, char *buf, size_t len)
{
	snprintf(
		buf, len, "%s%s", fr_syserr(e),
		e == EACCES
			? " (RDMA device contexts do not survive fork(): a child forked after its parent opened the device must exec a new program)"
			: "");
	return buf;
}

/* ---- connections: life cycle --------------------------------------------- */

static int verbs_slot_get(struct fr_tp *tp, struct fr_tp_conn *c)
{
	struct fr_tp_conn **slots;
	uint32_t *gens;
	uint32_t i, cap;

	for (i = 0; i < tp->nslots; i++)
		if (!tp->slots[i])
			break;
	if (i == tp->nslots) {
		if (tp->nslots >= VERBS_MAX_SLOTS)
			return FR_ENOMEM;
		cap = FR_MIN(tp->nslots ? tp->nslots * 2 : 16,
			     (uint32_t)VERBS_MAX_SLOTS);
		slots = realloc(tp->slots, cap * sizeof(*slots));
		if (!slots)
			return FR_ENOMEM;
		tp->slots = slots;
		gens = realloc(tp->slot_gen, cap * sizeof(*gens));
		if (!gens)
			return FR_ENOMEM;
		tp->slot_gen = gens;
		memset(slots + tp->nslots, 0,
		       (cap - tp->nslots) * sizeof(*slots));
		memset(gens + tp->nslots, 0,
		       (cap - tp->nslots) * sizeof(*gens));
		tp->nslots = cap;
	}
	/* A new generation per use: completions of the slot's previous
	 * connection, still in the CQ, never match the new one. */
	tp->slot_gen[i] = (tp->slot_gen[i] + 1) & 0x7fff;
	c->slot = i;
	c->gen = tp->slot_gen[i];
	tp->slots[i] = c;
	return 0;
}

struct fr_tp_conn *verbs_conn_new(struct fr_tp *tp)
{
	struct fr_tp_conn *c;
	size_t ctl_len = verbs_ctl_bytes(tp);
	unsigned int i;

	/* No send queue of the base's: the lanes keep their own rings. */
	c = fr_tpb_conn_new(tp, sizeof(*c), 0);
	if (!c)
		return NULL;
	c->sq_cap = tp->sq_cap;
	c->nqps = tp->opt.nqps;
	for (i = 0; i < tp->opt.nqps; i++) {
		c->lane[i].sq = calloc(tp->sq_cap, sizeof(*c->lane[i].sq));
		if (!c->lane[i].sq)
			goto err;
	}
	c->notes = calloc(tp->b.sq_depth, sizeof(*c->notes));
	c->held_cap = tp->rq_depth + VERBS_LL_LINES;
	c->held = calloc(c->held_cap, sizeof(*c->held));
	c->ctl = calloc(1, ctl_len);
	/* Messages not known to have arrived: at most a ring of lane 0
	 * and the notifications waiting. */
	c->log_cap = tp->sq_cap + tp->b.sq_depth;
	c->log = calloc(c->log_cap, sizeof(*c->log));
	if (!c->notes || !c->held || !c->ctl || !c->log)
		goto err;
	/* Notification payloads are sent from and received into it. */
	c->ctl_mr = ibv_reg_mr(tp->pd, c->ctl, ctl_len, IBV_ACCESS_LOCAL_WRITE);
	if (!c->ctl_mr || verbs_slot_get(tp, c))
		goto err;
	/* Our ring of the peer's polled lines and its words, which it
	 * writes; zero: no line is valid yet. */
	if (tp->opt.ll) {
		if (posix_memalign((void **)&c->ll, 4096, VERBS_LL_BYTES))
			goto err;
		memset(c->ll, 0, VERBS_LL_BYTES);
		c->ll_mr = ibv_reg_mr(tp->pd, c->ll, VERBS_LL_BYTES,
				      IBV_ACCESS_LOCAL_WRITE |
					      IBV_ACCESS_REMOTE_WRITE);
		if (!c->ll_mr)
			goto err;
	}
	/* Never 0 (a generation is 1..0x7fff): 0 is "not known". */
	c->cid = c->slot | c->gen << 16;
	return c;

err:
	fr_tpb_conn_destroy(c);
	return NULL;
}

/*
 * The class's conn_free (fr_tpb_conn_destroy, after verbs_drop_id): what
 * a connection holds beyond the base, not its struct.  Also for one that
 * verbs_conn_new() did not finish: its slot is freed only if it got one.
 */
void verbs_conn_release(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	unsigned int i;

	if (c->slot < tp->nslots && tp->slots[c->slot] == c)
		tp->slots[c->slot] = NULL;
	if (c->log)
		verbs_log_pop(c, c->msg_tail);
	if (c->ll_mr)
		ibv_dereg_mr(c->ll_mr);
	if (c->ctl_mr)
		ibv_dereg_mr(c->ctl_mr);
	free(c->ll);
	free(c->log);
	free(c->ctl);
	free(c->held);
	free(c->notes);
	for (i = 0; i < VERBS_MAX_QPS; i++)
		free(c->lane[i].sq);
}

/* The ring's writes no longer read their regions (the QP is gone). */
static void verbs_sq_release(struct fr_tp_conn *c, struct verbs_lane *l)
{
	uint64_t s;

	for (s = l->sq_head; s < l->sq_tail; s++) {
		struct verbs_sqe *e = &l->sq[s % c->sq_cap];

		if (e->mr) {
			e->mr->inflight--;
			e->mr = NULL;
		}
	}
	l->sq_head = l->sq_tail = 0;
	l->nwr = 0;
	l->unsignaled = 0;
	l->unsig_owed = 0;
}

/* Destroy lane i's QP; lane 0's belongs to the cm id. */
void verbs_drop_lane(struct fr_tp_conn *c, unsigned int i)
{
	struct fr_tp *tp = c->b.tp;
	struct verbs_lane *l = &c->lane[i];

	if (!l->qp)
		return;
	if (i || !c->id)
		ibv_destroy_qp(l->qp);
	else
		rdma_destroy_qp(c->id);
	l->qp = NULL;
	/* Its completions may still be in the CQ until we see it empty. */
	tp->cq_need -= l->cq_share;
	tp->cq_linger += l->cq_share;
	l->cq_share = 0;
	verbs_sq_release(c, l);
}

void verbs_drop_qp(struct fr_tp_conn *c)
{
	unsigned int i;

	for (i = 0; i < VERBS_MAX_QPS; i++)
		verbs_drop_lane(c, i);
	/* Nothing will post the notifications still waiting (the log
	 * fails their writes). */
	c->note_head = c->note_tail = 0;
	c->lanes_ready = false;
}

/* Destroy the QP and the cm id (the kernel drops the id's unread events);
 * the class's conn_down: fr_tpb_conn_destroy and fr_tpb_conn_free run it
 * first. */
void verbs_drop_id(struct fr_tp_conn *c)
{
	verbs_drop_qp(c);
	if (c->id) {
		rdma_destroy_id(c->id);
		c->id = NULL;
	}
	if (c->old_id) {
		rdma_destroy_id(c->old_id);
		c->old_id = NULL;
	}
	if (c->rs_req) {
		rdma_reject(c->rs_req, NULL, 0);
		rdma_destroy_id(c->rs_req);
		c->rs_req = NULL;
	}
}

/* Every QP of c to the error state, which flushes what was posted, without
 * telling the peer (a resume: rdma_disconnect() would be a close). */
void verbs_lanes_stop(struct fr_tp_conn *c)
{
	struct ibv_qp_attr a;
	unsigned int i;

	for (i = 0; i < c->nqps; i++) {
		if (!c->lane[i].qp)
			continue;
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_ERR;
		if (ibv_modify_qp(c->lane[i].qp, &a, IBV_QP_STATE))
			fr_dbg("verbs: rank %d: ibv_modify_qp to ERR (rank %d, QP %u): %s",
			       c->b.tp->b.rank, c->b.peer, i + 1,
			       fr_syserr(errno));
	}
	c->lanes_stopped = true;
	c->stop_ms = fr_now_ms();
}

/* A resume: the drained QPs go (the id stays, see verbs_resume.c); what
 * was in flight is in the log, the notifications with it. */
void verbs_drop_lanes(struct fr_tp_conn *c)
{
	unsigned int i;

	for (i = 0; i < VERBS_MAX_QPS; i++)
		verbs_drop_lane(c, i);
	c->note_head = c->note_tail;
	c->lanes_ready = false;
	c->rq_out = 0;
}

/*
 * The log's messages up to seq upto (exclusive) have reached the peer or
 * are given up: they leave it, and their regions are free to go (a
 * logged message keeps its region registered: dereg_mem says FR_EBUSY,
 * since a resume may send it again).
 */
void verbs_log_pop(struct fr_tp_conn *c, uint64_t upto)
{
	while (c->msg_head < upto) {
		struct verbs_msg *m = &c->log[c->msg_head % c->log_cap];

		if (m->mr) {
			m->mr->inflight--;
			m->mr = NULL;
		}
		c->msg_head++;
	}
}

struct fr_tp_conn *verbs_conn_by_cid(struct fr_tp *tp, uint32_t cid)
{
	uint32_t slot = cid & 0xffff;

	if (slot < tp->nslots && tp->slots[slot] && tp->slots[slot]->cid == cid)
		return tp->slots[slot];
	return NULL;
}

/*
 * Stop a QP that may have work in flight: rdma_disconnect() tells the peer
 * and moves the QP to the error state, and the error state flushes every
 * outstanding WR with a completion.  If neither can be done, nobody will
 * complete the ring: we do (synth).
 */
static void verbs_stop_qp(struct fr_tp_conn *c)
{
	struct ibv_qp_attr a;
	bool flushing = true;
	unsigned int i;

	c->stop_ms = fr_now_ms();
	/* rdma_disconnect() moves lane 0's QP to the error state. */
	if (c->id && !c->disconnected && !rdma_disconnect(c->id))
		c->disconnected = true;
	for (i = 0; i < c->nqps; i++) {
		if (!c->lane[i].qp) {
			/* A lane that never existed has nothing to flush. */
			if (!i)
				flushing = false;
			continue;
		}
		if (!i && c->disconnected)
			continue;
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_ERR;
		if (ibv_modify_qp(c->lane[i].qp, &a, IBV_QP_STATE))
			flushing = false;
	}
	/* A QP that will not flush: nobody completes the rings but us. */
	if (!flushing)
		c->synth = true;
}

/*
 * Fail a connection: remember why, owe the caller one error completion if
 * it was established and is theirs, and stop the QP.  A connection that
 * never came up has nothing in flight: its QP and id go at once.
 */
void verbs_conn_vfail(struct fr_tp_conn *c, int err, const char *fmt,
		      va_list ap)
{
	bool resuming = c->b.state == VERBS_RESUME;
	bool up = c->b.state == VERBS_UP || resuming;

	if (c->b.state == VERBS_FAILED)
		return;
	fr_tpb_conn_verr(c, err, up, fmt, ap);
	c->b.state = VERBS_FAILED;
	c->b.error = err;
	c->was_up = up;
	c->b.err_owed = up && c->b.owned;
	c->peer_gone = false;
	/* The log owes the writes their completions (verbs_log_fail). */
	c->note_head = c->note_tail;
	/* A resume has nothing in flight that the caller waits on: its QP
	 * and ids go at once, as do those of one that never came up. */
	if (up && !resuming)
		verbs_stop_qp(c);
	else
		verbs_drop_id(c);
}

void __attribute__((format(printf, 3, 4)))
verbs_conn_fail(struct fr_tp_conn *c, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	verbs_conn_vfail(c, err, fmt, ap);
	va_end(ap);
}

/* ---- memory in the CQ ---------------------------------------------------- */

/* Make room in the shared CQ for a QP of `need` entries. */
static int verbs_cq_reserve(struct fr_tp *tp, unsigned int need)
{
	unsigned long want = (unsigned long)tp->cq_need + tp->cq_linger + need;
	unsigned long size;

	if (want <= (unsigned long)tp->cq_size)
		return 0;
	size = FR_MAX(want, (unsigned long)tp->cq_size * 2);
	size = FR_MIN(size, (unsigned long)tp->max_cqe);
	if (size < want) {
		fr_tpb_seterr(
			&tp->b, FR_LOG_WARN,
			"the completion queue cannot grow to %lu entries (device limit %d): too many connections",
			want, tp->max_cqe);
		return FR_ENOMEM;
	}
	if (ibv_resize_cq(tp->cq, (int)size)) {
		fr_tpb_seterr(&tp->b, FR_LOG_WARN,
			      "ibv_resize_cq to %lu entries: %s", size,
			      fr_syserr(errno));
		return FR_ENOMEM;
	}
	tp->cq_size = tp->cq->cqe;
	return 0;
}

/* ---- queue pairs --------------------------------------------------------- */

/*
 * Post n receives on lane 0: each takes one write-with-immediate (no
 * bytes), one notification or one lanes-ready message (VERBS_CTL_LEN
 * bytes into its own slot of c->ctl).  Receives complete in the order
 * they were posted and at most rq_depth are posted, so slot rq_tail %
 * rq_depth is always free; wr_id carries it.
 */
int verbs_post_recvs(struct fr_tp_conn *c, unsigned int n)
{
	struct ibv_recv_wr wr[VERBS_RECV_BATCH], *bad;
	struct ibv_sge sge[VERBS_RECV_BATCH];
	unsigned int i, k, rq = c->b.tp->rq_depth;
	int rc;

	while (n) {
		k = FR_MIN(n, (unsigned int)VERBS_RECV_BATCH);
		memset(wr, 0, k * sizeof(wr[0]));
		for (i = 0; i < k; i++) {
			uint32_t idx = (c->rq_tail + i) % rq;

			sge[i].addr =
				(uint64_t)(uintptr_t)verbs_recv_buf(c, idx);
			sge[i].length = VERBS_CTL_LEN;
			sge[i].lkey = c->ctl_mr->lkey;
			wr[i].wr_id = verbs_wrid(c, true, idx);
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = 1;
			wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
		}
		/* ibv_post_* return the error; errno may be stale. */
		rc = ibv_post_recv(c->lane[0].qp, wr, &bad);
		if (rc)
			return rc;
		c->rq_out += k;
		c->rq_tail += k;
		n -= k;
	}
	return 0;
}

/*
 * Post a SEND of VERBS_CTL_LEN bytes (pl) on lane 0, signalled, outside the
 * data path's accounting of writes (lanes ready, a polled-lines key): the
 * ring must have room, which it has right after establishment.  0 or
 * FR_ESYS with a message.
 */
int verbs_post_ctl(struct fr_tp_conn *c, const uint8_t *pl, const char *what)
{
	struct verbs_lane *l0 = &c->lane[0];
	struct ibv_send_wr wr, *bad;
	struct verbs_sqe *e;
	struct ibv_sge sge;
	uint8_t *b = c->ctl + (size_t)(l0->sq_tail % c->sq_cap) * VERBS_CTL_LEN;
	int rc;

	if (l0->sq_tail - l0->sq_head >= c->sq_cap) {
		fr_tpb_seterr(&c->b.tp->b, FR_LOG_WARN,
			      "no room on the queue pair for the %s message",
			      what);
		return FR_ESYS;
	}
	memcpy(b, pl, VERBS_CTL_LEN);
	sge.addr = (uint64_t)(uintptr_t)b;
	sge.length = VERBS_CTL_LEN;
	sge.lkey = c->ctl_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = verbs_wrid(c, false, (uint32_t)l0->sq_tail);
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (l0->max_inline >= VERBS_CTL_LEN)
		wr.send_flags |= IBV_SEND_INLINE;
	rc = ibv_post_send(l0->qp, &wr, &bad);
	if (rc) {
		fr_tpb_seterr(&c->b.tp->b, FR_LOG_WARN,
			      "ibv_post_send (%s): %s", what, strerror(rc));
		return FR_ESYS;
	}
	e = &l0->sq[l0->sq_tail % c->sq_cap];
	memset(e, 0, sizeof(*e));
	e->kind = VERBS_SQE_PLAIN;
	l0->sq_tail++;
	l0->nwr++;
	return 0;
}

/*
 * Tell the peer where our ring of polled lines is (once, on a new
 * connection; none after a resume, and none with FR_IB_LL=0: the peer then
 * never sends us a line).  From now on we take lines.
 */
int verbs_ll_send_key(struct fr_tp_conn *c)
{
	uint8_t pl[VERBS_CTL_LEN];
	int rc;

	if (!c->ll_mr || c->ll_off)
		return 0;
	fr_put_le32(pl, VERBS_LLKEY_MAGIC);
	fr_put_le32(pl + 4, c->ll_mr->rkey);
	fr_put_le64(pl + 8, (uint64_t)(uintptr_t)c->ll);
	rc = verbs_post_ctl(c, pl, "polled lines key");
	if (!rc)
		c->ll_rx = true;
	return rc;
}

/* The PSN a hand-connected QP starts sending with: derived from its number,
 * so the peer's receive side knows it without another field. */
static uint32_t verbs_lane_psn(uint32_t qpn)
{
	return (qpn * 0x9e3779b1u) >> 8 & 0xffffff;
}

/*
 * Create lane i's RC QP on our PD and shared CQ, with its send and receive
 * depth reserved in the CQ and its ring empty.  Lane 0 is the cm id's QP:
 * rdma_create_qp() leaves it in INIT with rq_depth receives.  Lanes 1..
 * are plain QPs (ibv_create_qp(): RESET until verbs_lane_connect()) that
 * carry RDMA WRITEs only, with room for the one receive no message takes.
 * Inline data where the device allows it, else sends from registered
 * memory.
 */
static int verbs_rc_qp(struct fr_tp_conn *c, unsigned int i)
{
	struct fr_tp *tp = c->b.tp;
	struct verbs_lane *l = &c->lane[i];
	struct ibv_qp_init_attr attr;
	struct ibv_qp *qp;
	unsigned int rq = i ? 1 : tp->rq_depth, need = tp->sq_cap + rq;
	int rc, inl;

	rc = verbs_cq_reserve(tp, need);
	if (rc)
		return rc;
	for (inl = VERBS_MAX_INLINE;;
	     inl = inl == VERBS_MAX_INLINE ? VERBS_MIN_INLINE : 0) {
		memset(&attr, 0, sizeof(attr));
		attr.send_cq = tp->cq;
		attr.recv_cq = tp->cq;
		attr.qp_type = IBV_QPT_RC;
		attr.cap.max_send_wr = tp->sq_cap;
		attr.cap.max_recv_wr = rq;
		attr.cap.max_send_sge = 1;
		attr.cap.max_recv_sge = 1;
		attr.cap.max_inline_data = (uint32_t)inl;
		attr.sq_sig_all = 0;
		if (i)
			qp = ibv_create_qp(tp->pd, &attr);
		else
			qp = rdma_create_qp(c->id, tp->pd, &attr) ? NULL
								  : c->id->qp;
		if (qp)
			break;
		/* A device that cannot inline that much: ask less, then
		 * none (sends from registered memory). */
		if (!inl) {
			int e = errno;
			char why[192];

			verbs_strerror(e, why, sizeof(why));
			if (i)
				fr_tpb_seterr(&tp->b, FR_LOG_WARN,
					      "ibv_create_qp (QP %u of %u): %s",
					      i + 1, c->nqps, why);
			else
				fr_tpb_seterr(
					&tp->b, FR_LOG_WARN,
					"rdma_create_qp (%u send, %u receive WRs): %s",
					tp->sq_cap, tp->rq_depth, why);
			return e == ENOMEM ? FR_ENOMEM : FR_ESYS;
		}
	}
	l->qp = qp;
	l->max_inline = attr.cap.max_inline_data;
	l->cq_share = need;
	tp->cq_need += need;
	l->sq_head = l->sq_tail = 0;
	l->nwr = 0;
	l->unsignaled = 0;
	l->unsig_owed = 0;
	return 0;
}

/*
 * Take lane i to RTS against the peer's QP peer_qpn, with the path, MTU,
 * timeouts and access rights rdma_cm negotiated for lane 0 (the cm id
 * must have sent or received the request); only the QP numbers and PSNs
 * are the lane's own.
 */
int verbs_lane_connect(struct fr_tp_conn *c, unsigned int i, uint32_t peer_qpn)
{
	static const enum ibv_qp_state st[] = {IBV_QPS_INIT, IBV_QPS_RTR,
					       IBV_QPS_RTS};
	static const char *const name[] = {"INIT", "RTR", "RTS"};
	struct ibv_qp *qp = c->lane[i].qp;
	struct ibv_qp_attr a;
	unsigned int k;
	int mask, rc;

	for (k = 0; k < FR_ARRAY_SIZE(st); k++) {
		memset(&a, 0, sizeof(a));
		a.qp_state = st[k];
		if (rdma_init_qp_attr(c->id, &a, &mask)) {
			fr_tpb_seterr(&c->b.tp->b, FR_LOG_WARN,
				      "rdma_init_qp_attr (%s): %s", name[k],
				      fr_syserr(errno));
			return FR_ESYS;
		}
		if (st[k] == IBV_QPS_RTR) {
			a.dest_qp_num = peer_qpn;
			a.rq_psn = verbs_lane_psn(peer_qpn);
		} else if (st[k] == IBV_QPS_RTS) {
			a.sq_psn = verbs_lane_psn(qp->qp_num);
		}
		rc = ibv_modify_qp(qp, &a, mask);
		if (rc) {
			fr_tpb_seterr(&c->b.tp->b, FR_LOG_WARN,
				      "ibv_modify_qp of QP %u to %s: %s", i + 1,
				      name[k], strerror(rc));
			return FR_ESYS;
		}
		/*
		 * One receive that no message ever takes: a part that breaks
		 * our registration stops the QP, and only a posted receive
		 * (flushed then) lets us see it.  Possible from INIT on.
		 */
		if (st[k] == IBV_QPS_INIT) {
			struct ibv_recv_wr wr, *bad;

			memset(&wr, 0, sizeof(wr));
			wr.wr_id = verbs_wrid(c, true, 0);
			rc = ibv_post_recv(qp, &wr, &bad);
			if (rc) {
				fr_tpb_seterr(&c->b.tp->b, FR_LOG_WARN,
					      "ibv_post_recv on QP %u: %s",
					      i + 1, strerror(rc));
				return FR_ESYS;
			}
		}
	}
	return 0;
}

/*
 * Create the RC QP of c on our PD and shared CQ.  rdma_create_qp() leaves
 * it in INIT, where receives can be posted; rdma_connect/rdma_accept take
 * it to RTS.
 */
int verbs_qp_create(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	unsigned int i, held;
	int rc;

	if (c->id->verbs != tp->pd->context) {
		fr_tpb_seterr(
			&tp->b, FR_LOG_WARN,
			"connection with rank %d runs over device %s, not %s where our memory is registered",
			c->b.peer,
			c->id->verbs ? ibv_get_device_name(c->id->verbs->device)
				     : "?",
			ibv_get_device_name(tp->pd->context->device));
		return FR_ENODEV;
	}
	rc = verbs_rc_qp(c, 0);
	if (rc)
		return rc;
	/* A new generation per QP: completions of an earlier attempt's QP
	 * never match this one, even if its number is reused. */
	tp->slot_gen[c->slot] = (tp->slot_gen[c->slot] + 1) & 0x7fff;
	c->gen = tp->slot_gen[c->slot];
	c->note_head = c->note_tail = 0;
	c->lanes_ready = false;
	c->lanes_stopped = false;
	c->rq_tail = 0;
	c->rq_out = 0;
	/* After a resume, receives held for accept() keep their slots until
	 * handed out (then each is posted again); held lines took none. */
	held = c->held_count;
	for (i = 0; i < c->held_count; i++)
		held -= c->held[(c->held_head + i) % c->held_cap].line;
	rc = verbs_post_recvs(c, tp->rq_depth - held);
	if (rc) {
		fr_tpb_seterr(&tp->b, FR_LOG_WARN, "ibv_post_recv: %s",
			      strerror(rc));
		verbs_drop_qp(c);
		return FR_ESYS;
	}
	for (i = 1; i < c->nqps; i++) {
		rc = verbs_rc_qp(c, i);
		if (rc) {
			verbs_drop_qp(c);
			return rc;
		}
	}
	return 0;
}
