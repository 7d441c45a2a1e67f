/* SPDX-License-Identifier: MIT */
/*
 * hier.c - the two-level (hierarchical) All-Reduce, for jobs whose nodes
 * each run the same number k > 1 of ranks, m > 1 nodes.
 *
 * A flat ring crosses every node's network link with 2 (n-1)/n of the
 * vector, in and out.  Here each node first reduces among its own ranks
 * (fast: shared memory or loopback), and then every local rank carries a
 * different 1/k of the vector across the network, so the link carries
 * 2 (m-1)/m of the vector in all, split over k ranks that all work:
 *
 * Schedule (rank with local index li of k on its node, index gi of m among
 * the ranks with the same local index on every node, comm->local/cross):
 *   1. intra-node reduce-scatter, ring over the node's ranks, steps
 *      s = 0 .. k-2: send chunk li-s (our input at s = 0, then the partial
 *      sum made at step s-1) to the next local rank, take chunk li-s-1 from
 *      the previous one and reduce our input into it.  We end with chunk
 *      f = li+1 reduced over our node.
 *   2. inter-node reduce-scatter of chunk f cut into m pieces, ring over
 *      the ranks with our local index, steps s = 0 .. m-2 (pieces gi-s out,
 *      gi-s-1 in, reduced into our node's partial); we end with piece gi+1
 *      reduced over all ranks (FR_AVG divides it here);
 *   3. inter-node all-gather of the pieces (m-1 steps, forwarding);
 *   4. intra-node all-gather of the chunks (k-1 steps).
 * Chunks and pieces are cut as the ring cuts (the first count % parts get
 * one element more), so chunk c is accumulated in local order c, c+1, ...
 * and piece j in node order j, j+1, ...: every element is reduced once,
 * by one rank, and copied to all others, so all ranks end with the same
 * bits (tests/mp_allreduce.c holds an independent reference).
 * Data moves as mailbox fragments (xfer.c); a step starts when the one
 * before has finished both ways.
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"
#include "reduce.h"
#include "util.h"

enum { INTRA_RS, INTER_RS, INTER_AG, INTRA_AG, DONE };

struct hier {
	int phase, s;
	bool inited;
	const uint8_t *mine;
	uint8_t *out;
	size_t es;
	fr_reduce_fn kern;
	int k, li, lnext, lprev;
	int m, gi, gnext, gprev;
	size_t flo, flen; /* chunk f: our node's piece of the vector */
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

static void hier_free(struct fr_request *req)
{
	free(req->algo_state);
	req->algo_state = NULL;
}

static int hier_start(struct fr_comm *comm, struct fr_request *req)
{
	struct hier *st = calloc(1, sizeof(*st));
	size_t n = req->count;

	if (!st)
		return FR_ENOMEM;
	req->algo_state = st;
	if (!comm->topo.nodes_regular || comm->topo.ncross < 1)
		return fr_comm_fail(
			comm, FR_EINVAL,
			"rank %d: hier: the nodes do not all run the same number of ranks",
			comm->rank);
	st->es = fr_dtype_size(req->dtype);
	st->out = req->recvbuf;
	st->mine = req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	st->kern = fr_reduce_kernel(req->dtype, req->op);
	st->k = comm->topo.nlocal;
	st->li = comm->topo.local_index;
	st->lnext = comm->topo.local[(st->li + 1) % st->k];
	st->lprev = comm->topo.local[(st->li + st->k - 1) % st->k];
	st->m = comm->topo.ncross;
	st->gi = comm->topo.cross_index;
	st->gnext = comm->topo.cross[(st->gi + 1) % st->m];
	st->gprev = comm->topo.cross[(st->gi + st->m - 1) % st->m];
	cut(n, st->k, (st->li + 1) % st->k, &st->flo, &st->flen);
	if (st->k == 1 && n && st->mine != st->out)
		memcpy(st->out, st->mine, n * st->es);
	st->phase = st->k > 1 ? INTRA_RS : st->m > 1 ? INTER_RS : DONE;
	if (st->phase == DONE && req->op == FR_AVG && n)
		fr_reduce_scale_avg(req->dtype, st->out, n, comm->nranks);
	return 0;
}

/* The peers of the current phase. */
static void peers(const struct hier *st, int *next, int *prev)
{
	bool intra = st->phase == INTRA_RS || st->phase == INTRA_AG;

	*next = intra ? st->lnext : st->gnext;
	*prev = intra ? st->lprev : st->gprev;
}

static void step_init(struct fr_comm *comm, const struct fr_request *req,
		      struct hier *st)
{
	int s = st->s, ct, cr;

	switch (st->phase) {
	case INTRA_RS:
		ct = mod(st->li - s, st->k);
		cr = mod(st->li - s - 1, st->k);
		cut(req->count, st->k, ct, &st->tlo, &st->tlen);
		cut(req->count, st->k, cr, &st->rlo, &st->rlen);
		break;
	case INTRA_AG:
		ct = mod(st->li + 1 - s, st->k);
		cr = mod(st->li - s, st->k);
		cut(req->count, st->k, ct, &st->tlo, &st->tlen);
		cut(req->count, st->k, cr, &st->rlo, &st->rlen);
		break;
	case INTER_RS:
	case INTER_AG:
		ct = st->phase == INTER_RS ? mod(st->gi - s, st->m)
					   : mod(st->gi + 1 - s, st->m);
		cr = st->phase == INTER_RS ? mod(st->gi - s - 1, st->m)
					   : mod(st->gi - s, st->m);
		cut(st->flen, st->m, ct, &st->tlo, &st->tlen);
		cut(st->flen, st->m, cr, &st->rlo, &st->rlen);
		st->tlo += st->flo;
		st->rlo += st->flo;
		break;
	}
	fr_xfer_init(&st->tx, comm, st->tlen * st->es);
	fr_xfer_init(&st->rx, comm, st->rlen * st->es);
	st->inited = true;
}

/* The phase is over: finish it and move to the next one that has steps. */
static void phase_end(struct fr_comm *comm, const struct fr_request *req,
		      struct hier *st)
{
	if (st->phase == INTER_RS || (st->phase == INTRA_RS && st->m == 1)) {
		/* our piece is reduced over all ranks */
		size_t lo, len;

		if (st->phase == INTER_RS) {
			cut(st->flen, st->m, mod(st->gi + 1, st->m), &lo, &len);
			lo += st->flo;
		} else {
			lo = st->flo;
			len = st->flen;
		}
		if (req->op == FR_AVG && len)
			fr_reduce_scale_avg(req->dtype, st->out + lo * st->es,
					    len, comm->nranks);
	}
	st->s = 0;
	do {
		st->phase++;
	} while (st->phase != DONE &&
		 ((st->phase == INTER_RS || st->phase == INTER_AG)
			  ? st->m == 1
			  : st->k == 1));
}

static int hier_advance(struct fr_comm *comm, struct fr_request *req,
			bool *did_work)
{
	struct hier *st = req->algo_state;

	while (st->phase != DONE) {
		bool intra = st->phase == INTRA_RS || st->phase == INTRA_AG;
		int steps = (intra ? st->k : st->m) - 1;
		uint16_t step = (uint16_t)(1 + st->phase * 1024 + st->s);
		const uint8_t *src;
		int next, prev, rc;

		peers(st, &next, &prev);
		rc = fr_peer_need(comm, next);
		if (!rc)
			rc = fr_peer_need(comm, prev);
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		if (!st->inited)
			step_init(comm, req, st);
		src = st->phase == INTRA_RS && st->s == 0 ? st->mine : st->out;
		rc = fr_xfer_send(comm, req, &st->tx, next, step,
				  src + st->tlo * st->es, st->tx.len, did_work);
		if (rc)
			return rc;
		if (st->phase == INTRA_RS || st->phase == INTER_RS)
			rc = fr_xfer_take(
				comm, req, &st->rx, prev, step,
				st->out + st->rlo * st->es,
				(st->phase == INTRA_RS ? st->mine : st->out) +
					st->rlo * st->es,
				st->kern, st->es, UINT32_MAX, did_work);
		else
			rc = fr_xfer_take(comm, req, &st->rx, prev, step,
					  st->out + st->rlo * st->es, NULL,
					  NULL, st->es, UINT32_MAX, did_work);
		if (rc)
			return rc;
		if (!fr_xfer_complete(&st->tx) || !fr_xfer_complete(&st->rx))
			return 0;
		st->inited = false;
		if (++st->s < steps)
			continue;
		phase_end(comm, req, st);
	}
	return 0;
}

static bool hier_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct hier *st = req->algo_state;

	(void)comm;
	return st && st->phase == DONE;
}

static int hier_waiting_on(const struct fr_comm *comm,
			   const struct fr_request *req)
{
	const struct hier *st = req->algo_state;
	int next, prev;

	(void)comm;
	if (!st || st->phase == DONE)
		return -1;
	peers(st, &next, &prev);
	return st->inited && fr_xfer_complete(&st->rx) ? next : prev;
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
