/* SPDX-License-Identifier: MIT */
/*
 * treereduce.c - reduce to a root up a tree: binomial (latency) or chain
 * (bandwidth), the shapes of broadcast (fr_tree_shape, bcast.c) run
 * upwards.
 *
 * Schedule (n ranks, q = (rank - root) mod n):
 *   binomial: q's children are q + 2^j for every 2^j below q's lowest set
 *     bit; q reduces its children's vectors into its own, smallest subtree
 *     first (it is complete first), and sends the sum to its parent (q with
 *     that bit cleared).  lg n hops: the choice for small vectors.
 *   chain: q - 1 receives from q; the vector streams down the chain in
 *     mailbox fragments, every rank adding its own as a fragment passes, so
 *     after n - 1 fragment times the chain runs at the link rate and every
 *     link carries the vector once: the choice for large vectors.
 * Fragment f goes up as soon as every child's fragment f has been reduced
 * into it (xfer.c), so a deep tree pipelines too.
 *
 * Determinism: each rank folds in a fixed order (its own input, then its
 * children from the last to the first of fr_tree_shape's list), so the
 * same inputs give the same bits on every run.  FR_AVG divides at the root.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"

#define STEP 0

struct tr_state {
	int parent; /* -1 at the root */
	int nchild;
	int child[FR_TREE_MAX_CHILDREN]; /* in the order they are folded */
	size_t es, bytes;
	fr_reduce_fn kern;
	const uint8_t *src; /* our input */
	uint8_t *acc;	    /* children folded in: recvbuf at the root */
	uint8_t *own;	    /* acc when it is ours to free */
	bool finished;	    /* the root scaled (FR_AVG) or copied */
	struct fr_xfer tx, rx[FR_TREE_MAX_CHILDREN];
};

static int tr_start_shape(struct fr_comm *comm, struct fr_request *req,
			  bool chain)
{
	struct tr_state *st = fr_algo_state_new(req, sizeof(*st));
	int child[FR_TREE_MAX_CHILDREN];

	if (!st)
		return FR_ENOMEM;
	st->es = fr_dtype_size(req->dtype);
	st->bytes = req->count * st->es;
	st->kern = fr_reduce_kernel(req->dtype, req->op);
	st->src = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	fr_tree_shape(comm->nranks, comm->rank, req->root, chain, &st->parent,
		      child, &st->nchild);
	/* smallest subtree first: it completes first */
	for (int i = 0; i < st->nchild; i++)
		st->child[i] = child[st->nchild - 1 - i];
	if (st->parent < 0) {
		st->acc = req->recvbuf;
	} else if (st->nchild && st->bytes) {
		st->own = malloc(st->bytes);
		if (!st->own)
			return FR_ENOMEM;
		st->acc = st->own;
	}
	fr_xfer_init(&st->tx, comm, st->bytes);
	for (int i = 0; i < st->nchild; i++) {
		fr_xfer_init(&st->rx[i], comm, st->bytes);
		fr_peer_need(comm, st->child[i]);
	}
	if (st->parent >= 0)
		fr_peer_need(comm, st->parent);
	return comm->fail.failed;
}

static int tree_start(struct fr_comm *comm, struct fr_request *req)
{
	return tr_start_shape(comm, req, false);
}

static int chain_start(struct fr_comm *comm, struct fr_request *req)
{
	return tr_start_shape(comm, req, true);
}

/* Fold each child's fragments in, fragment f of child i only after that
 * of child i - 1; the fragments every child has delivered. */
static int fold_children(struct fr_comm *comm, struct fr_request *req,
			 struct tr_state *st, bool *did_work, uint32_t *ready)
{
	uint32_t limit = UINT32_MAX;

	for (int i = 0; i < st->nchild; i++) {
		struct fr_xfer *x = &st->rx[i];
		int rc = fr_algo_peer_ready(comm, st->child[i]);

		if (rc > 0)
			rc = fr_xfer_take(comm, req, x, st->child[i], STEP,
					  st->acc, i ? st->acc : st->src,
					  st->kern, st->es, limit, did_work);
		if (rc < 0)
			return rc;
		limit = x->done;
	}
	*ready = limit;
	return 0;
}

static bool children_done(const struct tr_state *st)
{
	for (int i = 0; i < st->nchild; i++)
		if (!fr_xfer_complete(&st->rx[i]))
			return false;
	return true;
}

static int tr_advance(struct fr_comm *comm, struct fr_request *req,
		      bool *did_work)
{
	struct tr_state *st = req->algo_state;
	uint32_t ready = UINT32_MAX;
	int rc;

	rc = fold_children(comm, req, st, did_work, &ready);
	if (rc)
		return rc;
	if (st->parent >= 0 && !fr_xfer_complete(&st->tx)) {
		const uint8_t *from = st->nchild ? st->acc : st->src;
		size_t avail = st->nchild ? fr_xfer_bytes(comm, &st->tx, ready)
					  : st->bytes;

		/* an empty reduce still goes up, once the children's did */
		if (!st->bytes && !children_done(st))
			return 0;
		rc = fr_peer_need(comm, st->parent);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		return fr_xfer_send(comm, req, &st->tx, st->parent, STEP, from,
				    avail, did_work);
	}
	if (st->parent < 0 && !st->finished && children_done(st)) {
		if (!st->nchild && st->bytes && st->src != st->acc)
			memcpy(st->acc, st->src, st->bytes); /* one rank */
		if (req->op == FR_AVG && st->bytes && comm->nranks > 1)
			fr_reduce_scale_avg(req->dtype, st->acc, req->count,
					    comm->nranks);
		st->finished = true;
		*did_work = true;
	}
	return 0;
}

static bool tr_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct tr_state *st = req->algo_state;

	(void)comm;
	if (!st || !children_done(st))
		return false;
	return st->parent >= 0 ? fr_xfer_complete(&st->tx) : st->finished;
}

static int tr_waiting_on(const struct fr_comm *comm,
			 const struct fr_request *req)
{
	const struct tr_state *st = req->algo_state;

	for (int i = 0; st && i < st->nchild; i++)
		if (!fr_xfer_complete(&st->rx[i]))
			return st->child[i];
	if (st && st->parent >= 0)
		return st->parent;
	return (comm->rank + 1) % comm->nranks;
}

static void tr_free(struct fr_request *req)
{
	struct tr_state *st = req->algo_state;

	if (st)
		free(st->own);
	fr_algo_free_state(req);
}

const struct fr_algo fr_algo_reduce_tree = {
	.id = FR_ALGO_TREE,
	.name = "tree",
	.start = tree_start,
	.advance = tr_advance,
	.done = tr_done,
	.free = tr_free,
	.waiting_on = tr_waiting_on,
};

const struct fr_algo fr_algo_reduce_chain = {
	.id = FR_ALGO_RING,
	.name = "chain",
	.start = chain_start,
	.advance = tr_advance,
	.done = tr_done,
	.free = tr_free,
	.waiting_on = tr_waiting_on,
};
