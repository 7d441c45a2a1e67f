/* SPDX-License-Identifier: MIT */
/*
 * oneshot.c - one-shot All-Reduce: every rank sends its whole vector to
 * every other rank, and each reduces all n vectors itself.
 *
 * Schedule (n ranks, any n): one step.  Rank r sends its input to ranks
 * r+1, r+2, ... r+n-1 (mod n, so that the n-1 messages of all ranks do not
 * all go to rank 0 first), each as mailbox fragments (xfer.c), and folds
 * the n vectors into its output in rank order:
 *
 *   out = ((x0 OP x1) OP x2) ... OP x(n-1)
 *
 * taking its own input at its place in that order and each other vector
 * from the mailbox of its sender as it comes (a later sender's fragments
 * wait in their own mailbox; credits bound how far a sender runs ahead).
 *
 * Cost: one one-way latency instead of recursive doubling's lg n (lg n + 2
 * where n is not a power of two), for n - 1 messages and (n - 1) N bytes
 * sent by every rank: the choice for small vectors on few ranks, and where
 * the latency is the network's (a 1 ms link: 1 ms per call, against 2 for
 * recursive doubling at n = 4).  It also keeps the ranks in step: every
 * rank's call ends one latency after the last rank entered it, where
 * recursive doubling lets half the ranks settle a whole call behind the
 * others (each call then waits out two latencies on some rank).
 *
 * Determinism: every rank folds the same vectors in the same order with
 * the same kernels, so all end with identical bits; element i's result is
 * the left fold over ranks 0..n-1 (tests/mp_allreduce.c, expect_linear).
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"

#define STEP 1

struct oneshot_state {
	size_t es, bytes;
	fr_reduce_fn kern;
	const uint8_t *src; /* our input (a copy when in place) */
	uint8_t *copy;	    /* that copy, else NULL */
	uint8_t *buf;	    /* the output */
	int next;	    /* the rank whose vector is folded next */
	bool rx_inited;
	struct fr_xfer rx;   /* from rank next */
	int nsent;	     /* peers that have all of our vector */
	struct fr_xfer tx[]; /* to each rank, by rank */
};

static int oneshot_start(struct fr_comm *comm, struct fr_request *req)
{
	int n = comm->nranks;
	struct oneshot_state *st = fr_algo_state_new(
		req, sizeof(*st) + (size_t)n * sizeof(st->tx[0]));

	if (!st)
		return FR_ENOMEM;
	st->es = fr_dtype_size(req->dtype);
	st->bytes = req->count * st->es;
	st->buf = req->recvbuf;
	st->kern = fr_reduce_kernel(req->dtype, req->op);
	st->src = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	/* in place the output overwrites our input while the sends, and
	 * our own turn in the fold, still read it */
	if (req->sendbuf == FR_IN_PLACE && n > 1 && st->bytes) {
		st->copy = malloc(st->bytes);
		if (!st->copy)
			return FR_ENOMEM;
		memcpy(st->copy, st->src, st->bytes);
		st->src = st->copy;
	}
	for (int r = 0; r < n; r++)
		fr_xfer_init(&st->tx[r], comm, r == comm->rank ? 0 : st->bytes);
	st->tx[comm->rank].done = st->tx[comm->rank].nfrags;
	st->nsent = 1;
	if (n == 1) {
		if (st->bytes && st->src != st->buf)
			memcpy(st->buf, st->src, st->bytes);
		st->next = 1;
		return 0;
	}
	/* start every connection at once */
	for (int k = 1; k < n; k++)
		fr_peer_need(comm, (comm->rank + k) % n);
	return comm->fail.failed;
}

static int send_all(struct fr_comm *comm, struct fr_request *req,
		    struct oneshot_state *st, bool *did_work)
{
	int n = comm->nranks;

	for (int k = 1; k < n && st->nsent < n; k++) {
		int peer = (comm->rank + k) % n, rc;
		struct fr_xfer *x = &st->tx[peer];

		if (fr_xfer_complete(x))
			continue;
		rc = fr_peer_need(comm, peer);
		if (rc == FR_EAGAIN)
			continue; /* still connecting: the others go on */
		if (rc)
			return rc;
		rc = fr_xfer_send(comm, req, x, peer, STEP, st->src, st->bytes,
				  did_work);
		if (rc)
			return rc;
		if (fr_xfer_complete(x))
			st->nsent++;
	}
	return 0;
}

/* Fold the vectors in rank order, each as far as it has come. */
static int fold(struct fr_comm *comm, struct fr_request *req,
		struct oneshot_state *st, bool *did_work)
{
	while (st->next < comm->nranks) {
		int r = st->next;
		int rc;

		if (r == comm->rank) {
			if (st->bytes && r == 0 && st->src != st->buf)
				memcpy(st->buf, st->src, st->bytes);
			else if (st->bytes && r > 0)
				st->kern(st->buf, st->buf, st->src, req->count);
			st->next++;
			*did_work = true;
			continue;
		}
		if (!st->rx_inited) {
			fr_xfer_init(&st->rx, comm, st->bytes);
			st->rx_inited = true;
		}
		rc = fr_peer_need(comm, r);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		/* rank 0's vector is copied, the later ones reduced in */
		rc = fr_xfer_take(comm, req, &st->rx, r, STEP, st->buf,
				  r ? st->buf : NULL, r ? st->kern : NULL,
				  st->es, UINT32_MAX, did_work);
		if (rc || !fr_xfer_complete(&st->rx))
			return rc;
		st->rx_inited = false;
		st->next++;
	}
	return 0;
}

static int oneshot_advance(struct fr_comm *comm, struct fr_request *req,
			   bool *did_work)
{
	struct oneshot_state *st = req->algo_state;
	bool was_done = st->next >= comm->nranks;
	int rc;

	rc = send_all(comm, req, st, did_work);
	if (!rc)
		rc = fold(comm, req, st, did_work);
	if (rc)
		return rc;
	if (!was_done && st->next >= comm->nranks && req->op == FR_AVG &&
	    st->bytes && comm->nranks > 1)
		fr_reduce_scale_avg(req->dtype, st->buf, req->count,
				    comm->nranks);
	return 0;
}

static bool oneshot_done(const struct fr_comm *comm,
			 const struct fr_request *req)
{
	const struct oneshot_state *st = req->algo_state;

	return st && st->next >= comm->nranks && st->nsent >= comm->nranks;
}

static int oneshot_waiting_on(const struct fr_comm *comm,
			      const struct fr_request *req)
{
	const struct oneshot_state *st = req->algo_state;

	if (!st)
		return (comm->rank + 1) % comm->nranks;
	if (st->next < comm->nranks && st->next != comm->rank)
		return st->next;
	for (int k = 1; k < comm->nranks; k++) {
		int peer = (comm->rank + k) % comm->nranks;

		if (!fr_xfer_complete(&st->tx[peer]))
			return peer;
	}
	return (comm->rank + 1) % comm->nranks;
}

static void oneshot_free(struct fr_request *req)
{
	struct oneshot_state *st = req->algo_state;

	if (st)
		free(st->copy);
	fr_algo_free_state(req);
}

const struct fr_algo fr_algo_oneshot = {
	.id = FR_ALGO_ONESHOT,
	.name = "oneshot",
	.start = oneshot_start,
	.advance = oneshot_advance,
	.done = oneshot_done,
	.free = oneshot_free,
	.waiting_on = oneshot_waiting_on,
};
