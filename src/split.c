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
 *   1. each rank that will have a communicator maps and registers its
 *      mailbox (peer.c) before it knows its group, sized for every rank of
 *      the parent: untouched pages cost nothing on TCP and shm (RDMA pins
 *      them all, the price of one round less);
 *   2. one small collective on the parent, an all-gather of every rank's
 *      card (color, key, the ids in use on its endpoint, its mailbox's
 *      key): every rank computes every group, ordered by (key, parent
 *      rank), its id, the lowest that no rank of the parent uses, and has
 *      the keys of its members' mailboxes;
 *   3. each member makes its communicator: a view of the endpoint with that
 *      id, around the mailbox of step 1.  No message more: the members need
 *      nothing more from each other.
 * Connections come up lazily, as in any communicator.
 *
 * Layer: entry points.  Calls coll.c (fr_allreduce), comm.c (the layout of
 * the nodes), the engine (lock.c, the progress thread), the peers
 * (mailbox), the memory layer (keys) and the transport's shared endpoint.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "log.h"

/*
 * The table of step 2, filled by an All-Reduce (MAX) of bytes:
 *   FR_SHARE_IDS bytes, one a communicator id: 1 where a rank of the
 *     parent uses it (the MAX of 0 and 1 is their OR);
 *   then a row a rank of the parent, its own filled, zeros elsewhere:
 *     0 u8 1: it has a mailbox, whose key follows; 0: FR_UNDEFINED, or
 *          it could not make one
 *     1 le32 color   5 le32 key   9 the mailbox's key, kl bytes
 * kl is the length of the keys of the parent's endpoint, which every rank
 * opened with the same transport; a rank whose kl differed would reduce
 * a table of another length, which the All-Reduce's mismatch check fails
 * on every rank.
 */
#define ROW_HAS 0
#define ROW_COLOR 1
#define ROW_KEY 5
#define ROW_MBX 9

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
	c->recipe = p->recipe;
	c->peer.timeout_ms = p->peer.timeout_ms;
	c->peer.slow_timeout_ms = p->peer.slow_timeout_ms;
	c->peer.mbx_slots = p->peer.mbx_slots;
	c->peer.out_slots = p->peer.out_slots;
	c->peer.mbx_slot_size = p->peer.mbx_slot_size;
	c->peer.ctrl_size = p->peer.ctrl_size;
	c->peer.ll = p->peer.ll;
	c->algo.forced = p->algo.forced;
	c->algo.tune = p->algo.tune;
	c->algo.segment_bytes = p->algo.segment_bytes;
	c->algo.slots = p->algo.slots;
	c->mem.regcache_max = p->mem.regcache_max;
	c->eng.spin_us = p->eng.spin_us;
	c->topo.ring_by_rank = p->topo.ring_by_rank;
	c->topo.ngrid = p->topo.ngrid;
	memcpy(c->topo.grid, p->topo.grid, sizeof(c->topo.grid));
	c->topo.node_id = p->topo.node_id;
	c->topo.rtt_us = p->topo.rtt_us;
	c->fail.fail_origin = -1;
	c->fail.dead_first = -1;
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
	/*
	 * The grid of nodes (FR_TOPO) places the parent's nodes by the
	 * parent's numbers; the group numbers them afresh, by its own lowest
	 * rank on each.  It keeps the grid only where the numbers agree:
	 * every node of the parent's in the group, first met in the same
	 * order.  Else its levels would put other machines in a rack.
	 */
	if (c->topo.ngrid &&
	    !fr_topo_same_nodes(ids, c->nranks, p->topo.nnodes))
		c->topo.ngrid = 0;
	rc = fr_comm_nodes_take(c, ids, cpus);
	/* the busiest node is the parent's: its CPUs are shared with it */
	c->topo.oversub = p->topo.oversub;
out:
	free(cpus);
	free(ids);
	return rc;
}

/*
 * Step 1: the new communicator's state and its mailbox, before the group
 * is known: sized for the parent's nranks, registered with the endpoint
 * the parent shares (the view the communicator gets in step 3 is of the
 * same endpoint, which deregisters it in the end).
 */
static int comm_early(struct fr_comm *parent, size_t kl, struct fr_comm **out,
		      uint8_t *row)
{
	struct fr_comm *c = comm_like(parent, 0, parent->nranks);
	size_t len = kl;
	int rc;

	if (!c)
		return FR_ENOMEM;
	fr_lock(parent);
	c->tp_ops = parent->tp_ops;
	c->tp = parent->tp;
	rc = fr_peers_mailbox(c, parent->nranks, false);
	if (!rc) {
		rc = fr_peers_pack_card_key(c, row + ROW_MBX, &len);
		/* cannot differ: one endpoint, one key length */
		if (!rc && len != kl)
			rc = FR_EPROTO;
		if (rc)
			fr_peers_fini(c);
	}
	c->tp_ops = NULL;
	c->tp = NULL;
	fr_unlock(parent);
	if (rc) {
		free(c);
		return rc;
	}
	row[ROW_HAS] = 1;
	*out = c;
	return 0;
}

/* Undo comm_early (the split failed before step 3).  keep: a peer may
 * have our key (the All-Reduce failed, but maybe not everywhere), so the
 * mailbox stays registered and mapped until the endpoint closes. */
static void comm_early_undo(struct fr_comm *parent, struct fr_comm *c,
			    bool keep)
{
	fr_lock(parent);
	c->tp_ops = parent->tp_ops;
	c->tp = parent->tp;
	if (keep) {
		fr_mem_keep(c->peer.out_mem, c->peer.out, c->peer.out_len,
			    fr_release_pages);
		fr_mem_keep(c->peer.mbx_mem, c->peer.mbx, c->peer.mbx_len,
			    fr_release_pages);
	} else {
		fr_peers_fini(c);
	}
	fr_unlock(parent);
	free(c);
}

/* Step 3 for this rank's group m[0..n-1] with id, around c (step 1); on
 * failure c is gone.  The other members have our mailbox's key from step 2
 * and may write into it already, so a failure here keeps it registered and
 * mapped until the endpoint closes (the view's quarantine), as a failed
 * communicator's destroy does. */
static int comm_make(struct fr_comm *parent, const struct member *m, int n,
		     int id, const uint8_t *rows, size_t rowlen, size_t kl,
		     struct fr_comm *c, fr_comm_t **out)
{
	int *eps = NULL, me = -1, rc = FR_ENOMEM;
	char err[FR_ERRMSG_MAX];

	for (int i = 0; i < n; i++)
		if (m[i].prank == parent->rank)
			me = i;
	c->rank = me;
	c->nranks = n; /* the mailbox keeps the parent's size */
	eps = malloc((size_t)n * sizeof(int));
	if (!eps)
		goto err_keep;
	for (int i = 0; i < n; i++)
		eps[i] = fr_share_member(parent->tp, m[i].prank);
	/* the endpoint changes hands under the parent's lock (fr_share_view) */
	fr_lock(parent);
	rc = fr_share_view(fr_share_of(parent->tp), eps, n, &c->tp_ops, &c->tp);
	fr_unlock(parent);
	if (rc)
		goto err_keep;
	rc = fr_share_set_id(c->tp, id);
	if (rc)
		goto err_view;
	c->id = id;
	rc = fr_lock_init(c);
	if (rc)
		goto err_view;
	/* addresses are the endpoint's: the view connects by rank */
	if (fr_peers_alloc(c)) {
		rc = FR_ENOMEM;
		goto err_lock;
	}
	for (int i = 0; i < n && !rc; i++) {
		const uint8_t *row = rows + (size_t)m[i].prank * rowlen;

		if (i != me && fr_mem_unpack_key(c, row + ROW_MBX, kl,
						 &c->peer.mbx_rkeys[i]))
			rc = FR_EPROTO;
	}
	if (rc)
		goto err_lock;
	/* the cost model is the parent's, tuned for the link already */
	rc = topo_from(c, parent, m);
	if (rc)
		goto err_lock;
	c->peer.last_activity_ms = fr_coarse_ms();
	if (c->thr.progress_mode == FR_PROGRESS_THREAD && n > 1) {
		rc = fr_progress_thread_start(c, err, sizeof(err));
		if (rc)
			goto err_lock;
	}
	free(eps);
	fr_info("rank %d: communicator %d of %d ranks split from %d (rank %d)",
		parent->rank, id, n, parent->nranks, me);
	*out = c;
	return 0;

err_lock:
	fr_comm_free_cards(c);
	fr_lock_fini(c);
err_view:
	fr_share_closing(c->tp, false); /* before the mailbox goes */
	fr_peers_fini(c);
	c->tp_ops->close(c->tp);
	free(eps);
	free(c);
	return rc;
err_keep:
	/* no view of our own yet: the parent's endpoint keeps them */
	free(eps);
	comm_early_undo(parent, c, true);
	return rc;
}

/* ---- for fr_comm_shrink (recover.c) ----------------------------------------
 */

int fr_split_early(struct fr_comm *parent, size_t kl, struct fr_comm **out,
		   uint8_t *key)
{
	uint8_t *row = calloc(1, ROW_MBX + kl);
	int rc;

	if (!row)
		return FR_ENOMEM;
	rc = comm_early(parent, kl, out, row);
	if (!rc)
		memcpy(key, row + ROW_MBX, kl);
	free(row);
	return rc;
}

void fr_split_early_undo(struct fr_comm *parent, struct fr_comm *c, bool keep)
{
	comm_early_undo(parent, c, keep);
}

int fr_split_make(struct fr_comm *parent, const int *members, int n, int id,
		  const uint8_t *const *keys, size_t kl, struct fr_comm *c,
		  fr_comm_t **out)
{
	size_t rowlen = ROW_MBX + kl;
	struct member *m = calloc((size_t)n, sizeof(*m));
	uint8_t *rows = calloc((size_t)parent->nranks, rowlen);
	int rc;

	if (!m || !rows) {
		free(rows);
		free(m);
		comm_early_undo(parent, c, true);
		return FR_ENOMEM;
	}
	for (int i = 0; i < n; i++) {
		m[i].key = i;
		m[i].prank = members[i];
		rows[(size_t)members[i] * rowlen + ROW_HAS] = 1;
		memcpy(rows + (size_t)members[i] * rowlen + ROW_MBX, keys[i],
		       kl);
	}
	rc = comm_make(parent, m, n, id, rows, rowlen, kl, c, out);
	free(rows);
	free(m);
	return rc;
}

int fr_comm_split(fr_comm_t *comm, int color, int key, fr_comm_t **newcomm)
{
	uint8_t blob[FR_TP_RKEY_MAX], used[FR_SHARE_IDS / 8], *table = NULL,
							      *rows, *row;
	size_t kl = sizeof(blob), rowlen;
	struct fr_comm *c = NULL;
	struct member *m = NULL;
	int n = 0, id = -1, nokey = -1, rc;
	bool decided = false;

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
	fr_lock(comm);
	rc = fr_peers_pack_card_key(comm, blob, &kl);
	fr_unlock(comm);
	if (rc)
		return rc;
	rowlen = ROW_MBX + kl;
	table = calloc(1, FR_SHARE_IDS + (size_t)comm->nranks * rowlen);
	m = calloc((size_t)comm->nranks, sizeof(*m));
	if (!table || !m) {
		rc = FR_ENOMEM;
		goto out;
	}
	rows = table + FR_SHARE_IDS;
	row = rows + (size_t)comm->rank * rowlen;
	fr_share_ids_used(fr_share_of(comm->tp), used);
	for (int i = 0; i < FR_SHARE_IDS; i++)
		table[i] = (used[i / 8] >> (i % 8)) & 1;
	fr_put_le32(row + ROW_COLOR, (uint32_t)color);
	fr_put_le32(row + ROW_KEY, (uint32_t)key);
	/* 1. our mailbox and its key (none without a communicator).  A
	 * failure here must not leave the others waiting in step 2: the row
	 * says "no mailbox", and every member then fails alike. */
	if (color != FR_UNDEFINED && comm_early(comm, kl, &c, row))
		c = NULL;
	/* 2. who goes where: an all-gather of the rows, as an All-Reduce
	 * (MAX) of the table: lg p steps where the all-gather's ring takes
	 * p - 1, and the table is small (9 bytes a rank and a key, 29 to 61
	 * in all).  It fails on every rank alike, so no rank goes on
	 * alone. */
	rc = fr_allreduce(comm, table, table,
			  FR_SHARE_IDS + (size_t)comm->nranks * rowlen, FR_U8,
			  FR_MAX);
	if (rc || color == FR_UNDEFINED)
		goto out;
	/* from here on every member fails alike or makes the communicator:
	 * a failure before comm_make leaves no one holding our key */
	decided = true;
	for (int r = 0; r < comm->nranks; r++) {
		const uint8_t *w = rows + (size_t)r * rowlen;

		if ((int)fr_get_le32(w + ROW_COLOR) != color)
			continue;
		if (!w[ROW_HAS])
			nokey = r;
		m[n].key = (int)fr_get_le32(w + ROW_KEY);
		m[n++].prank = r;
	}
	if (nokey >= 0) {
		/* a member could not make its mailbox: every member says so */
		fr_lock(comm);
		rc = fr_comm_seterr(
			comm, FR_ENOMEM,
			"rank %d: fr_comm_split: rank %d of the group of color %d could not make its mailbox",
			comm->rank, nokey, color);
		fr_unlock(comm);
		goto out;
	}
	qsort(m, (size_t)n, sizeof(*m), member_cmp);
	/* the lowest id that no rank of the parent uses (the table's union:
	 * all of them, not only the group's, which one byte an id per rank
	 * would cost) */
	for (int i = 0; i < FR_SHARE_IDS && id < 0; i++)
		if (!table[i])
			id = i;
	if (id < 0) {
		/* every member sees the same ids, so every one says so */
		fr_lock(comm);
		rc = fr_comm_seterr(
			comm, FR_EBUSY,
			"rank %d: fr_comm_split: no communicator id is left (%d in use on some rank)",
			comm->rank, FR_SHARE_IDS);
		fr_unlock(comm);
		goto out;
	}
	/* 3. */
	rc = comm_make(comm, m, n, id, rows, rowlen, kl, c, newcomm);
	c = NULL; /* comm_make's now, even when it fails */
	if (rc) {
		fr_lock(comm);
		fr_comm_seterr(
			comm, rc,
			"rank %d: fr_comm_split: making the communicator of color %d failed: %s",
			comm->rank, color, fr_strerror(rc));
		fr_unlock(comm);
	}
out:
	if (c)
		comm_early_undo(comm, c, rc != 0 && !decided);
	free(m);
	free(table);
	return rc;
}

int fr_comm_dup(fr_comm_t *comm, fr_comm_t **newcomm)
{
	if (!comm)
		return FR_EINVAL;
	return fr_comm_split(comm, 0, comm->rank, newcomm);
}
