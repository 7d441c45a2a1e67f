/* SPDX-License-Identifier: MIT */
/*
 * bruck_rsag.c - reduce-scatter and all-gather in ceil(lg p) steps
 * (Bruck's all-gather and its mirror image), for any number p of ranks:
 * small blocks on many ranks, where the ring's p - 1 steps are its cost.
 *
 * Names: rank r's offset j is block (r + j) mod p (block b is rank b's,
 * count elements); K = ceil(lg p) steps; at step k (distance 2^k) the
 * step moves c_k = min(2^k, p - 2^k) blocks.
 *
 * All-gather, k = 0, 1, ..., K-1: send our offsets [0, c_k) to rank
 *   r - 2^k, receive rank r + 2^k's offsets [0, c_k), which are our
 *   [2^k, 2^k + c_k), each straight into its block of recvbuf.  After step
 *   k we hold offsets [0, min(2^(k+1), p)): after the last, all p.
 * Reduce-scatter, the mirror image, k = K-1, ..., 1, 0: send our partial
 *   sums of offsets [2^k, 2^k + c_k) to rank r + 2^k (its [0, c_k)),
 *   receive rank r - 2^k's of its [2^k, 2^k + c_k), which are our
 *   [0, c_k), and reduce our partials of those into them.  After step k we
 *   hold the partials of offsets [0, 2^k); the last step (k = 0) reduces
 *   offset 0, our own block, straight into recvbuf (FR_AVG divides it
 *   there, once).  A partial is our input block until it is first
 *   received into (then it lives in the scratch buffer at its offset), so
 *   nothing is copied before it is sent.
 * Every rank's contribution to a block reaches its owner once, along the
 * binary digits of their distance, so each block is reduced in one fixed
 * order (tests/mp_allreduce.c's reference follows it): bits do not
 * depend on timing.  Both move (p - 1) blocks in and out of every rank,
 * as the ring does, in K steps instead of p - 1, through the mailboxes: a
 * copy in and out of the eager slots for every byte, which the ring's
 * zero-copy writes do without, so the ring is the choice for large blocks.
 *
 * A step's blocks are not contiguous in the user's buffers (they wrap
 * around at block p - 1, and a reduce-scatter's partials are in the input
 * or in the scratch buffer), so a step is a transfer of blocks at their
 * own addresses (struct fr_bx, xfer.c): small ones packed whole into as
 * few messages as hold them (a step of c_k small blocks is one message,
 * not c_k: the point of the schedule), large ones in fragments of a
 * payload, read and written in place.  A step starts when the one before
 * has finished both ways.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "mem.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

struct brsag {
	bool rs;
	int K, i;     /* steps; steps done */
	bool inited;  /* tx / rx set up for step i */
	int to, from; /* step i's peers */
	size_t es, blk;
	fr_reduce_fn kern;
	const uint8_t *in; /* RS: the p input blocks */
	uint8_t *out;	   /* RS: our block; AG: the p blocks */
	uint8_t *work;	   /* RS: partials, at their offsets */
	int reduced;	   /* RS: offsets [0, reduced) are in work */
	struct fr_bx tx, rx;
	const uint8_t **tsrc, **ra; /* this step's addresses, cap each */
	uint8_t **rdst;
	void *ptrs[]; /* the three arrays above */
};

/* The step's distance: RS counts down, AG up. */
static int dist_log(const struct brsag *st)
{
	return st->rs ? st->K - 1 - st->i : st->i;
}

static int blocks(int p, int d)
{
	return FR_MIN(d, p - d);
}

/* Step st->i's peers: the reduce-scatter sends 2^k ahead, the all-gather
 * 2^k behind. */
static void step_peers(const struct fr_comm *comm, const struct brsag *st,
		       int *to, int *from)
{
	int p = comm->nranks, d = 1 << dist_log(st);

	*to = (comm->rank + (st->rs ? d : p - d)) % p;
	*from = (comm->rank + (st->rs ? p - d : d)) % p;
}

static int start(struct fr_comm *comm, struct fr_request *req)
{
	int p = comm->nranks, K = 0, cap;
	struct brsag *st;
	size_t es = fr_dtype_size(req->dtype);
	bool rs = req->coll == FR_COLL_REDUCE_SCATTER;

	while ((1 << K) < p)
		K++;
	cap = K ? 1 << (K - 1) : 1; /* c_k <= 2^(K-1) */
	st = fr_algo_state_new(req,
			       sizeof(*st) + 3 * (size_t)cap * sizeof(void *));
	if (!st)
		return FR_ENOMEM;
	st->rs = rs;
	st->K = K;
	st->es = es;
	st->blk = req->count * es;
	st->out = req->recvbuf;
	st->tsrc = (const uint8_t **)st->ptrs;
	st->ra = (const uint8_t **)st->ptrs + cap;
	st->rdst = (uint8_t **)st->ptrs + 2 * cap;
	if (rs) {
		st->kern = fr_reduce_kernel(req->dtype, req->op);
		st->in = req->sendbuf;
		/* offsets [0, max(p - 2^(K-1), 2^(K-2))) at most, within
		 * cap, are received into before the last step (which goes
		 * to recvbuf) */
		if (st->blk && K > 1) {
			int rc = fr_scratch_get(comm, (size_t)cap * st->blk);

			if (rc)
				return rc;
			st->work = comm->mem.scratch;
		}
		if (!K && st->blk) {
			/* one rank: its input is the result */
			if (st->out != st->in)
				memmove(st->out, st->in, st->blk);
			if (req->op == FR_AVG)
				fr_reduce_scale_avg(req->dtype, st->out,
						    req->count, p);
		}
	} else if (st->blk && req->sendbuf != FR_IN_PLACE &&
		   req->sendbuf != st->out + (size_t)comm->rank * st->blk) {
		memcpy(st->out + (size_t)comm->rank * st->blk, req->sendbuf,
		       st->blk);
	}
	return 0;
}

/* Our block at offset j in buf. */
static uint8_t *at(const struct fr_comm *comm, const struct brsag *st,
		   const uint8_t *buf, int j)
{
	return (uint8_t *)buf +
	       (size_t)((comm->rank + j) % comm->nranks) * st->blk;
}

/* RS: where our partial of offset j is. */
static const uint8_t *partial(const struct fr_comm *comm,
			      const struct brsag *st, int j)
{
	return j < st->reduced ? st->work + (size_t)j * st->blk
			       : at(comm, st, st->in, j);
}

static void step_init(struct fr_comm *comm, struct brsag *st)
{
	int p = comm->nranks, d = 1 << dist_log(st), c = blocks(p, d);

	fr_bx_init(&st->tx, comm, st->blk, 0, st->blk, c);
	fr_bx_init(&st->rx, comm, st->blk, 0, st->blk, c);
	for (int j = 0; j < c && st->blk; j++) {
		if (st->rs) {
			st->tsrc[j] = partial(comm, st, d + j);
			st->ra[j] = partial(comm, st, j);
			st->rdst[j] = d == 1 ? st->out
					     : st->work + (size_t)j * st->blk;
		} else {
			st->tsrc[j] = at(comm, st, st->out, j);
			st->ra[j] = NULL;
			st->rdst[j] = at(comm, st, st->out, d + j);
		}
	}
	st->inited = true;
}

static int advance(struct fr_comm *comm, struct fr_request *req, bool *did_work)
{
	struct brsag *st = req->algo_state;

	while (st->i < st->K) {
		uint16_t step = (uint16_t)(1 + st->i);
		int rc;

		if (!st->inited) {
			step_peers(comm, st, &st->to, &st->from);
			rc = fr_peer_need(comm, st->to);
			if (!rc)
				rc = fr_peer_need(comm, st->from);
			if (rc)
				return rc == FR_EAGAIN ? 0 : rc;
			step_init(comm, st);
		}
		rc = fr_bx_send(comm, req, &st->tx, st->to, step, st->tsrc,
				did_work);
		if (!rc)
			rc = fr_bx_take(comm, req, &st->rx, st->from, step,
					st->rdst, st->rs ? st->ra : NULL,
					st->rs ? st->kern : NULL, st->es,
					did_work);
		if (rc)
			return rc;
		if (!fr_bx_complete(&st->tx) || !fr_bx_complete(&st->rx))
			return 0;
		if (st->rs)
			st->reduced =
				FR_MAX(st->reduced,
				       blocks(comm->nranks, 1 << dist_log(st)));
		st->inited = false;
		st->i++;
		if (st->rs && st->i == st->K && req->op == FR_AVG && st->blk)
			fr_reduce_scale_avg(req->dtype, st->out, req->count,
					    comm->nranks);
	}
	return 0;
}

static bool done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct brsag *st = req->algo_state;

	(void)comm;
	return st && st->i == st->K;
}

/* The step's sender until its data is in, then its receiver, taking what
 * we sent. */
static int waiting_on(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct brsag *st = req->algo_state;
	int to, from;

	if (!st || st->i == st->K)
		return -1;
	if (st->inited)
		return fr_bx_complete(&st->rx) ? st->to : st->from;
	step_peers(comm, st, &to, &from);
	return from;
}

static void brsag_free(struct fr_request *req)
{
	struct brsag *st = req->algo_state;

	if (st)
		fr_bx_release(&st->tx);
	fr_algo_free_state(req);
}

const struct fr_algo fr_algo_bruck_rsag = {
	.id = FR_ALGO_BRUCK,
	.name = "bruck",
	.start = start,
	.advance = advance,
	.done = done,
	.free = brsag_free,
	.waiting_on = waiting_on,
};
