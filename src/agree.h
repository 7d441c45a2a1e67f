/* SPDX-License-Identifier: MIT */
/*
 * agree.h - fault-tolerant agreement (fr_comm_agree): every surviving rank
 * decides the same value and the same set of failed ranks, although ranks
 * fail before or during it, on a communicator failed or not.  agree.c
 * says how.
 *
 * Layer: recovery, between the peers and the algorithms.  Calls the peers
 * (messages in the CTRL slot, liveness, failure knowledge) and the base;
 * called by the engine, which drives it from its progress rounds (also on
 * a failed communicator, while an agreement runs), and by the entry points
 * (recover.c).  Owns struct fr_agree.
 */
#ifndef FR_AGREE_H
#define FR_AGREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

struct fr_comm;

/* The agreement's state on the wire: a header, then three rank sets
 * (agree.c); a card of the exchange: a header, then the caller's card,
 * fr_comm_shrink's being its flag, the ids its endpoint uses and its new
 * mailbox's key (recover.c). */
#define FR_AGREE_STATE_HDR 40
#define FR_AGREE_CARD_HDR 8
#define FR_SHRINK_CARD(kl) (1 + FR_SHARE_IDS / 8 + (kl))

/* A set of ranks, a bit each. */
typedef uint64_t fr_rankset_t;
#define FR_RANKSET_WORDS(n) (((size_t)(n) + 63) / 64)
static inline bool fr_rankset_has(const fr_rankset_t *s, int r)
{
	return (s[r / 64] >> (r % 64)) & 1u;
}
static inline void fr_rankset_add(fr_rankset_t *s, int r)
{
	s[r / 64] |= (fr_rankset_t)1 << (r % 64);
}
static inline void fr_rankset_del(fr_rankset_t *s, int r)
{
	s[r / 64] &= ~((fr_rankset_t)1 << (r % 64));
}

/* A peer's latest state as its CTRL message said (agree.c, "Wire"). */
struct fr_agree_peer {
	bool valid;
	uint32_t inst, flags, bits;
	int32_t acc_ballot;
	uint32_t acc_value;
	uint32_t dec_inst, dec_value;
	fr_rankset_t *failed, *acc_set, *dec_set; /* into sets */
};

/* The agreement's state (comm->agr); allocated at the first agreement. */
struct fr_agree {
	int words;	     /* 64-bit words of a rank set */
	uint32_t inst;	     /* the instance this rank is in, or last ran */
	bool active;	     /* in fr_comm_agree now */
	bool decided;	     /* inst is decided */
	bool excluded;	     /* the others count this rank as failed */
	uint32_t flags;	     /* this rank's contribution to inst */
	fr_rankset_t *known; /* ranks known failed (grows, never shrinks) */
	/* the proposal this rank accepted in inst (its own, coordinating) */
	int32_t acc_ballot; /* AG_BALLOT(round, coordinator); -1: none */
	uint32_t acc_value;
	fr_rankset_t *acc_set;
	/* the last decision */
	uint32_t dec_inst, dec_value;
	fr_rankset_t *dec_set;
	/* coordinating: the rank this one takes as coordinator, since when,
	 * whether it proposed (acc is its proposal), asked for states */
	int coord;
	uint64_t coord_ms;
	bool proposing, poll;
	fr_rankset_t *owed; /* peers owed our latest state */
	bool owing;	    /* owed is not empty */
	uint64_t owing_ms;  /* since when (given up after the timeout) */
	/* fr_comm_failed: deaths known when the last decision came, or
	 * before the call that made it returned (fr_agree_end) */
	fr_rankset_t *seen;
	bool any_decided;
	struct fr_agree_peer *peers; /* [nranks] */
	/* the exchange (fr_agree_exchange_begin): its number, the ranks not
	 * in it, the cards we have (each rank's latest, of any exchange),
	 * the ranks owed ours, since when it runs */
	bool xactive;
	uint32_t xtag;
	fr_rankset_t *xskip, *xowed;
	uint8_t **xcard; /* [nranks], each xlen[r] bytes of exchange xtags[r] */
	uint32_t *xlen, *xtags;
	uint64_t xstart_ms;
	/* liveness: when the current wait began (a new coordinator, a
	 * proposal, an accepted one), and when each peer last sent us a
	 * state or a card: a rank is counted out only when neither it nor a
	 * PONG from it came for the timeout since the later of the two */
	uint64_t phase_ms;
	uint64_t poll_ms;   /* the coordinator last asked again (agree.c) */
	uint64_t resend_ms; /* a participant last sent its state again */
	fr_rankset_t *tmp;  /* scratch */
	uint64_t *heard_ms; /* [nranks] */
	fr_rankset_t *sets; /* every set above, one allocation */
	uint8_t *wire;	    /* our message, assembled */
	/* FR_FAULT_AGREE (fault injection for tests): die after sending
	 * this many proposals (phase 1), decisions (2) or cards (3) */
	int fault_phase;
	long fault_after;
};

/* The size of a CTRL slot (header included) for a job of nranks: the
 * agreement's state, or a card of fr_comm_shrink, whichever is larger; a
 * communicator split from the job keeps the job's. */
static inline size_t fr_agree_ctrl_size(int nranks)
{
	size_t state =
		FR_AGREE_STATE_HDR + 3 * 8 * (((size_t)nranks + 63) / 64);
	size_t card = FR_AGREE_CARD_HDR + FR_SHRINK_CARD(FR_TP_RKEY_MAX);
	/* + the message header (FR_MSG_HDR, peer.h) */
	size_t need = 64 + (state > card ? state : card);

	return (need + 63) & ~(size_t)63;
}

/* Enter an agreement with this rank's flags: 0, FR_ENOMEM, or FR_EBUSY
 * (one runs already: recovery's calls on one communicator go one at a
 * time). */
int fr_agree_begin(struct fr_comm *comm, uint32_t flags);
/* One round (the engine's, after it polled): take the peers' states,
 * coordinate, send what is owed, watch liveness.  Also with no agreement
 * active, to answer a rank still in one this rank has decided.  True when
 * this round decided. */
bool fr_agree_progress(struct fr_comm *comm, bool *did_work);
/* Whether an agreement or an exchange runs (the engine must poll, failed
 * or not). */
static inline bool fr_agree_running(const struct fr_agree *a)
{
	return (a->active && !a->decided) || a->xactive;
}
/* Peers are still owed our latest state (a decision not yet out). */
static inline bool fr_agree_owing(const struct fr_agree *a)
{
	return a->owing;
}
/* The decision: its value, and 0, or FR_EPEER when ranks failed (or
 * this one was counted out); ends the agreement. */
int fr_agree_end(struct fr_comm *comm, uint32_t *flags);
/*
 * The exchange: this rank's card (len bytes) to every rank not in skip
 * (nor known failed), and theirs, under the number tag; the engine runs
 * it to completion (fr_engine_agree_wait), which comes when every such
 * rank's card came or the rank failed.  fr_agree_exchange_end: whether
 * every card came (no rank failed meanwhile).  fr_agree_card: rank's
 * card, or NULL.  Needs an agreement made before it (agree_alloc).
 */
int fr_agree_exchange_begin(struct fr_comm *comm, uint32_t tag,
			    const fr_rankset_t *skip, const void *card,
			    size_t len);
bool fr_agree_exchange_end(struct fr_comm *comm);
const uint8_t *fr_agree_card(const struct fr_comm *comm, int rank, size_t *len);
/* The last decision's failed set, and whether this rank was counted out. */
const fr_rankset_t *fr_agree_decided_set(const struct fr_comm *comm);
/* The ranks known failed (fr_comm_failed): the last decision's set and
 * the deaths found since, ascending; how many in all. */
int fr_agree_failed(struct fr_comm *comm, int *ranks, int max);
void fr_agree_fini(struct fr_comm *comm);

#endif
