/* SPDX-License-Identifier: MIT */
/*
 * xfer.c - a step's data as a sequence of mailbox fragments.
 *
 * The eager protocol of the latency-optimal algorithms: each fragment is
 * one message (header + up to fr_msg_payload_max() bytes) written into the
 * receiver's mailbox without any ready-to-receive round trip; credits per
 * peer bound how far a sender runs ahead.  The header's step and offset
 * must be what the receiver's schedule expects next, else the collective
 * fails with FR_EPROTO instead of reducing the wrong bytes.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"
#include "util.h"

void fr_xfer_init(struct fr_xfer *x, const struct fr_comm *comm, size_t len)
{
	size_t maxp = fr_msg_payload_max(comm);

	x->len = len;
	x->nfrags = len ? (uint32_t)((len + maxp - 1) / maxp) : 1;
	x->done = 0;
	x->aux = 0;
}

uint32_t fr_xfer_len_tag(size_t len)
{
	uint64_t v = (uint64_t)len;
	uint32_t t = (uint32_t)(v ^ (v >> 32));

	/* every bit of a length below 4 GiB counts; never 0 ("no tag") */
	return t ? t : 0x80000000u;
}

size_t fr_xfer_bytes(const struct fr_comm *comm, const struct fr_xfer *x,
		     uint32_t frags)
{
	return FR_MIN((size_t)frags * fr_msg_payload_max(comm), x->len);
}

static int send_frag(struct fr_comm *comm, const struct fr_request *req,
		     int rank, uint16_t step, uint64_t off, const void *src,
		     size_t len, uint32_t aux, uint32_t *done, bool *did_work)
{
	struct fr_msg m;
	int rc;

	fr_msg_for(req, FR_MSG_DATA, &m);
	m.step = step;
	m.offset = off;
	m.aux = aux;
	rc = fr_msg_send(comm, rank, &m, src, len);
	if (rc == FR_EAGAIN)
		return rc;
	if (rc)
		return fr_comm_fail(
			comm, rc,
			"rank %d: collective #%u: sending to rank %d: %s",
			comm->rank, req->seq, rank, fr_strerror(rc));
	(*done)++;
	*did_work = true;
	return 0;
}

int fr_xfer_send_frag(struct fr_comm *comm, const struct fr_request *req,
		      int rank, uint16_t step, uint64_t off, const void *src,
		      size_t len, uint32_t *done, bool *did_work)
{
	return send_frag(comm, req, rank, step, off, src, len, 0, done,
			 did_work);
}

int fr_xfer_send(struct fr_comm *comm, const struct fr_request *req,
		 struct fr_xfer *x, int rank, uint16_t step, const uint8_t *src,
		 size_t avail, bool *did_work)
{
	size_t maxp = fr_msg_payload_max(comm);

	while (x->done < x->nfrags) {
		size_t off = (size_t)x->done * maxp;
		size_t len = FR_MIN(maxp, x->len - off);
		int rc;

		if (x->len && off + len > avail)
			break; /* not there yet */
		rc = send_frag(comm, req, rank, step, off, src + off, len,
			       x->aux, &x->done, did_work);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
	}
	return 0;
}

int fr_xfer_recv(struct fr_comm *comm, const struct fr_request *req,
		 struct fr_xfer *x, int rank, uint16_t step, size_t *off,
		 size_t *len, const uint8_t **payload)
{
	size_t maxp = fr_msg_payload_max(comm);
	const struct fr_msg *m;
	int rc;

	if (x->done >= x->nfrags)
		return FR_EAGAIN;
	rc = fr_msg_get(comm, req, rank, &m, payload);
	if (rc)
		return rc;
	*off = (size_t)x->done * maxp;
	*len = FR_MIN(maxp, x->len - *off);
	if (m->type == FR_MSG_DATA && m->aux != x->aux)
		return fr_comm_fail(
			comm, FR_EMISMATCH,
			"rank %d: collective #%u (%s): rank %d sends a block of another size than the %zu bytes this rank expects from it (the counts differ between the ranks)",
			comm->rank, req->seq, fr_coll_name(req->coll), rank,
			x->len);
	if (m->type != FR_MSG_DATA || m->step != step || m->offset != *off ||
	    m->len != *len)
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: collective #%u: rank %d sent step %u offset %llu (%u bytes), expected step %u offset %zu (%zu bytes)",
			comm->rank, req->seq, rank, m->step,
			(unsigned long long)m->offset, m->len, step, *off,
			*len);
	return 0;
}

void fr_xfer_recv_done(struct fr_comm *comm, struct fr_xfer *x, int rank)
{
	fr_msg_consume(comm, rank);
	x->done++;
}

int fr_xfer_take(struct fr_comm *comm, const struct fr_request *req,
		 struct fr_xfer *x, int rank, uint16_t step, uint8_t *dst,
		 const uint8_t *a, fr_reduce_fn kern, size_t es, uint32_t limit,
		 bool *did_work)
{
	while (x->done < FR_MIN(limit, x->nfrags)) {
		const uint8_t *p;
		size_t off, len;
		int rc = fr_xfer_recv(comm, req, x, rank, step, &off, &len, &p);

		if (rc == FR_EAGAIN)
			return 0;
		if (rc)
			return rc;
		if (len && kern)
			kern(dst + off, a + off, p, len / es);
		else if (len)
			memcpy(dst + off, p, len);
		fr_xfer_recv_done(comm, x, rank);
		*did_work = true;
	}
	return 0;
}

/* ---- a step over scattered blocks (struct fr_bx, algo.h) ---- */

static const uint8_t nothing[1]; /* the address of empty blocks */

void fr_bx_init(struct fr_bx *x, const struct fr_comm *comm, size_t stride,
		size_t lo, size_t len, int nb)
{
	size_t maxp = fr_msg_payload_max(comm);

	x->stride = stride;
	x->lo = lo;
	x->len = len;
	x->nb = (uint32_t)nb;
	/* blocks of a payload or less go whole, as many to a fragment as
	 * fit; larger ones in fragments of a payload */
	x->bpf = len && len <= maxp ? (uint32_t)(maxp / len) : 1;
	x->per = !len	       ? 0
		 : len <= maxp ? 1
			       : (uint32_t)((len + maxp - 1) / maxp);
	x->nfrags = !len	 ? 1
		    : x->bpf > 1 ? (x->nb + x->bpf - 1) / x->bpf
				 : x->per * x->nb;
	x->done = 0;
	x->packed = UINT32_MAX;
}

void fr_bx_release(struct fr_bx *x)
{
	free(x->bounce);
	x->bounce = NULL;
}

/* Fragment i: its first block *b (of *nblk whole ones, or part of one at
 * offset *o from the segment's start), *len bytes in all. */
static void bx_frag(const struct fr_comm *comm, const struct fr_bx *x,
		    uint32_t i, int *b, uint32_t *nblk, size_t *o, size_t *len)
{
	size_t maxp = fr_msg_payload_max(comm);

	*o = 0;
	*nblk = 1;
	if (!x->len) {
		*b = 0;
		*len = 0;
	} else if (x->bpf > 1) {
		*b = (int)(i * x->bpf);
		*nblk = FR_MIN(x->bpf, x->nb - (uint32_t)*b);
		*len = *nblk * x->len;
	} else {
		*b = (int)(i / x->per);
		*o = (size_t)(i % x->per) * maxp;
		*len = FR_MIN(maxp, x->len - *o);
	}
}

static uint64_t bx_off(const struct fr_bx *x, int b, size_t o)
{
	return (uint64_t)b * x->stride + x->lo + o;
}

int fr_bx_send(struct fr_comm *comm, const struct fr_request *req,
	       struct fr_bx *x, int rank, uint16_t step,
	       const uint8_t *const *src, bool *did_work)
{
	while (x->done < x->nfrags) {
		const uint8_t *from;
		uint32_t nblk;
		size_t o, len;
		int b, rc;

		bx_frag(comm, x, x->done, &b, &nblk, &o, &len);
		from = len ? src[b] + o : nothing;
		if (nblk > 1) {
			/* several small blocks in one message */
			if (!x->bounce)
				x->bounce = malloc(fr_msg_payload_max(comm));
			if (!x->bounce)
				return FR_ENOMEM;
			if (x->packed != x->done)
				for (uint32_t j = 0; j < nblk; j++)
					memcpy(x->bounce + j * x->len,
					       src[b + (int)j], x->len);
			x->packed = x->done;
			from = x->bounce;
		}
		rc = fr_xfer_send_frag(comm, req, rank, step, bx_off(x, b, o),
				       from, len, &x->done, did_work);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
	}
	return 0;
}

int fr_bx_take(struct fr_comm *comm, const struct fr_request *req,
	       struct fr_bx *x, int rank, uint16_t step, uint8_t *const *dst,
	       const uint8_t *const *a, fr_reduce_fn kern, size_t es,
	       bool *did_work)
{
	while (x->done < x->nfrags) {
		const struct fr_msg *msg;
		const uint8_t *p;
		uint32_t nblk;
		size_t o, len, piece;
		uint64_t off;
		int b, rc = fr_msg_get(comm, req, rank, &msg, &p);

		if (rc == FR_EAGAIN)
			return 0;
		if (rc)
			return rc;
		bx_frag(comm, x, x->done, &b, &nblk, &o, &len);
		off = bx_off(x, b, o);
		if (msg->type != FR_MSG_DATA || msg->step != step ||
		    msg->offset != off || msg->len != len)
			return fr_comm_fail(
				comm, FR_EPROTO,
				"rank %d: collective #%u: rank %d sent step %u offset %llu (%u bytes), expected step %u offset %llu (%zu bytes)",
				comm->rank, req->seq, rank, msg->step,
				(unsigned long long)msg->offset, msg->len, step,
				(unsigned long long)off, len);
		piece = nblk > 1 ? x->len : len;
		for (uint32_t j = 0; j < nblk && len; j++) {
			int bj = b + (int)j;

			if (kern)
				kern(dst[bj] + o, a[bj] + o, p + j * piece,
				     piece / es);
			else
				memcpy(dst[bj] + o, p + j * piece, piece);
		}
		fr_msg_consume(comm, rank);
		x->done++;
		*did_work = true;
	}
	return 0;
}
