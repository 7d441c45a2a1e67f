/* SPDX-License-Identifier: MIT */
/*
 * ll.c - the one-shot All-Reduce (and barrier, broadcast, reduce) over
 * lines: every rank puts its whole vector, with a header naming the call,
 * into a line of every other rank's (transport.h, line_put) and reduces
 * the n vectors itself.
 *
 * Schedule (n ranks on one node, 2 <= n <= FR_LL_RANKS_MAX, the vector and
 * its 16-byte header in one line): one step, as the one-shot over
 * mailboxes (oneshot.c).  Rank r puts to ranks r+1, r+2, ... r+n-1 (mod n)
 * line number k, the communicator's k-th collective over lines, and folds
 * the n vectors into its output in rank order:
 *
 *   out = ((x0 OP x1) OP x2) ... OP x(n-1)
 *
 * taking its own input at its place in that order and each other vector
 * from its sender's line as it comes (a later sender's waits in its line).
 *
 * Why: an 8-byte All-Reduce over the mailboxes costs a rank its message
 * header, a slot and a credit, the transport's completion, the peer
 * layer's bookkeeping and the algorithm's step (about 40 functions, none
 * of them the cost: 0.40-0.73 us at n = 2 over shm, where Open MPI's
 * vader took 0.24-0.32).  A line is the transport's cache line that the
 * receiver polls itself: the put writes the bytes and then the number,
 * the get sees the number and copies the bytes.  Nothing else moves.
 *
 * Order: a line is written again (number k + 2, same parity) only after
 * its reader has taken k: a rank puts k + 2 after it got k + 1 from every
 * peer, and each peer put k + 1 after it got k from every peer.  So each
 * connection needs its two lines only (transport.h).
 *
 * Mismatches: the header names the collective, the datatype, the
 * operation, the count and the collective's number, compared on arrival
 * (FR_EMISMATCH).  A peer whose arguments put it past a line (a larger
 * count), or that called another collective, sends mailbox messages
 * instead: fr_msg_get finds one for this collective, or one of another,
 * while we wait for its line, and the communicator fails with
 * FR_EMISMATCH.  A peer that waits for our messages in another collective
 * finds our line naming its collective (ll_progress) and fails it.  Settings
 * that would make ranks choose differently (FR_ALGO, FR_LL) are compared
 * at the rendezvous (comm.c).
 *
 * A barrier goes the same way with the header alone (n ranks on one
 * node): a rank leaves once it has every peer's line, so every peer has
 * entered; one step where dissemination takes lg n, and it reports
 * oneshot (fr_comm_last_algo), which it is.
 *
 * A broadcast and a reduce go the same way too, since the order rule
 * needs every rank to put a line to every peer and take every peer's:
 * a broadcast's root puts the header and its buffer, the others the
 * header alone, and copy the root's line out; a reduce's ranks all put
 * their vectors, and the root alone folds them (the same left fold; the
 * others keep nothing and may pass no output).  The header names the
 * root, so ranks that disagree on it fail as for any other argument.
 * Every rank leaves only once every rank has come, where the trees let a
 * rank go once its part is sent: with more ranks than CPUs that wait is
 * for the scheduler, and select.c does not offer these two there.
 *
 * Determinism: every rank folds the same vectors in the same order with
 * the same kernels, so all end with identical bits, the one-shot's left
 * fold over ranks 0..n-1 (tests/mp_allreduce.c, expect_linear); it runs
 * as FR_ALGO_ONESHOT, which it is (select.c chooses it for oneshot where
 * the lines can carry the call).
 */
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "peer.h"

#define LL_MAGIC 0x4c4c /* "LL" */
/* looks at a line that has not come, per pass of the engine */
#define FR_LL_LOOKS 16

/* The header before the vector: 16 bytes, host order (one node). */
struct ll_hdr {
	uint16_t magic;
	uint8_t coll, dtype, op, root; /* root: broadcast and reduce */
	uint16_t pad2;
	uint32_t seq;	/* the collective's number (req->seq) */
	uint32_t count; /* elements (the vector fits a line) */
};
_Static_assert(sizeof(struct ll_hdr) == FR_LL_HDR, "ll header");

struct ll_state {
	uint64_t line; /* our line number for this call */
	size_t bytes;  /* the vector's (0: a barrier) */
	size_t mine; /* our line's: the header, and the vector if we send one */
	bool keep;   /* the fold is our output (not a reduce's non-root) */
	fr_reduce_fn kern;
	int next;    /* the rank whose vector is folded next */
	int nput;    /* peers our line has gone to (in our order) */
	bool scaled; /* AVG's division done */
};

bool fr_ll_fits(const struct fr_comm *comm, enum fr_coll coll, size_t bytes)
{
	size_t max;

	if (coll == FR_COLL_BARRIER)
		bytes = 0;
	else if ((coll != FR_COLL_ALLREDUCE && coll != FR_COLL_BROADCAST &&
		  coll != FR_COLL_REDUCE) ||
		 !bytes)
		return false;
	if (comm->nranks < 2 || comm->nranks > FR_LL_RANKS_MAX ||
	    comm->topo.nnodes != 1)
		return false;
	max = fr_peer_line_bytes(comm);
	return max > FR_LL_HDR && bytes <= max - FR_LL_HDR;
}

static int ll_start(struct fr_comm *comm, struct fr_request *req)
{
	struct ll_state *st = fr_algo_state_new(req, sizeof(*st));
	const void *in =
		req->sendbuf == FR_IN_PLACE ? req->recvbuf : req->sendbuf;
	struct ll_hdr h = {
		.magic = LL_MAGIC,
		.coll = (uint8_t)req->coll,
		.dtype = (uint8_t)req->dtype,
		.op = (uint8_t)req->op,
		.seq = req->seq,
		.count = (uint32_t)req->count,
	};
	bool root = req->root == comm->rank;

	if (!st)
		return FR_ENOMEM;
	/* the operation means nothing to a broadcast's ranks: not compared */
	if (req->coll == FR_COLL_BROADCAST)
		h.op = 0;
	if (req->coll == FR_COLL_BROADCAST || req->coll == FR_COLL_REDUCE)
		h.root = (uint8_t)req->root;
	memcpy(comm->algo.ll_line, &h, sizeof(h));
	st->line = ++comm->algo.ll_seq;
	st->mine = FR_LL_HDR;
	if (req->coll == FR_COLL_BARRIER) /* the header alone */
		return 0;
	st->bytes = req->count * fr_dtype_size(req->dtype);
	st->kern = fr_reduce_kernel(req->dtype, req->op);
	st->keep = req->coll == FR_COLL_ALLREDUCE ||
		   (req->coll == FR_COLL_REDUCE && root);
	/* a broadcast's other ranks send the header alone */
	if (req->coll == FR_COLL_BROADCAST && !root)
		return 0;
	if (req->coll == FR_COLL_BROADCAST)
		in = req->recvbuf;
	st->mine += st->bytes;
	/* our line, header and input, assembled once: in place, the output
	 * overwrites the input while puts and the fold still read it (one
	 * image a communicator: one collective is active at a time) */
	memcpy(comm->algo.ll_line + FR_LL_HDR, in, st->bytes);
	return 0;
}

/* Our line to every peer, in our order; a peer still connecting waits. */
static int put_all(struct fr_comm *comm, struct ll_state *st, bool *did_work)
{
	int n = comm->nranks;

	while (st->nput < n - 1) {
		int peer = (comm->rank + 1 + st->nput) % n;
		int rc = fr_peer_line_put(comm, peer, st->line,
					  comm->algo.ll_line, st->mine);

		if (rc == FR_EAGAIN)
			return 0;
		if (rc)
			return rc;
		st->nput++;
		*did_work = true;
	}
	return 0;
}

/*
 * A peer that sends mailbox messages while we wait for lines chose another
 * schedule or called another collective (its messages for a later
 * collective, once it is done with this one, fr_msg_get leaves alone).
 * Looked at only when messages wait unread: a spin costs nothing more.
 */
static int check_msgs(struct fr_comm *comm, const struct fr_request *req,
		      const struct ll_state *st)
{
	for (int r = st->next; r < comm->nranks; r++) {
		const struct fr_msg *m;
		const uint8_t *payload;
		int rc;

		if (r == comm->rank)
			continue;
		rc = fr_msg_get(comm, req, r, &m, &payload);
		if (rc == FR_EAGAIN)
			continue;
		if (rc)
			return rc; /* fr_msg_get has failed the communicator */
		return fr_comm_fail(
			comm, FR_EMISMATCH,
			"rank %d: collective #%u (%s of %zu %s, %s, by lines): rank %d sent a message for it (collective %d, %llu elements of datatype %d, algorithm %d)",
			comm->rank, req->seq, fr_coll_name(req->coll),
			req->count, fr_dtype_name(req->dtype),
			fr_op_name(req->op), r, m->coll,
			(unsigned long long)m->count, m->dtype, m->algo & 0xf);
	}
	return 0;
}

/* Rank r's vector x into the output, at its place in the fold: rank 0's
 * copied, the later ones reduced in (a barrier has none, a reduce's
 * non-root keeps none); a broadcast's root's copied, where we are not it. */
static void fold(struct fr_request *req, const struct ll_state *st, int r,
		 const uint8_t *x)
{
	if (req->coll == FR_COLL_BROADCAST) {
		if (r == req->root && x != req->recvbuf)
			memcpy(req->recvbuf, x, st->bytes);
	} else if (st->keep && r == 0) {
		memcpy(req->recvbuf, x, st->bytes);
	} else if (st->keep) {
		st->kern(req->recvbuf, req->recvbuf, x, req->count);
	}
}

/* the length of rank r's line: a broadcast's other ranks put the header
 * alone */
static size_t line_len(const struct fr_request *req, const struct ll_state *st,
		       int r)
{
	return req->coll == FR_COLL_BROADCAST && r != req->root
		       ? FR_LL_HDR
		       : FR_LL_HDR + st->bytes;
}

/* rank r's line, folded into the output: 1, 0 (not yet) or the error */
static int take(struct fr_comm *comm, struct fr_request *req,
		struct ll_state *st, int r, bool *did_work)
{
	uint8_t in[FR_TP_LINE_MAX];
	struct ll_hdr h;
	int got = fr_peer_line_get(comm, r, st->line, in, sizeof(in));

	if (got <= 0)
		return got;
	memcpy(&h, in, sizeof(h));
	/* the same call has the same header as ours, field for field */
	if ((size_t)got != line_len(req, st, r) ||
	    memcmp(in, comm->algo.ll_line, FR_LL_HDR))
		return fr_comm_fail(
			comm, FR_EMISMATCH,
			"rank %d: collective #%u (%s of %zu %s, %s, root %d): rank %d called collective #%u, %s of %u elements of datatype %d, operation %d, root %d",
			comm->rank, req->seq, fr_coll_name(req->coll),
			req->count, fr_dtype_name(req->dtype),
			fr_op_name(req->op), req->root, r, h.seq,
			fr_coll_name((enum fr_coll)h.coll), h.count, h.dtype,
			h.op, h.root);
	fold(req, st, r, in + FR_LL_HDR);
	*did_work = true;
	return 1;
}

static int ll_advance(struct fr_comm *comm, struct fr_request *req,
		      bool *did_work)
{
	struct ll_state *st = req->algo_state;
	int rc = put_all(comm, st, did_work);

	while (!rc && st->next < comm->nranks) {
		int r = st->next;

		if (r == comm->rank) {
			fold(req, st, r,
			     req->coll == FR_COLL_BROADCAST
				     ? req->recvbuf
				     : comm->algo.ll_line + FR_LL_HDR);
			*did_work = true;
		} else {
			/* a few looks at the line before the engine's
			 * round (the transport's poll, the peers, the
			 * lock): the line is the only thing this call
			 * waits for, and a look costs a load */
			for (int i = 0; i < FR_LL_LOOKS && !rc; i++)
				rc = take(comm, req, st, r, did_work);
			/* not there yet: the mailboxes, once a pass */
			if (!rc && comm->peer.unread)
				rc = check_msgs(comm, req, st);
			if (rc <= 0)
				break;
			rc = 0;
		}
		st->next++;
	}
	if (rc)
		return rc;
	if (st->next >= comm->nranks && !st->scaled) {
		st->scaled = true;
		if (req->op == FR_AVG && st->keep)
			fr_reduce_scale_avg(req->dtype, req->recvbuf,
					    req->count, comm->nranks);
	}
	return 0;
}

static bool ll_done(const struct fr_comm *comm, const struct fr_request *req)
{
	const struct ll_state *st = req->algo_state;

	return st && st->next >= comm->nranks && st->nput >= comm->nranks - 1;
}

static int ll_waiting_on(const struct fr_comm *comm,
			 const struct fr_request *req)
{
	const struct ll_state *st = req->algo_state;

	if (!st)
		return (comm->rank + 1) % comm->nranks;
	if (st->next < comm->nranks && st->next != comm->rank)
		return st->next;
	if (st->nput < comm->nranks - 1)
		return (comm->rank + 1 + st->nput) % comm->nranks;
	return (comm->rank + 1) % comm->nranks;
}

/*
 * A rank that runs the collective by other means (a broadcast by the tree,
 * where its peers All-Reduce by lines) waits for messages that never come,
 * and its peers for its line: both would only learn of it at the timeout.
 * So while another algorithm's collective runs, once a tick of the coarse
 * clock (util.h), look at each peer's next line: one that names this very
 * collective (its number) means that peer took lines for it where we did
 * not.  A peer already at a later collective names that one, so there is
 * no false alarm; ranks that disagree on the lines' count find nothing,
 * and the timeout stays.  Not where lines cannot run (no lines, too many
 * ranks).
 */
static int ll_progress(struct fr_comm *comm, struct fr_request *active,
		       bool *did_work)
{
	uint8_t in[FR_TP_LINE_MAX];

	(void)did_work;
	if (!active || !active->algo || active->algo == &fr_algo_ll ||
	    !fr_ll_fits(comm, FR_COLL_BARRIER, 0) ||
	    !fr_coarse_tick_new(&comm->algo.ll_peek_ms))
		return 0;
	for (int r = 0; r < comm->nranks; r++) {
		struct ll_hdr h;
		int got;

		if (r == comm->rank)
			continue;
		got = fr_peer_line_get(comm, r, comm->algo.ll_seq + 1, in,
				       sizeof(in));
		if (got < 0)
			return got; /* the peer layer has failed the link */
		if ((size_t)got < FR_LL_HDR)
			continue;
		memcpy(&h, in, sizeof(h));
		if (h.magic == LL_MAGIC && h.seq == active->seq)
			return fr_comm_fail(
				comm, FR_EMISMATCH,
				"rank %d: collective #%u (%s of %zu %s, by %s): rank %d called it as %s of %u elements of datatype %d by lines",
				comm->rank, active->seq,
				fr_coll_name(active->coll), active->count,
				fr_dtype_name(active->dtype),
				active->algo->name, r,
				fr_coll_name((enum fr_coll)h.coll), h.count,
				h.dtype);
	}
	return 0;
}

const struct fr_algo fr_algo_ll = {
	.id = FR_ALGO_ONESHOT,
	.name = "oneshot",
	.start = ll_start,
	.advance = ll_advance,
	.done = ll_done,
	.free = fr_algo_free_state,
	.waiting_on = ll_waiting_on,
	.progress = ll_progress,
};
