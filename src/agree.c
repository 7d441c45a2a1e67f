/* SPDX-License-Identifier: MIT */
/*
 * agree.c - fault-tolerant agreement (fr_comm_agree, and the agreements
 * that recovery's other calls make).
 *
 * Every surviving rank must decide the same (value, failed set) although
 * ranks die before or during the agreement, on a communicator that may
 * have failed, where the collectives' messages no longer flow.  So the
 * agreement has a channel of its own: one CTRL slot per sender in each
 * mailbox (peer.c), into which a rank writes its whole current state,
 * each new one overwriting the last.  Nothing is lost by overwriting,
 * since every message carries everything its sender knows; the receiver
 * keeps each peer's latest (struct fr_agree_peer).
 *
 * Schedule (one instance; every rank runs the same sequence of them):
 *   1. Each rank sends its state (its flags, the ranks it knows failed,
 *      the proposal it accepted, if any) to the coordinator: the lowest
 *      rank it does not know failed.
 *   2. The coordinator waits for the state of every rank it does not know
 *      failed, then proposes: the accepted proposal with the highest ballot
 *      among them if there is one (a previous coordinator's, which some
 *      rank may have decided), else the AND of the flags it got and the
 *      failed ranks it knows.  Its ballot is its rank.
 *   3. Each rank accepts a proposal from the rank it takes as coordinator
 *      and says so with its state (an ACK).
 *   4. Once every rank it does not know failed has accepted, the
 *      coordinator decides and sends the decision to all.
 * Failures: a rank learns that another failed from the peer layer (a
 * closed or failed connection, a refused connect, an ABORT naming it) or
 * here, when one it waits on has answered no PING for FR_TIMEOUT_MS;
 * states carry what each knows, so the news spreads.  A rank whose
 * coordinator fails moves on to the next lowest rank, which, coordinating
 * now, asks every rank for its state (POLL).  A rank that has decided
 * answers any rank still in that instance with its state, which carries
 * the decision, also after fr_comm_agree returned (from the engine's later
 * rounds).
 *
 * Why uniform: a decision needs the ACK of every rank not known failed,
 * so every such rank has accepted the value; a later coordinator hears
 * from all of them and re-proposes the accepted value with the highest
 * ballot, which is that value.  This assumes what ULFM's agreement does:
 * a rank found failed stays failed (fail-stop).  A rank that is alive but
 * counted out (it answered nothing for the timeout) learns it from any
 * state naming it, and its agreement returns FR_EPEER with itself among
 * the failed ranks.
 *
 * Cost: one message to the coordinator, a proposal, an ACK and the
 * decision: two round trips, 4 (n - 1) messages.
 *
 * Wire (the CTRL payload, little-endian):
 *    0 u32 "FRA1"      4 u32 instance    8 u32 flags     12 i32 accepted ballot
 *   16 u32 accepted value               20 u32 last decided instance
 *   24 u32 its value   28 u32 bits (AG_*)                32 u32 set words
 *   36 u32 0           40 known failed, accepted set, decided set (u64 each)
 */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agree.h"
#include "envvar.h"
#include "internal.h"
#include "log.h"
#include "peer.h"
#include "util.h"

#define AG_MAGIC 0x31415246u /* "FRA1" */
#define AG_HDR FR_AGREE_STATE_HDR
enum {
	AG_ACTIVE = 1,	  /* in an agreement, undecided */
	AG_PROPOSING = 2, /* accepted value is the sender's own proposal */
	AG_POLL = 4,	  /* coordinating: send me your state */
};
/* the peer layer's CTRL channels: the agreement's states, the exchange's
 * cards */
#define AG_CH_AGREE 0
#define AG_CH_XCHG 1
/* sets per peer (failed, accepted, decided) and of our own */
#define AG_PEER_SETS 3
/* a coordinator asks the ranks it still waits on again this often */
#define AG_REPOLL_MS 500
#define AG_OWN_SETS 8
/* A proposal's ballot: its coordinator's round in the instance, then its
 * rank; a later proposal (a new coordinator, or the same one after a
 * failure) has a higher one. */
#define AG_RANK_BITS 20
#define AG_BALLOT(round, rank) \
	((int32_t)((uint32_t)(round) << AG_RANK_BITS | (uint32_t)(rank)))
#define AG_BALLOT_RANK(b) ((int)((uint32_t)(b) & ((1u << AG_RANK_BITS) - 1)))
#define AG_BALLOT_ROUND(b) ((uint32_t)(b) >> AG_RANK_BITS)
/* a card's header: "FRX1", the exchange's number */
#define XC_MAGIC 0x31585246u
#define XC_HDR FR_AGREE_CARD_HDR

/* Milliseconds from t to now: 0 when t is later (a stamp taken during
 * this round, after now was read). */
static uint64_t elapsed(uint64_t now, uint64_t t)
{
	return now > t ? now - t : 0;
}

/* An agreement of ours runs, undecided. */
static bool agreeing(const struct fr_agree *a)
{
	return a->active && !a->decided;
}

static size_t wire_len(const struct fr_agree *a)
{
	return AG_HDR + (size_t)AG_PEER_SETS * (size_t)a->words * 8;
}

static void set_copy(const struct fr_agree *a, fr_rankset_t *d,
		     const fr_rankset_t *s)
{
	memcpy(d, s, (size_t)a->words * sizeof(*d));
}

static void set_clear(const struct fr_agree *a, fr_rankset_t *d)
{
	memset(d, 0, (size_t)a->words * sizeof(*d));
}

static bool set_empty(const struct fr_agree *a, const fr_rankset_t *s)
{
	for (int i = 0; i < a->words; i++)
		if (s[i])
			return false;
	return true;
}

/* FR_FAULT_AGREE=propose:K, commit:K or card:K (tests): the coordinator
 * dies (SIGKILL) after sending K proposals or K decisions, or a rank after
 * sending K cards of an exchange (fr_comm_shrink's). */
static void fault_parse(struct fr_agree *a)
{
	const char *v = fr_env_get(fr_env_getenv, NULL, "FR_FAULT_AGREE");
	char *end;

	if (!v)
		return;
	if (!strncmp(v, "propose:", 8))
		a->fault_phase = 1;
	else if (!strncmp(v, "commit:", 7))
		a->fault_phase = 2;
	else if (!strncmp(v, "card:", 5))
		a->fault_phase = 3;
	else
		return;
	a->fault_after = strtol(strchr(v, ':') + 1, &end, 10);
	if (*end || a->fault_after < 0)
		a->fault_phase = 0;
}

static int agree_alloc(struct fr_comm *c)
{
	struct fr_agree *a = &c->agr;
	size_t w = FR_RANKSET_WORDS(c->nranks);
	fr_rankset_t *s;

	a->words = (int)w;
	a->sets = calloc((AG_OWN_SETS + AG_PEER_SETS * (size_t)c->nranks) * w,
			 sizeof(*a->sets));
	if (!a->sets)
		goto err_sets;
	a->peers = calloc((size_t)c->nranks, sizeof(*a->peers));
	if (!a->peers)
		goto err_peers;
	a->wire = malloc(wire_len(a));
	if (!a->wire)
		goto err_wire;
	a->xcard = calloc((size_t)c->nranks, sizeof(*a->xcard));
	a->xlen = calloc((size_t)c->nranks, sizeof(*a->xlen));
	a->xtags = calloc((size_t)c->nranks, sizeof(*a->xtags));
	a->heard_ms = calloc((size_t)c->nranks, sizeof(*a->heard_ms));
	if (!a->xcard || !a->xlen || !a->xtags || !a->heard_ms)
		goto err_x;
	s = a->sets;
	a->known = s;
	a->acc_set = s + w;
	a->dec_set = s + 2 * w;
	a->owed = s + 3 * w;
	a->seen = s + 4 * w;
	a->xskip = s + 5 * w;
	a->xowed = s + 6 * w;
	a->tmp = s + 7 * w;
	s += AG_OWN_SETS * w;
	for (int r = 0; r < c->nranks; r++, s += AG_PEER_SETS * w) {
		a->peers[r].failed = s;
		a->peers[r].acc_set = s + w;
		a->peers[r].dec_set = s + 2 * w;
	}
	a->decided = true; /* no instance yet */
	a->acc_ballot = -1;
	a->coord = -1;
	fault_parse(a);
	return 0;

err_x:
	free(a->heard_ms);
	free(a->xtags);
	free(a->xlen);
	free(a->xcard);
	free(a->wire);
err_wire:
	free(a->peers);
	a->peers = NULL;
err_peers:
	free(a->sets);
	a->sets = NULL;
err_sets:
	return FR_ENOMEM;
}

void fr_agree_fini(struct fr_comm *c)
{
	if (c->agr.xcard)
		for (int r = 0; r < c->nranks; r++)
			free(c->agr.xcard[r]);
	free(c->agr.xcard);
	free(c->agr.xlen);
	free(c->agr.xtags);
	free(c->agr.heard_ms);
	free(c->agr.wire);
	free(c->agr.peers);
	free(c->agr.sets);
	memset(&c->agr, 0, sizeof(c->agr));
}

int fr_agree_begin(struct fr_comm *c, uint32_t flags)
{
	struct fr_agree *a = &c->agr;
	int rc;

	if (!a->sets && (rc = agree_alloc(c)))
		return fr_comm_seterr(
			c, rc, "rank %d: agreement: out of memory", c->rank);
	if (a->active || a->xactive)
		return fr_comm_seterr(
			c, FR_EBUSY,
			"rank %d: an agreement or shrink runs already on this communicator (one at a time)",
			c->rank);
	if (c->nranks > 1 && wire_len(a) > c->peer.ctrl_size - FR_MSG_HDR)
		return fr_comm_seterr(
			c, FR_EPROTO,
			"rank %d: agreement: its %zu-byte state does not fit a CTRL slot of %zu",
			c->rank, wire_len(a), c->peer.ctrl_size - FR_MSG_HDR);
	a->inst++;
	a->active = true;
	a->decided = false;
	a->excluded = false;
	a->flags = flags;
	a->acc_ballot = -1;
	set_clear(a, a->acc_set);
	a->proposing = a->poll = false;
	a->coord = -1;
	return 0;
}

/* ---- messages ------------------------------------------------------------ */

static size_t encode(struct fr_comm *c)
{
	struct fr_agree *a = &c->agr;
	uint8_t *b = a->wire;
	size_t sb = (size_t)a->words * 8;
	uint32_t bits = 0;

	if (agreeing(a))
		bits |= AG_ACTIVE;
	if (a->proposing && AG_BALLOT_RANK(a->acc_ballot) == c->rank)
		bits |= AG_PROPOSING;
	if (a->poll)
		bits |= AG_POLL;
	fr_put_le32(b, AG_MAGIC);
	fr_put_le32(b + 4, a->inst);
	fr_put_le32(b + 8, a->flags);
	fr_put_le32(b + 12, (uint32_t)a->acc_ballot);
	fr_put_le32(b + 16, a->acc_value);
	fr_put_le32(b + 20, a->dec_inst);
	fr_put_le32(b + 24, a->dec_value);
	fr_put_le32(b + 28, bits);
	fr_put_le32(b + 32, (uint32_t)a->words);
	fr_put_le32(b + 36, 0);
	for (int i = 0; i < a->words; i++) {
		fr_put_le64(b + AG_HDR + 8 * (size_t)i, a->known[i]);
		fr_put_le64(b + AG_HDR + sb + 8 * (size_t)i, a->acc_set[i]);
		fr_put_le64(b + AG_HDR + 2 * sb + 8 * (size_t)i, a->dec_set[i]);
	}
	return wire_len(a);
}

static bool decode(const struct fr_agree *a, const uint8_t *b, size_t len,
		   struct fr_agree_peer *m)
{
	size_t sb = (size_t)a->words * 8;

	if (len != wire_len(a) || fr_get_le32(b) != AG_MAGIC ||
	    fr_get_le32(b + 32) != (uint32_t)a->words)
		return false;
	m->inst = fr_get_le32(b + 4);
	m->flags = fr_get_le32(b + 8);
	m->acc_ballot = (int32_t)fr_get_le32(b + 12);
	m->acc_value = fr_get_le32(b + 16);
	m->dec_inst = fr_get_le32(b + 20);
	m->dec_value = fr_get_le32(b + 24);
	m->bits = fr_get_le32(b + 28);
	for (int i = 0; i < a->words; i++) {
		m->failed[i] = fr_get_le64(b + AG_HDR + 8 * (size_t)i);
		m->acc_set[i] = fr_get_le64(b + AG_HDR + sb + 8 * (size_t)i);
		m->dec_set[i] =
			fr_get_le64(b + AG_HDR + 2 * sb + 8 * (size_t)i);
	}
	m->valid = true;
	return true;
}

/* ---- knowledge and decisions ----------------------------------------------
 */

/* r failed: in our set and the peer layer's. */
static void learn_failed(struct fr_comm *c, int r)
{
	struct fr_agree *a = &c->agr;

	if (r == c->rank) {
		if (!a->excluded && agreeing(a))
			fr_info("rank %d: agreement #%u: the other ranks count this rank as failed",
				c->rank, a->inst);
		a->excluded = true;
		return;
	}
	if (fr_rankset_has(a->known, r))
		return;
	fr_rankset_add(a->known, r);
	fr_peers_mark_dead(c, r);
	/* nothing more goes to it (a write to a dead peer over RDMA may
	 * wait seconds for its error, and the states owed to live ranks
	 * behind it); it gets our state again only if it writes to us */
	fr_rankset_del(a->owed, r);
	fr_rankset_del(a->xowed, r);
	fr_dbg("rank %d: agreement #%u: rank %d failed", c->rank, a->inst, r);
}

static void decide(struct fr_comm *c, uint32_t value, const fr_rankset_t *set)
{
	struct fr_agree *a = &c->agr;

	a->decided = true;
	a->dec_inst = a->inst;
	a->dec_value = value;
	if (set != a->dec_set)
		set_copy(a, a->dec_set, set);
	for (int r = 0; r < c->nranks; r++)
		if (fr_rankset_has(a->dec_set, r))
			learn_failed(c, r);
	set_clear(a, a->seen);
	for (int r = 0; r < c->nranks; r++)
		if (r != c->rank && c->peer.peers[r].dead)
			fr_rankset_add(a->seen, r);
	a->any_decided = true;
	fr_dbg("rank %d: agreement #%u decided: 0x%x", c->rank, a->inst, value);
}

static void owe(struct fr_comm *c, int r)
{
	struct fr_agree *a = &c->agr;

	if (r == c->rank)
		return;
	fr_rankset_add(a->owed, r);
	if (!a->owing)
		a->owing_ms = fr_coarse_ms();
	a->owing = true;
}

static void owe_all(struct fr_comm *c)
{
	for (int r = 0; r < c->nranks; r++)
		if (!fr_rankset_has(c->agr.known, r))
			owe(c, r);
}

/* The peers' new states: what they know, and what they ask of us. */
static void absorb(struct fr_comm *c, bool *did_work)
{
	struct fr_agree *a = &c->agr;

	for (int r = 0; r < c->nranks && c->peer.ctrl_new > 0; r++) {
		struct fr_agree_peer *m = &a->peers[r];
		const uint8_t *b;
		size_t len;

		if (r == c->rank ||
		    !fr_peers_ctrl_take(c, r, AG_CH_AGREE, &b, &len) ||
		    !decode(a, b, len, m))
			continue;
		*did_work = true;
		a->heard_ms[r] = fr_coarse_ms();
		/* one we count as failed is alive after all: tell it (our
		 * state names it), so that it stops waiting for us */
		if ((m->bits & AG_ACTIVE) && fr_rankset_has(a->known, r))
			owe(c, r);
		for (int q = 0; q < c->nranks; q++)
			if (fr_rankset_has(m->failed, q))
				learn_failed(c, q);
		/* counted out in its last agreement: failed, for us too */
		if (m->dec_inst && fr_rankset_has(m->dec_set, r))
			learn_failed(c, r);
		/* it decided the instance we are in (not a decision it made
		 * alone, counted out) */
		if (agreeing(a) && m->dec_inst == a->inst &&
		    !fr_rankset_has(m->dec_set, r))
			decide(c, m->dec_value, m->dec_set);
		/* it is still in one we decided: tell it */
		if ((m->bits & AG_ACTIVE) && a->dec_inst &&
		    m->inst == a->dec_inst && m->dec_inst < m->inst)
			owe(c, r);
		/* a new coordinator asks for our state */
		if ((m->bits & AG_POLL) && agreeing(a) && m->inst == a->inst)
			owe(c, r);
	}
}

/* Whether FR_FAULT_AGREE kills this rank in its next sends on channel
 * ch: the coordinator's proposals (phase 1) or decisions (2), the
 * exchange's cards (3). */
static bool fault_armed(const struct fr_agree *a, int ch)
{
	if (ch == AG_CH_XCHG)
		return a->fault_phase == 3;
	return (a->fault_phase == 1 && a->proposing && !a->decided) ||
	       (a->fault_phase == 2 && a->proposing && a->decided &&
		a->dec_inst == a->inst);
}

/* buf (len bytes) on channel ch to every rank in owed, which keeps those
 * that cannot take it yet; a rank that refuses it has failed. */
static void send_owed(struct fr_comm *c, int ch, fr_rankset_t *owed,
		      const void *buf, size_t len, bool *did_work)
{
	struct fr_agree *a = &c->agr;
	bool fault = fault_armed(a, ch);

	for (int r = 0; r < c->nranks; r++) {
		int rc;

		if (!fr_rankset_has(owed, r))
			continue;
		if (fault && a->fault_after-- <= 0) {
			fr_info("rank %d: FR_FAULT_AGREE: dying now", c->rank);
			kill(getpid(), SIGKILL);
		}
		rc = fr_peers_ctrl_send(c, r, ch, buf, len);
		if (rc == FR_EAGAIN) {
			if (fr_coarse_since(a->owing_ms) > 1000)
				fr_dbg("rank %d: agreement #%u: rank %d cannot take our %s yet (connection %d, %d writes outstanding, outbox 0x%llx)",
				       c->rank, a->inst, r,
				       ch == AG_CH_XCHG ? "card" : "state",
				       (int)c->peer.peers[r].state,
				       c->peer.outstanding,
				       (unsigned long long)c->peer.out_busy);
			continue;
		}
		fr_rankset_del(owed, r);
		if (rc == FR_EINVAL) {
			/* ours, not the peer's: it does not fit (the mailbox
			 * is sized so that it does) */
			fr_err("rank %d: agreement #%u: cannot send our %s to rank %d: %s",
			       c->rank, a->inst,
			       ch == AG_CH_XCHG ? "card" : "state", r,
			       fr_strerror(rc));
		} else if (rc) {
			learn_failed(c, r);
		} else {
			*did_work = true;
			a->owing_ms = fr_coarse_ms();
		}
	}
}

/* Send our latest state to every peer owed it. */
static void flush(struct fr_comm *c, bool *did_work)
{
	struct fr_agree *a = &c->agr;

	if (!set_empty(a, a->owed))
		send_owed(c, AG_CH_AGREE, a->owed, a->wire, encode(c),
			  did_work);
}

/* Wait on r: connect, PING; failed when it closed, or when neither a
 * state, a card nor a PONG came from it for the timeout since the wait
 * began (since). */
static void watch(struct fr_comm *c, int r, uint64_t now, uint64_t since)
{
	int rc = fr_peers_reach(c, r);

	if (c->agr.heard_ms[r] > since)
		since = c->agr.heard_ms[r];
	if (rc == FR_EPEER) {
		learn_failed(c, r);
		return;
	}
	/* connected and answering; a connection that never comes up counts
	 * as no answer */
	if (!rc && fr_peers_probe(c, r))
		return;
	if (elapsed(now, since) >= (uint64_t)c->peer.timeout_ms) {
		fr_info("rank %d: agreement #%u: rank %d answered nothing for %d ms: counted as failed",
			c->rank, c->agr.inst, r, c->peer.timeout_ms);
		learn_failed(c, r);
	}
}

/* The coordinator's part: propose once every live rank sent its state,
 * decide once every live rank accepted. */
/* Propose acc (value, set) with a ballot above every one seen. */
static void propose(struct fr_comm *c, uint64_t now)
{
	struct fr_agree *a = &c->agr;
	uint32_t round =
		a->acc_ballot >= 0 ? AG_BALLOT_ROUND(a->acc_ballot) : 0;

	for (int r = 0; r < c->nranks; r++) {
		const struct fr_agree_peer *m = &a->peers[r];

		if (r != c->rank && m->valid && m->inst == a->inst &&
		    m->acc_ballot >= 0 &&
		    AG_BALLOT_ROUND(m->acc_ballot) > round)
			round = AG_BALLOT_ROUND(m->acc_ballot);
	}
	a->acc_ballot = AG_BALLOT(round + 1, c->rank);
	a->proposing = true;
	a->poll = false;
	a->phase_ms = now; /* the ACKs get a timeout of their own */
	owe_all(c);
}

static void coordinate(struct fr_comm *c, uint64_t now)
{
	struct fr_agree *a = &c->agr;
	/* a rank that keeps us waiting is asked again now and then: it may
	 * count us as failed (it never writes to us unless we write to it:
	 * then it says so), or have missed our proposal */
	bool again = elapsed(now, a->poll_ms) >= AG_REPOLL_MS, all = true;

	if (again)
		a->poll_ms = now;
	for (int r = 0; r < c->nranks; r++) {
		const struct fr_agree_peer *m = &a->peers[r];
		bool ok;

		if (r == c->rank || fr_rankset_has(a->known, r))
			continue;
		if (!a->proposing)
			ok = m->valid && m->inst == a->inst;
		else
			ok = m->valid && ((m->inst == a->inst &&
					   m->acc_ballot == a->acc_ballot) ||
					  m->dec_inst >= a->inst);
		if (!ok) {
			all = false;
			watch(c, r, now, a->phase_ms);
			if (again &&
			    elapsed(now, a->phase_ms) >= AG_REPOLL_MS) {
				a->poll = !a->proposing;
				owe(c, r);
			}
		}
	}
	/* a rank found failed after the proposal: propose again with it
	 * (nobody has decided yet: only the coordinator decides), so that
	 * the decision names every rank the survivors saw fail */
	if (a->proposing) {
		bool grown = false;

		for (int r = 0; r < c->nranks && !grown; r++)
			grown = r != c->rank && fr_rankset_has(a->known, r) &&
				!fr_rankset_has(a->acc_set, r);
		if (grown) {
			for (int i = 0; i < a->words; i++)
				a->acc_set[i] |= a->known[i];
			propose(c, now);
			return;
		}
	}
	/* a rank just found failed may have been the last awaited: the
	 * next round sees the set complete */
	if (!all)
		return;
	if (a->proposing) {
		decide(c, a->acc_value, a->acc_set);
		owe_all(c);
		return;
	}
	/* a value some rank accepted may have been decided: keep it */
	{
		int32_t best = a->acc_ballot;
		int from = -1;
		uint32_t value = a->flags;

		for (int r = 0; r < c->nranks; r++) {
			const struct fr_agree_peer *m = &a->peers[r];

			if (r == c->rank || fr_rankset_has(a->known, r) ||
			    !m->valid || m->inst != a->inst)
				continue;
			value &= m->flags;
			if (m->acc_ballot > best) {
				best = m->acc_ballot;
				from = r;
			}
		}
		if (from >= 0) {
			a->acc_value = a->peers[from].acc_value;
			set_copy(a, a->acc_set, a->peers[from].acc_set);
		} else if (best < 0) {
			a->acc_value = value;
			set_copy(a, a->acc_set, a->known);
		} /* else our own accepted proposal stands */
	}
	propose(c, now);
}

/* The agreement's part of a round. */
static void agree_step(struct fr_comm *c, bool *did_work, uint64_t now)
{
	struct fr_agree *a = &c->agr;
	int coord;

	if (a->excluded) {
		/* counted out: no decision of theirs will include us */
		fr_rankset_t *s = a->tmp;

		set_copy(a, s, a->known);
		fr_rankset_add(s, c->rank);
		decide(c, a->flags, s);
		return;
	}
	for (coord = 0; fr_rankset_has(a->known, coord); coord++)
		;
	if (coord != a->coord) {
		a->coord = coord;
		a->coord_ms = a->phase_ms = now;
		if (coord == c->rank) {
			/* taking over from a failed coordinator: every rank
			 * may have sent its state to that one */
			a->poll = coord > 0;
			if (a->poll)
				owe_all(c);
		} else {
			owe(c, coord);
		}
	}
	if (coord == c->rank) {
		coordinate(c, now);
	} else {
		const struct fr_agree_peer *m = &a->peers[coord];

		if (m->valid && m->inst == a->inst &&
		    (m->bits & AG_PROPOSING) &&
		    AG_BALLOT_RANK(m->acc_ballot) == coord &&
		    m->acc_ballot > a->acc_ballot) {
			/* accept the coordinator's proposal: our state is
			 * the ACK */
			a->acc_ballot = m->acc_ballot;
			a->acc_value = m->acc_value;
			set_copy(a, a->acc_set, m->acc_set);
			owe(c, coord);
			a->phase_ms = a->resend_ms = now;
			*did_work = true;
		}
		/* our state again now and then: an ACK or a decision lost
		 * (given up after the timeout) is made good this way, the
		 * coordinator answering with its proposal or decision */
		if (elapsed(now, a->resend_ms) >= AG_REPOLL_MS) {
			a->resend_ms = now;
			owe(c, coord);
		}
		watch(c, coord, now, a->phase_ms);
	}
}

/* ---- the exchange -------------------------------------------------------- */

/* The cards that came: each rank's latest, whatever exchange it is of. */
static void xabsorb(struct fr_comm *c, bool *did_work)
{
	struct fr_agree *a = &c->agr;

	for (int r = 0; r < c->nranks && c->peer.ctrl_new > 0; r++) {
		const uint8_t *b;
		size_t len;
		uint8_t *card;

		if (r == c->rank ||
		    !fr_peers_ctrl_take(c, r, AG_CH_XCHG, &b, &len) ||
		    len < XC_HDR || fr_get_le32(b) != XC_MAGIC)
			continue;
		/* the same card again: its sender lacks ours (it asks again
		 * every AG_REPOLL_MS until it has it) */
		if (a->xcard[r] && a->xlen[r] == len &&
		    !memcmp(a->xcard[r], b, len) && a->xcard[c->rank] &&
		    a->xtags[c->rank] == fr_get_le32(b + 4))
			fr_rankset_add(a->xowed, r);
		card = realloc(a->xcard[r], len);
		if (!card)
			continue; /* as if it had not come: we wait on */
		a->heard_ms[r] = fr_coarse_ms();
		memcpy(card, b, len);
		a->xcard[r] = card;
		a->xlen[r] = (uint32_t)len;
		a->xtags[r] = fr_get_le32(b + 4);
		*did_work = true;
	}
}

static bool xhave(const struct fr_agree *a, int r)
{
	return a->xcard[r] && a->xtags[r] == a->xtag;
}

static void xflush(struct fr_comm *c, bool *did_work)
{
	struct fr_agree *a = &c->agr;

	if (!set_empty(a, a->xowed))
		send_owed(c, AG_CH_XCHG, a->xowed, a->xcard[c->rank],
			  a->xlen[c->rank], did_work);
}

/* Done when every rank in the exchange and not known failed sent its
 * card; the others are watched as the agreement watches. */
static void xstep(struct fr_comm *c, uint64_t now)
{
	struct fr_agree *a = &c->agr;
	bool again = elapsed(now, a->resend_ms) >= AG_REPOLL_MS, all = true;

	if (again)
		a->resend_ms = now;
	for (int r = 0; r < c->nranks; r++) {
		if (r == c->rank || fr_rankset_has(a->xskip, r) ||
		    fr_rankset_has(a->known, r) || xhave(a, r))
			continue;
		all = false;
		watch(c, r, now, a->xstart_ms);
		/* ours again, which makes it send its own (xabsorb) */
		if (again && elapsed(now, a->xstart_ms) >= AG_REPOLL_MS)
			fr_rankset_add(a->xowed, r);
	}
	if (all)
		a->xactive = false;
}

int fr_agree_exchange_begin(struct fr_comm *c, uint32_t tag,
			    const fr_rankset_t *skip, const void *card,
			    size_t len)
{
	struct fr_agree *a = &c->agr;
	uint8_t *mine;

	if (!a->sets)
		return FR_EPROTO;
	if (c->nranks > 1 && len + XC_HDR > c->peer.ctrl_size - FR_MSG_HDR)
		return FR_EPROTO;
	mine = realloc(a->xcard[c->rank], len + XC_HDR);
	if (!mine)
		return FR_ENOMEM;
	fr_put_le32(mine, XC_MAGIC);
	fr_put_le32(mine + 4, tag);
	memcpy(mine + XC_HDR, card, len);
	a->xcard[c->rank] = mine;
	a->xlen[c->rank] = (uint32_t)(len + XC_HDR);
	a->xtags[c->rank] = tag;
	a->xtag = tag;
	set_copy(a, a->xskip, skip);
	set_clear(a, a->xowed);
	for (int r = 0; r < c->nranks; r++)
		if (r != c->rank && !fr_rankset_has(skip, r) &&
		    !fr_rankset_has(a->known, r))
			fr_rankset_add(a->xowed, r);
	a->xstart_ms = fr_coarse_ms();
	a->xactive = true;
	if (!set_empty(a, a->xowed)) {
		if (!a->owing)
			a->owing_ms = a->xstart_ms;
		a->owing = true;
	}
	return 0;
}

bool fr_agree_exchange_end(struct fr_comm *c)
{
	struct fr_agree *a = &c->agr;

	a->xactive = false;
	for (int r = 0; r < c->nranks; r++)
		if (!fr_rankset_has(a->xskip, r) && !xhave(a, r))
			return false;
	return true;
}

const uint8_t *fr_agree_card(const struct fr_comm *c, int r, size_t *len)
{
	const struct fr_agree *a = &c->agr;

	if (!a->sets || !xhave(a, r))
		return NULL;
	*len = a->xlen[r] - XC_HDR;
	return a->xcard[r] + XC_HDR;
}

const fr_rankset_t *fr_agree_decided_set(const struct fr_comm *c)
{
	return c->agr.dec_set;
}

bool fr_agree_progress(struct fr_comm *c, bool *did_work)
{
	struct fr_agree *a = &c->agr;
	bool was = agreeing(a), xwas = a->xactive;
	uint64_t now = fr_coarse_ms();

	if (!a->sets)
		return false;
	absorb(c, did_work);
	xabsorb(c, did_work);
	if (agreeing(a) || a->xactive)
		for (int r = 0; r < c->nranks; r++)
			if (r != c->rank && c->peer.peers[r].dead)
				learn_failed(c, r);
	if (agreeing(a))
		agree_step(c, did_work, now);
	if (a->xactive)
		xstep(c, now);
	/* a peer that took nothing for the timeout never will */
	if (a->owing &&
	    elapsed(now, a->owing_ms) > (uint64_t)c->peer.timeout_ms) {
		fr_dbg("rank %d: agreement #%u: giving up sending to the ranks that took nothing for %d ms",
		       c->rank, a->inst, c->peer.timeout_ms);
		set_clear(a, a->owed);
		set_clear(a, a->xowed);
	}
	flush(c, did_work);
	xflush(c, did_work);
	{
		bool owed_before = a->owing;

		a->owing = !set_empty(a, a->owed) || !set_empty(a, a->xowed);
		if (a->owing && !owed_before)
			a->owing_ms = fr_coarse_ms();
	}
	return (was && !agreeing(a)) || (xwas && !a->xactive);
}

int fr_agree_end(struct fr_comm *c, uint32_t *flags)
{
	struct fr_agree *a = &c->agr;

	a->active = false;
	*flags = a->dec_value;
	/* a death found after this rank decided but before its call
	 * returns (the rest of the round that decided: a later peer's
	 * state naming it; the rounds that send the decision on) is one
	 * found during the agreement, as on the ranks that found it before
	 * deciding: fr_comm_failed shows it only after the next agreement,
	 * so that right after this one it is the decided set everywhere */
	for (int r = 0; r < c->nranks; r++)
		if (r != c->rank && c->peer.peers[r].dead)
			fr_rankset_add(a->seen, r);
	return a->excluded || !set_empty(a, a->dec_set) ? FR_EPEER : 0;
}

int fr_agree_failed(struct fr_comm *c, int *ranks, int max)
{
	struct fr_agree *a = &c->agr;
	bool agreed = a->sets && a->any_decided;
	int n = 0;

	for (int r = 0; r < c->nranks; r++) {
		bool in;

		if (r == c->rank)
			in = agreed &&
			     (a->excluded || fr_rankset_has(a->dec_set, r));
		else if (agreed)
			in = fr_rankset_has(a->dec_set, r) ||
			     (c->peer.peers[r].dead &&
			      !fr_rankset_has(a->seen, r));
		else
			in = c->peer.peers[r].dead;
		if (!in)
			continue;
		if (n < max)
			ranks[n] = r;
		n++;
	}
	return n;
}
