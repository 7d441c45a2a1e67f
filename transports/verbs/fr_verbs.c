/* SPDX-License-Identifier: MIT */
/*
 * fr_verbs.c - the RDMA verbs transport: write-with-immediate on RC queue
 * pairs, connections set up with librdmacm.
 *
 * Here the interface in transport.h maps one to one onto the hardware:
 * write_imm() is an IBV_WR_RDMA_WRITE_WITH_IMM into the peer's registered
 * region, the peer's HCA checks the remote key and the bounds (so no byte
 * lands outside a region, whatever the sender does), and the immediate
 * consumes one of the receives the peer keeps posted, raising its
 * FR_CQE_RECV.  RC delivers and completes in order, which gives the FIFO
 * rule on both sides.  With FR_IB_QPS > 1 a large write is striped over
 * several QPs and its immediate follows on the first one (below).
 *
 * Design
 *   - One endpoint = one rdma_cm event channel + one listening cm id bound
 *     to the chosen address (port 0: ephemeral) + one protection domain +
 *     one completion queue shared by the send and receive sides of every
 *     QP, with a completion channel for wait().  PD and CQ are made at
 *     open() on the listening id's device, so the core can register memory
 *     before any connection exists.
 *   - Device, port and GID: FR_IB_DEV=name[:port] restricts the search;
 *     otherwise the ACTIVE port whose RoCE v2 GID table holds local_ip (the
 *     interface the rendezvous went over) wins; failing that, the first
 *     ACTIVE port, ranking devices by hwloc locality to the calling thread
 *     when there are several.  The GID is the RoCE v2 IPv4-mapped entry
 *     (FR_IB_GID_INDEX=n overrides); its address is what we bind and
 *     advertise, so rdma_cm resolves to that very GID.  InfiniBand ports
 *     are addressed by their IPoIB address (local_ip), as rdma_cm expects.
 *     A loopback local_ip is no hint at all (rdma_cm cannot run over lo).
 *   - Everything is non-blocking: cm events are read from a non-blocking
 *     channel inside accept(), connect_done(), poll() and wait(); connects
 *     that are refused (the peer may not listen yet) or fail to resolve
 *     are retried with a back-off until the timeout.  An incoming request
 *     is judged (magic, version, job nonce, a rank not already connected)
 *     and accepted at once, so the connector's connect_done() and our
 *     accept() both complete on ESTABLISHED without waiting for each
 *     other's calls; a refusal carries a reply the connector turns into
 *     FR_EAUTH / FR_EBUSY / FR_EPROTO.  Receive completions of a connection
 *     accept() has not handed out yet are held back (its receives are then
 *     not reposted, so the hold is bounded) and released in order after.
 *   - Several QPs per connection (FR_IB_QPS=n, 1..8, default 1), so that
 *     a large write spreads over n flows (ECMP on RoCE fabrics, bonded
 *     ports).  Lane 0 is the rdma_cm QP; lanes 1..n-1 are plain RC QPs on
 *     the same PD and CQ, connected by hand: the connector creates them
 *     (RESET) and lists their QP numbers in its hello; the acceptor takes
 *     min(its n, the proposal), brings its own extra QPs to RTS before it
 *     accepts (path, MTU, timeouts, access from rdma_init_qp_attr() on the
 *     request's cm id; only dest_qp_num and the PSNs are the lane's, a
 *     PSN being a hash of the sending QP's number) and lists them in its
 *     reply; the connector connects its lanes on ESTABLISHED, drops the
 *     ones not taken, and sends a lanes-ready message on lane 0.  The
 *     acceptor stripes nothing before that message arrives: librdmacm
 *     sends the RTU (the acceptor's ESTABLISHED) before the connector has
 *     seen its own ESTABLISHED, so the connector's lanes may still be in
 *     RESET, where packets are dropped.  Lanes 1.. carry plain RDMA
 *     WRITEs only; each keeps one receive posted that no message takes, so
 *     that a part breaking our registration (the HCA stops the QP) shows
 *     as a flushed receive: FR_ERANGE, as on lane 0.  Lanes are created,
 *     flushed, destroyed and counted in the CQ like lane 0; an error on
 *     any fails the connection; completions are matched to a lane by
 *     qp_num (a destroyed lane's match nothing).
 *   - Striping: a write of at least FR_IB_STRIPE_BYTES (default 256 KiB)
 *     on a connection whose lanes are ready is cut into n parts (rounded
 *     up to 64 bytes), part i a plain RDMA WRITE on lane i.  Lane 0's part
 *     is ordered before anything posted after it on lane 0 by RC; the
 *     parts on lanes 1.. are signalled, and once all have completed (an
 *     RC write completes when its data is placed at the responder) the
 *     notification goes on lane 0: a SEND WITH IMM whose 8-byte payload
 *     holds the whole length, since the receive completion of a write
 *     with immediate reports only that WR's length.  Notifications wait
 *     in a per-connection FIFO (c->notes) and leave in write_imm() order;
 *     a later write, striped or not, posts its data at once but joins the
 *     FIFO while it is not empty (its immediate then also goes as a
 *     notification).  The write's FR_CQE_SEND is its notification's
 *     completion, so it comes after all its parts.  Receives on lane 0
 *     get an 8-byte slot each in a per-connection registered buffer
 *     (c->ctl), named by the wr_id; a notification's payload is checked
 *     (magic) and a malformed one fails the connection (FR_EPROTO).
 *   - Send queue accounting: each QP has a ring of the WRs posted on it.
 *     At most sq_depth writes are in flight per connection and at most
 *     sq_depth WRs other than fences per QP (then FR_EAGAIN), plus a few
 *     slots for fences (below).  Lane 0 keeps one slot reserved per
 *     notification not posted yet, so posting it never finds the queue
 *     full; a write takes all its slots or returns FR_EAGAIN with nothing
 *     posted.  The HW send queue has exactly as many entries as the ring,
 *     and an entry leaves the ring only when the completion that covers it
 *     is polled, so ibv_post_send() never meets a full queue.
 *   - Selective signalling: a WR is signalled when its ctx is not 0 (the
 *     core wants to know when that source is free), every 16th WR, and when
 *     the queue is about to fill (so a full queue always has a completion
 *     coming).  RC completes WRs in order, so a signalled completion also
 *     completes every earlier unsignalled WR: it retires the ring up to
 *     itself, raising one FR_CQE_SEND per write, in order.
 *   - Fences: the core waits for a SEND completion of every write, so an
 *     unsignalled tail must not stay uncovered.  After draining the CQ
 *     (and before wait() sleeps) every QP whose newest WR is unsignalled
 *     gets a signalled zero-length RDMA WRITE.  It carries no immediate, so
 *     it consumes no receive at the peer and raises nothing there; its
 *     completion retires the tail.  A busy QP pays one fence per poll, an
 *     idle one none.
 *   - Completions: ibv_poll_cq in batches, into a ring of FR completions
 *     that poll() hands out.  One work completion retires at most 16
 *     writes, and the CQ is polled only while the ring has room for that,
 *     so nothing is ever dropped.  wc.status is checked before wc.opcode
 *     (the opcode of an error completion is undefined).  wr_id names the
 *     connection (slot, generation) and the ring position; wc.qp_num must
 *     also match, so completions of a QP destroyed meanwhile (they stay in
 *     a shared CQ) are recognised and ignored.
 *   - Failure: the first error on a connection (a work completion in
 *     error, the peer's DISCONNECTED, a local error) fails it: we
 *     rdma_disconnect() (the peer learns at once, and the QP enters the
 *     error state, which flushes every outstanding WR with a completion:
 *     each write gets its FR_CQE_SEND with an error, once; a write whose
 *     notification was never posted gets it once its parts are flushed
 *     and lane 0's ring is empty, in order), and we owe the
 *     caller one FR_CQE_RECV with the error unless the failure itself was
 *     a receive completion.  Flushed receives raise nothing.  Later
 *     write_imm() calls return FR_EPEER.  Answering DISCONNECTED with
 *     rdma_disconnect() sends the DREP; without it the peer waits out the
 *     CM's DREQ timeout (~100 s).  The DISCONNECTED of a live connection is
 *     applied only after the CQ has been drained, so that completions that
 *     happened before it (a receive in error, the last writes) come first.
 *   - CQ size: every QP reserves its send and receive depth in the shared
 *     CQ (ibv_resize_cq when it would not fit), so the CQ cannot overflow.
 *     A destroyed QP's reservation is kept until the CQ has been seen
 *     empty, because its completions may still sit in the CQ.
 *   - Limits: a write is at most the port's max_msg_sz (8 MiB on rxe, 1-2
 *     GiB on ConnectX; FR_EINVAL beyond), striped or not: below the stripe
 *     size and before the lanes are ready it goes as one WR.
 *     fork(): librdmacm opens each device once per process, and a
 *     child forked after its parent opened an endpoint inherits that
 *     context, which the kernel will not serve to it (rxe rings its send
 *     doorbell with a write(): EACCES, reported with a hint); such a child
 *     must exec a new program.
 *
 * Wire formats (all integers little-endian)
 *
 *   connection request private data (hello), 24 + 4 * x bytes (<= 52)
 *      0 u32 magic "FRVB" (0x42565246)   4 u16 version (1)
 *      6 u16 kind (1 = hello)            8 i32 connector's rank
 *     12 u16 x: extra QPs proposed (0..7, FR_IB_QPS - 1)
 *     14 u16 reserved (0)               16 u64 job nonce
 *     24 u32[x] QP numbers of the connector's lanes 1..x
 *     (x used to be part of a reserved u32 that had to be 0: a peer
 *     without FR_IB_QPS refuses x > 0 as malformed, FR_EPROTO, and
 *     sends x = 0, so one QP interoperates both ways)
 *   accept private data, 12 or 16 + 4 * y bytes: magic, version, kind 2,
 *     i32 our rank, then u16 y: extra QPs taken (<= x; absent or zero
 *     padding: 0), u16 reserved (0), u32[y] QP numbers of our lanes 1..y
 *   lane 0 messages other than writes with immediate, 8 bytes each:
 *     notification: SEND WITH IMM (the write's immediate), payload u32
 *       length of the whole write, u32 magic "FNOT" (0x544f4e46)
 *     lanes ready (connector -> acceptor, once, before any notification
 *       of its own): SEND, payload u32 magic "FRDY" (0x59445246), u32 n
 *   reject private data, 12 bytes: magic, version, kind 3, i32 status
 *     (FR_EPROTO: version or malformed, FR_EAUTH: wrong nonce, FR_EBUSY:
 *     that rank is already connected).  A request without our magic is
 *     rejected without private data.  A rejection without our reply (no
 *     listener yet) is retried; one with it is final.
 *   address blob, 28 bytes: u8 magic (0xfb), u8 version (1), u8 family
 *     (4 = IPv4, 6 = IPv6), u8 reserved (0), u16 port, u16 reserved (0),
 *     u32 IPv6 scope id (0 for IPv4), u8[16] address (IPv4: first 4 bytes).
 *   remote key blob, 24 bytes: u8 magic (0xfd), u8 version (1), u16
 *     reserved (0), u32 rkey, u64 region address, u64 region length.
 *     Unpacked as a = address, b = length, c = rkey, d = VERBS_RKEY_TAG.
 *     roff in write_imm() is relative to the region start; the sender
 *     checks roff + len against the length (FR_ERANGE, nothing posted), the
 *     peer's HCA checks it again against its real registration.
 *
 * Environment: FR_IB_DEV=name[:port], FR_IB_GID_INDEX=n, FR_IB_TIMEOUT=t
 * (ACK timeout exponent), FR_IB_RETRY_CNT=n, FR_IB_QPS=n (QPs per
 * connection, 1..8), FR_IB_STRIPE_BYTES=size (smallest striped write, K/M/G
 * suffixes, 1 B..1 GiB), FR_POLL=spin (wait() returns at once: the core
 * then busy-polls).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <hwloc.h>
#include <hwloc/linux.h>
#include <hwloc/openfabrics-verbs.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "fastreduce.h"
#include "log.h"
#include "tp_cqring.h"
#include "transport.h"
#include "util.h"

#define VERBS_MAGIC 0x42565246u /* "FRVB" */
#define VERBS_VERSION 1
#define VERBS_KIND_HELLO 1
#define VERBS_KIND_ACCEPT 2
#define VERBS_KIND_REJECT 3
#define VERBS_HELLO_LEN 24 /* plus 4 bytes per extra QP */
#define VERBS_REPLY_LEN 12
#define VERBS_ACCEPT_LEN 16 /* plus 4 bytes per extra QP */

#define VERBS_ADDR_LEN FR_SOCKADDR_BLOB_LEN
#define VERBS_ADDR_MAGIC 0xfb /* util.h's address blob, tagged as ours */

#define VERBS_RKEY_LEN 24
#define VERBS_RKEY_MAGIC 0xfd
#define VERBS_RKEY_VERSION 1
/* struct fr_tp_rkey.d of a key we unpacked: a zeroed or foreign key has
 * another value and is refused. */
#define VERBS_RKEY_TAG 0x76657262u

#define VERBS_DEFAULT_SQ_DEPTH 64
#define VERBS_MAX_SQ_DEPTH 16384
#define VERBS_DEFAULT_TIMEOUT_MS 30000
/* Ring slots beyond sq_depth, for fences only. */
#define VERBS_FENCE_SLOTS 4
/* At most this many WRs in a row go unsignalled. */
#define VERBS_SIG_INTERVAL 16
#define VERBS_MAX_INLINE 64
#define VERBS_POLL_BATCH 32
/* One work completion becomes at most this many FR completions (the
 * writes it retires, plus an owed receive error). */
#define VERBS_WC_FANOUT (VERBS_SIG_INTERVAL + 1)
#define VERBS_RESOLVE_MS 2000
#define VERBS_BACKOFF_MIN_MS 10
#define VERBS_BACKOFF_MAX_MS 500
#define VERBS_MAX_SLOTS 65535
/* Accepted connections not yet handed out by accept(). */
#define VERBS_MAX_PENDING 256
#define VERBS_LISTEN_BACKLOG 64
#define VERBS_CQ_ACK_BATCH 64
#define VERBS_RECV_BATCH 64
#define VERBS_ERRBUF_LEN 256
#define VERBS_MAX_CANDS 64
/* rdma_cm: retry_count and rnr_retry_count; 7 = retry RNR forever, so a
 * receiver that is slow to repost only delays the sender. */
#define VERBS_CM_RETRY 7
/*
 * The QP's ACK timeout, 4.096 us * 2^t: how long a sender waits for an ACK
 * before it goes back and resends (go-back-N).  rdma_cm's default on
 * RoCE is about a second, so every lost packet stalls a connection for a
 * second: with 1 % loss a collective ran 16x slower on Soft-RoCE.  14 is
 * 67 ms, far above any data-centre round trip; FR_IB_TIMEOUT sets it
 * (0 keeps rdma_cm's), FR_IB_RETRY_CNT the retries (0..7) before the QP
 * fails with a transport retry error.
 */
#define VERBS_ACK_TIMEOUT 14

#define VERBS_WRID_RECV (1ull << 32)

/* Multi-QP striping (FR_IB_QPS, FR_IB_STRIPE_BYTES; see the top). */
#define VERBS_MAX_QPS 8
#define VERBS_DEFAULT_STRIPE (256u * 1024u)
#define VERBS_MAX_STRIPE (1ul << 30)
/* Parts start on this boundary (except the last one's end). */
#define VERBS_PART_ALIGN 64
/* The payload of a notification or a lanes-ready message. */
#define VERBS_CTL_LEN 8
#define VERBS_NOTE_MAGIC 0x544f4e46u  /* "FNOT" */
#define VERBS_READY_MAGIC 0x59445246u /* "FRDY" */

struct fr_tp_mr {
	struct fr_tp *tp;
	struct fr_tp_mr *prev, *next; /* tp->mrs */
	struct ibv_mr *mr;	      /* NULL for an empty region */
	uint8_t *base;
	size_t len;
	unsigned int inflight; /* posted writes still reading from it */
};

enum verbs_sqe_kind {
	VERBS_SQE_FENCE, /* a zero-length write that only signals the tail */
	VERBS_SQE_PLAIN, /* QP 0's part of a write, the lanes-ready message */
	VERBS_SQE_USER,	 /* the WR that completes a write_imm(): FR_CQE_SEND */
	VERBS_SQE_PART,	 /* a part on QP 1..n-1: its notification waits */
};

/* A posted send WR, in posting order. */
struct verbs_sqe {
	uint64_t ctx;
	struct fr_tp_mr *mr; /* NULL once it no longer reads it */
	uint64_t note;	     /* PART: its notification's seq in c->notes */
	uint8_t kind;	     /* enum verbs_sqe_kind */
};

/*
 * One RC QP of a connection and the ring of the WRs posted on it: WRs
 * sq_head .. sq_tail-1, slot = seq % sq_cap.
 */
struct verbs_lane {
	struct ibv_qp *qp;
	struct verbs_sqe *sq;
	uint64_t sq_head, sq_tail;
	unsigned int nwr;	 /* WRs in the ring that are not fences */
	unsigned int unsignaled; /* unsignalled WRs at the tail */
	unsigned int max_inline;
	unsigned int cq_share; /* CQ entries reserved for this QP */
	uint64_t last_raddr;   /* for fences: a remote address known valid */
	uint32_t last_rkey;
};

/*
 * A write whose immediate is not posted yet (its parts on other QPs are
 * still in flight, or an earlier one waits): notifications leave QP 0 in
 * the order of the write_imm() calls.
 */
struct verbs_note {
	uint64_t ctx;
	uint32_t imm, len;
	unsigned int parts_left; /* parts on QPs 1..n-1 not completed yet */
	bool silent; /* write_imm() failed: no FR_CQE_SEND is owed for it */
};

/* A receive completion held back until accept() hands the conn out. */
struct verbs_held {
	uint32_t imm, len;
};

enum verbs_state {
	VERBS_RETRY,	  /* outgoing: waiting for the next attempt */
	VERBS_ADDR,	  /* outgoing: resolving the address */
	VERBS_ROUTE,	  /* outgoing: resolving the route */
	VERBS_CONNECTING, /* outgoing: request sent, awaiting the reply */
	VERBS_ACCEPTING,  /* incoming: accepted, awaiting ESTABLISHED */
	VERBS_UP,	  /* established */
	VERBS_FAILED,	  /* dead; completions may still be owed */
};

struct fr_tp_conn {
	struct fr_tp *tp;
	struct fr_tp_conn *prev, *next; /* tp->conns */
	uint32_t slot;			/* in tp->slots, for wr_id */
	uint32_t gen;			/* of the slot, for wr_id */
	struct rdma_cm_id *id;
	int peer;
	enum verbs_state state;
	bool incoming;
	bool owned;	   /* the caller holds it (from connect or accept) */
	int error;	   /* why it failed */
	bool was_up;	   /* it failed after being established */
	bool err_owed;	   /* its error FR_CQE_RECV is not in the ring yet */
	bool synth;	   /* no flush will come: complete the ring ourselves */
	bool disconnected; /* rdma_disconnect() was called */
	bool peer_gone;	   /* DISCONNECTED seen, applied after the CQ drain */

	/* establishment */
	struct sockaddr_storage dst;
	uint64_t deadline_ms;
	uint64_t retry_ms;
	int backoff_ms;
	char why[128]; /* the last reason an attempt failed */

	/* QPs: lane 0 is the rdma_cm QP (id->qp while it exists), lanes
	 * 1..nqps-1 are connected by hand; a lane's qp is NULL when gone. */
	struct verbs_lane lane[VERBS_MAX_QPS];
	unsigned int nqps; /* lanes in use (negotiated) */
	bool lanes_ready;  /* the peer's lanes 1.. can receive */
	unsigned int sq_cap;
	unsigned int user_inflight; /* write_imm()s not completed yet */

	/* notifications not posted yet: seq note_head .. note_tail-1 */
	struct verbs_note *notes;
	uint64_t note_head, note_tail;

	/* Registered payloads: sq_cap send slots (by lane 0's ring slot),
	 * then rq_depth receive slots (by the receive's wr_id). */
	uint8_t *ctl;
	struct ibv_mr *ctl_mr;
	uint32_t rq_tail;  /* receives posted on lane 0 so far */
	uint64_t nstriped; /* writes striped so far (logged at close) */

	/* receive completions held back until accept() */
	struct verbs_held *held;
	unsigned int held_head, held_count;
};

struct fr_tp {
	int rank;
	uint64_t nonce;
	int timeout_ms;
	unsigned int sq_depth; /* writes in flight per QP */
	unsigned int sq_cap;   /* ring and HW send queue size */
	unsigned int rq_depth; /* receives posted per QP */
	bool spin;	       /* FR_POLL=spin: wait() never blocks */
	uint8_t ack_timeout;   /* FR_IB_TIMEOUT; 0: rdma_cm's own */
	uint8_t retry_cnt;     /* FR_IB_RETRY_CNT */
	unsigned int nqps;     /* FR_IB_QPS: QPs per connection we propose */
	size_t stripe;	       /* FR_IB_STRIPE_BYTES */
	int fatal;	       /* the endpoint itself failed */
	int wfd;	       /* eventfd: wake() ends a wait() */
	int epfd;	       /* wait_fd() for shm+verbs, made on first use */

	struct rdma_event_channel *ec;
	struct rdma_cm_id *lid; /* listening */
	struct ibv_pd *pd;
	struct ibv_comp_channel *cc;
	struct ibv_cq *cq;
	int cq_size;
	int max_cqe;
	unsigned int cq_need;	/* reserved by live QPs */
	unsigned int cq_linger; /* reserved by destroyed QPs */
	unsigned int cq_unacked;
	uint32_t max_msg;
	struct sockaddr_storage addr; /* bound */

	struct fr_tp_conn *conns;
	unsigned int npending; /* accepted, not handed out */
	struct fr_tp_conn **slots;
	uint32_t *slot_gen;
	uint32_t nslots;
	struct fr_tp_mr *mrs;

	struct fr_cqring ring;
	char errbuf[VERBS_ERRBUF_LEN];
};

/* ---- small helpers ------------------------------------------------------- */

static void __attribute__((format(printf, 3, 4)))
verbs_seterr(struct fr_tp *tp, int level, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(tp->errbuf, sizeof(tp->errbuf), fmt, ap);
	va_end(ap);
	fr_log(level, "verbs: rank %d: %s", tp->rank, tp->errbuf);
}

static void __attribute__((format(printf, 3, 4)))
verbs_msg(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!buf || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

static void verbs_sa_set_port(struct sockaddr_storage *sa, uint16_t port)
{
	if (sa->ss_family == AF_INET6)
		((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
	else
		((struct sockaddr_in *)sa)->sin_port = htons(port);
}

static int verbs_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -1;
	return 0;
}

static bool verbs_v4mapped(const uint8_t *raw)
{
	static const uint8_t prefix[12] = {0, 0, 0, 0, 0,    0,
					   0, 0, 0, 0, 0xff, 0xff};

	return !memcmp(raw, prefix, sizeof(prefix));
}

/*
 * strerror(), plus the likely cause of EACCES: librdmacm opens each device
 * once per process, and a child forked after that inherits the parent's
 * context, whose write()-based commands (rxe rings its send doorbell that
 * way) the kernel refuses to any other process.
 */
static const char *verbs_strerror(int e, char *buf, size_t len)
{
	snprintf(
		buf, len, "%s%s", fr_syserr(e),
		e == EACCES
			? " (RDMA device contexts do not survive fork(): a child forked after its parent opened the device must exec a new program)"
			: "");
	return buf;
}

/* "PORT_ACTIVE" -> "ACTIVE" */
static const char *verbs_port_state(enum ibv_port_state s)
{
	const char *t = ibv_port_state_str(s);

	return strncmp(t, "PORT_", 5) ? t : t + 5;
}

/* The FR status of a failed work completion. */
static int verbs_wc_status(enum ibv_wc_status s)
{
	switch (s) {
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_LOC_PROT_ERR:
		return FR_ERANGE;
	default:
		return FR_EPEER;
	}
}

/* Before rdma_connect / rdma_accept: the QP's ACK timeout (see
 * VERBS_ACK_TIMEOUT).  A kernel that refuses the option keeps its own:
 * slower recovery from loss, nothing worse. */
static void verbs_set_ack_timeout(struct fr_tp *tp, struct rdma_cm_id *id)
{
	uint8_t t = tp->ack_timeout;

	if (t && rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT,
				 &t, sizeof(t)))
		fr_dbg("verbs: rank %d: RDMA_OPTION_ID_ACK_TIMEOUT %u: %s",
		       tp->rank, t, fr_syserr(errno));
}

/* ---- connections: life cycle --------------------------------------------- */

static uint64_t verbs_wrid(const struct fr_tp_conn *c, bool recv, uint32_t seq)
{
	return (uint64_t)c->slot << 48 | (uint64_t)(c->gen & 0x7fff) << 33 |
	       (recv ? VERBS_WRID_RECV : 0) | seq;
}

static int verbs_slot_get(struct fr_tp *tp, struct fr_tp_conn *c)
{
	struct fr_tp_conn **slots;
	uint32_t *gens;
	uint32_t i, cap;

	for (i = 0; i < tp->nslots; i++)
		if (!tp->slots[i])
			break;
	if (i == tp->nslots) {
		if (tp->nslots >= VERBS_MAX_SLOTS)
			return FR_ENOMEM;
		cap = FR_MIN(tp->nslots ? tp->nslots * 2 : 16,
			     (uint32_t)VERBS_MAX_SLOTS);
		slots = realloc(tp->slots, cap * sizeof(*slots));
		if (!slots)
			return FR_ENOMEM;
		tp->slots = slots;
		gens = realloc(tp->slot_gen, cap * sizeof(*gens));
		if (!gens)
			return FR_ENOMEM;
		tp->slot_gen = gens;
		memset(slots + tp->nslots, 0,
		       (cap - tp->nslots) * sizeof(*slots));
		memset(gens + tp->nslots, 0,
		       (cap - tp->nslots) * sizeof(*gens));
		tp->nslots = cap;
	}
	/* A new generation per use: completions of the slot's previous
	 * connection, still in the CQ, never match the new one. */
	tp->slot_gen[i] = (tp->slot_gen[i] + 1) & 0x7fff;
	c->slot = i;
	c->gen = tp->slot_gen[i];
	tp->slots[i] = c;
	return 0;
}

static struct fr_tp_conn *verbs_conn_new(struct fr_tp *tp)
{
	struct fr_tp_conn *c;
	size_t ctl_len = (size_t)(tp->sq_cap + tp->rq_depth) * VERBS_CTL_LEN;
	unsigned int i;

	c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	for (i = 0; i < tp->nqps; i++) {
		c->lane[i].sq = calloc(tp->sq_cap, sizeof(*c->lane[i].sq));
		if (!c->lane[i].sq)
			goto err_sq;
	}
	c->notes = calloc(tp->sq_depth, sizeof(*c->notes));
	if (!c->notes)
		goto err_sq;
	c->held = calloc(tp->rq_depth, sizeof(*c->held));
	if (!c->held)
		goto err_sq;
	c->ctl = calloc(1, ctl_len);
	if (!c->ctl)
		goto err_sq;
	/* Notification payloads are sent from and received into it. */
	c->ctl_mr = ibv_reg_mr(tp->pd, c->ctl, ctl_len, IBV_ACCESS_LOCAL_WRITE);
	if (!c->ctl_mr)
		goto err_sq;
	c->tp = tp;
	c->peer = -1;
	c->sq_cap = tp->sq_cap;
	c->nqps = tp->nqps;
	if (verbs_slot_get(tp, c))
		goto err_slot;
	return c;

err_slot:
	ibv_dereg_mr(c->ctl_mr);
err_sq:
	free(c->ctl);
	free(c->held);
	free(c->notes);
	for (i = 0; i < VERBS_MAX_QPS; i++)
		free(c->lane[i].sq);
	free(c);
	return NULL;
}

/* The memory of a connection that is linked nowhere and has no QP. */
static void verbs_conn_destroy(struct fr_tp_conn *c)
{
	unsigned int i;

	c->tp->slots[c->slot] = NULL;
	ibv_dereg_mr(c->ctl_mr);
	free(c->ctl);
	free(c->held);
	free(c->notes);
	for (i = 0; i < VERBS_MAX_QPS; i++)
		free(c->lane[i].sq);
	free(c);
}

static void verbs_conn_link(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->tp;

	c->prev = NULL;
	c->next = tp->conns;
	if (tp->conns)
		tp->conns->prev = c;
	tp->conns = c;
}

/* The ring's writes no longer read their regions (the QP is gone). */
static void verbs_sq_release(struct fr_tp_conn *c, struct verbs_lane *l)
{
	uint64_t s;

	for (s = l->sq_head; s < l->sq_tail; s++) {
		struct verbs_sqe *e = &l->sq[s % c->sq_cap];

		if (e->mr) {
			e->mr->inflight--;
			e->mr = NULL;
		}
	}
	l->sq_head = l->sq_tail = 0;
	l->nwr = 0;
	l->unsignaled = 0;
}

/* Destroy lane i's QP; lane 0's belongs to the cm id. */
static void verbs_drop_lane(struct fr_tp_conn *c, unsigned int i)
{
	struct fr_tp *tp = c->tp;
	struct verbs_lane *l = &c->lane[i];

	if (!l->qp)
		return;
	if (i || !c->id)
		ibv_destroy_qp(l->qp);
	else
		rdma_destroy_qp(c->id);
	l->qp = NULL;
	/* Its completions may still be in the CQ until we see it empty. */
	tp->cq_need -= l->cq_share;
	tp->cq_linger += l->cq_share;
	l->cq_share = 0;
	verbs_sq_release(c, l);
}

static void verbs_drop_qp(struct fr_tp_conn *c)
{
	unsigned int i;

	for (i = 0; i < VERBS_MAX_QPS; i++)
		verbs_drop_lane(c, i);
	/* Nothing will complete the writes still waiting to notify. */
	c->note_head = c->note_tail = 0;
	c->user_inflight = 0;
	c->lanes_ready = false;
}

/* Destroy the QP and the cm id (the kernel drops the id's unread events). */
static void verbs_drop_id(struct fr_tp_conn *c)
{
	verbs_drop_qp(c);
	if (c->id) {
		rdma_destroy_id(c->id);
		c->id = NULL;
	}
}

static void verbs_conn_free(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->tp;

	if (c->prev)
		c->prev->next = c->next;
	else
		tp->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	if (c->incoming && !c->owned)
		tp->npending--;
	verbs_drop_id(c);
	verbs_conn_destroy(c);
}

/*
 * Stop a QP that may have work in flight: rdma_disconnect() tells the peer
 * and moves the QP to the error state, and the error state flushes every
 * outstanding WR with a completion.  If neither can be done, nobody will
 * complete the ring: we do (synth).
 */
static void verbs_stop_qp(struct fr_tp_conn *c)
{
	struct ibv_qp_attr a;
	bool flushing = true;
	unsigned int i;

	/* rdma_disconnect() moves lane 0's QP to the error state. */
	if (c->id && !c->disconnected && !rdma_disconnect(c->id))
		c->disconnected = true;
	for (i = 0; i < c->nqps; i++) {
		if (!c->lane[i].qp) {
			/* A lane that never existed has nothing to flush. */
			if (!i)
				flushing = false;
			continue;
		}
		if (!i && c->disconnected)
			continue;
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_ERR;
		if (ibv_modify_qp(c->lane[i].qp, &a, IBV_QP_STATE))
			flushing = false;
	}
	/* A QP that will not flush: nobody completes the rings but us. */
	if (!flushing)
		c->synth = true;
}

/*
 * Fail a connection: remember why, owe the caller one error completion if
 * it was established and is theirs, and stop the QP.  A connection that
 * never came up has nothing in flight: its QP and id go at once.
 */
static void __attribute__((format(printf, 3, 4)))
verbs_conn_fail(struct fr_tp_conn *c, int err, const char *fmt, ...)
{
	bool up = c->state == VERBS_UP;
	char msg[192];
	va_list ap;

	if (c->state == VERBS_FAILED)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	/* A peer breaking the rules on a live connection deserves a
	 * warning; the rest is reported by whoever gets the error code. */
	verbs_seterr(c->tp,
		     up && c->owned && (err == FR_ERANGE || err == FR_EPROTO)
			     ? FR_LOG_WARN
			     : FR_LOG_DEBUG,
		     "connection %s rank %d: %s", c->incoming ? "from" : "to",
		     c->peer, msg);
	c->state = VERBS_FAILED;
	c->error = err;
	c->was_up = up;
	c->err_owed = up && c->owned;
	c->peer_gone = false;
	if (up)
		verbs_stop_qp(c);
	else
		verbs_drop_id(c);
}

/* ---- memory in the CQ ---------------------------------------------------- */

/* Make room in the shared CQ for a QP of `need` entries. */
static int verbs_cq_reserve(struct fr_tp *tp, unsigned int need)
{
	unsigned long want = (unsigned long)tp->cq_need + tp->cq_linger + need;
	unsigned long size;

	if (want <= (unsigned long)tp->cq_size)
		return 0;
	size = FR_MAX(want, (unsigned long)tp->cq_size * 2);
	size = FR_MIN(size, (unsigned long)tp->max_cqe);
	if (size < want) {
		verbs_seterr(
			tp, FR_LOG_WARN,
			"the completion queue cannot grow to %lu entries (device limit %d): too many connections",
			want, tp->max_cqe);
		return FR_ENOMEM;
	}
	if (ibv_resize_cq(tp->cq, (int)size)) {
		verbs_seterr(tp, FR_LOG_WARN,
			     "ibv_resize_cq to %lu entries: %s", size,
			     fr_syserr(errno));
		return FR_ENOMEM;
	}
	tp->cq_size = tp->cq->cqe;
	return 0;
}

/* ---- queue pairs --------------------------------------------------------- */

/* A receive slot's payload buffer in c->ctl. */
static uint8_t *verbs_recv_buf(const struct fr_tp_conn *c, uint32_t idx)
{
	return c->ctl + (size_t)(c->sq_cap + idx) * VERBS_CTL_LEN;
}

/*
 * Post n receives on lane 0: each takes one write-with-immediate (no
 * bytes), one notification or one lanes-ready message (VERBS_CTL_LEN
 * bytes into its own slot of c->ctl).  Receives complete in the order
 * they were posted and at most rq_depth are posted, so slot rq_tail %
 * rq_depth is always free; wr_id carries it.
 */
static int verbs_post_recvs(struct fr_tp_conn *c, unsigned int n)
{
	struct ibv_recv_wr wr[VERBS_RECV_BATCH], *bad;
	struct ibv_sge sge[VERBS_RECV_BATCH];
	unsigned int i, k, rq = c->tp->rq_depth;
	int rc;

	while (n) {
		k = FR_MIN(n, (unsigned int)VERBS_RECV_BATCH);
		memset(wr, 0, k * sizeof(wr[0]));
		for (i = 0; i < k; i++) {
			uint32_t idx = (c->rq_tail + i) % rq;

			sge[i].addr =
				(uint64_t)(uintptr_t)verbs_recv_buf(c, idx);
			sge[i].length = VERBS_CTL_LEN;
			sge[i].lkey = c->ctl_mr->lkey;
			wr[i].wr_id = verbs_wrid(c, true, idx);
			wr[i].sg_list = &sge[i];
			wr[i].num_sge = 1;
			wr[i].next = i + 1 < k ? &wr[i + 1] : NULL;
		}
		/* ibv_post_* return the error; errno may be stale. */
		rc = ibv_post_recv(c->lane[0].qp, wr, &bad);
		if (rc)
			return rc;
		c->rq_tail += k;
		n -= k;
	}
	return 0;
}

/* The PSN a hand-connected QP starts sending with: derived from its number,
 * so the peer's receive side knows it without another field. */
static uint32_t verbs_lane_psn(uint32_t qpn)
{
	return (qpn * 0x9e3779b1u) >> 8 & 0xffffff;
}

/* Create the QP of lane i >= 1 (it stays in RESET until connected). */
static int verbs_lane_create(struct fr_tp_conn *c, unsigned int i)
{
	struct fr_tp *tp = c->tp;
	struct verbs_lane *l = &c->lane[i];
	struct ibv_qp_init_attr attr;
	unsigned int need = tp->sq_cap + 1;
	int rc, inl;

	rc = verbs_cq_reserve(tp, need);
	if (rc)
		return rc;
	for (inl = VERBS_MAX_INLINE;; inl = 0) {
		memset(&attr, 0, sizeof(attr));
		attr.send_cq = tp->cq;
		attr.recv_cq = tp->cq;
		attr.qp_type = IBV_QPT_RC;
		attr.cap.max_send_wr = tp->sq_cap;
		/* Plain RDMA WRITEs only: no receive is ever posted. */
		attr.cap.max_recv_wr = 1;
		attr.cap.max_send_sge = 1;
		attr.cap.max_recv_sge = 1;
		attr.cap.max_inline_data = (uint32_t)inl;
		l->qp = ibv_create_qp(tp->pd, &attr);
		if (l->qp)
			break;
		if (!inl) {
			int e = errno;
			char why[192];

			verbs_seterr(tp, FR_LOG_WARN,
				     "ibv_create_qp (QP %u of %u): %s", i + 1,
				     c->nqps,
				     verbs_strerror(e, why, sizeof(why)));
			return e == ENOMEM ? FR_ENOMEM : FR_ESYS;
		}
	}
	l->max_inline = attr.cap.max_inline_data;
	l->cq_share = need;
	tp->cq_need += need;
	l->sq_head = l->sq_tail = 0;
	l->nwr = 0;
	l->unsignaled = 0;
	return 0;
}

/*
 * Take lane i to RTS against the peer's QP peer_qpn, with the path, MTU,
 * timeouts and access rights rdma_cm negotiated for lane 0 (the cm id
 * must have sent or received the request); only the QP numbers and PSNs
 * are the lane's own.
 */
static int verbs_lane_connect(struct fr_tp_conn *c, unsigned int i,
			      uint32_t peer_qpn)
{
	static const enum ibv_qp_state st[] = {IBV_QPS_INIT, IBV_QPS_RTR,
					       IBV_QPS_RTS};
	static const char *const name[] = {"INIT", "RTR", "RTS"};
	struct ibv_qp *qp = c->lane[i].qp;
	struct ibv_qp_attr a;
	unsigned int k;
	int mask, rc;

	for (k = 0; k < FR_ARRAY_SIZE(st); k++) {
		memset(&a, 0, sizeof(a));
		a.qp_state = st[k];
		if (rdma_init_qp_attr(c->id, &a, &mask)) {
			verbs_seterr(c->tp, FR_LOG_WARN,
				     "rdma_init_qp_attr (%s): %s", name[k],
				     fr_syserr(errno));
			return FR_ESYS;
		}
		if (st[k] == IBV_QPS_RTR) {
			a.dest_qp_num = peer_qpn;
			a.rq_psn = verbs_lane_psn(peer_qpn);
		} else if (st[k] == IBV_QPS_RTS) {
			a.sq_psn = verbs_lane_psn(qp->qp_num);
		}
		rc = ibv_modify_qp(qp, &a, mask);
		if (rc) {
			verbs_seterr(c->tp, FR_LOG_WARN,
				     "ibv_modify_qp of QP %u to %s: %s", i + 1,
				     name[k], strerror(rc));
			return FR_ESYS;
		}
		/*
		 * One receive that no message ever takes: a part that breaks
		 * our registration stops the QP, and only a posted receive
		 * (flushed then) lets us see it.  Possible from INIT on.
		 */
		if (st[k] == IBV_QPS_INIT) {
			struct ibv_recv_wr wr, *bad;

			memset(&wr, 0, sizeof(wr));
			wr.wr_id = verbs_wrid(c, true, 0);
			rc = ibv_post_recv(qp, &wr, &bad);
			if (rc) {
				verbs_seterr(c->tp, FR_LOG_WARN,
					     "ibv_post_recv on QP %u: %s",
					     i + 1, strerror(rc));
				return FR_ESYS;
			}
		}
	}
	return 0;
}

/*
 * Create the RC QP of c on our PD and shared CQ.  rdma_create_qp() leaves
 * it in INIT, where receives can be posted; rdma_connect/rdma_accept take
 * it to RTS.
 */
static int verbs_qp_create(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->tp;
	struct ibv_qp_init_attr attr;
	unsigned int need = tp->sq_cap + tp->rq_depth, i;
	int rc, inl;

	if (c->id->verbs != tp->pd->context) {
		verbs_seterr(
			tp, FR_LOG_WARN,
			"connection with rank %d runs over device %s, not %s where our memory is registered",
			c->peer,
			c->id->verbs ? ibv_get_device_name(c->id->verbs->device)
				     : "?",
			ibv_get_device_name(tp->pd->context->device));
		return FR_ENODEV;
	}
	rc = verbs_cq_reserve(tp, need);
	if (rc)
		return rc;
	for (inl = VERBS_MAX_INLINE;; inl = 0) {
		memset(&attr, 0, sizeof(attr));
		attr.send_cq = tp->cq;
		attr.recv_cq = tp->cq;
		attr.qp_type = IBV_QPT_RC;
		attr.cap.max_send_wr = tp->sq_cap;
		attr.cap.max_recv_wr = tp->rq_depth;
		attr.cap.max_send_sge = 1;
		attr.cap.max_recv_sge = 1;
		attr.cap.max_inline_data = (uint32_t)inl;
		attr.sq_sig_all = 0;
		if (!rdma_create_qp(c->id, tp->pd, &attr))
			break;
		/* A device that cannot inline: send from registered memory. */
		if (!inl) {
			int e = errno;
			char why[192];

			verbs_seterr(
				tp, FR_LOG_WARN,
				"rdma_create_qp (%u send, %u receive WRs): %s",
				tp->sq_cap, tp->rq_depth,
				verbs_strerror(e, why, sizeof(why)));
			return e == ENOMEM ? FR_ENOMEM : FR_ESYS;
		}
	}
	c->lane[0].qp = c->id->qp;
	/* A new generation per QP: completions of an earlier attempt's QP
	 * never match this one, even if its number is reused. */
	tp->slot_gen[c->slot] = (tp->slot_gen[c->slot] + 1) & 0x7fff;
	c->gen = tp->slot_gen[c->slot];
	c->lane[0].max_inline = attr.cap.max_inline_data;
	c->lane[0].cq_share = need;
	tp->cq_need += need;
	c->lane[0].sq_head = c->lane[0].sq_tail = 0;
	c->lane[0].nwr = 0;
	c->lane[0].unsignaled = 0;
	c->user_inflight = 0;
	c->note_head = c->note_tail = 0;
	c->lanes_ready = false;
	c->rq_tail = 0;
	rc = verbs_post_recvs(c, tp->rq_depth);
	if (rc) {
		verbs_seterr(tp, FR_LOG_WARN, "ibv_post_recv: %s",
			     strerror(rc));
		verbs_drop_qp(c);
		return FR_ESYS;
	}
	for (i = 1; i < c->nqps; i++) {
		rc = verbs_lane_create(c, i);
		if (rc) {
			verbs_drop_qp(c);
			return rc;
		}
	}
	return 0;
}

/* ---- establishment ------------------------------------------------------- */

static void verbs_put_reply(uint8_t *b, int kind, int32_t value)
{
	fr_put_le32(b, VERBS_MAGIC);
	fr_put_le16(b + 4, VERBS_VERSION);
	fr_put_le16(b + 6, (uint16_t)kind);
	fr_put_le32(b + 8, (uint32_t)value);
}

static bool verbs_outgoing_pending(const struct fr_tp_conn *c)
{
	return !c->incoming &&
	       (c->state == VERBS_RETRY || c->state == VERBS_ADDR ||
		c->state == VERBS_ROUTE || c->state == VERBS_CONNECTING);
}

/* Another attempt later: the peer may not be listening yet. */
static void __attribute__((format(printf, 2, 3)))
verbs_retry(struct fr_tp_conn *c, const char *fmt, ...)
{
	uint64_t now = fr_now_ms();
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(c->why, sizeof(c->why), fmt, ap);
	va_end(ap);
	fr_dbg("verbs: rank %d: connecting to rank %d: %s; again in %d ms",
	       c->tp->rank, c->peer, c->why, c->backoff_ms);
	verbs_drop_id(c);
	c->state = VERBS_RETRY;
	c->retry_ms = now + (uint64_t)c->backoff_ms;
	c->backoff_ms = FR_MIN(c->backoff_ms * 2, VERBS_BACKOFF_MAX_MS);
}

static int verbs_resolve_ms(const struct fr_tp_conn *c)
{
	uint64_t now = fr_now_ms();
	uint64_t left = c->deadline_ms > now ? c->deadline_ms - now : 1;

	return (int)FR_MAX(FR_MIN(left, (uint64_t)VERBS_RESOLVE_MS),
			   (uint64_t)1);
}

/* One attempt: a fresh cm id, then address resolution from our address. */
static void verbs_start_connect(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->tp;
	struct sockaddr_storage src = tp->addr;

	if (rdma_create_id(tp->ec, &c->id, c, RDMA_PS_TCP)) {
		c->id = NULL;
		verbs_conn_fail(c, FR_ESYS, "rdma_create_id: %s",
				fr_syserr(errno));
		return;
	}
	/* Leave through the device we registered memory on. */
	verbs_sa_set_port(&src, 0);
	/* A link-local peer is reached through our own interface; the scope
	 * id in its blob is its interface index, meaningless here. */
	if (c->dst.ss_family == AF_INET6 && src.ss_family == AF_INET6 &&
	    IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)&c->dst)->sin6_addr))
		((struct sockaddr_in6 *)&c->dst)->sin6_scope_id =
			((struct sockaddr_in6 *)&src)->sin6_scope_id;
	if (rdma_resolve_addr(c->id, (struct sockaddr *)&src,
			      (struct sockaddr *)&c->dst,
			      verbs_resolve_ms(c))) {
		verbs_retry(c, "rdma_resolve_addr: %s", fr_syserr(errno));
		return;
	}
	c->state = VERBS_ADDR;
}

static void verbs_on_addr_resolved(struct fr_tp_conn *c)
{
	if (rdma_resolve_route(c->id, verbs_resolve_ms(c))) {
		verbs_retry(c, "rdma_resolve_route: %s", fr_syserr(errno));
		return;
	}
	c->state = VERBS_ROUTE;
}

static void verbs_on_route_resolved(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->tp;
	struct rdma_conn_param param;
	uint8_t hello[VERBS_HELLO_LEN + 4 * (VERBS_MAX_QPS - 1)];
	unsigned int i;
	int rc;

	/* Propose every QP we want; the acceptor may take fewer. */
	c->nqps = tp->nqps;
	rc = verbs_qp_create(c);
	if (rc) {
		verbs_conn_fail(c, rc, "cannot create a queue pair: %s",
				tp->errbuf);
		return;
	}
	fr_put_le32(hello, VERBS_MAGIC);
	fr_put_le16(hello + 4, VERBS_VERSION);
	fr_put_le16(hello + 6, VERBS_KIND_HELLO);
	fr_put_le32(hello + 8, (uint32_t)tp->rank);
	fr_put_le16(hello + 12, (uint16_t)(c->nqps - 1));
	fr_put_le16(hello + 14, 0);
	fr_put_le64(hello + 16, tp->nonce);
	for (i = 1; i < c->nqps; i++)
		fr_put_le32(hello + VERBS_HELLO_LEN + 4 * (i - 1),
			    c->lane[i].qp->qp_num);
	memset(&param, 0, sizeof(param));
	param.private_data = hello;
	param.private_data_len = (uint8_t)(VERBS_HELLO_LEN + 4 * (c->nqps - 1));
	/* No RDMA READ or atomics either way: the QPs then allow remote
	 * writes only. */
	param.responder_resources = 0;
	param.initiator_depth = 0;
	param.retry_count = tp->retry_cnt;
	param.rnr_retry_count = VERBS_CM_RETRY;
	verbs_set_ack_timeout(tp, c->id);
	if (rdma_connect(c->id, &param)) {
		verbs_retry(c, "rdma_connect: %s", fr_syserr(errno));
		return;
	}
	c->state = VERBS_CONNECTING;
}

/* Is qpn a QP number a peer may give (24 bits, not 0 or 1)? */
static bool verbs_qpn_ok(uint32_t qpn)
{
	return qpn > 1 && qpn <= 0xffffff;
}

/*
 * The connector's side, on ESTABLISHED: keep the first n lanes (the
 * acceptor's choice), connect lanes 1..n-1 to the acceptor's QPs listed at
 * qpns (its lanes are in RTS already: it connected them before replying),
 * destroy the rest, and tell the acceptor with a lanes-ready message on
 * lane 0 that ours can receive now.  The acceptor stripes nothing before
 * that message: its ESTABLISHED comes with our RTU, which librdmacm sends
 * before we see our own ESTABLISHED and get here.
 */
static int verbs_lanes_up(struct fr_tp_conn *c, unsigned int n,
			  const uint8_t *qpns)
{
	struct verbs_lane *l0 = &c->lane[0];
	struct ibv_send_wr wr, *bad;
	struct verbs_sqe *e;
	struct ibv_sge sge;
	uint8_t *b;
	unsigned int i;
	int rc;

	for (i = n; i < c->nqps; i++)
		verbs_drop_lane(c, i);
	c->nqps = n;
	if (n == 1)
		return 0;
	for (i = 1; i < n; i++) {
		uint32_t qpn = fr_get_le32(qpns + 4 * (i - 1));

		if (!verbs_qpn_ok(qpn)) {
			verbs_seterr(c->tp, FR_LOG_WARN,
				     "the peer gave QP number %u", qpn);
			return FR_EPROTO;
		}
		rc = verbs_lane_connect(c, i, qpn);
		if (rc)
			return rc;
	}
	/* Nothing has been posted yet: lane 0's ring is empty. */
	b = c->ctl + (size_t)(l0->sq_tail % c->sq_cap) * VERBS_CTL_LEN;
	fr_put_le32(b, VERBS_READY_MAGIC);
	fr_put_le32(b + 4, n);
	sge.addr = (uint64_t)(uintptr_t)b;
	sge.length = VERBS_CTL_LEN;
	sge.lkey = c->ctl_mr->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = verbs_wrid(c, false, (uint32_t)l0->sq_tail);
	wr.opcode = IBV_WR_SEND;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (l0->max_inline >= VERBS_CTL_LEN)
		wr.send_flags |= IBV_SEND_INLINE;
	rc = ibv_post_send(l0->qp, &wr, &bad);
	if (rc) {
		verbs_seterr(c->tp, FR_LOG_WARN,
			     "ibv_post_send (lanes ready): %s", strerror(rc));
		return FR_ESYS;
	}
	e = &l0->sq[l0->sq_tail % c->sq_cap];
	memset(e, 0, sizeof(*e));
	e->kind = VERBS_SQE_PLAIN;
	l0->sq_tail++;
	l0->nwr++;
	c->lanes_ready = true;
	return 0;
}

static void verbs_on_established(struct fr_tp_conn *c, const uint8_t *pd,
				 size_t pdlen)
{
	unsigned int extra;
	char where[96];
	int rank, rc;

	if (c->state == VERBS_ACCEPTING) {
		c->state = VERBS_UP;
		fr_dbg("verbs: rank %d: connection from rank %d established",
		       c->tp->rank, c->peer);
		return;
	}
	if (c->state != VERBS_CONNECTING)
		return;
	fr_sockaddr_str((struct sockaddr *)&c->dst, where, sizeof(where));
	if (pdlen < VERBS_REPLY_LEN || fr_get_le32(pd) != VERBS_MAGIC ||
	    fr_get_le16(pd + 6) != VERBS_KIND_ACCEPT) {
		verbs_conn_fail(c, FR_EPROTO,
				"%s accepted without a fastreduce reply",
				where);
		return;
	}
	rank = (int32_t)fr_get_le32(pd + 8);
	if (fr_get_le16(pd + 4) != VERBS_VERSION || rank != c->peer) {
		verbs_conn_fail(
			c, FR_EPROTO,
			"%s answered as rank %d (protocol version %u), expected rank %d",
			where, rank, fr_get_le16(pd + 4), c->peer);
		return;
	}
	/* A reply of 12 bytes (or zero padding) takes no extra QP. */
	extra = pdlen >= VERBS_ACCEPT_LEN ? fr_get_le16(pd + 12) : 0;
	if (extra > c->nqps - 1 ||
	    (extra && pdlen < VERBS_ACCEPT_LEN + 4 * (size_t)extra)) {
		verbs_conn_fail(
			c, FR_EPROTO,
			"%s accepted %u extra queue pairs, we proposed %u",
			where, extra, c->nqps - 1);
		return;
	}
	rc = verbs_lanes_up(c, extra + 1, pd + VERBS_ACCEPT_LEN);
	if (rc) {
		verbs_conn_fail(c, rc,
				"cannot connect the extra queue pairs: %s",
				c->tp->errbuf);
		return;
	}
	c->state = VERBS_UP;
	fr_dbg("verbs: rank %d: connected to rank %d at %s", c->tp->rank,
	       c->peer, where);
}

static void verbs_on_rejected(struct fr_tp_conn *c, int status,
			      const uint8_t *pd, size_t pdlen)
{
	int st;

	if (!verbs_outgoing_pending(c))
		return;
	/* Our own refusal is final; anything else (nobody listening on
	 * that port yet) is worth another try. */
	if (pdlen >= VERBS_REPLY_LEN && fr_get_le32(pd) == VERBS_MAGIC &&
	    fr_get_le16(pd + 6) == VERBS_KIND_REJECT) {
		st = (int32_t)fr_get_le32(pd + 8);
		if (st != FR_EAUTH && st != FR_EBUSY && st != FR_EPROTO)
			st = FR_EPROTO;
		verbs_conn_fail(
			c, st, "rank %d refused the connection: %s", c->peer,
			st == FR_EAUTH ? "wrong job nonce"
			: st == FR_EBUSY
				? "it already has a connection from this rank"
				: "protocol mismatch");
		return;
	}
	verbs_retry(c, "rejected (reason %d)", status);
}

/* Refuse a request; `status` 0 = without a reply (not our protocol). */
static void verbs_refuse(struct rdma_cm_id *id, int status)
{
	uint8_t b[VERBS_REPLY_LEN];

	verbs_put_reply(b, VERBS_KIND_REJECT, status);
	if (rdma_reject(id, status ? b : NULL, status ? sizeof(b) : 0))
		fr_dbg("verbs: rdma_reject: %s", fr_syserr(errno));
	rdma_destroy_id(id);
}

static struct fr_tp_conn *verbs_incoming_from(struct fr_tp *tp, int rank)
{
	struct fr_tp_conn *c;

	for (c = tp->conns; c; c = c->next)
		if (c->incoming && c->peer == rank && c->state != VERBS_FAILED)
			return c;
	return NULL;
}

/* A connection request: judge its hello, then accept it at once. */
static void verbs_on_request(struct fr_tp *tp, struct rdma_cm_id *id,
			     const uint8_t *pd, size_t pdlen)
{
	struct rdma_conn_param param;
	uint8_t reply[VERBS_ACCEPT_LEN + 4 * (VERBS_MAX_QPS - 1)];
	struct fr_tp_conn *c, *old;
	unsigned int extra, i;
	uint16_t version;
	uint64_t nonce;
	int rank, rc;

	if (pdlen < VERBS_HELLO_LEN || fr_get_le32(pd) != VERBS_MAGIC ||
	    fr_get_le16(pd + 6) != VERBS_KIND_HELLO) {
		fr_warn("verbs: rank %d: refused a connection request that is not a fastreduce hello",
			tp->rank);
		verbs_refuse(id, 0);
		return;
	}
	version = fr_get_le16(pd + 4);
	rank = (int32_t)fr_get_le32(pd + 8);
	nonce = fr_get_le64(pd + 16);
	if (version != VERBS_VERSION) {
		fr_warn("verbs: rank %d: refused rank %d: protocol version %u, we speak %u",
			tp->rank, rank, version, VERBS_VERSION);
		verbs_refuse(id, FR_EPROTO);
		return;
	}
	if (nonce != tp->nonce) {
		fr_warn("verbs: rank %d: refused a connection claiming rank %d: wrong job nonce",
			tp->rank, rank);
		verbs_refuse(id, FR_EAUTH);
		return;
	}
	extra = fr_get_le16(pd + 12);
	if (rank < 0 || fr_get_le16(pd + 14) || extra >= VERBS_MAX_QPS ||
	    pdlen < VERBS_HELLO_LEN + 4 * (size_t)extra) {
		fr_warn("verbs: rank %d: refused a malformed hello (rank %d, %u extra queue pairs)",
			tp->rank, rank, extra);
		verbs_refuse(id, FR_EPROTO);
		return;
	}
	for (i = 0; i < extra; i++) {
		if (!verbs_qpn_ok(fr_get_le32(pd + VERBS_HELLO_LEN + 4 * i))) {
			fr_warn("verbs: rank %d: refused a hello from rank %d with QP number %u",
				tp->rank, rank,
				fr_get_le32(pd + VERBS_HELLO_LEN + 4 * i));
			verbs_refuse(id, FR_EPROTO);
			return;
		}
	}
	old = verbs_incoming_from(tp, rank);
	if (old && (old->owned || old->state == VERBS_UP)) {
		fr_warn("verbs: rank %d: refused a second connection from rank %d",
			tp->rank, rank);
		verbs_refuse(id, FR_EBUSY);
		return;
	}
	/* An acceptance that never completed: the peer gave up on it and
	 * tries again, so the new request replaces it. */
	if (old)
		verbs_conn_fail(old, FR_EPEER, "superseded by a new request");
	if (tp->npending >= VERBS_MAX_PENDING) {
		fr_warn("verbs: rank %d: too many connections awaiting accept; refusing rank %d",
			tp->rank, rank);
		verbs_refuse(id, FR_EBUSY);
		return;
	}
	c = verbs_conn_new(tp);
	if (!c) {
		verbs_refuse(id, FR_EBUSY);
		return;
	}
	c->id = id;
	id->context = c;
	c->incoming = true;
	c->peer = rank;
	c->state = VERBS_ACCEPTING;
	c->deadline_ms = fr_now_ms() + (uint64_t)tp->timeout_ms;
	verbs_conn_link(c);
	tp->npending++;
	/* As many QPs as both want. */
	c->nqps = FR_MIN(tp->nqps, extra + 1);
	rc = verbs_qp_create(c);
	/* Our extra lanes go to RTS now (the cm id holds the request's path),
	 * so they can receive before the connector learns their numbers. */
	verbs_set_ack_timeout(tp, id);
	for (i = 1; !rc && i < c->nqps; i++)
		rc = verbs_lane_connect(
			c, i, fr_get_le32(pd + VERBS_HELLO_LEN + 4 * (i - 1)));
	if (rc) {
		fr_warn("verbs: rank %d: refusing rank %d: %s", tp->rank, rank,
			tp->errbuf);
		verbs_drop_qp(c);
		c->id = NULL;
		verbs_conn_free(c);
		verbs_refuse(id, FR_EBUSY);
		return;
	}
	verbs_put_reply(reply, VERBS_KIND_ACCEPT, tp->rank);
	fr_put_le16(reply + 12, (uint16_t)(c->nqps - 1));
	fr_put_le16(reply + 14, 0);
	for (i = 1; i < c->nqps; i++)
		fr_put_le32(reply + VERBS_ACCEPT_LEN + 4 * (i - 1),
			    c->lane[i].qp->qp_num);
	memset(&param, 0, sizeof(param));
	param.private_data = reply;
	param.private_data_len =
		(uint8_t)(VERBS_ACCEPT_LEN + 4 * (c->nqps - 1));
	param.responder_resources = 0;
	param.initiator_depth = 0;
	param.retry_count = tp->retry_cnt;
	param.rnr_retry_count = VERBS_CM_RETRY;
	if (rdma_accept(id, &param)) {
		verbs_conn_fail(c, FR_ESYS, "rdma_accept: %s",
				fr_syserr(errno));
		return;
	}
	fr_dbg("verbs: rank %d: accepting a connection from rank %d", tp->rank,
	       rank);
}

static void verbs_on_disconnected(struct fr_tp_conn *c)
{
	switch (c->state) {
	case VERBS_UP:
		/* After the CQ is drained: what came before comes first. */
		c->peer_gone = true;
		break;
	case VERBS_FAILED:
		/* We failed it first; this is the peer's answer, or its own
		 * disconnect crossing ours: reply so it need not wait. */
		if (c->id && !c->disconnected && !rdma_disconnect(c->id))
			c->disconnected = true;
		break;
	default:
		if (verbs_outgoing_pending(c))
			verbs_retry(c, "disconnected during the handshake");
		else
			verbs_conn_fail(c, FR_EPEER,
					"disconnected during the handshake");
		break;
	}
}

/* One cm event, already acknowledged (pd is a copy of its private data). */
static void verbs_cm_event(struct fr_tp *tp, enum rdma_cm_event_type type,
			   int status, struct rdma_cm_id *id, const uint8_t *pd,
			   size_t pdlen)
{
	struct fr_tp_conn *c;

	if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
		verbs_on_request(tp, id, pd, pdlen);
		return;
	}
	c = id->context;
	if (!c || c->id != id) {
		/* The listener: only the loss of the device matters. */
		if (type == RDMA_CM_EVENT_DEVICE_REMOVAL && !tp->fatal) {
			tp->fatal = FR_ENODEV;
			verbs_seterr(tp, FR_LOG_ERROR,
				     "the RDMA device was removed");
		}
		return;
	}
	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (c->state == VERBS_ADDR)
			verbs_on_addr_resolved(c);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (c->state == VERBS_ROUTE)
			verbs_on_route_resolved(c);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		verbs_on_established(c, pd, pdlen);
		break;
	case RDMA_CM_EVENT_REJECTED:
		verbs_on_rejected(c, status, pd, pdlen);
		break;
	case RDMA_CM_EVENT_ADDR_ERROR:
	case RDMA_CM_EVENT_ROUTE_ERROR:
	case RDMA_CM_EVENT_UNREACHABLE:
	case RDMA_CM_EVENT_CONNECT_ERROR:
		if (verbs_outgoing_pending(c))
			verbs_retry(c, "%s (status %d)", rdma_event_str(type),
				    status);
		else if (c->state != VERBS_FAILED)
			verbs_conn_fail(c, FR_EPEER, "%s (status %d)",
					rdma_event_str(type), status);
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		verbs_on_disconnected(c);
		break;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		verbs_conn_fail(c, FR_ENODEV, "the RDMA device was removed");
		if (!tp->fatal) {
			tp->fatal = FR_ENODEV;
			verbs_seterr(tp, FR_LOG_ERROR,
				     "the RDMA device was removed");
		}
		break;
	default:
		fr_dbg("verbs: rank %d: %s on the connection with rank %d",
		       tp->rank, rdma_event_str(type), c->peer);
		break;
	}
}

/* Read every cm event waiting on the (non-blocking) channel. */
static void verbs_cm_drain(struct fr_tp *tp)
{
	struct rdma_cm_event *ev;
	enum rdma_cm_event_type type;
	struct rdma_cm_id *id;
	uint8_t pd[256];
	size_t pdlen;
	int status;

	for (;;) {
		if (rdma_get_cm_event(tp->ec, &ev)) {
			if (errno != EAGAIN && errno != EWOULDBLOCK &&
			    errno != EINTR)
				fr_dbg("verbs: rdma_get_cm_event: %s",
				       fr_syserr(errno));
			return;
		}
		type = ev->event;
		status = ev->status;
		id = ev->id;
		pdlen = 0;
		/* param.conn is meaningful for these only; copy its private
		 * data, since acknowledging the event frees it. */
		if ((type == RDMA_CM_EVENT_CONNECT_REQUEST ||
		     type == RDMA_CM_EVENT_ESTABLISHED ||
		     type == RDMA_CM_EVENT_REJECTED) &&
		    ev->param.conn.private_data) {
			pdlen = FR_MIN((size_t)ev->param.conn.private_data_len,
				       sizeof(pd));
			memcpy(pd, ev->param.conn.private_data, pdlen);
		}
		/* Acknowledge before acting: acting may destroy the id, and
		 * rdma_destroy_id() waits for its events to be acknowledged. */
		rdma_ack_cm_event(ev);
		verbs_cm_event(tp, type, status, id, pd, pdlen);
	}
}

/* Retries that are due, handshakes past their deadline. */
static void verbs_timers(struct fr_tp *tp)
{
	struct fr_tp_conn *c, *next;
	uint64_t now = fr_now_ms();
	char where[96];

	for (c = tp->conns; c; c = next) {
		next = c->next;
		if (c->state == VERBS_UP || c->state == VERBS_FAILED)
			continue;
		if (now >= c->deadline_ms) {
			if (c->incoming) {
				verbs_conn_fail(c, FR_ETIMEDOUT,
						"never established");
				continue;
			}
			fr_sockaddr_str((struct sockaddr *)&c->dst, where,
					sizeof(where));
			verbs_conn_fail(
				c, FR_ETIMEDOUT,
				"could not connect to rank %d at %s within %d ms%s%s",
				c->peer, where, c->tp->timeout_ms,
				c->why[0] ? ": " : "", c->why);
			continue;
		}
		if (c->state == VERBS_RETRY && now >= c->retry_ms)
			verbs_start_connect(c);
	}
}

/* Incoming connections that failed before anyone took them: free. */
static void verbs_sweep(struct fr_tp *tp)
{
	struct fr_tp_conn *c, *next;

	for (c = tp->conns; c; c = next) {
		next = c->next;
		if (!c->owned && c->state == VERBS_FAILED) {
			fr_cqring_purge(&tp->ring, c);
			verbs_conn_free(c);
		}
	}
}

static int verbs_cq_drain(struct fr_tp *tp);
static void verbs_apply_peer_gone(struct fr_tp *tp);

/*
 * Establishment progress for accept() and connect_done(); poll() does the
 * same and more.  A peer's DISCONNECTED is applied here too (after a CQ
 * drain, as in poll()), so that wait() has nothing owed to spin on.
 */
static void verbs_progress(struct fr_tp *tp)
{
	struct fr_tp_conn *c;

	verbs_cm_drain(tp);
	verbs_timers(tp);
	for (c = tp->conns; c; c = c->next)
		if (c->peer_gone)
			break;
	if (c && verbs_cq_drain(tp) >= 0)
		verbs_apply_peer_gone(tp);
	verbs_sweep(tp);
}

/* ---- data path: completions ---------------------------------------------- */

/* Is the oldest unposted notification ready (its parts all done)? */
static bool verbs_note_ready(const struct fr_tp_conn *c)
{
	return c->note_head != c->note_tail &&
	       !c->notes[c->note_head % c->tp->sq_depth].parts_left;
}

/* Slots of a lane spoken for: lane 0 keeps one per unposted notification. */
static unsigned int verbs_lane_reserved(const struct fr_tp_conn *c,
					const struct verbs_lane *l)
{
	return l == &c->lane[0] ? (unsigned int)(c->note_tail - c->note_head)
				: 0;
}

/* Can lane l take `need` more WRs beside what it has reserved?  At most
 * sq_depth WRs that are not fences, and never more than the HW queue. */
static bool verbs_lane_room(const struct fr_tp_conn *c,
			    const struct verbs_lane *l, unsigned int need)
{
	unsigned int r = verbs_lane_reserved(c, l);

	return l->nwr + r + need <= c->tp->sq_depth &&
	       l->sq_tail - l->sq_head + r + need <= c->sq_cap;
}

/*
 * Post one WR on lane i and enter it in the lane's ring.  Signalled when
 * asked (sig), when it has a ctx (the caller wants to know when its source
 * is free), every VERBS_SIG_INTERVAL WRs, and when the lane or the
 * connection is about to fill (a full queue always has a completion
 * coming).  On failure the connection fails: FR_EPEER.
 */
static int verbs_lane_post(struct fr_tp_conn *c, unsigned int i,
			   struct ibv_send_wr *wr, enum verbs_sqe_kind kind,
			   uint64_t ctx, struct fr_tp_mr *mr, uint64_t note,
			   bool sig)
{
	struct fr_tp *tp = c->tp;
	struct verbs_lane *l = &c->lane[i];
	unsigned int r = verbs_lane_reserved(c, l);
	struct ibv_send_wr *bad;
	struct verbs_sqe *e;
	int rc;

	sig = sig || ctx || l->unsignaled + 1 >= VERBS_SIG_INTERVAL ||
	      c->user_inflight + 1 >= tp->sq_depth ||
	      l->nwr + r + 2 >= tp->sq_depth ||
	      l->sq_tail - l->sq_head + r + 1 >= c->sq_cap;
	wr->wr_id = verbs_wrid(c, false, (uint32_t)l->sq_tail);
	if (sig)
		wr->send_flags |= IBV_SEND_SIGNALED;
	/* Small payloads are copied into the WQE: no DMA read. */
	if (wr->num_sge && wr->sg_list->length <= l->max_inline)
		wr->send_flags |= IBV_SEND_INLINE;
	rc = ibv_post_send(l->qp, wr, &bad);
	if (rc) {
		char why[192];

		/* Our own failure, not the peer's: say so loudly. */
		fr_warn("verbs: rank %d: ibv_post_send to rank %d (queue pair %u): %s",
			tp->rank, c->peer, i + 1,
			verbs_strerror(rc, why, sizeof(why)));
		verbs_conn_fail(c, FR_EPEER, "ibv_post_send: %s", strerror(rc));
		return FR_EPEER;
	}
	e = &l->sq[l->sq_tail % c->sq_cap];
	e->ctx = ctx;
	e->kind = (uint8_t)kind;
	e->note = note;
	e->mr = mr && wr->num_sge && !(wr->send_flags & IBV_SEND_INLINE) ? mr
									 : NULL;
	if (e->mr)
		e->mr->inflight++;
	if (wr->num_sge && (wr->opcode == IBV_WR_RDMA_WRITE ||
			    wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)) {
		l->last_raddr = wr->wr.rdma.remote_addr;
		l->last_rkey = wr->wr.rdma.rkey;
	}
	l->sq_tail++;
	l->nwr++;
	l->unsignaled = sig ? 0 : l->unsignaled + 1;
	return 0;
}

/*
 * Post the notifications whose parts have all completed, oldest first, on
 * lane 0 as a send with immediate carrying the whole length (a receive
 * completion reports only its own WR's length).  Lane 0's slot was
 * reserved when the write was taken, so the queue has room.
 */
static void verbs_notes_post(struct fr_tp_conn *c)
{
	struct verbs_lane *l0 = &c->lane[0];
	struct ibv_send_wr wr;
	struct ibv_sge sge;

	while (c->state == VERBS_UP && verbs_note_ready(c)) {
		struct verbs_note *n =
			&c->notes[c->note_head % c->tp->sq_depth];
		uint8_t *b = c->ctl +
			     (size_t)(l0->sq_tail % c->sq_cap) * VERBS_CTL_LEN;

		fr_put_le32(b, n->len);
		fr_put_le32(b + 4, VERBS_NOTE_MAGIC);
		sge.addr = (uint64_t)(uintptr_t)b;
		sge.length = VERBS_CTL_LEN;
		sge.lkey = c->ctl_mr->lkey;
		memset(&wr, 0, sizeof(wr));
		wr.opcode = IBV_WR_SEND_WITH_IMM;
		wr.imm_data = htonl(n->imm);
		wr.sg_list = &sge;
		wr.num_sge = 1;
		/* The reservation becomes the WR. */
		c->note_head++;
		if (verbs_lane_post(c, 0, &wr, VERBS_SQE_USER, n->ctx, NULL, 0,
				    false)) {
			/* Still owed: it fails with the connection. */
			c->note_head--;
			return;
		}
	}
}

/* Retire a lane's ring up to seq s: the WRs before it completed without
 * error (RC completes in order), s itself with `status`. */
static void verbs_sq_retire(struct fr_tp_conn *c, struct verbs_lane *l,
			    uint64_t s, int status)
{
	struct fr_tp *tp = c->tp;

	while (l->sq_head <= s) {
		struct verbs_sqe *e = &l->sq[l->sq_head % c->sq_cap];

		if (e->mr) {
			e->mr->inflight--;
			e->mr = NULL;
		}
		switch (e->kind) {
		case VERBS_SQE_USER:
			fr_cqring_push(&tp->ring, FR_CQE_SEND,
				       l->sq_head == s ? status : 0, c, e->ctx,
				       0, 0);
			c->user_inflight--;
			break;
		case VERBS_SQE_PART:
			/* In error too: the notification's turn comes
			 * when its source is no longer read. */
			c->notes[e->note % c->tp->sq_depth].parts_left--;
			break;
		default:
			break;
		}
		if (e->kind != VERBS_SQE_FENCE)
			l->nwr--;
		l->sq_head++;
	}
	if (l->sq_head == l->sq_tail)
		l->unsignaled = 0;
}

/*
 * A failed connection's writes that never got their notification posted:
 * each gets its FR_CQE_SEND with the error, in order, once its parts are
 * retired (flushed: the source is no longer read) and lane 0 has retired
 * the writes posted before it.  Returns false when the ring is full.
 */
static bool verbs_notes_fail(struct fr_tp_conn *c)
{
	struct fr_tp *tp = c->tp;

	while (verbs_note_ready(c) &&
	       c->lane[0].sq_head == c->lane[0].sq_tail) {
		struct verbs_note *n = &c->notes[c->note_head % tp->sq_depth];

		if (!n->silent) {
			if (!fr_cqring_room(&tp->ring))
				return false;
			fr_cqring_push(&tp->ring, FR_CQE_SEND,
				       c->was_up ? FR_EPEER : c->error, c,
				       n->ctx, 0, 0);
		}
		c->user_inflight--;
		c->note_head++;
	}
	return true;
}

static void verbs_repost(struct fr_tp_conn *c)
{
	int rc;

	if (c->state == VERBS_FAILED || !c->lane[0].qp)
		return;
	rc = verbs_post_recvs(c, 1);
	if (rc)
		verbs_conn_fail(c, FR_ESYS, "ibv_post_recv: %s", strerror(rc));
}

/*
 * A receive on lane 0 that is not a write with immediate: a notification
 * (send with immediate; its payload holds the length of the whole striped
 * write) or, at the acceptor, the connector's lanes-ready message.
 * Returns the write's length, or -1 when it was handled here (ready) or
 * the connection failed (a malformed message).
 */
static int64_t verbs_recv_ctl(struct fr_tp_conn *c, const struct ibv_wc *wc)
{
	const uint8_t *b;
	uint32_t idx = (uint32_t)wc->wr_id % c->tp->rq_depth;

	if (wc->opcode != IBV_WC_RECV || wc->byte_len != VERBS_CTL_LEN) {
		verbs_conn_fail(
			c, FR_EPROTO,
			"rank %d sent a message that is neither a write with immediate nor a notification (opcode %d, %u bytes)",
			c->peer, (int)wc->opcode, wc->byte_len);
		return -1;
	}
	b = verbs_recv_buf(c, idx);
	if (wc->wc_flags & IBV_WC_WITH_IMM) {
		if (fr_get_le32(b + 4) != VERBS_NOTE_MAGIC) {
			verbs_conn_fail(c, FR_EPROTO,
					"rank %d sent a malformed notification",
					c->peer);
			return -1;
		}
		return fr_get_le32(b);
	}
	if (!c->incoming || c->nqps < 2 || c->lanes_ready ||
	    fr_get_le32(b) != VERBS_READY_MAGIC ||
	    fr_get_le32(b + 4) != c->nqps) {
		verbs_conn_fail(c, FR_EPROTO,
				"rank %d sent an unexpected message (%u bytes)",
				c->peer, wc->byte_len);
		return -1;
	}
	c->lanes_ready = true;
	fr_dbg("verbs: rank %d: rank %d's %u queue pairs are ready",
	       c->tp->rank, c->peer, c->nqps);
	/* Not the caller's: its receive goes back at once. */
	verbs_repost(c);
	return -1;
}

static void verbs_wc_recv(struct fr_tp_conn *c, const struct ibv_wc *wc)
{
	struct fr_tp *tp = c->tp;
	struct verbs_held *h;
	int64_t len;
	int st;

	if (wc->status != IBV_WC_SUCCESS) {
		/* Flushed receives (and any after the first error) say
		 * nothing new: the connection has its one error. */
		if (c->state == VERBS_FAILED)
			return;
		st = verbs_wc_status(wc->status);
		/* What the HCA says is worth seeing: the caller's message only
		 * has the error code. */
		if (wc->status != IBV_WC_WR_FLUSH_ERR && c->state == VERBS_UP)
			fr_warn("verbs: rank %d: receive from rank %d failed: %s",
				c->tp->rank, c->peer,
				ibv_wc_status_str(wc->status));
		/* This completion becomes the one error the caller is owed
		 * (after any held receives, which came first). */
		verbs_conn_fail(
			c, st,
			"receive from rank %d failed: %s (vendor error 0x%x)",
			c->peer, ibv_wc_status_str(wc->status), wc->vendor_err);
		return;
	}
	if (c->state == VERBS_FAILED)
		return; /* landed before the failure; nobody reads it now */
	if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
		len = wc->byte_len;
	} else {
		len = verbs_recv_ctl(c, wc);
		if (len < 0)
			return;
	}
	/* Held back until accept(), and behind older held ones. */
	if (!c->owned || c->held_count) {
		h = &c->held[(c->held_head + c->held_count) % tp->rq_depth];
		h->imm = ntohl(wc->imm_data);
		h->len = (uint32_t)len;
		c->held_count++;
		return;
	}
	fr_cqring_push(&tp->ring, FR_CQE_RECV, 0, c, 0, ntohl(wc->imm_data),
		       (uint32_t)len);
	verbs_repost(c);
}

static void verbs_wc_send(struct fr_tp_conn *c, struct verbs_lane *l,
			  const struct ibv_wc *wc)
{
	uint32_t off = (uint32_t)wc->wr_id - (uint32_t)l->sq_head;
	uint64_t s;
	int st;

	/* Not in the ring: already completed (synthesised after a failure). */
	if (off >= l->sq_tail - l->sq_head)
		return;
	s = l->sq_head + off;
	if (wc->status == IBV_WC_SUCCESS) {
		verbs_sq_retire(c, l, s, 0);
		return;
	}
	st = wc->status == IBV_WC_WR_FLUSH_ERR ? FR_EPEER
					       : verbs_wc_status(wc->status);
	if (wc->status != IBV_WC_WR_FLUSH_ERR && c->state == VERBS_UP)
		fr_warn("verbs: rank %d: RDMA write to rank %d failed: %s",
			c->tp->rank, c->peer, ibv_wc_status_str(wc->status));
	if (c->state != VERBS_FAILED)
		verbs_conn_fail(
			c, st,
			"write to rank %d failed: %s (vendor error 0x%x)",
			c->peer, ibv_wc_status_str(wc->status), wc->vendor_err);
	verbs_sq_retire(c, l, s, st);
}

/*
 * The receive of an extra lane (QP i >= 1) completed.  The peer only
 * writes there, so it completes only when the QP stopped: with the
 * connection still up (we did not stop it, our own writes on it did not
 * fail first), the peer's part broke our registration (the HCA refused it
 * and stopped the QP, flushing the receive), which is FR_ERANGE as for a
 * write with immediate on QP 0.
 */
static void verbs_wc_lane_recv(struct fr_tp_conn *c, unsigned int i,
			       const struct ibv_wc *wc)
{
	if (c->state == VERBS_FAILED)
		return;
	if (wc->status == IBV_WC_SUCCESS) {
		verbs_conn_fail(c, FR_EPROTO,
				"rank %d sent a message on queue pair %u",
				c->peer, i + 1);
		return;
	}
	if (wc->status != IBV_WC_WR_FLUSH_ERR && c->state == VERBS_UP)
		fr_warn("verbs: rank %d: queue pair %u with rank %d failed: %s",
			c->tp->rank, i + 1, c->peer,
			ibv_wc_status_str(wc->status));
	verbs_conn_fail(
		c,
		wc->status == IBV_WC_WR_FLUSH_ERR ? FR_ERANGE
						  : verbs_wc_status(wc->status),
		"queue pair %u stopped: %s (a write by rank %d outside our registrations)",
		i + 1, ibv_wc_status_str(wc->status), c->peer);
}

static void verbs_wc(struct fr_tp *tp, const struct ibv_wc *wc)
{
	uint32_t slot = (uint32_t)(wc->wr_id >> 48);
	uint32_t gen = (uint32_t)(wc->wr_id >> 33) & 0x7fff;
	struct fr_tp_conn *c = slot < tp->nslots ? tp->slots[slot] : NULL;
	unsigned int i;

	if (!c || c->gen != gen)
		return;
	/* A QP destroyed meanwhile leaves its completions in the CQ. */
	for (i = 0; i < c->nqps; i++)
		if (c->lane[i].qp && c->lane[i].qp->qp_num == wc->qp_num)
			break;
	if (i == c->nqps)
		return;
	if (!(wc->wr_id & VERBS_WRID_RECV))
		verbs_wc_send(c, &c->lane[i], wc);
	else if (!i)
		verbs_wc_recv(c, wc);
	else
		verbs_wc_lane_recv(c, i, wc);
}

/* Poll the CQ while the ring has room for what a batch can produce.
 * Returns the number of work completions taken, or FR_ESYS. */
static int verbs_cq_drain(struct fr_tp *tp)
{
	struct ibv_wc wc[VERBS_POLL_BATCH];
	int n, i, batch, total = 0;

	for (;;) {
		batch = (int)FR_MIN(fr_cqring_room(&tp->ring) / VERBS_WC_FANOUT,
				    (unsigned int)VERBS_POLL_BATCH);
		if (batch <= 0)
			return total;
		n = ibv_poll_cq(tp->cq, batch, wc);
		if (n < 0) {
			tp->fatal = FR_ESYS;
			verbs_seterr(tp, FR_LOG_ERROR,
				     "ibv_poll_cq failed (%d)", n);
			return FR_ESYS;
		}
		for (i = 0; i < n; i++)
			verbs_wc(tp, &wc[i]);
		total += n;
		if (n < batch) {
			/* Seen empty: destroyed QPs left nothing behind. */
			tp->cq_linger = 0;
			return total;
		}
	}
}

/*
 * Signal the tail of every QP whose newest WR is unsignalled with a
 * zero-length RDMA WRITE: no immediate, so nothing happens at the peer; its
 * completion retires the writes before it.
 */
static void verbs_post_fences(struct fr_tp *tp)
{
	struct ibv_send_wr wr, *bad;
	struct verbs_lane *l;
	struct verbs_sqe *e;
	struct fr_tp_conn *c;
	unsigned int i;
	int rc;

	for (c = tp->conns; c; c = c->next) {
		for (i = 0; i < c->nqps && c->state == VERBS_UP; i++) {
			l = &c->lane[i];
			if (!l->qp || !l->unsignaled ||
			    l->sq_tail - l->sq_head +
					    verbs_lane_reserved(c, l) >=
				    c->sq_cap)
				continue;
			memset(&wr, 0, sizeof(wr));
			wr.wr_id = verbs_wrid(c, false, (uint32_t)l->sq_tail);
			wr.opcode = IBV_WR_RDMA_WRITE;
			wr.num_sge = 0;
			wr.send_flags = IBV_SEND_SIGNALED;
			/* Zero bytes need no valid key; give the last used
			 * one anyway, for devices that look at it. */
			wr.wr.rdma.remote_addr = l->last_raddr;
			wr.wr.rdma.rkey = l->last_rkey;
			rc = ibv_post_send(l->qp, &wr, &bad);
			if (rc) {
				char why[192];

				fr_warn("verbs: rank %d: ibv_post_send (fence) to rank %d: %s",
					tp->rank, c->peer,
					verbs_strerror(rc, why, sizeof(why)));
				verbs_conn_fail(c, FR_EPEER,
						"ibv_post_send (fence): %s",
						strerror(rc));
				break;
			}
			e = &l->sq[l->sq_tail % c->sq_cap];
			memset(e, 0, sizeof(*e));
			e->kind = VERBS_SQE_FENCE;
			l->sq_tail++;
			l->unsignaled = 0;
		}
	}
}

static void verbs_notes_post_all(struct fr_tp *tp)
{
	struct fr_tp_conn *c;

	for (c = tp->conns; c; c = c->next)
		if (c->state == VERBS_UP && c->note_head != c->note_tail)
			verbs_notes_post(c);
}

/* Apply the DISCONNECTED events of live connections (after the drain). */
static void verbs_apply_peer_gone(struct fr_tp *tp)
{
	struct fr_tp_conn *c;

	for (c = tp->conns; c; c = c->next)
		if (c->peer_gone && c->state == VERBS_UP)
			verbs_conn_fail(c, FR_EPEER,
					"rank %d closed the connection",
					c->peer);
}

/* Move what connections owe the caller into the ring, as room allows:
 * held receives first (they came first), then the error, then the
 * writes nobody else will complete. */
static void verbs_flush_owed(struct fr_tp *tp)
{
	struct fr_tp_conn *c;
	unsigned int i;

	for (c = tp->conns; c; c = c->next) {
		if (!c->owned)
			continue;
		while (c->held_count && fr_cqring_room(&tp->ring)) {
			struct verbs_held *h = &c->held[c->held_head];

			fr_cqring_push(&tp->ring, FR_CQE_RECV, 0, c, 0, h->imm,
				       h->len);
			c->held_head = (c->held_head + 1) % tp->rq_depth;
			c->held_count--;
			verbs_repost(c);
		}
		if (c->held_count)
			return;
		if (c->err_owed) {
			if (!fr_cqring_room(&tp->ring))
				return;
			fr_cqring_push(&tp->ring, FR_CQE_RECV, c->error, c, 0,
				       0, 0);
			c->err_owed = false;
		}
		for (i = 0; c->synth && i < c->nqps; i++) {
			struct verbs_lane *l = &c->lane[i];

			while (l->sq_head < l->sq_tail) {
				if (fr_cqring_room(&tp->ring) < VERBS_WC_FANOUT)
					return;
				verbs_sq_retire(c, l, l->sq_head, FR_EPEER);
			}
		}
		if (c->state == VERBS_FAILED && !verbs_notes_fail(c))
			return;
	}
}

static bool verbs_owes(const struct fr_tp *tp)
{
	const struct fr_tp_conn *c;
	unsigned int i;

	if (tp->ring.count || tp->fatal)
		return true;
	for (c = tp->conns; c; c = c->next) {
		if (!c->owned)
			continue;
		if (c->held_count || c->err_owed || c->peer_gone)
			return true;
		/* A ready notification: posted (up) or failed (not). */
		if (verbs_note_ready(c) &&
		    (c->state == VERBS_UP ||
		     c->lane[0].sq_head == c->lane[0].sq_tail))
			return true;
		for (i = 0; c->synth && i < c->nqps; i++)
			if (c->lane[i].sq_head < c->lane[i].sq_tail)
				return true;
	}
	return false;
}

/* ---- device choice ------------------------------------------------------- */

struct verbs_cand {
	int dev; /* index in the device list */
	uint8_t port;
	bool ib;   /* InfiniBand link layer: addressed by IPoIB */
	int match; /* GID index holding local_ip, or -1 */
	int v4;	   /* first RoCE v2 IPv4-mapped GID, or -1 */
	int v6;	   /* first RoCE v2 global IPv6 GID, or -1 */
	bool ovr;  /* FR_IB_GID_INDEX exists on this port */
	struct ibv_gid_entry match_e, v4_e, v6_e, ovr_e;
	int score; /* hwloc: 0 near this thread, 1 unknown, 2 far */
};

struct verbs_choice {
	char dev[IBV_SYSFS_NAME_MAX];
	uint8_t port;
	bool ib;
	int gid_index; /* -1: none (InfiniBand) */
	struct sockaddr_storage sa;
	const char *why;
};

/* FR_IB_DEV=name[:port]; port 0 = any. */
static int verbs_parse_dev(const char *s, char *name, size_t len, int *port)
{
	const char *colon = strchr(s, ':');
	size_t n = colon ? (size_t)(colon - s) : strlen(s);
	long p = 0;

	if (!n || n >= len)
		return FR_EINVAL;
	if (colon && fr_parse_long(colon + 1, 1, 255, &p))
		return FR_EINVAL;
	memcpy(name, s, n);
	name[n] = '\0';
	*port = (int)p;
	return 0;
}

/* local_ip as a GID-comparable address; false if it is no usable hint. */
static bool verbs_hint(const char *ip, uint8_t *raw, int *family)
{
	struct in6_addr a6;
	struct in_addr a4;

	if (!ip)
		return false;
	if (inet_pton(AF_INET, ip, &a4) == 1) {
		/* rdma_cm cannot run over loopback; 0.0.0.0 names nothing. */
		if ((ntohl(a4.s_addr) >> 24) == 127 || a4.s_addr == INADDR_ANY)
			return false;
		memset(raw, 0, 10);
		raw[10] = raw[11] = 0xff;
		memcpy(raw + 12, &a4, 4);
		*family = AF_INET;
		return true;
	}
	if (inet_pton(AF_INET6, ip, &a6) == 1) {
		if (IN6_IS_ADDR_LOOPBACK(&a6) || IN6_IS_ADDR_UNSPECIFIED(&a6))
			return false;
		memcpy(raw, &a6, 16);
		*family = AF_INET6;
		return true;
	}
	return false;
}

static void verbs_gid_sockaddr(const struct ibv_gid_entry *e,
			       struct sockaddr_storage *sa)
{
	memset(sa, 0, sizeof(*sa));
	if (verbs_v4mapped(e->gid.raw)) {
		struct sockaddr_in *in = (struct sockaddr_in *)sa;

		in->sin_family = AF_INET;
		memcpy(&in->sin_addr, e->gid.raw + 12, 4);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;

		in6->sin6_family = AF_INET6;
		memcpy(&in6->sin6_addr, e->gid.raw, 16);
		if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr))
			in6->sin6_scope_id = e->ndev_ifindex;
	}
}

/* Scan a port's GID table for the RoCE v2 entries we can use. */
static void verbs_scan_gids(struct ibv_context *ctx, struct verbs_cand *k,
			    int tbl_len, const uint8_t *hint, bool hint_ok,
			    long ovr)
{
	struct ibv_gid_entry e;
	int g;

	for (g = 0; g < tbl_len; g++) {
		if (ibv_query_gid_ex(ctx, k->port, (uint32_t)g, &e, 0))
			continue; /* an empty slot */
		if (g == ovr) {
			k->ovr = true;
			k->ovr_e = e;
		}
		if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
			continue;
		if (hint_ok && k->match < 0 && !memcmp(e.gid.raw, hint, 16)) {
			k->match = g;
			k->match_e = e;
		}
		if (verbs_v4mapped(e.gid.raw)) {
			if (k->v4 < 0) {
				k->v4 = g;
				k->v4_e = e;
			}
		} else if (k->v6 < 0 && !IN6_IS_ADDR_LINKLOCAL(
						(struct in6_addr *)e.gid.raw)) {
			k->v6 = g;
			k->v6_e = e;
		}
	}
}

/*
 * The ACTIVE ports worth considering (FR_IB_DEV filters), with what their
 * GID tables offer.  why: a message for when there is none.
 */
static int verbs_scan(struct ibv_device **list, int ndev, const char *want,
		      int want_port, const uint8_t *hint, bool hint_ok,
		      long ovr, struct verbs_cand *cands, char *why,
		      size_t whylen)
{
	int i, p, n = 0;
	bool named = false;

	verbs_msg(why, whylen, "no RDMA device has an ACTIVE port");
	for (i = 0; i < ndev && n < VERBS_MAX_CANDS; i++) {
		const char *name = ibv_get_device_name(list[i]);
		struct ibv_device_attr da;
		struct ibv_context *ctx;

		if (want && strcmp(name, want))
			continue;
		named = true;
		ctx = ibv_open_device(list[i]);
		if (!ctx) {
			verbs_msg(why, whylen, "device %s: ibv_open_device: %s",
				  name, fr_syserr(errno));
			continue;
		}
		if (ibv_query_device(ctx, &da)) {
			verbs_msg(why, whylen,
				  "device %s: ibv_query_device: %s", name,
				  fr_syserr(errno));
			ibv_close_device(ctx);
			continue;
		}
		if (want_port > da.phys_port_cnt)
			verbs_msg(why, whylen, "device %s has no port %d", name,
				  want_port);
		for (p = 1; p <= da.phys_port_cnt && n < VERBS_MAX_CANDS; p++) {
			struct verbs_cand *k = &cands[n];
			struct ibv_port_attr pa;

			if (want_port && p != want_port)
				continue;
			if (ibv_query_port(ctx, (uint8_t)p, &pa)) {
				verbs_msg(
					why, whylen,
					"device %s port %d: ibv_query_port: %s",
					name, p, fr_syserr(errno));
				continue;
			}
			if (pa.state != IBV_PORT_ACTIVE) {
				verbs_msg(why, whylen,
					  "device %s port %d is %s", name, p,
					  verbs_port_state(pa.state));
				continue;
			}
			memset(k, 0, sizeof(*k));
			k->dev = i;
			k->port = (uint8_t)p;
			k->ib = pa.link_layer != IBV_LINK_LAYER_ETHERNET;
			k->match = k->v4 = k->v6 = -1;
			k->score = 1;
			verbs_scan_gids(ctx, k, pa.gid_tbl_len, hint,
					hint_ok && !k->ib, ovr);
			n++;
		}
		ibv_close_device(ctx);
	}
	if (want && !named)
		verbs_msg(why, whylen,
			  "FR_IB_DEV=%s: no RDMA device of that name", want);
	return n;
}

/*
 * Rank candidates by locality to the calling thread: 0 when the device
 * hangs off this thread's NUMA node, 2 when it is elsewhere, 1 unknown
 * (a software device has no PCI locality).  Best effort: without hwloc's
 * answer every device stays at 1 and the first one wins.
 */
static void verbs_hwloc_rank(struct ibv_device **list, struct verbs_cand *cands,
			     int n)
{
	hwloc_topology_t topo;
	hwloc_bitmap_t here, nodes, set;
	hwloc_const_cpuset_t all;
	int i;

	if (hwloc_topology_init(&topo))
		return;
	/* I/O objects are needed to find the OS device of an HCA. */
	hwloc_topology_set_io_types_filter(topo,
					   HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
	if (hwloc_topology_load(topo))
		goto out_load;
	here = hwloc_bitmap_alloc();
	if (!here)
		goto out_here;
	nodes = hwloc_bitmap_alloc();
	if (!nodes)
		goto out_nodes;
	set = hwloc_bitmap_alloc();
	if (!set)
		goto out_set;
	/* A pinned thread stays where it is bound; an unbound one is best
	 * described by where it runs now. */
	all = hwloc_topology_get_allowed_cpuset(topo);
	if (hwloc_get_cpubind(topo, here, HWLOC_CPUBIND_THREAD) ||
	    hwloc_bitmap_isincluded(all, here)) {
		if (hwloc_get_last_cpu_location(topo, here,
						HWLOC_CPUBIND_THREAD))
			goto out_where;
	}
	hwloc_cpuset_to_nodeset(topo, here, nodes);
	for (i = 0; i < n; i++) {
		struct ibv_device *dev = list[cands[i].dev];
		hwloc_obj_t os = hwloc_ibv_get_device_osdev(topo, dev);
		hwloc_obj_t anc =
			os ? hwloc_get_non_io_ancestor_obj(topo, os) : NULL;

		if (anc && anc->nodeset && !hwloc_bitmap_iszero(anc->nodeset) &&
		    !hwloc_bitmap_iszero(nodes)) {
			cands[i].score =
				hwloc_bitmap_intersects(anc->nodeset, nodes)
					? 0
					: 2;
		} else if (!hwloc_ibv_get_device_cpuset(topo, dev, set) &&
			   !hwloc_bitmap_iszero(set) &&
			   !hwloc_bitmap_isincluded(all, set)) {
			cands[i].score =
				hwloc_bitmap_intersects(set, here) ? 0 : 2;
		}
		fr_dbg("verbs: %s port %u: locality score %d",
		       ibv_get_device_name(dev), cands[i].port, cands[i].score);
	}
out_where:
	hwloc_bitmap_free(set);
out_set:
	hwloc_bitmap_free(nodes);
out_nodes:
	hwloc_bitmap_free(here);
out_here:
out_load:
	hwloc_topology_destroy(topo);
}

/* Can we bind an address on this port without a hint? */
static bool verbs_cand_usable(const struct verbs_cand *k, bool have_ip,
			      long ovr)
{
	if (k->ib)
		return have_ip;
	if (ovr >= 0)
		return k->ovr;
	return k->v4 >= 0 || k->v6 >= 0;
}

/* Choose device, port, GID and the address to bind (see the top). */
static int verbs_choose(const struct fr_tp_params *p, struct verbs_choice *ch,
			char *err, size_t errlen)
{
	struct verbs_cand cands[VERBS_MAX_CANDS], *k = NULL;
	char want[IBV_SYSFS_NAME_MAX], why[160];
	const char *env;
	struct ibv_device **list;
	uint8_t hint[16];
	int ndev, n, i, want_port = 0, family = 0, ndevs_usable = 0;
	bool hint_ok, have_ip;
	long ovr = -1;

	env = getenv("FR_IB_DEV");
	if (env && *env &&
	    verbs_parse_dev(env, want, sizeof(want), &want_port)) {
		verbs_msg(err, errlen, "FR_IB_DEV=\"%s\" is not name[:port]",
			  env);
		return FR_EINVAL;
	}
	env = env && *env ? want : NULL;
	{
		const char *g = getenv("FR_IB_GID_INDEX");

		if (g && *g && fr_parse_long(g, 0, 65535, &ovr)) {
			verbs_msg(err, errlen,
				  "FR_IB_GID_INDEX=\"%s\" is not a GID index",
				  g);
			return FR_EINVAL;
		}
	}
	hint_ok = verbs_hint(p->local_ip, hint, &family);
	have_ip = hint_ok;

	list = ibv_get_device_list(&ndev);
	if (!list) {
		verbs_msg(err, errlen,
			  "no RDMA device: ibv_get_device_list: %s",
			  fr_syserr(errno));
		return FR_ENODEV;
	}
	n = verbs_scan(list, ndev, env, want_port, hint, hint_ok, ovr, cands,
		       why, sizeof(why));
	if (!n) {
		verbs_msg(err, errlen, "%s",
			  ndev ? why : "no RDMA device found");
		ibv_free_device_list(list);
		return FR_ENODEV;
	}
	memset(ch, 0, sizeof(*ch));
	ch->gid_index = -1;

	/* 1. The port that owns the address we bootstrapped over. */
	for (i = 0; i < n && !k; i++)
		if (cands[i].match >= 0) {
			k = &cands[i];
			ch->why = "its GID holds local_ip";
		}
	/* 2. local_ip on InfiniBand is an IPoIB address: bind it and let
	 *    rdma_cm find its port (checked after binding). */
	for (i = 0; i < n && !k && hint_ok; i++)
		if (cands[i].ib) {
			k = &cands[i];
			ch->why = "InfiniBand, local_ip as its IPoIB address";
		}
	/* 3. The first usable port, on the device nearest to us. */
	if (!k) {
		int last = -1;

		/* Ports come grouped by device: count distinct devices. */
		for (i = 0; i < n; i++)
			if (verbs_cand_usable(&cands[i], have_ip, ovr) &&
			    cands[i].dev != last) {
				last = cands[i].dev;
				ndevs_usable++;
			}
		if (ndevs_usable > 1)
			verbs_hwloc_rank(list, cands, n);
		for (i = 0; i < n; i++)
			if (verbs_cand_usable(&cands[i], have_ip, ovr) &&
			    (!k || cands[i].score < k->score))
				k = &cands[i];
		ch->why = ndevs_usable > 1 ? "nearest to this thread (hwloc)"
					   : "first ACTIVE port";
	}
	if (!k) {
		k = &cands[0];
		if (ovr >= 0)
			verbs_msg(
				err, errlen,
				"FR_IB_GID_INDEX=%ld: no such GID on %s port %u",
				ovr, ibv_get_device_name(list[k->dev]),
				k->port);
		else if (k->ib)
			verbs_msg(
				err, errlen,
				"device %s port %u is InfiniBand, and rdma_cm needs its IPoIB address, but no local address was given",
				ibv_get_device_name(list[k->dev]), k->port);
		else
			verbs_msg(
				err, errlen,
				"device %s port %u has no RoCE v2 GID with an IP address",
				ibv_get_device_name(list[k->dev]), k->port);
		ibv_free_device_list(list);
		return FR_ENODEV;
	}
	snprintf(ch->dev, sizeof(ch->dev), "%s",
		 ibv_get_device_name(list[k->dev]));
	ibv_free_device_list(list);
	ch->port = k->port;
	ch->ib = k->ib;

	if (k->ib) {
		if (ovr >= 0)
			fr_info("verbs: FR_IB_GID_INDEX has no effect on InfiniBand port %s:%u (rdma_cm addresses it by IPoIB)",
				ch->dev, ch->port);
		if (inet_pton(AF_INET, p->local_ip,
			      &((struct sockaddr_in *)&ch->sa)->sin_addr) ==
		    1) {
			ch->sa.ss_family = AF_INET;
		} else {
			inet_pton(AF_INET6, p->local_ip,
				  &((struct sockaddr_in6 *)&ch->sa)->sin6_addr);
			ch->sa.ss_family = AF_INET6;
		}
		return 0;
	}
	if (ovr >= 0) {
		if (!k->ovr) {
			verbs_msg(
				err, errlen,
				"FR_IB_GID_INDEX=%ld: no such GID on %s port %u",
				ovr, ch->dev, ch->port);
			return FR_ENODEV;
		}
		ch->gid_index = (int)ovr;
		verbs_gid_sockaddr(&k->ovr_e, &ch->sa);
		ch->why = "FR_IB_GID_INDEX";
		return 0;
	}
	if (k->match >= 0) {
		ch->gid_index = k->match;
		verbs_gid_sockaddr(&k->match_e, &ch->sa);
	} else if (k->v4 >= 0) {
		ch->gid_index = k->v4;
		verbs_gid_sockaddr(&k->v4_e, &ch->sa);
	} else {
		ch->gid_index = k->v6;
		verbs_gid_sockaddr(&k->v6_e, &ch->sa);
	}
	return 0;
}

/* ---- the operations ------------------------------------------------------ */

static int verbs_probe(char *errbuf, size_t errlen)
{
	struct verbs_cand cands[VERBS_MAX_CANDS];
	char want[IBV_SYSFS_NAME_MAX], why[160];
	struct rdma_event_channel *ec;
	struct ibv_device **list;
	const char *env = getenv("FR_IB_DEV");
	int ndev, n, port = 0;

	if (env && *env && verbs_parse_dev(env, want, sizeof(want), &port)) {
		verbs_msg(errbuf, errlen, "FR_IB_DEV=\"%s\" is not name[:port]",
			  env);
		return FR_ENODEV;
	}
	list = ibv_get_device_list(&ndev);
	if (!list) {
		verbs_msg(errbuf, errlen,
			  "no RDMA device: ibv_get_device_list: %s",
			  fr_syserr(errno));
		return FR_ENODEV;
	}
	/* Any ACTIVE port will do: which one is open()'s business. */
	n = verbs_scan(list, ndev, env && *env ? want : NULL, port, NULL, false,
		       -1, cands, why, sizeof(why));
	ibv_free_device_list(list);
	if (!n) {
		verbs_msg(errbuf, errlen, "%s",
			  ndev ? why : "no RDMA device found");
		return FR_ENODEV;
	}
	/* Verbs alone are not enough: connections need rdma_cm. */
	ec = rdma_create_event_channel();
	if (!ec) {
		verbs_msg(errbuf, errlen,
			  "rdma_cm unavailable: rdma_create_event_channel: %s",
			  fr_syserr(errno));
		return FR_ENODEV;
	}
	rdma_destroy_event_channel(ec);
	return 0;
}

static void verbs_addr_encode(uint8_t *b, const struct sockaddr_storage *sa)
{
	fr_sockaddr_encode(b, VERBS_ADDR_MAGIC, sa);
}

static int verbs_addr_decode(const void *blob, size_t len,
			     struct sockaddr_storage *sa)
{
	socklen_t sl;

	return fr_sockaddr_decode(blob, len, VERBS_ADDR_MAGIC, sa, &sl);
}

/* Limits of the device we ended up on, and the sizes derived from them. */
static int verbs_limits(struct fr_tp *tp, const struct fr_tp_params *p,
			char *err, size_t errlen)
{
	struct ibv_context *ctx = tp->lid->verbs;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	unsigned int depth;

	if (ibv_query_device(ctx, &da) ||
	    ibv_query_port(ctx, tp->lid->port_num, &pa)) {
		verbs_msg(err, errlen, "verbs: querying %s: %s",
			  ibv_get_device_name(ctx->device), fr_syserr(errno));
		return FR_ENODEV;
	}
	if (pa.state != IBV_PORT_ACTIVE) {
		verbs_msg(err, errlen, "verbs: device %s port %u is %s",
			  ibv_get_device_name(ctx->device), tp->lid->port_num,
			  verbs_port_state(pa.state));
		return FR_ENODEV;
	}
	depth = p->sq_depth ? (unsigned int)p->sq_depth
			    : VERBS_DEFAULT_SQ_DEPTH;
	if (da.max_qp_wr > VERBS_FENCE_SLOTS &&
	    depth > (unsigned int)da.max_qp_wr - VERBS_FENCE_SLOTS) {
		fr_dbg("verbs: send queue depth %u capped to the device's %d",
		       depth, da.max_qp_wr - VERBS_FENCE_SLOTS);
		depth = (unsigned int)da.max_qp_wr - VERBS_FENCE_SLOTS;
	}
	tp->sq_depth = depth;
	tp->sq_cap = depth + VERBS_FENCE_SLOTS;
	/* Enough receives for the peer's writes in flight and the credits
	 * and control messages beside them. */
	tp->rq_depth = FR_MIN(2 * depth, (unsigned int)da.max_qp_wr);
	tp->max_cqe = da.max_cqe;
	tp->cq_size = (int)FR_MIN(4ul * (tp->sq_cap + tp->rq_depth),
				  (unsigned long)da.max_cqe);
	tp->max_msg = pa.max_msg_sz;
	return 0;
}

static int verbs_open(const struct fr_tp_params *params, struct fr_tp **out,
		      void *addr, size_t *addrlen)
{
	struct fr_tp_params p;
	long ack, retry, nqps;
	size_t stripe;
	struct verbs_choice ch;
	struct sockaddr *la;
	struct fr_tp *tp;
	const char *poll_env, *actual;
	char where[96], why[192];
	int rc;

	if (!params || !out || !addr || !addrlen || !params->size)
		return FR_EINVAL;
	/* Fields past the caller's size read as zero: the struct may grow. */
	memset(&p, 0, sizeof(p));
	memcpy(&p, params, FR_MIN(params->size, sizeof(p)));
	if (*addrlen < VERBS_ADDR_LEN) {
		verbs_msg(p.errbuf, p.errlen,
			  "verbs: address buffer of %zu bytes, need %d",
			  *addrlen, VERBS_ADDR_LEN);
		return FR_EINVAL;
	}
	if (p.rank < 0 || p.sq_depth < 0 || p.sq_depth > VERBS_MAX_SQ_DEPTH) {
		verbs_msg(p.errbuf, p.errlen,
			  "verbs: invalid rank %d or send queue depth %d",
			  p.rank, p.sq_depth);
		return FR_EINVAL;
	}
	{
		const char *e = getenv("FR_IB_TIMEOUT");

		ack = VERBS_ACK_TIMEOUT;
		if (e && *e && fr_parse_long(e, 0, 31, &ack)) {
			verbs_msg(
				p.errbuf, p.errlen,
				"FR_IB_TIMEOUT=\"%s\" is not 0..31 (ACK timeout 4.096 us * 2^n)",
				e);
			return FR_EINVAL;
		}
		e = getenv("FR_IB_RETRY_CNT");
		retry = VERBS_CM_RETRY;
		if (e && *e && fr_parse_long(e, 0, 7, &retry)) {
			verbs_msg(p.errbuf, p.errlen,
				  "FR_IB_RETRY_CNT=\"%s\" is not 0..7", e);
			return FR_EINVAL;
		}
		e = getenv("FR_IB_QPS");
		nqps = 1;
		if (e && *e && fr_parse_long(e, 1, VERBS_MAX_QPS, &nqps)) {
			verbs_msg(
				p.errbuf, p.errlen,
				"FR_IB_QPS=\"%s\" is not 1..%d (queue pairs per connection)",
				e, VERBS_MAX_QPS);
			return FR_EINVAL;
		}
		e = getenv("FR_IB_STRIPE_BYTES");
		stripe = VERBS_DEFAULT_STRIPE;
		if (e && *e &&
		    (fr_parse_size(e, &stripe) || !stripe ||
		     stripe > VERBS_MAX_STRIPE)) {
			verbs_msg(
				p.errbuf, p.errlen,
				"FR_IB_STRIPE_BYTES=\"%s\" is not a size of 1 byte to 1G",
				e);
			return FR_EINVAL;
		}
	}
	rc = verbs_choose(&p, &ch, p.errbuf, p.errlen);
	if (rc)
		return rc;

	tp = calloc(1, sizeof(*tp));
	if (!tp) {
		verbs_msg(p.errbuf, p.errlen, "verbs: out of memory");
		return FR_ENOMEM;
	}
	tp->rank = p.rank;
	tp->nonce = p.job_nonce;
	tp->timeout_ms =
		p.timeout_ms > 0 ? p.timeout_ms : VERBS_DEFAULT_TIMEOUT_MS;
	poll_env = getenv("FR_POLL");
	tp->spin = poll_env && !strcmp(poll_env, "spin");
	tp->ack_timeout = (uint8_t)ack;
	tp->retry_cnt = (uint8_t)retry;
	tp->nqps = (unsigned int)nqps;
	tp->stripe = stripe;

	rc = FR_ESYS;
	tp->wfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (tp->wfd < 0) {
		verbs_msg(p.errbuf, p.errlen, "verbs: eventfd: %s",
			  fr_syserr(errno));
		goto err_wfd;
	}
	tp->ec = rdma_create_event_channel();
	if (!tp->ec) {
		verbs_msg(p.errbuf, p.errlen,
			  "verbs: rdma_create_event_channel: %s",
			  fr_syserr(errno));
		rc = FR_ENODEV;
		goto err_ec;
	}
	if (verbs_nonblock(tp->ec->fd)) {
		verbs_msg(p.errbuf, p.errlen, "verbs: fcntl: %s",
			  fr_syserr(errno));
		goto err_id;
	}
	if (rdma_create_id(tp->ec, &tp->lid, NULL, RDMA_PS_TCP)) {
		verbs_msg(p.errbuf, p.errlen, "verbs: rdma_create_id: %s",
			  fr_syserr(errno));
		goto err_id;
	}
	if (rdma_bind_addr(tp->lid, (struct sockaddr *)&ch.sa) ||
	    !tp->lid->verbs) {
		/* Bound without a device: the address is on no RDMA port. */
		const char *e = tp->lid->verbs
					? fr_syserr(errno)
					: "no RDMA device owns that address";

		verbs_msg(p.errbuf, p.errlen,
			  "verbs: cannot bind %s (device %s port %u): %s",
			  fr_sockaddr_str((struct sockaddr *)&ch.sa, where,
					  sizeof(where)),
			  ch.dev, ch.port, e);
		rc = FR_ENODEV;
		goto err_bind;
	}
	/* rdma_cm decides which port an address belongs to; it must be the
	 * one we chose, or FR_IB_DEV would be ignored silently. */
	actual = ibv_get_device_name(tp->lid->verbs->device);
	if (strcmp(actual, ch.dev) || tp->lid->port_num != ch.port) {
		if (getenv("FR_IB_DEV") && *getenv("FR_IB_DEV")) {
			verbs_msg(
				p.errbuf, p.errlen,
				"verbs: FR_IB_DEV names %s port %u, but its address %s belongs to %s port %u",
				ch.dev, ch.port,
				fr_sockaddr_str((struct sockaddr *)&ch.sa,
						where, sizeof(where)),
				actual, tp->lid->port_num);
			rc = FR_ENODEV;
			goto err_bind;
		}
		fr_info("verbs: rank %d: address of %s port %u is served by %s port %u; using that",
			p.rank, ch.dev, ch.port, actual, tp->lid->port_num);
		ch.gid_index = -1;
	}
	rc = verbs_limits(tp, &p, p.errbuf, p.errlen);
	if (rc)
		goto err_bind;
	rc = FR_ESYS;
	tp->pd = ibv_alloc_pd(tp->lid->verbs);
	if (!tp->pd) {
		verbs_msg(p.errbuf, p.errlen, "verbs: ibv_alloc_pd: %s",
			  verbs_strerror(errno, why, sizeof(why)));
		goto err_pd;
	}
	tp->cc = ibv_create_comp_channel(tp->lid->verbs);
	if (!tp->cc) {
		verbs_msg(p.errbuf, p.errlen,
			  "verbs: ibv_create_comp_channel: %s",
			  fr_syserr(errno));
		goto err_cc;
	}
	if (verbs_nonblock(tp->cc->fd)) {
		verbs_msg(p.errbuf, p.errlen, "verbs: fcntl: %s",
			  fr_syserr(errno));
		goto err_cq;
	}
	tp->cq = ibv_create_cq(tp->lid->verbs, tp->cq_size, NULL, tp->cc, 0);
	if (!tp->cq) {
		verbs_msg(p.errbuf, p.errlen,
			  "verbs: ibv_create_cq (%d entries): %s", tp->cq_size,
			  fr_syserr(errno));
		goto err_cq;
	}
	tp->cq_size = tp->cq->cqe;
	if (rdma_listen(tp->lid, VERBS_LISTEN_BACKLOG)) {
		const char *e = fr_syserr(errno);

		verbs_msg(p.errbuf, p.errlen, "verbs: rdma_listen on %s: %s",
			  fr_sockaddr_str((struct sockaddr *)&ch.sa, where,
					  sizeof(where)),
			  e);
		goto err_listen;
	}
	la = rdma_get_local_addr(tp->lid);
	memcpy(&tp->addr, la,
	       la->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6)
					 : sizeof(struct sockaddr_in));
	verbs_sa_set_port(&tp->addr, ntohs(rdma_get_src_port(tp->lid)));
	verbs_addr_encode(addr, &tp->addr);
	*addrlen = VERBS_ADDR_LEN;
	fr_info("verbs: rank %d: device %s port %u (%s), gid index %d, listening on %s; %s",
		tp->rank, actual, tp->lid->port_num,
		ch.ib ? "InfiniBand" : "RoCE", ch.gid_index,
		fr_sockaddr_str((struct sockaddr *)&tp->addr, where,
				sizeof(where)),
		ch.why);
	*out = tp;
	return 0;

err_listen:
	ibv_destroy_cq(tp->cq);
err_cq:
	ibv_destroy_comp_channel(tp->cc);
err_cc:
	ibv_dealloc_pd(tp->pd);
err_pd:
err_bind:
	rdma_destroy_id(tp->lid);
err_id:
	rdma_destroy_event_channel(tp->ec);
err_ec:
	close(tp->wfd);
err_wfd:
	free(tp);
	return rc;
}

static int verbs_connect(struct fr_tp *tp, int peer, const void *addr,
			 size_t addrlen, struct fr_tp_conn **out)
{
	struct fr_tp_conn *c;
	int rc;

	if (!tp || !addr || !out || peer < 0)
		return FR_EINVAL;
	if (tp->fatal)
		return tp->fatal;
	c = verbs_conn_new(tp);
	if (!c) {
		verbs_seterr(tp, FR_LOG_DEBUG, "out of memory");
		return FR_ENOMEM;
	}
	rc = verbs_addr_decode(addr, addrlen, &c->dst);
	if (rc) {
		verbs_seterr(tp, FR_LOG_WARN,
			     "malformed address blob for rank %d (%zu bytes)",
			     peer, addrlen);
		verbs_conn_destroy(c);
		return rc;
	}
	c->peer = peer;
	c->owned = true;
	c->deadline_ms = fr_now_ms() + (uint64_t)tp->timeout_ms;
	c->backoff_ms = VERBS_BACKOFF_MIN_MS;
	verbs_conn_link(c);
	verbs_start_connect(c);
	if (c->state == VERBS_FAILED) {
		rc = c->error;
		verbs_conn_free(c);
		return rc;
	}
	*out = c;
	return 0;
}

static int verbs_accept(struct fr_tp *tp, int peer, struct fr_tp_conn **out)
{
	struct fr_tp_conn *c;

	if (!tp || !out || peer < 0)
		return FR_EINVAL;
	if (tp->fatal)
		return tp->fatal;
	verbs_progress(tp);
	for (c = tp->conns; c; c = c->next) {
		if (c->incoming && !c->owned && c->state == VERBS_UP &&
		    c->peer == peer) {
			/* Receives held so far go out with the next poll. */
			c->owned = true;
			tp->npending--;
			*out = c;
			return 0;
		}
	}
	return FR_EAGAIN;
}

static int verbs_connect_done(struct fr_tp_conn *c)
{
	if (!c)
		return FR_EINVAL;
	if (c->tp->fatal)
		return c->tp->fatal;
	verbs_progress(c->tp);
	if (c->state == VERBS_UP)
		return 0;
	if (c->state == VERBS_FAILED)
		return c->was_up ? FR_EPEER : c->error;
	return FR_EAGAIN;
}

static int verbs_reg_mem(struct fr_tp *tp, void *buf, size_t len, int access,
			 struct fr_tp_mr **out)
{
	const int all =
		FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE;
	struct fr_tp_mr *mr;
	struct rlimit rl;
	char lim[32];
	int flags = 0, e;

	if (!tp || !out || (access & ~all) || (!buf && len) ||
	    (uintptr_t)buf + len < (uintptr_t)buf)
		return FR_EINVAL;
	/* Least privilege: never remote read; the HCA needs local write
	 * to let a peer write into the region. */
	if (access & (FR_TP_LOCAL_WRITE | FR_TP_REMOTE_WRITE))
		flags |= IBV_ACCESS_LOCAL_WRITE;
	if (access & FR_TP_REMOTE_WRITE)
		flags |= IBV_ACCESS_REMOTE_WRITE;
	mr = calloc(1, sizeof(*mr));
	if (!mr)
		return FR_ENOMEM;
	if (len) {
		mr->mr = ibv_reg_mr(tp->pd, buf, len, flags);
		if (!mr->mr) {
			e = errno;
			free(mr);
			if (e != ENOMEM && e != EPERM) {
				char why[192];

				verbs_seterr(
					tp, FR_LOG_WARN,
					"ibv_reg_mr of %zu bytes at %p: %s",
					len, buf,
					verbs_strerror(e, why, sizeof(why)));
				return FR_ESYS;
			}
			if (getrlimit(RLIMIT_MEMLOCK, &rl) ||
			    rl.rlim_cur == RLIM_INFINITY)
				snprintf(lim, sizeof(lim), "unlimited");
			else
				snprintf(lim, sizeof(lim), "%llu KiB",
					 (unsigned long long)rl.rlim_cur /
						 1024);
			verbs_seterr(
				tp, FR_LOG_WARN,
				"ibv_reg_mr of %zu bytes at %p: %s; registered memory is pinned and counts against the locked-memory limit (ulimit -l: %s): raise it (ulimit -l unlimited, or memlock in /etc/security/limits.conf)",
				len, buf, strerror(e), lim);
			return FR_ENOMEM;
		}
	}
	mr->tp = tp;
	mr->base = buf;
	mr->len = len;
	mr->prev = NULL;
	mr->next = tp->mrs;
	if (tp->mrs)
		tp->mrs->prev = mr;
	tp->mrs = mr;
	*out = mr;
	return 0;
}

static int verbs_dereg_mem(struct fr_tp *tp, struct fr_tp_mr *mr)
{
	int rc;

	if (!tp || !mr || mr->tp != tp)
		return FR_EINVAL;
	/* Posted writes still read from it: the caller must poll first. */
	if (mr->inflight)
		return FR_EBUSY;
	if (mr->mr) {
		rc = ibv_dereg_mr(mr->mr);
		if (rc) {
			verbs_seterr(tp, FR_LOG_WARN, "ibv_dereg_mr: %s",
				     strerror(rc));
			return FR_ESYS;
		}
	}
	if (mr->prev)
		mr->prev->next = mr->next;
	else
		tp->mrs = mr->next;
	if (mr->next)
		mr->next->prev = mr->prev;
	free(mr);
	return 0;
}

static int verbs_pack_rkey(struct fr_tp_mr *mr, void *blob, size_t *len)
{
	uint8_t *b = blob;

	if (!mr || !blob || !len || *len < VERBS_RKEY_LEN)
		return FR_EINVAL;
	/* Only what a peer needs: never the ibv_mr (lkey, handles). */
	b[0] = VERBS_RKEY_MAGIC;
	b[1] = VERBS_RKEY_VERSION;
	fr_put_le16(b + 2, 0);
	fr_put_le32(b + 4, mr->mr ? mr->mr->rkey : 0);
	fr_put_le64(b + 8, (uint64_t)(uintptr_t)mr->base);
	fr_put_le64(b + 16, mr->len);
	*len = VERBS_RKEY_LEN;
	return 0;
}

static int verbs_unpack_rkey(struct fr_tp *tp, const void *blob, size_t len,
			     struct fr_tp_rkey *rkey)
{
	const uint8_t *b = blob;
	uint64_t addr, rlen;

	if (!blob || !rkey)
		return FR_EINVAL;
	if (len != VERBS_RKEY_LEN || b[0] != VERBS_RKEY_MAGIC ||
	    b[1] != VERBS_RKEY_VERSION || fr_get_le16(b + 2))
		return FR_EPROTO;
	addr = fr_get_le64(b + 8);
	rlen = fr_get_le64(b + 16);
	/* addr + roff never wraps once roff + len <= rlen is checked. */
	if (addr + rlen < addr)
		return FR_EPROTO;
	rkey->a = addr;
	rkey->b = rlen;
	rkey->c = fr_get_le32(b + 4);
	rkey->d = VERBS_RKEY_TAG;
	return 0;
}

/*
 * How a write is cut: into up to nqps parts of `chunk` bytes (a multiple of
 * VERBS_PART_ALIGN; the last part is shorter), part i on lane i.  Returns
 * the number of parts; 1 or 0 (len 0): not striped.
 */
static unsigned int verbs_parts(const struct fr_tp_conn *c, size_t len,
				size_t *chunk)
{
	size_t k;

	*chunk = len;
	/* Lane 0 takes a part and a notification: with a queue of one
	 * write, a striped one could never be posted. */
	if (!c->lanes_ready || len < c->tp->stripe || c->tp->sq_depth < 2)
		return len ? 1 : 0;
	k = (len + c->nqps - 1) / c->nqps;
	k = (k + VERBS_PART_ALIGN - 1) / VERBS_PART_ALIGN * VERBS_PART_ALIGN;
	*chunk = k;
	return (unsigned int)((len + k - 1) / k);
}

static int verbs_write_imm(struct fr_tp_conn *c, struct fr_tp_mr *lmr,
			   size_t loff, const struct fr_tp_rkey *rkey,
			   uint64_t roff, size_t len, uint32_t imm,
			   uint64_t ctx)
{
	struct ibv_send_wr wr;
	struct verbs_note *n;
	struct ibv_sge sge;
	struct fr_tp *tp;
	unsigned int nparts, i;
	size_t chunk;
	uint64_t seq;
	int rc;

	if (!c)
		return FR_EINVAL;
	tp = c->tp;
	if (c->state == VERBS_FAILED)
		return c->was_up ? FR_EPEER : c->error;
	if (c->state != VERBS_UP)
		return FR_EAGAIN;
	/*
	 * One message as far as the port goes: the single-WR path (before
	 * the extra QPs are ready, below the stripe size) must work for
	 * every length, and the port caps a message at max_msg_sz.
	 */
	if (len > UINT32_MAX || len > tp->max_msg) {
		verbs_seterr(
			tp, FR_LOG_WARN,
			"a write of %zu bytes exceeds the port's maximum message size of %u bytes",
			len, tp->max_msg);
		return FR_EINVAL;
	}
	if (len) {
		if (!lmr || !rkey || lmr->tp != tp || !lmr->mr ||
		    rkey->d != VERBS_RKEY_TAG)
			return FR_EINVAL;
		if (loff > lmr->len || len > lmr->len - loff)
			return FR_ERANGE;
		/* Overflow-safe; the peer's HCA checks again. */
		if (roff > rkey->b || len > rkey->b - roff)
			return FR_ERANGE;
	}
	if (c->user_inflight >= tp->sq_depth)
		return FR_EAGAIN;
	nparts = verbs_parts(c, len, &chunk);

	memset(&wr, 0, sizeof(wr));
	if (len) {
		wr.sg_list = &sge;
		wr.num_sge = 1;
		wr.wr.rdma.rkey = rkey->c;
		sge.lkey = lmr->mr->lkey;
	}
	/* The plain case: one write with immediate on lane 0, as long as no
	 * earlier notification waits (it must reach the peer first). */
	if (nparts <= 1 && c->note_head == c->note_tail) {
		if (!verbs_lane_room(c, &c->lane[0], 1))
			return FR_EAGAIN;
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		wr.imm_data = htonl(imm);
		if (len) {
			sge.addr = (uint64_t)(uintptr_t)(lmr->base + loff);
			sge.length = (uint32_t)len;
			wr.wr.rdma.remote_addr = rkey->a + roff;
		}
		rc = verbs_lane_post(c, 0, &wr, VERBS_SQE_USER, ctx, lmr, 0,
				     false);
		if (rc)
			return rc;
		c->user_inflight++;
		return 0;
	}

	/*
	 * Parts now, notification later: lane 0 needs a slot for its part
	 * (if any) and one reserved for the notification; lanes 1.. one
	 * each.  All or nothing, so FR_EAGAIN leaves nothing behind.
	 */
	if (!verbs_lane_room(c, &c->lane[0], nparts ? 2 : 1))
		return FR_EAGAIN;
	for (i = 1; i < nparts; i++)
		if (!verbs_lane_room(c, &c->lane[i], 1))
			return FR_EAGAIN;
	if (nparts > 1)
		c->nstriped++;
	seq = c->note_tail;
	n = &c->notes[seq % tp->sq_depth];
	n->ctx = ctx;
	n->imm = imm;
	n->len = (uint32_t)len;
	n->parts_left = nparts ? nparts - 1 : 0;
	n->silent = false;
	c->note_tail++;
	c->user_inflight++;
	/* Lanes 1.. first, each part signalled: its completion (the data
	 * is placed at the peer) is what the notification waits for. */
	for (i = nparts; i-- > 0;) {
		size_t off = (size_t)i * chunk;

		sge.addr = (uint64_t)(uintptr_t)(lmr->base + loff + off);
		sge.length = (uint32_t)FR_MIN(chunk, len - off);
		wr.opcode = IBV_WR_RDMA_WRITE;
		wr.send_flags = 0;
		wr.wr.rdma.remote_addr = rkey->a + roff + off;
		rc = verbs_lane_post(c, i, &wr,
				     i ? VERBS_SQE_PART : VERBS_SQE_PLAIN, 0,
				     lmr, seq, i > 0);
		if (rc) {
			/* The parts not posted never count down; the
			 * caller learns from rc, not from a completion. */
			n->parts_left -= i ? i : 0;
			n->silent = true;
			return rc;
		}
	}
	verbs_notes_post(c);
	return 0;
}

static int verbs_poll(struct fr_tp *tp, struct fr_tp_cqe *cqe, int max)
{
	int n = 0, rc;

	if (!tp || max < 0 || (max && !cqe))
		return FR_EINVAL;
	if (tp->fatal)
		return tp->fatal;
	verbs_cm_drain(tp);
	verbs_timers(tp);
	rc = verbs_cq_drain(tp);
	if (rc < 0)
		return rc;
	verbs_apply_peer_gone(tp);
	verbs_flush_owed(tp);
	verbs_notes_post_all(tp);
	verbs_post_fences(tp);
	verbs_sweep(tp);
	n = fr_cqring_pop(&tp->ring, cqe, max);
	return n;
}

/* How long wait() may sleep before a retry or deadline is due. */
static int verbs_wait_cap(const struct fr_tp *tp, int t)
{
	const struct fr_tp_conn *c;
	uint64_t now = fr_now_ms(), due;

	for (c = tp->conns; c; c = c->next) {
		if (c->state == VERBS_UP || c->state == VERBS_FAILED)
			continue;
		due = c->state == VERBS_RETRY
			      ? FR_MIN(c->retry_ms, c->deadline_ms)
			      : c->deadline_ms;
		due = due > now ? due - now : 0;
		if (due > INT_MAX)
			due = INT_MAX;
		if (t < 0 || (int)due < t)
			t = (int)due;
	}
	return t;
}

/*
 * The sleep, split in three so that the mixed transport (shm+verbs) can
 * sleep on us and on shm at once (transport.h): prepare arms the CQ and
 * looks once more, the caller sleeps on the completion channel, the cm
 * event channel and the wake eventfd (wait_fd(): one epoll descriptor
 * holding the three), finish takes the CQ event and the wake.
 */
static int verbs_wait_prepare(struct fr_tp *tp, int *timeout_ms)
{
	int rc;

	if (!tp || !timeout_ms)
		return FR_EINVAL;
	if (tp->spin || verbs_owes(tp))
		return 1;
	/* A notification left unposted (its parts completed in a drain
	 * outside poll) or an uncovered tail would never raise the
	 * completion we sleep on. */
	verbs_notes_post_all(tp);
	verbs_post_fences(tp);
	*timeout_ms = verbs_wait_cap(tp, *timeout_ms < 0 ? -1 : *timeout_ms);
	/* Arm, then look once more: a completion that arrived before the
	 * arming raises no event. */
	rc = ibv_req_notify_cq(tp->cq, 0);
	if (rc) {
		verbs_seterr(tp, FR_LOG_ERROR, "ibv_req_notify_cq: %s",
			     strerror(rc));
		return FR_ESYS;
	}
	rc = verbs_cq_drain(tp);
	if (rc < 0)
		return rc;
	return rc > 0 || verbs_owes(tp) ? 1 : 0;
}

static void verbs_wait_finish(struct fr_tp *tp)
{
	struct ibv_cq *ecq;
	uint64_t v;
	void *ectx;

	/* The channel is non-blocking (open): no event is EAGAIN. */
	if (!ibv_get_cq_event(tp->cc, &ecq, &ectx)) {
		/* Acknowledging takes a lock: do it in batches. */
		if (++tp->cq_unacked >= VERBS_CQ_ACK_BATCH) {
			ibv_ack_cq_events(tp->cq, tp->cq_unacked);
			tp->cq_unacked = 0;
		}
	}
	/* Level-triggered: a wake left unread would end every later wait. */
	if (read(tp->wfd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		fr_dbg("verbs: rank %d: reading the wake eventfd: %s",
		       tp->rank, fr_syserr(errno));
}

static int verbs_wait_fd(struct fr_tp *tp)
{
	const int fds[3] = { tp->cc->fd, tp->ec->fd, tp->wfd };
	struct epoll_event ev = { .events = EPOLLIN };

	if (tp->epfd > 0)
		return tp->epfd;
	tp->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (tp->epfd < 0) {
		verbs_seterr(tp, FR_LOG_ERROR, "epoll_create1: %s",
			     fr_syserr(errno));
		tp->epfd = 0;
		return FR_ESYS;
	}
	for (int i = 0; i < 3; i++)
		if (epoll_ctl(tp->epfd, EPOLL_CTL_ADD, fds[i], &ev)) {
			verbs_seterr(tp, FR_LOG_ERROR, "epoll_ctl: %s",
				     fr_syserr(errno));
			close(tp->epfd);
			tp->epfd = 0;
			return FR_ESYS;
		}
	return tp->epfd;
}

static int verbs_wait(struct fr_tp *tp, int timeout_ms)
{
	struct pollfd pfd[3];
	int t = timeout_ms, rc;

	if (!tp)
		return FR_EINVAL;
	rc = verbs_wait_prepare(tp, &t);
	if (rc)
		return rc < 0 ? rc : 0;
	pfd[0].fd = tp->cc->fd;
	pfd[0].events = POLLIN;
	pfd[1].fd = tp->ec->fd;
	pfd[1].events = POLLIN;
	pfd[2].fd = tp->wfd;
	pfd[2].events = POLLIN;
	if (poll(pfd, 3, t) < 0 && errno != EINTR) {
		verbs_seterr(tp, FR_LOG_ERROR, "poll: %s", fr_syserr(errno));
		return FR_ESYS;
	}
	verbs_wait_finish(tp);
	return 0;
}

/* The one call another thread may make while wait() sleeps. */
static void verbs_wake(struct fr_tp *tp)
{
	uint64_t one = 1;

	if (tp && write(tp->wfd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		fr_dbg("verbs: rank %d: writing the wake eventfd: %s", tp->rank,
		       fr_syserr(errno));
}

static void verbs_close_conn(struct fr_tp_conn *c)
{
	if (!c)
		return;
	fr_cqring_purge(&c->tp->ring, c);
	if (c->nqps > 1)
		fr_dbg("verbs: rank %d: connection %s rank %d: %u queue pairs, %llu writes striped",
		       c->tp->rank, c->incoming ? "from" : "to", c->peer,
		       c->nqps, (unsigned long long)c->nstriped);
	/* Tell the peer now rather than leave it to its timeouts. */
	if (c->id && !c->disconnected && c->state == VERBS_UP &&
	    !rdma_disconnect(c->id))
		c->disconnected = true;
	verbs_conn_free(c);
}

static void verbs_close(struct fr_tp *tp)
{
	if (!tp)
		return;
	while (tp->conns)
		verbs_close_conn(tp->conns);
	while (tp->mrs) {
		tp->mrs->inflight = 0;
		verbs_dereg_mem(tp, tp->mrs);
	}
	/* ibv_destroy_cq() waits for every event to be acknowledged. */
	if (tp->cq_unacked)
		ibv_ack_cq_events(tp->cq, tp->cq_unacked);
	ibv_destroy_cq(tp->cq);
	ibv_destroy_comp_channel(tp->cc);
	ibv_dealloc_pd(tp->pd);
	rdma_destroy_id(tp->lid);
	rdma_destroy_event_channel(tp->ec);
	if (tp->epfd > 0)
		close(tp->epfd);
	close(tp->wfd);
	free(tp->slots);
	free(tp->slot_gen);
	free(tp);
}

static int verbs_conn_peer(const struct fr_tp_conn *c)
{
	return c ? c->peer : -1;
}

static int verbs_pending(struct fr_tp *tp, int *peers, int max)
{
	int n = 0;

	if (!tp || !peers || !tp->npending)
		return 0;
	for (struct fr_tp_conn *c = tp->conns; c && n < max; c = c->next)
		if (c->incoming && !c->owned && c->state == VERBS_UP)
			peers[n++] = c->peer;
	return n;
}

static const char *verbs_last_error(struct fr_tp *tp)
{
	return tp ? tp->errbuf : "";
}

/* The HCA's local CPUs (sysfs local_cpus), where the progress thread goes
 * by default (src/affinity.c).  A software device (rxe, siw) has none. */
static int verbs_locality(struct fr_tp *tp, cpu_set_t *cpus)
{
	char path[IBV_SYSFS_PATH_MAX + 32];
	hwloc_bitmap_t set;
	int rc = FR_ENODEV;
	unsigned int i;

	if (!tp || !tp->pd)
		return FR_ENODEV;
	snprintf(path, sizeof(path), "%s/device/local_cpus",
		 tp->pd->context->device->ibdev_path);
	set = hwloc_bitmap_alloc();
	if (!set)
		return FR_ENOMEM;
	if (!hwloc_linux_read_path_as_cpumask(path, set) &&
	    !hwloc_bitmap_iszero(set)) {
		CPU_ZERO(cpus);
		hwloc_bitmap_foreach_begin(i, set)
		{
			if (i < CPU_SETSIZE)
				CPU_SET(i, cpus);
		}
		hwloc_bitmap_foreach_end();
		rc = 0;
	}
	hwloc_bitmap_free(set);
	return rc;
}

const struct fr_tp_ops fr_verbs_ops = {
	.size = sizeof(struct fr_tp_ops),
	.name = "verbs",
	.probe = verbs_probe,
	.open = verbs_open,
	.connect = verbs_connect,
	.accept = verbs_accept,
	.connect_done = verbs_connect_done,
	.reg_mem = verbs_reg_mem,
	.dereg_mem = verbs_dereg_mem,
	.pack_rkey = verbs_pack_rkey,
	.unpack_rkey = verbs_unpack_rkey,
	.write_imm = verbs_write_imm,
	.poll = verbs_poll,
	.wait = verbs_wait,
	.wake = verbs_wake,
	.wait_prepare = verbs_wait_prepare,
	.wait_fd = verbs_wait_fd,
	.wait_finish = verbs_wait_finish,
	.close_conn = verbs_close_conn,
	.close = verbs_close,
	.conn_peer = verbs_conn_peer,
	.last_error = verbs_last_error,
	.pending = verbs_pending,
	.locality = verbs_locality,
};
