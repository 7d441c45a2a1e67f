/* SPDX-License-Identifier: MIT */
/*
 * shm_data.c - the shared-memory transport's data path: queued writes go
 * into the ring slot by slot (or as one PULL slot), the receiver checks
 * each slot against its region table and copies or pulls the bytes into
 * place, sends retire in order.  The design and the wire format are in
 * fr_shm.c, the layout in shm.h.  Calls only the transport base.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include "fastreduce.h"
#include "log.h"
#include "shm.h"
#include "util.h"

/* ---- data path ------------------------------------------------------------
 */

static void shm_poke(struct fr_tp_conn *c)
{
	char one = 0;

	/* Seen the peer asleep after our ring update: wake it. */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(c->peer_sleep, memory_order_relaxed) &&
	    send(c->fd, &one, 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 &&
	    errno != EAGAIN)
		fr_dbg("shm: wake rank %d: %s", c->b.peer, fr_syserr(errno));
}

/* Report the oldest queued write done: its source is no longer read
 * (shm_sq_done). */
static void shm_sq_retire(struct fr_tp_conn *c)
{
	fr_tpb_sq_retire(c);
	c->sq_push--;
}

/* Can the oldest pushed write be retired, the consumer's head being head? */
static bool shm_sq_done(const struct fr_tp_conn *c, uint64_t head)
{
	const struct shm_sqe *e = fr_tpb_sq_at(&c->b.sq, 0);

	/* A fragment's bytes are in the ring; a pull reads the source until
	 * the consumer moves past its slot. */
	return c->sq_push && (!e->pull || head > e->seq);
}

/* Retire pushed writes, oldest first, while they are done. */
static void shm_sq_reap(struct fr_tp_conn *c, uint64_t head)
{
	while (shm_sq_done(c, head) && !fr_cqring_full(&c->b.tp->cq))
		shm_sq_retire(c);
}

/* Does this write go as one PULL slot?  Large enough, not started, and the
 * peer has said it can pull from us. */
static bool shm_pull_eligible(struct fr_tp_conn *c, const struct shm_sqe *e)
{
	if (!c->cma || e->done || e->len < c->b.tp->cma_bytes)
		return false;
	if (!c->pull_tx)
		c->pull_tx = atomic_load_explicit(&c->tx->pull_ok,
						  memory_order_acquire);
	return c->pull_tx;
}

/* Room for one more slot in the ring?  *head is the consumer's head as
 * last read; it is read again (a cache miss) only when the ring looks
 * full. */
static bool shm_ring_room(struct fr_tp_conn *c, uint64_t *head)
{
	if (c->tx_tail - *head < SHM_SLOTS)
		return true;
	*head = atomic_load_explicit(&c->tx->head, memory_order_acquire);
	return c->tx_tail - *head < SHM_SLOTS;
}

/* Push queued writes into the ring while it has room, and retire those
 * that are done. */
void shm_tx(struct fr_tp_conn *c)
{
	bool pushed = false;
	uint64_t head;

	if (c->b.state != SHM_UP)
		return;
	/*
	 * The consumer writes head after every pass: reading it costs a
	 * cache miss, which before writing the slot is one more on the
	 * latency path (and takes the line from the consumer, whose next
	 * store then misses too).  The last value read serves until the
	 * ring looks full, or a pull waits for the consumer to pass it.
	 */
	head = c->tx_head;
	if (c->sq_push &&
	    ((const struct shm_sqe *)fr_tpb_sq_at(&c->b.sq, 0))->pull)
		head = atomic_load_explicit(&c->tx->head, memory_order_acquire);
	/*
	 * Later writes may follow a pull still pending: the consumer takes
	 * slots in order, so one that covers the same bytes lands after it.
	 */
	while (c->sq_push < c->b.sq.count) {
		struct shm_sqe *e = fr_tpb_sq_at(&c->b.sq, c->sq_push);
		struct shm_slot *s;
		uint32_t flags = 0, n = 0;

		if (!shm_ring_room(c, &head))
			break;
		s = &c->tx->slot[c->tx_tail % SHM_SLOTS];
		if (shm_pull_eligible(c, e)) {
			flags = SLOT_FIRST | SLOT_LAST | SLOT_PULL;
			s->src = (uint64_t)(uintptr_t)(e->b.mr->base + e->loff);
			s->off = e->roff;
			e->pull = true;
			e->done = e->len;
		} else {
			n = (uint32_t)FR_MIN((size_t)SHM_SLOT_DATA,
					     e->len - e->done);
			if (e->done == 0)
				flags |= SLOT_FIRST;
			if (e->done + n == e->len)
				flags |= SLOT_LAST;
			if (n)
				memcpy(s->data,
				       e->b.mr->base + e->loff + e->done, n);
			s->src = 0;
			s->off = e->roff + e->done;
			e->done += n;
		}
		s->imm = e->imm;
		s->flags = flags;
		s->region = e->rid;
		s->gen = e->rgen;
		s->len = n;
		s->total = (uint32_t)e->len;
		if (flags & SLOT_LAST) {
			e->seq = c->tx_tail;
			c->sq_push++;
		}
		c->tx_tail++;
		atomic_store_explicit(&s->seq, c->tx_tail,
				      memory_order_release);
		pushed = true;
	}
	c->tx_head = head;
	shm_sq_reap(c, head);
	if (pushed)
		shm_poke(c);
}

/*
 * write_inline: the whole write in one INLINE slot, whose first cache line
 * holds the bytes with seq, so the consumer's one miss brings all of it.
 * Only when nothing queued waits for the ring (the order of writes) and
 * the ring has room; else FR_EAGAIN and the caller uses write_imm.  The
 * bytes are copied now: no send queue entry, no SEND completion.
 */
int shm_write_inline(struct fr_tp_conn *c, const void *buf,
		     const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		     uint32_t imm)
{
	struct shm_slot *s;

	if (!c || !buf || !rkey || !rkey->d || !len || len > SHM_SLOT_INLINE)
		return FR_EINVAL;
	if (c->b.state == SHM_FAILED)
		return c->b.error;
	if (c->b.state != SHM_UP || c->sq_push != c->b.sq.count)
		return FR_EAGAIN;
	if (!shm_ring_room(c, &c->tx_head))
		return FR_EAGAIN;
	s = &c->tx->slot[c->tx_tail % SHM_SLOTS];
	s->imm = imm;
	s->flags = SLOT_FIRST | SLOT_LAST | SLOT_INLINE |
		   (uint32_t)len << SLOT_INL_SHIFT;
	s->region = rkey->c;
	s->gen = rkey->d;
	s->off = roff;
	memcpy(s->inl, buf, len);
	c->tx_tail++;
	atomic_store_explicit(&s->seq, c->tx_tail, memory_order_release);
	shm_poke(c);
	return 0;
}

/*
 * Lines (transport.h, line_put): beside the rings, two per direction in
 * the segment (struct shm_line), for a collective that goes whole in one
 * message.  The writer copies the bytes and their count, then publishes
 * the number (release) and wakes a sleeping peer as a ring write does;
 * the reader polls the number in the line itself.  For a short line that
 * is one cache line from core to core, and none of the ring's slots,
 * region checks or completions: the caller owns the order (it puts a
 * number only after it got the one before from that peer).
 */
int shm_line_put(struct fr_tp_conn *c, uint64_t seq, const void *buf,
		 size_t len)
{
	struct shm_line *l;

	if (!c || !buf || !seq || !len || len > FR_TP_LINE_MAX)
		return FR_EINVAL;
	if (c->b.state == SHM_FAILED)
		return c->b.error;
	if (c->b.state != SHM_UP)
		return FR_EAGAIN;
	l = &c->line_tx[seq & 1];
	memcpy(l->data, buf, len);
	l->len = (uint32_t)len;
	atomic_store_explicit(&l->seq, seq, memory_order_release);
	shm_poke(c);
	return 0;
}

int shm_line_get(struct fr_tp_conn *c, uint64_t seq, void *buf, size_t len)
{
	const struct shm_line *l;
	uint32_t n;

	if (!c || !buf || !seq)
		return FR_EINVAL;
	/* a failed connection keeps its segment (shm_conn_down): a line
	 * the peer put before it closed is still read */
	if (!c->line_rx)
		return c->b.state == SHM_FAILED ? c->b.error : 0;
	l = &c->line_rx[seq & 1];
	if (atomic_load_explicit(&l->seq, memory_order_acquire) != seq) {
		if (c->b.state == SHM_FAILED)
			return c->b.error;
		c->line_want = seq; /* a sleep looks for it (shm_ready) */
		return 0;
	}
	n = l->len;
	if (!n || n > FR_TP_LINE_MAX) {
		fr_tpb_conn_fail(c, FR_EPROTO, "a line of %u bytes", n);
		return FR_EPROTO;
	}
	memcpy(buf, l->data, FR_MIN((size_t)n, len));
	c->line_want = seq + 1;
	return (int)n;
}

/*
 * Pull the next chunk of the PULL slot h (checked against mr) from the
 * writer's memory into ours, spending at most *budget bytes.  0 when the
 * write is all here, 1 when more remains, or an error (the connection has
 * failed).
 */
static int shm_pull(struct fr_tp_conn *c, struct fr_tpb_mr *mr,
		    const struct shm_slot *h, size_t *budget)
{
	size_t n = FR_MIN(*budget, (size_t)h->total - c->rx_pulled);
	struct iovec l = {mr->base + h->off + c->rx_pulled, n};
	struct iovec r = {(void *)(uintptr_t)(h->src + c->rx_pulled), n};
	ssize_t got;

	do
		got = process_vm_readv(c->peer_pid, &l, 1, &r, 1, 0);
	while (got < 0 && errno == EINTR);
	if (got < 0 && errno == ESRCH) {
		fr_tpb_conn_fail(c, FR_EPEER, "peer process %d is gone",
				 (int)c->peer_pid);
		return FR_EPEER;
	}
	if (got <= 0) {
		fr_tpb_conn_fail(c, FR_ERANGE,
				 "cross-memory read from the peer failed: %s",
				 got < 0 ? fr_syserr(errno) : "nothing read");
		return FR_ERANGE;
	}
	/*
	 * Did the writer give up on the connection while we read?  Then its
	 * application may have freed or reused the source, and the bytes we
	 * read may be anything: fail rather than complete the write.
	 *
	 * This suffices: the writer sets "closed" (seq_cst) before anything
	 * lets its application reuse the source (shm_mark_closed, then the
	 * release of the queue, the error completions, close), and it does
	 * not otherwise let the source go before we have moved head past
	 * the slot, which we do only after this check.  Our read is ordered
	 * before the load below by the system call and by the load itself,
	 * a seq_cst read-modify-write (a full barrier; a bare fence is what
	 * ThreadSanitizer cannot follow).
	 * So if the load still sees 0, the writer's store comes later in the
	 * single total order, every reuse of the source later still, and
	 * every byte we read predates them: it is the write's own data.  If
	 * a reuse could have raced with our read, we see the flag.
	 */
	if (atomic_fetch_or_explicit(&c->rx->closed, 0, memory_order_seq_cst)) {
		fr_tpb_conn_fail(c, FR_EPEER,
				 "peer closed while its write was being read");
		return FR_EPEER;
	}
	c->rx_pulled += (size_t)got;
	*budget -= (size_t)got;
	return c->rx_pulled < h->total;
}

/* Has the producer published the slot at index i (shm_slot.seq)? */
static bool shm_slot_ready(const struct shm_ring *r, uint64_t i)
{
	return atomic_load_explicit(&r->slot[i % SHM_SLOTS].seq,
				    memory_order_acquire) == i + 1;
}

/* Take the peer's writes out of the ring, check and place them. */
void shm_rx(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->b.tp;
	size_t budget = SHM_CMA_CHUNK;
	bool got = false;

	if (c->b.state != SHM_UP) /* shm_tx may just have failed it */
		return;

	while (c->b.state == SHM_UP && shm_slot_ready(c->rx, c->rx_head)) {
		const struct shm_slot *s = &c->rx->slot[c->rx_head % SHM_SLOTS];
		struct shm_slot h;
		struct fr_tpb_mr *mr = NULL;
		uint32_t n, total, fl, inl;
		bool pull, bad;

		if (fr_cqring_full(&tp->cq))
			break;
		/* The peer can rewrite the slot: judge a private copy. */
		memcpy((uint8_t *)&h + SHM_SLOT_FIELDS_AT,
		       (const uint8_t *)s + SHM_SLOT_FIELDS_AT,
		       SHM_SLOT_FIELDS);
		fl = h.flags & ((1u << SLOT_INL_SHIFT) - 1);
		inl = h.flags >> SLOT_INL_SHIFT;
		pull = fl & SLOT_PULL;
		/* A pull has no payload, is its write's only slot, and one
		 * begun in an earlier pass must still be there as it was.  An
		 * INLINE slot is a whole write of 1 to SHM_SLOT_INLINE bytes
		 * (its len and total are its bytes: not read). */
		if (fl & SLOT_INLINE)
			bad = c->rx_pulled != 0 || !inl ||
			      inl > SHM_SLOT_INLINE ||
			      fl != (SLOT_FIRST | SLOT_LAST | SLOT_INLINE);
		else if (pull)
			bad = inl || h.len || h.total <= c->rx_pulled ||
			      (fl & (SLOT_FIRST | SLOT_LAST)) !=
				      (SLOT_FIRST | SLOT_LAST);
		else
			bad = inl || c->rx_pulled != 0 || h.len > SHM_SLOT_DATA;
		if (bad || (fl & ~SLOT_FLAGS)) {
			fr_tpb_conn_fail(c, FR_EPROTO, "malformed slot");
			break;
		}
		if (pull && !c->pull_rx) {
			fr_tpb_conn_fail(
				c, FR_EPROTO,
				"a pull, but cross-memory attach was not granted");
			break;
		}
		if (pull && !budget)
			break; /* enough for this pass */
		n = inl ? inl : pull ? h.total : h.len;
		total = inl ? inl : h.total;
		if (total) {
			uint64_t end = h.off + n;

			/* A pull's whole range is checked now, before each of
			 * its chunks: the region may have gone meanwhile. */
			mr = fr_tpb_region(&tp->b, h.region, h.gen);
			if (!mr || !(mr->access & FR_TP_REMOTE_WRITE) ||
			    end < h.off || end > mr->len) {
				fr_tpb_conn_fail(
					c, FR_ERANGE,
					"write outside a registered region (region %u gen %u, offset %" PRIu64
					", %u bytes)",
					h.region, h.gen, h.off, n);
				break;
			}
			if (pull) {
				if (shm_pull(c, mr, &h, &budget))
					break; /* failed, or more next pass */
				c->rx_pulled = 0;
				/* One pulled write per pass: the caller gets
				 * its completion (uses the bytes, returns
				 * credits) before we copy the next one. */
				budget = 0;
			} else if (inl) {
				memcpy(mr->base + h.off, h.inl, inl);
			} else if (h.len) {
				memcpy(mr->base + h.off, s->data, h.len);
			}
		}
		if (fl & SLOT_LAST)
			fr_cqring_push(&tp->cq, FR_CQE_RECV, 0, c, 0, h.imm,
				       total);
		c->rx_head++;
		got = true;
	}
	/* Moving head past a PULL slot tells the writer that its source is
	 * free again: only after the bytes are here (shm_sq_done). */
	if (got && c->b.state == SHM_UP) {
		atomic_store_explicit(&c->rx->head, c->rx_head,
				      memory_order_release);
		shm_poke(c); /* a producer may wait for room, or a pull */
	}
}

/* Is there anything for poll() on this connection right now? */
bool shm_ready(struct fr_tp_conn *c)
{
	if (c->b.state == SHM_FAILED)
		return fr_tpb_owes(c);
	if (c->b.state != SHM_UP || !c->b.owned)
		return false;
	if (shm_slot_ready(c->rx, c->rx_head))
		return true;
	/* a line a get waits for: reported once, as a failed communicator
	 * may never take it */
	if (c->line_want != c->line_told &&
	    atomic_load_explicit(&c->line_rx[c->line_want & 1].seq,
				 memory_order_acquire) == c->line_want) {
		c->line_told = c->line_want;
		return true;
	}
	if (c->b.sq.count) {
		uint64_t head = atomic_load_explicit(&c->tx->head,
						     memory_order_acquire);

		/* A write to retire (a pull the peer has finished: its
		 * consumer pokes us when it moves head), or room for the
		 * next one. */
		if (shm_sq_done(c, head))
			return true;
		return c->sq_push < c->b.sq.count &&
		       c->tx_tail - head < SHM_SLOTS;
	}
	return false;
}
