/* SPDX-License-Identifier: MIT */
/*
 * fastreduce.h - the public interface of libfastreduce.
 *
 * libfastreduce All-Reduces CPU-memory buffers (gradients) between the ranks
 * of a data-parallel job, over RDMA verbs or, where no RDMA device is usable,
 * TCP.  This header is the whole public interface; everything else in the
 * library is private.
 *
 * Conventions
 *   - Handles are opaque: fr_comm_t (a communicator, one per rank and job),
 *     fr_mem_t (a buffer registered once and reused), fr_request_t (a
 *     non-blocking collective in flight).
 *   - Every function that can fail returns 0 on success or a negative FR_E*
 *     code.  fr_strerror() turns a code into text; fr_comm_last_error() gives
 *     the communicator's own message for its most recent failure, naming the
 *     rank or peer involved.
 *   - Destroying or freeing a NULL handle is a no-op that returns 0.
 *   - Configuration structs start with their own size so that later versions
 *     can append fields without breaking binaries built against this one:
 *     always fill them with fr_config_init() / set .size = sizeof(...).
 *   - Threads: every call on a communicator (and on its fr_mem_t,
 *     fr_request_t and fr_buckets_t) takes the communicator's lock, so
 *     several application threads may share one communicator; a request
 *     is completed (fr_test, fr_wait) by one thread only.  With a progress
 *     thread (fr_config_t.progress, FR_PROGRESS=thread) collectives also
 *     advance while no thread is inside the library.  Different
 *     communicators are independent.  See fastreduce(7), THREADS.
 *   - Collectives on one communicator run in the order they were started,
 *     and every rank must start the same collectives in the same order with
 *     the same count, datatype, operation and root.  Ranks that do not get
 *     FR_EMISMATCH (never a hang and never wrong numbers).
 *
 * See fastreduce(7) for an overview and one man page per function in man3.
 */
#ifndef FASTREDUCE_H
#define FASTREDUCE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && defined(FR_BUILDING_LIBRARY)
#define FR_API __attribute__((visibility("default")))
#else
#define FR_API
#endif

/* ---- version ----------------------------------------------------------- */

#define FR_VERSION_MAJOR 0
#define FR_VERSION_MINOR 1
#define FR_VERSION_PATCH 0
#define FR_VERSION_STRING "0.1.0"
/* One number that grows with every release: 0xMMmmpp. */
#define FR_VERSION_NUMBER                                                      \
	((FR_VERSION_MAJOR << 16) | (FR_VERSION_MINOR << 8) | FR_VERSION_PATCH)

/* The version of the library actually loaded ("0.1.0"). */
FR_API const char *fr_version(void);
/* The same as a number, comparable with FR_VERSION_NUMBER. */
FR_API unsigned fr_version_number(void);

/* ---- errors ------------------------------------------------------------ */

/*
 * X(NAME, value, message).  One table makes the codes, fr_strerror() and
 * fr_errname(); codes are negative and stable across releases.
 */
#define FR_ERRNO_MAP(X)                                              \
	X(EINVAL, -1, "invalid argument")                            \
	X(ENOMEM, -2, "out of memory")                               \
	X(ENODEV, -3, "no usable transport device")                  \
	X(ETIMEDOUT, -4, "timed out waiting for a peer")             \
	X(EMISMATCH, -5,                                             \
	  "ranks called the collective with different arguments")    \
	X(EPEER, -6, "a peer failed or closed its connection")       \
	X(EBOOTSTRAP, -7, "rendezvous with the other ranks failed")  \
	X(EPROTO, -8, "malformed or unexpected message from a peer") \
	X(ESYS, -9, "system call failed")                            \
	X(EAGAIN, -10, "operation not complete yet")                 \
	X(ENOTSUP, -11, "operation not supported")                   \
	X(EBUSY, -12, "resource is in use")                          \
	X(EAUTH, -13, "peer presented the wrong job token")          \
	X(ERANGE, -14, "access outside a registered region")         \
	X(EREVOKED, -15, "the communicator was revoked")

enum fr_errno {
	FR_OK = 0,
#define FR_ERRNO_ENUM_(name, val, msg) FR_##name = (val),
	FR_ERRNO_MAP(FR_ERRNO_ENUM_)
#undef FR_ERRNO_ENUM_
};

/* Static text for a code ("invalid argument"); never NULL. */
FR_API const char *fr_strerror(int err);
/* The code's name ("FR_EINVAL"); never NULL. */
FR_API const char *fr_errname(int err);

/* ---- datatypes and operations ----------------------------------------- */

typedef enum fr_dtype {
	FR_F32 = 0,  /* float */
	FR_F64 = 1,  /* double */
	FR_F16 = 2,  /* IEEE binary16, as uint16_t bits */
	FR_BF16 = 3, /* bfloat16, as uint16_t bits */
	FR_I8 = 4,
	FR_U8 = 5,
	FR_I32 = 6,
	FR_U32 = 7,
	FR_I64 = 8,
	FR_U64 = 9,
	FR_DTYPE_COUNT
} fr_dtype_t;

/*
 * FR_AVG is the sum divided by the number of ranks; floating types only.
 * f16 and bf16 are reduced through float and rounded to nearest-even after
 * every step, as NCCL does.  Integer sums and products wrap (two's
 * complement) like unsigned arithmetic.
 */
typedef enum fr_op {
	FR_SUM = 0,
	FR_PROD = 1,
	FR_MIN = 2,
	FR_MAX = 3,
	FR_AVG = 4,
	FR_OP_COUNT
} fr_op_t;

/* Size in bytes of one element, or 0 for an invalid dtype. */
FR_API size_t fr_dtype_size(fr_dtype_t dtype);
/* "f32", "bf16", ... ("?" if invalid). */
FR_API const char *fr_dtype_name(fr_dtype_t dtype);
/* "sum", "prod", "min", "max", "avg" ("?" if invalid). */
FR_API const char *fr_op_name(fr_op_t op);
/* Parse a name as printed above (also "float", "double", "half",
 * "bfloat16", "int32", ...).  Returns 0 or FR_EINVAL. */
FR_API int fr_dtype_from_name(const char *name, fr_dtype_t *dtype);
FR_API int fr_op_from_name(const char *name, fr_op_t *op);

/* ---- algorithms ------------------------------------------------------- */

/*
 * Collective algorithms.  FR_ALGO_AUTO (the default) picks one per call
 * from a cost model (see fastreduce(7), fr_tune(1)); any other value forces
 * that algorithm for the collectives that have it (others still choose).
 *   ring          bandwidth-optimal pipelined ring: All-Reduce,
 *                 reduce-scatter, all-gather; a pipelined chain for broadcast
 *   rd            recursive doubling All-Reduce (latency-optimal); for
 *                 broadcast the binomial tree
 *   rabenseifner  recursive-halving reduce-scatter + recursive-doubling
 *                 all-gather All-Reduce (medium sizes)
 *   tree          binomial-tree broadcast
 *   dissemination the barrier
 *   hier          two-level All-Reduce for ranks on several nodes with the
 *                 same number of ranks on each (more than one): reduce-
 *                 scatter within each node, All-Reduce of each piece across
 *                 the nodes, all-gather within each node; two-level
 *                 reduce-scatter (within the node, then across nodes) and
 *                 all-gather (across nodes, then within the node) too
 *   oneshot       every rank sends its vector to every other and reduces
 *                 all of them itself: All-Reduce in one step (small
 *                 vectors, few ranks, long links)
 *   pairwise      all-to-all (and all-to-allv): every rank exchanges its
 *                 block with every other directly, rank + k and rank - k
 *                 at step k (large blocks)
 *   bruck         all-to-all in ceil(lg n) steps, blocks forwarded through
 *                 intermediate ranks (small blocks, many ranks)
 * Reduce to a root runs the binomial tree (tree, small vectors) or a
 * pipelined chain (ring, large ones); all-gatherv and reduce-scatterv the
 * ring.
 */
typedef enum fr_algorithm {
	FR_ALGO_AUTO = 0,
	FR_ALGO_RING = 1,
	FR_ALGO_RD = 2,
	FR_ALGO_RABENSEIFNER = 3,
	FR_ALGO_TREE = 4,
	FR_ALGO_DISSEMINATION = 5,
	FR_ALGO_HIER = 6,
	FR_ALGO_ONESHOT = 7,
	FR_ALGO_PAIRWISE = 8,
	FR_ALGO_BRUCK = 9,
	FR_ALGO_COUNT
} fr_algo_t;

/* "auto", "ring", "rd", "rabenseifner", "tree", "dissemination", "hier",
 * "oneshot", "pairwise", "bruck" ("?"). */
FR_API const char *fr_algo_name(int algo);
/* Parse such a name (also "recursive_doubling"); 0 or FR_EINVAL. */
FR_API int fr_algo_from_name(const char *name, fr_algo_t *algo);

/* ---- compression on the wire -------------------------------------------- */

/*
 * How f32 data of an All-Reduce travels (fr_coll_opts_t.compress).  The
 * reduction itself is done in f32 at every step; only what crosses the wire
 * is narrowed, and every rank ends with identical bits.
 *   none  f32 as is
 *   bf16  bfloat16, round to nearest even (same range as f32)
 *   fp16  IEEE binary16, round to nearest even (|x| > 65504 becomes inf)
 *   int8  blocks of FR_INT8_BLOCK values: one f32 scale (max |x| / 127)
 *         and one signed byte per value; a block holding inf or NaN
 *         arrives as NaN
 */
typedef enum fr_compress {
	FR_COMPRESS_NONE = 0,
	FR_COMPRESS_BF16 = 1,
	FR_COMPRESS_FP16 = 2,
	FR_COMPRESS_INT8 = 3,
	FR_COMPRESS_COUNT
} fr_compress_t;

#define FR_INT8_BLOCK 256

/* "none", "bf16", "fp16", "int8" ("?"). */
FR_API const char *fr_compress_name(int compress);
/* Parse such a name (also "fp32"/"f32" for none, "f16"/"half"); 0 or
 * FR_EINVAL. */
FR_API int fr_compress_from_name(const char *name, fr_compress_t *compress);
/* Wire bytes of count f32 values in that format (for estimates). */
FR_API size_t fr_compress_bytes(int compress, size_t count);

/* ---- communicators ------------------------------------------------------ */

typedef struct fr_comm fr_comm_t;
typedef struct fr_mem fr_mem_t;
typedef struct fr_request fr_request_t;

/*
 * Communicator settings.  Zero / NULL fields take their value from the
 * environment variable named in the comment, else the default.
 */
typedef struct fr_config {
	size_t size;            /* sizeof(fr_config_t): set by fr_config_init() */
	int rank;               /* 0..nranks-1 (fr_comm_create only)          */
	int nranks;             /* number of ranks (fr_comm_create only)      */
	const char *rendezvous; /* "host:port" where rank 0 serves the rendezvous
				 * (fr_comm_create only; FR_RENDEZVOUS)        */
	const char *transport;  /* "auto", "tcp", "shm", "verbs"; FR_TRANSPORT */
	const char *job_token;  /* shared secret; FR_JOB_TOKEN, none          */
	int timeout_ms;         /* peer timeout; FR_TIMEOUT_MS, 30000         */
	size_t segment_bytes;   /* pipeline segment; FR_SEGMENT_BYTES, 512 KiB*/
	int slots;              /* staging slots per peer; FR_SLOTS, 8        */
	int regcache_entries;   /* registration cache bound; FR_REGCACHE_MAX, 64 */
	int algo;               /* fr_algo_t to force; FR_ALGO, auto          */
	int progress;           /* fr_progress_t; FR_PROGRESS, caller         */
} fr_config_t;

/*
 * Who advances collectives (fr_config_t.progress, FR_PROGRESS):
 *   caller  the application's calls into the library (fr_test, fr_wait,
 *           fr_progress, any call on the communicator); the default
 *   thread  also a progress thread of the communicator, so that a
 *           non-blocking collective completes while the application
 *           computes; it sleeps in the transport's wait when nothing
 *           arrives, and runs where FR_PROGRESS_CPU (a CPU list such as
 *           "3" or "2-3") puts it, else inherits the creating thread's
 *           binding.
 */
typedef enum fr_progress_mode {
	FR_PROGRESS_DEFAULT = 0, /* FR_PROGRESS, else caller */
	FR_PROGRESS_CALLER = 1,
	FR_PROGRESS_THREAD = 2,
} fr_progress_t;

/* Fill cfg with its size and "take everything from the environment". */
FR_API void fr_config_init(fr_config_t *cfg);

/*
 * Create a communicator with an explicit rank, size and rendezvous address
 * (collective: every rank of the job calls it).  Blocks until all ranks have
 * met and the ring neighbours are connected, or the timeout passes.
 */
FR_API int fr_comm_create(const fr_config_t *cfg, fr_comm_t **comm);

/*
 * Create a communicator from the environment of the launcher: frrun
 * (FR_RANK, FR_NRANKS, FR_RENDEZVOUS), Open MPI (OMPI_COMM_WORLD_RANK/SIZE),
 * MPICH/Hydra (PMI_RANK/PMI_SIZE), Slurm srun (SLURM_PROCID/SLURM_NTASKS) or
 * torchrun (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT).  cfg may be NULL; its
 * rank, nranks and rendezvous are ignored.  See fr_comm_create_from_env(3)
 * for how the rendezvous address is found.
 */
FR_API int fr_comm_create_from_env(const fr_config_t *cfg, fr_comm_t **comm);

/*
 * Release everything the communicator holds (connections, registrations,
 * requests).  Requests still in flight are abandoned.  NULL is a no-op.
 */
FR_API int fr_comm_destroy(fr_comm_t *comm);

/*
 * Revoke comm (as ULFM's MPI_Comm_revoke): not collective; every pending
 * and later call on comm fails at once with FR_EREVOKED, on this rank when
 * it returns (it may take up to 5 s to reach ranks never talked to) and on
 * every other rank as the notice reaches it (within a round trip,
 * whatever call each is blocked in).  On a communicator that had already
 * failed, this rank's calls go on returning that failure's code; the
 * revoke notice still goes to every rank.  Sub-communicators made from comm are
 * not revoked.  Safe from any thread, also while another waits on comm.  0, or
 * FR_EINVAL for NULL.  See fr_comm_revoke(3).
 */
FR_API int fr_comm_revoke(fr_comm_t *comm);

/*
 * Agree (as ULFM's MPI_Comm_agree): collective over the ranks of comm that
 * are alive, and fault-tolerant: it completes although ranks fail before
 * or during it, and works on a failed or revoked communicator.  Every
 * surviving rank gets the same *flags (the bitwise AND of the values the
 * survivors passed in *flags) and the same code: 0, or FR_EPEER when ranks
 * of comm have failed (fr_comm_failed names them; the communicator then
 * fails, if it had not).  A rank the others counted as failed (it answered
 * nothing for FR_TIMEOUT_MS) gets FR_EPEER and finds itself among them.
 * FR_EINVAL for NULL.  See fr_comm_agree(3).
 */
FR_API int fr_comm_agree(fr_comm_t *comm, uint32_t *flags);

/*
 * The ranks of comm known to have failed, ascending: up to max of them in
 * ranks, how many in all in *nfailed.  After fr_comm_agree, the set it
 * agreed on (the same on every survivor), plus any found failed after it
 * returned.
 * 0, or FR_EINVAL.  See fr_comm_failed(3).
 */
FR_API int fr_comm_failed(fr_comm_t *comm, int *ranks, int max, int *nfailed);

/*
 * Shrink (as ULFM's MPI_Comm_shrink): collective over the surviving ranks
 * of comm, fault-tolerant as fr_comm_agree.  *newcomm is a communicator of
 * the ranks that have not failed, in their order in comm, over the same
 * endpoint and connections (as fr_comm_split's); works on a failed or
 * revoked comm, which stays as it is (destroy it).  Ranks that fail during
 * the shrink are left out (it agrees again).  0, FR_EPEER when this rank
 * was counted as failed or ranks kept failing, FR_EBUSY with no
 * communicator id left, FR_ENOMEM, FR_EINVAL for NULL.  See
 * fr_comm_shrink(3).
 */
FR_API int fr_comm_shrink(fr_comm_t *comm, fr_comm_t **newcomm);

/*
 * Grow (re-admission): collective over the ranks of comm and nnew
 * newcomers, processes that call fr_comm_join (or fr_comm_create_from_env
 * with FR_JOIN=1, as frrun --respawn starts them).  *newcomm has
 * comm->nranks + nnew ranks: comm's, in their order, then the newcomers in
 * the order they reached comm's rank 0, which listens for them at
 * FR_GROW_RENDEZVOUS, else at the job's rendezvous address, for up to the
 * timeout.  New connections; comm stays as it is (destroy it).  0,
 * FR_ETIMEDOUT on every rank of comm when not all newcomers came,
 * FR_EINVAL (nnew < 1, NULL), or what creating a communicator returns.
 * See fr_comm_grow(3).
 */
FR_API int fr_comm_grow(fr_comm_t *comm, int nnew, fr_comm_t **newcomm);

/*
 * Join a running job as a newcomer of its next fr_comm_grow: take a rank
 * from the grow's leader at cfg->rendezvous, else FR_GROW_RENDEZVOUS, else
 * the job's rendezvous address from the launcher's environment (waiting
 * for it up to FR_SLOW_TIMEOUT_MS), then create the communicator with the
 * others.  cfg may be NULL; its rank and nranks are ignored.  The
 * failures of fr_comm_create; fr_comm_last_error(NULL) says why.  See
 * fr_comm_grow(3).
 */
FR_API int fr_comm_join(const fr_config_t *cfg, fr_comm_t **newcomm);

/*
 * Sub-communicators.  fr_comm_split is collective over comm: the ranks that
 * pass the same color (>= 0) form a new communicator, ordered by (key,
 * rank in comm); a rank passing FR_UNDEFINED gets *newcomm = NULL.
 * fr_comm_dup is fr_comm_split(comm, 0, rank).  A new communicator shares
 * comm's endpoint and connections (no new rendezvous), and has its own
 * sequence numbers, mismatch checks, progress, lock and error state;
 * communicators may be destroyed in any order, comm first included.  Ranks
 * in the same communicator must not split or dup two communicators at
 * once from two threads (collectives on different communicators may run
 * at once from different threads).  See fr_comm_split(3).
 */
#define FR_UNDEFINED (-1)
FR_API int fr_comm_split(fr_comm_t *comm, int color, int key,
			 fr_comm_t **newcomm);
FR_API int fr_comm_dup(fr_comm_t *comm, fr_comm_t **newcomm);

FR_API int fr_comm_rank(const fr_comm_t *comm);
FR_API int fr_comm_size(const fr_comm_t *comm);
/* "tcp", "shm" or "verbs". */
FR_API const char *fr_comm_transport(const fr_comm_t *comm);

/*
 * The message of the communicator's most recent error ("" if none), e.g.
 * "rank 2: peer rank 3 closed the connection, died or became unreachable".
 * Valid until the next call on the communicator.  NULL comm gives the message of this thread's
 * last fr_comm_create*() call ("" if it succeeded).
 */
FR_API const char *fr_comm_last_error(const fr_comm_t *comm);

/*
 * Counters.  Set stats->size = sizeof(fr_stats_t) before the call; fields
 * beyond the caller's size are not written.
 */
typedef struct fr_stats {
	size_t size;
	uint64_t collectives;       /* collectives completed                  */
	uint64_t bytes_sent;        /* payload bytes written to peers         */
	uint64_t bytes_received;    /* payload bytes written by peers to us   */
	uint64_t writes;            /* write-with-immediate operations posted */
	uint64_t mem_registrations; /* transport registrations performed     */
	uint64_t regcache_hits;     /* unregistered buffers found in the cache */
	uint64_t regcache_misses;   /* ... and those that had to be registered */
	uint64_t regcache_evictions;
	uint64_t rkeys_sent;        /* remote keys sent to peers              */
	uint64_t wire_bytes;        /* every byte our writes put on the wire,
				     * message headers included               */
	uint64_t compress_in_bytes; /* f32 bytes fed to the compressor        */
	uint64_t compress_out_bytes; /* ... and the wire bytes it made of them */
} fr_stats_t;

FR_API int fr_comm_stats(const fr_comm_t *comm, fr_stats_t *stats);

/* The algorithm (fr_algo_t) of the most recently started collective, or
 * FR_ALGO_AUTO before the first; FR_EINVAL for NULL. */
FR_API int fr_comm_last_algo(const fr_comm_t *comm);

/* ---- memory ------------------------------------------------------------- */

/*
 * Register [buf, buf+len) with the transport once, for reuse by every
 * collective whose buffers lie inside it: those run zero-copy and without
 * any registration or key exchange after the first use.  Buffers that were
 * not registered still work through a bounded internal cache.
 */
FR_API int fr_mem_register(fr_comm_t *comm, void *buf, size_t len,
			   fr_mem_t **mem);
/* FR_EBUSY while a collective in flight uses it.  NULL is a no-op. */
FR_API int fr_mem_deregister(fr_mem_t *mem);

/* ---- collectives -------------------------------------------------------- */

/* Pass as sendbuf (or pass sendbuf == recvbuf) for an in-place All-Reduce. */
#define FR_IN_PLACE ((const void *)1)

/*
 * recvbuf[i] = op over all ranks of sendbuf[i], for i < count.  Blocking.
 * sendbuf and recvbuf must be equal (in place) or must not overlap.
 */
FR_API int fr_allreduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
			size_t count, fr_dtype_t dtype, fr_op_t op);

/*
 * Start the same All-Reduce without waiting; *req is completed by
 * fr_test()/fr_wait() (which also release it).  The buffers must stay valid
 * and untouched until then.  Progress happens inside fr_test, fr_wait,
 * fr_progress and any other call on the communicator.
 */
FR_API int fr_iallreduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
			 size_t count, fr_dtype_t dtype, fr_op_t op,
			 fr_request_t **req);

/*
 * Per-call options of an All-Reduce.  Fill with fr_coll_opts_init().
 *   compress  fr_compress_t, for f32 data (FR_EINVAL for other dtypes);
 *             compressed All-Reduces run the compressed ring
 *             (fr_comm_last_algo() says FR_ALGO_RING)
 *   residual  error feedback: count floats, all zero before the first
 *             call, kept by the caller for this buffer between calls and
 *             not touched while the call runs.  What this rank's
 *             compression dropped is stored there and added back before
 *             the next compression of the same buffer, so over many steps
 *             nothing is lost.  NULL: no error feedback.
 */
typedef struct fr_coll_opts {
	size_t size; /* sizeof(fr_coll_opts_t): set by fr_coll_opts_init() */
	int compress;
	float *residual;
} fr_coll_opts_t;

FR_API void fr_coll_opts_init(fr_coll_opts_t *opts);
/* fr_allreduce / fr_iallreduce with options (NULL opts: none). */
FR_API int fr_allreduce_ex(fr_comm_t *comm, const void *sendbuf,
			   void *recvbuf, size_t count, fr_dtype_t dtype,
			   fr_op_t op, const fr_coll_opts_t *opts);
FR_API int fr_iallreduce_ex(fr_comm_t *comm, const void *sendbuf,
			    void *recvbuf, size_t count, fr_dtype_t dtype,
			    fr_op_t op, const fr_coll_opts_t *opts,
			    fr_request_t **req);

/*
 * Reduce-scatter with equal blocks: recvbuf (recvcount elements) on rank r
 * = op over all ranks of block r of sendbuf (nranks * recvcount elements).
 * In place: recvbuf == sendbuf + rank * recvcount elements (as NCCL).
 */
FR_API int fr_reduce_scatter(fr_comm_t *comm, const void *sendbuf,
			     void *recvbuf, size_t recvcount,
			     fr_dtype_t dtype, fr_op_t op);
FR_API int fr_ireduce_scatter(fr_comm_t *comm, const void *sendbuf,
			      void *recvbuf, size_t recvcount,
			      fr_dtype_t dtype, fr_op_t op,
			      fr_request_t **req);

/*
 * All-gather: block r of recvbuf (nranks * sendcount elements) = rank r's
 * sendbuf (sendcount elements), on every rank.  In place: sendbuf ==
 * recvbuf + rank * sendcount elements, or FR_IN_PLACE (our block is
 * already in recvbuf).  dtype only sizes the elements.
 */
FR_API int fr_allgather(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
			size_t sendcount, fr_dtype_t dtype);
FR_API int fr_iallgather(fr_comm_t *comm, const void *sendbuf,
			 void *recvbuf, size_t sendcount, fr_dtype_t dtype,
			 fr_request_t **req);

/* Broadcast: buf (count elements) of rank root to every rank's buf. */
FR_API int fr_broadcast(fr_comm_t *comm, void *buf, size_t count,
			fr_dtype_t dtype, int root);
FR_API int fr_ibroadcast(fr_comm_t *comm, void *buf, size_t count,
			 fr_dtype_t dtype, int root, fr_request_t **req);

/*
 * Reduce to one rank: recvbuf (count elements) on rank root = op over all
 * ranks of sendbuf.  recvbuf matters on the root only (NULL elsewhere is
 * fine).  In place on the root: sendbuf == recvbuf or FR_IN_PLACE.
 */
FR_API int fr_reduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		     size_t count, fr_dtype_t dtype, fr_op_t op, int root);
FR_API int fr_ireduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		      size_t count, fr_dtype_t dtype, fr_op_t op, int root,
		      fr_request_t **req);

/*
 * All-to-all: count elements to and from every rank; block r of sendbuf
 * (nranks * count elements) goes to rank r, and block r of recvbuf comes
 * from rank r.  In place: sendbuf == recvbuf or FR_IN_PLACE (recvbuf
 * holds the blocks to send).  dtype only sizes the elements.
 */
FR_API int fr_alltoall(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		       size_t count, fr_dtype_t dtype);
FR_API int fr_ialltoall(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
			size_t count, fr_dtype_t dtype, fr_request_t **req);

/*
 * All-to-all with a count per pair: sendcounts[r] elements from
 * sendbuf + sdispls[r] elements go to rank r, which receives them at
 * its recvbuf + rdispls[this rank]; recvcounts[r] must equal what rank r
 * sends here (else FR_EMISMATCH on both).  Counts may be 0.  The arrays
 * (nranks entries each) are copied: they may change once the call
 * returns.  Blocks of recvbuf must not overlap; in place (sendbuf ==
 * recvbuf or FR_IN_PLACE) the blocks to send are read from recvbuf at
 * rdispls with recvcounts.
 */
FR_API int fr_alltoallv(fr_comm_t *comm, const void *sendbuf,
			const size_t *sendcounts, const size_t *sdispls,
			void *recvbuf, const size_t *recvcounts,
			const size_t *rdispls, fr_dtype_t dtype);
FR_API int fr_ialltoallv(fr_comm_t *comm, const void *sendbuf,
			 const size_t *sendcounts, const size_t *sdispls,
			 void *recvbuf, const size_t *recvcounts,
			 const size_t *rdispls, fr_dtype_t dtype,
			 fr_request_t **req);

/*
 * All-gather with a count per rank: rank r's sendbuf (sendcount ==
 * recvcounts[r] elements) lands at recvbuf + displs[r] elements on every
 * rank.  In place: sendbuf == recvbuf + displs[rank] or FR_IN_PLACE.
 * recvcounts must be the same on every rank (FR_EMISMATCH otherwise);
 * displs may differ.  The arrays are copied.
 */
FR_API int fr_allgatherv(fr_comm_t *comm, const void *sendbuf, size_t sendcount,
			 void *recvbuf, const size_t *recvcounts,
			 const size_t *displs, fr_dtype_t dtype);
FR_API int fr_iallgatherv(fr_comm_t *comm, const void *sendbuf,
			  size_t sendcount, void *recvbuf,
			  const size_t *recvcounts, const size_t *displs,
			  fr_dtype_t dtype, fr_request_t **req);

/*
 * Reduce-scatter with a count per rank: recvbuf (recvcounts[r] elements)
 * on rank r = op over all ranks of the r-th block of sendbuf, the blocks
 * lying back to back in rank order (block r starts at the sum of
 * recvcounts[0 .. r-1]).  In place: recvbuf == sendbuf + that offset.
 * recvcounts must be the same on every rank.  The array is copied.
 */
FR_API int fr_reduce_scatterv(fr_comm_t *comm, const void *sendbuf,
			      void *recvbuf, const size_t *recvcounts,
			      fr_dtype_t dtype, fr_op_t op);
FR_API int fr_ireduce_scatterv(fr_comm_t *comm, const void *sendbuf,
			       void *recvbuf, const size_t *recvcounts,
			       fr_dtype_t dtype, fr_op_t op,
			       fr_request_t **req);

/*
 * Point-to-point: count elements from buf to rank peer, which receives
 * them with fr_recv / fr_irecv of the same count, dtype and tag (>= 0).
 * Messages between two ranks with the same tag are received in the order
 * they were sent; tags let a receiver take them in another order.  Any
 * size: small messages go eagerly into the peer's mailbox, large ones by
 * a rendezvous straight into the receive buffer (zero copy; register the
 * buffers with fr_mem_register to make that free).  A send to this rank
 * itself works.  fr_send returns once buf may be reused, fr_recv once buf
 * holds the message; the fr_i* forms return a request (fr_wait, fr_test)
 * and proceed independently of collectives started meanwhile.
 */
FR_API int fr_send(fr_comm_t *comm, const void *buf, size_t count,
		   fr_dtype_t dtype, int peer, int tag);
FR_API int fr_recv(fr_comm_t *comm, void *buf, size_t count, fr_dtype_t dtype,
		   int peer, int tag);
FR_API int fr_isend(fr_comm_t *comm, const void *buf, size_t count,
		    fr_dtype_t dtype, int peer, int tag, fr_request_t **req);
FR_API int fr_irecv(fr_comm_t *comm, void *buf, size_t count, fr_dtype_t dtype,
		    int peer, int tag, fr_request_t **req);

/* Barrier: returns once every rank has entered it. */
FR_API int fr_barrier(fr_comm_t *comm);
FR_API int fr_ibarrier(fr_comm_t *comm, fr_request_t **req);

/*
 * Make progress; if the request is complete set *done = 1, release it, set
 * *req = NULL and return its result.  Otherwise *done = 0 and return 0.
 */
FR_API int fr_test(fr_request_t **req, int *done);
/* Block until the request completes; release it, *req = NULL, its result. */
FR_API int fr_wait(fr_request_t **req);
/* Advance every collective in flight without blocking. */
FR_API int fr_progress(fr_comm_t *comm);

/* ---- gradient buckets ---------------------------------------------------- */

/*
 * All-Reduce a flat gradient arena in buckets while the backward pass is
 * still producing it (as PyTorch DDP does).  The arena is cut once, at
 * creation, into buckets of bucket_bytes (the first one first_bucket_bytes),
 * starting from its end (backward produces the last layers first) or its
 * start.  Each step, the application marks element ranges ready in any
 * order (fr_buckets_ready); a bucket's All-Reduce starts as soon as it and
 * every bucket before it are complete, so all ranks start the same
 * collectives in the same order; fr_buckets_wait() treats what is not
 * marked yet as ready, waits for the rest and re-arms for the next step.
 */
typedef struct fr_buckets fr_buckets_t;

typedef struct fr_buckets_config {
	size_t size;              /* sizeof: set by fr_buckets_config_init() */
	size_t bucket_bytes;      /* FR_BUCKET_BYTES, 25 MiB                 */
	size_t first_bucket_bytes; /* FR_FIRST_BUCKET_BYTES, 1 MiB           */
	int compress;             /* fr_compress_t for every bucket (f32)    */
	int error_feedback;       /* 1: keep a residual per element (compress) */
	int forward;              /* 1: buckets from the arena's start       */
} fr_buckets_config_t;

FR_API void fr_buckets_config_init(fr_buckets_config_t *cfg);
/*
 * Set up buckets over arena (count elements of dtype), reduced in place
 * with op.  The arena is registered once here (zero copy).  cfg may be
 * NULL.
 */
FR_API int fr_buckets_create(fr_comm_t *comm, void *arena, size_t count,
			     fr_dtype_t dtype, fr_op_t op,
			     const fr_buckets_config_t *cfg,
			     fr_buckets_t **buckets);
/* Elements [offset, offset + count) of this step's gradients are final;
 * starts every bucket that became complete.  FR_EINVAL if a range is out
 * of the arena or was marked already this step. */
FR_API int fr_buckets_ready(fr_buckets_t *buckets, size_t offset,
			    size_t count);
/* End of the backward pass: start what remains, wait for every bucket,
 * and re-arm for the next step.  0 or the first error. */
FR_API int fr_buckets_wait(fr_buckets_t *buckets);
/* Number of buckets and the element range of bucket i (in start order). */
FR_API int fr_buckets_count(const fr_buckets_t *buckets);
FR_API int fr_buckets_range(const fr_buckets_t *buckets, int i,
			    size_t *offset, size_t *count);
/* Free (FR_EBUSY while a step is in flight).  NULL is a no-op. */
FR_API int fr_buckets_destroy(fr_buckets_t *buckets);

#ifdef __cplusplus
}
#endif

#endif /* FASTREDUCE_H */
