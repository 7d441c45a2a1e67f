/* SPDX-License-Identifier: MIT */
/*
 * verbs_lines.c - the polled lines' receiving side (fr_verbs.c, "Small
 * writes"): the peer's 128-byte lines read out of our ring in order and
 * delivered as writes, the credit and the state word (polling or
 * asleep) written into the peer's region, the wake-up of a peer that
 * sleeps, and the words a rank writes before it sleeps itself; and the
 * delivery of a write (ours by line or by receive) to the caller's
 * completion ring.  Sending a line is a write (verbs_data.c).  It posts
 * through verbs_post.c and fails connections through verbs_conn.c.
 */

#include <endian.h>
#include <string.h>

#include <infiniband/verbs.h>

#include "fastreduce.h"
#include "tp_cqring.h"
#include "util.h"
#include "verbs.h"

/* A word of our region that the peer writes (its credit or its state). */
uint64_t verbs_ll_word(const struct fr_tp_conn *c, size_t off)
{
	const uint64_t *w = (const uint64_t *)(const void *)(c->ll + off);

	return le64toh(__atomic_load_n(w, __ATOMIC_ACQUIRE));
}

/* Does c take the peer's lines now: up, or draining for a resume (what
 * landed before the link went is taken then, and counted for it)? */
static bool verbs_ll_taking(const struct fr_tp_conn *c)
{
	return c->ll_rx &&
	       (c->b.state == VERBS_UP ||
		(c->b.state == VERBS_RESUME && c->rs == VERBS_RS_DRAIN));
}

/* Read the line at the head of our ring into p (16 payload words): false
 * while any of its flags is not the line's number + 1 (not all there). */
static bool verbs_line_read(const struct fr_tp_conn *c, uint32_t *p)
{
	const uint64_t *w =
		(const uint64_t *)(const void *)(c->ll +
						 (size_t)(c->ll_head %
							  VERBS_LL_LINES) *
							 VERBS_LL_LINE);
	uint32_t flag = (uint32_t)(c->ll_head + 1);

	for (unsigned int i = 0; i < VERBS_LL_WORDS; i++) {
		uint64_t v = le64toh(__atomic_load_n(&w[i], __ATOMIC_ACQUIRE));

		if ((uint32_t)(v >> 32) != flag)
			return false;
		p[i] = (uint32_t)v;
	}
	return true;
}

/* Is the next message of c a line that is all there (poll() would hand
 * it out)? */
bool verbs_line_ready(const struct fr_tp_conn *c)
{
	uint32_t p[VERBS_LL_WORDS];

	return verbs_ll_taking(c) && verbs_line_read(c, p) &&
	       p[0] == (uint32_t)c->rx_msgs;
}

/* An 8-byte RDMA WRITE of v into the peer's region at off (our credit or
 * state word), signalled if sig.  False when lane 0 has no room now (or the
 * post failed the connection). */
static bool verbs_ll_put_word(struct fr_tp_conn *c, size_t off, uint64_t v,
			      bool sig)
{
	uint8_t *b = verbs_ll_word_out(c, off == VERBS_LL_STATE_OFF);
	struct ibv_send_wr wr;
	struct ibv_sge sge;

	if (c->b.state != VERBS_UP || !c->ll_tx ||
	    !verbs_lane_room(c, &c->lane[0], 1))
		return false;
	fr_put_le64(b, v);
	sge.addr = (uint64_t)(uintptr_t)b;
	sge.length = 8;
	sge.lkey = c->ctl_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.wr.rdma.remote_addr = c->ll_peer_addr + off;
	wr.wr.rdma.rkey = c->ll_peer_rkey;
	return !verbs_lane_post(c, 0, &wr, VERBS_SQE_WORD, 0, NULL, 0, sig);
}

/* Give the peer its credit back once a batch of its lines has been
 * handed out. */
static void verbs_ll_credit(struct fr_tp_conn *c)
{
	c->ll_credit_owed = false;
	if (!c->ll_tx ||
	    c->ll_freed - c->ll_credit_sent < VERBS_LL_CREDIT_BATCH)
		return;
	if (verbs_ll_put_word(c, VERBS_LL_CREDIT_OFF, c->ll_freed, false))
		c->ll_credit_sent = c->ll_freed;
	else
		c->ll_credit_owed = c->b.state == VERBS_UP;
}

/*
 * Tell the peer we poll (our state word odd): from now on it may send us
 * small writes as lines.  Said when one of its small writes came another
 * way while it thought we slept.
 */
void verbs_ll_awake(struct fr_tp_conn *c)
{
	c->ll_awake_owed = false;
	if (!c->ll_rx || !c->ll_tx || (c->ll_state & 1))
		return;
	if (verbs_ll_put_word(c, VERBS_LL_STATE_OFF, c->ll_state + 1, false))
		c->ll_state++;
	else
		c->ll_awake_owed = c->b.state == VERBS_UP;
}

/*
 * One of our lines was placed (its write completed): if the peer has
 * said since that it sleeps (state even), and we have not woken it for
 * that sleep, wake it with a SEND, which raises a completion there.  The
 * peer looks at its lines after its asleep word is acknowledged, so a
 * line placed before we read the word is seen either way (fr_verbs.c).
 */
static void verbs_ll_ring(struct fr_tp_conn *c)
{
	uint64_t s = verbs_ll_word(c, VERBS_LL_STATE_OFF);
	struct verbs_lane *l0 = &c->lane[0];
	struct ibv_send_wr wr;
	struct ibv_sge sge;
	uint8_t *b;

	c->ll_ring_owed = false;
	if (!c->ll_tx || (s & 1) || s == c->ll_rung)
		return;
	if (!verbs_lane_room(c, l0, 1)) {
		c->ll_ring_owed = true;
		return;
	}
	b = c->ctl + (size_t)(l0->sq_tail % c->sq_cap) * VERBS_CTL_LEN;
	memset(b, 0, VERBS_CTL_LEN);
	fr_put_le32(b, VERBS_WAKE_MAGIC);
	sge.addr = (uint64_t)(uintptr_t)b;
	sge.length = VERBS_CTL_LEN;
	sge.lkey = c->ctl_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	if (verbs_lane_post(c, 0, &wr, VERBS_SQE_WORD, 0, NULL, 0, false))
		return;
	c->ll_rung = s;
	c->ll_rings++;
}

/* A receive (a write's, or a line's) handed out: its receive goes back,
 * or the line's slot counts towards the peer's credit. */
void verbs_delivered(struct fr_tp_conn *c, bool line)
{
	if (!line) {
		verbs_repost(c);
		return;
	}
	c->ll_freed++;
	verbs_ll_credit(c);
}

/* Hand a message out, or hold it (asked to, not accepted yet, older ones
 * held, or no room in the ring of completions). */
void verbs_deliver(struct fr_tp_conn *c, uint32_t imm, uint32_t len, bool line,
		   bool hold)
{
	struct fr_tp *tp = c->b.tp;
	struct verbs_held *h;

	if (hold || !c->b.owned || c->held_count || !fr_cqring_room(tp->b.cq)) {
		h = &c->held[(c->held_head + c->held_count) % c->held_cap];
		h->imm = imm;
		h->len = len;
		h->line = line;
		c->held_count++;
		return;
	}
	fr_cqring_push(tp->b.cq, FR_CQE_RECV, 0, c, 0, imm, len);
	verbs_delivered(c, line);
}

/*
 * Take the line at the head of the ring if it is the next message: check
 * it as the HCA would a write (its destination one of our regions that
 * peers may write, all of it inside), copy its bytes there and hand it
 * out (or hold it: inside a CQ drain, whose room in the ring of
 * completions is spoken for).  1 taken, 0 not (not there, or a write with
 * immediate comes first), or a negative code: the connection failed.
 */
static int verbs_line_take(struct fr_tp_conn *c, bool hold)
{
	struct fr_tp *tp = c->b.tp;
	uint32_t p[VERBS_LL_WORDS], len;
	uint8_t data[FR_TP_INLINE_MAX];
	struct fr_tp_mr *mr;
	uint64_t raddr;

	if (!verbs_line_read(c, p))
		return 0;
	/* A line behind the messages taken would stop the ring for good. */
	if ((int32_t)(p[0] - (uint32_t)c->rx_msgs) < 0) {
		verbs_conn_fail(
			c, FR_EPROTO,
			"rank %d sent a line out of order (message %u, expected %u)",
			c->b.peer, p[0], (uint32_t)c->rx_msgs);
		return FR_EPROTO;
	}
	if (p[0] != (uint32_t)c->rx_msgs)
		return 0;
	len = p[2];
	raddr = p[4] | (uint64_t)p[5] << 32;
	if (!len || len > FR_TP_INLINE_MAX || p[6] || p[7]) {
		verbs_conn_fail(c, FR_EPROTO,
				"rank %d sent a malformed line (%u bytes)",
				c->b.peer, len);
		return FR_EPROTO;
	}
	mr = verbs_mr_find(tp, p[3], raddr, len);
	if (!mr) {
		verbs_conn_fail(
			c, FR_ERANGE,
			"rank %d wrote %u bytes at 0x%llx outside our registrations (a line)",
			c->b.peer, len, (unsigned long long)raddr);
		return FR_ERANGE;
	}
	for (uint32_t i = 0; i < len; i++)
		data[i] = (uint8_t)(p[8 + i / 4] >> (8 * (i % 4)));
	memcpy(mr->base + (raddr - (uint64_t)(uintptr_t)mr->base), data, len);
	c->ll_head++;
	c->ll_taken++;
	c->rx_msgs++;
	c->rs_progress = true;
	verbs_deliver(c, p[1], len, true, hold);
	return 1;
}

/* Take every line that is the next message (those before a write with
 * immediate that just arrived, or what a resume's drain found), held:
 * poll() hands them out after the drain. */
void verbs_lines_take(struct fr_tp_conn *c)
{
	while (verbs_ll_taking(c) && verbs_line_take(c, true) > 0)
		;
}

/*
 * poll()'s part: on every connection, post what polled lines owe (a
 * wake-up, credit, our awake word), then hand out the lines that are the
 * next messages, as the ring of completions has room.
 */
void verbs_lines_poll(struct fr_tp *tp)
{
	for (struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next) {
		if (c->b.state == VERBS_UP) {
			if (c->ll_ring_owed)
				verbs_ll_ring(c);
			if (c->ll_credit_owed)
				verbs_ll_credit(c);
			if (c->ll_awake_owed)
				verbs_ll_awake(c);
		}
		if (!c->b.owned)
			continue;
		while (!c->held_count && fr_cqring_room(tp->b.cq) &&
		       verbs_ll_taking(c) && verbs_line_take(c, false) > 0)
			;
	}
}

/*
 * Before wait() sleeps: tell every peer we said we poll that we may sleep
 * now (our state word even, signalled).  The caller arms the CQ and looks
 * once more; the word's completion wakes us, and the wait() after that
 * looks at the lines once they are all placed that the peer sent before
 * it saw the word.  1 when a word cannot go now (lane 0 full): do not
 * sleep yet.
 */
int verbs_ll_sleep(struct fr_tp *tp)
{
	for (struct fr_tp_conn *c = tp->b.conns; c; c = c->b.next) {
		if (c->b.state != VERBS_UP || !c->ll_tx || !(c->ll_state & 1))
			continue;
		if (!verbs_ll_put_word(c, VERBS_LL_STATE_OFF, c->ll_state + 1,
				       true))
			return 1;
		c->ll_state++;
	}
	return 0;
}
