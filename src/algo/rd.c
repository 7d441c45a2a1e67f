/* SPDX-License-Identifier: MIT */
/*
 * rd.c - recursive doubling All-Reduce, the latency-optimal schedule.
 *
 * Schedule (n ranks, pof2 = largest power of two <= n, rem = n - pof2):
 *
 *   fold (only when n is not a power of two): of each pair (2i, 2i+1),
 *     i < rem, the even rank sends its whole input to the odd one, which
 *     reduces it into its own; the odd rank becomes virtual rank i and the
 *     even one waits out the rest.  Ranks >= 2 rem are virtual rank r - rem.
 *   steps k = 0 .. lg(pof2) - 1: virtual rank v exchanges its whole current
 *     vector with virtual rank v ^ 2^k and reduces what it receives into it.
 *     After step k every group of 2^(k+1) virtual ranks holds the same sum.
 *   unfold: the odd rank of each folded pair sends the result to its even
 *     partner.
 *
 * lg(pof2) (+2) steps of one message each: every message carries its
 * header and data in one write into the partner's mailbox (eager: no
 * ready-to-receive round trip), so an 8-byte All-Reduce costs lg n one-way
 * latencies.  Vectors larger than a mailbox slot go as fragments, each
 * reduced on arrival (pipelined against the rest of the step).
 *
 * Determinism: both ranks of a step combine the same two vectors and every
 * kernel is commutative bit for bit, so all ranks end with identical bits;
 * element i's result is the fixed tree ((x0 ^ x1) ^ (x2 ^ x3)) ... over the
 * hypercube (after the fold), the same tree Rabenseifner's algorithm uses,
 * so both give the same bits for the same inputs.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

enum { PH_FOLD, PH_STEPS, PH_UNFOLD, PH_DONE };
#define STEP_FOLD 0
#define STEP_UNFOLD 0xffff

struct rd_state {
	struct fr_hcube h;
	size_t bytes;
	size_t es;
	const uint8_t *cur; /* the current vector: the input, then buf */
	uint8_t *buf;
	fr_reduce_fn kern;
	int phase, k, partner;
	struct fr_xfer tx, rx;
};

void fr_hcube_init(struct fr_hcube *h, int rank, int n)
{
	h->pof2 = 1;
	h->steps = 0;
	while (h->pof2 * 2 <= n) {
		h->pof2 *= 2;
		h->steps++;
	}
	h->rem = n - h->pof2;
	if (rank < 2 * h->rem)
		h->vrank = rank % 2 ? rank / 2 : -1;
	else
		h->vrank = rank - h->rem;
}

static int rd_start(struct fr_comm *comm, struct fr_request *req)
{
	struct rd_state *st = calloc(1, sizeof(*st));

	if (!st)
		return FR_ENOMEM;
	req->algo_state = st;
	st->es = fr_dtype_size(req->dtype);
	st->bytes = req->count * st->es;
	st->buf = req->recvbuf;
	st->cur = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	st->kern = fr_reduce_kernel(req->dtype, req->op);
	fr_hcube_init(&st->h, comm->rank, comm->nranks);
	if (comm->nranks == 1) {
		if (st->bytes && st->cur != st->buf)
			memcpy(st->buf, st->cur, st->bytes);
		st->phase = PH_DONE;
		return 0;
	}
	st->phase = PH_FOLD;
	/* Start every connection this schedule needs at once. */
	if (comm->rank < 2 * st->h.rem)
		fr_peer_need(comm, comm->rank ^ 1);
	for (int k = 0; st->h.vrank >= 0 && k < st->h.steps; k++)
		fr_peer_need(comm, fr_hcube_real(&st->h, st->h.vrank ^ (1 << k)));
	return comm->failed;
}

static void phase_init(struct fr_comm *comm, struct rd_state *st, int phase,
		       int partner)
{
	st->phase = phase;
	st->partner = partner;
	fr_xfer_init(&st->tx, comm, st->bytes);
	fr_xfer_init(&st->rx, comm, st->bytes);
}

/* Receive fragments; reduce = combine with cur into buf, else copy. */
static int take(struct fr_comm *comm, struct fr_request *req,
		struct rd_state *st, uint16_t step, bool reduce,
		uint32_t limit, bool *did_work)
{
	return fr_xfer_take(comm, req, &st->rx, st->partner, step, st->buf,
			    st->cur, reduce ? st->kern : NULL, st->es, limit,
			    did_work);
}

static int rd_advance(struct fr_comm *comm, struct fr_request *req,
		      bool *did_work)
{
	struct rd_state *st = req->algo_state;
	const struct fr_hcube *h = &st->h;
	int r = comm->rank, rc;

	for (;;) {
		switch (st->phase) {
		case PH_FOLD:
			if (r >= 2 * h->rem) {
				phase_init(comm, st, PH_STEPS, -1);
				st->k = -1;
				goto next_step;
			}
			if (st->partner < 0 || st->tx.nfrags == 0)
				phase_init(comm, st, PH_FOLD, r ^ 1);
			rc = fr_peer_need(comm, st->partner);
			if (rc)
				return rc == FR_EAGAIN ? 0 : rc;
			if (r % 2 == 0) {
				rc = fr_xfer_send(comm, req, &st->tx, st->partner,
						  STEP_FOLD, st->cur, st->bytes,
						  did_work);
				if (rc || !fr_xfer_complete(&st->tx))
					return rc;
				phase_init(comm, st, PH_UNFOLD, r + 1);
				continue;
			}
			rc = take(comm, req, st, STEP_FOLD, true, st->rx.nfrags,
				  did_work);
			if (rc || !fr_xfer_complete(&st->rx))
				return rc;
			st->cur = st->buf;
			phase_init(comm, st, PH_STEPS, -1);
			st->k = -1;
			goto next_step;
		case PH_STEPS:
			rc = fr_peer_need(comm, st->partner);
			if (rc)
				return rc == FR_EAGAIN ? 0 : rc;
			rc = fr_xfer_send(comm, req, &st->tx, st->partner,
					  (uint16_t)(1 + st->k), st->cur,
					  st->bytes, did_work);
			if (rc)
				return rc;
			/* A fragment may overwrite buf only once our own
			 * fragment of those bytes has been copied out. */
			rc = take(comm, req, st, (uint16_t)(1 + st->k), true,
				  st->tx.done, did_work);
			if (rc || !fr_xfer_complete(&st->tx) ||
			    !fr_xfer_complete(&st->rx))
				return rc;
			st->cur = st->buf;
next_step:
			if (++st->k < h->steps) {
				phase_init(comm, st, PH_STEPS,
					   fr_hcube_real(h, h->vrank ^ (1 << st->k)));
				continue;
			}
			if (req->op == FR_AVG && st->bytes) {
				if (st->cur != st->buf)
					memcpy(st->buf, st->cur, st->bytes);
				fr_reduce_scale_avg(req->dtype, st->buf,
						    req->count, comm->nranks);
			} else if (st->cur != st->buf && st->bytes) {
				memcpy(st->buf, st->cur, st->bytes);
			}
			st->cur = st->buf;
			if (r >= 2 * h->rem) {
				st->phase = PH_DONE;
				return 0;
			}
			phase_init(comm, st, PH_UNFOLD, r - 1);
			continue;
		case PH_UNFOLD:
			if (r % 2) {
				rc = fr_xfer_send(comm, req, &st->tx, st->partner,
						  STEP_UNFOLD, st->buf,
						  st->bytes, did_work);
				if (rc || !fr_xfer_complete(&st->tx))
					return rc;
			} else {
				rc = take(comm, req, st, STEP_UNFOLD, false,
					  st->rx.nfrags, did_work);
				if (rc || !fr_xfer_complete(&st->rx))
					return rc;
			}
			st->phase = PH_DONE;
			return 0;
		default:
			return 0;
		}
	}
}

static bool rd_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct rd_state *st = req->algo_state;

	(void)comm;
	return st && st->phase == PH_DONE;
}

static void rd_free(struct fr_request *req)
{
	free(req->algo_state);
	req->algo_state = NULL;
}

static int rd_waiting_on(const struct fr_comm *comm,
			 const struct fr_request *req)
{
	const struct rd_state *st = req->algo_state;

	return st && st->partner >= 0 ? st->partner : (comm->rank + 1) % comm->nranks;
}

const struct fr_algo fr_algo_rd = {
	.id = FR_ALGO_RD,
	.name = "rd",
	.start = rd_start,
	.advance = rd_advance,
	.done = rd_done,
	.free = rd_free,
	.waiting_on = rd_waiting_on,
};
