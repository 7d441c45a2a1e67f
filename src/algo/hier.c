/* SPDX-License-Identifier: MIT */
/*
 * hier.c - the hierarchical All-Reduce, for jobs whose nodes each run the
 * same number k > 1 of ranks, m > 1 nodes: two levels (the node, then
 * all the nodes), or more where FR_TOPO puts the nodes on a grid (racks
 * of nodes, a torus): one level per dimension of it above the node.
 *
 * A flat ring crosses every node's network link with 2 (n-1)/n of the
 * vector, in and out.  Here each node first reduces among its own ranks
 * (fast: shared memory or loopback), and then every local rank carries a
 * different 1/k of the vector across the network, so the link carries
 * 2 (m-1)/m of the vector in all, split over k ranks that all work.  With
 * more levels each one above works on a smaller piece: a rack's uplink
 * carries 2 (R-1)/R of the 1/(k d0) the rack's ranks each hold (R racks,
 * d0 nodes a rack), not the whole of it as with two levels, and every
 * level's ring is only as long as its dimension.
 *
 * Levels: L0 = the node's k ranks (comm->topo.local, our index i0); above
 * it either L1 = the ranks with our local index on every node
 * (comm->topo.cross, of m), or one level per dimension of FR_TOPO's grid
 * of size > 1 (comm->topo.level[]: the ranks with our local index on the
 * nodes whose grid coordinates are ours but that one).  Level l has g_l
 * members, our index i_l in it, and a range of the vector R_l: R_0 is the
 * whole of it, R_{l+1} the part i_l + 1 of R_l cut in g_l parts.
 *
 * Schedule:
 *   RS of each level l = 0, 1, ..., L-1 in turn, a ring over its members,
 *      steps s = 0 .. g_l - 2: send part i_l - s of R_l (the rank's own
 *      input at s = 0 of the first level, else what it holds, the partial
 *      sum made at step s-1 or by the level below), take part i_l - s - 1
 *      from the previous member and reduce into it (the input at the first
 *      level, else what we hold).  We end with part i_l + 1 = R_{l+1},
 *      reduced over the level's members; after the last level it is
 *      reduced over all ranks (FR_AVG divides it here);
 *   AG of each level l = L-1, ..., 0, the mirror image (g_l - 1 steps,
 *      forwarding, no arithmetic).
 * Parts are cut as the ring cuts (the first len % parts get one element
 * more), so part c of R_l is accumulated in the level's order c, c+1, ...,
 * c-1 from the partials of the level below: every element is reduced
 * once, in one fixed order, and copied to all others, so all ranks end
 * with the same bits (tests/mp_allreduce.c holds an independent
 * reference).  With two levels this is the schedule this algorithm always
 * had.  Data moves as mailbox fragments (xfer.c); a step starts when the
 * one before has finished both ways.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

#define HIER_LEVELS (1 + FR_TOPO_MAX_DIMS)

struct hier_level {
	int g, i, next, prev;
	size_t lo, len; /* R_l */
};

/*
 * Phases: RS of level 0 .. nl-1, then AG of level nl-1 .. 0; phase p is
 * the RS of level p for p < nl, the AG of level 2 nl - 1 - p after; 2 nl:
 * done.
 */
struct hier {
	int nl, phase, s;
	bool inited;
	const uint8_t *mine;
	uint8_t *out;
	size_t es;
	fr_reduce_fn kern;
	struct hier_level lv[HIER_LEVELS];
	size_t tlo, tlen, rlo, rlen; /* this step: elements out and in */
	struct fr_xfer tx, rx;
};

static int mod(int x, int p)
{
	return ((x % p) + p) % p;
}

/* Part c of n elements cut in parts: [*lo, *lo + *len). */
static void cut(size_t n, int parts, int c, size_t *lo, size_t *len)
{
	size_t base = n / (size_t)parts, rem = n % (size_t)parts;
	size_t uc = (size_t)c;

	*lo = uc * base + FR_MIN(uc, rem);
	*len = base + (uc < rem);
}

static bool is_rs(const struct hier *st)
{
	return st->phase < st->nl;
}

/* The level of the current phase. */
static const struct hier_level *level(const struct hier *st)
{
	return &st->lv[is_rs(st) ? st->phase : 2 * st->nl - 1 - st->phase];
}

static void hier_free(struct fr_request *req)
{
	free(req->algo_state);
	req->algo_state = NULL;
}

static void level_set(struct hier_level *lv, const int *ranks, int g, int i)
{
	lv->g = g;
	lv->i = i;
	lv->next = ranks[(i + 1) % g];
	lv->prev = ranks[(i + g - 1) % g];
}

static int hier_start(struct fr_comm *comm, struct fr_request *req)
{
	struct hier *st = calloc(1, sizeof(*st));
	const struct fr_topo *t = &comm->topo;
	size_t n = req->count;

	if (!st)
		return FR_ENOMEM;
	req->algo_state = st;
	if (!t->nodes_regular || t->ncross < 1)
		return fr_comm_fail(
			comm, FR_EINVAL,
			"rank %d: hier: the nodes do not all run the same number of ranks",
			comm->rank);
	st->es = fr_dtype_size(req->dtype);
	st->out = req->recvbuf;
	st->mine = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	st->kern = fr_reduce_kernel(req->dtype, req->op);
	/* the levels with more than one member, from the node up */
	if (t->nlocal > 1)
		level_set(&st->lv[st->nl++], t->local, t->nlocal,
			  t->local_index);
	if (t->nlevels)
		for (int l = 0; l < t->nlevels; l++)
			level_set(&st->lv[st->nl++], t->level[l], t->nlevel[l],
				  t->level_index[l]);
	else if (t->ncross > 1)
		level_set(&st->lv[st->nl++], t->cross, t->ncross,
			  t->cross_index);
	/* their ranges: each the part the level below ends with */
	st->lv[0].len = n;
	for (int l = 1; l < st->nl; l++) {
		const struct hier_level *b = &st->lv[l - 1];

		cut(b->len, b->g, (b->i + 1) % b->g, &st->lv[l].lo,
		    &st->lv[l].len);
		st->lv[l].lo += b->lo;
	}
	if (!st->nl) {
		/* one rank: the input is the result */
		if (n && st->mine != st->out)
			memcpy(st->out, st->mine, n * st->es);
		if (req->op == FR_AVG && n)
			fr_reduce_scale_avg(req->dtype, st->out, n,
					    comm->nranks);
	}
	return 0;
}

static void step_init(struct fr_comm *comm, struct hier *st)
{
	const struct hier_level *lv = level(st);
	int s = st->s, ct, cr;

	ct = is_rs(st) ? mod(lv->i - s, lv->g) : mod(lv->i + 1 - s, lv->g);
	cr = is_rs(st) ? mod(lv->i - s - 1, lv->g) : mod(lv->i - s, lv->g);
	cut(lv->len, lv->g, ct, &st->tlo, &st->tlen);
	cut(lv->len, lv->g, cr, &st->rlo, &st->rlen);
	st->tlo += lv->lo;
	st->rlo += lv->lo;
	fr_xfer_init(&st->tx, comm, st->tlen * st->es);
	fr_xfer_init(&st->rx, comm, st->rlen * st->es);
	st->inited = true;
}

/* The phase is over: after the last RS, our part is reduced over all
 * ranks (FR_AVG divides it there, once). */
static void phase_end(struct fr_comm *comm, const struct fr_request *req,
		      struct hier *st)
{
	if (st->phase == st->nl - 1 && req->op == FR_AVG) {
		const struct hier_level *lv = &st->lv[st->nl - 1];
		size_t lo, len;

		cut(lv->len, lv->g, (lv->i + 1) % lv->g, &lo, &len);
		if (len)
			fr_reduce_scale_avg(req->dtype,
					    st->out + (lv->lo + lo) * st->es,
					    len, comm->nranks);
	}
	st->s = 0;
	st->phase++;
}

static int hier_advance(struct fr_comm *comm, struct fr_request *req,
			bool *did_work)
{
	struct hier *st = req->algo_state;

	while (st->phase < 2 * st->nl) {
		const struct hier_level *lv = level(st);
		/* the first level's RS reads the input, the rest what we
		 * hold */
		const uint8_t *in = st->phase == 0 ? st->mine : st->out;
		uint16_t step = (uint16_t)(1 + st->phase * 1024 + st->s);
		int rc;

		rc = fr_peer_need(comm, lv->next);
		if (!rc)
			rc = fr_peer_need(comm, lv->prev);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		if (!st->inited)
			step_init(comm, st);
		rc = fr_xfer_send(comm, req, &st->tx, lv->next, step,
				  (st->s == 0 ? in : st->out) +
					  st->tlo * st->es,
				  st->tx.len, did_work);
		if (rc)
			return rc;
		if (is_rs(st))
			rc = fr_xfer_take(comm, req, &st->rx, lv->prev, step,
					  st->out + st->rlo * st->es,
					  in + st->rlo * st->es, st->kern,
					  st->es, UINT32_MAX, did_work);
		else
			rc = fr_xfer_take(comm, req, &st->rx, lv->prev, step,
					  st->out + st->rlo * st->es, NULL,
					  NULL, st->es, UINT32_MAX, did_work);
		if (rc)
			return rc;
		if (!fr_xfer_complete(&st->tx) || !fr_xfer_complete(&st->rx))
			return 0;
		st->inited = false;
		if (++st->s < lv->g - 1)
			continue;
		phase_end(comm, req, st);
	}
	return 0;
}

static bool hier_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct hier *st = req->algo_state;

	(void)comm;
	return st && st->phase == 2 * st->nl;
}

static int hier_waiting_on(const struct fr_comm *comm,
			   const struct fr_request *req)
{
	const struct hier *st = req->algo_state;
	const struct hier_level *lv;

	(void)comm;
	if (!st || st->phase == 2 * st->nl)
		return -1;
	lv = level(st);
	return st->inited && fr_xfer_complete(&st->rx) ? lv->next : lv->prev;
}

const struct fr_algo fr_algo_hier = {
	.id = FR_ALGO_HIER,
	.name = "hier",
	.start = hier_start,
	.advance = hier_advance,
	.done = hier_done,
	.free = hier_free,
	.waiting_on = hier_waiting_on,
};
