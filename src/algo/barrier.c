/* SPDX-License-Identifier: MIT */
/*
 * barrier.c - the dissemination barrier.
 *
 * Schedule (n ranks): rounds k = 0 .. ceil(lg n) - 1; in round k rank r
 * sends an empty message to (r + 2^k) mod n and waits for the one from
 * (r - 2^k) mod n.  After round k, r has heard (through chains of messages)
 * from the 2^(k+1) - 1 ranks before it, so after ceil(lg n) rounds from
 * everybody: nobody leaves before all have arrived.  Unlike recursive
 * doubling it needs no fold for n not a power of two.
 */
#include <stdlib.h>

#include "internal.h"
#include "algo.h"
#include "peer.h"

struct dis_state {
	int k, rounds;
	struct fr_xfer tx, rx;
};

static int to(const struct fr_comm *c, int k)
{
	return (c->rank + (1 << k)) % c->nranks;
}

static int from(const struct fr_comm *c, int k)
{
	return ((c->rank - (1 << k)) % c->nranks + c->nranks) % c->nranks;
}

static int dis_start(struct fr_comm *comm, struct fr_request *req)
{
	struct dis_state *st = fr_algo_state_new(req, sizeof(*st));

	if (!st)
		return FR_ENOMEM;
	while ((1 << st->rounds) < comm->nranks)
		st->rounds++;
	for (int k = 0; k < st->rounds; k++) {
		fr_peer_need(comm, to(comm, k));
		fr_peer_need(comm, from(comm, k));
	}
	fr_xfer_init(&st->tx, comm, 0);
	fr_xfer_init(&st->rx, comm, 0);
	return comm->fail.failed;
}

static int dis_advance(struct fr_comm *comm, struct fr_request *req,
		       bool *did_work)
{
	struct dis_state *st = req->algo_state;
	int rc;

	while (st->k < st->rounds) {
		rc = fr_peer_need(comm, to(comm, st->k));
		if (!rc)
			rc = fr_peer_need(comm, from(comm, st->k));
		if (rc)
			return rc == FR_EAGAIN ? 0 : rc;
		rc = fr_xfer_send(comm, req, &st->tx, to(comm, st->k),
				  (uint16_t)st->k, NULL, 0, did_work);
		if (!rc)
			rc = fr_xfer_take(comm, req, &st->rx, from(comm, st->k),
					  (uint16_t)st->k, NULL, NULL, NULL, 1,
					  UINT32_MAX, did_work);
		if (rc || !fr_xfer_complete(&st->tx) ||
		    !fr_xfer_complete(&st->rx))
			return rc;
		st->k++;
		fr_xfer_init(&st->tx, comm, 0);
		fr_xfer_init(&st->rx, comm, 0);
	}
	return 0;
}

static bool dis_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct dis_state *st = req->algo_state;

	(void)comm;
	return st && st->k >= st->rounds;
}

static int dis_waiting_on(const struct fr_comm *comm,
			  const struct fr_request *req)
{
	const struct dis_state *st = req->algo_state;

	if (!st || st->k >= st->rounds)
		return (comm->rank + 1) % comm->nranks;
	/* Once from's message is in, only our send to `to` is left (it may
	 * wait for a connection): `to` needs it, from may well have left. */
	return fr_xfer_complete(&st->rx) ? to(comm, st->k) : from(comm, st->k);
}

const struct fr_algo fr_algo_dissemination = {
	.id = FR_ALGO_DISSEMINATION,
	.name = "dissemination",
	.start = dis_start,
	.advance = dis_advance,
	.done = dis_done,
	.free = fr_algo_free_state,
	.waiting_on = dis_waiting_on,
};
