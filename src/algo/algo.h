/* SPDX-License-Identifier: MIT */
/*
 * algo.h - collective algorithms as interchangeable parts.
 *
 * An algorithm implements one or more collectives behind this table; the
 * progress engine (request.c) starts a request with start(), calls
 * advance() whenever something may have changed, and finishes it when
 * done() says so.  Algorithms reach peers only through peer.h; per-peer
 * state (connections, credits, keys) lives with the communicator, the state
 * of one collective in req->algo_state.  Which algorithm runs is decided in
 * one place, select.c.
 */
#ifndef FR_ALGO_H
#define FR_ALGO_H

#include "internal.h"
#include "reduce.h"

struct fr_algo {
	int id;		  /* fr_algo_t, sent in every message header */
	const char *name; /* for logs */
	int (*start)(struct fr_comm *comm, struct fr_request *req);
	int (*advance)(struct fr_comm *comm, struct fr_request *req,
		       bool *did_work);
	bool (*done)(const struct fr_comm *comm, const struct fr_request *req);
	void (*free)(struct fr_request *req);
	/* The rank the collective waits on, for timeout messages. */
	int (*waiting_on)(const struct fr_comm *comm,
			  const struct fr_request *req);
};

extern const struct fr_algo fr_algo_ring;	   /* allreduce, RS, AG */
extern const struct fr_algo fr_algo_rd;		   /* allreduce         */
extern const struct fr_algo fr_algo_rabenseifner;  /* allreduce         */
extern const struct fr_algo fr_algo_bcast_tree;	   /* broadcast         */
extern const struct fr_algo fr_algo_bcast_chain;   /* broadcast         */
extern const struct fr_algo fr_algo_dissemination; /* barrier          */
extern const struct fr_algo fr_algo_cring; /* compressed allreduce */
extern const struct fr_algo fr_algo_hier;  /* two-level allreduce  */
extern const struct fr_algo fr_algo_hier_rsag; /* two-level RS, AG */

/* The algorithm for req (every rank decides the same from the same
 * arguments, settings and tune file). */
const struct fr_algo *fr_algo_select(struct fr_comm *comm,
				     const struct fr_request *req);
/* Predicted time in microseconds of algorithm id for the collective, or a
 * negative value if it does not implement it. */
double fr_algo_predict_us(const struct fr_comm *comm, int id, enum fr_coll coll,
			  size_t bytes, fr_dtype_t dtype);
/* The same from the parameters alone, for any number of ranks (tools
 * predicting other job sizes); payload_max is a mailbox slot's payload. */
double fr_model_predict_us(const struct fr_tune *t, int nranks,
			   size_t payload_max, int id, enum fr_coll coll,
			   size_t bytes, fr_dtype_t dtype);
/* Cost-model parameters: FR_TUNE_FILE, else built-in defaults. */
int fr_tune_load(struct fr_comm *comm, const char *transport, char *err,
		 size_t errlen);
/* A hash of the parameters, which must agree on all ranks. */
uint32_t fr_tune_hash(const struct fr_tune *t);
void fr_tune_oversub(struct fr_comm *comm);

/* Shared helpers for the hypercube algorithms (rd.c, rabenseifner.c). */
struct fr_hcube {
	int pof2, rem, steps; /* largest power of two <= n, n - pof2, lg */
	int vrank;	      /* -1: folded out (an even rank < 2 rem) */
};
void fr_hcube_init(struct fr_hcube *h, int rank, int n);
/* The real rank of virtual rank v. */
static inline int fr_hcube_real(const struct fr_hcube *h, int v)
{
	return v < h->rem ? 2 * v + 1 : v + h->rem;
}

/*
 * A transfer of len bytes as mailbox fragments (xfer.c): the sender copies
 * each fragment into a message, the receiver takes them in order.  Step
 * numbers in the header tell the receiver which part of the schedule a
 * fragment belongs to, so a schedule error is caught, not reduced.
 */
struct fr_xfer {
	size_t len;
	uint32_t
		nfrags; /* at least 1: an empty transfer is one empty message */
	uint32_t done;	/* fragments sent / received */
};
void fr_xfer_init(struct fr_xfer *x, const struct fr_comm *comm, size_t len);
static inline bool fr_xfer_complete(const struct fr_xfer *x)
{
	return x->done >= x->nfrags;
}
/* Bytes covered by the first `frags` fragments. */
size_t fr_xfer_bytes(const struct fr_comm *comm, const struct fr_xfer *x,
		     uint32_t frags);
/* Send the next fragments of src[0, avail) (avail <= len) to rank. */
int fr_xfer_send(struct fr_comm *comm, const struct fr_request *req,
		 struct fr_xfer *x, int rank, uint16_t step, const uint8_t *src,
		 size_t avail, bool *did_work);
/* The next fragment from rank: 0 with its offset, length and payload, or
 * FR_EAGAIN.  fr_xfer_recv_done() consumes it. */
int fr_xfer_recv(struct fr_comm *comm, const struct fr_request *req,
		 struct fr_xfer *x, int rank, uint16_t step, size_t *off,
		 size_t *len, const uint8_t **payload);
void fr_xfer_recv_done(struct fr_comm *comm, struct fr_xfer *x, int rank);
/* Take up to `limit` fragments from rank into dst at their offsets:
 * dst = a OP fragment with kern, else a copy. */
int fr_xfer_take(struct fr_comm *comm, const struct fr_request *req,
		 struct fr_xfer *x, int rank, uint16_t step, uint8_t *dst,
		 const uint8_t *a, fr_reduce_fn kern, size_t es, uint32_t limit,
		 bool *did_work);

/*
 * The run of a hypercube All-Reduce (hcube.c): the fold that makes n a power
 * of two, the algorithm's own body, the unfold.  Algorithms put it first in
 * their state so that done / waiting_on / free are shared.
 */
enum { FR_HC_FOLD, FR_HC_BODY, FR_HC_UNFOLD, FR_HC_DONE };
struct fr_hc {
	struct fr_hcube h;
	size_t es, bytes;
	const uint8_t *cur; /* the current vector: the input, then buf */
	uint8_t *buf;
	fr_reduce_fn kern;
	int stage, partner;
	bool inited; /* tx / rx set up for the current step */
	struct fr_xfer tx, rx;
};
/* Fill hc for req, start the connections of the schedule (the fold
 * partner, and the partner of every hypercube dimension). */
int fr_hc_start(struct fr_comm *comm, struct fr_request *req, struct fr_hc *hc);
void fr_hc_xfers(struct fr_comm *comm, struct fr_hc *hc, int partner,
		 size_t txlen, size_t rxlen);
/*
 * One step of a hypercube schedule with partner: send src[0, txlen), take
 * rxlen bytes into dst (dst = a OP fragment with hc->kern when a, else a
 * copy).  lockstep: take fragment i only once our own fragment i is out,
 * for when dst is what we send from.  1 once both directions are done (the
 * next step starts afresh), 0 while waiting, or an error.
 */
int fr_hc_exchange(struct fr_comm *comm, struct fr_request *req,
		   struct fr_hc *hc, int partner, uint16_t step,
		   const uint8_t *src, size_t txlen, uint8_t *dst,
		   const uint8_t *a, size_t rxlen, bool lockstep,
		   bool *did_work);
/* Run the fold / unfold stage; they move hc->stage on when done. */
int fr_hc_fold(struct fr_comm *comm, struct fr_request *req, struct fr_hc *hc,
	       bool *did_work);
int fr_hc_unfold(struct fr_comm *comm, struct fr_request *req, struct fr_hc *hc,
		 bool *did_work);
/* After the body: the result into buf, then on to the unfold (the body
 * divides by n for FR_AVG itself, before the unfold sends it). */
void fr_hc_body_done(struct fr_comm *comm, struct fr_hc *hc);
/* Run fold, body and unfold as far as they go; body runs the algorithm's
 * own steps and calls fr_hc_body_done() at their end. */
typedef int (*fr_hc_body_fn)(struct fr_comm *comm, struct fr_request *req,
			     bool *did_work);
int fr_hc_run(struct fr_comm *comm, struct fr_request *req, fr_hc_body_fn body,
	      bool *did_work);
bool fr_hc_done(const struct fr_comm *comm, const struct fr_request *req);
int fr_hc_waiting_on(const struct fr_comm *comm, const struct fr_request *req);
/* free(req->algo_state) */
void fr_algo_free_state(struct fr_request *req);

#endif
