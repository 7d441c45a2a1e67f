/* SPDX-License-Identifier: MIT */
/*
 * split.c - sub-communicators: fr_comm_split and fr_comm_dup.
 *
 * A new communicator shares its parent's endpoint and connections
 * (transports/share): it is a view of them with an id of its own, equal on
 * all its ranks, which its writes carry, and above the view it is a whole
 * communicator (its own mailbox, requests, sequence numbers, failure,
 * lock and progress), so that nothing above the transport knows it shares.
 *
 * The split:
 *   1. one small collective on the parent, an all-gather of every rank's
 *      (color, key, the ids in use on its endpoint): every rank computes
 *      every group, ordered by (key, parent rank), and its id, the lowest
 *      that no member uses;
 *   2. each member makes its communicator: a view of the endpoint with that
 *      id, its mailbox registered;
 *   3. the members hand each other their mailbox's key, by point-to-point
 *      messages on the parent (a reserved tag), only inside each group: a
 *      round of small messages, no second collective.
 * Connections come up lazily, as in any communicator.
 *
 * Layer: entry points.  Calls coll.c (fr_allreduce), comm.c (the layout of
 * the nodes), the engine (lock.c, request.c, p2p.c: the parent's
 * point-to-point, the progress thread), the peers (mailbox), the memory
 * layer (keys) and the transport's shared endpoint.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "log.h"

/* one member's mailbox key, as it travels: length byte, key, padding */
#define KEY_MSG 64

/* What each rank says in the all-gather (little-endian on the wire). */
struct split_card {
	uint8_t color[4], key[4];
	uint8_t used[FR_SHARE_IDS / 8];
};

struct member {
	int key, prank;
};

static int member_cmp(const void *a, const void *b)
{
	const struct member *x = a, *y = b;

	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return x->prank < y->prank ? -1 : x->prank > y->prank;
}

/* A new communicator's own state, from its parent's settings. */
static struct fr_comm *comm_like(const struct fr_comm *p, int rank, int n)
{
	struct fr_comm *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->rank = rank;
	c->nranks = n;
	c->job_rank = fr_share_member(p->tp, p->rank);
	c->job_nonce = p->job_nonce;
	c->peer.timeout_ms = p->peer.timeout_ms;
	c->peer.slow_timeout_ms = p->peer.slow_timeout_ms;
	c->peer.mbx_slots = p->peer.mbx_slots;
	c->peer.out_slots = p->peer.out_slots;
	c->peer.mbx_slot_size = p->peer.mbx_slot_size;
	c->peer.ll = p->peer.ll;
	c->algo.forced = p->algo.forced;
	c->algo.tune = p->algo.tune;
	c->algo.segment_bytes = p->algo.segment_bytes;
	c->algo.slots = p->algo.slots;
	c->mem.regcache_max = p->mem.regcache_max;
	c->eng.spin_us = p->eng.spin_us;
	c->topo.ring_by_rank = p->topo.ring_by_rank;
	c->topo.node_id = p->topo.node_id;
	c->topo.rtt_us = p->topo.rtt_us;
	c->fail.fail_origin = -1;
	c->stats.size = sizeof(c->stats);
	c->thr.progress_mode = p->thr.progress_mode;
	c->thr.pt_cpu_mode = p->thr.pt_cpu_mode;
	c->thr.pt_cpus = p->thr.pt_cpus;
	return c;
}

/* The group's layout of nodes, from the parent's. */
static int topo_from(struct fr_comm *c, const struct fr_comm *p,
		     const struct member *m)
{
	uint64_t *ids = calloc((size_t)c->nranks, sizeof(*ids));
	uint16_t *cpus = calloc((size_t)c->nranks, sizeof(*cpus));
	int rc = FR_ENOMEM;

	if (!ids || !cpus)
		goto out;
	for (int i = 0; i < c->nranks; i++)
		ids[i] = (uint64_t)p->topo.node_of[m[i].prank];
	rc = fr_comm_nodes_take(c, ids, cpus);
	/* the busiest node is the parent's: its CPUs are shared with it */
	c->topo.oversub = p->topo.oversub;
out:
	free(cpus);
	free(ids);
	return rc;
}

/* Step 3: hand our mailbox key to every other member, take theirs. */
static int keys_exchange(struct fr_comm *parent, struct fr_comm *c,
			 const struct member *m)
{
	int n = c->nranks, rc = 0, posted = 0;
	uint8_t mine[KEY_MSG] = {0}, *theirs;
	size_t kl = FR_TP_RKEY_MAX;
	fr_request_t **rq;

	rc = fr_peers_pack_card_key(c, mine + 1, &kl);
	if (rc)
		return rc;
	mine[0] = (uint8_t)kl;
	theirs = calloc((size_t)n, KEY_MSG);
	rq = calloc(2 * (size_t)n, sizeof(*rq));
	if (!theirs || !rq) {
		rc = FR_ENOMEM;
		goto out;
	}
	fr_lock(parent);
	for (int i = 0; i < n && !rc; i++) {
		if (i == c->rank)
			continue;
		rc = fr_p2p_submit(parent, false, theirs + (size_t)i * KEY_MSG,
				   KEY_MSG, FR_U8, m[i].prank, FR_P2P_TAG_SPLIT,
				   &rq[posted]);
		if (!rc)
			posted++;
		if (!rc) {
			rc = fr_p2p_submit(parent, true, mine, KEY_MSG, FR_U8,
					   m[i].prank, FR_P2P_TAG_SPLIT,
					   &rq[posted]);
			if (!rc)
				posted++;
		}
	}
	/* every request is waited for (and freed), failed or not */
	for (int k = 0; k < posted; k++) {
		int r = fr_req_wait_locked(rq[k]);

		if (r && !rc)
			rc = r;
	}
	fr_unlock(parent);
	for (int i = 0; i < n && !rc; i++) {
		const uint8_t *b = theirs + (size_t)i * KEY_MSG;

		if (i == c->rank)
			continue;
		if (b[0] > FR_TP_RKEY_MAX ||
		    fr_mem_unpack_key(c, b + 1, b[0],
				      &c->peer.peers[i].mbx_rkey))
			rc = FR_EPROTO;
	}
out:
	free(rq);
	free(theirs);
	return rc;
}

/* Steps 2 and 3 for this rank's group m[0..n-1] with id. */
static int comm_make(struct fr_comm *parent, const struct member *m, int n,
		     int id, fr_comm_t **out)
{
	struct fr_comm *c;
	int *eps = NULL, me = -1, rc;
	char err[FR_ERRMSG_MAX];

	for (int i = 0; i < n; i++)
		if (m[i].prank == parent->rank)
			me = i;
	c = comm_like(parent, me, n);
	eps = malloc((size_t)n * sizeof(int));
	if (!c || !eps) {
		rc = FR_ENOMEM;
		goto err_alloc;
	}
	for (int i = 0; i < n; i++)
		eps[i] = fr_share_member(parent->tp, m[i].prank);
	rc = fr_lock_init(c);
	if (rc)
		goto err_alloc;
	/* the endpoint changes hands under the parent's lock (fr_share_view) */
	fr_lock(parent);
	rc = fr_share_view(fr_share_of(parent->tp), eps, n, &c->tp_ops, &c->tp);
	fr_unlock(parent);
	if (rc)
		goto err_view;
	rc = fr_share_set_id(c->tp, id);
	if (rc)
		goto err_id;
	c->id = id;
	rc = fr_peers_init(c);
	if (rc)
		goto err_id;
	/* addresses are the endpoint's: the view connects by rank */
	c->peer.addrs = calloc((size_t)n, FR_TP_ADDR_MAX);
	c->peer.addrlens = calloc((size_t)n, 1);
	if (!c->peer.addrs || !c->peer.addrlens) {
		rc = FR_ENOMEM;
		goto err_cards;
	}
	/* the cost model is the parent's, tuned for the link already */
	rc = topo_from(c, parent, m);
	if (rc)
		goto err_cards;
	if (n > 1) {
		rc = keys_exchange(parent, c, m);
		if (rc)
			goto err_cards;
	}
	c->peer.last_activity_ms = fr_coarse_ms();
	if (c->thr.progress_mode == FR_PROGRESS_THREAD && n > 1) {
		rc = fr_progress_thread_start(c, err, sizeof(err));
		if (rc)
			goto err_cards;
	}
	free(eps);
	fr_info("rank %d: communicator %d of %d ranks split from %d (rank %d)",
		parent->rank, id, n, parent->nranks, me);
	*out = c;
	return 0;

err_cards:
	fr_comm_free_cards(c);
	fr_peers_fini(c);
err_id:
	fr_share_closing(c->tp, false);
	c->tp_ops->close(c->tp);
err_view:
	fr_lock_fini(c);
err_alloc:
	free(eps);
	free(c);
	return rc;
}

int fr_comm_split(fr_comm_t *comm, int color, int key, fr_comm_t **newcomm)
{
	struct split_card mine = {0}, *all = NULL;
	struct member *m = NULL;
	uint8_t used[FR_SHARE_IDS / 8];
	int n = 0, id = -1, rc;

	if (!comm)
		return FR_EINVAL;
	if (!newcomm || (color < 0 && color != FR_UNDEFINED)) {
		fr_lock(comm);
		rc = fr_refuse(
			comm, FR_EINVAL, "rank %d: fr_comm_split: %s",
			comm->rank,
			!newcomm
				? "NULL newcomm"
				: "color is negative (FR_UNDEFINED: no communicator)");
		fr_unlock(comm);
		return rc;
	}
	*newcomm = NULL;
	fr_share_ids_used(fr_share_of(comm->tp), mine.used);
	fr_put_le32(mine.color, (uint32_t)color);
	fr_put_le32(mine.key, (uint32_t)key);
	all = calloc((size_t)comm->nranks, sizeof(*all));
	m = calloc((size_t)comm->nranks, sizeof(*m));
	if (!all || !m) {
		rc = FR_ENOMEM;
		goto out;
	}
	/* 1. who goes where: an all-gather of the cards, as an All-Reduce
	 * (MAX) of a table where each rank fills its own row, zeros
	 * elsewhere: lg p steps where the all-gather's ring takes p - 1,
	 * and the table is small (40 bytes a rank).  It fails on every rank
	 * alike, so no rank goes on alone. */
	all[comm->rank] = mine;
	rc = fr_allreduce(comm, all, all, (size_t)comm->nranks * sizeof(*all),
			  FR_U8, FR_MAX);
	if (rc)
		goto out;
	if (color == FR_UNDEFINED)
		goto out;
	memset(used, 0, sizeof(used));
	for (int r = 0; r < comm->nranks; r++) {
		if ((int)fr_get_le32(all[r].color) != color)
			continue;
		m[n].key = (int)fr_get_le32(all[r].key);
		m[n++].prank = r;
		for (size_t b = 0; b < sizeof(used); b++)
			used[b] |= all[r].used[b];
	}
	qsort(m, (size_t)n, sizeof(*m), member_cmp);
	for (int i = 0; i < FR_SHARE_IDS && id < 0; i++)
		if (!(used[i / 8] & 1u << (i % 8)))
			id = i;
	if (id < 0) {
		/* every member sees the same ids, so every one says so */
		fr_lock(comm);
		rc = fr_comm_seterr(
			comm, FR_EBUSY,
			"rank %d: fr_comm_split: the group of color %d has no communicator id left (%d in use on a member)",
			comm->rank, color, FR_SHARE_IDS);
		fr_unlock(comm);
		goto out;
	}
	/* 2. and 3. */
	rc = comm_make(comm, m, n, id, newcomm);
	if (rc) {
		fr_lock(comm);
		fr_comm_seterr(
			comm, rc,
			"rank %d: fr_comm_split: making the communicator of color %d failed: %s",
			comm->rank, color, fr_strerror(rc));
		fr_unlock(comm);
	}
out:
	free(m);
	free(all);
	return rc;
}

int fr_comm_dup(fr_comm_t *comm, fr_comm_t **newcomm)
{
	if (!comm)
		return FR_EINVAL;
	return fr_comm_split(comm, 0, comm->rank, newcomm);
}
