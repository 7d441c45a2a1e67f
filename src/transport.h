/* SPDX-License-Identifier: MIT */
/*
 * transport.h - the internal transport interface.
 *
 * Algorithms see the network only through this table of function pointers.
 * Its one data operation is a one-sided write with immediate: copy len bytes
 * from a local registered region into a peer's registered region at an
 * offset, then deliver a 32-bit immediate to the peer as a completion.  An
 * optional inline form (write_inline, below) sends a few bytes from any
 * memory with no SEND completion; the rules below hold for it too, but for
 * the SEND completion it does not have.
 *
 * Semantics every transport honours (the conformance suite checks them):
 *   - a FR_CQE_RECV completion means the bytes are already in place in the
 *     receiver's region;
 *   - a FR_CQE_SEND completion means the source bytes may be reused;
 *   - writes on one connection complete in the order they were posted, on
 *     both sides (FIFO);
 *   - the receiver checks every write against its registered regions
 *     (region exists, offset + len within it, remote write allowed) and fails
 *     the connection with FR_ERANGE otherwise: nothing is written out of
 *     bounds;
 *   - write_imm returns FR_EAGAIN when the connection's send queue is full
 *     (back-pressure); the caller polls and retries;
 *   - a peer that closes or dies produces one completion with a negative
 *     status on every connection to it; later operations on it fail.
 *
 * A transport is single-threaded: one thread at a time drives one endpoint
 * (the communicator's lock sees to it); only wake() may come from another.
 *
 * Layer: transports.  Called by the memory layer (registration, keys), the
 * peers (connections, writes, completions), the engine (poll, wait, wake)
 * and comm.c (open, close); a transport calls only the base (log, util)
 * and transports/common.
 */
#ifndef FR_TRANSPORT_H
#define FR_TRANSPORT_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most bytes of one write_inline. */
#define FR_TP_INLINE_MAX 32
/* Most bytes of one line (line_put, below). */
#define FR_TP_LINE_MAX 240
/* Largest opaque address blob and remote key blob. */
#define FR_TP_ADDR_MAX 128
#define FR_TP_RKEY_MAX 52 /* the ring's READY (2 keys) fits 128 bytes */

/* Registration access flags (least privilege: a peer may write only into
 * regions registered with FR_TP_REMOTE_WRITE). */
#define FR_TP_LOCAL_READ 0x1
#define FR_TP_LOCAL_WRITE 0x2
#define FR_TP_REMOTE_WRITE 0x4

struct fr_tp;      /* an endpoint: one per communicator  */
struct fr_tp_conn; /* a connection to one peer           */
struct fr_tp_mr;   /* a registered memory region         */

/*
 * A peer's region as unpacked from its key blob.  The core only stores and
 * copies it; its contents are the transport's own: most fill a/b/c/d (e.g.
 * region id + length for TCP, addr + rkey for verbs), and one that needs
 * more uses raw, all FR_TP_RKEY_BYTES of it, as a type of its own (the
 * mixed transport keeps a key per side there, struct fr_mux_rkey).
 */
#define FR_TP_RKEY_BYTES 48
struct fr_tp_rkey {
	union {
		struct {
			uint64_t a, b;
			uint32_t c, d;
		};
		unsigned char raw[FR_TP_RKEY_BYTES];
	};
};

enum fr_tp_cqe_kind {
	FR_CQE_SEND = 1, /* our write finished: the source may be reused      */
	FR_CQE_RECV = 2, /* a peer's write landed: its bytes are in our region */
};

struct fr_tp_cqe {
	int kind;                /* enum fr_tp_cqe_kind                    */
	int status;              /* 0, or a negative FR_E* code            */
	struct fr_tp_conn *conn; /* the connection it happened on          */
	uint64_t ctx;            /* SEND: the ctx given to write_imm       */
	uint32_t imm;            /* RECV: the immediate                    */
	uint32_t len;            /* RECV: bytes written                    */
};

/* What the core tells a transport when it opens an endpoint. */
struct fr_tp_params {
	size_t size;        /* sizeof(struct fr_tp_params)                   */
	int rank;           /* our rank, for messages and hello checks       */
	uint64_t job_nonce; /* connections presenting another nonce are refused */
	const char *local_ip; /* numeric address of the interface to use
			       * (the one we reached the rendezvous over), or NULL */
	int timeout_ms;     /* for connection establishment                  */
	int sq_depth;       /* writes in flight per connection before EAGAIN */
	char *errbuf;       /* where to write a message on failure           */
	size_t errlen;
};

struct fr_tp_ops {
	size_t size; /* sizeof(struct fr_tp_ops): lets the table grow */
	const char *name;

	/* Is the transport usable on this machine?  0 or FR_ENODEV with a
	 * message in errbuf. */
	int (*probe)(char *errbuf, size_t errlen);

	/* Open an endpoint; write its address blob (<= FR_TP_ADDR_MAX) to
	 * addr and its length to *addrlen. */
	int (*open)(const struct fr_tp_params *p, struct fr_tp **tp, void *addr,
		    size_t *addrlen);
	/* Start connecting to the peer of rank `peer` at its address blob.
	 * Non-blocking: returns a connection that connect_done() completes. */
	int (*connect)(struct fr_tp *tp, int peer, const void *addr,
		       size_t addrlen, struct fr_tp_conn **conn);
	/* Take the connection that peer `peer` opened to us (the peer's hello
	 * names its rank).  Non-blocking: FR_EAGAIN until it has arrived. */
	int (*accept)(struct fr_tp *tp, int peer, struct fr_tp_conn **conn);
	/* 0 once the connection is established, FR_EAGAIN before, or an error
	 * (peer refused, wrong nonce, ...).  Advances the handshake. */
	int (*connect_done)(struct fr_tp_conn *conn);

	int (*reg_mem)(struct fr_tp *tp, void *buf, size_t len, int access,
		       struct fr_tp_mr **mr);
	int (*dereg_mem)(struct fr_tp *tp, struct fr_tp_mr *mr);
	/* The key a peer needs to write into mr (<= FR_TP_RKEY_MAX bytes). */
	int (*pack_rkey)(struct fr_tp_mr *mr, void *blob, size_t *len);
	/* Validate and decode a peer's key blob. */
	int (*unpack_rkey)(struct fr_tp *tp, const void *blob, size_t len,
			   struct fr_tp_rkey *rkey);

	/*
	 * Write len bytes at loff in the local region lmr to roff in the peer's
	 * region rkey, then deliver imm.  len may be 0 (lmr and rkey may then
	 * be NULL): only the immediate travels.  ctx comes back in the SEND
	 * completion.  FR_EAGAIN when the send queue is full.
	 */
	int (*write_imm)(struct fr_tp_conn *conn, struct fr_tp_mr *lmr,
			 size_t loff, const struct fr_tp_rkey *rkey,
			 uint64_t roff, size_t len, uint32_t imm, uint64_t ctx);
	/*
	 * Optional (NULL): the small-message (low-latency) form of write_imm.
	 * len (1 ..= FR_TP_INLINE_MAX) bytes are taken from buf, which need
	 * not be registered, before the call returns, and no SEND completion
	 * follows.  The receiver sees exactly what write_imm would give it
	 * (the bytes in its region, then a RECV completion), in order with
	 * the connection's other writes.  A transport sends them the cheapest
	 * way it has: shm writes data, header and sequence word into one
	 * cache line that the receiver polls, verbs posts them inline in an
	 * unsignalled work request or as a line the peer polls.  FR_EAGAIN
	 * when they cannot go at once (no room, or writes queued before
	 * them): the caller sends them by write_imm instead, which keeps the
	 * order.  A transport may put the bytes in place only when it raises
	 * the RECV completion (verbs' lines): a later write into the same
	 * bytes before that completion was taken may then be overwritten,
	 * which the core never does (a mailbox slot is written again only
	 * after its receiver handed back its credit).
	 */
	int (*write_inline)(struct fr_tp_conn *conn, const void *buf,
			    const struct fr_tp_rkey *rkey, uint64_t roff,
			    size_t len, uint32_t imm);

	/* Make progress and return up to max completions (>= 0), or a negative
	 * code if the endpoint itself failed. */
	int (*poll)(struct fr_tp *tp, struct fr_tp_cqe *cqe, int max);
	/*
	 * Block until there may be something for poll() or timeout_ms passes
	 * (-1: forever).  Returns 0 (woken or timed out) or an error.  Called
	 * only after poll() returned 0, so a transport can arm notifications
	 * there.
	 */
	int (*wait)(struct fr_tp *tp, int timeout_ms);
	/*
	 * Make a wait() in progress (or the next one) return soon.  The only
	 * operation that may be called from another thread while one thread
	 * is inside any other: the progress thread sleeps in wait() and an
	 * application thread that needs the communicator wakes it.
	 */
	void (*wake)(struct fr_tp *tp);

	/*
	 * A sleep split in three, so that one thread can sleep on several
	 * transports at once (the mixed transport): wait_prepare() arms the
	 * notifications and returns 1 if something is ready already (then
	 * no sleep), 0 when armed, lowering *timeout_ms to its own deadlines;
	 * wait_fd() becomes readable when the transport may have work;
	 * wait_finish() undoes what prepare armed.  Optional (NULL: the
	 * transport cannot be mixed).
	 */
	int (*wait_prepare)(struct fr_tp *tp, int *timeout_ms);
	int (*wait_fd)(struct fr_tp *tp);
	void (*wait_finish)(struct fr_tp *tp);

	void (*close_conn)(struct fr_tp_conn *conn);
	void (*close)(struct fr_tp *tp);

	/* The peer rank of a connection. */
	int (*conn_peer)(const struct fr_tp_conn *conn);

	/* Optional (NULL): the endpoint's most recent error message, "" if
	 * none, for the core to quote when a call failed. */
	const char *(*last_error)(struct fr_tp *tp);

	/* Optional (NULL): the ranks of up to max incoming connections that
	 * wait for accept(), written to peers; returns how many.  Cheap when
	 * there are none.  Lets a rank take a connection it does not need yet,
	 * so that the peer that opened it can tell whether it is alive
	 * (peer.c, "Slow or dead"). */
	int (*pending)(struct fr_tp *tp, int *peers, int max);

	/* Optional (NULL): the CPUs local to the endpoint's device (an RDMA
	 * adapter's NUMA node), where the progress thread goes by default
	 * (affinity.c).  0 with *cpus filled, or FR_ENODEV when the device
	 * says nothing (a software device). */
	int (*locality)(struct fr_tp *tp, cpu_set_t *cpus);

	/*
	 * Optional (all three NULL, or line_bytes returning 0): lines, a
	 * channel of each connection beside its writes, for a collective
	 * small enough to go whole in one message (the one-shot All-Reduce
	 * over lines, algo/ll.c).  Each direction of a connection has two
	 * lines, one for odd and one for even numbers: line_put(seq) copies
	 * len (1 ..= line_bytes) bytes from buf into the line of seq's
	 * parity and then publishes seq there, and the peer's
	 * line_get(seq) sees them once published: the bytes it asked for
	 * copied to buf and their count returned (the put's len, which may
	 * differ from the len asked for: at most len are copied), 0 while
	 * the line holds another number.  No region, no key, no completion:
	 * the receiver polls the line itself (one cache line between two
	 * cores for a short one), and a put to a sleeping peer wakes it, as
	 * a write would (its wait treats a line it waits for as something
	 * for poll, so poll must then be called and returns nothing for
	 * it).  The caller sees to it that a put never overwrites what the
	 * peer has not read: it puts seq only after getting seq - 1 from
	 * that peer, who got seq - 2 from it before putting seq - 1.
	 * Numbers start at 1 (a line starts at 0, which no get asks for).
	 * line_put returns 0, FR_EAGAIN (not connected yet) or the
	 * connection's error; line_get a count, 0, or the error.
	 * line_bytes: the endpoint's largest line, 0 where it has none (a
	 * view other than the first of a shared endpoint: lines are the
	 * connection's, not a communicator's).
	 */
	size_t (*line_bytes)(struct fr_tp *tp);
	int (*line_put)(struct fr_tp_conn *conn, uint64_t seq, const void *buf,
			size_t len);
	int (*line_get)(struct fr_tp_conn *conn, uint64_t seq, void *buf,
			size_t len);
};

/*
 * The shared endpoint (transports/share): several communicators over one
 * endpoint and its connections (fr_comm_split, fr_comm_dup).  Each
 * communicator gets a view, an endpoint of its own behind the same
 * interface, numbered by its ranks, with an id (0..FR_SHARE_IDS - 1) equal
 * on all its ranks.  A view's writes carry the id in the bits of the
 * immediate (and the SEND ctx) below, which the core therefore never sets:
 * an immediate's own payload is 20 bits (peer.h), a ctx's own bits are
 * 0..47 and 56..63.
 */
#define FR_SHARE_IDS 256
#define FR_TP_IMM_ID_SHIFT 20
#define FR_TP_IMM_ID_MASK (0xffu << FR_TP_IMM_ID_SHIFT)
#define FR_TP_CTX_ID_SHIFT 48
#define FR_TP_CTX_ID_MASK (0xffull << FR_TP_CTX_ID_SHIFT)
/* A write whose source is the caller's memory (the core's user buffers):
 * a view closing a connection with such writes still queued closes the
 * real one, so that nothing reads that memory afterwards. */
#define FR_TP_CTX_USER (1ull << 62)

struct fr_share;
/* Share the endpoint tp of ops (this process is rank of nranks): its first
 * view, of every rank with id 0, in *vops / *view.  From then on the views
 * own tp, and the last one closed closes it; on failure the caller still
 * does. */
int fr_share_new(const struct fr_tp_ops *ops, struct fr_tp *tp, int rank,
		 int nranks, const struct fr_tp_ops **vops,
		 struct fr_tp **view);
/* The endpoint's peers' address blobs ([nranks][FR_TP_ADDR_MAX]), copied. */
int fr_share_set_addrs(struct fr_share *s, const uint8_t *addrs,
		       const uint8_t *addrlens);
/* A view for a communicator whose rank i is the endpoint's rank
 * members[i] (n of them), with the operations it is driven by; its id is
 * set later (fr_share_set_id) and it receives nothing before.  The caller
 * holds the lock of a communicator already on s, if there is one. */
int fr_share_view(struct fr_share *s, const int *members, int n,
		  const struct fr_tp_ops **ops, struct fr_tp **view);
/* 0, or FR_EBUSY if id is taken. */
int fr_share_set_id(struct fr_tp *view, int id);
/* The ids in use (bit i of used[i / 8]). */
void fr_share_ids_used(struct fr_share *s, uint8_t used[FR_SHARE_IDS / 8]);
struct fr_share *fr_share_of(struct fr_tp *view);
/* The endpoint rank of the view's rank i, or -1. */
int fr_share_member(struct fr_tp *view, int i);
/* The view is about to close: clean says every peer it talked to has said
 * goodbye, so nothing more can come for its id; otherwise the id is kept
 * from reuse, and the regions deregistered from now on stay registered
 * until the endpoint closes (a late write must find them): dereg_mem then
 * returns FR_EBUSY, and the caller keeps their memory. */
void fr_share_closing(struct fr_tp *view, bool clean);
/* Take buf (len bytes) over, for a region that stays registered: it is
 * released, by release(buf, len), once the endpoint has closed and nothing
 * can land in it.  0, or FR_ENOMEM (then the caller must keep it). */
int fr_share_adopt(struct fr_tp *view, void *buf, size_t len,
		   void (*release)(void *buf, size_t len));

extern const struct fr_tp_ops fr_tcp_ops;
extern const struct fr_tp_ops fr_shm_ops;
extern const struct fr_tp_ops fr_mux_ops; /* shm within a node, tcp across */
#ifdef FR_HAVE_VERBS
extern const struct fr_tp_ops fr_verbs_ops;
extern const struct fr_tp_ops fr_mux_verbs_ops; /* shm within, verbs across */
#endif

/* The transport named `name` ("tcp", "shm", "verbs", "shm+tcp",
 * "shm+verbs") or NULL. */
const struct fr_tp_ops *fr_transport_find(const char *name);
/* Add a transport that fr_transport_find (FR_TRANSPORT, fr_config_t's
 * transport) then finds by its name: the unit tests' in-process fake
 * (tests/fake_tp.c).  Internal, not exported; not thread-safe: call before
 * any communicator exists.  0, or FR_EINVAL (name taken), FR_ENOMEM. */
int fr_transport_register(const struct fr_tp_ops *ops);

#endif /* FR_TRANSPORT_H */
