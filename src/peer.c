/* SPDX-License-Identifier: MIT */
/*
 * peer.c - peers connected on first use, and the mailbox message layer.
 *
 * Connections: every rank learned every other rank's transport address at
 * the rendezvous.  The first time an algorithm needs rank q, the lower rank
 * of the pair connects and the higher one accepts (the transport parks an
 * incoming connection until it is accepted), so each pair shares one
 * connection used in both directions, and only pairs that ever talk are
 * connected: a ring job opens its two neighbour connections and no others.
 * The connections are views of the job's shared endpoint
 * (transports/share), whose link between two processes either side may
 * open: a peer that has written to us before we need it (it reached a
 * collective's step with us first) is accepted as soon as it arrives, by
 * whoever drives progress, so that its PINGs get answered.
 *
 * Mailbox wire format: rank p writes into our mailbox at
 *   [p][slot][mbx_slot_size], slot < mbx_slots (data, one credit each),
 *   slot mbx_slots (ABORT, at most once, and once more to supersede it
 *   with a revoke: safe because a failed communicator's fail_text and
 *   fail_seq never change, so both have the same length), mbx_slots + 1
 *   (BYE, once), mbx_slots + 2 + ch (CTRL, channel ch < FR_CTRL_CHANNELS:
 *   recovery's, agree.c, each new one overwriting the last; aux carries a
 *   checksum of the payload, so that one read while the next lands, which
 *   RDMA allows, is seen torn and skipped: the next one's completion
 *   follows),
 * a 64-byte little-endian header followed by the payload:
 *    0 u32 magic "FRM1"   4 u8 type   5 u8 coll   6 u8 algo   7 u8 dtype
 *    8 u8 op   9 u8 0    10 u16 step  12 u32 seq  16 u64 count
 *   24 i32 root          28 u32 credits returned  32 u64 offset
 *   40 u32 payload len   44 i32 err   48 i32 origin  52 u32 aux
 * The immediate names the slot, so the receiver can check order; writes on
 * one connection land in order, so slot k is always the next one expected.
 *
 * Small messages (the low-latency path): a DATA or READY message whose
 * payload fits FR_TP_INLINE_MAX with a 16-byte header instead of 64, and
 * whose fields fit it (offset 0, aux 0, count < 2^16, root < 255), goes
 * by the transport's write_inline where it has one: from the caller's
 * stack, no outbox slot, no SEND completion, and on shm header, data and
 * the slot's sequence word in one cache line that the receiver polls.
 * Same slot, same credit, same order as any other message:
 *    0 u8 0xc1 (never the first byte of "FRM1")   1 u8 type << 4 | credits
 *    2 u8 coll   3 u8 algo   4 u8 dtype   5 u8 op   6 u8 payload len
 *    7 u8 root + 1   8 u16 step   10 u16 count   12 u32 seq
 * FR_LL=0 turns it off (every message then takes the 64-byte header).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "peer.h"
#include "util.h"

#define MSG_MAGIC 0x314d5246u	  /* "FRM1" */
#define MSG_COMPACT_MAGIC 0xc1u	  /* first byte of a small message */
#define CTX_OUT (1ull << 63)	  /* SEND ctx of an outbox message: | slot */
#define CTX_USER FR_TP_CTX_USER	  /* SEND ctx of a write from user memory */
#define CTX_LIVE (1ull << 61)	  /* SEND ctx of a PING or PONG */
/* PONG payload: level << 12 | collectives started (low 12 bits) */
#define LIVE_SEQ_MASK 0xfffu /* collectives started, low bits */
#define LIVE_LEVEL_SHIFT 12  /* 0, or waiting for a late rank at that level */
#define LIVE_LEVEL_MAX 0xffu

/*
 * p said goodbye after it had started the collective that runs here: it
 * has finished (or abandoned) its part and left, which is no failure of
 * ours by itself.  What it sent is still read; writes to it wait; if ours
 * needs more from it, or needs it to take ours, it is the rank ours waits
 * on and fr_peers_check_gone fails ours at once.  (A ring's prev at the
 * last step, a tree's parent once all came down, a reduce's child that
 * sent all: ranks finish a collective at different times, and one that
 * fails at its next call leaves at once.)
 */
static bool left_after_ours(const struct fr_comm *c, const struct fr_peer *p)
{
	return p->bye && c->peer.in_coll &&
	       (int32_t)(p->bye_seq - (c->peer.seq - 1)) > 0;
}

int fr_comm_fail(struct fr_comm *comm, int err, const char *fmt, ...)
{
	va_list ap;

	if (comm->fail.failed)
		return comm->fail
			.failed; /* keep the first, root-cause message */
	va_start(ap, fmt);
	vsnprintf(comm->errmsg, sizeof(comm->errmsg), fmt, ap);
	va_end(ap);
	fr_comm_errmsg_tag(comm);
	comm->fail.failed = err;
	/* every unfinished collective fails, from the active one on: later
	 * ABORTs must name it, not the next free number */
	comm->fail.fail_seq =
		comm->peer.in_coll ? comm->peer.seq - 1 : comm->peer.seq;
	if (comm->fail.fail_origin < 0) {
		comm->fail.fail_code = err;
		memcpy(comm->fail.fail_text, comm->errmsg,
		       sizeof(comm->fail.fail_text));
	}
	fr_err("%s", comm->errmsg);
	/* Tell the peers, so that the failure travels to every rank; an
	 * ABORT we relay keeps the rank that failed first. */
	fr_peers_send_abort(comm, err,
			    comm->fail.fail_origin >= 0 ? comm->fail.fail_origin
							: comm->rank);
	return err;
}

/* ---- collectives as the peers see them ---------------------------------- */

int fr_peers_coll_begin(struct fr_comm *c, uint32_t *seq)
{
	*seq = c->peer.seq++;
	c->peer.in_coll = true;
	c->peer.last_activity_ms = fr_coarse_ms();
	/* an ABORT for this collective (or an earlier one) arrived while an
	 * earlier one ran: it fails now */
	if (c->fail.abort_pending && (int32_t)(*seq - c->fail.abort_seq) >= 0) {
		c->fail.fail_origin = c->fail.abort_origin;
		return fr_comm_fail(c, c->fail.abort_err, "%s",
				    c->fail.abort_msg);
	}
	return 0;
}

void fr_peers_coll_end(struct fr_comm *c)
{
	c->peer.in_coll = false;
}

void fr_msg_encode(const struct fr_msg *m, uint8_t *b)
{
	memset(b, 0, FR_MSG_HDR);
	fr_put_le32(b, MSG_MAGIC);
	b[4] = m->type;
	b[5] = m->coll;
	b[6] = m->algo;
	b[7] = m->dtype;
	b[8] = m->op;
	fr_put_le16(b + 10, m->step);
	fr_put_le32(b + 12, m->seq);
	fr_put_le64(b + 16, m->count);
	fr_put_le32(b + 24, (uint32_t)m->root);
	fr_put_le32(b + 28, m->credits);
	fr_put_le64(b + 32, m->offset);
	fr_put_le32(b + 40, m->len);
	fr_put_le32(b + 44, (uint32_t)m->err);
	fr_put_le32(b + 48, (uint32_t)m->origin);
	fr_put_le32(b + 52, m->aux);
}

bool fr_msg_encode_compact(const struct fr_msg *m, const void *payload,
			   size_t len, uint8_t *b)
{
	if ((m->type != FR_MSG_DATA && m->type != FR_MSG_READY) ||
	    len > FR_MSG_COMPACT_MAX || m->offset || m->aux ||
	    m->count > UINT16_MAX || m->root < -1 || m->root > 254 ||
	    m->credits > 15 || m->err || m->origin)
		return false;
	b[0] = MSG_COMPACT_MAGIC;
	b[1] = (uint8_t)(m->type << 4 | m->credits);
	b[2] = m->coll;
	b[3] = m->algo;
	b[4] = m->dtype;
	b[5] = m->op;
	b[6] = (uint8_t)len;
	b[7] = (uint8_t)(m->root + 1);
	fr_put_le16(b + 8, m->step);
	fr_put_le16(b + 10, (uint16_t)m->count);
	fr_put_le32(b + 12, m->seq);
	if (len)
		memcpy(b + FR_MSG_COMPACT, payload, len);
	return true;
}

static int msg_decode_compact(const uint8_t *b, size_t maxlen, struct fr_msg *m)
{
	m->hdr = FR_MSG_COMPACT;
	m->type = b[1] >> 4;
	m->credits = b[1] & 15u;
	m->coll = b[2];
	m->algo = b[3];
	m->dtype = b[4];
	m->op = b[5];
	m->len = b[6];
	m->root = (int32_t)b[7] - 1;
	m->step = fr_get_le16(b + 8);
	m->count = fr_get_le16(b + 10);
	m->seq = fr_get_le32(b + 12);
	if ((m->type != FR_MSG_DATA && m->type != FR_MSG_READY) ||
	    m->len > FR_MSG_COMPACT_MAX || m->len > maxlen)
		return FR_EPROTO;
	return 0;
}

int fr_msg_decode(const uint8_t *b, size_t maxlen, struct fr_msg *m)
{
	memset(m, 0, sizeof(*m));
	if (b[0] == MSG_COMPACT_MAGIC)
		return msg_decode_compact(b, maxlen, m);
	if (fr_get_le32(b) != MSG_MAGIC)
		return FR_EPROTO;
	m->hdr = FR_MSG_HDR;
	m->type = b[4];
	m->coll = b[5];
	m->algo = b[6];
	m->dtype = b[7];
	m->op = b[8];
	m->step = fr_get_le16(b + 10);
	m->seq = fr_get_le32(b + 12);
	m->count = fr_get_le64(b + 16);
	m->root = (int32_t)fr_get_le32(b + 24);
	m->credits = fr_get_le32(b + 28);
	m->offset = fr_get_le64(b + 32);
	m->len = fr_get_le32(b + 40);
	m->err = (int32_t)fr_get_le32(b + 44);
	m->origin = (int32_t)fr_get_le32(b + 48);
	m->aux = fr_get_le32(b + 52);
	if (m->type < FR_MSG_DATA || m->type > FR_MSG_TYPE_MAX ||
	    m->len > maxlen)
		return FR_EPROTO;
	return 0;
}

size_t fr_msg_payload_max(const struct fr_comm *comm)
{
	return comm->peer.mbx_slot_size - FR_MSG_HDR;
}

/* A sender's row of a mailbox: its data slots, ABORT and BYE (full
 * size), then its CTRL slots (small). */
static size_t mbx_row(const struct fr_comm *c)
{
	return (size_t)(c->peer.mbx_slots + 2) * c->peer.mbx_slot_size +
	       FR_CTRL_CHANNELS * c->peer.ctrl_size;
}

/* Where slot (data, ABORT, BYE, or mbx_slots + 2 + channel: CTRL) of
 * sender from's row is. */
static size_t mbx_off(const struct fr_comm *c, int from, uint32_t slot)
{
	size_t row = (size_t)from * mbx_row(c);

	if (slot < (uint32_t)c->peer.mbx_slots + 2)
		return row + slot * c->peer.mbx_slot_size;
	return row + (size_t)(c->peer.mbx_slots + 2) * c->peer.mbx_slot_size +
	       (slot - (uint32_t)c->peer.mbx_slots - 2) * c->peer.ctrl_size;
}

/* Where in rank's mailbox our slot rslot is. */
static uint64_t mbx_roff(const struct fr_comm *c, uint32_t rslot)
{
	return mbx_off(c, c->rank, rslot);
}

static uint8_t *mbx_slot(struct fr_comm *comm, int from, int slot)
{
	return comm->peer.mbx + mbx_off(comm, from, (uint32_t)slot);
}

/* ---- setup ------------------------------------------------------------------
 */

/*
 * The mailbox and the outbox are mapped, not allocated and cleared: fresh
 * anonymous pages read as zero.  A communicator made by fr_comm_create
 * maps them populated, so that no collective takes a page fault on them
 * (in a VM a fault costs microseconds, and the first collectives of a
 * 64-rank job on 2 CPUs took 10 ms longer without it); a split's mailbox,
 * sized for its parent before the group is known (split.c), is not: its
 * rows that no member writes must cost nothing, and a split of 64 ranks
 * that faulted in 3 MB a rank took 270 ms where it now takes 30.  Nor is
 * the mailbox of a job of more than FR_POPULATE_MAX_RANKS ranks: up to
 * 32 MiB a rank, so n^2 bytes on a host that runs them all (512 ranks on
 * one host mapped 16 GiB, 1,024 would not fit in 24), where each rank
 * writes only to the few peers its algorithms name.  RDMA registration
 * pins them all anyway.
 */
#define FR_POPULATE_MAX_RANKS 128

int fr_peers_alloc(struct fr_comm *c)
{
	c->peer.mbx_rkeys =
		calloc((size_t)c->nranks, sizeof(*c->peer.mbx_rkeys));
	c->peer.peers = fr_pages_new((size_t)c->nranks * sizeof(*c->peer.peers),
				     false, &c->peer.peers_len);
	if (!c->peer.mbx_rkeys || !c->peer.peers) {
		fr_peers_free(c);
		return FR_ENOMEM;
	}
	return 0;
}

void fr_peers_free(struct fr_comm *c)
{
	fr_pages_free(c->peer.peers, c->peer.peers_len);
	free(c->peer.mbx_rkeys);
	c->peer.peers = NULL;
	c->peer.mbx_rkeys = NULL;
}

/* The keys traded with one peer, direct-mapped by registration id (ids
 * start at 1: 0 is none). */
struct fr_peer_keys {
	/* ids of our registrations whose key it has */
	uint32_t sent[FR_RKEY_CACHE];
	/* its registrations' keys we have */
	uint32_t id[FR_RKEY_CACHE];
	struct fr_tp_rkey rkey[FR_RKEY_CACHE];
};

/* rank's key caches, made (all ids 0: none known) on first use; NULL
 * without memory. */
static struct fr_peer_keys *peer_keys(struct fr_comm *c, int rank)
{
	struct fr_peer *p = &c->peer.peers[rank];

	if (!p->keys)
		p->keys = calloc(1, sizeof(*p->keys));
	return p->keys;
}

int fr_peer_key_offer(struct fr_comm *comm, int rank, const struct fr_mem *mem,
		      void *key, size_t *keylen)
{
	struct fr_peer_keys *k = peer_keys(comm, rank);
	int rc;

	if (!k)
		return FR_ENOMEM;
	if (k->sent[mem->id % FR_RKEY_CACHE] == mem->id) {
		*keylen = 0;
		return 0;
	}
	rc = fr_mem_pack_key(mem, key, keylen);
	return rc ? rc : 1;
}

void fr_peer_key_sent(struct fr_comm *comm, int rank, const struct fr_mem *mem)
{
	struct fr_peer_keys *k = comm->peer.peers[rank].keys;

	/* (offered first: k was made there) */
	k->sent[mem->id % FR_RKEY_CACHE] = mem->id;
	comm->stats.rkeys_sent++;
}

int fr_peer_key_learn(struct fr_comm *comm, int rank, uint32_t id,
		      const void *key, size_t keylen,
		      const struct fr_tp_rkey **out)
{
	struct fr_peer_keys *k = peer_keys(comm, rank);
	uint32_t slot = id % FR_RKEY_CACHE;

	if (!k)
		return FR_ENOMEM;
	if (!id)
		return FR_EINVAL;
	if (key) {
		struct fr_tp_rkey r;

		/* (a bad key leaves what was held) */
		if (fr_mem_unpack_key(comm, key, keylen, &r))
			return FR_EINVAL;
		k->rkey[slot] = r;
		k->id[slot] = id;
	}
	if (!out)
		return 0;
	if (k->id[slot] != id)
		return FR_EPROTO;
	*out = &k->rkey[slot];
	return 0;
}

int fr_peers_mailbox(struct fr_comm *c, int rows, bool populate)
{
	size_t sz;
	int rc;

	sz = (size_t)rows * mbx_row(c);
	c->peer.mbx = fr_pages_new(sz, populate, &c->peer.mbx_len);
	if (!c->peer.mbx)
		return FR_ENOMEM;
	rc = fr_mem_register_internal(c, c->peer.mbx, sz,
				      FR_TP_LOCAL_READ | FR_TP_REMOTE_WRITE,
				      false, &c->peer.mbx_mem);
	if (rc)
		goto err_mbx_reg;
	sz = (size_t)c->peer.out_slots * c->peer.mbx_slot_size;
	c->peer.out = fr_pages_new(sz, populate, &c->peer.out_len);
	if (!c->peer.out) {
		rc = FR_ENOMEM;
		goto err_out;
	}
	rc = fr_mem_register_internal(c, c->peer.out, sz, FR_TP_LOCAL_READ,
				      false, &c->peer.out_mem);
	if (rc)
		goto err_out_reg;
	return 0;

err_out_reg:
	fr_pages_free(c->peer.out, c->peer.out_len);
	c->peer.out = NULL;
err_out:
	fr_mem_free_internal(c->peer.mbx_mem);
	c->peer.mbx_mem = NULL;
err_mbx_reg:
	fr_pages_free(c->peer.mbx, c->peer.mbx_len);
	c->peer.mbx = NULL;
	return rc;
}

int fr_peers_init(struct fr_comm *c)
{
	int rc = fr_peers_alloc(c);

	if (rc)
		return rc;
	rc = fr_peers_mailbox(c, c->nranks, c->nranks <= FR_POPULATE_MAX_RANKS);
	if (rc)
		fr_peers_free(c);
	return rc;
}

void fr_peers_fini(struct fr_comm *c)
{
	if (c->peer.peers)
		for (int r = 0; r < c->nranks; r++) {
			struct fr_peer *p = &c->peer.peers[r];

			while (p->stash) {
				struct fr_stashed *s = p->stash;

				p->stash = s->next;
				free(s);
			}
			for (int ch = 0; ch < FR_CTRL_CHANNELS; ch++)
				free(p->ctrl[ch]);
			free(p->keys);
		}
	if (c->peer.peers)
		for (struct fr_peer *p = c->peer.active; p; p = p->next_active)
			if (p->conn)
				c->tp_ops->close_conn(p->conn);
	c->peer.active = NULL;
	/* a region the transport keeps registered keeps its pages until the
	 * endpoint closes: a late write may still land there */
	fr_mem_free_buf(c->peer.out_mem, c->peer.out, c->peer.out_len,
			fr_release_pages);
	fr_mem_free_buf(c->peer.mbx_mem, c->peer.mbx, c->peer.mbx_len,
			fr_release_pages);
	fr_peers_free(c);
	c->peer.out_mem = c->peer.mbx_mem = NULL;
	c->peer.out = c->peer.mbx = NULL;
}

int fr_peers_pack_card_key(struct fr_comm *c, void *blob, size_t *len)
{
	return fr_mem_pack_key(c->peer.mbx_mem, blob, len);
}

/* ---- connections -----------------------------------------------------------
 */

/* The transport's own account of a system call that failed (rc
 * FR_ESYS: which call, which limit), with its closing parenthesis, or
 * NULL. */
static const char *tp_why(struct fr_comm *c, int rc)
{
	static _Thread_local char buf[FR_ERRMSG_MAX / 2];
	const char *e = c->tp_ops->last_error && rc == FR_ESYS
				? c->tp_ops->last_error(c->tp)
				: NULL;

	if (!e || !*e)
		return NULL;
	snprintf(buf, sizeof(buf), "%s)", e);
	return buf;
}

/* The transport's most recent error message if it is about rank (a failed
 * connection: the HCA's status text, the socket's error), else NULL. */
static const char *tp_about(struct fr_comm *c, int rank)
{
	const char *e =
		c->tp_ops->last_error ? c->tp_ops->last_error(c->tp) : NULL;
	char key[24];
	size_t kl;

	if (!e || !*e)
		return NULL;
	kl = (size_t)snprintf(key, sizeof(key), "rank %d", rank);
	for (const char *s = e; (s = strstr(s, key)); s += kl)
		if (s[kl] < '0' || s[kl] > '9')
			return e;
	return NULL;
}

static int peer_advance(struct fr_comm *c, struct fr_peer *p)
{
	const struct fr_tp_ops *o = c->tp_ops;
	int rc;

	if (!p->conn) {
		rc = o->accept(c->tp, fr_peer_rank(&c->peer, p), &p->conn);
		if (rc == FR_EAGAIN)
			return rc;
		if (rc)
			goto failed;
	}
	rc = o->connect_done(p->conn);
	if (rc == FR_EAGAIN)
		return rc;
	if (rc)
		goto failed;
	p->state = FR_PEER_UP;
	p->credits = c->peer.mbx_slots;
	fr_dbg("rank %d: connected to rank %d", c->rank,
	       fr_peer_rank(&c->peer, p));
	return 0;

failed:
	p->state = FR_PEER_DOWN;
	if (rc != FR_ERANGE)
		fr_peers_mark_dead(c, fr_peer_rank(&c->peer, p));
	/* a write outside our registered memory that came before we accepted
	 * the connection: the protocol error the completion path reports */
	if (rc == FR_ERANGE)
		return fr_comm_fail(
			c, FR_EPROTO,
			"rank %d: peer rank %d wrote outside our registered memory",
			c->rank, fr_peer_rank(&c->peer, p));
	return fr_comm_fail(
		c, rc, "rank %d: %s rank %d failed: %s%s%s", c->rank,
		c->rank < fr_peer_rank(&c->peer, p) ? "connecting to"
						    : "accepting",
		fr_peer_rank(&c->peer, p), fr_strerror(rc),
		tp_why(c, rc) ? " (" : "", tp_why(c, rc) ? tp_why(c, rc) : "");
}

static int peer_need(struct fr_comm *c, int rank, bool coll)
{
	struct fr_peer *p = &c->peer.peers[rank];
	int rc;

	switch (p->state) {
	case FR_PEER_UP:
		return 0;
	case FR_PEER_DOWN:
		if (c->fail.failed)
			return c->fail.failed;
		/* left after starting ours (a collective's step, not
		 * point-to-point): see left_after_ours */
		if (coll && left_after_ours(c, p))
			return 0;
		return fr_comm_fail(
			c, FR_EPEER, "rank %d: rank %d %s", c->rank, rank,
			p->bye ? "has destroyed its communicator" : "is gone");
	case FR_PEER_IDLE:
		if (rank == c->rank)
			return fr_comm_fail(
				c, FR_EPROTO,
				"rank %d: an algorithm asked for a connection to itself",
				c->rank);
		/* The lower rank of a pair connects, the higher accepts.
		 * No address: a communicator talks through its view of the
		 * shared endpoint (comm.c), which has them all and connects
		 * by rank. */
		if (c->rank < rank) {
			rc = c->tp_ops->connect(c->tp, rank, NULL, 0, &p->conn);
			if (rc) {
				p->state = FR_PEER_DOWN;
				fr_peers_mark_dead(c, rank);
				return fr_comm_fail(
					c, rc,
					"rank %d: connecting to rank %d failed: %s%s%s",
					c->rank, rank, fr_strerror(rc),
					tp_why(c, rc) ? " (" : "",
					tp_why(c, rc) ? tp_why(c, rc) : "");
			}
		}
		p->state = FR_PEER_CONNECTING;
		p->next_active = c->peer.active;
		c->peer.active = p;
		c->peer.last_activity_ms = fr_coarse_ms();
		/* fall through */
	case FR_PEER_CONNECTING:
		return peer_advance(c, p);
	}
	return FR_EPROTO;
}

int fr_peer_need(struct fr_comm *c, int rank)
{
	return peer_need(c, rank, true);
}

int fr_peer_need_p2p(struct fr_comm *c, int rank)
{
	return peer_need(c, rank, false);
}

/*
 * Slow or dead.  A rank that waits on a peer for a while PINGs it (an
 * immediate-only write, every quarter of the timeout, at most every second)
 * and the peer's progress machinery - its application's next call into the
 * library, or its progress thread - answers with a PONG that says how many
 * collectives it has started and whether it is itself waiting, patiently,
 * for a late rank.  Neither counts as progress of a collective.  So the
 * waiter knows, when the timeout comes:
 *   - no fresh PONG: dead, hung or unreachable: FR_ETIMEDOUT at the timeout,
 *     as before (a closed connection still fails at once);
 *   - alive and in the collective, but silent: FR_ETIMEDOUT at the timeout;
 *   - alive but not yet in the collective (a checkpoint, a slow data
 *     loader), or in the same collective and waiting for such a rank
 *     itself: patience until FR_SLOW_TIMEOUT_MS, then FR_ETIMEDOUT saying
 *     so.
 * A rank that starts waiting patiently tells all its peers at once with an
 * unsolicited PONG, so the patience spreads along a ring in round trips,
 * not in ping intervals.
 *
 * Patience must end at a rank that really is late, never go round in a
 * circle: two ranks that each wait patiently because the other does would
 * wait for nothing until FR_SLOW_TIMEOUT_MS (a lost message, or a peer
 * that died while a neighbour was late).  So the PONG carries a level: 1
 * for a rank that waits on one that has not entered the collective, k + 1
 * for one that waits on a rank at level k.  A chain of distinct ranks is at
 * most nranks - 1 long, so a higher level can only come from a circle and
 * counts as not late; a circle's levels climb by one a round trip until
 * they get there.  And a peer that has gone on to a later collective is
 * not late for ours, whatever it waits for now (it may well wait for us):
 * what we wait on from it was sent, or lost, and the timeout applies.
 */
static int live_send_on(struct fr_comm *c, struct fr_tp_conn *conn,
			uint32_t imm)
{
	int rc = c->tp_ops->write_imm(conn, NULL, 0, NULL, 0, 0, imm, CTX_LIVE);

	if (rc)
		return rc;
	c->peer.outstanding++;
	c->stats.writes++;
	return 0;
}

static int live_send(struct fr_comm *c, struct fr_peer *p, uint32_t imm)
{
	if (p->state != FR_PEER_UP)
		return FR_EAGAIN;
	return live_send_on(c, p->conn, imm);
}

/* A PONG from p: what it says, and when. */
static void note_pong(struct fr_peer *p, uint32_t imm)
{
	p->pong_ms = fr_coarse_ms();
	p->pong_started = FR_IMM_PAYLOAD(imm) & LIVE_SEQ_MASK;
	p->pong_level = (uint16_t)(FR_IMM_PAYLOAD(imm) >> LIVE_LEVEL_SHIFT);
}

static uint32_t pong_imm(const struct fr_comm *c)
{
	return FR_IMM(FR_IMM_PONG,
		      (uint32_t)c->peer.late_level << LIVE_LEVEL_SHIFT |
			      (c->peer.seq & LIVE_SEQ_MASK));
}

static int ping_interval_ms(const struct fr_comm *c)
{
	return FR_MAX(FR_MIN(c->peer.timeout_ms / 4, 1000), 10);
}

/* Take the connections that wait for us (transport's pending op): over
 * the shared endpoint, a peer that has written to us, whichever rank is
 * lower. */
static void accept_pending(struct fr_comm *c, bool *did_work)
{
	int q[32], n;

	if (!c->tp_ops->pending)
		return;
	n = c->tp_ops->pending(c->tp, q, 32);
	for (int i = 0; i < n; i++) {
		struct fr_peer *p;

		if (q[i] < 0 || q[i] >= c->nranks || q[i] == c->rank)
			continue;
		p = &c->peer.peers[q[i]];
		/* its data connection: as fr_peer_need would */
		if (p->state != FR_PEER_IDLE)
			continue;
		p->state = FR_PEER_CONNECTING;
		p->next_active = c->peer.active;
		c->peer.active = p;
		if (!peer_advance(c, p))
			*did_work = true;
	}
}

/* A failed communicator takes no new connections, unless in recovery
 * (fr_peers_recovery_progress). */
static void accept_early(struct fr_comm *c, bool *did_work)
{
	if (!c->fail.failed)
		accept_pending(c, did_work);
}

/* Liveness: a completion that only says a peer is alive (a PING, a PONG,
 * the send of one) is no progress of a collective. */
static bool cqe_is_liveness(const struct fr_tp_cqe *cqe)
{
	if (cqe->kind == FR_CQE_SEND)
		return (cqe->ctx & CTX_LIVE) != 0;
	return !cqe->status && (FR_IMM_TYPE(cqe->imm) == FR_IMM_PING ||
				FR_IMM_TYPE(cqe->imm) == FR_IMM_PONG);
}

/* PING the peer we wait on now and then; afterwards, what its PONGs say:
 * 1 alive but late (not in our collective, or itself waiting for a late
 * rank), 0 alive and in it, -1 no fresh answer. */
static int liveness(struct fr_comm *c, int rank, uint32_t seq, uint64_t idle_ms,
		    unsigned int *level)
{
	struct fr_peer *p = &c->peer.peers[rank];
	uint64_t now = fr_coarse_ms(), every = (uint64_t)ping_interval_ms(c);
	uint32_t d;

	if (p->state != FR_PEER_UP) {
		return -1;
	} else if (idle_ms >= every && now - p->ping_ms >= every &&
		   !live_send(c, p, FR_IMM(FR_IMM_PING, 0))) {
		p->ping_ms = now;
	}
	/* an answer to one of the last few PINGs, not an old one */
	if (!p->pong_ms || now - p->pong_ms > 3 * every)
		return -1;
	/* has it started collective #seq?  (started counts them, mod 2^12) */
	d = (p->pong_started - (seq & LIVE_SEQ_MASK)) & LIVE_SEQ_MASK;
	if (d == 0 || d > LIVE_SEQ_MASK / 2) {
		*level = 1;
		return 1;
	}
	/* in ours, waiting for a late rank itself, not through a circle */
	if (d == 1 && p->pong_level &&
	    p->pong_level + 1 < FR_MIN(c->nranks, (int)LIVE_LEVEL_MAX)) {
		*level = p->pong_level + 1u;
		return 1;
	}
	return 0;
}

/* We just started waiting for a late rank: tell everyone connected. */
static void announce_late(struct fr_comm *c)
{
	for (struct fr_peer *p = c->peer.active; p; p = p->next_active)
		if (live_send(c, p, pong_imm(c)) == FR_EAGAIN &&
		    p->state == FR_PEER_UP)
			p->pong_owed = true;
}

/*
 * Turn a silent neighbour into an error once the timeout has passed, or,
 * if it answers PINGs but has not entered the collective (or waits for a
 * rank that has not), once FR_SLOW_TIMEOUT_MS has (peer.c, "Slow or dead").
 */
int fr_peers_watch(struct fr_comm *comm, const struct fr_request *req, int peer)
{
	uint64_t idle = fr_coarse_since(comm->peer.last_activity_ms);
	unsigned int level = 0;
	const char *name;
	int lv = -1;

	if (!req) {
		comm->peer.late_level = 0;
		return 0;
	}
	if (peer >= 0 && peer < comm->nranks && peer != comm->rank)
		lv = liveness(comm, peer, req->seq, idle, &level);
	if (lv == 1 && !comm->peer.late_level) {
		comm->peer.late_level = (uint16_t)level;
		fr_dbg("rank %d: collective #%u: rank %d is alive but late%s: waiting patiently",
		       comm->rank, req->seq, peer,
		       level > 1 ? " (it waits itself)" : "");
		announce_late(comm);
	} else if (lv == 1) {
		comm->peer.late_level = (uint16_t)level;
	} else if (comm->peer.late_level) {
		fr_dbg("rank %d: collective #%u: rank %d %s", comm->rank,
		       req->seq, peer,
		       lv ? "stopped answering" : "is no longer late");
		/* the late rank has arrived (or stopped answering): it gets a
		 * whole timeout from now to send, as a rank that was never
		 * late does, not the rest of one that ran out meanwhile (its
		 * data may first need a connection to us) */
		comm->peer.late_level = 0;
		comm->peer.last_activity_ms = fr_coarse_ms();
		return 0;
	}
	if (idle < (uint64_t)comm->peer.timeout_ms ||
	    (lv == 1 && idle < (uint64_t)comm->peer.slow_timeout_ms))
		return 0;
	name = fr_coll_name(req->coll);
	if (lv == 1 && level > 1)
		fr_comm_fail(
			comm, FR_ETIMEDOUT,
			"rank %d: collective #%u (%s): rank %d is alive but itself waits for a rank that has not entered collective #%u after %.0f s (FR_SLOW_TIMEOUT_MS=%ld)",
			comm->rank, req->seq, name, peer, req->seq,
			(double)idle / 1000, comm->peer.slow_timeout_ms);
	else if (lv == 1)
		fr_comm_fail(
			comm, FR_ETIMEDOUT,
			"rank %d: rank %d is alive but has not entered collective #%u (%s) after %.0f s (FR_SLOW_TIMEOUT_MS=%ld)",
			comm->rank, peer, req->seq, name, (double)idle / 1000,
			comm->peer.slow_timeout_ms);
	else if (lv == 0)
		fr_comm_fail(
			comm, FR_ETIMEDOUT,
			"rank %d: collective #%u (%s): rank %d is alive and in it but sent nothing for %llu ms",
			comm->rank, req->seq, name, peer,
			(unsigned long long)idle);
	else if (peer >= 0 && (fr_peers_mark_dead(comm, peer), true))
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
	return FR_ETIMEDOUT;
}

int fr_peers_watch_p2p(struct fr_comm *comm, int peer)
{
	uint64_t idle = fr_coarse_since(comm->peer.last_activity_ms);
	unsigned int level = 0;

	if (peer < 0 || peer >= comm->nranks || peer == comm->rank)
		return 0;
	/* it answers PINGs: alive, and free to send when it likes */
	if (liveness(comm, peer, comm->peer.seq, idle, &level) >= 0 ||
	    idle < (uint64_t)comm->peer.timeout_ms)
		return 0;
	fr_peers_mark_dead(comm, peer);
	return fr_comm_fail(
		comm, FR_ETIMEDOUT,
		"rank %d: point-to-point with rank %d: no progress for %llu ms and rank %d does not answer (dead, hung, unreachable, or busy outside the library without a progress thread)",
		comm->rank, peer, (unsigned long long)idle, peer);
}

/*
 * A peer we wait on said goodbye and left nothing unread (or closed, and
 * what it left is nothing we take): it will never send what we wait for,
 * so fail now instead of at the timeout.  Not while
 * writes of ours are in flight: then we may be waiting for those (a peer
 * that has all our data may well have left), and they complete or fail
 * on their own.
 */
int fr_peers_check_gone(struct fr_comm *comm, const struct fr_request *req,
			int peer)
{
	struct fr_peer *p;

	if (comm->peer.outstanding > 0)
		return 0;
	if (peer < 0 || peer >= comm->nranks || peer == comm->rank)
		return 0;
	p = &comm->peer.peers[peer];
	/* messages of its still unread: ours may yet take them, unless it
	 * has closed and this step (an idle one) took none: then they are
	 * not ours (a collective called with other arguments) */
	if (!p->bye ||
	    (p->recv_taken != p->recv_arrived && p->state != FR_PEER_DOWN))
		return 0;
	if (comm->fail.abort_pending && !comm->fail.failed) {
		/* the job failed elsewhere (its ABORT waits for our collective
		 * to end): the peer left because of it, and ours cannot end
		 * without it; report the failure itself, as when a peer's
		 * connection closes */
		comm->fail.fail_origin = comm->fail.abort_origin;
		return fr_comm_fail(comm, comm->fail.abort_err, "%s",
				    comm->fail.abort_msg);
	}
	fr_comm_fail(
		comm, FR_EPEER,
		"rank %d: collective #%u (%s): rank %d has destroyed its communicator",
		comm->rank, req->seq, fr_coll_name(req->coll), peer);
	return FR_EPEER;
}

/* Return credits to peers we owe half their slots or more. */
int fr_peers_progress(struct fr_comm *c, bool *did_work)
{
	accept_early(c, did_work);
	if (c->fail.failed)
		return c->fail.failed;
	for (struct fr_peer *p = c->peer.active; p; p = p->next_active) {
		int rc;

		if (p->pong_owed && !live_send(c, p, pong_imm(c)))
			p->pong_owed = false;

		if (p->state == FR_PEER_CONNECTING) {
			rc = peer_advance(c, p);
			if (rc && rc != FR_EAGAIN)
				return rc;
			if (!rc)
				*did_work = true;
			continue;
		}
		if (p->state != FR_PEER_UP ||
		    p->credits_owed < FR_MAX(c->peer.mbx_slots / 2, 1))
			continue;
		rc = c->tp_ops->write_imm(
			p->conn, NULL, 0, NULL, 0, 0,
			FR_IMM(FR_IMM_CREDIT, (uint32_t)p->credits_owed), 0);
		if (rc == FR_EAGAIN)
			continue;
		if (rc == FR_EPEER && left_after_ours(c, p)) {
			p->state = FR_PEER_DOWN; /* it needs none any more */
			continue;
		}
		if (rc)
			return fr_comm_fail(
				c, rc,
				"rank %d: returning credits to rank %d: %s",
				c->rank, fr_peer_rank(&c->peer, p),
				fr_strerror(rc));
		p->credits_owed = 0;
		c->peer.outstanding++;
		c->stats.writes++;
		*did_work = true;
	}
	return 0;
}

/* ---- sending ---------------------------------------------------------------
 */

/*
 * A write the transport refused at once (not FR_EAGAIN): the connection
 * failed before its failed completion was polled (a verbs QP in the error
 * state does this).  Fail here, naming the peer, rather than leave the
 * caller a bare code.
 */
static int link_failed(struct fr_comm *c, struct fr_peer *p, int rc,
		       const char *what)
{
	const char *why = tp_about(c, fr_peer_rank(&c->peer, p));

	if (rc == FR_EAGAIN)
		return rc;
	if (rc == FR_EPEER) {
		p->state = FR_PEER_DOWN;
		fr_peers_mark_dead(c, fr_peer_rank(&c->peer, p));
		/* closed before its closing was polled: as there */
		if (left_after_ours(c, p))
			return FR_EAGAIN;
	}
	return fr_comm_fail(c, rc == FR_ERANGE ? FR_EPROTO : rc,
			    "rank %d: %s rank %d failed: %s%s%s%s", c->rank,
			    what, fr_peer_rank(&c->peer, p), fr_strerror(rc),
			    why ? " (" : "", why ? why : "", why ? ")" : "");
}

static int write_failed(struct fr_comm *c, struct fr_peer *p, int rc)
{
	return link_failed(c, p, rc, "writing to");
}

int fr_peer_write(struct fr_comm *c, int rank, struct fr_mem *lmem, size_t loff,
		  const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		  uint32_t imm, bool user)
{
	struct fr_peer *p = &c->peer.peers[rank];
	int rc;

	if (p->state != FR_PEER_UP)
		return FR_EAGAIN;
	rc = c->tp_ops->write_imm(p->conn, lmem ? lmem->tp_mr : NULL, loff,
				  rkey, roff, len, imm, user ? CTX_USER : 0);
	if (rc)
		return write_failed(c, p, rc);
	c->peer.outstanding++;
	c->peer.user_outstanding += user;
	p->user_unsent += user;
	c->stats.writes++;
	c->stats.bytes_sent += len;
	c->stats.wire_bytes += len;
	return 0;
}

int fr_peer_unsent(const struct fr_comm *c, int rank)
{
	return c->peer.peers[rank].user_unsent;
}

size_t fr_peer_line_bytes(const struct fr_comm *c)
{
	/* FR_LL=0 turns the small messages' paths off, lines too */
	return c->nranks > 1 && c->peer.ll && c->tp_ops->line_bytes
		       ? c->tp_ops->line_bytes(c->tp)
		       : 0;
}

int fr_peer_line_put(struct fr_comm *c, int rank, uint64_t seq, const void *buf,
		     size_t len)
{
	struct fr_peer *p = &c->peer.peers[rank];
	int rc = fr_peer_need(c, rank);

	if (rc)
		return rc;
	if (p->state != FR_PEER_UP)
		return FR_EAGAIN;
	rc = c->tp_ops->line_put(p->conn, seq, buf, len);
	if (rc)
		return link_failed(c, p, rc, "a line to");
	c->stats.bytes_sent += len;
	c->stats.wire_bytes += len;
	return 0;
}

int fr_peer_line_get(struct fr_comm *c, int rank, uint64_t seq, void *buf,
		     size_t len)
{
	struct fr_peer *p = &c->peer.peers[rank];
	int rc;

	/* a peer whose connection went down may have put this line before
	 * it left (its communicator destroyed right after the collective):
	 * the line is still there, as a message would be in our mailbox */
	if (p->state == FR_PEER_DOWN && p->conn) {
		rc = c->tp_ops->line_get(p->conn, seq, buf, len);
		if (rc > 0)
			return rc;
	}
	rc = fr_peer_need(c, rank);
	if (rc)
		return rc == FR_EAGAIN ? 0 : rc;
	if (p->state != FR_PEER_UP)
		return 0; /* left after ours: fr_peers_check_gone decides */
	rc = c->tp_ops->line_get(p->conn, seq, buf, len);
	if (rc > 0) {
		/* progress, as a completion is (the timeout's clock) */
		c->peer.last_activity_ms = fr_coarse_ms();
		return rc;
	}
	if (rc == FR_EAGAIN || !rc)
		return 0;
	rc = link_failed(c, p, rc, "a line from");
	return rc == FR_EAGAIN ? 0 : rc;
}

/* The header's algo byte: the algorithm, and in the high nibble the
 * compression, which the ranks must agree on as much. */
static uint8_t wire_algo(const struct fr_request *req)
{
	return (uint8_t)((req->algo ? req->algo->id : 0) | req->compress << 4);
}

void fr_msg_for(const struct fr_request *req, uint8_t type, struct fr_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->coll = (uint8_t)req->coll;
	m->algo = wire_algo(req);
	m->dtype = (uint8_t)req->dtype;
	m->op = (uint8_t)req->op;
	m->seq = req->seq;
	m->count = req->count;
	m->root = req->root;
}

/* A message of wire bytes is on its way to p: the slot and credit it took
 * (data only: ABORT and BYE have their own slots), the credits it carried
 * back, the counters. */
static void msg_sent(struct fr_comm *c, struct fr_peer *p, bool special,
		     size_t wire)
{
	if (!special) {
		p->credits_owed = 0;
		p->credits--;
		p->send_seq++;
	}
	c->stats.writes++;
	c->stats.bytes_sent += wire;
	c->stats.wire_bytes += wire;
}

int fr_msg_send(struct fr_comm *c, int rank, struct fr_msg *m,
		const void *payload, size_t len)
{
	struct fr_peer *p = &c->peer.peers[rank];
	bool ctrl = m->type == FR_MSG_CTRL;
	bool special = m->type == FR_MSG_ABORT || m->type == FR_MSG_BYE || ctrl;
	uint32_t slot = 0, rslot;
	uint8_t *buf;
	int rc, i;

	if (p->state != FR_PEER_UP || (!special && p->credits <= 0))
		return FR_EAGAIN;
	if (len > fr_msg_payload_max(c))
		return FR_EINVAL;
	if (!special && c->peer.ll) {
		uint8_t b[FR_TP_INLINE_MAX];

		m->credits = (uint32_t)p->credits_owed;
		m->len = (uint32_t)len;
		if (fr_msg_encode_compact(m, payload, len, b)) {
			rslot = p->send_seq % (uint32_t)c->peer.mbx_slots;
			rc = c->tp_ops->write_inline(
				p->conn, b,
				&c->peer.mbx_rkeys[fr_peer_rank(&c->peer, p)],
				mbx_roff(c, rslot), FR_MSG_COMPACT + len,
				FR_IMM(FR_IMM_MSG, rslot));
			if (!rc) {
				msg_sent(c, p, false, FR_MSG_COMPACT + len);
				return 0;
			}
			/* FR_EAGAIN: not at once; write_imm keeps the order */
			if (rc != FR_EAGAIN)
				return write_failed(c, p, rc);
		}
	}
	/* The last outbox slots are kept for ABORT and BYE, which must go
	 * out however busy the data path is (CTRL waits its turn). */
	if ((!special || ctrl) && __builtin_popcountll(c->peer.out_busy) >=
					  c->peer.out_slots - FR_OUT_RESERVED)
		return FR_EAGAIN;
	if (ctrl && (m->step >= FR_CTRL_CHANNELS ||
		     len > c->peer.ctrl_size - FR_MSG_HDR))
		return FR_EINVAL;
	for (i = 0; i < c->peer.out_slots; i++) {
		slot = (c->peer.out_next + (uint32_t)i) %
		       (uint32_t)c->peer.out_slots;
		if (!(c->peer.out_busy & (1ull << slot)))
			break;
	}
	if (i == c->peer.out_slots)
		return FR_EAGAIN;
	/* credits ride on data only: ABORT, BYE and CTRL take none (CTRL
	 * has its own small slots: the same one for every message) */
	m->credits = special ? 0 : (uint32_t)p->credits_owed;
	m->len = (uint32_t)len;
	buf = c->peer.out + (size_t)slot * c->peer.mbx_slot_size;
	fr_msg_encode(m, buf);
	if (len)
		memcpy(buf + FR_MSG_HDR, payload, len);
	rslot = m->type == FR_MSG_ABORT ? (uint32_t)c->peer.mbx_slots
		: m->type == FR_MSG_BYE ? (uint32_t)c->peer.mbx_slots + 1
		: m->type == FR_MSG_CTRL
			? (uint32_t)c->peer.mbx_slots + 2u + m->step
			: p->send_seq % (uint32_t)c->peer.mbx_slots;
	rc = c->tp_ops->write_imm(p->conn, c->peer.out_mem->tp_mr,
				  (size_t)slot * c->peer.mbx_slot_size,
				  &c->peer.mbx_rkeys[fr_peer_rank(&c->peer, p)],
				  mbx_roff(c, rslot), FR_MSG_HDR + len,
				  FR_IMM(FR_IMM_MSG, rslot), CTX_OUT | slot);
	if (rc)
		/* ABORT and BYE are best effort: their callers go on */
		return special ? rc : write_failed(c, p, rc);
	c->peer.out_busy |= 1ull << slot;
	c->peer.out_next = slot + 1;
	c->peer.outstanding++;
	msg_sent(c, p, special, FR_MSG_HDR + len);
	return 0;
}

/* The peer has had our last word: the ABORT, or the revoke notice once
 * the communicator is revoked (a second ABORT into the same slot: a revoke
 * supersedes whatever failure came first). */
static bool told(const struct fr_comm *c, const struct fr_peer *p)
{
	return c->fail.revoked ? p->revoke_sent : p->abort_sent;
}

void fr_peers_send_abort(struct fr_comm *c, int err, int origin)
{
	bool rv = c->fail.revoked;
	struct fr_msg m = {.type = FR_MSG_ABORT,
			   .seq = c->fail.fail_seq,
			   .err = rv		      ? FR_EREVOKED
				  : c->fail.fail_code ? c->fail.fail_code
						      : err,
			   .origin = rv ? c->fail.revoke_origin : origin,
			   /* the first rank found dead here, + 1 (0: none) */
			   .aux = (uint32_t)(c->fail.dead_first + 1)};

	size_t len = strnlen(c->fail.fail_text, sizeof(c->fail.fail_text) - 1);

	if (!c->peer.peers)
		return;
	len = FR_MIN(len, fr_msg_payload_max(c));
	/* Best effort: a peer that is gone cannot be told.  The payload is
	 * the first failing rank's own message, so that every rank can say
	 * what went wrong where, not only that something did. */
	for (struct fr_peer *p = c->peer.active; p; p = p->next_active) {
		if (p->state != FR_PEER_UP || told(c, p) || p->bye)
			continue;
		if (!fr_msg_send(c, fr_peer_rank(&c->peer, p), &m,
				 c->fail.fail_text, len)) {
			p->abort_sent = true;
			p->revoke_sent = rv;
		}
	}
}

/*
 * Tell every rank that this one failed, not only the peers it is already
 * connected to: a rank that refused a collective's arguments in the very
 * first collective has no connections yet, and a partner of the refused
 * collective (a non-neighbour in the hypercube algorithms) may be waiting
 * for a connection to it.  Connect to everyone and hand out the ABORT as the
 * connections come up, for at most FR_TELL_MS: a rank that does not need
 * us never accepts, and learns it from the ranks that do, which relay it.
 * Only the failing rank does this (relays go to connected peers), so a job
 * fails with n - 1 new connections, not n^2.
 */
#define FR_TELL_MS 1000
/* A revoke has nobody else to tell the ranks it misses: they would wait
 * for it until the timeout.  Give connections longer to come up. */
#define FR_TELL_REVOKE_MS 5000

/* The failed communicator's last polls: one batch of completions into the
 * bookkeeping (the algorithms are done: theirs are dropped); how many, or
 * the transport's error. */
static int drain(struct fr_comm *c)
{
	struct fr_tp_cqe cqe[32];
	int n = c->tp_ops->poll(c->tp, cqe, 32);

	for (int i = 0; i < n; i++) {
		int from;

		(void)fr_peers_on_cqe(c, &cqe[i], &from);
	}
	return n;
}

void fr_peers_tell_all(struct fr_comm *c)
{
	uint64_t deadline =
		fr_now_ms() +
		FR_MIN(c->peer.timeout_ms,
		       c->fail.revoked ? FR_TELL_REVOKE_MS : FR_TELL_MS);
	int origin = c->fail.fail_origin >= 0 ? c->fail.fail_origin : c->rank;

	if (!c->peer.peers || !c->fail.failed || c->nranks < 2 ||
	    c->fail.told_all)
		return;
	c->fail.told_all = true;
	for (int q = 0; q < c->nranks; q++)
		if (q != c->rank && c->peer.peers[q].state == FR_PEER_IDLE) {
			c->peer.peers[q].told_only = true;
			fr_peer_need(c, q); /* a failure marks it DOWN */
		}
	for (;;) {
		bool all = true;
		int n = drain(c);

		if (n < 0)
			break;
		for (struct fr_peer *p = c->peer.active; p; p = p->next_active)
			if (p->state == FR_PEER_CONNECTING)
				peer_advance(c, p);
		fr_peers_send_abort(c, c->fail.failed, origin);
		for (struct fr_peer *p = c->peer.active; p; p = p->next_active)
			if (p->state == FR_PEER_CONNECTING ||
			    (p->state == FR_PEER_UP && !told(c, p) && !p->bye))
				all = false;
		if (all || fr_now_ms() >= deadline)
			break;
		if (!n)
			c->tp_ops->wait(c->tp, 1);
	}
}

/* ---- receiving
 * --------------------------------------------------------------- */

/* The decoded head of p's unconsumed messages (p->peek), or the failure. */
static int msg_peek(struct fr_comm *c, struct fr_peer *p, const uint8_t **b)
{
	*b = mbx_slot(c, fr_peer_rank(&c->peer, p),
		      (int)(p->recv_taken % (uint32_t)c->peer.mbx_slots));
	if (!p->have_peek) {
		if (fr_msg_decode(*b, fr_msg_payload_max(c), &p->peek))
			return fr_comm_fail(
				c, FR_EPROTO,
				"rank %d: malformed message from rank %d",
				c->rank, fr_peer_rank(&c->peer, p));
		p->have_peek = true;
	}
	return 0;
}

int fr_msg_leftover(struct fr_comm *c, const struct fr_request *req)
{
	/* the common case, at no cost however many peers are connected */
	if (!c->peer.unread)
		return 0;
	for (struct fr_peer *p = c->peer.active; p; p = p->next_active) {
		const uint8_t *b;
		int rc;

		const struct fr_msg *m = &p->peek;

		if (p->stash) {
			m = &p->stash->m;
		} else {
			if (p->recv_taken == p->recv_arrived)
				continue;
			rc = msg_peek(c, p, &b);
			if (rc)
				return rc;
			if (FR_MSG_IS_P2P(m->type))
				continue; /* not a collective's */
		}
		if (m->seq == req->seq)
			return fr_comm_fail(
				c, FR_EMISMATCH,
				"rank %d: collective #%u (%s, root %d) is done here, but rank %d sent this rank a message for it that its schedule does not have (%s, root %d): the ranks called it with different roots or counts",
				c->rank, req->seq, fr_coll_name(req->coll),
				req->root, fr_peer_rank(&c->peer, p),
				fr_coll_name(m->coll), m->root);
	}
	return 0;
}

/* The head of p's slots is consumed: its slot will be written again. */
static void slot_consume(struct fr_comm *c, struct fr_peer *p)
{
	p->have_peek = false;
	p->recv_taken++;
	c->peer.unread--;
	p->credits_owed++;
}

int fr_msg_p2p_next(struct fr_comm *c, int rank, const struct fr_msg **mp,
		    const uint8_t **payload)
{
	struct fr_peer *p = &c->peer.peers[rank];

	while (p->recv_taken != p->recv_arrived) {
		struct fr_stashed *s;
		const uint8_t *b;
		int rc = msg_peek(c, p, &b);

		if (rc)
			return rc;
		if (FR_MSG_IS_P2P(p->peek.type)) {
			*mp = &p->peek;
			*payload = b + p->peek.hdr;
			return 0;
		}
		/* a collective's message ahead of it: a copy waits for its
		 * collective, the slot goes back to the sender */
		s = malloc(sizeof(*s) + p->peek.len);
		if (!s)
			return fr_comm_fail(
				c, FR_ENOMEM,
				"rank %d: out of memory keeping a message of rank %d",
				c->rank, rank);
		s->next = NULL;
		s->m = p->peek;
		memcpy(s->data, b + p->peek.hdr, p->peek.len);
		if (p->stash_tail)
			p->stash_tail->next = s;
		else
			p->stash = s;
		p->stash_tail = s;
		slot_consume(c, p);
	}
	return FR_EAGAIN;
}

void fr_msg_p2p_consume(struct fr_comm *c, int rank)
{
	struct fr_peer *p = &c->peer.peers[rank];

	slot_consume(c, p);
	p->p2p_unread--;
	c->peer.p2p_unread--;
}

int fr_msg_get(struct fr_comm *c, const struct fr_request *req, int rank,
	       const struct fr_msg **mp, const uint8_t **payload)
{
	struct fr_peer *p = &c->peer.peers[rank];
	const uint8_t *b, *pl;
	const struct fr_msg *m = &p->peek;
	int rc;

	if (p->stash) {
		/* moved out of the way of a point-to-point message: older
		 * than anything still in a slot */
		m = &p->stash->m;
		pl = p->stash->data;
	} else {
		if (p->recv_taken == p->recv_arrived)
			return FR_EAGAIN;
		rc = msg_peek(c, p, &b);
		if (rc)
			return rc;
		/* point-to-point: the engine moves it on (fr_msg_p2p_next) */
		if (FR_MSG_IS_P2P(m->type))
			return FR_EAGAIN;
		pl = b + m->hdr;
	}
	if (m->seq != req->seq) {
		/* A peer already in a later collective: keep it for then. */
		if ((int32_t)(m->seq - req->seq) > 0)
			return FR_EAGAIN;
		return fr_comm_fail(
			c, FR_EMISMATCH,
			"rank %d: rank %d sent a message of %s(count=%llu, %s, %s, root %d) for collective #%u, which this rank finished without it (now at #%u): the ranks called different collectives or roots, or different numbers of them",
			c->rank, rank, fr_coll_name(m->coll),
			(unsigned long long)m->count,
			fr_dtype_name((fr_dtype_t)m->dtype),
			fr_op_name((fr_op_t)m->op), m->root, m->seq, req->seq);
	}
	if (m->coll != req->coll || m->count != req->count ||
	    m->dtype != req->dtype || m->op != req->op || m->root != req->root)
		return fr_comm_fail(
			c, FR_EMISMATCH,
			"rank %d: collective #%u: rank %d called %s(count=%llu, %s, %s, root %d) but this rank %s(count=%zu, %s, %s, root %d)",
			c->rank, req->seq, rank, fr_coll_name(m->coll),
			(unsigned long long)m->count,
			fr_dtype_name((fr_dtype_t)m->dtype),
			fr_op_name((fr_op_t)m->op), m->root,
			fr_coll_name(req->coll), req->count,
			fr_dtype_name(req->dtype), fr_op_name(req->op),
			req->root);
	if (m->algo != wire_algo(req))
		return fr_comm_fail(
			c, FR_EMISMATCH,
			"rank %d: collective #%u: rank %d runs algorithm %s with compression %s, this rank %s with %s",
			c->rank, req->seq, rank, fr_algo_name(m->algo & 15),
			fr_compress_name(m->algo >> 4),
			fr_algo_name(wire_algo(req) & 15),
			fr_compress_name(req->compress));
	*mp = m;
	*payload = pl;
	return 0;
}

void fr_msg_consume(struct fr_comm *c, int rank)
{
	struct fr_peer *p = &c->peer.peers[rank];
	struct fr_stashed *s = p->stash;

	if (s) {
		/* its slot went back when it was stashed */
		p->stash = s->next;
		if (!p->stash)
			p->stash_tail = NULL;
		free(s);
		return;
	}
	slot_consume(c, p);
}

static int on_abort(struct fr_comm *c, struct fr_peer *p,
		    const struct fr_msg *m)
{
	int orig_err =
		m->err < 0 && m->err >= FR_ERRNO_LOWEST ? m->err : FR_EPEER;
	int err = orig_err;
	const uint8_t *b =
		mbx_slot(c, fr_peer_rank(&c->peer, p), c->peer.mbx_slots);
	char text[2 * FR_ERRMSG_MAX], why[FR_ERRMSG_MAX];
	size_t len = FR_MIN((size_t)m->len, sizeof(why) - 1);

	/* the rank its sender found dead, if any: dead here too */
	if (m->aux && m->aux <= (uint32_t)c->nranks &&
	    (int)m->aux - 1 != c->rank)
		fr_peers_mark_dead(c, (int)m->aux - 1);

	/* Its own message, as text we can print: control characters out. */
	for (size_t i = 0; i < len; i++) {
		uint8_t ch = b[FR_MSG_HDR + i];

		why[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
	}
	why[len] = '\0';
	/*
	 * Errors that concern only the rank that had them (its arguments, its
	 * memory, its system) are FR_EPEER here: nothing is wrong with ours.
	 * Those that concern the job (a timeout, a mismatch, a protocol error)
	 * travel as they are.
	 */
	if (err == FR_EINVAL || err == FR_ENOMEM || err == FR_ENODEV ||
	    err == FR_ESYS || err == FR_ENOTSUP || err == FR_EBUSY ||
	    err == FR_ERANGE || err == FR_EAGAIN || err == FR_EBOOTSTRAP)
		err = FR_EPEER;
	if (len)
		snprintf(
			text, sizeof(text),
			"rank %d: aborted at collective #%u: rank %d failed first (%s), as reported by rank %d: %s",
			c->rank, m->seq, m->origin, fr_strerror(orig_err),
			fr_peer_rank(&c->peer, p), why);
	else
		snprintf(
			text, sizeof(text),
			"rank %d: aborted at collective #%u: rank %d failed first (%s), as reported by rank %d",
			c->rank, m->seq, m->origin, fr_strerror(orig_err),
			fr_peer_rank(&c->peer, p));
	/*
	 * A revoke ends everything at once, whatever collective either rank
	 * is in (fr_comm_revoke): no waiting for ours to complete.
	 */
	if (orig_err == FR_EREVOKED) {
		bool was = c->fail.failed != 0;

		if (c->fail.revoked)
			return c->fail.failed; /* relayed already */
		c->fail.revoked = true;
		c->fail.revoke_origin = m->origin;
		if (!was) {
			memcpy(c->fail.fail_text, why, sizeof(why));
			c->fail.fail_code = orig_err;
			c->fail.fail_origin = m->origin;
		}
		fr_comm_fail(
			c, FR_EREVOKED,
			"rank %d: rank %d revoked the communicator (told by rank %d)",
			c->rank, m->origin, fr_peer_rank(&c->peer, p));
		/* failed before: fr_comm_fail kept that failure and sent
		 * nothing; the revoke is passed on all the same */
		if (was)
			fr_peers_send_abort(c, FR_EREVOKED, m->origin);
		return c->fail.failed;
	}
	/*
	 * A peer that failed in a later collective than ours had finished
	 * ours: let ours complete, fail at the next one.
	 */
	if (c->peer.in_coll ? (int32_t)(m->seq - (c->peer.seq - 1)) > 0
			    : (int32_t)(m->seq - c->peer.seq) >= 0) {
		if (!c->fail.abort_pending && !c->fail.failed) {
			c->fail.abort_pending = true;
			c->fail.abort_seq = m->seq;
			c->fail.abort_err = err;
			c->fail.abort_origin = m->origin;
			memcpy(c->fail.abort_msg, text,
			       sizeof(c->fail.abort_msg) - 1);
			c->fail.abort_msg[sizeof(c->fail.abort_msg) - 1] = '\0';
			memcpy(c->fail.fail_text, why, sizeof(why));
			c->fail.fail_code = orig_err;
		}
		return 0;
	}
	if (!c->fail.failed) {
		memcpy(c->fail.fail_text, why, sizeof(why));
		c->fail.fail_code = orig_err;
	}
	c->fail.fail_origin = m->origin;
	return fr_comm_fail(c, err, "%s", text);
}

/* FNV-1a of a CTRL message's payload and length (its aux). */
static uint32_t ctrl_sum(const uint8_t *b, size_t len)
{
	uint32_t h = 2166136261u ^ (uint32_t)len;

	for (size_t i = 0; i < len; i++)
		h = (h ^ b[i]) * 16777619u;
	return h;
}

/* A CTRL message: kept as the peer's latest, unless read torn (the next
 * one is landing over it; its completion follows). */
static int on_ctrl(struct fr_comm *c, struct fr_peer *p, int ch,
		   const struct fr_msg *m, const uint8_t *payload)
{
	if (!p->ctrl[ch]) {
		p->ctrl[ch] = malloc(c->peer.ctrl_size);
		if (!p->ctrl[ch])
			return 0; /* as if lost (the sender is counted out if
				   * nothing more comes from it) */
	}
	/* copied, then checked: the copy is what the next write cannot
	 * tear any more */
	memcpy(p->ctrl[ch], payload, m->len);
	if (ctrl_sum(p->ctrl[ch], m->len) != m->aux)
		return 0;
	p->ctrl_len[ch] = m->len;
	if (!p->ctrl_new[ch])
		c->peer.ctrl_new++;
	p->ctrl_new[ch] = true;
	return 0;
}

static int on_msg(struct fr_comm *c, struct fr_peer *p, uint32_t slot,
		  uint32_t len)
{
	const uint8_t *b;
	struct fr_msg m;

	if (slot >= (uint32_t)(c->peer.mbx_slots + 2 + FR_CTRL_CHANNELS) ||
	    len < FR_MSG_COMPACT)
		goto bad;
	b = mbx_slot(c, fr_peer_rank(&c->peer, p), (int)slot);
	if (fr_msg_decode(b,
			  slot >= (uint32_t)c->peer.mbx_slots + 2
				  ? c->peer.ctrl_size - FR_MSG_HDR
				  : fr_msg_payload_max(c),
			  &m) ||
	    m.len != len - m.hdr)
		goto bad;
	if (slot == (uint32_t)c->peer.mbx_slots) {
		if (m.type != FR_MSG_ABORT)
			goto bad;
		return on_abort(c, p, &m);
	}
	if (slot >= (uint32_t)c->peer.mbx_slots + 2) {
		if (m.type != FR_MSG_CTRL)
			goto bad;
		return on_ctrl(c, p,
			       (int)(slot - (uint32_t)c->peer.mbx_slots - 2),
			       &m, b + FR_MSG_HDR);
	}
	if (slot == (uint32_t)c->peer.mbx_slots + 1) {
		if (m.type != FR_MSG_BYE)
			goto bad;
		/*
		 * BYE is no error here: a neighbour that left mid-collective is
		 * caught by its closed connection or the timeout, and new
		 * collectives by the algorithms' start.
		 */
		p->bye = true;
		p->bye_seq = m.seq;
		return 0;
	}
	if (slot != p->recv_arrived % (uint32_t)c->peer.mbx_slots ||
	    (m.type > FR_MSG_READY && !FR_MSG_IS_P2P(m.type)) ||
	    m.credits > (uint32_t)c->peer.mbx_slots)
		goto bad;
	p->recv_arrived++;
	c->peer.unread++;
	if (p->recv_arrived - p->recv_taken > (uint32_t)c->peer.mbx_slots)
		goto bad;
	p->credits += (int)m.credits;
	if (p->credits > c->peer.mbx_slots)
		goto bad;
	if (FR_MSG_IS_P2P(m.type)) {
		p->p2p_unread++;
		c->peer.p2p_unread++;
		return 0;
	}
	/* for a collective this rank has finished: its schedule had no
	 * place for it (the ranks disagree on roots or counts); say so now,
	 * not when this rank next reads from that peer, if it ever does */
	if ((int32_t)(m.seq - (c->peer.seq - (c->peer.in_coll ? 1u : 0u))) < 0)
		return fr_comm_fail(
			c, FR_EMISMATCH,
			"rank %d: rank %d sent a message of %s(count=%llu, root %d) for collective #%u, which this rank finished without it (now at #%u): the ranks called different collectives, roots or counts",
			c->rank, fr_peer_rank(&c->peer, p),
			fr_coll_name(m.coll), (unsigned long long)m.count,
			m.root, m.seq, c->peer.seq);
	return 0;
bad:
	return fr_comm_fail(
		c, FR_EPROTO,
		"rank %d: malformed or out-of-order message from rank %d (slot %u, %u bytes)",
		c->rank, fr_peer_rank(&c->peer, p), slot, len);
}

static void send_done(struct fr_comm *c, struct fr_peer *p,
		      const struct fr_tp_cqe *cqe)
{
	c->peer.outstanding--;
	if (cqe->ctx & CTX_OUT) {
		c->peer.out_busy &= ~(1ull << (cqe->ctx & 63));
	} else if (cqe->ctx & CTX_USER) {
		c->peer.user_outstanding--;
		if (p && p->user_unsent > 0)
			p->user_unsent--;
	}
}

static struct fr_peer *cqe_peer(struct fr_comm *c, const struct fr_tp_cqe *cqe)
{
	int r = c->tp_ops->conn_peer(cqe->conn);

	return r >= 0 && r < c->nranks && r != c->rank ? &c->peer.peers[r]
						       : NULL;
}

int fr_peers_on_cqe(struct fr_comm *c, const struct fr_tp_cqe *cqe, int *from)
{
	struct fr_peer *p = cqe_peer(c, cqe);
	uint32_t type = FR_IMM_TYPE(cqe->imm);

	/* a PING or PONG is not progress of a collective */
	if (!cqe_is_liveness(cqe)) {
		c->peer.last_activity_ms = fr_coarse_ms();
		c->peer.late_level = 0;
	}
	if (cqe->kind == FR_CQE_SEND)
		send_done(c, p, cqe);
	if (!p)
		return fr_comm_fail(
			c, FR_EPROTO,
			"rank %d: completion on a connection of no known peer",
			c->rank);
	if (cqe->status) {
		const char *why = tp_about(c, fr_peer_rank(&c->peer, p));
		const char *what =
			cqe->status == FR_EPEER
				? "closed the connection, died or became unreachable"
			: cqe->status == FR_ERANGE
				? (cqe->kind == FR_CQE_SEND
					   ? "refused our write (outside its registered memory)"
					   : "wrote outside our registered memory")
				: fr_strerror(cqe->status);

		/* gone: closed, dead or left (recovery counts it out) */
		if (cqe->status == FR_EPEER)
			fr_peers_mark_dead(c, fr_peer_rank(&c->peer, p));
		if ((p->bye && !c->peer.in_coll) ||
		    (cqe->status == FR_EPEER && left_after_ours(c, p))) {
			/* it said goodbye: closing now is expected, even
			 * during a collective it had started
			 * (left_after_ours) */
			p->state = FR_PEER_DOWN;
			return 0;
		}
		p->state = FR_PEER_DOWN;
		if (c->fail.abort_pending && !c->fail.failed) {
			/* the job has failed elsewhere (its ABORT waits for
			 * our collective to end): a peer that leaves now does
			 * so because of it, and ours cannot end without it */
			c->fail.fail_origin = c->fail.abort_origin;
			return fr_comm_fail(c, c->fail.abort_err, "%s",
					    c->fail.abort_msg);
		}
		return fr_comm_fail(
			c, cqe->status == FR_ERANGE ? FR_EPROTO : FR_EPEER,
			"rank %d: peer rank %d %s%s%s%s", c->rank,
			fr_peer_rank(&c->peer, p), what, why ? " (" : "",
			why ? why : "", why ? ")" : "");
	}
	if (cqe->kind == FR_CQE_SEND)
		return 0;
	c->stats.bytes_received += cqe->len;
	switch (type) {
	case FR_IMM_MSG:
		return on_msg(c, p, FR_IMM_PAYLOAD(cqe->imm), cqe->len);
	case FR_IMM_CREDIT:
		p->credits += (int)FR_IMM_PAYLOAD(cqe->imm);
		if (p->credits > c->peer.mbx_slots || cqe->len)
			break;
		return 0;
	case FR_IMM_PING:
		if (cqe->len)
			break;
		/* answered from here, whoever drives progress; if the send
		 * queue is full, from fr_peers_progress */
		if (live_send(c, p, pong_imm(c)) == FR_EAGAIN)
			p->pong_owed = true;
		return 0;
	case FR_IMM_PONG:
		if (cqe->len)
			break;
		note_pong(p, cqe->imm);
		return 0;
	}
	if (!(FR_IMM_PEER_TYPES & 1u << type)) {
		/* an algorithm's own (struct fr_algo.imm_types) */
		*from = fr_peer_rank(&c->peer, p);
		return FR_PEERS_FOR_ALGO;
	}
	return fr_comm_fail(
		c, FR_EPROTO,
		"rank %d: unexpected message (immediate 0x%08x) from rank %d",
		c->rank, cqe->imm, fr_peer_rank(&c->peer, p));
}

/* ---- recovery ---------------------------------------------------------- */

void fr_peers_mark_dead(struct fr_comm *c, int rank)
{
	struct fr_peer *p;

	if (!c->peer.peers || rank < 0 || rank >= c->nranks || rank == c->rank)
		return;
	p = &c->peer.peers[rank];
	if (p->dead)
		return;
	p->dead = true;
	c->peer.ndead++;
	if (c->fail.dead_first < 0)
		c->fail.dead_first = rank;
	fr_dbg("rank %d: rank %d is dead", c->rank, rank);
}

int fr_peers_reach(struct fr_comm *c, int rank)
{
	struct fr_peer *p = &c->peer.peers[rank];
	int rc;

	if (p->dead)
		return FR_EPEER;
	switch (p->state) {
	case FR_PEER_UP:
		return 0;
	case FR_PEER_IDLE:
		rc = fr_peer_need(c, rank);
		break;
	case FR_PEER_CONNECTING:
		rc = peer_advance(c, p);
		break;
	case FR_PEER_DOWN:
		if (p->conn || p->bye) {
			/* closed on us, or it destroyed its communicator */
			fr_peers_mark_dead(c, rank);
			return FR_EPEER;
		}
		/* cut by fr_peers_quiesce (still in the active list): a new
		 * connection over the shared endpoint's link */
		rc = c->rank < rank ? c->tp_ops->connect(c->tp, rank, NULL, 0,
							 &p->conn)
				    : 0;
		if (rc) {
			fr_peers_mark_dead(c, rank);
			return FR_EPEER;
		}
		p->state = FR_PEER_CONNECTING;
		rc = peer_advance(c, p);
		break;
	default:
		return FR_EPROTO;
	}
	if (rc == FR_EAGAIN || !rc)
		return rc;
	return p->dead || p->state == FR_PEER_DOWN ? FR_EPEER : rc;
}

int fr_peers_ctrl_send(struct fr_comm *c, int rank, int ch, const void *payload,
		       size_t len)
{
	/* step: the channel, which fr_msg_send picks the slot by */
	struct fr_msg m = {
		.type = FR_MSG_CTRL, .seq = c->peer.seq, .step = (uint16_t)ch};
	/* also to a rank counted as failed whose connection is up: it may
	 * be alive, and must learn that it was counted out */
	int rc = c->peer.peers[rank].state == FR_PEER_UP
			 ? 0
			 : fr_peers_reach(c, rank);

	if (rc)
		return rc;
	m.aux = ctrl_sum(payload, len);
	rc = fr_msg_send(c, rank, &m, payload, len);
	if (rc && rc != FR_EAGAIN && rc != FR_EINVAL) {
		c->peer.peers[rank].state = FR_PEER_DOWN;
		fr_peers_mark_dead(c, rank);
		return FR_EPEER;
	}
	return rc;
}

bool fr_peers_ctrl_take(struct fr_comm *c, int rank, int ch,
			const uint8_t **payload, size_t *len)
{
	struct fr_peer *p = &c->peer.peers[rank];

	if (!p->ctrl_new[ch])
		return false;
	p->ctrl_new[ch] = false;
	c->peer.ctrl_new--;
	*payload = p->ctrl[ch];
	*len = p->ctrl_len[ch];
	return true;
}

bool fr_peers_probe(struct fr_comm *c, int rank)
{
	struct fr_peer *p = &c->peer.peers[rank];
	uint64_t now = fr_coarse_ms(), every = (uint64_t)ping_interval_ms(c);

	if (p->dead || p->state != FR_PEER_UP)
		return false;
	if (now - p->ping_ms >= every &&
	    !live_send(c, p, FR_IMM(FR_IMM_PING, 0)))
		p->ping_ms = now;
	return p->pong_ms && now - p->pong_ms <= 3 * every;
}

void fr_peers_recovery_progress(struct fr_comm *c, bool *did_work)
{
	/* the peers that connect to us: on a failed communicator too */
	accept_pending(c, did_work);
	for (struct fr_peer *p = c->peer.active; p; p = p->next_active) {
		if (p->state == FR_PEER_CONNECTING && !peer_advance(c, p))
			*did_work = true;
		if (p->pong_owed && !live_send(c, p, pong_imm(c)))
			p->pong_owed = false;
	}
}

/* ---- goodbye
 * ------------------------------------------------------------------ */

/*
 * When a collective fails, its request finishes at once and the application
 * may free its buffers, but sends of that collective can still be queued in
 * the transport, reading from them (a live peer that stopped reading).  A
 * failed communicator never sends user data again, so give the queued sends
 * FR_QUIESCE_MS to drain (they usually do in microseconds, and the ABORT
 * queued behind them goes out too), then close every connection: the
 * transport drops what is queued and nothing reads the application's memory
 * after the failed call returns.  The peers see the closed connection as
 * this rank's failure, which they are about to learn anyway.
 */
#define FR_QUIESCE_MS 200

void fr_peers_quiesce(struct fr_comm *c)
{
	uint64_t deadline = fr_now_ms() + FR_QUIESCE_MS;

	if (!c->peer.peers || c->peer.user_outstanding <= 0)
		return;
	while (c->peer.user_outstanding > 0 && fr_now_ms() < deadline) {
		int n = drain(c);

		if (n < 0)
			break;
		if (!n)
			c->tp_ops->wait(c->tp, 1);
	}
	if (c->peer.user_outstanding <= 0)
		return;
	fr_info("rank %d: %d sends still queued %d ms after the failure: closing every connection",
		c->rank, c->peer.user_outstanding, FR_QUIESCE_MS);
	for (struct fr_peer *p = c->peer.active; p; p = p->next_active) {
		if (p->conn)
			c->tp_ops->close_conn(p->conn);
		p->conn = NULL;
		p->state = FR_PEER_DOWN;
		p->user_unsent = 0;
	}
	/* their completions went with the connections */
	c->peer.outstanding = 0;
	c->peer.user_outstanding = 0;
	c->peer.out_busy = 0;
}

/*
 * Say goodbye to every connected peer and wait (bounded) for theirs,
 * reading and dropping whatever else arrives, so that no connection is
 * closed while the other side may still send on it: closing a TCP socket
 * with unread data resets it, and the reset can destroy a peer's last
 * writes still in flight.  A failed communicator waits less: its peers are
 * failing too, or dead.
 */
/*
 * A failed communicator's goodbye is complete only if every rank said
 * goodbye: a rank this one never connected to may still be telling it
 * of the failure (a revoke's notice goes to every rank, fr_peers_tell_all)
 * and its write must not find the mailbox gone, which would fail the
 * whole link to it (transports/share keeps a view's memory until the
 * endpoint closes unless the goodbye was complete).
 */
static bool everyone_left(const struct fr_comm *c)
{
	if (!c->fail.failed)
		return true;
	for (int r = 0; r < c->nranks; r++)
		if (r != c->rank && !c->peer.peers[r].bye)
			return false;
	return true;
}

uint64_t fr_peers_goodbye_ms(const struct fr_comm *c)
{
	return (uint64_t)(c->fail.failed ? FR_MIN(c->peer.timeout_ms, 2000)
					 : c->peer.timeout_ms);
}

int fr_peers_goodbye_step(struct fr_comm *c, bool *clean, bool *idle)
{
	struct fr_tp_cqe cqe[32];
	bool all = true;
	int n;

	*idle = false;
	if (!c->peer.peers) {
		*clean = true;
		return 1;
	}
	/* an ABORT that found no room when we failed goes first, and
	 * to a peer still connecting to us (it may only learn of the
	 * failure from us) once the connection is up */
	if (c->fail.failed) {
		for (struct fr_peer *p = c->peer.active; p; p = p->next_active)
			if (p->state == FR_PEER_CONNECTING)
				peer_advance(c, p);
		fr_peers_send_abort(c, c->fail.failed,
				    c->fail.fail_origin >= 0
					    ? c->fail.fail_origin
					    : c->rank);
	}

	for (struct fr_peer *p = c->peer.active; p; p = p->next_active) {
		struct fr_msg m = {.type = FR_MSG_BYE, .seq = c->peer.seq};

		/* a connection still coming up: finish it, so that
		 * the peer gets the ABORT, unless it is only ours to
		 * tell (fr_peers_tell_all) or the peer never connected
		 * to us (it does not need us) */
		if (c->fail.failed && p->state == FR_PEER_CONNECTING &&
		    p->conn &&
		    (!p->told_only || c->rank > fr_peer_rank(&c->peer, p)))
			all = false;
		if (p->state != FR_PEER_UP)
			continue;
		/* a peer already gone cannot be told: give up on it */
		if (!p->bye_sent && fr_msg_send(c, fr_peer_rank(&c->peer, p),
						&m, NULL, 0) != FR_EAGAIN)
			p->bye_sent = true;
		if (!p->bye_sent || !p->bye)
			all = false;
	}
	if (all && c->peer.outstanding <= 0) {
		*clean = everyone_left(c);
		return 1;
	}
	n = c->tp_ops->poll(c->tp, cqe, 32);
	if (n < 0)
		return n;
	*idle = !n;
	for (int i = 0; i < n; i++) {
		struct fr_peer *p = cqe_peer(c, &cqe[i]);
		const uint8_t *b;
		struct fr_msg m;

		if (cqe[i].kind == FR_CQE_SEND)
			send_done(c, p, &cqe[i]);
		if (cqe[i].kind == FR_CQE_SEND) {
			if (cqe[i].status && p)
				p->bye = true;
			continue;
		}
		if (!p)
			continue;
		if (cqe[i].status) {
			p->bye = true; /* gone: nothing more will come */
			continue;
		}
		if (FR_IMM_TYPE(cqe[i].imm) != FR_IMM_MSG ||
		    FR_IMM_PAYLOAD(cqe[i].imm) !=
			    (uint32_t)c->peer.mbx_slots + 1)
			continue;
		b = mbx_slot(c, fr_peer_rank(&c->peer, p),
			     c->peer.mbx_slots + 1);
		if (!fr_msg_decode(b, fr_msg_payload_max(c), &m) &&
		    m.type == FR_MSG_BYE)
			p->bye = true;
	}
	return 0;
}

bool fr_peers_goodbye(struct fr_comm *c)
{
	uint64_t deadline = fr_now_ms() + fr_peers_goodbye_ms(c);

	while (fr_now_ms() < deadline) {
		bool clean, idle;
		int rc = fr_peers_goodbye_step(c, &clean, &idle);

		if (rc > 0)
			return clean;
		if (rc < 0)
			break;
		if (idle)
			c->tp_ops->wait(c->tp, 20);
	}
	fr_dbg("rank %d: goodbye incomplete", c->rank);
	return false;
}
