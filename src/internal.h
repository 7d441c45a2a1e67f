/* SPDX-License-Identifier: MIT */
/*
 * internal.h - the communicator, its peers, registered memory and requests.
 *
 * A communicator owns one transport endpoint and a table of peers, one per
 * rank.  A peer is connected on first use (peer.c), so a job whose
 * collectives only ever use the ring talks to its two ring neighbours and
 * nobody else; one connection per pair carries traffic both ways.
 *
 * Per-peer state lives here: the connection, mailbox credits and sequence
 * numbers, and the remote keys exchanged once per (peer, registration).
 * Each algorithm keeps the state of one collective in the request
 * (req->algo_state) and its own long-lived state, if any, behind a pointer
 * of the communicator (comm->ring).
 */
#ifndef FR_INTERNAL_H
#define FR_INTERNAL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fastreduce.h"
#include "transport.h"

#define FR_ERRMSG_MAX 512
#define FR_DEFAULT_TIMEOUT_MS 30000
#define FR_DEFAULT_SEGMENT (512u * 1024u)
#define FR_DEFAULT_SLOTS 8
#define FR_MAX_SLOTS 64
#define FR_DEFAULT_REGCACHE 64
#define FR_DEFAULT_SPIN_US 50
/* Mailbox data slots per peer (credits). */
#define FR_MBX_SLOTS 8
/* Outbox slots only ABORT and BYE may use. */
#define FR_OUT_RESERVED 2
/* Peers' remote keys are cached direct-mapped by registration id. */
#define FR_RKEY_CACHE 64

/* A registration: user-owned (fr_mem_register) or cached. */
struct fr_mem {
	struct fr_comm *comm;
	struct fr_tp_mr *tp_mr;
	uintptr_t base; /* registered range [base, base + len) */
	size_t len;
	uint32_t id;    /* unique in the communicator, never reused */
	int access;
	int refs;       /* collectives in flight using it */
	bool user;      /* from fr_mem_register, else cache-owned */
	uint64_t last_use;
	struct fr_mem *next; /* in comm->user_mems or comm->cache */
};

/* Collectives (the wire carries these numbers: append only). */
enum fr_coll {
	FR_COLL_ALLREDUCE = 1,
	FR_COLL_REDUCE_SCATTER = 2,
	FR_COLL_ALLGATHER = 3,
	FR_COLL_BROADCAST = 4,
	FR_COLL_BARRIER = 5,
};

/* A decoded mailbox message header (see peer.c for the wire layout). */
struct fr_msg {
	uint8_t type;  /* enum fr_msg_type */
	uint8_t coll, algo, dtype, op;
	uint16_t step;
	uint32_t seq;
	uint64_t count;
	int32_t root;
	uint32_t credits; /* our mailbox slots the sender has freed */
	uint64_t offset;  /* DATA: byte offset of the payload in the step */
	uint32_t len;     /* payload bytes after the header */
	int32_t err, origin; /* ABORT */
	uint32_t aux;     /* algorithm's own */
};

enum fr_msg_type {
	FR_MSG_DATA = 1,  /* a fragment of a step's data */
	FR_MSG_READY = 2, /* ring: ready to receive, names the buffer */
	FR_MSG_ABORT = 3, /* the job failed (special slot, sent once) */
	FR_MSG_BYE = 4,   /* the communicator is destroyed (special slot) */
};

#define FR_MSG_HDR 64

enum fr_peer_state {
	FR_PEER_IDLE = 0, /* never needed */
	FR_PEER_CONNECTING,
	FR_PEER_UP,
	FR_PEER_DOWN, /* failed or closed */
};

/* What we know about one other rank. */
struct fr_peer {
	int rank;
	enum fr_peer_state state;
	struct fr_tp_conn *conn;
	struct fr_peer *next_active; /* comm->active list (connected or connecting) */
	/* its card: transport address and mailbox key */
	struct fr_tp_rkey mbx_rkey;
	/* sending into its mailbox */
	int credits;          /* free data slots there for us */
	uint32_t send_seq;    /* data slots used so far */
	bool abort_sent, bye_sent;
	bool told_only; /* connected only to hand it our ABORT */
	/* receiving from it into our mailbox */
	uint32_t recv_arrived; /* data messages landed */
	uint32_t recv_taken;   /* data messages consumed (in order) */
	int credits_owed;      /* consumed, not yet returned */
	bool have_peek;        /* msg below is the decoded head */
	struct fr_msg peek;
	bool bye;              /* it destroyed its communicator */
	/* liveness (peer.c, "Slow or dead"): our last PING to it, its last
	 * PONG, and what that said: how many collectives it had started, and
	 * whether it is itself waiting for a late rank */
	uint64_t ping_ms, pong_ms;
	uint32_t pong_started;
	bool pong_late, pong_owed;
	/* a liveness-only connection (PING and PONG, no data) to a lower rank
	 * we wait on that has not connected to us yet, or from a higher one
	 * that waits on us; a connection from the other side of the pair
	 * to the one that carries data, so the two never mix up */
	struct fr_tp_conn *probe;
	bool probe_up, probe_dead;
	/* ids of our registrations whose key it has (direct-mapped) */
	uint32_t rkey_sent[FR_RKEY_CACHE];
	/* its registrations' keys we have (direct-mapped by id) */
	uint32_t rkey_id[FR_RKEY_CACHE];
	struct fr_tp_rkey rkey[FR_RKEY_CACHE];
};

enum fr_req_state { FR_REQ_QUEUED, FR_REQ_ACTIVE, FR_REQ_DONE };

struct fr_algo; /* algo/algo.h */

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
	int forced;   /* algorithm asked for (FR_ALGO_AUTO: choose) */
	int compress; /* fr_compress_t of f32 All-Reduce data on the wire */
	float *residual; /* error feedback (count floats) or NULL */
	const struct fr_algo *algo;
	void *algo_state;
};

/* Tuned cost-model parameters (select.c, fr_tune(1)). */
struct fr_tune {
	double alpha_us;   /* per message step, microseconds */
	double beta_ns;    /* per byte on the wire, nanoseconds */
	double copy_ns;    /* per byte copied through a mailbox */
	double gamma_ns[FR_DTYPE_COUNT]; /* per byte reduced */
	char source[256];  /* "built-in defaults" or the file it came from */
};

struct fr_ring_comm; /* algo/ring.c */

struct fr_comm {
	int rank, nranks;
	const struct fr_tp_ops *tp_ops;
	struct fr_tp *tp;
	uint64_t job_nonce;
	int timeout_ms;
	long slow_timeout_ms; /* patience with a peer that is alive but late */
	bool waiting_late;    /* what we wait on is alive but late */
	size_t segment_bytes;
	int slots;
	int regcache_max;
	int spin_us; /* busy-poll budget before blocking; -1: never block */
	int algo_forced; /* FR_ALGO / config: FR_ALGO_AUTO or one algorithm */
	struct fr_tune tune;

	/* peers[rank]; peers[rank == ours] is unused */
	struct fr_peer *peers;
	struct fr_peer *active; /* peers connected or connecting */
	/* the transport addresses from the rendezvous (cards) */
	uint8_t *addrs;  /* [nranks][FR_TP_ADDR_MAX] */
	uint8_t *addrlens;

	/*
	 * Nodes, from every rank's fr_node_id() at the rendezvous.  The
	 * layout is regular when every node has the same number of ranks:
	 * local[] are the ranks on our node and cross[] those with our local
	 * index on every node, both in rank order (the two-level All-Reduce
	 * runs rings over them).
	 */
	uint64_t node_id;
	int nnodes;
	double oversub;    /* ranks per online CPU on the busiest node */
	bool nodes_regular;
	int *local, nlocal, local_index;
	int *cross, ncross, cross_index;
	int *node_of; /* every rank's node (numbered by lowest rank) */
	/*
	 * The ring's order (ring.c, cring.c): ring_order[i] is the rank at
	 * position i, ring_pos ours.  The ranks of a node are adjacent, nodes in order
	 * of their lowest rank, so a ring crosses each node's link twice
	 * whatever the launcher's placement (round robin puts every rank's
	 * neighbours on other nodes); rank order where FR_RING_ORDER=rank.
	 */
	int *ring_order, ring_pos;
	int ring_crossings; /* our node's ranks whose next is elsewhere */
	bool ring_by_rank;

	/*
	 * Mailbox: peer p writes into slots [p][0 .. mbx_slots + 1]; the
	 * last two are for its ABORT and BYE.  Outbox: where messages are
	 * assembled before the write.
	 */
	int mbx_slots;        /* data slots per peer */
	size_t mbx_slot_size; /* header + eager payload */
	uint8_t *mbx;
	struct fr_mem *mbx_mem;
	int out_slots;
	uint8_t *out;
	struct fr_mem *out_mem;
	uint64_t out_busy; /* bitmap: outbox slots awaiting completion */
	uint32_t out_next;
	int outstanding;      /* our writes without a SEND completion */
	int user_outstanding; /* ... of them, writes from user buffers */

	/* algorithm state that outlives one collective */
	struct fr_ring_comm *ring;
	/* a scratch buffer registered once, grown on demand */
	void *scratch;
	size_t scratch_len;
	struct fr_mem *scratch_mem;

	uint64_t last_activity_ms; /* last completion seen, for timeouts */
	uint32_t seq;           /* collectives started */
	int last_algo;          /* of the last collective started */
	/* (collective, bytes) whose choice FR_LOG=info has already told */
#define FR_ALGO_LOGGED 32
	struct {
		int coll;
		size_t bytes;
	} algo_logged[FR_ALGO_LOGGED];
	unsigned algo_logged_next;
	struct fr_request *queue; /* FIFO; the head is the active one */
	struct fr_request *tail;

	struct fr_mem *user_mems;
	struct fr_mem *cache;
	int cache_entries;
	uint32_t next_mem_id;

	int failed; /* 0 or the error that failed the communicator */
	int fail_origin; /* the rank that failed first, -1: this one */
	/* an ABORT for a collective after the active one: applied when that
	 * collective starts, so the active one may still complete */
	bool abort_pending;
	uint32_t abort_seq;
	int abort_err, abort_origin;
	char abort_msg[FR_ERRMSG_MAX];
	/* the first failing rank's own code and message, which ABORT
	 * carries on (relays included) */
	int fail_code;
	uint32_t fail_seq; /* the first collective the failure ended */
	bool told_all;     /* fr_peers_tell_all has run */
	char fail_text[FR_ERRMSG_MAX];
	fr_stats_t stats;
	char errmsg[FR_ERRMSG_MAX];

	/* threads (progress.c): the lock every public call takes */
	pthread_mutex_t lock;
	pthread_cond_t yield_cv; /* the lock was given up */
	/* events (a request finished, the leader left, stop): ev_gen grows */
	pthread_mutex_t ev_lock;
	pthread_cond_t ev_cv;
	uint64_t ev_gen;
	atomic_int lock_waiters; /* threads blocked in fr_lock() */
	atomic_bool sleeping;    /* the lock holder sleeps in tp wait() */
	bool poller_busy;        /* a thread drives the engine (leader) */
	int progress_mode;       /* FR_PROGRESS_CALLER or _THREAD */
	bool pt_running, pt_stop;
	pthread_t pt;
	int pt_cpu_mode; /* FR_PROGRESS_CPU: enum fr_cpu_mode (affinity.h) */
	cpu_set_t pt_cpus; /* its list */
};

/* comm.c */
int fr_comm_fail(struct fr_comm *comm, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int fr_comm_seterr(struct fr_comm *comm, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int fr_scratch_get(struct fr_comm *comm, size_t len);

/* mem.c */
int fr_mem_acquire(struct fr_comm *comm, const void *buf, size_t len,
		   int access, struct fr_mem **mem);
void fr_mem_release(struct fr_mem *mem);
int fr_mem_register_internal(struct fr_comm *comm, void *buf, size_t len,
			     int access, bool user, struct fr_mem **mem);
void fr_mem_free_internal(struct fr_mem *mem);
void fr_mem_cache_drop_idle(struct fr_comm *comm);
void fr_mem_cache_flush(struct fr_comm *comm);

/* progress.c: see there for the protocol */
void fr_lock(struct fr_comm *comm);
void fr_unlock(struct fr_comm *comm);
/* Wait for the next fr_signal(), giving the lock up meanwhile. */
void fr_cond_wait(struct fr_comm *comm);
/* Wake every fr_cond_wait() (lock held). */
void fr_signal(struct fr_comm *comm);
/* The leader: give the lock to the threads that asked for it. */
void fr_lock_yield(struct fr_comm *comm);
/* The leader: sleep in the transport's wait, holding the lock; fr_lock()
 * from another thread ends the sleep. */
void fr_comm_sleep(struct fr_comm *comm, int ms);
/* How long the leader may sleep: up to the timeout, at most 100 ms while
 * requests are pending. */
int fr_sleep_ms(const struct fr_comm *comm, bool pending);
int fr_lock_init(struct fr_comm *comm);
void fr_lock_fini(struct fr_comm *comm);
int fr_progress_thread_start(struct fr_comm *comm, char *err, size_t errlen);
void fr_progress_thread_stop(struct fr_comm *comm);

/* request.c */
/* One round of the engine with the checks a waiter makes (timeout, peer
 * gone); true while requests are pending. */
bool fr_engine_step(struct fr_comm *comm, bool *did_work);
/* fr_wait() with the lock held. */
int fr_req_wait_locked(struct fr_request *req);
int fr_progress_internal(struct fr_comm *comm, bool *did_work);
void fr_requests_abandon(struct fr_comm *comm);
struct fr_request *fr_active_req(struct fr_comm *comm);
int fr_req_submit(struct fr_comm *comm, struct fr_request *req,
		  fr_request_t **out);

/* coll.c */
/* fr_iallreduce_ex() with the lock held. */
int fr_iallreduce_locked(struct fr_comm *comm, const void *sendbuf,
			 void *recvbuf, size_t count, fr_dtype_t dtype,
			 fr_op_t op, const fr_coll_opts_t *opts,
			 fr_request_t **req);
const char *fr_coll_name(enum fr_coll coll);
/* Total elements a collective's data spans on every rank (the full
 * vector for reduce-scatter and all-gather: nranks blocks). */
size_t fr_coll_count_total(const struct fr_request *req);

#endif
