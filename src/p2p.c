/* SPDX-License-Identifier: MIT */
/*
 * p2p.c - point-to-point sends and receives, matched by (source, tag) in
 * the order they were posted and sent.
 *
 * Protocol, per message of `bytes` bytes from rank s to rank r:
 *   eager (bytes <= a mailbox slot's payload): one FR_MSG_P2P message
 *     carrying tag, count, type and the data; the send is complete once
 *     the message is written (the data was copied).
 *   rendezvous (larger): s sends FR_MSG_RTS (tag, count, type); when r has
 *     a matching receive it registers the receive buffer (or finds it
 *     registered: fr_mem_register makes that free) and answers FR_MSG_CTS
 *     with the buffer's key, offset and an id; s writes the whole buffer
 *     into it with one write-with-immediate (FR_IMM_P2P, the id) from its
 *     own registration - zero copy on both sides - and is complete when
 *     the write is; r is complete when the write lands.
 *   to itself: the data is copied, into the receive if one is posted,
 *     else into an unexpected message; the send is complete at once.
 * A message whose receive is not posted yet waits in the unexpected list
 * (an eager one as a copy, a rendezvous one as its RTS), so that the
 * mailbox slot goes back to the sender.  Messages travel in the mailboxes
 * with the collectives' (peer.c moves a collective's message out of the
 * way when a point-to-point one behind it is wanted, and back).
 *
 * Matching: a receive takes the oldest unexpected message of its source
 * and tag, else waits; an arriving message goes to the oldest posted
 * receive of its source and tag, else to the unexpected list.  A peer's
 * messages arrive in the order it sent them, so messages between a pair
 * with the same tag are received in order.  Sizes and types must agree:
 * a receive of another count or type than the message fails the
 * communicator with FR_EMISMATCH, as a collective's mismatch does.
 *
 * Requests are fr_request_t's, kept in their own list (comm->eng.p2p)
 * and finished out of order, independently of the collectives' queue.
 * A failure of the communicator finishes them with its error; while one
 * waits for a peer and no collective runs, the peer is PINGed and a peer
 * that answers nothing for the timeout fails it (fr_peers_watch_p2p).
 *
 * Layer: engine.  Calls the peers (messages, writes, liveness), the memory
 * layer (registrations, keys) and the base; called by request.c and the
 * entry points (sendrecv.c).
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "internal.h"
#include "log.h"
#include "mem.h"
#include "peer.h"
#include "util.h"

enum p2p_stage {
	P2P_SEND_EAGER, /* send: the message waits for a credit */
	P2P_SEND_RTS,	/* send: its RTS waits for a credit */
	P2P_WAIT_CTS,	/* send: RTS sent, waiting for the receiver */
	P2P_WRITING,	/* send: written, waiting for the completion */
	P2P_POSTED,	/* receive: no message yet */
	P2P_SEND_CTS,  /* receive: matched an RTS, its CTS waits for a credit */
	P2P_WAIT_DATA, /* receive: CTS sent, waiting for the write */
	P2P_DONE,
};

/* A message that arrived before its receive. */
struct fr_p2p_unexp {
	struct fr_p2p_unexp *next;
	int peer, tag;
	fr_dtype_t dtype;
	size_t count;
	uint32_t psn;
	bool rts;   /* a rendezvous' RTS: no data here */
	size_t len; /* bytes of data */
	uint8_t data[];
};

#define P2P_ID_MASK FR_IMM_PAYLOAD_MASK

static size_t req_bytes(const struct fr_request *req)
{
	return req->count * fr_dtype_size(req->dtype);
}

static void finish(struct fr_comm *comm, struct fr_request *req, int result)
{
	if (req->p2p.mem) {
		fr_mem_release(req->p2p.mem);
		req->p2p.mem = NULL;
	}
	req->p2p.stage = P2P_DONE;
	req->state = FR_REQ_DONE;
	req->result = result;
	fr_signal(comm);
}

static int mismatch(struct fr_comm *comm, struct fr_request *req, int src,
		    size_t count, fr_dtype_t dtype)
{
	return fr_comm_fail(
		comm, FR_EMISMATCH,
		"rank %d: point-to-point from rank %d, tag %d: it sent %zu elements of %s, the receive takes %zu of %s",
		comm->rank, src, req->p2p.tag, count, fr_dtype_name(dtype),
		req->count, fr_dtype_name(req->dtype));
}

/* The oldest posted receive for (src, tag), or NULL. */
static struct fr_request *posted(struct fr_comm *comm, int src, int tag)
{
	for (struct fr_request *q = comm->eng.p2p; q; q = q->p2p.next)
		if (!q->p2p.send && q->p2p.stage == P2P_POSTED &&
		    q->p2p.peer == src && q->p2p.tag == tag)
			return q;
	return NULL;
}

/* A receive met its rendezvous message: register, then the CTS. */
static int accept_rts(struct fr_comm *comm, struct fr_request *req,
		      uint32_t psn)
{
	const int access = FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE;
	int rc = fr_mem_acquire(comm, req->recvbuf, req_bytes(req), access,
				&req->p2p.mem);

	if (rc)
		return fr_comm_fail(
			comm, rc,
			"rank %d: point-to-point from rank %d: cannot register the receive buffer: %s",
			comm->rank, req->p2p.peer, fr_strerror(rc));
	req->p2p.moff = (uintptr_t)req->recvbuf - req->p2p.mem->base;
	req->p2p.psn = psn;
	req->p2p.id = comm->eng.p2p_id++ & P2P_ID_MASK;
	req->p2p.stage = P2P_SEND_CTS;
	return 0;
}

/* An unexpected message (or a local send) meets its receive. */
static int take(struct fr_comm *comm, struct fr_request *req,
		struct fr_p2p_unexp *u)
{
	if (u->count != req->count || u->dtype != req->dtype)
		return mismatch(comm, req, u->peer, u->count, u->dtype);
	if (u->rts)
		return accept_rts(comm, req, u->psn);
	if (u->len)
		memcpy(req->recvbuf, u->data, u->len);
	finish(comm, req, 0);
	return 0;
}

/* A message without its receive yet: rts, or len bytes of data. */
static struct fr_p2p_unexp *unexp_new(struct fr_comm *comm, int peer, int tag,
				      fr_dtype_t dtype, size_t count,
				      uint32_t psn, bool rts, const void *data,
				      size_t len)
{
	struct fr_p2p_unexp *u = malloc(sizeof(*u) + len);

	if (!u) {
		fr_comm_fail(
			comm, FR_ENOMEM,
			"rank %d: out of memory keeping a message of rank %d",
			comm->rank, peer);
		return NULL;
	}
	u->next = NULL;
	u->peer = peer;
	u->tag = tag;
	u->dtype = dtype;
	u->count = count;
	u->psn = psn;
	u->rts = rts;
	u->len = rts ? 0 : len;
	if (!rts && len)
		memcpy(u->data, data, len);
	if (comm->eng.unexp_tail)
		comm->eng.unexp_tail->next = u;
	else
		comm->eng.unexp = u;
	comm->eng.unexp_tail = u;
	return u;
}

/* Take the oldest unexpected message of (peer, tag) off the list. */
static struct fr_p2p_unexp *unexp_take(struct fr_comm *comm, int peer, int tag)
{
	struct fr_p2p_unexp **pp = &comm->eng.unexp, *prev = NULL;

	for (; *pp; prev = *pp, pp = &(*pp)->next) {
		struct fr_p2p_unexp *u = *pp;

		if (u->peer != peer || u->tag != tag)
			continue;
		*pp = u->next;
		if (comm->eng.unexp_tail == u)
			comm->eng.unexp_tail = prev;
		return u;
	}
	return NULL;
}

/* ---- arriving messages ----------------------------------------------------
 */

static int on_p2p_msg(struct fr_comm *comm, int src, const struct fr_msg *m,
		      const uint8_t *payload)
{
	int tag = (int)m->aux;
	fr_dtype_t dtype = (fr_dtype_t)m->dtype;
	size_t es = fr_dtype_size(dtype);
	struct fr_request *req;

	if (m->type == FR_MSG_CTS) {
		struct fr_tp_rkey key;
		int rc;

		for (req = comm->eng.p2p; req; req = req->p2p.next)
			if (req->p2p.send && req->p2p.stage == P2P_WAIT_CTS &&
			    req->p2p.peer == src && req->p2p.psn == m->seq)
				break;
		if (!req)
			return fr_comm_fail(
				comm, FR_EPROTO,
				"rank %d: rank %d answered a send of ours that is not waiting (number %u)",
				comm->rank, src, m->seq);
		rc = fr_mem_unpack_key(comm, payload, m->len, &key);
		if (!rc)
			rc = fr_peer_write(comm, src, req->p2p.mem,
					   req->p2p.moff, &key, m->offset,
					   req_bytes(req),
					   FR_IMM(FR_IMM_P2P, m->aux), true);
		if (rc)
			return fr_comm_fail(
				comm, rc,
				"rank %d: point-to-point to rank %d: writing %zu bytes: %s",
				comm->rank, src, req_bytes(req),
				fr_strerror(rc));
		req->p2p.stage = P2P_WRITING;
		return 0;
	}
	if (!es || tag < 0 || m->count > SIZE_MAX / es ||
	    (m->type == FR_MSG_P2P && m->len != m->count * es))
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: malformed point-to-point message from rank %d",
			comm->rank, src);
	req = posted(comm, src, tag);
	if (!req)
		return unexp_new(comm, src, tag, dtype, (size_t)m->count,
				 m->seq, m->type == FR_MSG_RTS, payload, m->len)
			       ? 0
			       : comm->fail.failed;
	if (m->count != req->count || dtype != req->dtype)
		return mismatch(comm, req, src, (size_t)m->count, dtype);
	if (m->type == FR_MSG_RTS)
		return accept_rts(comm, req, m->seq);
	if (m->len)
		memcpy(req->recvbuf, payload, m->len);
	finish(comm, req, 0);
	return 0;
}

static int take_messages(struct fr_comm *comm, bool *did_work)
{
	for (struct fr_peer *p = comm->peer.active; p && comm->peer.p2p_unread;
	     p = p->next_active) {
		const struct fr_msg *m;
		const uint8_t *payload;

		while (p->p2p_unread &&
		       !fr_msg_p2p_next(comm, fr_peer_rank(&comm->peer, p), &m,
					&payload)) {
			int rc = on_p2p_msg(comm, fr_peer_rank(&comm->peer, p),
					    m, payload);

			fr_msg_p2p_consume(comm, fr_peer_rank(&comm->peer, p));
			*did_work = true;
			if (rc)
				return rc;
		}
		if (comm->fail.failed)
			return comm->fail.failed;
	}
	return 0;
}

/* ---- posting ---------------------------------------------------------- */

/* An earlier send to the same peer has not gone yet: keep the order. */
static bool behind(const struct fr_comm *comm, const struct fr_request *req)
{
	for (const struct fr_request *q = comm->eng.p2p; q && q != req;
	     q = q->p2p.next)
		if (q->p2p.peer == req->p2p.peer && q->p2p.send &&
		    (q->p2p.stage == P2P_SEND_EAGER ||
		     q->p2p.stage == P2P_SEND_RTS))
			return true;
	return false;
}

static void msg_for(const struct fr_request *req, uint8_t type,
		    struct fr_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->dtype = (uint8_t)req->dtype;
	m->count = req->count;
	m->seq = req->p2p.psn;
	m->aux = (uint32_t)req->p2p.tag;
	m->root = -1;
}

static int post(struct fr_comm *comm, struct fr_request *req, bool *did_work)
{
	struct fr_msg m;
	uint8_t key[FR_TP_RKEY_MAX];
	size_t klen = sizeof(key);
	int rc;

	switch (req->p2p.stage) {
	case P2P_SEND_EAGER:
	case P2P_SEND_RTS:
		if (behind(comm, req))
			return 0;
		rc = fr_peer_need_p2p(comm, req->p2p.peer);
		if (rc == FR_EAGAIN)
			return 0;
		if (rc)
			break;
		if (req->p2p.stage == P2P_SEND_EAGER) {
			msg_for(req, FR_MSG_P2P, &m);
			rc = fr_msg_send(comm, req->p2p.peer, &m, req->sendbuf,
					 req_bytes(req));
		} else {
			msg_for(req, FR_MSG_RTS, &m);
			rc = fr_msg_send(comm, req->p2p.peer, &m, NULL, 0);
		}
		break;
	case P2P_SEND_CTS:
		rc = fr_peer_need_p2p(comm, req->p2p.peer);
		if (rc == FR_EAGAIN)
			return 0;
		if (!rc)
			rc = fr_mem_pack_key(req->p2p.mem, key, &klen);
		if (rc)
			break;
		msg_for(req, FR_MSG_CTS, &m);
		m.aux = req->p2p.id;
		m.offset = req->p2p.moff;
		rc = fr_msg_send(comm, req->p2p.peer, &m, key, klen);
		break;
	case P2P_WRITING:
		/* our writes from user memory are all complete */
		if (comm->peer.user_outstanding == 0) {
			finish(comm, req, 0);
			*did_work = true;
		}
		return 0;
	default:
		return 0;
	}
	if (rc == FR_EAGAIN)
		return 0;
	if (rc)
		return fr_comm_fail(comm, rc,
				    "rank %d: point-to-point with rank %d: %s",
				    comm->rank, req->p2p.peer, fr_strerror(rc));
	*did_work = true;
	if (req->p2p.stage == P2P_SEND_EAGER)
		finish(comm, req, 0);
	else
		req->p2p.stage = req->p2p.stage == P2P_SEND_RTS ? P2P_WAIT_CTS
								: P2P_WAIT_DATA;
	return 0;
}

int fr_p2p_progress(struct fr_comm *comm, bool *did_work)
{
	int rc = 0;

	if (comm->peer.p2p_unread)
		rc = take_messages(comm, did_work);
	for (struct fr_request *q = comm->eng.p2p; q && !rc; q = q->p2p.next)
		if (q->state != FR_REQ_DONE)
			rc = post(comm, q, did_work);
	return rc;
}

int fr_p2p_on_cqe(struct fr_comm *comm, int peer, uint32_t imm, uint32_t len)
{
	uint32_t id = FR_IMM_PAYLOAD(imm);

	for (struct fr_request *q = comm->eng.p2p; q; q = q->p2p.next)
		if (!q->p2p.send && q->p2p.stage == P2P_WAIT_DATA &&
		    q->p2p.peer == peer && q->p2p.id == id) {
			if (len != req_bytes(q))
				return fr_comm_fail(
					comm, FR_EPROTO,
					"rank %d: point-to-point from rank %d: %u bytes written, %zu expected",
					comm->rank, peer, len, req_bytes(q));
			finish(comm, q, 0);
			return 0;
		}
	return fr_comm_fail(
		comm, FR_EPROTO,
		"rank %d: rank %d wrote into a receive that does not wait for it (id %u)",
		comm->rank, peer, id);
}

/* ---- requests -------------------------------------------------------------
 */

int fr_p2p_submit(struct fr_comm *comm, bool send, void *buf, size_t count,
		  fr_dtype_t dtype, int peer, int tag, fr_request_t **out)
{
	struct fr_request *req = calloc(1, sizeof(*req));
	struct fr_p2p_unexp *u;
	bool work = false;
	int rc = 0;

	if (!req)
		return FR_ENOMEM;
	req->comm = comm;
	req->state = FR_REQ_ACTIVE;
	req->count = count;
	req->dtype = dtype;
	req->root = peer;
	req->p2p.on = true;
	req->p2p.send = send;
	req->p2p.peer = peer;
	req->p2p.tag = tag;
	if (send)
		req->sendbuf = buf;
	else
		req->recvbuf = buf;
	if (comm->eng.p2p_tail)
		comm->eng.p2p_tail->p2p.next = req;
	else
		comm->eng.p2p = req;
	comm->eng.p2p_tail = req;
	*out = req;

	if (send && peer == comm->rank) {
		/* to ourselves: a copy, now */
		struct fr_request *r = posted(comm, peer, tag);

		if (!r && !unexp_new(comm, peer, tag, dtype, count, 0, false,
				     buf, req_bytes(req)))
			rc = comm->fail.failed;
		else if (r && (count != r->count || dtype != r->dtype))
			rc = mismatch(comm, r, peer, count, dtype);
		else if (r && req_bytes(req))
			memcpy(r->recvbuf, buf, req_bytes(req));
		if (r && !rc)
			finish(comm, r, 0);
		if (rc)
			goto failed;
		finish(comm, req, 0);
		return 0;
	}
	if (send) {
		req->p2p.psn = comm->eng.p2p_psn++;
		req->p2p.stage = P2P_SEND_EAGER;
		if (req_bytes(req) > fr_msg_payload_max(comm)) {
			rc = fr_mem_acquire(comm, buf, req_bytes(req),
					    FR_TP_LOCAL_READ, &req->p2p.mem);
			if (rc) {
				rc = fr_comm_fail(
					comm, rc,
					"rank %d: point-to-point to rank %d: cannot register the send buffer: %s",
					comm->rank, peer, fr_strerror(rc));
				goto failed;
			}
			req->p2p.moff = (uintptr_t)buf - req->p2p.mem->base;
			req->p2p.stage = P2P_SEND_RTS;
		}
	} else {
		req->p2p.stage = P2P_POSTED;
		u = unexp_take(comm, peer, tag);
		if (u) {
			rc = take(comm, req, u);
			free(u);
			if (rc)
				goto failed;
		}
		if (req->state == FR_REQ_DONE)
			return 0;
	}
	if (peer != comm->rank)
		(void)fr_peer_need_p2p(comm, peer);
	/* the first message goes out now, as a collective's does; a failure
	 * here is the communicator's, and the request reports it */
	(void)post(comm, req, &work);
	return 0;

failed:
	fr_p2p_unlink(req);
	free(req);
	*out = NULL;
	return rc;
}

int fr_p2p_waiting_on(const struct fr_comm *comm)
{
	for (const struct fr_request *q = comm->eng.p2p; q; q = q->p2p.next)
		if (q->state != FR_REQ_DONE && q->p2p.peer != comm->rank)
			return q->p2p.peer;
	return -1;
}

void fr_p2p_fail_all(struct fr_comm *comm)
{
	for (struct fr_request *q = comm->eng.p2p; q; q = q->p2p.next)
		if (q->state != FR_REQ_DONE)
			finish(comm, q, comm->fail.failed);
}

void fr_p2p_unlink(struct fr_request *req)
{
	struct fr_comm *comm = req->comm;
	struct fr_request **pp = &comm->eng.p2p, *prev = NULL;

	for (; *pp && *pp != req; pp = &(*pp)->p2p.next)
		prev = *pp;
	if (*pp)
		*pp = req->p2p.next;
	if (comm->eng.p2p_tail == req)
		comm->eng.p2p_tail = prev;
	if (req->p2p.mem) {
		fr_mem_release(req->p2p.mem);
		req->p2p.mem = NULL;
	}
}

void fr_p2p_abandon(struct fr_comm *comm)
{
	while (comm->eng.p2p) {
		struct fr_request *q = comm->eng.p2p;

		fr_p2p_unlink(q);
		free(q);
	}
	while (comm->eng.unexp) {
		struct fr_p2p_unexp *u = comm->eng.unexp;

		comm->eng.unexp = u->next;
		free(u);
	}
	comm->eng.unexp_tail = NULL;
}
