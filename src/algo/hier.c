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
 * reference).  Data moves as mailbox fragments (xfer.c); a step starts
 * when the one before has finished both ways.
 *
 * Lanes (pipelining the levels): with two levels or more, a vector of
 * 8 FR_SEGMENT_BYTES or more is cut, as above, into P = bytes / (8
 * segment_bytes) lanes, at most HIER_LANES, and each lane runs the whole
 * schedule above on its own range, R_0 being the lane.  The lanes go
 * through the levels one behind the other, so while lane c crosses the
 * slow top level, lane c+1 is in the node's reduce-scatter and lane c-1 in
 * its all-gather: the levels below cost about 1/P of their time instead
 * of adding up (without lanes the top level's link idles during them).
 * Two lanes never talk to the same peers at once: each level runs its
 * stages in one order that every member keeps, so the messages from a
 * peer arrive in the order they are taken:
 *   levels below the top: RS lane 0, RS lane 1, ..., RS lane P-1, then
 *     AG lane 0, ..., AG lane P-1;
 *   the top level: RS lane 0, AG lane 0, RS lane 1, AG lane 1, ...
 * A lane waits for its level's turn; lanes cannot deadlock, as stage k of
 * a level waits only on stages before it, and each lane's earlier phases,
 * which by induction all finish (the levels' peers are distinct ranks).
 * With lanes the cuts differ from the unpipelined ones, so the bits may
 * too, but they are again the same on every rank and in every run.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

#define HIER_LEVELS (1 + FR_TOPO_MAX_DIMS)
/* Lanes at most: the step numbers of (lane, phase) stay within 16 bits
 * (1 + (lane * 2 HIER_LEVELS + phase) * 1024 + step). */
#define HIER_LANES 4
/* A lane holds at least this many ring segments (FR_SEGMENT_BYTES). */
#define HIER_LANE_SEGMENTS 8

int fr_hier_lanes(const struct fr_comm *comm, size_t bytes, int levels)
{
	size_t seg = comm->algo.segment_bytes;
	size_t lanes = seg ? bytes / (HIER_LANE_SEGMENTS * seg) : 1;

	return levels < 2 ? 1 : (int)FR_MAX(FR_MIN(lanes, HIER_LANES), 1);
}

struct hier_level {
	int g, i, next, prev;
};

/*
 * One lane.  Phases: RS of level 0 .. nl-1, then AG of level nl-1 .. 0;
 * phase p is the RS of level p for p < nl, the AG of level 2 nl - 1 - p
 * after; 2 nl: done.
 */
struct hier_lane {
	int phase, s;
	bool inited;
	size_t lo[HIER_LEVELS], len[HIER_LEVELS]; /* R_l */
	size_t tlo, tlen, rlo, rlen; /* this step: elements out and in */
	struct fr_xfer tx, rx;
};

struct hier {
	int nl, nlanes;
	const uint8_t *mine;
	uint8_t *out;
	size_t es;
	fr_reduce_fn kern;
	struct hier_level lv[HIER_LEVELS];
	int stage[HIER_LEVELS]; /* the stages of each level done */
	struct hier_lane ln[HIER_LANES];
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

static bool is_rs(const struct hier *st, const struct hier_lane *ln)
{
	return ln->phase < st->nl;
}

/* The level of a lane's current phase. */
static int level(const struct hier *st, const struct hier_lane *ln)
{
	return is_rs(st, ln) ? ln->phase : 2 * st->nl - 1 - ln->phase;
}

/* Is it the turn of lane c's current phase on its level (the order in
 * the comment at the top)? */
static bool my_turn(const struct hier *st, const struct hier_lane *ln)
{
	int l = level(st, ln), c = (int)(ln - st->ln), k;

	if (l == st->nl - 1)
		k = 2 * c + !is_rs(st, ln);
	else
		k = is_rs(st, ln) ? c : st->nlanes + c;
	return st->stage[l] == k;
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
	/* the lanes (one level has nothing to overlap) and their ranges */
	st->nlanes = fr_hier_lanes(comm, n * st->es, st->nl);
	for (int c = 0; c < st->nlanes; c++) {
		struct hier_lane *ln = &st->ln[c];

		cut(n, st->nlanes, c, &ln->lo[0], &ln->len[0]);
		for (int l = 1; l < st->nl; l++) {
			const struct hier_level *b = &st->lv[l - 1];

			cut(ln->len[l - 1], b->g, (b->i + 1) % b->g, &ln->lo[l],
			    &ln->len[l]);
			ln->lo[l] += ln->lo[l - 1];
		}
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

static void step_init(struct fr_comm *comm, struct hier *st,
		      struct hier_lane *ln)
{
	int l = level(st, ln), s = ln->s, ct, cr;
	const struct hier_level *lv = &st->lv[l];

	ct = is_rs(st, ln) ? mod(lv->i - s, lv->g) : mod(lv->i + 1 - s, lv->g);
	cr = is_rs(st, ln) ? mod(lv->i - s - 1, lv->g) : mod(lv->i - s, lv->g);
	cut(ln->len[l], lv->g, ct, &ln->tlo, &ln->tlen);
	cut(ln->len[l], lv->g, cr, &ln->rlo, &ln->rlen);
	ln->tlo += ln->lo[l];
	ln->rlo += ln->lo[l];
	fr_xfer_init(&ln->tx, comm, ln->tlen * st->es);
	fr_xfer_init(&ln->rx, comm, ln->rlen * st->es);
	ln->inited = true;
}

/* The lane's phase is over: after the last RS, its part is reduced over
 * all ranks (FR_AVG divides it there, once); its level's next stage may
 * go. */
static void phase_end(struct fr_comm *comm, const struct fr_request *req,
		      struct hier *st, struct hier_lane *ln)
{
	if (ln->phase == st->nl - 1 && req->op == FR_AVG) {
		const struct hier_level *lv = &st->lv[st->nl - 1];
		size_t lo, len;

		cut(ln->len[st->nl - 1], lv->g, (lv->i + 1) % lv->g, &lo, &len);
		if (len)
			fr_reduce_scale_avg(
				req->dtype,
				st->out + (ln->lo[st->nl - 1] + lo) * st->es,
				len, comm->nranks);
	}
	st->stage[level(st, ln)]++;
	ln->s = 0;
	ln->phase++;
}

/* Run one lane while its turn lasts and its data flows; *moved when it
 * finished a phase (another lane's turn may have come). */
static int lane_advance(struct fr_comm *comm, struct fr_request *req,
			struct hier *st, struct hier_lane *ln, bool *moved,
			bool *did_work)
{
	int c = (int)(ln - st->ln);

	while (ln->phase < 2 * st->nl && my_turn(st, ln)) {
		const struct hier_level *lv = &st->lv[level(st, ln)];
		/* the first level's RS reads the input, the rest what we
		 * hold */
		const uint8_t *in = ln->phase == 0 ? st->mine : st->out;
		uint16_t step =
			(uint16_t)(1 +
				   (c * 2 * HIER_LEVELS + ln->phase) * 1024 +
				   ln->s);
		int rc;

		rc = fr_peer_need(comm, lv->next);
		if (!rc)
			rc = fr_peer_need(comm, lv->prev);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		if (!ln->inited)
			step_init(comm, st, ln);
		rc = fr_xfer_send(comm, req, &ln->tx, lv->next, step,
				  (ln->s == 0 ? in : st->out) +
					  ln->tlo * st->es,
				  ln->tx.len, did_work);
		if (rc)
			return rc;
		if (is_rs(st, ln))
			rc = fr_xfer_take(comm, req, &ln->rx, lv->prev, step,
					  st->out + ln->rlo * st->es,
					  in + ln->rlo * st->es, st->kern,
					  st->es, UINT32_MAX, did_work);
		else
			rc = fr_xfer_take(comm, req, &ln->rx, lv->prev, step,
					  st->out + ln->rlo * st->es, NULL,
					  NULL, st->es, UINT32_MAX, did_work);
		if (rc)
			return rc;
		if (!fr_xfer_complete(&ln->tx) || !fr_xfer_complete(&ln->rx))
			return 0;
		ln->inited = false;
		if (++ln->s < lv->g - 1)
			continue;
		phase_end(comm, req, st, ln);
		*moved = true;
	}
	return 0;
}

static int hier_advance(struct fr_comm *comm, struct fr_request *req,
			bool *did_work)
{
	struct hier *st = req->algo_state;
	bool moved;

	do {
		moved = false;
		for (int c = 0; c < st->nlanes; c++) {
			int rc = lane_advance(comm, req, st, &st->ln[c], &moved,
					      did_work);

			if (rc)
				return rc;
		}
	} while (moved);
	return 0;
}

static bool hier_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct hier *st = req->algo_state;

	(void)comm;
	if (!st)
		return false;
	for (int c = 0; c < st->nlanes; c++)
		if (st->ln[c].phase < 2 * st->nl)
			return false;
	return true;
}

/* The lane whose turn it is on its level (the first such) waits on its
 * level's previous member, or, its data in, on the next one taking what
 * it sent; a lane waiting for its turn waits on that one. */
static int hier_waiting_on(const struct fr_comm *comm,
			   const struct fr_request *req)
{
	const struct hier *st = req->algo_state;

	(void)comm;
	if (!st)
		return -1;
	for (int c = 0; c < st->nlanes; c++) {
		const struct hier_lane *ln = &st->ln[c];
		const struct hier_level *lv;

		if (ln->phase == 2 * st->nl || !my_turn(st, ln))
			continue;
		lv = &st->lv[level(st, ln)];
		return ln->inited && fr_xfer_complete(&ln->rx) ? lv->next
							       : lv->prev;
	}
	return -1;
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
