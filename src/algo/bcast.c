/* SPDX-License-Identifier: MIT */
/*
 * bcast.c - broadcast down a tree: binomial (latency) or chain (bandwidth).
 * The trees' shapes (fr_tree_shape) serve reduce too (reduce.c), upwards.
 *
 * Schedule (n ranks, q = (rank - root) mod n, the rank relative to root):
 *   binomial: q's parent is q with its lowest set bit cleared; its children
 *     are q + 2^j for every 2^j below that bit (every 2^j < n for the root),
 *     served largest subtree first.  lg n hops for any size: the choice for
 *     small messages.
 *   chain: q receives from q - 1 and forwards to q + 1.  The message is cut
 *     into mailbox fragments and every rank forwards a fragment as soon as
 *     it has it, so after n - 1 fragment times the chain streams at the
 *     link rate: the choice for large messages.
 * In both, each rank copies fragments from its parent into buf and sends
 * each child the fragments it has, in order (xfer.c); nothing is reduced,
 * so every rank ends with the root's bits.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "algo.h"
#include "peer.h"
#include "util.h"

struct bc_state {
	int parent; /* real rank, -1 at the root */
	int nchild;
	int child[FR_TREE_MAX_CHILDREN];
	uint8_t *buf;
	size_t bytes;
	struct fr_xfer rx, tx[FR_TREE_MAX_CHILDREN];
};

static int real_rank(int q, int root, int n)
{
	return (q + root) % n;
}

void fr_tree_shape(int n, int rank, int root, bool chain, int *parent,
		   int *child, int *nchild)
{
	int q = (rank - root + n) % n, low = 1;

	*parent = -1;
	*nchild = 0;
	if (chain) {
		if (q > 0)
			*parent = real_rank(q - 1, root, n);
		if (q + 1 < n)
			child[(*nchild)++] = real_rank(q + 1, root, n);
		return;
	}
	if (q > 0) {
		low = q & -q;
		*parent = real_rank(q - low, root, n);
	} else {
		while (low < n)
			low <<= 1;
	}
	for (int m = low >> 1; m >= 1; m >>= 1)
		if (q + m < n)
			child[(*nchild)++] = real_rank(q + m, root, n);
}

static int bc_start_shape(struct fr_comm *comm, struct fr_request *req,
			  bool chain)
{
	struct bc_state *st = fr_algo_state_new(req, sizeof(*st));

	if (!st)
		return FR_ENOMEM;
	st->buf = req->recvbuf;
	st->bytes = req->count * fr_dtype_size(req->dtype);
	fr_tree_shape(comm->nranks, comm->rank, req->root, chain, &st->parent,
		      st->child, &st->nchild);
	fr_xfer_init(&st->rx, comm, st->bytes);
	for (int i = 0; i < st->nchild; i++) {
		fr_xfer_init(&st->tx[i], comm, st->bytes);
		fr_peer_need(comm, st->child[i]);
	}
	if (st->parent >= 0)
		fr_peer_need(comm, st->parent);
	return comm->fail.failed;
}

static int tree_start(struct fr_comm *comm, struct fr_request *req)
{
	return bc_start_shape(comm, req, false);
}

static int chain_start(struct fr_comm *comm, struct fr_request *req)
{
	return bc_start_shape(comm, req, true);
}

static int bc_advance(struct fr_comm *comm, struct fr_request *req,
		      bool *did_work)
{
	struct bc_state *st = req->algo_state;
	size_t avail = st->bytes;
	int rc;

	if (st->parent >= 0) {
		rc = fr_peer_need(comm, st->parent);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		rc = fr_xfer_take(comm, req, &st->rx, st->parent, 0, st->buf,
				  NULL, NULL, 1, UINT32_MAX, did_work);
		if (rc)
			return rc;
		avail = fr_xfer_bytes(comm, &st->rx, st->rx.done);
	}
	for (int i = 0; i < st->nchild; i++) {
		if (fr_xfer_complete(&st->tx[i]))
			continue;
		/* an empty broadcast still tells the child, once we know */
		if (!st->bytes && st->parent >= 0 && !fr_xfer_complete(&st->rx))
			break;
		rc = fr_peer_need(comm, st->child[i]);
		if (rc == FR_EAGAIN)
			continue;
		if (rc)
			return rc;
		rc = fr_xfer_send(comm, req, &st->tx[i], st->child[i], 0,
				  st->buf, avail, did_work);
		if (rc)
			return rc;
	}
	return 0;
}

static bool bc_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct bc_state *st = req->algo_state;

	(void)comm;
	if (!st || (st->parent >= 0 && !fr_xfer_complete(&st->rx)))
		return false;
	for (int i = 0; i < st->nchild; i++)
		if (!fr_xfer_complete(&st->tx[i]))
			return false;
	return true;
}

static int bc_waiting_on(const struct fr_comm *comm,
			 const struct fr_request *req)
{
	const struct bc_state *st = req->algo_state;

	if (st && st->parent >= 0 && !fr_xfer_complete(&st->rx))
		return st->parent;
	for (int i = 0; st && i < st->nchild; i++)
		if (!fr_xfer_complete(&st->tx[i]))
			return st->child[i];
	return (comm->rank + 1) % comm->nranks;
}

const struct fr_algo fr_algo_bcast_tree = {
	.id = FR_ALGO_TREE,
	.name = "tree",
	.start = tree_start,
	.advance = bc_advance,
	.done = bc_done,
	.free = fr_algo_free_state,
	.waiting_on = bc_waiting_on,
};

const struct fr_algo fr_algo_bcast_chain = {
	.id = FR_ALGO_RING,
	.name = "chain",
	.start = chain_start,
	.advance = bc_advance,
	.done = bc_done,
	.free = fr_algo_free_state,
	.waiting_on = bc_waiting_on,
};
