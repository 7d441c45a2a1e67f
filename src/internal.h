/* SPDX-License-Identifier: MIT */
/*
 * internal.h - the communicator, composed of the state each layer owns.
 *
 * The library is built in layers, each calling only the ones below it
 * (doc/architecture.md has the picture; scripts/check-layers.py proves
 * from the objects' symbols that no two files call each other):
 *
 *   entry points   comm.c coll.c buckets.c      the public API, the lock taken
 *                  sendrecv.c split.c recover.c
 *   engine         progress.c request.c lock.c  requests, progress, the lock,
 *                  p2p.c                        point-to-point
 *   algorithms     src/algo/                    schedules behind struct fr_algo
 *   recovery       agree.c                      fault-tolerant agreement
 *   peers          peer.c                       connections, mailboxes,
 *                                               liveness, failure and abort
 *   memory         mem.c                        registrations, cache, scratch
 *   transports     transport.c transports/      the interface of transport.h
 *   base           errors.c log.c util.c ...    no communicator state
 *
 * Each layer's state is a sub-struct declared in its own header (mem.h,
 * peer.h, topo.h, algo/algo.h, engine.h) and written only by that layer;
 * layers above may read it.  What every layer shares is here: the
 * communicator's identity, its transport endpoint, its counters and its
 * last error, and the description of one collective (struct fr_request),
 * which the engine queues, an algorithm runs and the peers stamp on every
 * message.
 */
#ifndef FR_INTERNAL_H
#define FR_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fastreduce.h"
#include "transport.h"
#include "util.h"

/* The lowest FR_E* code (the codes are -1 .. -n, test_errors checks):
 * a code on the wire below it is not one of ours. */
#define FR_ERRNO_ONE_(name, val, msg) +1
#define FR_ERRNO_LOWEST (-(0 FR_ERRNO_MAP(FR_ERRNO_ONE_)))
#define FR_DEFAULT_TIMEOUT_MS 30000
#define FR_DEFAULT_SEGMENT (512u * 1024u)
#define FR_DEFAULT_SLOTS 8
#define FR_MAX_SLOTS 64
#define FR_DEFAULT_REGCACHE 64
#define FR_DEFAULT_SPIN_US 50

struct fr_comm;

/* every layer's state and interface (the order is clang-format's) */
#include "agree.h"
#include "algo/algo.h"
#include "engine.h"
#include "mem.h"
#include "peer.h"
#include "topo.h"

enum fr_req_state { FR_REQ_QUEUED, FR_REQ_ACTIVE, FR_REQ_DONE };

struct fr_algo; /* algo/algo.h */

#define FR_ALGO_INLINE 256
struct fr_request {
	struct fr_comm *comm;
	struct fr_request *next; /* comm->queue */
	enum fr_req_state state;
	int result;
	uint32_t seq;
	enum fr_coll coll;
	const void *sendbuf; /* FR_IN_PLACE when in place */
	void *recvbuf;
	size_t count; /* elements on the wire: see fr_coll_count_total */
	fr_dtype_t dtype;
	fr_op_t op;
	int root;
	int forced;	 /* algorithm asked for (FR_ALGO_AUTO: choose) */
	int compress;	 /* fr_compress_t of f32 All-Reduce data on the wire */
	float *residual; /* error feedback (count floats) or NULL */
	/* the v-collectives' counts and displacements in elements, copied
	 * from the caller (FR_VEC_*: nranks each), owned by the request */
	size_t *vec;
	/* a point-to-point send or receive (p2p.c), not a collective:
	 * kept in comm->eng.p2p, not the collectives' queue */
	struct fr_p2p_req p2p;
	const struct fr_algo *algo;
	void *algo_state;
	/* Last, and not copied from the template (fr_req_submit): where a
	 * small algorithm state lives (fr_algo_state_new), so that a small
	 * collective allocates nothing. */
	_Alignas(16) unsigned char algo_inline[FR_ALGO_INLINE];
};
#define FR_REQ_HEAD offsetof(struct fr_request, algo_inline)
/* The arrays in req->vec, nranks entries each. */
enum { FR_VEC_SCOUNTS, FR_VEC_SDISPLS, FR_VEC_RCOUNTS, FR_VEC_RDISPLS };
static inline const size_t *fr_req_vec(const struct fr_request *req, int which,
				       int nranks)
{
	return req->vec + (size_t)which * (size_t)nranks;
}

/* The collective's name, for messages (errors.c). */
const char *fr_coll_name(enum fr_coll coll);

/* Settings after config, environment and defaults (comm.c). */
struct fr_settings {
	int rank, nranks;
	char rendezvous[300];
	char transport[32];
	char token[257]; /* FR_BOOT_TOKEN_MAX + 1 */
	bool has_token;
	long timeout_ms;
	long boot_timeout_ms; /* the rendezvous's (FR_BOOT_TIMEOUT_MS) */
	size_t segment_bytes;
	long slots, regcache, spin_us, slow_timeout_ms;
	int algo;
	size_t eager_bytes;
	int progress;
	int cpu_mode; /* FR_PROGRESS_CPU: enum fr_cpu_mode */
	cpu_set_t cpus;
	bool ring_by_rank;
	long ll; /* FR_LL: small messages by write_inline (peer.c) */
	int grid[FR_TOPO_MAX_DIMS], ngrid; /* FR_TOPO: a grid of nodes */
};

struct fr_comm {
	int rank, nranks;
	/* a communicator split from another (split.c): its id on the shared
	 * endpoint (0: the job's own) and this rank's rank in the job */
	int id, job_rank;
	const struct fr_tp_ops *tp_ops;
	struct fr_tp *tp;
	uint64_t job_nonce;

	/* each written only by its owner (the header named) */
	struct fr_mem_layer mem;   /* mem.h: registrations, cache */
	struct fr_peer_layer peer; /* peer.h: connections, liveness */
	struct fr_fail fail;	   /* peer.h: failure and abort */
	struct fr_agree agr;	   /* agree.h: fault-tolerant agreement */
	struct fr_topo topo;	   /* topo.h: nodes, the ring's order */
	struct fr_algo_layer algo; /* algo/algo.h: choice, model, state */
	struct fr_engine eng;	   /* engine.h: the request queue */
	struct fr_threads thr;	   /* engine.h: lock, progress thread */

	fr_stats_t stats;
	char errmsg[FR_ERRMSG_MAX];
	/* what the job's communicator was made with (inherited by those split
	 * from it): fr_comm_grow makes the grown one alike */
	struct fr_settings recipe;
};

/* Total elements a collective's data spans on every rank (the full vector
 * for reduce-scatter and all-gather: nranks blocks). */
static inline size_t fr_coll_count_total(const struct fr_request *req)
{
	/* the v-collectives' count is already the total (coll.c) */
	if (req->coll == FR_COLL_REDUCE_SCATTER ||
	    req->coll == FR_COLL_ALLGATHER || req->coll == FR_COLL_ALLTOALL)
		return req->count * (size_t)req->comm->nranks;
	return req->count;
}

/* errors.c: a split communicator's messages say which it is: append
 * " [communicator ID: rank R of N, job rank J]" to comm->errmsg. */
void fr_comm_errmsg_tag(struct fr_comm *comm);
/* errors.c: set the communicator's last error message; returns err. */
int fr_comm_seterr(struct fr_comm *comm, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* coll.c: refuse this rank's call (coll.c's top comment says why the
 * communicator fails on every rank); returns err. */
int fr_refuse(struct fr_comm *comm, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* comm.c: a mailbox slot's bytes, header included, on a job of nranks
 * with FR_EAGER_BYTES eager (0: the default, sized by the job); what a
 * communicator of that size gets, for the tools that model jobs they do
 * not run (fr_step's projections). */
size_t fr_mbx_slot_size(int nranks, size_t eager);

/* comm.c: the layout of the nodes (struct fr_topo) from each rank's node
 * id and online CPUs (0: unknown); what the rendezvous filled in, freed. */
int fr_comm_nodes_take(struct fr_comm *c, const uint64_t *ids,
		       const uint16_t *cpus);
void fr_comm_free_cards(struct fr_comm *c);

/*
 * comm.c: a whole job of n communicators in this process, without a
 * rendezvous, for what simulates or tests a job in one process (perf/sim,
 * the unit tests): comms[r] is rank r, on node node_ids[r] (NULL: all on
 * this host; the cards say no CPU count, so the model never takes the
 * job for processes oversubscribing this host).  cfg as for
 * fr_comm_create but for rank, nranks and rendezvous, which it ignores;
 * its transport must connect endpoints of this process (the tests' fake,
 * the simulator's).  0, or an error that fr_comm_last_error(NULL)
 * explains, with nothing left behind.  Not exported.
 * fr_comm_destroy_local destroys such a job (or any n communicators of
 * this process that talk only among themselves) from one thread;
 * fr_comm_destroy on each would wait out every goodbye.
 */
int fr_comm_create_local(const fr_config_t *cfg, int n,
			 const uint64_t *node_ids, fr_comm_t **comms);
int fr_comm_destroy_local(int n, fr_comm_t **comms);

/*
 * split.c, for fr_comm_shrink (recover.c), without the parent's lock: a
 * new communicator's state and mailbox before its group is known, and its
 * mailbox's key (kl bytes); undone (keep: a peer may have the key, so the
 * mailbox stays until the endpoint closes); made, for members (parent
 * ranks, ascending), with id and each member's key (keys[i]).  On
 * failure fr_split_make has undone c.
 */
int fr_split_early(struct fr_comm *parent, size_t kl, struct fr_comm **out,
		   uint8_t *key);
void fr_split_early_undo(struct fr_comm *parent, struct fr_comm *c, bool keep);
int fr_split_make(struct fr_comm *parent, const int *members, int n, int id,
		  const uint8_t *const *keys, size_t kl, struct fr_comm *c,
		  fr_comm_t **out);

/* coll.c: fr_iallreduce_ex() with the lock held (buckets.c). */
int fr_iallreduce_locked(struct fr_comm *comm, const void *sendbuf,
			 void *recvbuf, size_t count, fr_dtype_t dtype,
			 fr_op_t op, const fr_coll_opts_t *opts,
			 fr_request_t **req);

#endif
