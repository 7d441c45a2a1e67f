/* SPDX-License-Identifier: MIT */
/*
 * vring.c - all-gatherv and reduce-scatterv: the ring with a block per rank
 * of any size, through the mailboxes.
 *
 * Schedule (n ranks laid out in the ring's order, comm->topo.ring_order,
 * p our position, o(i) the rank at position i mod n; "next" and "prev" by
 * position, as in ring.c):
 *
 *   all-gatherv, steps k = 0 .. n-2: send block o(p-k) to next (at k = 0
 *     our own, then what arrived at step k-1); receive block o(p-k-1) from
 *     prev straight into recvbuf at its displacement.  After n-1 steps
 *     every rank holds every block.
 *   reduce-scatterv, steps k = 0 .. n-2: send the partial sum of block
 *     o(p-k-1) to next (at k = 0 our own input of it, then the sum made at
 *     step k-1); receive the partial sum of block o(p-k-2) from prev and
 *     add our input of that block to it.  At k = n-2 that block is our
 *     own, o(p), and the sum goes into recvbuf: it now holds every rank's
 *     contribution, folded in ring order starting after its owner.
 *
 * Pipelining: every block is a transfer of mailbox fragments (xfer.c), and
 * fragment f of step k+1 goes out as soon as fragment f of step k has
 * arrived (and been reduced), so a large vector streams around the ring
 * as in ring.c.  Blocks of different sizes cost nothing extra: an empty
 * block is one empty message, and each fragment carries a tag of its
 * block's length, so ranks whose counts disagree fail with FR_EMISMATCH.
 * The data is copied through the mailboxes (the zero-copy ring of ring.c
 * needs equal blocks at offsets every rank can compute).
 *
 * Determinism: block b is folded in the fixed order of positions after
 * b's owner, so the same inputs give the same bits on every run.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"

struct vr_state {
	int n, pos, next, prev;
	int ktx, krx; /* steps of the send and the receive side */
	size_t es;
	bool reduces; /* reduce-scatterv */
	fr_reduce_fn kern;
	const size_t *counts, *displs; /* blocks: elements, by rank */
	const uint8_t *in;	       /* reduce-scatterv: our input */
	uint8_t *out;		       /* all-gatherv: recvbuf */
	uint8_t *acc;		       /* reduce-scatterv: partial sums */
	bool finished;		       /* FR_AVG scaled */
	struct fr_xfer tx, rx;
};

static int owner(const struct fr_comm *comm, const struct vr_state *st,
		 int back)
{
	return comm->topo
		.ring_order[((st->pos - back) % st->n + st->n) % st->n];
}

/* The block sent at step k, and received at step k. */
static int tx_block(const struct fr_comm *comm, const struct vr_state *st,
		    int k)
{
	return owner(comm, st, st->reduces ? k + 1 : k);
}

static int rx_block(const struct fr_comm *comm, const struct vr_state *st,
		    int k)
{
	return owner(comm, st, st->reduces ? k + 2 : k + 1);
}

static size_t blen(const struct vr_state *st, int b)
{
	return st->counts[b] * st->es;
}

static void vr_xfer(struct fr_comm *comm, struct vr_state *st,
		    struct fr_xfer *x, int b)
{
	fr_xfer_init(x, comm, blen(st, b));
	x->aux = fr_xfer_len_tag(x->len);
}

static int vr_start(struct fr_comm *comm, struct fr_request *req)
{
	struct vr_state *st = fr_algo_state_new(req, sizeof(*st));
	int n = comm->nranks, me = comm->rank;

	if (!st)
		return FR_ENOMEM;
	st->n = n;
	st->pos = comm->topo.ring_pos;
	st->next = comm->topo.ring_order[(st->pos + 1) % n];
	st->prev = comm->topo.ring_order[(st->pos + n - 1) % n];
	st->es = fr_dtype_size(req->dtype);
	st->reduces = req->coll == FR_COLL_REDUCE_SCATTERV;
	st->counts = fr_req_vec(req, FR_VEC_RCOUNTS, n);
	st->displs = fr_req_vec(
		req, st->reduces ? FR_VEC_SDISPLS : FR_VEC_RDISPLS, n);
	if (st->reduces) {
		size_t total = 0;

		st->kern = fr_reduce_kernel(req->dtype, req->op);
		st->in = req->sendbuf;
		for (int r = 0; r < n; r++)
			total = FR_MAX(total, (st->displs[r] + st->counts[r]) *
						      st->es);
		if (n > 1 && total) {
			st->acc = malloc(total);
			if (!st->acc)
				return FR_ENOMEM;
		}
		if (n == 1 && blen(st, me) && req->recvbuf != req->sendbuf)
			memcpy(req->recvbuf, st->in, blen(st, me));
	} else {
		st->out = req->recvbuf;
		if (req->sendbuf != FR_IN_PLACE && blen(st, me))
			memcpy(st->out + st->displs[me] * st->es, req->sendbuf,
			       blen(st, me));
	}
	if (n == 1) {
		st->finished = true; /* nothing to divide by one */
		return 0;
	}
	vr_xfer(comm, st, &st->tx, tx_block(comm, st, 0));
	vr_xfer(comm, st, &st->rx, rx_block(comm, st, 0));
	fr_peer_need(comm, st->next);
	fr_peer_need(comm, st->prev);
	return comm->fail.failed;
}

/* Where block b's bytes are: what we send or receive into. */
static uint8_t *vr_buf(const struct vr_state *st, uint8_t *base, int b)
{
	return blen(st, b) ? base + st->displs[b] * st->es : NULL;
}

static int vr_recv(struct fr_comm *comm, struct fr_request *req,
		   struct vr_state *st, bool *did_work)
{
	while (st->krx < st->n - 1) {
		int b = rx_block(comm, st, st->krx), rc;
		bool last = st->krx == st->n - 2;

		rc = fr_peer_need(comm, st->prev);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		if (!st->reduces)
			rc = fr_xfer_take(comm, req, &st->rx, st->prev,
					  (uint16_t)st->krx,
					  vr_buf(st, st->out, b), NULL, NULL, 1,
					  UINT32_MAX, did_work);
		else
			rc = fr_xfer_take(
				comm, req, &st->rx, st->prev, (uint16_t)st->krx,
				last ? (blen(st, b) ? req->recvbuf : NULL)
				     : vr_buf(st, st->acc, b),
				vr_buf(st, (uint8_t *)st->in, b), st->kern,
				st->es, UINT32_MAX, did_work);
		if (rc || !fr_xfer_complete(&st->rx))
			return rc;
		if (++st->krx < st->n - 1)
			vr_xfer(comm, st, &st->rx, rx_block(comm, st, st->krx));
	}
	return 0;
}

static int vr_send(struct fr_comm *comm, struct fr_request *req,
		   struct vr_state *st, bool *did_work)
{
	while (st->ktx < st->n - 1) {
		int k = st->ktx, b = tx_block(comm, st, k), rc;
		const uint8_t *src;
		size_t avail = blen(st, b);

		if (k == 0)
			src = vr_buf(st,
				     st->reduces ? (uint8_t *)st->in : st->out,
				     b);
		else
			src = vr_buf(st, st->reduces ? st->acc : st->out, b);
		/* from step 1 on we forward what step k - 1 received: only
		 * as far as it has come (an empty block once it came) */
		if (k > 0 && st->krx < k)
			avail = st->krx == k - 1 ? fr_xfer_bytes(comm, &st->rx,
								 st->rx.done)
						 : 0;
		if (k > 0 && st->krx < k && !blen(st, b))
			return 0;
		rc = fr_peer_need(comm, st->next);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		rc = fr_xfer_send(comm, req, &st->tx, st->next, (uint16_t)k,
				  src, avail, did_work);
		if (rc || !fr_xfer_complete(&st->tx))
			return rc;
		if (++st->ktx < st->n - 1)
			vr_xfer(comm, st, &st->tx, tx_block(comm, st, st->ktx));
	}
	return 0;
}

static int vr_advance(struct fr_comm *comm, struct fr_request *req,
		      bool *did_work)
{
	struct vr_state *st = req->algo_state;
	int rc;

	rc = vr_recv(comm, req, st, did_work);
	if (!rc)
		rc = vr_send(comm, req, st, did_work);
	if (rc)
		return rc;
	if (st->reduces && !st->finished && st->krx >= st->n - 1 &&
	    st->ktx >= st->n - 1) {
		size_t cnt = st->counts[comm->rank];

		if (req->op == FR_AVG && cnt && st->n > 1)
			fr_reduce_scale_avg(req->dtype, req->recvbuf, cnt,
					    st->n);
		st->finished = true;
		*did_work = true;
	}
	return 0;
}

static bool vr_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct vr_state *st = req->algo_state;

	(void)comm;
	return st && st->ktx >= st->n - 1 && st->krx >= st->n - 1 &&
	       (!st->reduces || st->finished);
}

static int vr_waiting_on(const struct fr_comm *comm,
			 const struct fr_request *req)
{
	const struct vr_state *st = req->algo_state;

	if (st && st->krx < st->n - 1)
		return st->prev;
	if (st && st->ktx < st->n - 1)
		return st->next;
	return (comm->rank + 1) % comm->nranks;
}

static void vr_free(struct fr_request *req)
{
	struct vr_state *st = req->algo_state;

	if (st)
		free(st->acc);
	fr_algo_free_state(req);
}

const struct fr_algo fr_algo_vring = {
	.id = FR_ALGO_RING,
	.name = "ring",
	.start = vr_start,
	.advance = vr_advance,
	.done = vr_done,
	.free = vr_free,
	.waiting_on = vr_waiting_on,
};
