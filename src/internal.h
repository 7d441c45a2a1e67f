/* SPDX-License-Identifier: MIT */
/*
 * internal.h - the communicator, registered memory and requests.
 *
 * A communicator owns one transport endpoint and two connections: to the
 * ring's next rank (we write data there) and from its previous rank (it
 * writes data to us).  For two ranks they go to the same peer but are still
 * two connections, which keeps the code free of special cases.
 */
#ifndef FR_INTERNAL_H
#define FR_INTERNAL_H

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
/* Control messages (ready-to-receive, abort) land in a small inbox ring. */
#define FR_CTRL_SLOTS 8
#define FR_CTRL_MSG_SIZE 128
/* Peers' remote keys are cached direct-mapped by registration id. */
#define FR_RKEY_CACHE 256

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

/* What we know about one ring neighbour. */
struct fr_peer {
	int rank;
	struct fr_tp_conn *conn;
	/* its control inbox for our messages, and the next slot to use */
	struct fr_tp_rkey ctrl_rkey;
	uint32_t ctrl_seq;
	/* the next slot it will use in our inbox */
	uint32_t ctrl_recv_seq;
	/* its last "ready" message for a collective we have not started */
	bool have_ready;
	bool bye; /* it destroyed its communicator */
	uint8_t ready[FR_CTRL_MSG_SIZE];
	/* ids of our registrations whose key it has (direct-mapped) */
	uint32_t rkey_sent[FR_RKEY_CACHE];
	/* its registrations' keys we have (direct-mapped by id) */
	uint32_t rkey_id[FR_RKEY_CACHE];
	struct fr_tp_rkey rkey[FR_RKEY_CACHE];
};

enum fr_req_state { FR_REQ_QUEUED, FR_REQ_ACTIVE, FR_REQ_DONE };

struct fr_ring_state; /* ring.c */

struct fr_request {
	struct fr_comm *comm;
	struct fr_request *next; /* comm->queue */
	enum fr_req_state state;
	int result;
	uint32_t seq;
	const void *sendbuf;
	void *recvbuf;
	size_t count;
	fr_dtype_t dtype;
	fr_op_t op;
	struct fr_ring_state *ring;
};

struct fr_comm {
	int rank, nranks;
	const struct fr_tp_ops *tp_ops;
	struct fr_tp *tp;
	uint64_t job_nonce;
	int timeout_ms;
	size_t segment_bytes;
	int slots;
	int regcache_max;
	int spin_us; /* busy-poll budget before blocking; -1: never block */

	struct fr_peer prev, next;

	/* staging: `slots` segments our previous rank writes into */
	void *staging;
	struct fr_mem *staging_mem;
	/* control inboxes (one per neighbour) and our outbox */
	uint8_t *ctrl_in;  /* [2][FR_CTRL_SLOTS][FR_CTRL_MSG_SIZE] */
	struct fr_mem *ctrl_in_mem;
	uint8_t *ctrl_out; /* [FR_CTRL_SLOTS][FR_CTRL_MSG_SIZE] */
	struct fr_mem *ctrl_out_mem;
	uint32_t ctrl_out_seq;
	uint32_t ctrl_out_busy; /* bitmap of outbox slots awaiting completion */
	/* the next rank's staging slots */
	struct fr_tp_rkey next_staging_rkey;

	/* staging flow: counters are continuous across collectives */
	uint64_t rs_sent;     /* segments written into next's staging */
	uint64_t rs_received; /* segments landed in our staging */
	int credits;          /* free slots at next */
	int credits_owed;     /* slots freed here, not yet told to prev */
	/* segments prev wrote into our staging for a collective we have not
	 * started yet (it need not wait for us: the slots are ours) */
	struct {
		uint32_t payload, len;
	} rs_early[FR_MAX_SLOTS];
	int n_rs_early;
	int outstanding;      /* our writes without a SEND completion */

	uint64_t last_activity_ms; /* last completion seen, for timeouts */
	uint32_t seq;           /* collectives started */
	struct fr_request *queue; /* FIFO; the head is the active one */
	struct fr_request *tail;

	struct fr_mem *user_mems;
	struct fr_mem *cache;
	int cache_entries;
	uint32_t next_mem_id;

	int failed; /* 0 or the error that failed the communicator */
	/* an ABORT for a collective after the active one: applied when that
	 * collective starts, so the active one may still complete */
	bool abort_pending;
	uint32_t abort_seq;
	int abort_err;
	char abort_msg[FR_ERRMSG_MAX];
	fr_stats_t stats;
	char errmsg[FR_ERRMSG_MAX];
};

/* comm.c */
int fr_comm_fail(struct fr_comm *comm, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
int fr_comm_seterr(struct fr_comm *comm, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* mem.c */
int fr_mem_acquire(struct fr_comm *comm, const void *buf, size_t len,
		   int access, struct fr_mem **mem);
void fr_mem_release(struct fr_mem *mem);
int fr_mem_register_internal(struct fr_comm *comm, void *buf, size_t len,
			     int access, bool user, struct fr_mem **mem);
void fr_mem_free_internal(struct fr_mem *mem);
void fr_mem_cache_flush(struct fr_comm *comm);

/* request.c */
int fr_progress_internal(struct fr_comm *comm, bool *did_work);
void fr_requests_abandon(struct fr_comm *comm);

#endif
