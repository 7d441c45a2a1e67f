/* SPDX-License-Identifier: MIT */
/*
 * hier_rsag.c - the hierarchical reduce-scatter and all-gather, for jobs
 * whose m > 1 nodes each run the same number k > 1 of ranks: two levels
 * (the node, then all the nodes), or more where FR_TOPO puts the nodes on
 * a grid (racks of nodes, a torus): one level per dimension of it above
 * the node, as for the All-Reduce (hier.c).
 *
 * The flat ring crosses each node's network link with (p-1)/p of the n
 * blocks (p = m k ranks); here the ranks of a node first combine within
 * the node (shared memory or loopback), and every local rank then carries
 * its own share across the network, so the link carries (m-1)/m of the
 * data, spread over the node's k ranks.  With a grid, each level above
 * works on what the one below left: a rack's uplink carries (R-1)/R of
 * the 1/(k d0) of the data each of the rack's ranks holds (R racks of d0
 * nodes), where with two levels it carries (m-1)/m of it, and each
 * level's ring is only as long as its dimension.
 *
 * Names: the levels l = 0 .. L-1 (L >= 2) have g_l members: level 0 the
 * node's k ranks, then each dimension of size > 1 of FR_TOPO's grid where
 * it holds the nodes, else all m nodes as one level.  Every rank has a
 * coordinate on each: x_0 its local index (rank order on its node); x_l
 * its node's digit of that dimension (fr_topo_grid_parse), or, without a
 * grid, its node (numbered in the order of their lowest rank), so that
 * level 0's ring is always the node's ranks, however the launcher placed
 * them.  Level l's ring is the g_l ranks whose
 * coordinates are ours but x_l, in the order of x_l; ours are i_l.  Block
 * b is rank b's (count elements).  The blocks are ordered ("packed") by
 * their owners' coordinates, x_0 first: position
 *   P(b) = sum_l x_l(b) w_l,   w_l = g_{l+1} ... g_{L-1} (w_{L-1} = 1),
 * so that S_l, the blocks whose owners' x_0 .. x_{l-1} are ours, are the
 * w_{l-1} g_l ... positions from sum_{j<l} i_j w_j on, and "chunk c" of
 * level l (those of S_l with x_l = c) the w_l positions from there plus
 * c w_l: each a run of consecutive positions.
 *
 * Reduce-scatter (level l = 0 .. L-1 in turn, a ring over its members,
 * steps s = 0 .. g_l - 2):
 *   send chunk i_l-1-s (our input at s = 0 of level 0, else the partial
 *   sum made at step s-1 or by the level below), take chunk i_l-2-s from
 *   the previous member and reduce our partial of it into it (our input at
 *   level 0, else what the level below left us).  After level l we hold
 *   chunk i_l = S_{l+1} reduced over the ranks whose coordinates x_{l+1}
 *   .. are ours; after the last, our own block reduced over all ranks
 *   (the last step reduces straight into recvbuf, and FR_AVG divides it
 *   there, once).  Chunk c of a level is accumulated in the level's order
 *   c+1, c+2, ..., c from the partials below: every block is reduced in
 *   one fixed order (the reference in tests/mp_allreduce.c follows it),
 *   so the bits do not depend on timing.  Level 0's partial sums live in
 *   two packed chunks (w_0 blocks each, 2/k of the input) in the
 *   communicator's scratch buffer, alternately received into and sent
 *   from; the levels above work in place in the one that holds S_1.
 * All-gather, the mirror image (copies, no arithmetic), levels L-1 .. 0:
 *   at level l, send chunk i_l - s (at s = 0 the chunk we hold, S_{l+1}),
 *   receive chunk i_l-1-s and forward it the next step, all of it
 *   straight into recvbuf: after level 0 we hold all n blocks.
 *
 * Pipelining: every block is cut into the same segments (elements [j S,
 * (j+1) S) of each block, S about 1 MiB / w_0 bytes, at least a mailbox
 * payload), and the schedule above runs segment by segment in L lanes,
 * one a level: lane j runs its level's ring on segment q once lane j-1
 * has finished it, so while the network's level works on segment q the
 * node combines segment q+1 instead of the link waiting for the whole of
 * level 0.  Each lane talks to its own level's peers (distinct ranks:
 * they differ from us in another coordinate) in segment order, segments
 * touch disjoint elements, and each element still follows the order
 * above.
 *
 * A chunk's blocks are not contiguous in the user's buffers (block b sits
 * at b * count, and a chunk's owners are spread over the ranks).  Rather
 * than pack them into a staging buffer (a copy of every chunk sent, (k-1)/k
 * of the vector for the all-gather), a step's transfer goes block by block
 * (struct fr_bx, xfer.c): a large block in fragments read from and written
 * to its own address, at no extra copy; small ones whole, as many to a
 * message as fit (packed on the way out: a copy of small data, for far
 * fewer messages).  Fragment headers carry
 * the offset in the packed chunk, so the receiver checks every one
 * against its schedule (FR_EPROTO on a mismatch), as xfer.c does; in each
 * lane a step starts when the one before has finished both ways.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

#define RSAG_LEVELS (1 + FR_TOPO_MAX_DIMS)

/* The chunk-segment a lane aims for (all w_0 blocks of a segment). */
#define SEG_TARGET ((size_t)1 << 20)

/* One level's run over the segments. */
struct lane {
	int lv;		   /* its level */
	int seg, s;	   /* seg == nseg: done */
	bool inited;	   /* tx / rx set up for (seg, s) */
	int next, prev;	   /* its peers */
	struct fr_bx tx, rx;
	/* this step's block addresses (segment start): out, in, operand */
	const uint8_t **tsrc, **ra;
	uint8_t **rdst;
};

struct hrsag {
	bool rs;
	size_t es, blk; /* element size, block bytes */
	size_t segc;	/* elements per segment */
	int nseg, nl;
	fr_reduce_fn kern;
	const uint8_t *in; /* reduce-scatter: the n input blocks */
	uint8_t *out;	   /* RS: our block; AG: the n blocks */
	uint8_t *work[2];  /* RS: two packed chunks of w_0 blocks */
	int g[RSAG_LEVELS], i[RSAG_LEVELS]; /* g_l, i_l */
	int w[RSAG_LEVELS];		    /* w_l */
	int base[RSAG_LEVELS];		    /* S_l's first position */
	int *perm;			    /* perm[P(b)] = b */
	struct lane lane[RSAG_LEVELS];
};

static int mod(int x, int p)
{
	return ((x % p) + p) % p;
}

static void hrsag_free(struct fr_request *req)
{
	struct hrsag *st = req->algo_state;

	if (st) {
		free(st->perm);
		for (int i = 0; i < RSAG_LEVELS; i++) {
			fr_bx_release(&st->lane[i].tx);
			free(st->lane[i].tsrc);
			free(st->lane[i].ra);
			free(st->lane[i].rdst);
		}
	}
	free(st);
	req->algo_state = NULL;
}

/*
 * The levels (g_l), every rank's coordinates and so perm[] (the names at
 * the top), our place on each level (i_l), and the first position of each
 * S_l.  0, FR_ENOMEM, or FR_EINVAL where the layout is not k ranks on
 * every node.
 */
static int place(const struct fr_comm *comm, struct hrsag *st)
{
	const struct fr_topo *t = &comm->topo;
	int n = comm->nranks, k = t->nlocal, rc = FR_ENOMEM;
	int *seen = calloc((size_t)t->nnodes, sizeof(int));
	int dim[RSAG_LEVELS], stride[RSAG_LEVELS];

	st->perm = malloc((size_t)n * sizeof(int));
	if (!seen || !st->perm)
		goto out;
	st->g[st->nl++] = k;
	for (int d = 0, s = 1; t->nlevels && d < t->ngrid; d++) {
		if (t->grid[d] > 1) {
			dim[st->nl] = t->grid[d];
			stride[st->nl] = s;
			st->g[st->nl++] = t->grid[d];
		}
		s *= t->grid[d];
	}
	if (!t->nlevels)
		st->g[st->nl++] = t->nnodes;
	st->w[st->nl - 1] = 1;
	for (int l = st->nl - 2; l >= 0; l--)
		st->w[l] = st->w[l + 1] * st->g[l + 1];
	rc = FR_EINVAL;
	if ((long)st->w[0] * k != n)
		goto out;
	for (int p = 0; p < n; p++)
		st->perm[p] = -1;
	for (int r = 0; r < n; r++) {
		int nd = t->node_of[r], x[RSAG_LEVELS], pos = 0;

		if (nd < 0 || nd >= t->nnodes || seen[nd] >= k)
			goto out;
		x[0] = seen[nd]++;
		for (int l = 1; l < st->nl; l++)
			x[l] = t->nlevels ? nd / stride[l] % dim[l] : nd;
		for (int l = 0; l < st->nl; l++)
			pos += x[l] * st->w[l];
		if (pos >= n || st->perm[pos] >= 0)
			goto out;
		st->perm[pos] = r;
		if (r == comm->rank)
			memcpy(st->i, x, (size_t)st->nl * sizeof(int));
	}
	for (int l = 1; l < st->nl; l++)
		st->base[l] = st->base[l - 1] + st->i[l - 1] * st->w[l - 1];
	rc = 0;
out:
	free(seen);
	return rc;
}

/* The rank whose coordinates are ours but x_l = i_l + d (mod g_l). */
static int neighbour(const struct hrsag *st, int l, int d)
{
	int pos = st->base[l] + st->i[l] * st->w[l];

	for (int j = l + 1; j < st->nl; j++)
		pos += st->i[j] * st->w[j];
	return st->perm[pos +
			(mod(st->i[l] + d, st->g[l]) - st->i[l]) * st->w[l]];
}

static int lane_init(struct hrsag *st, struct lane *ln, int lv)
{
	size_t nb = (size_t)st->w[0];

	ln->lv = lv;
	ln->next = neighbour(st, lv, 1);
	ln->prev = neighbour(st, lv, -1);
	ln->tsrc = calloc(nb, sizeof(*ln->tsrc));
	ln->ra = calloc(nb, sizeof(*ln->ra));
	ln->rdst = calloc(nb, sizeof(*ln->rdst));
	return ln->tsrc && ln->ra && ln->rdst ? 0 : FR_ENOMEM;
}

static int hrsag_start(struct fr_comm *comm, struct fr_request *req)
{
	struct hrsag *st = calloc(1, sizeof(*st));
	size_t seg_bytes;
	int rc;

	if (!st)
		return FR_ENOMEM;
	req->algo_state = st;
	st->rs = req->coll == FR_COLL_REDUCE_SCATTER;
	if (!comm->topo.nodes_regular || !comm->topo.node_of ||
	    comm->topo.nlocal < 2 || comm->topo.ncross < 2)
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
	/* lane j: the reduce-scatter's level j, the all-gather's L-1-j */
	for (int j = 0; j < st->nl && !rc; j++)
		rc = lane_init(st, &st->lane[j], st->rs ? j : st->nl - 1 - j);
	if (rc)
		return rc;
	st->es = fr_dtype_size(req->dtype);
	st->blk = req->count * st->es;
	/* segments of about SEG_TARGET / w_0 bytes per block, at least a
	 * mailbox payload */
	seg_bytes =
		FR_MAX(SEG_TARGET / (size_t)st->w[0], fr_msg_payload_max(comm));
	st->segc = FR_MAX(seg_bytes / st->es, (size_t)1);
	st->nseg =
		req->count ? (int)((req->count + st->segc - 1) / st->segc) : 1;
	st->out = req->recvbuf;
	if (st->rs) {
		st->kern = fr_reduce_kernel(req->dtype, req->op);
		st->in = req->sendbuf;
		if (st->blk) {
			size_t chunk = (size_t)st->w[0] * st->blk;

			rc = fr_scratch_get(comm, 2 * chunk);
			if (rc)
				return rc;
			st->work[0] = comm->mem.scratch;
			st->work[1] = st->work[0] + chunk;
		}
	} else if (st->blk && req->sendbuf != FR_IN_PLACE) {
		memcpy(st->out + (size_t)comm->rank * st->blk, req->sendbuf,
		       st->blk);
	}
	return 0;
}

/* Block q of chunk c of level l in the user's n-block buffer base. */
static uint8_t *user_blk(const struct hrsag *st, const uint8_t *base, int l,
			 int c, int q)
{
	int pos = st->base[l] + c * st->w[l] + q;

	return (uint8_t *)base + (size_t)st->perm[pos] * st->blk;
}

/* Block q of chunk c of level l >= 1 in the packed S_1 (RS). */
static uint8_t *work_blk(const struct hrsag *st, int l, int c, int q)
{
	uint8_t *s1 = st->work[(st->g[0] - 1) % 2]; /* level 0 left it */
	int pos = st->base[l] - st->base[1] + c * st->w[l] + q;

	return s1 + (size_t)pos * st->blk;
}

static void step_init(struct fr_comm *comm, struct hrsag *st, struct lane *ln)
{
	int s = ln->s, l = ln->lv, g = st->g[l], i = st->i[l], nb = st->w[l];
	size_t lo = (size_t)ln->seg * st->segc * st->es;
	size_t len = st->blk ? FR_MIN(st->segc * st->es, st->blk - lo) : 0;
	bool last = l == st->nl - 1 && s == g - 2;

	fr_bx_init(&ln->tx, comm, st->blk, lo, len, nb);
	fr_bx_init(&ln->rx, comm, st->blk, lo, len, nb);
	if (!len)
		return; /* no addresses: empty messages */
	for (int q = 0; q < nb; q++) {
		int ct = st->rs ? mod(i - 1 - s, g) : mod(i - s, g);
		int cr = st->rs ? mod(i - 2 - s, g) : mod(i - 1 - s, g);

		if (!st->rs) {
			ln->tsrc[q] = user_blk(st, st->out, l, ct, q);
			ln->rdst[q] = user_blk(st, st->out, l, cr, q);
			ln->ra[q] = NULL;
		} else if (l == 0) {
			/* from the input into the packed chunks */
			ln->tsrc[q] = s ? st->work[s % 2] + (size_t)q * st->blk
					: user_blk(st, st->in, 0, ct, q);
			ln->rdst[q] =
				st->work[(s + 1) % 2] + (size_t)q * st->blk;
			ln->ra[q] = user_blk(st, st->in, 0, cr, q);
		} else {
			/* in place in S_1, the last step into recvbuf */
			ln->tsrc[q] = work_blk(st, l, ct, q);
			ln->ra[q] = work_blk(st, l, cr, q);
			ln->rdst[q] = last ? st->out : work_blk(st, l, cr, q);
		}
		/* the segment's start in every block */
		ln->tsrc[q] += lo;
		ln->rdst[q] += lo;
		if (ln->ra[q])
			ln->ra[q] += lo;
	}
}

/* Run lane ln as far as it goes, up to segment `upto` (exclusive). */
static int lane_run(struct fr_comm *comm, struct fr_request *req,
		    struct hrsag *st, struct lane *ln, int upto, bool *did_work)
{
	int j = (int)(ln - st->lane);

	while (ln->seg < upto) {
		uint16_t step =
			(uint16_t)(1 + ((st->rs ? 0 : RSAG_LEVELS) + j) * 1024 +
				   ln->s);
		int rc = fr_peer_need(comm, ln->next);

		if (!rc)
			rc = fr_peer_need(comm, ln->prev);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		if (!ln->inited) {
			step_init(comm, st, ln);
			ln->inited = true;
		}
		rc = fr_bx_send(comm, req, &ln->tx, ln->next, step, ln->tsrc,
				did_work);
		if (!rc)
			rc = fr_bx_take(comm, req, &ln->rx, ln->prev, step,
					ln->rdst, ln->ra,
					st->rs ? st->kern : NULL, st->es,
					did_work);
		if (rc)
			return rc;
		if (!fr_bx_complete(&ln->tx) || !fr_bx_complete(&ln->rx))
			return 0;
		ln->inited = false;
		if (++ln->s < st->g[ln->lv] - 1)
			continue;
		/* the segment is through this level */
		if (st->rs && ln->lv == st->nl - 1 && req->op == FR_AVG &&
		    ln->rx.len)
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
	struct lane *last = &st->lane[st->nl - 1];

	for (;;) {
		bool moved = false;

		for (int j = 0; j < st->nl; j++) {
			struct lane *ln = &st->lane[j];
			int seg = ln->seg;
			int rc = lane_run(comm, req, st, ln,
					  j ? st->lane[j - 1].seg : st->nseg,
					  did_work);

			if (rc)
				return rc;
			moved |= ln->seg != seg;
		}
		/* again while a lane's progress unblocked the next */
		if (last->seg == st->nseg || !moved)
			return 0;
	}
}

static bool hrsag_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct hrsag *st = req->algo_state;

	(void)comm;
	return st && st->nl && st->lane[st->nl - 1].seg == st->nseg;
}

/* The last lane not waiting for the one before it waits on its previous
 * member, or, its data in, on the next one taking what it sent. */
static int hrsag_waiting_on(const struct fr_comm *comm,
			    const struct fr_request *req)
{
	const struct hrsag *st = req->algo_state;
	const struct lane *ln;
	int j;

	(void)comm;
	if (!st || !st->nl || st->lane[st->nl - 1].seg == st->nseg)
		return -1;
	for (j = st->nl - 1; j > 0; j--)
		if (st->lane[j].seg < st->lane[j - 1].seg)
			break;
	ln = &st->lane[j];
	return ln->inited && fr_bx_complete(&ln->rx) ? ln->next : ln->prev;
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
