/* SPDX-License-Identifier: MIT */
/*
 * rd.c - recursive doubling All-Reduce, the latency-optimal schedule.
 *
 * Schedule (n ranks, pof2 = largest power of two <= n, rem = n - pof2):
 *
 *   fold (only when n is not a power of two, hcube.c): of each pair
 *     (2i, 2i+1), i < rem, the even rank sends its whole input to the odd
 *     one, which reduces it into its own and becomes virtual rank i; the
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

#include "internal.h"
#include "algo.h"
#include "peer.h"

#define STEP(k) (uint16_t)(1 + (k))

struct rd_state {
	struct fr_hc hc; /* first: hcube.c's done / waiting_on use it */
	int k;		 /* the step in the body */
};

static int rd_start(struct fr_comm *comm, struct fr_request *req)
{
	struct rd_state *st = fr_algo_state_new(req, sizeof(*st));

	if (!st)
		return FR_ENOMEM;
	return fr_hc_start(comm, req, &st->hc);
}

/* The steps: exchange the whole vector with v ^ 2^k and reduce. */
static int body(struct fr_comm *comm, struct fr_request *req, bool *did_work)
{
	struct rd_state *st = req->algo_state;
	struct fr_hc *hc = &st->hc;
	const struct fr_hcube *h = &hc->h;
	int rc;

	while (st->k < h->steps) {
		/* buf is what we send: a fragment may overwrite it only once
		 * our own fragment of those bytes is out (lockstep) */
		rc = fr_hc_exchange(comm, req, hc,
				    fr_hcube_real(h, h->vrank ^ (1 << st->k)),
				    STEP(st->k), hc->cur, hc->bytes, hc->buf,
				    hc->cur, hc->bytes, true, did_work);
		if (rc <= 0)
			return rc;
		hc->cur = hc->buf;
		st->k++;
	}
	fr_hc_body_done(comm, hc);
	if (req->op == FR_AVG && hc->bytes)
		fr_reduce_scale_avg(req->dtype, hc->buf, req->count,
				    comm->nranks);
	return 0;
}

static int rd_advance(struct fr_comm *comm, struct fr_request *req,
		      bool *did_work)
{
	return fr_hc_run(comm, req, body, did_work);
}

const struct fr_algo fr_algo_rd = {
	.id = FR_ALGO_RD,
	.name = "rd",
	.start = rd_start,
	.advance = rd_advance,
	.done = fr_hc_done,
	.free = fr_hc_free,
	.waiting_on = fr_hc_waiting_on,
};
