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
 *
 * Zero-copy steps (struct fr_zx): a large step skips the mailbox.
 *   receiver: READY (step, the slot its writes will name, the length, the
 *     registration's id and offset, and its key the first time this peer
 *     needs it) once it is in the step and the destination is free;
 *   sender: once READY came, the step's bytes straight from its own
 *     registered buffer into the named one, in writes of FR_SEGMENT_BYTES
 *     (whole elements), each with immediate FR_IMM_ZX (slot << 14 | the
 *     write's number mod 2^14);
 *   receiver: counts the writes in order (fr_zx_on_cqe), so that a reduced
 *     step is reduced a segment at a time while the next one travels.
 * A reduced step lands in a staging area of at most FR_ZX_STAGE_MAX (16
 * MiB), which the communicator keeps registered: a longer step comes a
 * chunk at a time, the next chunk's READY once the last one is reduced
 * (its latency once per 16 MiB).  A gathered step lands in place, whole.
 * What it saves: the copy into and out of a mailbox slot on each side, a
 * message per fragment, and the mailbox's window (FR_MBX_SLOTS payloads a
 * round trip; on a job of 4,096 ranks a payload is about 1 KiB).  What it
 * costs: the READY's latency, once a step.  No byte is written before the
 * receiver said where (it is in the collective, the area is free), and the
 * READY carries the length so that ranks whose counts differ fail with
 * FR_EMISMATCH.  A slot is a receive of the running collective: a write
 * naming another one, or going past the length, fails it with FR_EPROTO.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "mem.h"
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

/* ---- zero-copy steps (struct fr_zx, algo.h) ---- */

#define ZX_SEG_BITS 14
#define ZX_SEG_MASK ((1u << ZX_SEG_BITS) - 1)
_Static_assert(FR_ZX_SLOTS <= 1u << (20 - ZX_SEG_BITS),
	       "a slot and a segment number fill an immediate's 20 bits");
/* READY: slot, registration id, offset, the step's length, the chunk's
 * start and length, has key, key length, key (little-endian) */
#define ZX_READY_LEN (40 + 2 + FR_TP_RKEY_MAX)

bool fr_zx_use(const struct fr_comm *comm, size_t len)
{
	return len >= fr_zx_min(fr_msg_payload_max(comm));
}

int fr_zx_stage(struct fr_comm *comm, size_t len)
{
	struct fr_zx_layer *zl = &comm->algo.zx;

	return fr_mem_buf_grow(
		comm, &zl->stage, &zl->stage_len, &zl->stage_mem, len,
		FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE);
}

void fr_zx_comm_free(struct fr_comm *comm)
{
	struct fr_zx_layer *zl = &comm->algo.zx;

	fr_mem_buf_free(&zl->stage, &zl->stage_len, &zl->stage_mem);
}

static int zx_slot_take(struct fr_comm *comm, struct fr_zx *z)
{
	struct fr_zx_layer *zl = &comm->algo.zx;

	for (int i = 0; i < FR_ZX_SLOTS; i++)
		if (!zl->rx[i]) {
			zl->rx[i] = z;
			return i;
		}
	return -1;
}

void fr_zx_reset(struct fr_zx *z)
{
	memset(z, 0, sizeof(*z));
	z->slot = -1;
}

void fr_zx_cancel(struct fr_comm *comm, struct fr_zx *z)
{
	if (z->slot >= 0 && z->slot < FR_ZX_SLOTS &&
	    comm->algo.zx.rx[z->slot] == z)
		comm->algo.zx.rx[z->slot] = NULL;
	z->slot = -1;
}

int fr_zx_recv(struct fr_comm *comm, const struct fr_request *req,
	       struct fr_zx *z, int peer, uint16_t step, struct fr_mem *mem,
	       size_t off, size_t len, size_t chunk, bool *did_work)
{
	uint8_t b[ZX_READY_LEN] = {0};
	size_t kl = FR_TP_RKEY_MAX;
	struct fr_msg m;
	int rc;

	if (z->posted || (z->len && z->arrived == z->len))
		return 0;
	z->peer = peer;
	z->step = step;
	z->len = len;
	chunk = FR_MIN(chunk, len - z->arrived);
	if (z->slot < 0)
		z->slot = zx_slot_take(comm, z);
	if (z->slot < 0)
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: collective #%u: more than %d zero-copy receives at once",
			comm->rank, req->seq, FR_ZX_SLOTS);
	fr_put_le32(b, (uint32_t)z->slot);
	fr_put_le32(b + 4, mem->id);
	fr_put_le64(b + 8, (uint64_t)off);
	fr_put_le64(b + 16, (uint64_t)len);
	fr_put_le64(b + 24, (uint64_t)z->arrived);
	fr_put_le64(b + 32, (uint64_t)chunk);
	rc = fr_peer_key_offer(comm, peer, mem, b + 42, &kl);
	if (rc == FR_ENOMEM)
		return fr_comm_fail(comm, rc,
				    "rank %d: no memory for rank %d's keys",
				    comm->rank, peer);
	if (rc < 0)
		return fr_comm_fail(comm, rc, "rank %d: packing a key: %s",
				    comm->rank, fr_strerror(rc));
	b[40] = (uint8_t)rc; /* 1: the key follows */
	b[41] = (uint8_t)kl;
	fr_msg_for(req, FR_MSG_READY, &m);
	m.step = step;
	rc = fr_msg_send(comm, peer, &m, b, sizeof(b));
	if (rc == FR_EAGAIN)
		return 0;
	if (rc)
		return fr_comm_fail(
			comm, rc,
			"rank %d: collective #%u: sending to rank %d: %s",
			comm->rank, req->seq, peer, fr_strerror(rc));
	if (b[40])
		fr_peer_key_sent(comm, peer, mem);
	z->chunk_start = z->arrived;
	z->chunk_end = z->arrived + chunk;
	z->posted = true;
	*did_work = true;
	return 0;
}

/* The receiver's READY for step, if it came: 1, 0 (not yet) or the error. */
static int zx_take_ready(struct fr_comm *comm, const struct fr_request *req,
			 struct fr_zx *z, int peer, uint16_t step, size_t len)
{
	const struct fr_msg *m;
	const uint8_t *b;
	const struct fr_tp_rkey *dest;
	uint64_t rlen, cstart, clen;
	int rc = fr_msg_get(comm, req, peer, &m, &b);

	if (rc == FR_EAGAIN)
		return 0;
	if (rc)
		return rc;
	if (m->type != FR_MSG_READY || m->step != step ||
	    m->len != ZX_READY_LEN)
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: collective #%u: rank %d sent a message of type %u for step %u where this rank waits for its READY for step %u",
			comm->rank, req->seq, peer, m->type, m->step, step);
	rlen = fr_get_le64(b + 16);
	if (rlen != len)
		return fr_comm_fail(
			comm, FR_EMISMATCH,
			"rank %d: collective #%u (%s): rank %d expects %llu bytes from this rank, which sends %zu (the counts differ between the ranks)",
			comm->rank, req->seq, fr_coll_name(req->coll), peer,
			(unsigned long long)rlen, len);
	cstart = fr_get_le64(b + 24);
	clen = fr_get_le64(b + 32);
	if (b[40] > 1 || b[41] > FR_TP_RKEY_MAX ||
	    fr_get_le32(b) >= FR_ZX_SLOTS || cstart != z->sent || !clen ||
	    clen > len - z->sent)
		goto bad;
	rc = fr_peer_key_learn(comm, peer, fr_get_le32(b + 4),
			       b[40] ? b + 42 : NULL, b[41], &dest);
	if (rc == FR_ENOMEM)
		return fr_comm_fail(comm, rc,
				    "rank %d: no memory for rank %d's keys",
				    comm->rank, peer);
	if (rc)
		goto bad;
	z->dest = *dest;
	z->dest_off = fr_get_le64(b + 8);
	z->id = fr_get_le32(b);
	z->chunk_start = (size_t)cstart;
	z->chunk_end = (size_t)(cstart + clen);
	z->have_dest = true;
	fr_msg_consume(comm, peer);
	return 1;
bad:
	return fr_comm_fail(
		comm, FR_EPROTO,
		"rank %d: collective #%u: rank %d sent a malformed READY (a range this rank does not send next, or a buffer whose key it never sent)",
		comm->rank, req->seq, peer);
}

int fr_zx_send(struct fr_comm *comm, const struct fr_request *req,
	       struct fr_zx *z, int peer, uint16_t step, struct fr_mem *mem,
	       size_t off, size_t len, bool *did_work)
{
	size_t es = fr_dtype_size(req->dtype);
	size_t seg = FR_MAX(comm->algo.segment_bytes / es, (size_t)1) * es;
	int rc;

	z->len = len;
	while (z->sent < len) {
		size_t n;

		if (!z->have_dest) {
			/* the next chunk's READY */
			rc = zx_take_ready(comm, req, z, peer, step, len);
			if (rc <= 0)
				return rc;
			*did_work = true;
		}
		n = FR_MIN(seg, z->chunk_end - z->sent);
		rc = fr_peer_write(
			comm, peer, mem, off + z->sent, &z->dest,
			z->dest_off + (z->sent - z->chunk_start), n,
			FR_IMM(FR_IMM_ZX, z->id << ZX_SEG_BITS |
						  (z->segs_sent & ZX_SEG_MASK)),
			true);
		if (rc == FR_EAGAIN)
			return 0;
		if (rc)
			return rc;
		z->sent += n;
		z->segs_sent++;
		z->wrote = true;
		if (z->sent == z->chunk_end)
			z->have_dest = false;
		*did_work = true;
	}
	return 0;
}

int fr_zx_on_cqe(struct fr_comm *comm, struct fr_request *active, int peer,
		 const struct fr_tp_cqe *cqe)
{
	uint32_t payload = FR_IMM_PAYLOAD(cqe->imm);
	uint32_t slot = payload >> ZX_SEG_BITS;
	struct fr_zx *z = slot < FR_ZX_SLOTS ? comm->algo.zx.rx[slot] : NULL;

	if (!active || !z || !z->posted || z->peer != peer ||
	    (payload & ZX_SEG_MASK) != (z->segs & ZX_SEG_MASK) ||
	    cqe->len > z->chunk_end - z->arrived || !cqe->len)
		return fr_comm_fail(
			comm, FR_EPROTO,
			"rank %d: unexpected zero-copy write (immediate 0x%08x, %u bytes) from rank %d",
			comm->rank, cqe->imm, cqe->len, peer);
	z->arrived += cqe->len;
	z->segs++;
	if (z->arrived == z->chunk_end) {
		/* the chunk is in: a write more names no receive */
		fr_zx_cancel(comm, z);
		z->posted = false;
	}
	return 0;
}
