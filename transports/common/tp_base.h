/* SPDX-License-Identifier: MIT */
/*
 * tp_base.h - the transport base: the machinery the connection-based
 * transports share.
 *
 * Owns: an endpoint's list of connections and its count of parked ones
 * (arrived, not yet taken by accept()); its error text (seterr, the
 * last_error operation); its listener, its wake eventfd and the epoll set
 * that holds them; a connection's life (allocation, link, failure, the
 * error completions it then owes, free); the send queue of write
 * descriptors; the region table whose slots (id + generation) are the
 * remote keys of tcp and shm, and their key blobs; the checks that open()
 * and write_imm() share; the operations that are the same everywhere
 * (accept, connect_done, poll, close, close_conn, wake, conn_peer,
 * pending, last_error, ...).
 *
 * Who may call it: the transports under transports/ (tcp, shm, verbs, the
 * mixed shm+tcp / shm+verbs), never the core, which sees a transport only
 * through transport.h.
 *
 * How a transport uses it: its struct fr_tp begins with a struct fr_tpb and
 * its struct fr_tp_conn with a struct fr_tpb_conn, each as the member
 * named b (FR_TPB_FIRST checks it: the base reaches them by converting the
 * transport's pointers).  It describes itself in a struct fr_tpb_class
 * (name, key blob format, progress and connection-teardown hooks), opens
 * with fr_tpb_open_params() and fr_tpb_alloc(), makes connections with
 * fr_tpb_conn_new(), and builds its operations table with FR_TPB_OPS from
 * its own operations and the base's.  Connection states: the base knows
 * FR_TPB_RETRY, FR_TPB_UP and FR_TPB_FAILED; a transport's own handshake
 * states count from FR_TPB_SETUP.  A transport keyed otherwise (verbs: an
 * ibv_mr list, its own per-QP rings, its own failure path) uses the parts
 * it needs: the list, errors, wake, a connection's life, and leaves the
 * region table and the send queue empty; its regions are in a list of its
 * own (struct fr_tpb_link).
 *
 * Like the transports, the base is single-threaded per endpoint; only
 * fr_tpb_wake() may be called from another thread.
 */
#ifndef FR_TP_BASE_H
#define FR_TP_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tp_cqring.h"
#include "transport.h"

#define FR_TPB_ERRBUF_LEN 256
/* A connection's failure message, before "connection to rank N: ". */
#define FR_TPB_CONN_MSG_LEN 192
#define FR_TPB_DEFAULT_TIMEOUT_MS 30000
#define FR_TPB_DEFAULT_SQ_DEPTH 64
/* Incoming connections not yet handed out by accept(): strangers beyond
 * this are closed at once rather than costing memory. */
#define FR_TPB_MAX_PENDING 256
/* Slots of the region table; an id beyond is refused in a key blob. */
#define FR_TPB_MAX_REGIONS (1u << 20)

/* The base's layout check: struct S has the base as its first member b. */
#define FR_TPB_FIRST(S) \
	_Static_assert(offsetof(struct S, b) == 0, #S ": the base comes first")

enum fr_tpb_state {
	FR_TPB_RETRY,  /* outgoing: refused, the next attempt at retry_ms */
	FR_TPB_UP,     /* established */
	FR_TPB_FAILED, /* dead; its error completions may still be owed */
	FR_TPB_SETUP,  /* a transport's own handshake states count from here */
};

struct fr_tpb_mr;

/* The base of a transport's send queue entry (its first member). */
struct fr_tpb_sqe {
	struct fr_tpb_mr *mr; /* the region it reads; NULL once it does not */
	uint64_t ctx;	      /* for its SEND completion */
};

/* depth entries of esize bytes; count of them queued from head, FIFO. */
struct fr_tpb_sq {
	unsigned char *e;
	size_t esize;
	unsigned int depth, head, count;
};

/* A connection's part that the base keeps (first member of fr_tp_conn). */
struct fr_tpb_conn {
	struct fr_tp *tp;		/* its endpoint */
	struct fr_tp_conn *prev, *next; /* the endpoint's list, b.conns */
	int peer;			/* the peer's rank; -1 until known */
	int state;     /* enum fr_tpb_state, or the transport's own */
	bool incoming; /* the peer connected to us */
	bool owned;    /* the caller holds it (from connect or accept) */
	bool err_owed; /* its error completion is not in the ring yet */
	int error;     /* why it failed */
	/* establishment */
	uint64_t deadline_ms, retry_ms;
	int backoff_ms, last_errno;
	/* queued writes, FIFO (empty for a transport that keeps its own) */
	struct fr_tpb_sq sq;
};

/* What the base needs to know of a transport. */
struct fr_tpb_class {
	const char *name; /* "tcp": the prefix of its messages */
	/* its remote key blob (fr_tpb_pack_rkey): magic, version and
	 * length, 20, or 28 with the region's address */
	struct {
		uint8_t magic, version;
		size_t len;
	} rkey;
	/*
	 * Make progress without blocking: accept, handshakes, send, receive.
	 * eager: accept() or connect_done() asks, or wait() saw an event
	 * (a transport may skip costly checks on a plain poll()).
	 */
	void (*progress)(struct fr_tp *tp, bool eager);
	/*
	 * A connection fails or is freed: let go of what it holds (socket,
	 * mapping) before the base releases its queued writes' regions.
	 * NULL: nothing to do.
	 */
	void (*conn_down)(struct fr_tp_conn *c);
	/*
	 * A connection is freed, after conn_down: free what it holds beyond
	 * the base (buffers of its own; verbs: its rings, its registered
	 * control buffer), not its struct.  NULL: nothing to free.
	 */
	void (*conn_free)(struct fr_tp_conn *c);
};

/* A registered region of the table (tcp, shm): the transport's struct
 * fr_tp_mr is this, converted at the interface. */
struct fr_tpb_mr {
	struct fr_tp *tp;
	uint8_t *base;
	size_t len;
	int access;
	uint32_t id, gen;
	unsigned int inflight; /* queued writes still reading from it */
};

/* One slot of the region table. */
struct fr_tpb_slot {
	struct fr_tpb_mr *mr; /* NULL when free */
	uint32_t gen;	      /* of the current or next registration */
};

/* An endpoint's part that the base keeps (first member of fr_tp). */
struct fr_tpb {
	const struct fr_tpb_class *cls;
	int rank;
	uint64_t nonce;
	int timeout_ms;	       /* for connection establishment */
	unsigned int sq_depth; /* writes queued per connection */
	int lfd;	       /* the listener, or -1 */
	int epfd;	       /* the epoll set wait() sleeps in, or -1 */
	int wfd;	       /* eventfd in it: wake() ends a wait(); or -1 */
	struct fr_cqring *cq;  /* the completions poll() hands out, or NULL */
	struct fr_tp_conn *conns;
	unsigned int npending; /* incoming connections not handed out */
	int accept_errno; /* the last accept() failure, 0 after a success */
	struct fr_tpb_slot *regions; /* the region table (tcp, shm) */
	uint32_t nregions;
	char errbuf[FR_TPB_ERRBUF_LEN];
};

static inline struct fr_tpb *fr_tpb_of(struct fr_tp *tp)
{
	return (struct fr_tpb *)(void *)tp;
}

static inline struct fr_tpb_conn *fr_tpb_c(struct fr_tp_conn *c)
{
	return (struct fr_tpb_conn *)(void *)c;
}

static inline const struct fr_tpb_conn *fr_tpb_cc(const struct fr_tp_conn *c)
{
	return (const struct fr_tpb_conn *)(const void *)c;
}

static inline struct fr_tpb_mr *fr_tpb_mr(struct fr_tp_mr *mr)
{
	return (struct fr_tpb_mr *)(void *)mr;
}

/*
 * The operations table of a transport of the base: its own operations
 * (probe_ ... finish_) and the base's.  dereg_ may be fr_tpb_dereg_mem.
 * FR_TPB_OPS_FIELDS is the same without the braces, for a table that adds
 * optional operations of its own (shm's lines).
 */
#define FR_TPB_OPS_FIELDS(name_, probe_, open_, connect_, dereg_, write_, \
			  inline_, wait_, prepare_, finish_)              \
	.size = sizeof(struct fr_tp_ops), .name = name_, .probe = probe_, \
	.open = open_, .connect = connect_, .accept = fr_tpb_accept,      \
	.connect_done = fr_tpb_connect_done, .reg_mem = fr_tpb_reg_mem,   \
	.dereg_mem = dereg_, .pack_rkey = fr_tpb_pack_rkey,               \
	.unpack_rkey = fr_tpb_unpack_rkey, .write_imm = write_,           \
	.write_inline = inline_, .poll = fr_tpb_poll, .wait = wait_,      \
	.wait_prepare = prepare_, .wait_fd = fr_tpb_wait_fd,              \
	.wait_finish = finish_, .wake = fr_tpb_wake,                      \
	.close_conn = fr_tpb_close_conn, .close = fr_tpb_close,           \
	.conn_peer = fr_tpb_conn_peer, .last_error = fr_tpb_last_error,   \
	.pending = fr_tpb_pending
#define FR_TPB_OPS(name_, probe_, open_, connect_, dereg_, write_, inline_,  \
		   wait_, prepare_, finish_)                                 \
	{                                                                    \
		FR_TPB_OPS_FIELDS(name_, probe_, open_, connect_, dereg_,    \
				  write_, inline_, wait_, prepare_, finish_) \
	}

/* ---- the endpoint ----------------------------------------------------------
 */

/*
 * Copy the caller's parameters into *p (fields past its size read as
 * zero: the struct may grow) and check what every open() checks: the
 * address buffer holds addr_need bytes, the rank and the send queue depth
 * (at most max_sq) are valid.  FR_EINVAL, with a message, when not.
 */
int fr_tpb_open_params(const char *name, const struct fr_tp_params *params,
		       struct fr_tp_params *p, struct fr_tp **out,
		       const void *addr, const size_t *addrlen,
		       size_t addr_need, int max_sq);
/* A failed open()'s message: into the caller's errbuf, and the debug log. */
void __attribute__((format(printf, 3, 4)))
fr_tpb_open_err(const char *name, const struct fr_tp_params *p, const char *fmt,
		...);
/* open() fails after fr_tpb_alloc(): the message (fr_tpb_open_err), the
 * endpoint closed (fr_tpb_close); returns FR_ESYS. */
int __attribute__((format(printf, 3, 4)))
fr_tpb_open_fail(struct fr_tp *tp, const struct fr_tp_params *p,
		 const char *fmt, ...);
/*
 * A zeroed endpoint of size bytes (a struct fr_tp) with its base filled
 * from the checked parameters: the defaults for timeout and send queue
 * depth, no descriptors, no connections, no regions, no completion ring
 * (set b.cq).  NULL, with a message, when out of memory.
 */
void *fr_tpb_alloc(const struct fr_tpb_class *cls, const struct fr_tp_params *p,
		   size_t size);
/*
 * Create the epoll set and the wake eventfd, the eventfd in the set (event
 * data &b->wfd) and the listener b->lfd too if there is one (event data
 * NULL).  0, or FR_ESYS with errno kept and *what naming the call that
 * failed.
 */
int fr_tpb_open_fds(struct fr_tpb *b, const char **what);
/* Watch fd in the epoll set (its events come with data); 0 or FR_ESYS. */
int fr_tpb_watch(struct fr_tpb *b, int fd, uint32_t events, void *data);
/* Free every connection and the region table, close the descriptors. */
void fr_tpb_fini(struct fr_tpb *b);

/* Set the endpoint's error text (last_error) and log it at level. */
void __attribute__((format(printf, 3, 4)))
fr_tpb_seterr(struct fr_tpb *b, int level, const char *fmt, ...);

/* Take a wake: level-triggered, one left unread would end every wait. */
void fr_tpb_wake_drain(struct fr_tpb *b);
/* wait_prepare()'s first look: FR_EINVAL without an endpoint, 1 when
 * completions wait in the ring (no sleep), else 0. */
int fr_tpb_wait_begin(struct fr_tp *tp);

/* Operations, for struct fr_tp_ops as they are (FR_TPB_OPS). */
int fr_tpb_accept(struct fr_tp *tp, int peer, struct fr_tp_conn **conn);
int fr_tpb_connect_done(struct fr_tp_conn *c);
int fr_tpb_poll(struct fr_tp *tp, struct fr_tp_cqe *cqe, int max);
int fr_tpb_wait_fd(struct fr_tp *tp);
void fr_tpb_wake(struct fr_tp *tp);
void fr_tpb_close_conn(struct fr_tp_conn *c);
void fr_tpb_close(struct fr_tp *tp);
int fr_tpb_conn_peer(const struct fr_tp_conn *c);
const char *fr_tpb_last_error(struct fr_tp *tp);
int fr_tpb_pending(struct fr_tp *tp, int *peers, int max);

/* ---- connections
 * --------------------------------------------------------------- */

/* A zeroed connection of size bytes (a struct fr_tp_conn) of tp, peer
 * unknown, with a send queue of tp's depth in entries of esize bytes (0:
 * none); in no list yet.  NULL when out of memory. */
void *fr_tpb_conn_new(struct fr_tp *tp, size_t size, size_t esize);
/* Free a connection in no list: conn_down, its queue's regions released,
 * conn_free, its memory. */
void fr_tpb_conn_destroy(struct fr_tp_conn *c);
/* Into the endpoint's list (first), out of it (a parked one no longer
 * counts), and out of it and destroyed. */
void fr_tpb_conn_link(struct fr_tp_conn *c);
void fr_tpb_conn_unlink(struct fr_tp_conn *c);
void fr_tpb_conn_free(struct fr_tp_conn *c);
/* connect(): the caller's connection to peer, its deadline from now and
 * its first backoff; returns now (ms). */
uint64_t fr_tpb_conn_outgoing(struct fr_tp_conn *c, int peer, int backoff_ms);
/* A connection that a peer opened: in state, with a deadline for its
 * handshake, linked and counted as parked until accept() takes it. */
void fr_tpb_conn_park(struct fr_tp_conn *c, int state, uint64_t now);
/* accept(): the parked, established connection from peer, now the
 * caller's; NULL if it has not arrived. */
struct fr_tp_conn *fr_tpb_take(struct fr_tpb *b, int peer);
/*
 * An incoming hello's protocol version and job nonce against ours (the
 * rank it claims only names it): 0 when both match, else what to refuse
 * it with, FR_EPROTO or FR_EAUTH, with a warning.
 */
int fr_tpb_hello_check(const struct fr_tpb *b, int rank, unsigned int version,
		       unsigned int ours, uint64_t nonce);
/* connect_done()'s answer once progress is made: 0 up, the error once
 * failed, FR_EAGAIN before. */
int fr_tpb_conn_status(const struct fr_tp_conn *c);
/*
 * Fail a connection, once: set the endpoint's error text (a warning for
 * a peer breaking the protocol on a connection the caller holds), let the
 * transport release what it holds (conn_down) and the queued writes their
 * regions, remember err for later calls and owe the caller one error
 * completion plus one per queued write if it was established and theirs.
 */
void __attribute__((format(printf, 3, 4)))
fr_tpb_conn_fail(struct fr_tp_conn *c, int err, const char *fmt, ...);
/*
 * The endpoint's error text for c failing with err, as fr_tpb_conn_fail()
 * sets it ("connection to|from rank N: " and the message, at most
 * FR_TPB_CONN_MSG_LEN - 1 bytes of it): a warning for FR_ERANGE or
 * FR_EPROTO on a connection the caller holds when live (the failure
 * breaks an established connection: verbs, which fails its connections
 * its own way, asks only then; the base always), else debug.
 */
void __attribute__((format(printf, 4, 0)))
fr_tpb_conn_verr(struct fr_tp_conn *c, int err, bool live, const char *fmt,
		 va_list ap);
/* A refused attempt: the next one after the backoff, which doubles up to
 * max_ms; e is kept as last_errno. */
void fr_tpb_retry(struct fr_tp_conn *c, int e, uint64_t now, int max_ms);
/* t (ms, -1 forever) lowered to the connection's next handshake deadline
 * or retry, if it has one. */
int fr_tpb_due(const struct fr_tp_conn *c, int t, uint64_t now);
/* A failed connection's owed completions into the ring, in order, as far
 * as there is room: its error RECV, then an error SEND per queued write. */
void fr_tpb_flush_failed(struct fr_tp_conn *c);
/* Does the failed connection still owe the caller completions? */
bool fr_tpb_owes(const struct fr_tp_conn *c);

/* ---- a transport's own list
 * ---------------------------------------------------- */

/*
 * The link of a doubly linked list that a transport keeps of its own
 * objects (verbs and the mux: their registrations, freed at close): the
 * first member of each, so that a struct fr_tpb_link * converts back.
 */
struct fr_tpb_link {
	struct fr_tpb_link *prev, *next;
};

/* n into the list *head (first), and out of it. */
void fr_tpb_list_add(struct fr_tpb_link **head, struct fr_tpb_link *n);
void fr_tpb_list_del(struct fr_tpb_link **head, struct fr_tpb_link *n);

/* ---- the send queue
 * ------------------------------------------------------------ */

int fr_tpb_sq_init(struct fr_tpb_sq *q, unsigned int depth, size_t esize);
void fr_tpb_sq_fini(struct fr_tpb_sq *q);

/* The i-th queued entry (0: the oldest); i == count: the next free one. */
static inline void *fr_tpb_sq_at(const struct fr_tpb_sq *q, unsigned int i)
{
	return q->e + (size_t)((q->head + i) % q->depth) * q->esize;
}

/* Queue the entry at fr_tpb_sq_at(q, q->count), filled by the caller,
 * reading mr (NULL: nothing) and completing with ctx. */
void fr_tpb_sq_post(struct fr_tpb_sq *q, struct fr_tpb_mr *mr, uint64_t ctx);
/* Every queued entry stops reading its region (the connection failed or
 * goes away). */
void fr_tpb_sq_release(struct fr_tpb_sq *q);
/* c's oldest queued write is done: its SEND completion into the ring (the
 * caller checked for room), its region released, dequeued. */
void fr_tpb_sq_retire(struct fr_tp_conn *c);

/*
 * write_imm()'s checks before queueing on c: 0, the connection's error,
 * FR_EAGAIN (not up yet, or the queue is full), FR_EINVAL or FR_ERANGE
 * (the local range).  The peer's region bounds are not checked: the
 * receiver is the authority and checks every write itself.
 */
int fr_tpb_write_check(const struct fr_tp_conn *c, struct fr_tp_mr *lmr,
		       size_t loff, const struct fr_tp_rkey *rkey, size_t len);

/* ---- the region table
 * ---------------------------------------------------------- */

/*
 * A region id is a slot of the table; the slot's generation goes up at
 * every deregistration (never 0, so a zeroed key matches nothing), so a
 * key kept after dereg_mem never reaches what is registered there next.
 */
int fr_tpb_reg_mem(struct fr_tp *tp, void *buf, size_t len, int access,
		   struct fr_tp_mr **mr);
/* FR_EINVAL (not ours), FR_EBUSY (queued writes still read it) or 0. */
int fr_tpb_dereg_check(struct fr_tpb *b, struct fr_tpb_mr *mr);
int fr_tpb_dereg_mem(struct fr_tp *tp, struct fr_tp_mr *mr);
/* The region registered in slot id with generation gen, or NULL. */
struct fr_tpb_mr *fr_tpb_region(const struct fr_tpb *b, uint32_t id,
				uint32_t gen);

/*
 * A table region's key blob, the class's rkey.len bytes (integers
 * little-endian):
 *   u8 magic, u8 version, u16 0, u32 region id, u32 generation,
 *   u64 region length, and with a length of 28 a u64 region address.
 * Unpacked as a = length, b = address (0 without), c = id, d = generation.
 */
int fr_tpb_pack_rkey(struct fr_tp_mr *mr, void *blob, size_t *len);
int fr_tpb_unpack_rkey(struct fr_tp *tp, const void *blob, size_t len,
		       struct fr_tp_rkey *rkey);

#endif /* FR_TP_BASE_H */
