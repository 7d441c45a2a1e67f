/* SPDX-License-Identifier: MIT */
/*
 * hier_rsag.c - the two-level (hierarchical) reduce-scatter and all-gather,
 * for jobs whose m > 1 nodes each run the same number k > 1 of ranks.
 *
 * The flat ring crosses each node's network link with (p-1)/p of the n
 * blocks (p = m k ranks); here the ranks of a node first combine within
 * the node (shared memory or loopback), and every local rank then carries
 * its own share across the network, so the link carries (m-1)/m of the
 * data, spread over the node's k ranks.
 *
 * Names: block b is rank b's (count elements); rank b has local index
 * lidx(b) on its node (rank order within the node) and G_l is the list of
 * the m ranks with local index l, one per node, in rank order (comm->cross
 * is G_li; every rank derives all of them from comm->node_of).  Chunk l is
 * the m blocks of G_l, in G_l's order: what local rank l must end with.
 * Our rank has local index li (of k, peers comm->local) and index gi in
 * G_li (of m, peers comm->cross).
 *
 * Reduce-scatter:
 *   1. intra-node reduce-scatter of the k chunks, ring over comm->local,
 *      steps s = 0 .. k-2: send chunk li-1-s (our own input at s = 0, then
 *      the partial sum made at step s-1) to the next local rank, take chunk
 *      li-2-s from the previous one and reduce our input into it.  We end
 *      with chunk li (the blocks of G_li) reduced over our node, chunk c
 *      having been accumulated in local order c+1, c+2, ..., c.
 *   2. inter-node reduce-scatter of chunk li's m blocks, ring over
 *      comm->cross, steps s = 0 .. m-2: block gi-1-s out, block gi-2-s in,
 *      reduced into our node's partial; the last step (block gi, our own)
 *      reduces straight into recvbuf, and FR_AVG divides it there, once.
 *      Block G[j] is accumulated in node order j+1, j+2, ..., j.
 *   Each block is reduced by one rank in one fixed order (the reference in
 *   tests/mp_allreduce.c follows it), so the bits do not depend on timing.
 *   The partial sums of step 1 live in two packed chunks (m blocks each,
 *   2/k of the input) in the communicator's scratch buffer, alternately
 *   received into and sent from; step 2 works in place in the one that
 *   holds chunk li.
 *
 * All-gather, the mirror image (copies, no arithmetic):
 *   1. inter-node all-gather over comm->cross, steps s = 0 .. m-2: send
 *      block G_li[gi-s] (ours at s = 0), receive G_li[gi-1-s], straight
 *      into recvbuf: we end with chunk li;
 *   2. intra-node all-gather of the chunks over comm->local, steps s = 0 ..
 *      k-2: send chunk li-s, receive chunk li-1-s and forward it next step.
 *
 * Pipelining: every block is cut into the same segments (elements [j S,
 * (j+1) S) of each block, S about 1 MiB / m bytes, at least a mailbox
 * payload), and the schedule above runs segment by segment in two lanes:
 * the first phase (RS step 1, AG step 1) of segment j+1 runs while the
 * second phase of segment j does, each lane on its own peers' connections
 * (within the node, across nodes) and in segment order on each, so the
 * network link works while the node combines the next segment instead of
 * waiting for the whole first phase.  Segments touch disjoint elements,
 * and each element still follows the order above.
 *
 * A chunk's blocks are not contiguous in the user's buffers (block b sits
 * at b * count, and G_l's ranks are spread over the vector).  Rather than
 * pack them into a staging buffer (a copy of every chunk sent, (k-1)/k of
 * the vector for the all-gather), a step's transfer is cut into fragments
 * that never span a block (struct bx below): fragment i of a chunk is read
 * from and written to its block's own address, at no extra copy.  The
 * price is at least one message per block and step (m per intra-node step
 * instead of one when blocks are small: a few more headers, sent back to
 * back without waiting).  Fragment headers carry the offset in the packed
 * chunk, so the receiver checks every one against its schedule (FR_EPROTO on a
 * mismatch), as xfer.c does; in each lane a step starts when the one
 * before has finished both ways.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

enum { RS_INTRA, RS_INTER, AG_INTER, AG_INTRA };

/* The chunk-segment a lane aims for (all m blocks of a segment). */
#define SEG_TARGET ((size_t)1 << 20)

/* A step's data: nb blocks' bytes [lo, lo + len) at scattered addresses,
 * as fragments of at most a mailbox payload that never span a block (an
 * empty step is one empty message).  Headers carry the offset in the
 * packed chunk of whole blocks (stride bytes each). */
struct bx {
	size_t stride, lo, len;
	uint32_t per;	       /* fragments per block */
	uint32_t nfrags, done; /* fragments in all / sent or received */
};

/* One phase's run over the segments. */
struct lane {
	int phase, seg, s; /* seg == nseg: done */
	bool inited;	   /* tx / rx set up for (seg, s) */
	int next, prev;	   /* its peers */
	int steps;	   /* per segment */
	struct bx tx, rx;
	/* this step's block addresses (segment start): out, in, operand */
	const uint8_t **tsrc, **ra;
	uint8_t **rdst;
};

struct hrsag {
	size_t es, blk; /* element size, block bytes */
	size_t segc;	/* elements per segment */
	int nseg;
	fr_reduce_fn kern;
	const uint8_t *in; /* reduce-scatter: the n input blocks */
	uint8_t *out;	   /* RS: our block; AG: the n blocks */
	uint8_t *work[2];  /* RS: two packed chunks of m blocks */
	int k, li, m, gi;
	int *members; /* members[l * m + g] = G_l[g] */
	struct lane lane[2];
};

static const uint8_t nothing[1]; /* the address of empty blocks */

static int mod(int x, int p)
{
	return ((x % p) + p) % p;
}

static void bx_init(struct bx *x, const struct fr_comm *comm, size_t stride,
		    size_t lo, size_t len, int nb)
{
	size_t maxp = fr_msg_payload_max(comm);

	x->stride = stride;
	x->lo = lo;
	x->len = len;
	x->per = len ? (uint32_t)((len + maxp - 1) / maxp) : 0;
	x->nfrags = len ? x->per * (uint32_t)nb : 1;
	x->done = 0;
}

/* Fragment i: block *b, offset *o from the segment's start, *len bytes. */
static void bx_frag(const struct fr_comm *comm, const struct bx *x, uint32_t i,
		    int *b, size_t *o, size_t *len)
{
	size_t maxp = fr_msg_payload_max(comm);

	if (!x->len) {
		*b = 0;
		*o = *len = 0;
		return;
	}
	*b = (int)(i / x->per);
	*o = (size_t)(i % x->per) * maxp;
	*len = FR_MIN(maxp, x->len - *o);
}

static uint64_t bx_off(const struct bx *x, int b, size_t o)
{
	return (uint64_t)b * x->stride + x->lo + o;
}

static int bx_send(struct fr_comm *comm, const struct fr_request *req,
		   struct bx *x, int rank, uint16_t step,
		   const uint8_t *const *src, bool *did_work)
{
	while (x->done < x->nfrags) {
		size_t o, len;
		int b, rc;

		bx_frag(comm, x, x->done, &b, &o, &len);
		rc = fr_xfer_send_frag(comm, req, rank, step, bx_off(x, b, o),
				       len ? src[b] + o : nothing, len,
				       &x->done, did_work);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
	}
	return 0;
}

/* dst[b] = a[b] OP fragment with kern, else a copy. */
static int bx_take(struct fr_comm *comm, const struct fr_request *req,
		   struct bx *x, int rank, uint16_t step, uint8_t *const *dst,
		   const uint8_t *const *a, fr_reduce_fn kern, size_t es,
		   bool *did_work)
{
	while (x->done < x->nfrags) {
		const struct fr_msg *msg;
		const uint8_t *p;
		size_t o, len;
		uint64_t off;
		int b, rc = fr_msg_get(comm, req, rank, &msg, &p);

		if (rc == FR_EAGAIN)
			return 0;
		if (rc)
			return rc;
		bx_frag(comm, x, x->done, &b, &o, &len);
		off = bx_off(x, b, o);
		if (msg->type != FR_MSG_DATA || msg->step != step ||
		    msg->offset != off || msg->len != len)
			return fr_comm_fail(
				comm, FR_EPROTO,
				"rank %d: collective #%u: rank %d sent step %u offset %llu (%u bytes), expected step %u offset %llu (%zu bytes)",
				comm->rank, req->seq, rank, msg->step,
				(unsigned long long)msg->offset, msg->len, step,
				(unsigned long long)off, len);
		if (len && kern)
			kern(dst[b] + o, a[b] + o, p, len / es);
		else if (len)
			memcpy(dst[b] + o, p, len);
		fr_msg_consume(comm, rank);
		x->done++;
		*did_work = true;
	}
	return 0;
}

static void hrsag_free(struct fr_request *req)
{
	struct hrsag *st = req->algo_state;

	if (st) {
		free(st->members);
		for (int i = 0; i < 2; i++) {
			free(st->lane[i].tsrc);
			free(st->lane[i].ra);
			free(st->lane[i].rdst);
		}
	}
	free(st);
	req->algo_state = NULL;
}

/* members[l * m + g]: the g-th rank (rank order) with local index l. */
static int place(const struct fr_comm *comm, struct hrsag *st)
{
	int n = comm->nranks, *seen, *fill;

	st->members = malloc((size_t)n * sizeof(int));
	seen = calloc((size_t)n, sizeof(int));
	fill = calloc((size_t)st->k, sizeof(int));
	if (!st->members || !seen || !fill) {
		free(seen);
		free(fill);
		return FR_ENOMEM;
	}
	for (int r = 0; r < n; r++) {
		int l = seen[comm->topo.node_of[r]]++;

		if (l >= st->k || fill[l] >= st->m)
			break; /* not regular: caught below */
		st->members[l * st->m + fill[l]++] = r;
	}
	for (int l = 0; l < st->k; l++)
		if (fill[l] != st->m)
			st->m = -1;
	free(seen);
	free(fill);
	return st->m < 0 ? FR_EINVAL : 0;
}

static bool intra(int phase)
{
	return phase == RS_INTRA || phase == AG_INTRA;
}

static int lane_init(struct fr_comm *comm, struct hrsag *st, struct lane *ln,
		     int phase)
{
	ln->phase = phase;
	if (intra(phase)) {
		ln->next = comm->topo.local[(st->li + 1) % st->k];
		ln->prev = comm->topo.local[(st->li + st->k - 1) % st->k];
		ln->steps = st->k - 1;
	} else {
		ln->next = comm->topo.cross[(st->gi + 1) % st->m];
		ln->prev = comm->topo.cross[(st->gi + st->m - 1) % st->m];
		ln->steps = st->m - 1;
	}
	ln->tsrc = calloc((size_t)st->m, sizeof(*ln->tsrc));
	ln->ra = calloc((size_t)st->m, sizeof(*ln->ra));
	ln->rdst = calloc((size_t)st->m, sizeof(*ln->rdst));
	return ln->tsrc && ln->ra && ln->rdst ? 0 : FR_ENOMEM;
}

static int hrsag_start(struct fr_comm *comm, struct fr_request *req)
{
	struct hrsag *st = calloc(1, sizeof(*st));
	bool rs = req->coll == FR_COLL_REDUCE_SCATTER;
	size_t seg_bytes;
	int rc;

	if (!st)
		return FR_ENOMEM;
	req->algo_state = st;
	st->k = comm->topo.nlocal;
	st->m = comm->topo.ncross;
	if (!comm->topo.nodes_regular || !comm->topo.node_of || st->k < 2 ||
	    st->m < 2)
		return fr_comm_fail(
			comm, FR_EINVAL,
			"rank %d: hier %s: needs nodes that all run the same number (> 1) of ranks, more than one node",
			comm->rank, fr_coll_name(req->coll));
	rc = place(comm, st);
	if (rc == FR_EINVAL)
		return fr_comm_fail(comm, rc,
				    "rank %d: hier %s: irregular node layout",
				    comm->rank, fr_coll_name(req->coll));
	if (rc)
		return rc;
	st->li = comm->topo.local_index;
	st->gi = comm->topo.cross_index;
	rc = lane_init(comm, st, &st->lane[0], rs ? RS_INTRA : AG_INTER);
	if (!rc)
		rc = lane_init(comm, st, &st->lane[1],
			       rs ? RS_INTER : AG_INTRA);
	if (rc)
		return rc;
	st->es = fr_dtype_size(req->dtype);
	st->blk = req->count * st->es;
	/* segments of about SEG_TARGET / m bytes per block, at least a
	 * mailbox payload */
	seg_bytes =
		FR_MAX(SEG_TARGET / (size_t)st->m, fr_msg_payload_max(comm));
	st->segc = FR_MAX(seg_bytes / st->es, (size_t)1);
	st->nseg =
		req->count ? (int)((req->count + st->segc - 1) / st->segc) : 1;
	st->out = req->recvbuf;
	if (rs) {
		st->kern = fr_reduce_kernel(req->dtype, req->op);
		st->in = req->sendbuf;
		if (st->blk) {
			rc = fr_scratch_get(comm, 2 * (size_t)st->m * st->blk);
			if (rc)
				return rc;
			st->work[0] = comm->mem.scratch;
			st->work[1] = st->work[0] + (size_t)st->m * st->blk;
		}
	} else if (st->blk && req->sendbuf != FR_IN_PLACE) {
		memcpy(st->out + (size_t)comm->rank * st->blk, req->sendbuf,
		       st->blk);
	}
	return 0;
}

/* Block g of chunk l in the user's n-block buffer base. */
static uint8_t *chunk_blk(const struct hrsag *st, const uint8_t *base, int l,
			  int g)
{
	return (uint8_t *)base + (size_t)st->members[l * st->m + g] * st->blk;
}

static void step_init(struct fr_comm *comm, struct hrsag *st, struct lane *ln)
{
	int s = ln->s, m = st->m, nb = intra(ln->phase) ? m : 1;
	size_t lo = (size_t)ln->seg * st->segc * st->es;
	size_t len = st->blk ? FR_MIN(st->segc * st->es, st->blk - lo) : 0;
	uint8_t *w = st->work[(st->k - 1) % 2]; /* chunk li after RS_INTRA */
	int ct, cr;

	bx_init(&ln->tx, comm, st->blk, lo, len, nb);
	bx_init(&ln->rx, comm, st->blk, lo, len, nb);
	if (!len)
		return; /* no addresses: empty messages */
	switch (ln->phase) {
	case RS_INTRA:
		ct = mod(st->li - 1 - s, st->k);
		cr = mod(st->li - 2 - s, st->k);
		for (int g = 0; g < m; g++) {
			ln->tsrc[g] = s ? st->work[s % 2] + (size_t)g * st->blk
					: chunk_blk(st, st->in, ct, g);
			ln->rdst[g] =
				st->work[(s + 1) % 2] + (size_t)g * st->blk;
			ln->ra[g] = chunk_blk(st, st->in, cr, g);
		}
		break;
	case RS_INTER:
		ct = mod(st->gi - 1 - s, m);
		cr = mod(st->gi - 2 - s, m);
		ln->tsrc[0] = w + (size_t)ct * st->blk;
		ln->ra[0] = w + (size_t)cr * st->blk;
		ln->rdst[0] = s == m - 2 ? st->out : w + (size_t)cr * st->blk;
		break;
	case AG_INTER:
		ln->tsrc[0] =
			chunk_blk(st, st->out, st->li, mod(st->gi - s, m));
		ln->rdst[0] =
			chunk_blk(st, st->out, st->li, mod(st->gi - 1 - s, m));
		break;
	case AG_INTRA:
		ct = mod(st->li - s, st->k);
		cr = mod(st->li - 1 - s, st->k);
		for (int g = 0; g < m; g++) {
			ln->tsrc[g] = chunk_blk(st, st->out, ct, g);
			ln->rdst[g] = chunk_blk(st, st->out, cr, g);
		}
		break;
	}
	/* the segment's start in every block */
	for (int g = 0; g < nb; g++) {
		ln->tsrc[g] += lo;
		ln->rdst[g] += lo;
		if (ln->ra[g])
			ln->ra[g] += lo;
	}
}

/* Run lane ln as far as it goes, up to segment `upto` (exclusive). */
static int lane_run(struct fr_comm *comm, struct fr_request *req,
		    struct hrsag *st, struct lane *ln, int upto, bool *did_work)
{
	while (ln->seg < upto) {
		uint16_t step = (uint16_t)(1 + ln->phase * 1024 + ln->s);
		bool reduce = ln->phase == RS_INTRA || ln->phase == RS_INTER;
		int rc = fr_peer_need(comm, ln->next);

		if (!rc)
			rc = fr_peer_need(comm, ln->prev);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		if (!ln->inited) {
			step_init(comm, st, ln);
			ln->inited = true;
		}
		rc = bx_send(comm, req, &ln->tx, ln->next, step, ln->tsrc,
			     did_work);
		if (!rc)
			rc = bx_take(comm, req, &ln->rx, ln->prev, step,
				     ln->rdst, ln->ra, reduce ? st->kern : NULL,
				     st->es, did_work);
		if (rc)
			return rc;
		if (ln->tx.done < ln->tx.nfrags || ln->rx.done < ln->rx.nfrags)
			return 0;
		ln->inited = false;
		if (++ln->s < ln->steps)
			continue;
		/* the segment is through this phase */
		if (ln->phase == RS_INTER && req->op == FR_AVG && ln->rx.len)
			fr_reduce_scale_avg(req->dtype, st->out + ln->rx.lo,
					    ln->rx.len / st->es, comm->nranks);
		ln->s = 0;
		ln->seg++;
	}
	return 0;
}

static int hrsag_advance(struct fr_comm *comm, struct fr_request *req,
			 bool *did_work)
{
	struct hrsag *st = req->algo_state;
	int rc;

	for (;;) {
		int seg0 = st->lane[0].seg, seg1 = st->lane[1].seg;

		rc = lane_run(comm, req, st, &st->lane[0], st->nseg, did_work);
		if (!rc)
			rc = lane_run(comm, req, st, &st->lane[1],
				      st->lane[0].seg, did_work);
		if (rc)
			return rc;
		/* again while the first lane's progress unblocked the second */
		if (st->lane[1].seg == st->nseg ||
		    (st->lane[0].seg == seg0 && st->lane[1].seg == seg1))
			return 0;
	}
}

static bool hrsag_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct hrsag *st = req->algo_state;

	(void)comm;
	return st && st->lane[1].seg == st->nseg;
}

static int hrsag_waiting_on(const struct fr_comm *comm,
			    const struct fr_request *req)
{
	const struct hrsag *st = req->algo_state;
	const struct lane *ln;

	(void)comm;
	if (!st || st->lane[1].seg == st->nseg)
		return -1;
	/* the second lane, unless it waits for the first */
	ln = &st->lane[st->lane[1].seg < st->lane[0].seg ? 1 : 0];
	return ln->inited && ln->rx.done >= ln->rx.nfrags ? ln->next : ln->prev;
}

const struct fr_algo fr_algo_hier_rsag = {
	.id = FR_ALGO_HIER,
	.name = "hier",
	.start = hrsag_start,
	.advance = hrsag_advance,
	.done = hrsag_done,
	.free = hrsag_free,
	.waiting_on = hrsag_waiting_on,
};
