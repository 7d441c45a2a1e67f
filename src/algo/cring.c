/* SPDX-License-Identifier: MIT */
/*
 * cring.c - the compressed ring All-Reduce (f32 data, bf16/fp16/int8 on
 * the wire; see compress.h for the formats).
 *
 * Schedule (p ranks, rank r, next r+1, prev r-1, the vector cut into p
 * chunks on FR_INT8_BLOCK boundaries so that each chunk encodes on its
 * own):
 *   reduce-scatter, steps s = 0 .. p-2: encode chunk r-s (at s = 0 our
 *     input, later the partial sum we made at step s-1, plus the residual)
 *     a few fragments ahead of sending it to next; take chunk r-s-1 from prev,
 * decode it as its fragments arrive and add our input: a partial sum in f32.
 *   after the last step we hold chunk r+1 reduced over all ranks (in f32);
 *     FR_AVG divides it here, then we encode it once and replace our copy
 *     by the decoded encoding, the value every other rank will see.
 *   all-gather, steps s = 0 .. p-2: send the encoded chunk r+1-s to next
 *     (our final one, then what prev sent us the step before, forwarded
 *     byte for byte); take chunk r-s from prev and decode it.
 * Every final value is thus encoded once, by the rank that reduced it, and
 * every rank decodes the same bytes: all ranks end with identical bits.
 * Every element is encoded exactly once per rank per call (the chunks r,
 * r-1, ..., r-p+2 in the reduce-scatter, r+1 at the end), so one residual
 * per element gives error feedback on every narrowing the schedule makes.
 *
 * Wire bytes: 2 (p-1)/p of the compressed vector, like the ring's
 * 2 (p-1)/p of the f32 one; fragments go through the mailbox (xfer.c).
 * A step starts when the one before has finished both ways.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "compress.h"
#include "internal.h"
#include "peer.h"
#include "util.h"

#define DECODE_BATCH 4096

struct cring {
	int fmt, p, r, next, prev;
	size_t *elo;  /* chunk c: elements [elo[c], elo[c+1]) */
	size_t *boff; /* ... its encoding at enc + boff[c] */
	uint8_t *enc;
	float *tmp; /* decoded fragment values */
	const float *mine;
	float *out;
	fr_reduce_fn kern;
	int phase; /* 0 reduce-scatter, 1 all-gather, 2 done */
	int s;
	bool inited;
	int ct, cr;    /* chunks sent and taken in this step */
	size_t rx_dec; /* values of chunk cr decoded so far */
	size_t tx_enc; /* reduce-scatter: values of chunk ct encoded so far */
	struct fr_xfer tx, rx;
};

static int mod(int x, int p)
{
	return ((x % p) + p) % p;
}

static size_t chunk_n(const struct cring *st, int c)
{
	return st->elo[c + 1] - st->elo[c];
}

static void cring_free(struct fr_request *req)
{
	struct cring *st = req->algo_state;

	if (!st)
		return;
	free(st->tmp);
	free(st->enc);
	free(st->boff);
	free(st->elo);
	free(st);
	req->algo_state = NULL;
}

/* Encode values [first, first + k) of chunk c of src (first on a unit
 * boundary) with their residual into enc; out, when given, gets the
 * decoded values. */
static void encode_values(struct fr_comm *comm, struct fr_request *req,
			  struct cring *st, int c, size_t first, size_t k,
			  const float *src, float *out)
{
	size_t at = st->elo[c] + first;

	fr_codec_encode(st->fmt,
			st->enc + st->boff[c] +
				fr_compress_bytes(st->fmt, first),
			src + at, k, req->residual ? req->residual + at : NULL,
			out ? out + at : NULL);
	comm->stats.compress_in_bytes += k * sizeof(float);
	comm->stats.compress_out_bytes += fr_compress_bytes(st->fmt, k);
}

static int cring_start(struct fr_comm *comm, struct fr_request *req)
{
	struct cring *st = calloc(1, sizeof(*st));
	size_t n = req->count, units = (n + FR_INT8_BLOCK - 1) / FR_INT8_BLOCK;
	int p = comm->nranks;

	if (!st)
		return FR_ENOMEM;
	req->algo_state = st;
	st->fmt = req->compress;
	st->p = p;
	/* by position in the ring (comm->ring_order), as ring.c */
	st->r = comm->topo.ring_pos;
	st->next = comm->topo.ring_order[(comm->topo.ring_pos + 1) % p];
	st->prev = comm->topo.ring_order[(comm->topo.ring_pos + p - 1) % p];
	st->out = req->recvbuf;
	st->mine = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	st->kern = fr_reduce_kernel(FR_F32, req->op);
	if (p == 1) {
		/* nothing crosses a wire: nothing is narrowed */
		if (n && st->mine != st->out)
			memcpy(st->out, st->mine, n * sizeof(float));
		st->phase = 2;
		return 0;
	}
	st->elo = calloc((size_t)p + 1, sizeof(*st->elo));
	st->boff = calloc((size_t)p + 1, sizeof(*st->boff));
	st->tmp = malloc(DECODE_BATCH * sizeof(float));
	if (!st->elo || !st->boff || !st->tmp)
		return FR_ENOMEM;
	for (int c = 0; c <= p; c++) {
		st->elo[c] = FR_MIN(n, units * (size_t)c / (size_t)p *
					       FR_INT8_BLOCK);
		if (c)
			st->boff[c] =
				st->boff[c - 1] +
				fr_compress_bytes(st->fmt, chunk_n(st, c - 1));
	}
	st->enc = malloc(FR_MAX(st->boff[p], (size_t)1));
	if (!st->enc)
		return FR_ENOMEM;
	/* start both connections at once; advance waits for them */
	fr_peer_need(comm, st->next);
	fr_peer_need(comm, st->prev);
	return comm->fail.failed;
}

/* Set up step s of the phase: which chunks, their transfers. */
static void step_init(struct fr_comm *comm, struct fr_request *req,
		      struct cring *st)
{
	int r = st->r, p = st->p, s = st->s;

	if (st->phase == 0) {
		st->ct = mod(r - s, p);
		st->cr = mod(r - s - 1, p);
		st->tx_enc = 0; /* encoded as the fragments go: encode_ahead */
	} else {
		st->ct = mod(r + 1 - s, p);
		st->cr = mod(r - s, p);
	}
	fr_xfer_init(&st->tx, comm, st->boff[st->ct + 1] - st->boff[st->ct]);
	fr_xfer_init(&st->rx, comm, st->boff[st->cr + 1] - st->boff[st->cr]);
	st->rx_dec = 0;
	st->inited = true;
}

/*
 * Reduce-scatter: encode chunk ct (our input at step 0, then the partial
 * sums of the step before, each plus its residual) a few fragments ahead
 * of the sends, so that encoding overlaps the wire instead of stalling the
 * step's start.  Pieces are whole units (int8 blocks), which encode on
 * their own.  Returns the encoded bytes ready to send.
 */
static size_t encode_ahead(struct fr_comm *comm, struct fr_request *req,
			   struct cring *st)
{
	size_t n = chunk_n(st, st->ct);
	size_t want = fr_xfer_bytes(comm, &st->tx, st->tx.done + 8);
	const float *src = st->s ? st->out : st->mine;

	while (st->tx_enc < n &&
	       fr_compress_bytes(st->fmt, st->tx_enc) < want) {
		size_t k = FR_MIN(n - st->tx_enc, (size_t)DECODE_BATCH);

		encode_values(comm, req, st, st->ct, st->tx_enc, k, src, NULL);
		st->tx_enc += k;
	}
	return st->tx_enc == n ? st->tx.len
			       : fr_compress_bytes(st->fmt, st->tx_enc);
}

/* Decode the values of chunk cr that are complete now: reduce them into
 * our input (reduce-scatter) or store them (all-gather). */
static void take_values(const struct fr_comm *comm, struct cring *st)
{
	size_t n = chunk_n(st, st->cr), lo = st->elo[st->cr];
	size_t got = fr_xfer_bytes(comm, &st->rx, st->rx.done);
	size_t v = fr_codec_values_in(st->fmt, got, n);

	while (st->rx_dec < v) {
		size_t k = FR_MIN(v - st->rx_dec, (size_t)DECODE_BATCH);
		const uint8_t *src = st->enc + st->boff[st->cr] +
				     fr_compress_bytes(st->fmt, st->rx_dec);
		size_t at = lo + st->rx_dec;

		if (st->phase == 0) {
			fr_codec_decode(st->fmt, st->tmp, src, k);
			st->kern(st->out + at, st->mine + at, st->tmp, k);
		} else {
			fr_codec_decode(st->fmt, st->out + at, src, k);
		}
		st->rx_dec += k;
	}
}

static int cring_advance(struct fr_comm *comm, struct fr_request *req,
			 bool *did_work)
{
	struct cring *st = req->algo_state;

	while (st->phase < 2) {
		uint16_t step =
			(uint16_t)(st->phase == 0 ? 1 + st->s : st->p + st->s);
		int rc;

		rc = fr_peer_need(comm, st->next);
		if (!rc)
			rc = fr_peer_need(comm, st->prev);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		if (!st->inited)
			step_init(comm, req, st);
		rc = fr_xfer_send(comm, req, &st->tx, st->next, step,
				  st->enc + st->boff[st->ct],
				  st->phase == 0 ? encode_ahead(comm, req, st)
						 : st->tx.len,
				  did_work);
		if (rc)
			return rc;
		while (!fr_xfer_complete(&st->rx)) {
			const uint8_t *payload;
			size_t off, len;

			rc = fr_xfer_recv(comm, req, &st->rx, st->prev, step,
					  &off, &len, &payload);
			if (rc == FR_EAGAIN)
				break;
			if (rc)
				return rc;
			memcpy(st->enc + st->boff[st->cr] + off, payload, len);
			fr_xfer_recv_done(comm, &st->rx, st->prev);
			take_values(comm, st);
			*did_work = true;
		}
		if (!fr_xfer_complete(&st->tx) || !fr_xfer_complete(&st->rx))
			return 0;
		st->inited = false;
		if (++st->s < st->p - 1)
			continue;
		st->s = 0;
		if (st->phase == 0) {
			/* chunk cr = r+1 is reduced over all ranks: finish
			 * it, encode it once, keep what the others will see */
			int f = st->cr;
			size_t lo = st->elo[f];

			if (req->op == FR_AVG && chunk_n(st, f))
				fr_reduce_scale_avg(FR_F32, st->out + lo,
						    chunk_n(st, f), st->p);
			encode_values(comm, req, st, f, 0, chunk_n(st, f),
				      st->out, st->out);
		}
		st->phase++;
	}
	return 0;
}

static bool cring_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct cring *st = req->algo_state;

	(void)comm;
	return st && st->phase == 2;
}

static int cring_waiting_on(const struct fr_comm *comm,
			    const struct fr_request *req)
{
	const struct cring *st = req->algo_state;

	(void)comm;
	if (!st || st->phase == 2)
		return -1;
	return st->inited && fr_xfer_complete(&st->rx) ? st->next : st->prev;
}

const struct fr_algo fr_algo_cring = {
	.id = FR_ALGO_RING,
	.name = "ring (compressed)",
	.start = cring_start,
	.advance = cring_advance,
	.done = cring_done,
	.free = cring_free,
	.waiting_on = cring_waiting_on,
};
