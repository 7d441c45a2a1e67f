/* SPDX-License-Identifier: MIT */
/*
 * hcube.c - what recursive doubling and Rabenseifner share: the hypercube
 * of virtual ranks, and the fold / unfold that make any n a power of two.
 *
 * Schedule of the fold (n ranks, pof2 = largest power of two <= n,
 * rem = n - pof2): of each pair (2i, 2i+1), i < rem, the even rank sends its
 * whole input to the odd one, which reduces it into its own and becomes
 * virtual rank i; ranks >= 2 rem are virtual rank r - rem.  The even rank
 * waits out the body and receives the whole result in the unfold.  Both
 * go zero copy from fr_zx_min() bytes up (xfer.c), as Rabenseifner's
 * steps do (fr_hc_exchange; recursive doubling's steps, which reduce into
 * what they send, stay in the mailbox).
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "mem.h"
#include "peer.h"

#define STEP_FOLD 0
#define STEP_UNFOLD 0xffff

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

int fr_hc_start(struct fr_comm *comm, struct fr_request *req, struct fr_hc *hc)
{
	const struct fr_hcube *h = &hc->h;

	hc->es = fr_dtype_size(req->dtype);
	hc->bytes = req->count * hc->es;
	hc->buf = req->recvbuf;
	hc->cur = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	hc->in = hc->cur;
	hc->zr.slot = -1; /* no receive open (fr_hc_free) */
	hc->kern = fr_reduce_kernel(req->dtype, req->op);
	hc->partner = -1;
	fr_hcube_init(&hc->h, comm->rank, comm->nranks);
	if (comm->nranks == 1) {
		if (hc->bytes && hc->cur != hc->buf)
			memcpy(hc->buf, hc->cur, hc->bytes);
		hc->stage = FR_HC_DONE;
		return 0;
	}
	hc->stage = FR_HC_FOLD;
	/* Start every connection this schedule needs at once. */
	if (comm->rank < 2 * h->rem)
		fr_peer_need(comm, comm->rank ^ 1);
	for (int k = 0; h->vrank >= 0 && k < h->steps; k++)
		fr_peer_need(comm, fr_hcube_real(h, h->vrank ^ (1 << k)));
	return comm->fail.failed;
}

/* The registration holding p (in buf or in the input) and p's offset in
 * it: 0, or the error that failed the communicator. */
static int hc_mem(struct fr_comm *comm, struct fr_hc *hc, const uint8_t *p,
		  struct fr_mem **mem, size_t *off)
{
	/* p starts a non-empty range: in buf only if below its end (an
	 * input right after buf is not buf's) */
	bool in_buf = p >= hc->buf && p < hc->buf + hc->bytes;
	const uint8_t *base = in_buf ? hc->buf : hc->in;
	struct fr_mem **m = in_buf ? &hc->bmem : &hc->imem;
	int rc = 0;

	if (!*m)
		rc = fr_mem_acquire(comm, base, hc->bytes,
				    in_buf ? FR_TP_LOCAL_READ |
						     FR_TP_LOCAL_WRITE |
						     FR_TP_REMOTE_WRITE
					   : FR_TP_LOCAL_READ,
				    m);
	if (rc)
		return fr_comm_fail(comm, rc,
				    "rank %d: registering %zu bytes: %s",
				    comm->rank, hc->bytes, fr_strerror(rc));
	*mem = *m;
	*off = (size_t)(p - base) + ((uintptr_t)base - (*m)->base);
	return 0;
}

/* A zero-copy receive: what came reduced into dst (with a) segment by
 * segment from the staging area, which holds a chunk of at most
 * FR_ZX_STAGE_MAX bytes; then the next chunk's READY, once the area is
 * free (a gathered step lands in place, in one chunk). */
static int hc_zx_recv(struct fr_comm *comm, struct fr_request *req,
		      struct fr_hc *hc, uint16_t step, uint8_t *dst,
		      const uint8_t *a, size_t rxlen, bool *did_work)
{
	struct fr_zx_layer *zl = &comm->algo.zx;
	struct fr_zx *z = &hc->zr;
	size_t off = 0, n, chunk = rxlen;
	struct fr_mem *mem;
	int rc;

	n = a ? (z->arrived - hc->zdone) / hc->es * hc->es : 0;
	if (n) {
		hc->kern(dst + hc->zdone, a + hc->zdone,
			 (const uint8_t *)zl->stage +
				 (hc->zdone - z->chunk_start),
			 n / hc->es);
		hc->zdone += n;
		*did_work = true;
	}
	if (z->posted || fr_zx_recv_done(z) || (a && hc->zdone < z->arrived))
		return 0;
	if (a) {
		chunk = FR_MIN(rxlen - z->arrived, (size_t)FR_ZX_STAGE_MAX);
		rc = fr_zx_stage(comm, chunk);
		if (rc)
			return fr_comm_fail(
				comm, rc,
				"rank %d: a staging area of %zu bytes: %s",
				comm->rank, chunk, fr_strerror(rc));
		mem = zl->stage_mem;
	} else if ((rc = hc_mem(comm, hc, dst + z->arrived, &mem, &off))) {
		return rc;
	}
	return fr_zx_recv(comm, req, z, hc->partner, step, mem, off, rxlen,
			  chunk, did_work);
}

/* A step's transfers with partner, zero copy where zx_ok and the length
 * calls for it (the same answer on both sides: the lengths agree). */
static void hc_step(struct fr_comm *comm, struct fr_hc *hc, int partner,
		    size_t txlen, size_t rxlen, bool zx_ok)
{
	hc->partner = partner;
	fr_xfer_init(&hc->tx, comm, txlen);
	fr_xfer_init(&hc->rx, comm, rxlen);
	hc->inited = true;
	hc->ztx = zx_ok && fr_zx_use(comm, txlen);
	hc->zrx = zx_ok && fr_zx_use(comm, rxlen);
	fr_zx_reset(&hc->zt);
	fr_zx_reset(&hc->zr);
	hc->zdone = 0;
}

/* Send the step's txlen bytes from src: 0 (also while going on), the
 * error; *done once all is sent. */
static int hc_send(struct fr_comm *comm, struct fr_request *req,
		   struct fr_hc *hc, uint16_t step, const uint8_t *src,
		   size_t txlen, bool *done, bool *did_work)
{
	struct fr_mem *mem;
	size_t off;
	int rc;

	if (!hc->ztx) {
		rc = fr_xfer_send(comm, req, &hc->tx, hc->partner, step, src,
				  txlen, did_work);
		*done = !rc && fr_xfer_complete(&hc->tx);
		return rc;
	}
	rc = hc_mem(comm, hc, src, &mem, &off);
	if (!rc)
		rc = fr_zx_send(comm, req, &hc->zt, hc->partner, step, mem, off,
				txlen, did_work);
	hc->zwrote |= hc->zt.wrote;
	*done = !rc && fr_zx_send_done(&hc->zt);
	return rc;
}

/* Take the step's rxlen bytes into dst (dst = a OP them with hc->kern
 * when a, else a copy): 0 or the error; *done once all is in. */
static int hc_recv(struct fr_comm *comm, struct fr_request *req,
		   struct fr_hc *hc, uint16_t step, uint8_t *dst,
		   const uint8_t *a, size_t rxlen, bool *done, bool *did_work)
{
	int rc;

	if (!hc->zrx) {
		rc = fr_xfer_take(comm, req, &hc->rx, hc->partner, step, dst, a,
				  a ? hc->kern : NULL, hc->es, UINT32_MAX,
				  did_work);
		*done = !rc && fr_xfer_complete(&hc->rx);
		return rc;
	}
	rc = hc_zx_recv(comm, req, hc, step, dst, a, rxlen, did_work);
	*done = !rc && fr_zx_recv_done(&hc->zr) && (!a || hc->zdone == rxlen);
	return rc;
}

int fr_hc_exchange(struct fr_comm *comm, struct fr_request *req,
		   struct fr_hc *hc, int partner, uint16_t step,
		   const uint8_t *src, size_t txlen, uint8_t *dst,
		   const uint8_t *a, size_t rxlen, bool lockstep,
		   bool *did_work)
{
	bool tx_done = false, rx_done = false;
	int rc = 0;

	/* lockstep reads what it reduces into: fragments only */
	if (!hc->inited)
		hc_step(comm, hc, partner, txlen, rxlen, !lockstep);
	rc = fr_peer_need(comm, hc->partner);
	if (rc)
		return rc == FR_EAGAIN ? 0 : rc;
	/* the READY first: the partner's data may start at once, and a
	 * fragment of ours must not overtake it (the partner's zero-copy
	 * send takes a READY first) */
	if (hc->zrx) {
		rc = hc_recv(comm, req, hc, step, dst, a, rxlen, &rx_done,
			     did_work);
		if (!rc && !hc->zr.posted && !hc->zr.arrived)
			return comm->fail.failed;
	}
	if (!rc)
		rc = hc_send(comm, req, hc, step, src, txlen, &tx_done,
			     did_work);
	if (!rc && !hc->zrx) {
		rc = fr_xfer_take(comm, req, &hc->rx, hc->partner, step, dst, a,
				  a ? hc->kern : NULL, hc->es,
				  lockstep ? hc->tx.done : UINT32_MAX,
				  did_work);
		rx_done = !rc && fr_xfer_complete(&hc->rx);
	}
	if (rc || !tx_done || !rx_done)
		return rc;
	hc->inited = false;
	return 1;
}

int fr_hc_fold(struct fr_comm *comm, struct fr_request *req, struct fr_hc *hc,
	       bool *did_work)
{
	int r = comm->rank, rc;
	bool done;

	if (r >= 2 * hc->h.rem) {
		hc->stage = FR_HC_BODY;
		hc->inited = false;
		return 0;
	}
	if (!hc->inited)
		hc_step(comm, hc, r ^ 1, r % 2 ? 0 : hc->bytes,
			r % 2 ? hc->bytes : 0, true);
	rc = fr_peer_need(comm, hc->partner);
	if (rc)
		return rc == FR_EAGAIN ? 0 : rc;
	if (r % 2 == 0) {
		rc = hc_send(comm, req, hc, STEP_FOLD, hc->cur, hc->bytes,
			     &done, did_work);
		if (rc || !done)
			return rc;
		/* nothing to do until the result comes back (its READY, for
		 * a zero-copy one, goes out now: the partner's writes land
		 * once it has read all of ours) */
		hc->stage = FR_HC_UNFOLD;
		hc_step(comm, hc, r + 1, 0, hc->bytes, true);
		return 0;
	}
	rc = hc_recv(comm, req, hc, STEP_FOLD, hc->buf, hc->cur, hc->bytes,
		     &done, did_work);
	if (rc || !done)
		return rc;
	hc->cur = hc->buf;
	hc->stage = FR_HC_BODY;
	hc->inited = false;
	return 0;
}

void fr_hc_body_done(struct fr_comm *comm, struct fr_hc *hc)
{
	int r = comm->rank;

	if (hc->cur != hc->buf && hc->bytes)
		memcpy(hc->buf, hc->cur, hc->bytes);
	hc->cur = hc->buf;
	if (r >= 2 * hc->h.rem) {
		hc->stage = FR_HC_DONE;
		return;
	}
	hc->stage = FR_HC_UNFOLD;
	hc_step(comm, hc, r - 1, hc->bytes, 0, true);
}

int fr_hc_unfold(struct fr_comm *comm, struct fr_request *req, struct fr_hc *hc,
		 bool *did_work)
{
	bool done;
	int rc;

	if (comm->rank % 2)
		rc = hc_send(comm, req, hc, STEP_UNFOLD, hc->buf, hc->bytes,
			     &done, did_work);
	else
		rc = hc_recv(comm, req, hc, STEP_UNFOLD, hc->buf, NULL,
			     hc->bytes, &done, did_work);
	if (rc || !done)
		return rc;
	hc->stage = FR_HC_DONE;
	return 0;
}

int fr_hc_run(struct fr_comm *comm, struct fr_request *req, fr_hc_body_fn body,
	      bool *did_work)
{
	struct fr_hc *hc = req->algo_state;
	int stage, rc = 0;

	do {
		stage = hc->stage;
		switch (stage) {
		case FR_HC_FOLD:
			rc = fr_hc_fold(comm, req, hc, did_work);
			break;
		case FR_HC_BODY:
			rc = body(comm, req, did_work);
			break;
		case FR_HC_UNFOLD:
			rc = fr_hc_unfold(comm, req, hc, did_work);
			break;
		}
	} while (!rc && hc->stage != stage && hc->stage != FR_HC_DONE);
	return rc;
}

bool fr_hc_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct fr_hc *hc = req->algo_state;

	/* zero-copy steps read our buffers until their writes complete */
	return hc && hc->stage == FR_HC_DONE &&
	       (!hc->zwrote || comm->peer.user_outstanding == 0);
}

void fr_hc_free(struct fr_request *req)
{
	struct fr_hc *hc = req->algo_state;

	if (hc) {
		fr_zx_cancel(req->comm, &hc->zr);
		if (hc->imem)
			fr_mem_release(hc->imem);
		if (hc->bmem)
			fr_mem_release(hc->bmem);
	}
	fr_algo_free_state(req);
}

int fr_hc_waiting_on(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct fr_hc *hc = req->algo_state;

	return hc && hc->partner >= 0 ? hc->partner
				      : (comm->rank + 1) % comm->nranks;
}

void *fr_algo_state_new(struct fr_request *req, size_t size)
{
	void *st = size <= sizeof(req->algo_inline) ? req->algo_inline
						    : malloc(size);

	if (st)
		memset(st, 0, size);
	req->algo_state = st;
	return st;
}

void fr_algo_free_state(struct fr_request *req)
{
	if (req->algo_state != (void *)req->algo_inline)
		free(req->algo_state);
	req->algo_state = NULL;
}
