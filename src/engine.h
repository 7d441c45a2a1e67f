/* SPDX-License-Identifier: MIT */
/*
 * engine.h - the progress engine: the request queue (request.c), the
 * communicator's lock and how its holder sleeps (lock.c), and the progress
 * thread (progress.c).
 *
 * Requests run one after another in the order they were started (every
 * rank starts them in the same order).  A round of the engine drains the
 * transport's completions into the peer layer, hands the algorithms what
 * is theirs, and lets the active collective's algorithm take what arrived
 * and post what it can.
 *
 * Layer: engine.  Calls the algorithms only through the table's hooks
 * (fr_algo_select, fr_algos_*: algo/algo.h), the agreement (agree.h: its
 * rounds, also on a failed communicator), the peers, the memory layer
 * and the transport's poll/wait/wake; called by the entry points.  Within
 * the layer progress.c calls request.c, which calls lock.c and p2p.c
 * (point-to-point requests, which p2p.c says how they travel).  Owns struct
 * fr_engine and struct fr_threads.
 */
#ifndef FR_ENGINE_H
#define FR_ENGINE_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "fastreduce.h"

struct fr_comm;
struct fr_request;
struct fr_mem;
struct fr_p2p_unexp;

/* A point-to-point request's state (req->p2p, p2p.c). */
struct fr_p2p_req {
	bool on;   /* this request is a send or a receive, not a collective */
	bool send; /* else a receive */
	int peer, tag;
	int stage;		 /* p2p.c's enum p2p_stage */
	uint32_t psn;		 /* the sender's number of the message */
	uint32_t id;		 /* receive: the rendezvous write's id */
	struct fr_mem *mem;	 /* the registration of the buffer */
	size_t moff;		 /* the buffer's offset in it */
	struct fr_request *next; /* comm->eng.p2p, in the order posted */
};

/* The request queue (comm->eng). */
struct fr_engine {
	struct fr_request *queue; /* FIFO; the head is the active one */
	struct fr_request *tail;
	/* one finished request kept for the next: a blocking collective
	 * allocates nothing (request.c, req_new / req_unlink_free) */
	struct fr_request *spare;
	int last_algo; /* of the last collective started */
	/* point-to-point (p2p.c): sends and receives in the order posted,
	 * messages that arrived before their receive, the numbers given */
	struct fr_request *p2p, *p2p_tail;
	struct fr_p2p_unexp *unexp, *unexp_tail;
	uint32_t p2p_psn, p2p_id;
	int spin_us;   /* busy-poll budget before blocking; -1: never block */
	unsigned int busy_steps; /* fr_engine_step: steps that did work */
	/* a spin that finds its core shared (request.c, shared_core()) */
	uint64_t nudge_at;  /* fr_now_ns: it may change cores from then */
	uint64_t nudge_gap; /* ns until the next change after that one */
	uint64_t shared_ns; /* fr_now_ns: it last found the core shared */
	unsigned shared_streak; /* waits in a row that found it shared */
	unsigned nudge_tries;	/* since the core was last found unshared */
	uint64_t spin_long_until; /* fr_now_ns: waits spin FR_SHARED_SPIN_US */
};

/* Threads (comm->thr, lock.c and progress.c): the lock every public call
 * takes, the leader/followers protocol, the progress thread. */
struct fr_threads {
	pthread_mutex_t lock;
	pthread_cond_t yield_cv; /* the lock was given up */
	/* events (a request finished, the leader left, stop): ev_gen grows */
	pthread_mutex_t ev_lock;
	pthread_cond_t ev_cv;
	uint64_t ev_gen;
	/* threads in fr_cond_wait(): fr_signal() has nobody to wake (and
	 * costs nothing) when 0, the common case of one application thread */
	atomic_int ev_waiters;
	atomic_int lock_waiters; /* threads blocked in fr_lock() */
	atomic_bool sleeping;	 /* the lock holder sleeps in tp wait() */
	bool poller_busy;	 /* a thread drives the engine (leader) */
	int progress_mode;	 /* FR_PROGRESS_CALLER or _THREAD */
	bool pt_running, pt_stop;
	pthread_t pt;
	int pt_cpu_mode;   /* FR_PROGRESS_CPU: enum fr_cpu_mode (affinity.h) */
	cpu_set_t pt_cpus; /* its list */
};

/* lock.c: see there for the protocol */
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

/* progress.c */
int fr_progress_thread_start(struct fr_comm *comm, char *err, size_t errlen);
void fr_progress_thread_stop(struct fr_comm *comm);

/* p2p.c: point-to-point sends and receives */
/* Queue a send (send) or receive of count elements with peer and tag;
 * the checks are the caller's.  0 or an error; *out the request. */
int fr_p2p_submit(struct fr_comm *comm, bool send, void *buf, size_t count,
		  fr_dtype_t dtype, int peer, int tag, fr_request_t **out);
/* Every engine round: take point-to-point messages, post what can go. */
int fr_p2p_progress(struct fr_comm *comm, bool *did_work);
/* A rendezvous write landed (FR_IMM_P2P). */
int fr_p2p_on_cqe(struct fr_comm *comm, int peer, uint32_t imm, uint32_t len);
/* The peer the oldest unfinished request waits on, or -1. */
int fr_p2p_waiting_on(const struct fr_comm *comm);
/* The communicator failed: finish every request with its error. */
void fr_p2p_fail_all(struct fr_comm *comm);
/* Take req out of the list (it is finished and being freed). */
void fr_p2p_unlink(struct fr_request *req);
/* Destroy: free every request and unexpected message. */
void fr_p2p_abandon(struct fr_comm *comm);

/* request.c */
/* One round of the engine with the checks a waiter makes (timeout, peer
 * gone); true while requests are pending. */
bool fr_engine_step(struct fr_comm *comm, bool *did_work);
/* fr_wait() with the lock held. */
int fr_req_wait_locked(struct fr_request *req);
int fr_progress_internal(struct fr_comm *comm, bool *did_work);
/* An agreement runs or owes messages, or recovery has begun on a failed
 * communicator: rounds must poll, failed or not. */
bool fr_engine_busy(const struct fr_comm *comm);
/* ... of which an agreement or exchange runs or owes (the busy part). */
bool fr_engine_agreeing(const struct fr_comm *comm);
/* Run the engine until the agreement begun (agree.h) has decided. */
void fr_engine_agree_wait(struct fr_comm *comm);
void fr_requests_abandon(struct fr_comm *comm);
int fr_req_submit(struct fr_comm *comm, struct fr_request *req,
		  fr_request_t **out);

#endif
