/* SPDX-License-Identifier: MIT */
/*
 * alltoall.c - all-to-all: pairwise exchange (alltoall and alltoallv) and
 * Bruck's algorithm (alltoall).
 *
 * Pairwise, n ranks, rank r: at step k = 1 .. n-1 it sends its block for
 * rank r+k and takes the block from rank r-k (mod n), so that at every step
 * every rank sends to one rank and receives from another, and no rank is
 * everybody's first destination.  The steps are not serialised: each block
 * is a transfer of mailbox fragments (xfer.c) to its own peer, with its own
 * credits, so all n - 1 of them stream at once in step order and a slow
 * peer holds up only its own block.  (n - 1) blocks leave every rank: the
 * bandwidth term is the least there is, the choice for large blocks.
 *
 * Bruck, for small blocks on many ranks: ceil(lg n) rounds instead of
 * n - 1 messages.  Rank r first rotates its blocks so that tmp[j] is the
 * block for rank r+j; in round i (k = 2^i) it sends to rank r+k, in one
 * message, every tmp[j] whose index j has bit k set, and receives the same
 * positions from rank r-k into tmp.  After the last round tmp[j] is the
 * block rank r-j sent to r (every block travels along the binary digits of
 * its distance); a last rotation puts it at recvbuf block r-j.  Each block
 * moves about lg(n)/2 times: more bytes, far fewer messages.
 *
 * alltoallv sizes every transfer from the caller's counts; each fragment
 * carries a tag of its transfer's length (fr_xfer_len_tag), so counts
 * that differ between a sender and its receiver fail both with
 * FR_EMISMATCH instead of waiting for fragments that never come.
 *
 * Nothing is reduced: every block arrives with its sender's bits.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"

#define STEP 0

/* ---- pairwise ----------------------------------------------------------- */

struct pw_state {
	int nsent, nrecv; /* peers done each way (ourselves included) */
	const uint8_t *sbuf;
	uint8_t *rbuf;
	uint8_t *copy; /* in place: what we send, copied first */
	size_t es;
	const size_t *scounts, *sdispls, *rcounts, *rdispls; /* elements */
	size_t *uniform;    /* alltoall: counts and displacements, 2n */
	struct fr_xfer x[]; /* tx by rank, then rx by rank */
};

static int pw_start(struct fr_comm *comm, struct fr_request *req)
{
	int n = comm->nranks, me = comm->rank;
	struct pw_state *st = fr_algo_state_new(
		req, sizeof(*st) + 2 * (size_t)n * sizeof(st->x[0]));
	size_t extent = 0;
	bool v = req->coll == FR_COLL_ALLTOALLV;

	if (!st)
		return FR_ENOMEM;
	st->es = fr_dtype_size(req->dtype);
	st->rbuf = req->recvbuf;
	if (v) {
		st->scounts = fr_req_vec(req, FR_VEC_SCOUNTS, n);
		st->sdispls = fr_req_vec(req, FR_VEC_SDISPLS, n);
		st->rcounts = fr_req_vec(req, FR_VEC_RCOUNTS, n);
		st->rdispls = fr_req_vec(req, FR_VEC_RDISPLS, n);
	} else {
		st->uniform = malloc(2 * (size_t)n * sizeof(size_t));
		if (!st->uniform)
			return FR_ENOMEM;
		for (int r = 0; r < n; r++) {
			st->uniform[r] = req->count;
			st->uniform[n + r] = (size_t)r * req->count;
		}
		st->scounts = st->rcounts = st->uniform;
		st->sdispls = st->rdispls = st->uniform + n;
	}
	st->sbuf = req->sendbuf;
	if (req->sendbuf == FR_IN_PLACE) {
		/* what we send is in recvbuf, which the receives overwrite */
		st->scounts = st->rcounts;
		st->sdispls = st->rdispls;
		for (int r = 0; r < n; r++)
			if (st->rcounts[r]) /* an empty block is nowhere */
				extent = FR_MAX(extent, st->rdispls[r] +
								st->rcounts[r]);
		extent *= st->es;
		if (extent) {
			st->copy = malloc(extent);
			if (!st->copy)
				return FR_ENOMEM;
			memcpy(st->copy, st->rbuf, extent);
		}
		st->sbuf = st->copy;
	} else if (st->scounts[me] && st->sbuf != st->rbuf) {
		memcpy(st->rbuf + st->rdispls[me] * st->es,
		       st->sbuf + st->sdispls[me] * st->es,
		       st->scounts[me] * st->es);
	}
	for (int r = 0; r < n; r++) {
		struct fr_xfer *tx = &st->x[r], *rx = &st->x[n + r];

		fr_xfer_init(tx, comm, r == me ? 0 : st->scounts[r] * st->es);
		fr_xfer_init(rx, comm, r == me ? 0 : st->rcounts[r] * st->es);
		if (v) {
			tx->aux = fr_xfer_len_tag(tx->len);
			rx->aux = fr_xfer_len_tag(rx->len);
		}
	}
	st->x[me].done = st->x[me].nfrags;
	st->x[n + me].done = st->x[n + me].nfrags;
	st->nsent = st->nrecv = 1;
	for (int k = 1; k < n; k++)
		fr_peer_need(comm, (me + k) % n);
	return comm->fail.failed;
}

/* A block's address; none for an empty one (its buffer may be NULL). */
static const uint8_t *block(const uint8_t *buf, size_t displ, size_t len,
			    size_t es)
{
	return len ? buf + displ * es : NULL;
}

static int pw_advance(struct fr_comm *comm, struct fr_request *req,
		      bool *did_work)
{
	struct pw_state *st = req->algo_state;
	int n = comm->nranks, me = comm->rank;

	for (int k = 1; k < n && (st->nsent < n || st->nrecv < n); k++) {
		int to = (me + k) % n, from = (me - k + n) % n, rc;
		struct fr_xfer *tx = &st->x[to], *rx = &st->x[n + from];

		if (!fr_xfer_complete(tx)) {
			rc = fr_algo_peer_ready(comm, to);
			if (rc > 0)
				rc = fr_xfer_send(comm, req, tx, to, STEP,
						  block(st->sbuf,
							st->sdispls[to],
							tx->len, st->es),
						  tx->len, did_work);
			if (rc < 0)
				return rc;
			if (fr_xfer_complete(tx))
				st->nsent++;
		}
		if (!fr_xfer_complete(rx)) {
			rc = fr_algo_peer_ready(comm, from);
			if (rc > 0)
				rc = fr_xfer_take(
					comm, req, rx, from, STEP,
					(uint8_t *)block(st->rbuf,
							 st->rdispls[from],
							 rx->len, st->es),
					NULL, NULL, 1, UINT32_MAX, did_work);
			if (rc < 0)
				return rc;
			if (fr_xfer_complete(rx))
				st->nrecv++;
		}
	}
	return 0;
}

static bool pw_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct pw_state *st = req->algo_state;

	return st && st->nsent >= comm->nranks && st->nrecv >= comm->nranks;
}

static int pw_waiting_on(const struct fr_comm *comm,
			 const struct fr_request *req)
{
	const struct pw_state *st = req->algo_state;
	int n = comm->nranks;

	for (int k = 1; st && k < n; k++) {
		int from = (comm->rank - k + n) % n, to = (comm->rank + k) % n;

		if (!fr_xfer_complete(&st->x[n + from]))
			return from;
		if (!fr_xfer_complete(&st->x[to]))
			return to;
	}
	return (comm->rank + 1) % n;
}

static void pw_free(struct fr_request *req)
{
	struct pw_state *st = req->algo_state;

	if (st) {
		free(st->copy);
		free(st->uniform);
	}
	fr_algo_free_state(req);
}

const struct fr_algo fr_algo_pairwise = {
	.id = FR_ALGO_PAIRWISE,
	.name = "pairwise",
	.start = pw_start,
	.advance = pw_advance,
	.done = pw_done,
	.free = pw_free,
	.waiting_on = pw_waiting_on,
};

/* ---- Bruck -------------------------------------------------------------- */

struct bruck_state {
	size_t blk;   /* bytes per block */
	int n, k;     /* ranks; this round's distance (k >= n: done) */
	int to, from; /* this round's partners */
	size_t npack; /* blocks moved this round */
	bool packed;
	uint8_t *tmp;	/* n blocks: tmp[j] is for / from rank r +- j */
	uint8_t *spack; /* this round's blocks out */
	uint8_t *rpack; /* and in */
	struct fr_xfer tx, rx;
};

/* The blocks of this round: tmp[j] for every j with bit k set. */
static void bruck_pack(struct bruck_state *st, uint8_t *pack, bool out)
{
	size_t i = 0;

	for (int j = 1; j < st->n && st->blk; j++) {
		if (!(j & st->k))
			continue;
		if (out)
			memcpy(pack + i * st->blk,
			       st->tmp + (size_t)j * st->blk, st->blk);
		else
			memcpy(st->tmp + (size_t)j * st->blk,
			       pack + i * st->blk, st->blk);
		i++;
	}
}

static void bruck_round(struct fr_comm *comm, struct bruck_state *st)
{
	st->npack = 0;
	for (int j = 1; j < st->n; j++)
		st->npack += (j & st->k) != 0;
	st->to = (comm->rank + st->k) % st->n;
	st->from = (comm->rank - st->k + st->n) % st->n;
	st->packed = false;
	fr_xfer_init(&st->tx, comm, st->npack * st->blk);
	fr_xfer_init(&st->rx, comm, st->npack * st->blk);
}

static int bruck_start(struct fr_comm *comm, struct fr_request *req)
{
	struct bruck_state *st = fr_algo_state_new(req, sizeof(*st));
	int n = comm->nranks, me = comm->rank;
	const uint8_t *src;

	if (!st)
		return FR_ENOMEM;
	st->n = n;
	st->blk = req->count * fr_dtype_size(req->dtype);
	st->k = 1;
	src = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	if (n == 1) {
		if (src != req->recvbuf && st->blk)
			memcpy(req->recvbuf, src, st->blk);
		return 0;
	}
	/* empty blocks: empty messages only (the buffers may be NULL) */
	st->tmp = malloc((size_t)n * st->blk +
			 2 * ((size_t)n / 2 + 1) * st->blk + 1);
	if (!st->tmp)
		return FR_ENOMEM;
	st->spack = st->tmp + (size_t)n * st->blk;
	st->rpack = st->spack + ((size_t)n / 2 + 1) * st->blk;
	for (int j = 0; j < n && st->blk; j++)
		memcpy(st->tmp + (size_t)j * st->blk,
		       src + (size_t)((me + j) % n) * st->blk, st->blk);
	bruck_round(comm, st);
	for (int k = 1; k < n; k <<= 1) {
		fr_peer_need(comm, (me + k) % n);
		fr_peer_need(comm, (me - k + n) % n);
	}
	return comm->fail.failed;
}

static int bruck_advance(struct fr_comm *comm, struct fr_request *req,
			 bool *did_work)
{
	struct bruck_state *st = req->algo_state;
	uint16_t step;
	int rc;

	while (st->k < st->n) {
		step = (uint16_t)__builtin_ctz((unsigned)st->k);
		if (!st->packed) {
			bruck_pack(st, st->spack, true);
			st->packed = true;
		}
		rc = fr_algo_peer_ready(comm, st->to);
		if (rc > 0)
			rc = fr_xfer_send(comm, req, &st->tx, st->to, step,
					  st->spack, st->tx.len, did_work);
		if (rc < 0)
			return rc;
		rc = fr_algo_peer_ready(comm, st->from);
		if (rc > 0)
			rc = fr_xfer_take(comm, req, &st->rx, st->from, step,
					  st->rpack, NULL, NULL, 1, UINT32_MAX,
					  did_work);
		if (rc < 0)
			return rc;
		if (!fr_xfer_complete(&st->rx) || !fr_xfer_complete(&st->tx))
			return 0;
		bruck_pack(st, st->rpack, false);
		st->k <<= 1;
		*did_work = true;
		if (st->k < st->n) {
			bruck_round(comm, st);
			continue;
		}
		/* tmp[j] came from rank r - j */
		for (int j = 0; j < st->n && st->blk; j++)
			memcpy((uint8_t *)req->recvbuf +
				       (size_t)((comm->rank - j + st->n) %
						st->n) *
					       st->blk,
			       st->tmp + (size_t)j * st->blk, st->blk);
	}
	return 0;
}

static bool bruck_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct bruck_state *st = req->algo_state;

	(void)comm;
	return st && st->k >= st->n;
}

static int bruck_waiting_on(const struct fr_comm *comm,
			    const struct fr_request *req)
{
	const struct bruck_state *st = req->algo_state;

	if (st && st->k < st->n)
		return fr_xfer_complete(&st->rx) ? st->to : st->from;
	return (comm->rank + 1) % comm->nranks;
}

static void bruck_free(struct fr_request *req)
{
	struct bruck_state *st = req->algo_state;

	if (st)
		free(st->tmp);
	fr_algo_free_state(req);
}

const struct fr_algo fr_algo_bruck = {
	.id = FR_ALGO_BRUCK,
	.name = "bruck",
	.start = bruck_start,
	.advance = bruck_advance,
	.done = bruck_done,
	.free = bruck_free,
	.waiting_on = bruck_waiting_on,
};
