/* SPDX-License-Identifier: MIT */
/*
 * ring.c - the pipelined ring: All-Reduce, reduce-scatter and all-gather
 * over one-sided write-with-immediate.
 *
 * Schedule (n ranks, r our position in the ring, count elements split
 * into n chunks, chunk c holding count/n elements plus one for the first
 * count%n chunks).  The ring's order is comm->ring_order: a node's ranks
 * side by side (comm.c), so position and rank differ only where the
 * launcher placed ranks round robin over the nodes; "next" and "previous"
 * are by position:
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
 * Flow control: the next rank owns a staging area of slots x segment_bytes,
 * registered once per communicator; we may write one reduce-scatter segment
 * per credit, and it returns a credit (a zero-length write carrying only an
 * immediate) once it has reduced the slot.  The window is counted in bytes:
 * a collective whose segments are smaller than segment_bytes (a big job's
 * small chunks: 64 MiB over 4,096 ranks is 16 KiB a step) carves the same
 * area into more, smaller slots, halving the slot and doubling their number
 * while its largest segment still fits, until the window holds an eighth
 * of its segments (a small job's collectives keep the FR_SLOTS slots:
 * ring_window says why), up to RING_MAX_WINDOW slots.  With
 * one slot a segment and a step a segment, slots are how far a rank may run
 * ahead of its successor, and a window of 8 held a 2,048-rank ring in step
 * with its slowest hop (perf/sim/README.md, "Why the ring is slower on the
 * fat tree").  The layout is a function of the collective's arguments, so
 * both ends compute the same one, and both change it at the collective's
 * first segment (a rank whose chunks are all empty sends none, and changes
 * nothing): the sender once every slot of the old layout has come back
 * (the receiver has reduced all of it), the receiver as it takes that
 * segment (after the READY check, or from the segments it parked), so
 * neither ever reads a slot written under the other layout.  A collective
 * in a window larger than FR_SLOTS (a large job's: thousands of segments a
 * rank) returns its last credits at once (one message, nothing beside its
 * segments), so that the one after it, in whatever layout, need not wait
 * for them; the others let theirs ride on their next READY, as before.
 * Slot = (serial - base) mod window, base the serial where the layout
 * began, the serial running on across collectives; immediates carry serial
 * and slot so that any disagreement is caught as FR_EPROTO instead of
 * corrupting data.
 *
 * Queueing: the two streams share the connection to the next rank, and the
 * transport sends in the order posted, so the ring posts a segment only
 * while fewer than RING_QUEUED of its writes to the next rank wait in the
 * transport (fr_peer_unsent): the choice between a reduce-scatter segment
 * and an all-gather one is made when the wire has room, not 32 MiB ahead.
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
 * Reduce-scatter runs only the first phase and all-gather only the second,
 * over a vector of n equal blocks where chunk c is the block of the rank
 * at position (c - 1) mod n, so that each rank's own block is the chunk it
 * reduces last / sends first.
 * Reduce-scatter keeps the partial sums of steps 0 .. n-3 in a scratch
 * buffer registered once (its recvbuf holds one block) and reduces the last
 * step straight into recvbuf.
 *
 * The ring's long-lived state (staging slots, credits, segments that came
 * early) is its own (struct fr_ring_comm), created on the first ring
 * collective; READY messages travel through the peers' mailboxes and the
 * first one to the previous rank carries the staging slots' key.
 *
 * Determinism: chunk c is accumulated in the fixed order c, c+1, ..., c-1
 * and then copied bit for bit to everybody, so all ranks end with identical
 * bits and the same inputs give the same bits on every run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "log.h"
#include "peer.h"
#include "reduce.h"
#include "ring.h"
#include "util.h"

/*
 * The most slots a staging area is carved into: a slot number and the
 * credits a READY carries are 8 bits, and past a few hundred segments in
 * flight a rank is no more held back by its successor than by the wire.
 */
#define RING_MAX_WINDOW 128
_Static_assert(RING_MAX_WINDOW >= FR_MAX_SLOTS && RING_MAX_WINDOW < 256,
	       "slot numbers and READY credits are 8 bits");

/*
 * Segments we hand the transport for the next rank before it has sent the
 * earlier ones on (fr_peer_unsent): what is not posted yet can still go
 * out in a better order.  The transport's send queue is a FIFO of 64
 * writes, and the all-gather, which needs no credits, filled it with up to
 * 32 MiB while a reduce-scatter segment that the next rank needed sooner
 * waited behind them: 64 MiB on 4 ranks at 1 Gbit/s took 0.86 to 1.06 s
 * a call from job to job, and 0.91 to 0.94 s with four (perf/bench/
 * README.md, "The all-gather's place in the send queue").  Four keep the
 * socket fed between two passes of progress: the kernel's send buffer
 * holds megabytes more.
 */
#define RING_QUEUED 4

struct fr_ring_comm {
	int next, prev;
	/* staging: slots x segment_bytes that our previous rank writes
	 * into, in rx_win slots (ring_slot_bytes) */
	void *staging;
	size_t staging_len;
	struct fr_mem *staging_mem;
	bool staging_key_sent;
	/* the next rank's staging slots */
	struct fr_tp_rkey next_staging;
	bool have_next_staging;
	/* staging flow: counters are continuous across collectives */
	uint64_t rs_sent;     /* segments written into next's staging */
	uint64_t rs_received; /* segments landed in our staging */
	int credits;	      /* free slots at next */
	int credits_owed;     /* slots freed here, not yet told to prev */
	bool owed_now;	      /* return them all now (a deep window ended) */
	/* the layouts in use, from serial base on: tx of next's staging,
	 * rx of ours, each in win slots of ring_slot_bytes(win) bytes (every
	 * rank's staging is slots x segment_bytes) */
	int tx_win, rx_win;
	uint64_t tx_base, rx_base;
	/* segments prev wrote into our staging for a collective we have not
	 * started yet (it need not wait for us: the slots are ours) */
	struct {
		uint32_t payload, len;
	} rs_early[RING_MAX_WINDOW];
	int n_rs_early;
};

struct cursor {
	int k;	  /* step */
	size_t j; /* segment within the step's chunk */
};

enum stream { RS_SEND, RS_RECV, AG_SEND, AG_RECV };

/* READY payload (little-endian). */
#define READY_TO_NEXT 1 /* from the receiver's previous rank */
#define READY_TO_PREV 2 /* from the receiver's next rank */
#define READY_LEN (24 + 2 * FR_TP_RKEY_MAX)

struct ready {
	uint8_t role, credits, has_key, keylen;
	uint32_t mem_id;
	uint64_t dest_off;
	uint8_t has_staging, staging_keylen;
	uint8_t key[FR_TP_RKEY_MAX], staging_key[FR_TP_RKEY_MAX];
};

struct fr_ring_state {
	int n, r, rs_steps, ag_steps; /* r: our position in the ring */
	int me;			      /* our rank: our block of RS/AG */
	const int *order;	      /* comm->ring_order */
	size_t count, es, seg;	      /* count: elements of the whole vector */
	size_t blk;		      /* RS/AG: elements per block */
	enum fr_coll coll;
	const uint8_t *sbuf; /* step-0 reduce-scatter input */
	uint8_t *work;	     /* where partial sums / the gathered vector live */
	uint8_t *rbuf;	     /* the caller's recvbuf */
	struct fr_mem *smem, *wmem;
	size_t soff, woff; /* of sbuf / work inside their registrations */
	bool wmem_owned;   /* acquired here (not the scratch) */
	fr_reduce_fn kern;
	bool avg;
	bool sent_ready_prev, sent_ready_next;
	bool ready_prev, ready_next;
	const struct fr_tp_rkey *dst; /* next rank's recvbuf */
	uint64_t dst_off;
	struct cursor cur[4];
	uint32_t ag_sent, ag_recvd; /* segment serials in the all-gather */
	/* the staging layout of this collective's reduce-scatter (win
	 * slots); 0: it writes no staging, any layout will do */
	int win;
};

static void ready_encode(const struct ready *m, uint8_t *b)
{
	memset(b, 0, READY_LEN);
	b[0] = m->role;
	b[1] = m->credits;
	b[2] = m->has_key;
	b[3] = m->keylen;
	fr_put_le32(b + 4, m->mem_id);
	fr_put_le64(b + 8, m->dest_off);
	b[16] = m->has_staging;
	b[17] = m->staging_keylen;
	memcpy(b + 24, m->key, FR_TP_RKEY_MAX);
	memcpy(b + 24 + FR_TP_RKEY_MAX, m->staging_key, FR_TP_RKEY_MAX);
}

static int ready_decode(const uint8_t *b, size_t len, struct ready *m)
{
	if (len != READY_LEN)
		return FR_EPROTO;
	m->role = b[0];
	m->credits = b[1];
	m->has_key = b[2];
	m->keylen = b[3];
	m->mem_id = fr_get_le32(b + 4);
	m->dest_off = fr_get_le64(b + 8);
	m->has_staging = b[16];
	m->staging_keylen = b[17];
	memcpy(m->key, b + 24, FR_TP_RKEY_MAX);
	memcpy(m->staging_key, b + 24 + FR_TP_RKEY_MAX, FR_TP_RKEY_MAX);
	if ((m->role != READY_TO_NEXT && m->role != READY_TO_PREV) ||
	    m->has_key > 1 || m->keylen > FR_TP_RKEY_MAX ||
	    m->has_staging > 1 || m->staging_keylen > FR_TP_RKEY_MAX ||
	    m->credits > RING_MAX_WINDOW)
		return FR_EPROTO;
	return 0;
}

/* ---- the ring's own long-lived state ------------------------------------ */

static struct fr_ring_comm *ring_of(const struct fr_comm *comm)
{
	return comm->algo.state[FR_ASTATE_RING];
}

static int ring_comm_get(struct fr_comm *comm, struct fr_ring_comm **out)
{
	struct fr_ring_comm *rc = ring_of(comm);
	size_t ps = 4096, sz;
	int err;

	if (rc) {
		*out = rc;
		return 0;
	}
	rc = calloc(1, sizeof(*rc));
	if (!rc)
		return FR_ENOMEM;
	rc->next =
		comm->topo.ring_order[(comm->topo.ring_pos + 1) % comm->nranks];
	rc->prev =
		comm->topo.ring_order[(comm->topo.ring_pos + comm->nranks - 1) %
				      comm->nranks];
	rc->credits = rc->tx_win = rc->rx_win = comm->algo.slots;
	sz = (size_t)comm->algo.slots * comm->algo.segment_bytes;
	rc->staging = aligned_alloc(ps, (sz + ps - 1) / ps * ps);
	if (!rc->staging) {
		/* name what was asked for and the knobs that size it */
		fr_comm_seterr(
			comm, FR_ENOMEM,
			"rank %d: cannot allocate the ring's %zu MiB of staging buffers (FR_SLOTS=%d x FR_SEGMENT_BYTES=%zu): lower those, or raise the memory limit (ulimit -v, the job's cgroup)",
			comm->rank, sz >> 20, comm->algo.slots,
			comm->algo.segment_bytes);
		err = FR_ENOMEM;
		goto err_staging;
	}
	err = fr_mem_register_internal(comm, rc->staging, sz,
				       FR_TP_LOCAL_READ | FR_TP_REMOTE_WRITE,
				       false, &rc->staging_mem);
	if (err)
		goto err_reg;
	rc->staging_len = sz;
	comm->algo.state[FR_ASTATE_RING] = rc;
	*out = rc;
	return 0;

err_reg:
	free(rc->staging);
err_staging:
	free(rc);
	return err;
}

static void ring_comm_free(struct fr_comm *comm)
{
	struct fr_ring_comm *rc = ring_of(comm);

	if (!rc)
		return;
	/* kept by the endpoint while a late write may land in it */
	fr_mem_free_buf(rc->staging_mem, rc->staging, rc->staging_len,
			fr_release_heap);
	free(rc);
	comm->algo.state[FR_ASTATE_RING] = NULL;
}

/* ---- schedule helpers
 * ---------------------------------------------------------- */

static int stream_steps(const struct fr_ring_state *st, enum stream s)
{
	return s <= RS_RECV ? st->rs_steps : st->ag_steps;
}

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

/* Elements of chunk c: count/n split for All-Reduce; block (c-1) mod n of
 * the n equal blocks for reduce-scatter and all-gather. */
static void chunk_range(const struct fr_ring_state *st, int c, size_t *off,
			size_t *cnt)
{
	if (st->coll == FR_COLL_ALLREDUCE) {
		fr_ring_chunk(st->count, st->n, c, off, cnt);
		return;
	}
	*off = (size_t)st->order[fr_ring_mod((long)c - 1, st->n)] * st->blk;
	*cnt = st->blk;
}

/* Byte offset (in the vector) and length of segment (k, j). */
static void seg_range(const struct fr_ring_state *st, enum stream s,
		      const struct cursor *c, size_t *off, size_t *len)
{
	size_t coff, ccnt, e0;

	chunk_range(st, stream_chunk(st, s, c->k), &coff, &ccnt);
	e0 = c->j * st->seg;
	*off = (coff + e0) * st->es;
	*len = FR_MIN(st->seg, ccnt - e0) * st->es;
}

/* Skip to the next existing segment (chunks may be empty). */
static void cur_norm(struct fr_ring_state *st, enum stream s)
{
	struct cursor *c = &st->cur[s];

	while (c->k < stream_steps(st, s)) {
		size_t coff, ccnt;

		chunk_range(st, stream_chunk(st, s, c->k), &coff, &ccnt);
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
	return st->cur[s].k >= stream_steps(st, s);
}

/* Has stream s gone past segment (k, j)? */
static bool past(const struct fr_ring_state *st, enum stream s, int k, size_t j)
{
	const struct cursor *c = &st->cur[s];

	return c->k > k || (c->k == k && c->j > j);
}

/* A slot's bytes in a layout of win slots (every rank's staging is the
 * same slots x segment_bytes, so both neighbours agree) */
static size_t ring_slot_bytes(const struct fr_ring_comm *rc, int win)
{
	return rc->staging_len / (size_t)win;
}

/*
 * The staging layout for `segs` segments a rank of at most `need` bytes,
 * as its number of slots, win: the area of slots x segment_bytes in
 * halves of the slot (a slot is then ring_slot_bytes(win) exactly) while
 * the segment fits and slots stay 64-byte aligned, until the window holds
 * an eighth of the segments, up to RING_MAX_WINDOW slots.  A larger window
 * pays only where a collective has many segments (a large job's: 4,095 a
 * rank at 4,096 ranks); a small job's few would only be spread over more
 * of the staging, and more of the cache (4 ranks' 32 KiB took 1.5 times as
 * long in 128 slots as in 8, shm on this 2-core host), so with fewer than
 * 8 (slots + 1) segments a rank (up to 72 ranks at the defaults) the
 * layout is FR_SLOTS slots of FR_SEGMENT_BYTES whatever the size.
 */
static int ring_window(const struct fr_comm *comm, size_t need, size_t segs)
{
	int win = comm->algo.slots;
	size_t sb = comm->algo.segment_bytes;

	while (win * 2 <= RING_MAX_WINDOW && (size_t)win < segs / 8 &&
	       sb / 2 >= need && sb % 128 == 0) {
		win *= 2;
		sb /= 2;
	}
	return win;
}

/* The layout of st's reduce-scatter: 0 where it writes no staging. */
static void state_window(const struct fr_comm *comm, struct fr_ring_state *st)
{
	size_t most;

	if (!st->rs_steps || !st->count || st->n == 1)
		return;
	/* the largest chunk: count/n plus one, or the block */
	most = st->coll == FR_COLL_ALLREDUCE
		       ? (st->count + (size_t)st->n - 1) / (size_t)st->n
		       : st->blk;
	/* (the segments: as if every chunk were the largest) */
	if (most)
		st->win = ring_window(comm, FR_MIN(st->seg, most) * st->es,
				      (size_t)st->rs_steps *
					      fr_ring_nsegs(most, st->seg));
}

/* The ring's state of the collective running now, if it is a ring's. */
static struct fr_ring_state *active_ring(struct fr_request *req)
{
	return req && req->algo == &fr_algo_ring ? req->algo_state : NULL;
}

/* ---- start / finish
 * --------------------------------------------------------------- */

static int on_rs(struct fr_comm *comm, struct fr_request *req, uint32_t payload,
		 uint32_t len);

static int acquire(struct fr_comm *comm, const void *buf, size_t len,
		   int access, struct fr_mem **mem, size_t *off)
{
	int rc = fr_mem_acquire(comm, buf, len, access, mem);

	if (!rc)
		*off = (uintptr_t)buf - (*mem)->base;
	return rc;
}

static int ring_start(struct fr_comm *comm, struct fr_request *req)
{
	struct fr_ring_state *st;
	struct fr_ring_comm *rc;
	const int rw =
		FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE;
	size_t bytes, blkb;
	int err;

	st = calloc(1, sizeof(*st));
	if (!st)
		return FR_ENOMEM;
	req->algo_state = st;
	st->n = comm->nranks;
	st->r = comm->topo.ring_pos;
	st->me = comm->rank;
	st->order = comm->topo.ring_order;
	st->coll = req->coll;
	st->count = fr_coll_count_total(req);
	st->blk = req->count;
	st->es = fr_dtype_size(req->dtype);
	st->seg = FR_MAX(comm->algo.segment_bytes / st->es, (size_t)1);
	st->kern = req->coll == FR_COLL_ALLGATHER
			   ? NULL
			   : fr_reduce_kernel(req->dtype, req->op);
	st->avg = req->op == FR_AVG && req->coll != FR_COLL_ALLGATHER;
	st->rbuf = req->recvbuf;
	st->rs_steps = req->coll == FR_COLL_ALLGATHER ? 0 : st->n - 1;
	st->ag_steps = req->coll == FR_COLL_REDUCE_SCATTER ? 0 : st->n - 1;
	bytes = st->count * st->es;
	blkb = st->blk * st->es;

	if (comm->peer.peers[st->order[(st->r + 1) % st->n]].bye ||
	    comm->peer.peers[st->order[(st->r + st->n - 1) % st->n]].bye)
		return fr_comm_fail(
			comm, FR_EPEER,
			"rank %d: collective #%u: a ring neighbour has destroyed its communicator",
			comm->rank, req->seq);
	switch (req->coll) {
	case FR_COLL_ALLREDUCE:
		st->work = st->rbuf;
		st->sbuf =
			req->sendbuf == FR_IN_PLACE ? st->rbuf : req->sendbuf;
		if (st->n == 1 && bytes && st->sbuf != st->rbuf)
			memcpy(st->rbuf, st->sbuf, bytes);
		break;
	case FR_COLL_REDUCE_SCATTER:
		st->sbuf = req->sendbuf;
		if (st->n == 1 && blkb && st->sbuf != st->rbuf)
			memcpy(st->rbuf, st->sbuf, blkb);
		break;
	default: /* all-gather: our block goes in place first */
		st->work = st->rbuf;
		st->sbuf = req->sendbuf == FR_IN_PLACE
				   ? st->rbuf + (size_t)st->me * blkb
				   : req->sendbuf;
		if (blkb && st->sbuf != st->rbuf + (size_t)st->me * blkb)
			memcpy(st->rbuf + (size_t)st->me * blkb, st->sbuf,
			       blkb);
		break;
	}
	if (st->n == 1) {
		st->ready_prev = st->ready_next = true;
		st->sent_ready_prev = st->sent_ready_next = true;
		return 0;
	}
	err = ring_comm_get(comm, &rc);
	if (err)
		return err;
	state_window(comm, st);
	if (bytes) {
		if (req->coll == FR_COLL_REDUCE_SCATTER) {
			err = fr_scratch_get(comm, bytes);
			if (err)
				return err;
			st->work = comm->mem.scratch;
			st->wmem = comm->mem.scratch_mem;
			st->woff = 0;
			err = acquire(comm, st->sbuf, bytes, FR_TP_LOCAL_READ,
				      &st->smem, &st->soff);
		} else {
			err = acquire(comm, st->work, bytes, rw, &st->wmem,
				      &st->woff);
			st->wmem_owned = !err;
			if (!err && req->coll == FR_COLL_ALLGATHER) {
				st->smem = st->wmem;
				st->wmem->refs++;
				st->soff = st->woff + (size_t)st->me * blkb;
			} else if (!err && st->sbuf == st->rbuf) {
				st->smem = st->wmem;
				st->wmem->refs++;
				st->soff = st->woff;
			} else if (!err) {
				err = acquire(comm, st->sbuf, bytes,
					      FR_TP_LOCAL_READ, &st->smem,
					      &st->soff);
			}
		}
		if (err)
			return err;
	}
	for (int s = 0; s < 4; s++)
		cur_norm(st, (enum stream)s);
	fr_peer_need(comm, rc->next);
	fr_peer_need(comm, rc->prev);
	return comm->fail.failed;
}

static void ring_free(struct fr_request *req)
{
	struct fr_ring_state *st = req->algo_state;

	if (!st)
		return;
	if (st->smem)
		fr_mem_release(st->smem);
	if (st->wmem && st->wmem_owned)
		fr_mem_release(st->wmem);
	free(st);
	req->algo_state = NULL;
}

static bool ring_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct fr_ring_state *st = req->algo_state;

	return st && st->ready_prev && st->ready_next &&
	       cur_done(st, RS_SEND) && cur_done(st, RS_RECV) &&
	       cur_done(st, AG_SEND) && cur_done(st, AG_RECV) &&
	       comm->peer.user_outstanding == 0;
}

static int ring_waiting_on(const struct fr_comm *comm,
			   const struct fr_request *req)
{
	const struct fr_ring_state *st = req->algo_state;
	const struct fr_ring_comm *rc = ring_of(comm);

	/* Next: before its READY, when our sends wait for its credits, and
	 * once all that comes from prev has come (only sends are left; prev
	 * may well have finished and left meanwhile). */
	if (st && rc &&
	    (!st->ready_next ||
	     (!cur_done(st, RS_SEND) &&
	      (rc->credits == 0 || (st->win && st->win != rc->tx_win))) ||
	     (st->ready_prev && cur_done(st, RS_RECV) &&
	      cur_done(st, AG_RECV))))
		return rc->next;
	return rc ? rc->prev
		  : comm->topo.ring_order[(comm->topo.ring_pos + comm->nranks -
					   1) %
					  comm->nranks];
}

/* ---- sending
 * ------------------------------------------------------------------------ */

static int send_ready(struct fr_comm *comm, struct fr_request *req,
		      bool to_next)
{
	struct fr_ring_state *st = req->algo_state;
	struct fr_ring_comm *rc = ring_of(comm);
	int peer_rank = to_next ? rc->next : rc->prev;
	struct ready r = {.role = to_next ? READY_TO_NEXT : READY_TO_PREV};
	uint8_t payload[READY_LEN];
	struct fr_msg m;
	int err;

	if (!to_next) {
		r.credits = (uint8_t)rc->credits_owed;
		/* the staging key, once */
		if (!rc->staging_key_sent) {
			size_t kl = FR_TP_RKEY_MAX;

			err = fr_mem_pack_key(rc->staging_mem, r.staging_key,
					      &kl);
			if (err)
				return err;
			r.has_staging = 1;
			r.staging_keylen = (uint8_t)kl;
		}
	}
	/* The previous rank writes the all-gather into our recvbuf. */
	if (!to_next && st->ag_steps && st->wmem) {
		size_t kl = FR_TP_RKEY_MAX;

		r.mem_id = st->wmem->id;
		r.dest_off = st->woff;
		err = fr_peer_key_offer(comm, peer_rank, st->wmem, r.key, &kl);
		if (err < 0)
			return err;
		r.has_key = err == 1;
		r.keylen = (uint8_t)kl;
	}
	ready_encode(&r, payload);
	fr_msg_for(req, FR_MSG_READY, &m);
	err = fr_msg_send(comm, peer_rank, &m, payload, READY_LEN);
	if (err)
		return err;
	if (!to_next) {
		rc->credits_owed -= r.credits;
		rc->owed_now = rc->owed_now && rc->credits_owed;
		if (r.has_staging)
			rc->staging_key_sent = true;
	}
	if (r.has_key)
		fr_peer_key_sent(comm, peer_rank, st->wmem);
	return 0;
}

static int flush_credits(struct fr_comm *comm, bool *did_work)
{
	struct fr_ring_comm *rc = ring_of(comm);
	int err;

	/*
	 * Few credits owed ride on our next READY to prev instead of a
	 * message of their own (small collectives then send one message
	 * less); prev still holds more than half its slots meanwhile, so
	 * it is never held up by them - unless its next collective takes
	 * another layout, for which it needs them all back: after one in a
	 * window larger than FR_SLOTS (a large job's, a message is nothing
	 * beside its segments) they go at once, so that the next starts as
	 * soon as it would have.
	 */
	if (!rc || !rc->credits_owed ||
	    (!rc->owed_now && rc->credits_owed < FR_MAX(rc->rx_win / 2, 1)))
		return 0;
	err = fr_peer_write(comm, rc->prev, NULL, 0, NULL, 0, 0,
			    FR_IMM(FR_IMM_RCREDIT, (uint32_t)rc->credits_owed),
			    false);
	if (err)
		return err;
	rc->credits_owed = 0;
	rc->owed_now = false;
	*did_work = true;
	return 0;
}

static int ring_progress(struct fr_comm *comm, struct fr_request *active,
			 bool *did_work)
{
	int err = flush_credits(comm, did_work);

	(void)active;
	if (err && err != FR_EAGAIN)
		return fr_comm_fail(comm, err,
				    "rank %d: returning staging credits: %s",
				    comm->rank, fr_strerror(err));
	return 0;
}

static int post(struct fr_comm *comm, struct fr_mem *lmem, size_t loff,
		const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		uint32_t imm)
{
	return fr_peer_write(comm, ring_of(comm)->next, lmem, loff, rkey, roff,
			     len, imm, true);
}

/* Reduce-scatter segments, in order, while the next rank has free slots. */
static int send_rs(struct fr_comm *comm, struct fr_ring_state *st,
		   bool *did_work)
{
	struct fr_ring_comm *rc = ring_of(comm);

	/* A new layout of next's staging once all of the old is free, from
	 * the collective's first segment on (next changes at that one too) */
	if (!cur_done(st, RS_SEND) && st->win && st->win != rc->tx_win) {
		if (rc->credits < rc->tx_win)
			return 0;
		rc->tx_win = st->win;
		rc->tx_base = rc->rs_sent;
		rc->credits = st->win;
	}
	while (!cur_done(st, RS_SEND) && rc->credits > 0 &&
	       rc->have_next_staging &&
	       fr_peer_unsent(comm, rc->next) < RING_QUEUED) {
		struct cursor *c = &st->cur[RS_SEND];
		uint32_t slot = (uint32_t)((rc->rs_sent - rc->tx_base) %
					   (uint64_t)rc->tx_win);
		uint32_t serial = (uint32_t)(rc->rs_sent & 0xfff);
		struct fr_mem *src;
		size_t off, len, loff;
		int err;

		if (c->k > 0 && !past(st, RS_RECV, c->k - 1, c->j))
			break; /* not reduced here yet */
		seg_range(st, RS_SEND, c, &off, &len);
		/* Step 0 sends our input; later steps what we reduced. */
		if (c->k == 0) {
			src = st->smem;
			loff = st->soff + off;
		} else {
			src = st->wmem;
			loff = st->woff + off;
		}
		err = post(comm, src, loff, &rc->next_staging,
			   (uint64_t)slot * ring_slot_bytes(rc, rc->tx_win),
			   len, FR_IMM(FR_IMM_RS, serial << 8 | slot));
		if (err == FR_EAGAIN)
			break;
		if (err)
			return err;
		rc->credits--;
		rc->rs_sent++;
		cur_next(st, RS_SEND);
		*did_work = true;
	}
	return 0;
}

/* All-gather segments, in order, straight into the next rank's recvbuf. */
static int send_ag(struct fr_comm *comm, struct fr_ring_state *st,
		   bool *did_work)
{
	struct fr_ring_comm *rc = ring_of(comm);

	while (!cur_done(st, AG_SEND) &&
	       fr_peer_unsent(comm, rc->next) < RING_QUEUED) {
		struct cursor *c = &st->cur[AG_SEND];
		size_t off, len, loff;
		int err;

		if (c->k == 0 ? st->rs_steps && !past(st, RS_RECV,
						      st->rs_steps - 1, c->j)
			      : !past(st, AG_RECV, c->k - 1, c->j))
			break;
		seg_range(st, AG_SEND, c, &off, &len);
		/* all-gather's own block was copied into recvbuf at start */
		loff = st->woff + off;
		err = post(comm, st->wmem, loff, st->dst, st->dst_off + off,
			   len, FR_IMM(FR_IMM_AG, st->ag_sent));
		if (err == FR_EAGAIN)
			break;
		if (err)
			return err;
		st->ag_sent++;
		cur_next(st, AG_SEND);
		*did_work = true;
	}
	return 0;
}

/* ---- receiving
 * ------------------------------------------------------------------ */

static int apply_ready(struct fr_comm *comm, struct fr_request *req, int from,
		       const struct ready *m)
{
	struct fr_ring_state *st = req->algo_state;
	struct fr_ring_comm *rc = ring_of(comm);
	int err;

	if (m->role == READY_TO_NEXT) {
		/* from our previous rank */
		if (from != rc->prev || st->ready_prev || m->credits ||
		    m->has_key || m->has_staging)
			goto bad;
		st->ready_prev = true;
		return 0;
	}
	if (from != rc->next || st->ready_next)
		goto bad;
	if (m->credits) {
		rc->credits += m->credits;
		if (rc->credits > rc->tx_win)
			goto bad;
	}
	if (m->has_staging) {
		err = fr_mem_unpack_key(comm, m->staging_key, m->staging_keylen,
					&rc->next_staging);
		if (err)
			goto bad;
		rc->have_next_staging = true;
	}
	if (m->has_key || (st->ag_steps && st->count)) {
		/* its recvbuf, where our all-gather goes */
		bool want = st->ag_steps && st->count;

		err = fr_peer_key_learn(comm, from, m->mem_id,
					m->has_key ? m->key : NULL, m->keylen,
					want ? &st->dst : NULL);
		if (err == FR_ENOMEM)
			return fr_comm_fail(
				comm, err,
				"rank %d: no memory for rank %d's keys",
				comm->rank, from);
		if (err == FR_EINVAL)
			goto bad; /* id 0, or a key that does not unpack */
		if (err)
			return fr_comm_fail(
				comm, err,
				"rank %d: rank %d named a receive buffer whose key it never sent",
				comm->rank, from);
		if (want)
			st->dst_off = m->dest_off;
	}
	st->ready_next = true;
	return 0;
bad:
	return fr_comm_fail(comm, FR_EPROTO,
			    "rank %d: unexpected ring READY from rank %d",
			    comm->rank, from);
}

/* READY messages from the neighbours, in the order they were sent. */
static int take_readies(struct fr_comm *comm, struct fr_request *req,
			bool *did_work)
{
	struct fr_ring_state *st = req->algo_state;
	struct fr_ring_comm *rc = ring_of(comm);
	int from[2] = {rc->prev, rc->next};

	for (int i = 0; i < 2 && !(st->ready_prev && st->ready_next); i++) {
		for (;;) {
			const struct fr_msg *m;
			const uint8_t *p;
			struct ready r;
			int err;

			if (st->ready_prev && st->ready_next)
				break;
			err = fr_msg_get(comm, req, from[i], &m, &p);
			if (err == FR_EAGAIN)
				break;
			if (err)
				return err;
			if (m->type != FR_MSG_READY ||
			    ready_decode(p, m->len, &r))
				return fr_comm_fail(
					comm, FR_EPROTO,
					"rank %d: malformed ring READY from rank %d",
					comm->rank, from[i]);
			err = apply_ready(comm, req, from[i], &r);
			if (err)
				return err;
			fr_msg_consume(comm, from[i]);
			*did_work = true;
		}
	}
	return 0;
}

/* Reduce-scatter segments kept until our READY check (on_rs parks them). */
static int take_early(struct fr_comm *comm, struct fr_request *req,
		      bool *did_work)
{
	struct fr_ring_comm *rc = ring_of(comm);
	int n = rc->n_rs_early, err = 0;
	struct {
		uint32_t payload, len;
	} early[RING_MAX_WINDOW];

	memcpy(early, rc->rs_early, sizeof(early[0]) * (size_t)n);
	rc->n_rs_early = 0;
	for (int i = 0; i < n && !err; i++)
		err = on_rs(comm, req, early[i].payload, early[i].len);
	*did_work = true;
	return err;
}

static int ring_advance(struct fr_comm *comm, struct fr_request *req,
			bool *did_work)
{
	struct fr_ring_state *st = req->algo_state;
	struct fr_ring_comm *rc = ring_of(comm);
	int err;

	if (st->n == 1)
		return 0;
	err = fr_peer_need(comm, rc->next);
	if (!err)
		err = fr_peer_need(comm, rc->prev);
	if (err)
		return err == FR_EAGAIN ? 0 : err;
	if (!st->sent_ready_next) {
		err = send_ready(comm, req, true);
		if (err == FR_EAGAIN)
			return 0;
		if (err)
			return err;
		st->sent_ready_next = true;
		*did_work = true;
	}
	if (!st->sent_ready_prev) {
		err = send_ready(comm, req, false);
		if (err == FR_EAGAIN)
			return 0;
		if (err)
			return err;
		st->sent_ready_prev = true;
		*did_work = true;
	}
	err = take_readies(comm, req, did_work);
	if (!err && st->ready_prev && rc->n_rs_early && !cur_done(st, RS_RECV))
		err = take_early(comm, req, did_work);
	if (err)
		return err;
	/*
	 * Reduce-scatter segments go into the next rank's staging slots,
	 * which are its communicator's, not its user buffers: they may go
	 * before its READY (it keeps them until it starts).  The all-gather
	 * writes into its recvbuf and waits for the READY naming it.
	 */
	err = send_rs(comm, st, did_work);
	if (!err && st->ready_next)
		err = send_ag(comm, st, did_work);
	if (!err)
		err = flush_credits(comm, did_work);
	return err == FR_EAGAIN ? 0 : err;
}

static int on_rs(struct fr_comm *comm, struct fr_request *req, uint32_t payload,
		 uint32_t len)
{
	struct fr_ring_state *st = active_ring(req);
	struct fr_ring_comm *rc = ring_of(comm);
	uint32_t slot, serial = (uint32_t)(rc->rs_received & 0xfff);
	size_t off, n;
	const uint8_t *in;
	uint8_t *dst;
	struct cursor *c;

	/*
	 * For a collective we have not started, or whose READY from prev we
	 * have not checked yet: keep it until then (it sits in our own
	 * staging slot, and credits bound how many), so that nothing is
	 * reduced before prev is known to have called the same collective.
	 */
	if ((!st || cur_done(st, RS_RECV) || !st->ready_prev) &&
	    rc->n_rs_early < RING_MAX_WINDOW) {
		rc->rs_early[rc->n_rs_early].payload = payload;
		rc->rs_early[rc->n_rs_early++].len = len;
		return 0;
	}
	/*
	 * The first segment of a collective whose layout is not the one in
	 * use: prev changed layout at the same segment of the same stream
	 * (its first of the collective), once everything it wrote under the
	 * old one had been reduced here.
	 */
	if (st && !cur_done(st, RS_RECV) && st->ready_prev && st->win &&
	    st->win != rc->rx_win) {
		rc->rx_win = st->win;
		rc->rx_base = rc->rs_received;
	}
	slot = (uint32_t)((rc->rs_received - rc->rx_base) %
			  (uint64_t)rc->rx_win);
	if (!st || cur_done(st, RS_RECV) || !st->ready_prev ||
	    payload != (serial << 8 | slot))
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: unexpected reduce-scatter segment from rank %d",
			comm->rank, rc->prev);
	c = &st->cur[RS_RECV];
	seg_range(st, RS_RECV, c, &off, &n);
	if (len != n)
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: segment of %u bytes from rank %d, expected %zu",
			comm->rank, len, rc->prev, n);
	in = (const uint8_t *)rc->staging +
	     (size_t)slot * ring_slot_bytes(rc, rc->rx_win);
	dst = st->work + off;
	/* reduce-scatter: the last step goes straight to the caller */
	if (st->coll == FR_COLL_REDUCE_SCATTER && c->k == st->rs_steps - 1)
		dst = st->rbuf + (off - (size_t)st->me * st->blk * st->es);
	st->kern(dst, st->sbuf + off, in, n / st->es);
	if (st->avg && c->k == st->rs_steps - 1)
		fr_reduce_scale_avg(req->dtype, dst, n / st->es, st->n);
	rc->rs_received++;
	rc->credits_owed++;
	cur_next(st, RS_RECV);
	if (cur_done(st, RS_RECV) && st->win > comm->algo.slots)
		rc->owed_now = true;
	return 0;
}

static int on_ag(struct fr_comm *comm, struct fr_request *req, uint32_t payload,
		 uint32_t len)
{
	struct fr_ring_state *st = active_ring(req);
	size_t off, n;

	if (!st || cur_done(st, AG_RECV) ||
	    payload != (st->ag_recvd & FR_IMM_PAYLOAD_MASK))
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: unexpected all-gather segment from rank %d",
			comm->rank, ring_of(comm)->prev);
	seg_range(st, AG_RECV, &st->cur[AG_RECV], &off, &n);
	if (len != n)
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: segment of %u bytes from rank %d, expected %zu",
			comm->rank, len, ring_of(comm)->prev, n);
	st->ag_recvd++;
	cur_next(st, AG_RECV);
	return 0;
}

static int ring_on_cqe(struct fr_comm *comm, struct fr_request *active,
		       int peer, const struct fr_tp_cqe *cqe)
{
	struct fr_ring_comm *rc = ring_of(comm);
	uint32_t type = FR_IMM_TYPE(cqe->imm),
		 payload = FR_IMM_PAYLOAD(cqe->imm);

	if (!rc)
		goto bad;
	switch (type) {
	case FR_IMM_RCREDIT:
		if (peer != rc->next || cqe->len)
			goto bad;
		rc->credits += (int)payload;
		if (rc->credits > rc->tx_win)
			goto bad;
		return 0;
	case FR_IMM_RS:
		if (peer != rc->prev)
			goto bad;
		return on_rs(comm, active, payload, cqe->len);
	case FR_IMM_AG:
		if (peer != rc->prev)
			goto bad;
		return on_ag(comm, active, payload, cqe->len);
	}
bad:
	return fr_comm_fail(
		comm, FR_EPROTO,
		"rank %d: unexpected ring message (immediate 0x%08x) from rank %d",
		comm->rank, cqe->imm, peer);
}

const struct fr_algo fr_algo_ring = {
	.id = FR_ALGO_RING,
	.name = "ring",
	.start = ring_start,
	.advance = ring_advance,
	.done = ring_done,
	.free = ring_free,
	.waiting_on = ring_waiting_on,
	.imm_types = 1u << FR_IMM_RS | 1u << FR_IMM_AG | 1u << FR_IMM_RCREDIT,
	.on_cqe = ring_on_cqe,
	.progress = ring_progress,
	.comm_free = ring_comm_free,
};
