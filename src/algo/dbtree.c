/* SPDX-License-Identifier: MIT */
/*
 * dbtree.c - double binary tree All-Reduce (NCCL's schedule for large jobs):
 * log-latency like recursive doubling, and every rank sends about 2N bytes,
 * as in the ring, pipelined in mailbox fragments.
 *
 * Schedule (n ranks, any n; the vector cut in two halves, h0 the first
 * ceil(count / 2) elements, h1 the rest):
 *   tree 0, the in-order binary tree of ranks 0..n-1: rank r > 0, whose
 *     lowest set bit is b, has the children r - b/2 and r + b/2 (where that
 *     is past n - 1, r + b/4, r + b/8, ..., the first below n), and the
 *     parent (r - b) | 2b, or r - b where that is past n - 1.  Rank 0 is the
 *     root, with one child: the largest power of two below n.  The odd ranks
 *     are its leaves; it is ceil(lg n) + 1 levels deep.
 *   tree 1, tree 0 relabelled: rank r plays n - 1 - r (mirrored) where n is
 *     even, r - 1 mod n (shifted) where it is odd, so that tree 0's leaves
 *     are tree 1's inner ranks and the other way round: no rank forwards
 *     both halves (one does where n is odd: rank 0).
 *   Half t goes up tree t, reduced on the way, and back down from its root:
 *     fragment f of a rank's partial sum goes to its parent as soon as its
 *     children's fragment f is folded in, and the root's fragment f goes
 *     down as soon as it is final, each rank forwarding it to its children
 *     as it comes.  So both phases of both trees overlap: 2 lg n fragment
 *     hops, then the link's time for about 2N bytes a rank (N up and N
 *     down, over the two trees), against the ring's 2 (n - 1) hops.
 *
 * Receiving: the four streams of a rank (up and down, in each tree) share
 * peers (a rank's parent in one tree can be its child in the other), and a
 * peer's messages come through one queue in the order sent; so each is
 * taken as it comes, told apart by its step (UP + t, DOWN + t), and none
 * waits behind another's.  A rank's partial sum is its own input OP its
 * first child's, then OP its second child's (the fold order of reduce.c's
 * trees): a second child's fragment that comes before the first child's is
 * put aside (side) and folded after it.  So the order is fixed and every
 * run gives the same bits, on every rank (the root's bits, sent down).
 * FR_AVG divides at the root, fragment by fragment, before sending down.
 *
 * Element i's result (tests/mp_allreduce.c, expect_dbtree): in its half's
 * tree, v(r) = (x_r OP v(child 0)) OP v(child 1), at the root.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"

enum { DBT_UP = 0, DBT_DOWN = 2 }; /* + the tree: a message's step */

struct dbt_tree {
	int parent; /* -1 at the root */
	int nchild;
	int child[2];		   /* in the order they are folded */
	size_t off, len;	   /* the half: bytes into the vector */
	uint32_t nfrags;	   /* of len */
	uint32_t folded;	   /* fragments with every child's folded in */
	uint32_t final;		   /* at the root: divided (FR_AVG), to send */
	uint8_t *side;		   /* child 1's fragments ahead of child 0's */
	struct fr_xfer up_rx[2];   /* from the children */
	struct fr_xfer up_tx;	   /* to the parent */
	struct fr_xfer down_rx;	   /* from the parent */
	struct fr_xfer down_tx[2]; /* to the children */
};

struct dbt_state {
	size_t es;
	fr_reduce_fn kern;
	const uint8_t *src;  /* our input */
	uint8_t *buf;	     /* the output: also where partial sums build up */
	int ntrees;	     /* 2, or 1 where the second half is empty */
	int npeers, peer[6]; /* everyone we talk to, once */
	struct dbt_tree t[2];
};

/*
 * Tree 0 at rank r: parent (-1 at the root) and children (-1: none), in
 * fold order.
 */
static void btree(int n, int r, int *parent, int *c0, int *c1)
{
	int b = 1;

	*parent = *c0 = *c1 = -1;
	while (b < n && !(r & b))
		b <<= 1;
	if (r == 0) {
		/* b is the first power of two >= n */
		if (n > 1)
			*c0 = b >> 1;
		return;
	}
	*parent = (r ^ b) | (b << 1);
	if (*parent >= n)
		*parent = r ^ b;
	if (b == 1)
		return;
	*c0 = r - (b >> 1);
	for (int h = b >> 1; h >= 1; h >>= 1)
		if (r + h < n) {
			*c1 = r + h;
			break;
		}
}

void fr_dbtree_shape(int n, int rank, int tree, int *parent, int *child,
		     int *nchild)
{
	int r = rank, p, c[2];

	if (tree == 1)
		r = n % 2 ? (rank - 1 + n) % n : n - 1 - rank;
	btree(n, r, &p, &c[0], &c[1]);
	*nchild = 0;
	for (int i = 0; i < 2; i++) {
		if (c[i] < 0)
			continue;
		if (tree == 1)
			c[i] = n % 2 ? (c[i] + 1) % n : n - 1 - c[i];
		child[(*nchild)++] = c[i];
	}
	if (tree == 1 && p >= 0)
		p = n % 2 ? (p + 1) % n : n - 1 - p;
	*parent = p;
}

static void add_peer(struct dbt_state *st, int peer)
{
	for (int i = 0; i < st->npeers; i++)
		if (st->peer[i] == peer)
			return;
	st->peer[st->npeers++] = peer;
}

static int dbt_start(struct fr_comm *comm, struct fr_request *req)
{
	struct dbt_state *st = fr_algo_state_new(req, sizeof(*st));
	size_t half;

	if (!st)
		return FR_ENOMEM;
	st->es = fr_dtype_size(req->dtype);
	st->kern = fr_reduce_kernel(req->dtype, req->op);
	st->src = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	st->buf = req->recvbuf;
	if (comm->nranks == 1) {
		if (req->count && st->src != st->buf)
			memcpy(st->buf, st->src, req->count * st->es);
		return 0;
	}
	half = (req->count + 1) / 2;
	/* an empty second half (count < 2) is left out on every rank; an
	 * empty vector still goes up and down tree 0 */
	st->ntrees = req->count - half ? 2 : 1;
	for (int t = 0; t < st->ntrees; t++) {
		struct dbt_tree *tr = &st->t[t];

		fr_dbtree_shape(comm->nranks, comm->rank, t, &tr->parent,
				tr->child, &tr->nchild);
		tr->off = t ? half * st->es : 0;
		tr->len = (t ? req->count - half : half) * st->es;
		fr_xfer_init(&tr->up_tx, comm, tr->len);
		fr_xfer_init(&tr->down_rx, comm, tr->len);
		tr->nfrags = tr->up_tx.nfrags;
		for (int i = 0; i < tr->nchild; i++) {
			fr_xfer_init(&tr->up_rx[i], comm, tr->len);
			fr_xfer_init(&tr->down_tx[i], comm, tr->len);
			add_peer(st, tr->child[i]);
		}
		if (tr->parent >= 0)
			add_peer(st, tr->parent);
		/* a leaf's sum is its input: all of it can go up */
		if (!tr->nchild)
			tr->folded = tr->nfrags;
	}
	for (int i = 0; i < st->npeers; i++)
		fr_peer_need(comm, st->peer[i]);
	return comm->fail.failed;
}

/* Fold the second child's fragments put aside, up to the first child's. */
static void fold_side(struct fr_comm *comm, struct dbt_state *st,
		      struct dbt_tree *tr, bool *did_work)
{
	size_t maxp = fr_msg_payload_max(comm);

	while (tr->folded < tr->up_rx[0].done &&
	       tr->folded < tr->up_rx[1].done) {
		size_t o = (size_t)tr->folded * maxp;
		size_t l = FR_MIN(maxp, tr->len - o);

		if (l)
			st->kern(st->buf + tr->off + o, st->buf + tr->off + o,
				 tr->side + o, l / st->es);
		tr->folded++;
		*did_work = true;
	}
}

/* One message from peer, of tree t's stream `step`: fold it, put it aside
 * or copy it down.  0, or the error that failed the communicator. */
static int take(struct fr_comm *comm, struct fr_request *req,
		struct dbt_state *st, int peer, int t, bool down,
		bool *did_work)
{
	struct dbt_tree *tr = &st->t[t];
	uint16_t step = (uint16_t)((down ? DBT_DOWN : DBT_UP) + t);
	struct fr_xfer *x = NULL;
	const uint8_t *p;
	size_t off, len;
	int k = -1, rc;

	if (down && peer == tr->parent) {
		x = &tr->down_rx;
	} else if (!down) {
		for (int i = 0; i < tr->nchild; i++)
			if (tr->child[i] == peer)
				k = i;
		if (k >= 0)
			x = &tr->up_rx[k];
	}
	if (!x || fr_xfer_complete(x))
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: collective #%u: rank %d sent step %u, which it has no part in here (double binary tree)",
			comm->rank, req->seq, peer, step);
	rc = fr_xfer_recv(comm, req, x, peer, step, &off, &len, &p);
	/* (drain has the message in hand: EAGAIN cannot come back, and if it
	 * did, drain would ask for the same message forever) */
	if (rc == FR_EAGAIN)
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: collective #%u: a message from rank %d went missing",
			comm->rank, req->seq, peer);
	if (rc)
		return rc;
	uint8_t *dst = st->buf + tr->off + off;

	if (down) {
		if (len)
			memcpy(dst, p, len); /* the final sum */
	} else if (k == 0) {
		if (len)
			st->kern(dst, st->src + tr->off + off, p, len / st->es);
		if (tr->nchild == 1)
			tr->folded++;
	} else if (tr->folded == x->done && tr->folded < tr->up_rx[0].done) {
		if (len)
			st->kern(dst, dst, p, len / st->es);
		tr->folded++;
	} else if (len) {
		if (!tr->side) {
			tr->side = malloc(tr->len);
			if (!tr->side)
				return fr_comm_fail(
					comm, FR_ENOMEM,
					"rank %d: collective #%u: no memory for %zu bytes of a tree's second child",
					comm->rank, req->seq, tr->len);
		}
		memcpy(tr->side + off, p, len);
	}
	fr_xfer_recv_done(comm, x, peer);
	if (!down && tr->nchild == 2)
		fold_side(comm, st, tr, did_work);
	*did_work = true;
	return 0;
}

/* Every message that has come from peer, as it comes. */
static int drain(struct fr_comm *comm, struct fr_request *req,
		 struct dbt_state *st, int peer, bool *did_work)
{
	for (;;) {
		const struct fr_msg *m;
		const uint8_t *p;
		int rc = fr_msg_get(comm, req, peer, &m, &p);

		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		int t = m->step % 2;
		bool down = m->step >= DBT_DOWN;

		if (m->step >= DBT_DOWN + 2 || t >= st->ntrees)
			return fr_comm_fail(
				comm, FR_EPROTO,
				"rank %d: collective #%u: rank %d sent step %u, not one of the double binary tree's",
				comm->rank, req->seq, peer, m->step);
		rc = take(comm, req, st, peer, t, down, did_work);
		if (rc)
			return rc;
	}
}

static int send_tree(struct fr_comm *comm, struct fr_request *req,
		     struct dbt_state *st, struct dbt_tree *tr, int t,
		     bool *did_work)
{
	int rc;

	/* (an empty half goes up once the children's has come) */
	if (tr->parent >= 0 && !fr_xfer_complete(&tr->up_tx) && tr->folded) {
		/* a leaf sends its input, an inner rank its partial sum */
		const uint8_t *from =
			(tr->nchild ? st->buf : st->src) + tr->off;

		rc = fr_algo_peer_ready(comm, tr->parent);
		if (rc < 0)
			return rc;
		if (rc)
			rc = fr_xfer_send(comm, req, &tr->up_tx, tr->parent,
					  (uint16_t)(DBT_UP + t), from,
					  tr->len ? fr_xfer_bytes(comm,
								  &tr->up_tx,
								  tr->folded)
						  : 0,
					  did_work);
		if (rc)
			return rc;
	}
	if (tr->parent < 0 && tr->final < tr->folded) {
		/* the root: these fragments are the result */
		size_t a = fr_xfer_bytes(comm, &tr->up_tx, tr->final);
		size_t z = fr_xfer_bytes(comm, &tr->up_tx, tr->folded);

		if (req->op == FR_AVG && z > a)
			fr_reduce_scale_avg(req->dtype, st->buf + tr->off + a,
					    (z - a) / st->es, comm->nranks);
		tr->final = tr->folded;
		*did_work = true;
	}
	/* down: what the root has finished, or what came from the parent */
	uint32_t have = tr->parent < 0 ? tr->final : tr->down_rx.done;

	for (int i = 0; i < tr->nchild; i++) {
		if (fr_xfer_complete(&tr->down_tx[i]) || !have)
			continue;
		rc = fr_algo_peer_ready(comm, tr->child[i]);
		if (rc < 0)
			return rc;
		if (rc)
			rc = fr_xfer_send(
				comm, req, &tr->down_tx[i], tr->child[i],
				(uint16_t)(DBT_DOWN + t), st->buf + tr->off,
				tr->len ? fr_xfer_bytes(comm, &tr->down_tx[i],
							have)
					: 0,
				did_work);
		if (rc)
			return rc;
	}
	return 0;
}

static int dbt_advance(struct fr_comm *comm, struct fr_request *req,
		       bool *did_work)
{
	struct dbt_state *st = req->algo_state;
	int rc;

	for (int i = 0; i < st->npeers; i++) {
		rc = fr_algo_peer_ready(comm, st->peer[i]);
		if (rc > 0)
			rc = drain(comm, req, st, st->peer[i], did_work);
		if (rc < 0)
			return rc;
	}
	for (int t = 0; t < st->ntrees; t++) {
		rc = send_tree(comm, req, st, &st->t[t], t, did_work);
		if (rc)
			return rc;
	}
	return 0;
}

static bool tree_done(const struct dbt_tree *tr)
{
	for (int i = 0; i < tr->nchild; i++)
		if (!fr_xfer_complete(&tr->up_rx[i]) ||
		    !fr_xfer_complete(&tr->down_tx[i]))
			return false;
	if (tr->parent < 0)
		return tr->final >= tr->nfrags;
	return fr_xfer_complete(&tr->up_tx) && fr_xfer_complete(&tr->down_rx);
}

static bool dbt_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct dbt_state *st = req->algo_state;

	(void)comm;
	if (!st)
		return false;
	for (int t = 0; t < st->ntrees; t++)
		if (!tree_done(&st->t[t]))
			return false;
	return true;
}

static int dbt_waiting_on(const struct fr_comm *comm,
			  const struct fr_request *req)
{
	const struct dbt_state *st = req->algo_state;

	(void)comm;
	/* what has to come first; then, with only sends left, the peer
	 * whose credits they wait for (the one that must not leave: any
	 * other may have finished and gone meanwhile) */
	for (int t = 0; st && t < st->ntrees; t++) {
		const struct dbt_tree *tr = &st->t[t];

		for (int i = 0; i < tr->nchild; i++)
			if (!fr_xfer_complete(&tr->up_rx[i]))
				return tr->child[i];
		if (tr->parent >= 0 && !fr_xfer_complete(&tr->down_rx))
			return tr->parent;
	}
	for (int t = 0; st && t < st->ntrees; t++) {
		const struct dbt_tree *tr = &st->t[t];

		if (tr->parent >= 0 && !fr_xfer_complete(&tr->up_tx))
			return tr->parent;
		for (int i = 0; i < tr->nchild; i++)
			if (!fr_xfer_complete(&tr->down_tx[i]))
				return tr->child[i];
	}
	return -1; /* nothing left: nobody to wait on */
}

static void dbt_free(struct fr_request *req)
{
	struct dbt_state *st = req->algo_state;

	if (st)
		for (int t = 0; t < 2; t++)
			free(st->t[t].side);
	fr_algo_free_state(req);
}

const struct fr_algo fr_algo_dbtree = {
	.id = FR_ALGO_TREE,
	.name = "dbtree",
	.start = dbt_start,
	.advance = dbt_advance,
	.done = dbt_done,
	.free = dbt_free,
	.waiting_on = dbt_waiting_on,
};
