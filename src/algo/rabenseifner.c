/* SPDX-License-Identifier: MIT */
/*
 * rabenseifner.c - Rabenseifner's All-Reduce: recursive-halving
 * reduce-scatter, then recursive-doubling all-gather.
 *
 * Schedule (n ranks, pof2 = largest power of two <= n, L = lg pof2; the
 * fold and unfold for n not a power of two are those of rd.c):
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
 * between recursive doubling (small) and the ring (large).  Data travels
 * as mailbox fragments (xfer.c) reduced or copied on arrival.
 *
 * Determinism: element i is combined over the hypercube dimensions in the
 * order 0, 1, ..., L-1, by the same commutative kernels, exactly the tree
 * of recursive doubling: both algorithms give the same bits.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

enum { PH_FOLD, PH_RS, PH_AG, PH_UNFOLD, PH_DONE };
#define STEP_FOLD 0
#define STEP_RS(k) (uint16_t)(1 + (k))
#define STEP_AG(k) (uint16_t)(0x100 + (k))
#define STEP_UNFOLD 0xffff
#define MAX_STEPS 32

struct rab_state {
	struct fr_hcube h;
	size_t es, bytes;
	const uint8_t *cur; /* the input, until the first reduction */
	uint8_t *buf;
	fr_reduce_fn kern;
	int phase, k, partner;
	bool inited;
	/* element range held after k reduce-scatter steps */
	size_t lo[MAX_STEPS + 1], hi[MAX_STEPS + 1];
	struct fr_xfer tx, rx;
};

static int rab_start(struct fr_comm *comm, struct fr_request *req)
{
	struct rab_state *st = calloc(1, sizeof(*st));
	const struct fr_hcube *h;

	if (!st)
		return FR_ENOMEM;
	req->algo_state = st;
	st->es = fr_dtype_size(req->dtype);
	st->bytes = req->count * st->es;
	st->buf = req->recvbuf;
	st->cur = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	st->kern = fr_reduce_kernel(req->dtype, req->op);
	st->partner = -1;
	fr_hcube_init(&st->h, comm->rank, comm->nranks);
	h = &st->h;
	if (comm->nranks == 1) {
		if (st->bytes && st->cur != st->buf)
			memcpy(st->buf, st->cur, st->bytes);
		st->phase = PH_DONE;
		return 0;
	}
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
	st->phase = PH_FOLD;
	if (comm->rank < 2 * h->rem)
		fr_peer_need(comm, comm->rank ^ 1);
	for (int k = 0; h->vrank >= 0 && k < h->steps; k++)
		fr_peer_need(comm, fr_hcube_real(h, h->vrank ^ (1 << k)));
	return comm->failed;
}

/* Byte range [*off, *off + *len) of elements [lo, hi). */
static void brange(const struct rab_state *st, size_t lo, size_t hi,
		   size_t *off, size_t *len)
{
	*off = lo * st->es;
	*len = (hi - lo) * st->es;
}

static void xfers(struct fr_comm *comm, struct rab_state *st, int partner,
		  size_t txlen, size_t rxlen)
{
	st->partner = partner;
	fr_xfer_init(&st->tx, comm, txlen);
	fr_xfer_init(&st->rx, comm, rxlen);
	st->inited = true;
}

/* The other half of R_k, which the partner of step k holds. */
static void other_half(const struct rab_state *st, int k, size_t *lo,
		       size_t *hi)
{
	if (st->lo[k + 1] == st->lo[k]) {
		*lo = st->hi[k + 1];
		*hi = st->hi[k];
	} else {
		*lo = st->lo[k];
		*hi = st->lo[k + 1];
	}
}

static int rab_advance(struct fr_comm *comm, struct fr_request *req,
		       bool *did_work)
{
	struct rab_state *st = req->algo_state;
	const struct fr_hcube *h = &st->h;
	int r = comm->rank, rc;
	size_t off, len, olo, ohi, ooff, olen;

	for (;;) {
		switch (st->phase) {
		case PH_FOLD:
			if (r >= 2 * h->rem) {
				st->phase = PH_RS;
				st->k = 0;
				st->inited = false;
				continue;
			}
			if (!st->inited)
				xfers(comm, st, r ^ 1, st->bytes, st->bytes);
			rc = fr_peer_need(comm, st->partner);
			if (rc)
				return rc == FR_EAGAIN ? 0 : rc;
			if (r % 2 == 0) {
				rc = fr_xfer_send(comm, req, &st->tx, st->partner,
						  STEP_FOLD, st->cur, st->bytes,
						  did_work);
				if (rc || !fr_xfer_complete(&st->tx))
					return rc;
				st->phase = PH_UNFOLD;
				xfers(comm, st, r + 1, 0, st->bytes);
				continue;
			}
			rc = fr_xfer_take(comm, req, &st->rx, st->partner,
					  STEP_FOLD, st->buf, st->cur, st->kern,
					  st->es, UINT32_MAX, did_work);
			if (rc || !fr_xfer_complete(&st->rx))
				return rc;
			st->cur = st->buf;
			st->phase = PH_RS;
			st->k = 0;
			st->inited = false;
			continue;
		case PH_RS:
			if (st->k == h->steps) {
				brange(st, st->lo[h->steps], st->hi[h->steps],
				       &off, &len);
				if (st->cur != st->buf && len)
					memcpy(st->buf + off, st->cur + off, len);
				st->cur = st->buf;
				if (req->op == FR_AVG && len)
					fr_reduce_scale_avg(req->dtype,
							    st->buf + off,
							    len / st->es,
							    comm->nranks);
				st->phase = PH_AG;
				st->k = h->steps - 1;
				st->inited = false;
				continue;
			}
			other_half(st, st->k, &olo, &ohi);
			brange(st, olo, ohi, &ooff, &olen);
			brange(st, st->lo[st->k + 1], st->hi[st->k + 1], &off,
			       &len);
			if (!st->inited)
				xfers(comm, st,
				      fr_hcube_real(h, h->vrank ^ (1 << st->k)),
				      olen, len);
			rc = fr_peer_need(comm, st->partner);
			if (rc)
				return rc == FR_EAGAIN ? 0 : rc;
			rc = fr_xfer_send(comm, req, &st->tx, st->partner,
					  STEP_RS(st->k), st->cur + ooff, olen,
					  did_work);
			if (!rc)
				rc = fr_xfer_take(comm, req, &st->rx,
						  st->partner, STEP_RS(st->k),
						  st->buf + off, st->cur + off,
						  st->kern, st->es, UINT32_MAX,
						  did_work);
			if (rc || !fr_xfer_complete(&st->tx) ||
			    !fr_xfer_complete(&st->rx))
				return rc;
			/* R_(k+1), all that later steps read, is in buf now */
			st->cur = st->buf;
			st->k++;
			st->inited = false;
			continue;
		case PH_AG:
			if (st->k < 0) {
				if (r >= 2 * h->rem) {
					st->phase = PH_DONE;
					return 0;
				}
				st->phase = PH_UNFOLD;
				xfers(comm, st, r - 1, st->bytes, 0);
				continue;
			}
			brange(st, st->lo[st->k + 1], st->hi[st->k + 1], &off,
			       &len);
			other_half(st, st->k, &olo, &ohi);
			brange(st, olo, ohi, &ooff, &olen);
			if (!st->inited)
				xfers(comm, st,
				      fr_hcube_real(h, h->vrank ^ (1 << st->k)),
				      len, olen);
			rc = fr_peer_need(comm, st->partner);
			if (rc)
				return rc == FR_EAGAIN ? 0 : rc;
			rc = fr_xfer_send(comm, req, &st->tx, st->partner,
					  STEP_AG(st->k), st->buf + off, len,
					  did_work);
			if (!rc)
				rc = fr_xfer_take(comm, req, &st->rx,
						  st->partner, STEP_AG(st->k),
						  st->buf + ooff, NULL, NULL,
						  st->es, UINT32_MAX, did_work);
			if (rc || !fr_xfer_complete(&st->tx) ||
			    !fr_xfer_complete(&st->rx))
				return rc;
			st->k--;
			st->inited = false;
			continue;
		case PH_UNFOLD:
			if (r % 2) {
				rc = fr_xfer_send(comm, req, &st->tx, st->partner,
						  STEP_UNFOLD, st->buf,
						  st->bytes, did_work);
				if (rc || !fr_xfer_complete(&st->tx))
					return rc;
			} else {
				rc = fr_xfer_take(comm, req, &st->rx,
						  st->partner, STEP_UNFOLD,
						  st->buf, NULL, NULL, st->es,
						  UINT32_MAX, did_work);
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

static bool rab_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct rab_state *st = req->algo_state;

	(void)comm;
	return st && st->phase == PH_DONE;
}

static void rab_free(struct fr_request *req)
{
	free(req->algo_state);
	req->algo_state = NULL;
}

static int rab_waiting_on(const struct fr_comm *comm,
			  const struct fr_request *req)
{
	const struct rab_state *st = req->algo_state;

	return st && st->partner >= 0 ? st->partner :
					(comm->rank + 1) % comm->nranks;
}

const struct fr_algo fr_algo_rabenseifner = {
	.id = FR_ALGO_RABENSEIFNER,
	.name = "rabenseifner",
	.start = rab_start,
	.advance = rab_advance,
	.done = rab_done,
	.free = rab_free,
	.waiting_on = rab_waiting_on,
};
