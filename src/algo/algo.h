/* SPDX-License-Identifier: MIT */
/*
 * algo.h - collective algorithms as interchangeable parts.
 *
 * An algorithm implements one or more collectives behind this table; the
 * progress engine (request.c) starts a request with start(), calls
 * advance() whenever something may have changed, and finishes it when
 * done() says so.  Algorithms reach peers only through peer.h; per-peer
 * state (connections, credits, keys) lives with the peer layer, the state
 * of one collective in req->algo_state, state that outlives a collective
 * (the ring's staging buffers) in comm->algo.state[].  Which algorithm runs
 * is decided in one place, select.c, which also holds the table of every
 * algorithm: the engine reaches them only through it (fr_algos_*), so no
 * algorithm is named outside src/algo/.
 *
 * Layer: algorithms.  May call the peers (peer.h), the memory layer
 * (mem.h), the kernels (reduce.h, compress.h) and the base; never the
 * engine or the transport.  Called by the engine.  Owns struct
 * fr_algo_layer.
 */
#ifndef FR_ALGO_H
#define FR_ALGO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fastreduce.h"
#include "peer.h"
#include "reduce.h"
#include "topo.h"
#include "transport.h"

struct fr_comm;
struct fr_request;

/* Tuned cost-model parameters (select.c, fr_tune(1)). */
struct fr_tune {
	double alpha_us; /* per message step, microseconds */
	double beta_ns;	 /* per byte on the wire, nanoseconds */
	double copy_ns;	 /* per byte copied through a mailbox */
	/* between two ranks of one node, where that is cheaper than the
	 * network (the mixed transports' shared memory): a message step's
	 * latency and a byte's write; 0: unset, such a step costs what it
	 * did before (select.c, "the node's own steps") */
	double local_alpha_us;
	double local_beta_ns;
	/* a rank's own work per message step (a send and a receive, no wire
	 * latency): what each extra message of the one-shot costs */
	double msg_us;
	/* a line's trip among the ranks of one node (ll.c): a rank's put
	 * until its peers have read it, the wait for the slowest of them
	 * included, microseconds (select.c, "lines"); priced only where
	 * the transport has lines */
	double line_us;
	double gamma_ns[FR_DTYPE_COUNT]; /* per byte reduced */
	/* what a Rabenseifner step's stream loses to starting afresh, as a
	 * fraction of its wire time: each step writes to a new partner over
	 * a connection idle since the last call, where the ring's two stream
	 * throughout (select.c, "a step's fresh stream"); 0: nothing */
	double step_ramp;
	/* FR_TOPO's grid: grid_beta_ns[d] (d >= 1) per byte through the
	 * uplink that joins a group of the first d dimensions' nodes (a rack
	 * of grid[0] nodes for d = 1) to the rest, which the group's nodes
	 * share; 0: not known (select.c, "the grid's links") */
	double grid_beta_ns[FR_TOPO_MAX_DIMS];
	char source[256]; /* "built-in defaults" or the file it came from */
};

/*
 * An extra message of the one-shot All-Reduce costs a rank its own work
 * only, no wire latency, but that work does not overlap: p - 1 sends, p - 1
 * receives and reductions on one CPU, where a step of recursive doubling
 * overlaps its one send and one receive with the partner's.  Where the
 * built-in alpha is all of it the software's (a LAN), such a message
 * costs about 2.5 alpha: measured at 3 ranks on 2 CPUs, the one-shot took
 * 16.7 us against 15.0 for recursive doubling over shm, 36 against 23
 * over TCP, and 43 against 26-40 between namespaces, which the model
 * gets right from 2.5 up (recursive doubling's 3 steps against the
 * one-shot's 1 + 2.5).  Over a long link the wire latency goes to alpha
 * alone (fr_tune_link, select.c) and the one-shot wins.
 */
#define FR_MSG_PER_ALPHA 2.5

/* A line's trip among the ranks of one node (fr_tune.line_us) as built in:
 * 8 bytes over shm at n = 2 took 0.28 us (perf/bench/README.md). */
#define FR_LINE_US 0.3
/* Over TCP, what a Rabenseifner step's stream to a new partner loses, as
 * a fraction of its wire time (select.c, "a step's fresh stream"), where
 * no tune file gives it (fr_tune measures it). */
#define FR_TCP_STEP_RAMP 0.03

/* Slots of comm->algo.state[]: one per algorithm with state that outlives
 * a collective. */
enum fr_algo_state_slot { FR_ASTATE_RING, FR_ASTATE_COUNT };

/* Zero-copy steps' receives open at once (xfer.c): an immediate's slot. */
#define FR_ZX_SLOTS 64

/* What the zero-copy steps keep across collectives (xfer.c). */
struct fr_zx_layer {
	/* where reduced steps land before they are reduced: registered once
	 * for remote writes, grown on demand */
	void *stage;
	size_t stage_len;
	struct fr_mem *stage_mem;
	/* the receives whose READY went out, by the slot their writes
	 * name */
	struct fr_zx *rx[FR_ZX_SLOTS];
};

/* The algorithm layer's state in the communicator (comm->algo). */
struct fr_algo_layer {
	int forced; /* FR_ALGO / config: FR_ALGO_AUTO or one algorithm */
	struct fr_tune tune;
	size_t segment_bytes; /* FR_SEGMENT_BYTES: the ring's pipeline unit */
	int slots;	      /* FR_SLOTS: the ring's staging slots */
	void *state[FR_ASTATE_COUNT];
	/* (collective, bytes) whose choice FR_LOG=info has already told */
#define FR_ALGO_LOGGED 32
	struct {
		int coll;
		size_t bytes;
	} logged[FR_ALGO_LOGGED];
	unsigned logged_next;
	/* the last choices of fr_algo_select, while the parameters stand */
#define FR_ALGO_MEMO 8
	struct fr_algo_memo {
		const struct fr_algo *algo; /* NULL: an empty entry */
		int coll, dtype;
		size_t bytes;
	} memo[FR_ALGO_MEMO];
	unsigned memo_next;
	/* the hypercube steps whose pairs share a node (select.c), once
	 * known: bit j for step j */
	bool hc_local_known;
	unsigned hc_local;
	struct fr_zx_layer zx;
	/* the one-shot over lines (ll.c): the communicator's collectives
	 * over lines so far, and the active one's line (header and input) */
	uint64_t ll_seq;
	uint64_t ll_peek_ms; /* the last look at the peers' next lines (ll.c) */
	_Alignas(64) uint8_t ll_line[FR_TP_LINE_MAX];
};

struct fr_algo {
	int id;		  /* fr_algo_t, sent in every message header */
	const char *name; /* for logs */
	int (*start)(struct fr_comm *comm, struct fr_request *req);
	int (*advance)(struct fr_comm *comm, struct fr_request *req,
		       bool *did_work);
	bool (*done)(const struct fr_comm *comm, const struct fr_request *req);
	void (*free)(struct fr_request *req);
	/* The rank the collective waits on now (-1: none), for timeout
	 * messages and to fail at once when it has left (fr_peers_check_gone):
	 * never one whose part is over, which may well have gone. */
	int (*waiting_on)(const struct fr_comm *comm,
			  const struct fr_request *req);
	/*
	 * Optional, for algorithms whose state outlives one collective (the
	 * ring's staging buffers and credits):
	 *   imm_types: immediate types (a bit per enum fr_imm_type, peer.h)
	 *     whose completions on_cqe gets, with the collective running now
	 *     (active, NULL if none) and the sender;
	 *   progress: every round of the engine, collective or not, with
	 *     the collective running now (active, NULL if none);
	 *   comm_free: the communicator is being destroyed.
	 */
	uint32_t imm_types;
	int (*on_cqe)(struct fr_comm *comm, struct fr_request *active, int peer,
		      const struct fr_tp_cqe *cqe);
	int (*progress)(struct fr_comm *comm, struct fr_request *active,
			bool *did_work);
	void (*comm_free)(struct fr_comm *comm);
};

extern const struct fr_algo fr_algo_ring;	   /* allreduce, RS, AG */
extern const struct fr_algo fr_algo_rd;		   /* allreduce         */
extern const struct fr_algo fr_algo_rabenseifner;  /* allreduce         */
extern const struct fr_algo fr_algo_bcast_tree;	   /* broadcast         */
extern const struct fr_algo fr_algo_bcast_chain;   /* broadcast         */
extern const struct fr_algo fr_algo_dissemination; /* barrier          */
extern const struct fr_algo fr_algo_cring;	   /* compressed allreduce */
extern const struct fr_algo fr_algo_hier;	   /* hierarchical allreduce */
extern const struct fr_algo fr_algo_hier_rsag;	   /* hierarchical RS, AG */
extern const struct fr_algo fr_algo_oneshot;	   /* allreduce, one step */
extern const struct fr_algo fr_algo_dbtree;	   /* allreduce, 2 trees */
extern const struct fr_algo fr_algo_reduce_tree;   /* reduce (binomial) */
extern const struct fr_algo fr_algo_reduce_chain;  /* reduce (chain)    */
extern const struct fr_algo fr_algo_pairwise;	   /* alltoall(v)       */
extern const struct fr_algo fr_algo_bruck;	   /* alltoall          */
extern const struct fr_algo fr_algo_bruck_rsag;	   /* log-step RS, AG */
extern const struct fr_algo fr_algo_vring; /* allgatherv, reduce_scatterv */
extern const struct fr_algo fr_algo_ll;	   /* allreduce, bcast, reduce, barrier:
					    * lines */

/* ll.c: the one-shot over lines takes All-Reduces, broadcasts and reduces
 * of up to a line (less its FR_LL_HDR-byte header), and barriers, on at
 * most FR_LL_RANKS_MAX ranks, all on one node, over a transport with lines
 * (fr_peer_line_bytes); beyond that
 * rank count its n - 1 lines a rank cost more than recursive doubling's
 * lg n steps.  fr_ll_fits: whether the collective of bytes is one. */
#define FR_LL_HDR 16
#define FR_LL_RANKS_MAX 8
bool fr_ll_fits(const struct fr_comm *comm, enum fr_coll coll, size_t bytes);

/* The table's hooks for the engine (select.c): an algorithm's completion,
 * every algorithm's progress, and their state freed. */
int fr_algos_on_cqe(struct fr_comm *comm, struct fr_request *active, int peer,
		    const struct fr_tp_cqe *cqe);
int fr_algos_progress(struct fr_comm *comm, struct fr_request *active,
		      bool *did_work);
void fr_algos_comm_free(struct fr_comm *comm);

/* hier.c: the lanes its All-Reduce of bytes runs in over levels levels
 * (1 to 4; 1 below two levels), for the model. */
int fr_hier_lanes(const struct fr_comm *comm, size_t bytes, int levels);

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
/* The one-shot over lines (ll.c) from the parameters alone: an All-Reduce
 * of bytes, or a barrier, on nranks ranks of one node that lines carry
 * (fr_ll_fits says where). */
double fr_model_ll_us(const struct fr_tune *t, int nranks, enum fr_coll coll,
		      size_t bytes, fr_dtype_t dtype);
/* Cost-model parameters for a transport: the built-in defaults, then what
 * FR_TUNE_FILE says.  0, or FR_EINVAL with a message in err. */
int fr_tune_load(struct fr_tune *t, const char *transport, char *err,
		 size_t errlen);
/* A hash of the parameters, which must agree on all ranks. */
uint32_t fr_tune_hash(const struct fr_tune *t);
void fr_tune_oversub(struct fr_comm *comm);
void fr_tune_link(struct fr_comm *comm);
/*
 * For tools that link the internals (fr_tune(1) calibrates the model on
 * the job, fr_step(1) forces an algorithm per phase): the communicator's
 * model parameters, read and replaced, and the algorithm it runs
 * (FR_ALGO_AUTO: the model chooses), replaced; fr_algo_force returns the
 * one before.  Every rank must make the same change between the same
 * collectives.
 */
void fr_tune_get(const struct fr_comm *comm, struct fr_tune *t);
void fr_tune_set(struct fr_comm *comm, const struct fr_tune *t);
int fr_algo_force(struct fr_comm *comm, int algo);

/* fr_peer_need() as a schedule with several peers wants it: 1 connected,
 * 0 still connecting (go on with the others), or the error. */
static inline int fr_algo_peer_ready(struct fr_comm *comm, int peer)
{
	int rc = fr_peer_need(comm, peer);

	return rc == FR_EAGAIN ? 0 : rc ? rc : 1;
}

/*
 * The trees of broadcast and reduce (bcast.c), rooted at root, over ranks
 * relabelled q = (rank - root) mod n: binomial (q's parent is q with its
 * lowest set bit cleared, its children q + 2^j for every 2^j below that
 * bit, largest subtree first) or chain (q - 1 and q + 1).  *parent is -1
 * at the root; child[] needs FR_TREE_MAX_CHILDREN entries.
 */
#define FR_TREE_MAX_CHILDREN 32
void fr_tree_shape(int n, int rank, int root, bool chain, int *parent,
		   int *child, int *nchild);

/*
 * The double binary tree's trees (dbtree.c): rank's parent (-1 at the root)
 * and children (at most 2, in fold order) in tree 0 (the in-order binary
 * tree rooted at rank 0) or tree 1 (tree 0 mirrored where n is even,
 * shifted by one where odd).
 */
void fr_dbtree_shape(int n, int rank, int tree, int *parent, int *child,
		     int *nchild);

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
	/* carried in every fragment's aux and checked on receipt: 0, or
	 * fr_xfer_len_tag(len) where the two sides size the transfer from
	 * their own counts (the v-collectives), so that a disagreement is
	 * FR_EMISMATCH, not a wait for fragments that never come */
	uint32_t aux;
};
void fr_xfer_init(struct fr_xfer *x, const struct fr_comm *comm, size_t len);
uint32_t fr_xfer_len_tag(size_t len);
static inline bool fr_xfer_complete(const struct fr_xfer *x)
{
	return x->done >= x->nfrags;
}
/* Bytes covered by the first `frags` fragments. */
size_t fr_xfer_bytes(const struct fr_comm *comm, const struct fr_xfer *x,
		     uint32_t frags);
/* One DATA fragment of len bytes at src, at byte offset off of the step:
 * 0 once sent (*done counted up), FR_EAGAIN (no free slot), or the error
 * that failed the communicator. */
int fr_xfer_send_frag(struct fr_comm *comm, const struct fr_request *req,
		      int rank, uint16_t step, uint64_t off, const void *src,
		      size_t len, uint32_t *done, bool *did_work);
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
 * A step's data written zero copy (xfer.c, "Zero-copy steps"): the
 * receiver names where it goes in a READY message, the sender writes it
 * there straight from its own buffer in segments of FR_SEGMENT_BYTES, each
 * a write-with-immediate the receiver counts.  For steps of fr_zx_min()
 * bytes or more, where the mailbox's fragments (a copy on each side, and
 * a window of FR_MBX_SLOTS payloads a round trip) cost more than the
 * READY's extra latency.
 */
struct fr_zx {
	int peer;
	uint16_t step;
	size_t len;
	/* the chunk of [0, len) the last READY covers: the receiver names a
	 * chunk at a time where its area is smaller than the step */
	size_t chunk_start, chunk_end;
	/* receiving: a READY is out and its chunk not all in; bytes and
	 * writes landed (in order) */
	bool posted;
	int slot;
	size_t arrived;
	uint32_t segs;
	/* sending: the chunk's READY came, naming dest (id: its slot); bytes
	 * posted; wrote: a write went out (the engine waits for them) */
	bool have_dest, wrote;
	struct fr_tp_rkey dest;
	uint64_t dest_off;
	uint32_t id;
	size_t sent;
	uint32_t segs_sent;
};
/* The largest chunk a staging area holds: a step longer than this is
 * received a chunk at a time (a READY each), so that the area a
 * communicator keeps pinned stays this size whatever the collectives'. */
#define FR_ZX_STAGE_MAX (16u << 20)
/* The smallest step sent zero copy where a mailbox payload is
 * payload_max bytes: a full window of fragments, and at least 64 KiB. */
static inline size_t fr_zx_min(size_t payload_max)
{
	size_t w = (size_t)FR_MBX_SLOTS * payload_max;

	return w > (64u << 10) ? w : (64u << 10);
}
/* Does a step of len bytes go zero copy on this communicator?  The same
 * answer on every rank for the same len. */
bool fr_zx_use(const struct fr_comm *comm, size_t len);
/* The staging area for received steps that are reduced: at least len
 * bytes at comm->algo.zx.stage (0, or FR_ENOMEM / the registration's
 * error).  Only between collectives' steps: no READY may name it. */
int fr_zx_stage(struct fr_comm *comm, size_t len);
/* Receive the next chunk of a step of len bytes from peer, at most chunk
 * bytes from byte z->arrived on, into mem's bytes from off: send its READY
 * (0 also while the mailbox is full: call again), then count the writes
 * (fr_zx_on_cqe) until z->arrived reaches z->chunk_end; call again for
 * the next chunk once this one's bytes are used.  Complete once
 * z->arrived == len. */
int fr_zx_recv(struct fr_comm *comm, const struct fr_request *req,
	       struct fr_zx *z, int peer, uint16_t step, struct fr_mem *mem,
	       size_t off, size_t len, size_t chunk, bool *did_work);
/* Send len bytes of mem from off to peer, each chunk once its READY for
 * step has come: 0 (also while waiting) or the error.  Complete once
 * z->sent == len (the writes are the engine's to wait for:
 * fr_peer_write's user). */
int fr_zx_send(struct fr_comm *comm, const struct fr_request *req,
	       struct fr_zx *z, int peer, uint16_t step, struct fr_mem *mem,
	       size_t off, size_t len, bool *did_work);
static inline bool fr_zx_recv_done(const struct fr_zx *z)
{
	return z->len && z->arrived == z->len;
}
static inline bool fr_zx_send_done(const struct fr_zx *z)
{
	return z->len && z->sent == z->len;
}
/* A transfer before its first use (fr_zx_recv / fr_zx_send). */
void fr_zx_reset(struct fr_zx *z);
/* Forget a receive (its slot freed): before the state holding z goes. */
void fr_zx_cancel(struct fr_comm *comm, struct fr_zx *z);
/* A FR_IMM_ZX write landed (the algorithms' on_cqe for that type). */
int fr_zx_on_cqe(struct fr_comm *comm, struct fr_request *active, int peer,
		 const struct fr_tp_cqe *cqe);
void fr_zx_comm_free(struct fr_comm *comm);

/*
 * A step's data over nb blocks at scattered addresses (xfer.c): the bytes
 * [lo, lo + len) of each, as fragments of at most a mailbox payload that
 * hold whole blocks or part of one, so that each is read from and written
 * to its block's own address, with no staging buffer for a large one (an
 * empty step is one empty message).  Headers carry the offset in the packed
 * blocks (stride bytes each), which the receiver checks against its schedule
 * (FR_EPROTO).
 */
struct fr_bx {
	size_t stride, lo, len;
	uint32_t nb;
	uint32_t per;	       /* fragments per block (large blocks) */
	uint32_t bpf;	       /* blocks per fragment (small blocks) */
	uint32_t nfrags, done; /* fragments in all / sent or received */
	uint8_t *bounce;       /* where small blocks are packed to send */
	uint32_t packed;       /* the fragment bounce holds (a full window
				* leaves it there for the next try) */
};
/* Set x up for a step (x->bounce kept: fr_bx_release frees it).  Blocks
 * of a payload or less travel whole, as many to a message as fit (packed
 * on the way out, so that a step of many small blocks is a few messages,
 * not one a block); larger ones in fragments of a payload. */
void fr_bx_init(struct fr_bx *x, const struct fr_comm *comm, size_t stride,
		size_t lo, size_t len, int nb);
void fr_bx_release(struct fr_bx *x);
static inline bool fr_bx_complete(const struct fr_bx *x)
{
	return x->done >= x->nfrags;
}
/* Send the next fragments to rank, block b's from src[b] (the segment's
 * start in it): 0 (also while slots are full) or the error. */
int fr_bx_send(struct fr_comm *comm, const struct fr_request *req,
	       struct fr_bx *x, int rank, uint16_t step,
	       const uint8_t *const *src, bool *did_work);
/* Take the fragments that came from rank: dst[b] = a[b] OP fragment with
 * kern, else a copy.  0 (also while none is there) or the error. */
int fr_bx_take(struct fr_comm *comm, const struct fr_request *req,
	       struct fr_bx *x, int rank, uint16_t step, uint8_t *const *dst,
	       const uint8_t *const *a, fr_reduce_fn kern, size_t es,
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
	/* the step's directions zero copy (fr_zx_use), their transfers, the
	 * received bytes reduced so far, and the registrations of the input
	 * (imem, where it is not buf) and of buf, taken on first use */
	bool ztx, zrx;
	struct fr_zx zt, zr;
	size_t zdone;
	bool zwrote; /* zero-copy writes went out: done waits for them */
	struct fr_mem *imem, *bmem;
	const uint8_t *in; /* the input */
};
/* Fill hc for req, start the connections of the schedule (the fold
 * partner, and the partner of every hypercube dimension). */
int fr_hc_start(struct fr_comm *comm, struct fr_request *req, struct fr_hc *hc);
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
/* The algorithms' free: registrations released, a receive cancelled. */
void fr_hc_free(struct fr_request *req);
int fr_hc_waiting_on(const struct fr_comm *comm, const struct fr_request *req);
/* req->algo_state = size zeroed bytes: inside the request when they fit
 * (FR_ALGO_INLINE: a small collective allocates nothing), else from the
 * heap.  NULL when out of memory. */
void *fr_algo_state_new(struct fr_request *req, size_t size);
/* Release what fr_algo_state_new gave (or a calloc'ed algo_state). */
void fr_algo_free_state(struct fr_request *req);

#endif
