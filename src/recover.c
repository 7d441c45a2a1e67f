/* SPDX-License-Identifier: MIT */
/*
 * recover.c - recovery's entry points: revoke a communicator, agree on a
 * value and on the failed ranks, name them (fastreduce(7), "Recovery").
 *
 * Layer: entry points.  Calls the engine (its rounds), the agreement
 * (agree.h) and the peers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agree.h"
#include "internal.h"
#include "log.h"
#include "peer.h"

/*
 * Revoke: the communicator fails with FR_EREVOKED here, and its ABORT goes
 * to every rank, connecting to those we never talked to
 * (fr_peers_tell_all); a rank that gets it fails at once, whatever
 * collective it is in (peer.c, on_abort), and relays it to the peers it
 * is connected to, so that the notice spreads even if this rank dies
 * while sending it.  Then one round of the engine finishes every pending
 * request of ours with the failure and wakes their waiters.
 */
int fr_comm_revoke(fr_comm_t *comm)
{
	bool did_work = false;

	if (!comm)
		return FR_EINVAL;
	fr_lock(comm);
	if (!comm->fail.revoked) {
		/* also when it had failed before: the others may wait on it
		 * in a call that the first failure's notice did not end (it
		 * is deferred to their next collective), so every rank gets
		 * a revoke notice of its own, once (peer.c, told()) */
		comm->fail.revoked = true;
		comm->fail.revoke_origin = comm->rank;
		if (!comm->fail.failed)
			fr_comm_fail(
				comm, FR_EREVOKED,
				"rank %d: this rank revoked the communicator",
				comm->rank);
		comm->fail.told_all = false;
		if (comm->nranks > 1)
			fr_peers_tell_all(comm);
	}
	(void)fr_progress_internal(comm, &did_work);
	fr_unlock(comm);
	return 0;
}

/*
 * Agree: fault-tolerant, so it runs on a failed or revoked communicator
 * too (agree.c says how); the same value and the same failed set on every
 * surviving rank.  A non-empty set fails the communicator, if it had not
 * failed yet: its collectives would wait on a dead rank.
 */
static int agree_locked(struct fr_comm *comm, uint32_t *flags)
{
	int ranks[8], n, rc;
	char list[64];
	size_t at = 0;

	rc = fr_agree_begin(comm, *flags);
	if (rc)
		return rc;
	/* a progress thread idle on a failed communicator wakes up */
	fr_signal(comm);
	fr_engine_agree_wait(comm);
	rc = fr_agree_end(comm, flags);
	if (rc && !comm->fail.failed) {
		n = fr_agree_failed(comm, ranks, 8);
		list[0] = '\0';
		for (int i = 0; i < FR_MIN(n, 8) && at < sizeof(list); i++)
			at += (size_t)snprintf(list + at, sizeof(list) - at,
					       "%s%d", i ? " " : "", ranks[i]);
		fr_comm_fail(
			comm, FR_EPEER,
			"rank %d: the agreement found %d rank%s failed: %s%s",
			comm->rank, n, n == 1 ? "" : "s", list,
			n > 8 ? " ..." : "");
	}
	return rc;
}

int fr_comm_agree(fr_comm_t *comm, uint32_t *flags)
{
	int rc;

	if (!comm || !flags)
		return FR_EINVAL;
	fr_lock(comm);
	rc = agree_locked(comm, flags);
	fr_unlock(comm);
	return rc;
}

int fr_comm_failed(fr_comm_t *comm, int *ranks, int max, int *nfailed)
{
	int n;

	if (!comm || !nfailed || max < 0 || (max > 0 && !ranks))
		return FR_EINVAL;
	fr_lock(comm);
	n = fr_agree_failed(comm, ranks, max);
	fr_unlock(comm);
	*nfailed = n;
	return 0;
}

/*
 * Shrink: a communicator of the survivors, made as fr_comm_split makes
 * one (a view of the same endpoint, so live connections are reused, with
 * a mailbox of its own), but with no collective of comm, which has failed:
 *   1. agree on who failed (the others are the members, in comm's order);
 *   2. each member maps its new mailbox and exchanges cards with the other
 *      members (agree.c, the exchange): the mailbox's key and the
 *      communicator ids its endpoint uses;
 *   3. agree that every member has every card and that nobody failed
 *      since 1; then each makes the communicator with the lowest id that
 *      no member uses.  Otherwise (a member died meanwhile) all start
 *      again, at most FR_SHRINK_TRIES times.
 */
#define FR_SHRINK_TRIES 8
#define CARD_HAS 0
#define CARD_IDS 1
#define CARD_KEY FR_SHRINK_CARD(0)

/* A rank set's copy (the agreement's sets change with the next one). */
static fr_rankset_t *set_dup(const fr_rankset_t *s, int nranks)
{
	size_t len = FR_RANKSET_WORDS(nranks) * sizeof(*s);
	fr_rankset_t *d = malloc(len);

	if (d)
		memcpy(d, s, len);
	return d;
}

/* Step 3's outcome: 1 made (or failed making), 0 start again. */
static int shrink_make(struct fr_comm *comm, const fr_rankset_t *dead,
		       size_t kl, struct fr_comm *c, fr_comm_t **newcomm,
		       int *rcp)
{
	const uint8_t **keys = calloc((size_t)comm->nranks, sizeof(*keys));
	int *members = calloc((size_t)comm->nranks, sizeof(*members));
	uint8_t used[FR_SHARE_IDS / 8] = {0};
	int n = 0, id = -1;

	if (!keys || !members) {
		*rcp = FR_ENOMEM;
		goto out;
	}
	for (int r = 0; r < comm->nranks; r++) {
		const uint8_t *card;
		size_t len;

		if (fr_rankset_has(dead, r))
			continue;
		card = fr_agree_card(comm, r, &len);
		/* every member said it has every card: cannot be missing */
		if (!card || len != CARD_KEY + kl) {
			*rcp = FR_EPROTO;
			goto out;
		}
		for (int i = 0; i < FR_SHARE_IDS / 8; i++)
			used[i] |= card[CARD_IDS + i];
		keys[n] = card + CARD_KEY;
		members[n++] = r;
	}
	for (int i = 0; i < FR_SHARE_IDS && id < 0; i++)
		if (!((used[i / 8] >> (i % 8)) & 1))
			id = i;
	if (id < 0) {
		fr_lock(comm);
		*rcp = fr_comm_seterr(
			comm, FR_EBUSY,
			"rank %d: fr_comm_shrink: no communicator id is left (%d in use on some member)",
			comm->rank, FR_SHARE_IDS);
		fr_unlock(comm);
		goto out;
	}
	*rcp = fr_split_make(comm, members, n, id, keys, kl, c, newcomm);
	c = NULL;
	if (!*rcp)
		fr_info("rank %d: shrunk to %d of %d ranks (communicator %d)",
			comm->rank, n, comm->nranks, id);
out:
	if (c)
		fr_split_early_undo(comm, c, true);
	free(members);
	free(keys);
	return 1;
}

int fr_comm_shrink(fr_comm_t *comm, fr_comm_t **newcomm)
{
	uint8_t *card = NULL;
	fr_rankset_t *dead = NULL;
	size_t kl = FR_TP_RKEY_MAX;
	int rc;

	if (!comm || !newcomm)
		return FR_EINVAL;
	*newcomm = NULL;
	card = calloc(1, CARD_KEY + FR_TP_RKEY_MAX);
	if (!card)
		return FR_ENOMEM;
	fr_lock(comm);
	rc = fr_peers_pack_card_key(comm, card + CARD_KEY, &kl);
	fr_unlock(comm);
	if (rc)
		goto out;
	for (int t = 0; t < FR_SHRINK_TRIES; t++) {
		struct fr_comm *c = NULL;
		uint32_t ok = 1;
		bool same;

		/* 1. */
		fr_lock(comm);
		(void)agree_locked(comm, &ok);
		free(dead);
		dead = comm->agr.sets ? set_dup(fr_agree_decided_set(comm),
						comm->nranks)
				      : NULL;
		if (!dead || comm->agr.excluded) {
			rc = !dead ? FR_ENOMEM
				   : fr_comm_seterr(
					     comm, FR_EPEER,
					     "rank %d: fr_comm_shrink: the other ranks count this rank as failed",
					     comm->rank);
			fr_unlock(comm);
			goto out;
		}
		fr_unlock(comm);
		/* 2. */
		card[CARD_HAS] = !fr_split_early(comm, kl, &c, card + CARD_KEY);
		fr_lock(comm);
		fr_share_ids_used(fr_share_of(comm->tp), card + CARD_IDS);
		ok = card[CARD_HAS];
		rc = fr_agree_exchange_begin(comm, comm->agr.inst, dead, card,
					     CARD_KEY + kl);
		if (!rc) {
			fr_signal(comm);
			fr_engine_agree_wait(comm);
			ok &= fr_agree_exchange_end(comm);
		} else {
			ok = 0;
		}
		for (int r = 0; ok && r < comm->nranks; r++) {
			size_t len;
			const uint8_t *cr =
				fr_rankset_has(dead, r)
					? NULL
					: fr_agree_card(comm, r, &len);

			if (!fr_rankset_has(dead, r) &&
			    (!cr || len != CARD_KEY + kl || !cr[CARD_HAS]))
				ok = 0;
		}
		/* 3. */
		(void)agree_locked(comm, &ok);
		same = !comm->agr.excluded &&
		       !memcmp(dead, fr_agree_decided_set(comm),
			       FR_RANKSET_WORDS(comm->nranks) * sizeof(*dead));
		fr_unlock(comm);
		if (ok && same) {
			shrink_make(comm, dead, kl, c, newcomm, &rc);
			goto out;
		}
		/* nobody made the communicator (the agreement said so to
		 * all), so nothing writes into its mailbox: it goes */
		if (c)
			fr_split_early_undo(comm, c, false);
		fr_dbg("rank %d: fr_comm_shrink: %s: again", comm->rank,
		       same ? "a member could not take part"
			    : "a rank failed meanwhile");
	}
	fr_lock(comm);
	rc = fr_comm_seterr(
		comm, FR_EPEER,
		"rank %d: fr_comm_shrink: ranks kept failing or could not take part (%d tries)",
		comm->rank, FR_SHRINK_TRIES);
	fr_unlock(comm);
out:
	free(dead);
	free(card);
	return rc;
}
