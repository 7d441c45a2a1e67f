/* SPDX-License-Identifier: MIT */
/*
 * rabenseifner.c - Rabenseifner's All-Reduce: recursive-halving
 * reduce-scatter, then recursive-doubling all-gather.
 *
 * Schedule (n ranks, pof2 = largest power of two <= n, L = lg pof2; the
 * fold and unfold for n not a power of two are hcube.c's):
 *
 *   reduce-scatter, steps k = 0 .. L-1: virtual rank v holds the element
 *     range R_k (R_0 = everything) and splits it at its middle; if bit k of
 *     v is 0 it keeps the lower half and sends the upper half to v ^ 2^k,
 *     else the reverse.  It receives the half it keeps from the partner and
 *     reduces it into its own.  After L steps it holds R_L, about count /
 *     pof2 elements, fully reduced (divided by n for FR_AVG).
 *   all-gather, steps k = L-1 .. 0: v sends R_(k+1) to v ^ 2^k and
 *     receives the partner's half of R_k into place, so it holds R_k.
 *
 * 2 L messages of decreasing then increasing size: 2 lg p latencies but
 * only 2 (p-1)/p n bytes on the wire per rank, which makes it the choice
 * between recursive doubling (small) and the ring (large).  A step's data
 * travels as mailbox fragments (xfer.c) reduced or copied on arrival, or,
 * from fr_zx_min() bytes up, zero copy (xfer.c, "Zero-copy steps"): the
 * partner writes the reduce-scatter's half into our staging area, which
 * we reduce a segment at a time as it lands, and the all-gather's half
 * straight into its place in recvbuf.  On a large job that matters most:
 * 32 MiB of mailbox over 4,096 ranks leaves fragments of about 1 KiB.
 *
 * Determinism: element i is combined over the hypercube dimensions in the
 * order 0, 1, ..., L-1, by the same commutative kernels, exactly the tree
 * of recursive doubling: both algorithms give the same bits.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "algo.h"
#include "peer.h"
#include "reduce.h"

#define STEP_RS(k) (uint16_t)(1 + (k))
#define STEP_AG(k) (uint16_t)(0x100 + (k))
#define MAX_STEPS 32

struct rab_state {
	struct fr_hc hc; /* first: hcube.c's done / waiting_on use it */
	bool gather;	 /* in the all-gather half of the body */
	int k;
	/* element range held after k reduce-scatter steps */
	size_t lo[MAX_STEPS + 1], hi[MAX_STEPS + 1];
};

static int rab_start(struct fr_comm *comm, struct fr_request *req)
{
	struct rab_state *st = fr_algo_state_new(req, sizeof(*st));
	const struct fr_hcube *h;
	int rc;

	if (!st)
		return FR_ENOMEM;
	rc = fr_hc_start(comm, req, &st->hc);
	h = &st->hc.h;
	st->lo[0] = 0;
	st->hi[0] = req->count;
	for (int k = 0; h->vrank >= 0 && k < h->steps; k++) {
		size_t mid = st->lo[k] + (st->hi[k] - st->lo[k]) / 2;

		if (h->vrank & (1 << k)) {
			st->lo[k + 1] = mid;
			st->hi[k + 1] = st->hi[k];
		} else {
			st->lo[k + 1] = st->lo[k];
			st->hi[k + 1] = mid;
		}
	}
	return rc;
}

/* Bytes of R_(k+1) (ours after step k) and of the other half of R_k (the
 * partner's), as offsets and lengths. */
static void halves(const struct rab_state *st, int k, size_t *mine,
		   size_t *mlen, size_t *other, size_t *olen)
{
	size_t es = st->hc.es, olo, ohi;

	if (st->lo[k + 1] == st->lo[k]) {
		olo = st->hi[k + 1];
		ohi = st->hi[k];
	} else {
		olo = st->lo[k];
		ohi = st->lo[k + 1];
	}
	*mine = st->lo[k + 1] * es;
	*mlen = (st->hi[k + 1] - st->lo[k + 1]) * es;
	*other = olo * es;
	*olen = (ohi - olo) * es;
}

static int body(struct fr_comm *comm, struct fr_request *req, bool *did_work)
{
	struct rab_state *st = req->algo_state;
	struct fr_hc *hc = &st->hc;
	const struct fr_hcube *h = &hc->h;
	size_t mine, mlen, other, olen;
	int rc;

	/* reduce-scatter: send the partner's half, reduce ours */
	while (!st->gather && st->k < h->steps) {
		halves(st, st->k, &mine, &mlen, &other, &olen);
		rc = fr_hc_exchange(comm, req, hc,
				    fr_hcube_real(h, h->vrank ^ (1 << st->k)),
				    STEP_RS(st->k), hc->cur + other, olen,
				    hc->buf + mine, hc->cur + mine, mlen, false,
				    did_work);
		if (rc <= 0)
			return rc;
		/* R_(k+1), all that later steps read, is in buf now */
		hc->cur = hc->buf;
		if (++st->k < h->steps)
			continue;
		st->gather = true;
		st->k = h->steps - 1;
		mine = st->lo[h->steps] * hc->es;
		mlen = (st->hi[h->steps] - st->lo[h->steps]) * hc->es;
		if (req->op == FR_AVG && mlen)
			fr_reduce_scale_avg(req->dtype, hc->buf + mine,
					    mlen / hc->es, comm->nranks);
	}
	/* all-gather: send ours, copy the partner's into place */
	while (st->k >= 0) {
		halves(st, st->k, &mine, &mlen, &other, &olen);
		rc = fr_hc_exchange(comm, req, hc,
				    fr_hcube_real(h, h->vrank ^ (1 << st->k)),
				    STEP_AG(st->k), hc->buf + mine, mlen,
				    hc->buf + other, NULL, olen, false,
				    did_work);
		if (rc <= 0)
			return rc;
		st->k--;
	}
	fr_hc_body_done(comm, hc);
	return 0;
}

static int rab_advance(struct fr_comm *comm, struct fr_request *req,
		       bool *did_work)
{
	return fr_hc_run(comm, req, body, did_work);
}

const struct fr_algo fr_algo_rabenseifner = {
	.id = FR_ALGO_RABENSEIFNER,
	.name = "rabenseifner",
	.start = rab_start,
	.advance = rab_advance,
	.done = fr_hc_done,
	.free = fr_hc_free,
	.waiting_on = fr_hc_waiting_on,
	.imm_types = 1u << FR_IMM_ZX,
	.on_cqe = fr_zx_on_cqe,
};
