/* SPDX-License-Identifier: MIT */
/*
 * verbs.h - what the files of the verbs transport share: its constants,
 * the endpoint, connection, lane and region structs, and the functions
 * one file calls in another, listed by the file that defines them.  The
 * design and the wire formats are described at the top of fr_verbs.c.
 * The endpoint and the connection begin with the transport base's part
 * (transports/common/tp_base.h: the connection list, error text, wake-up,
 * connection life), which the files use directly.  Private to
 * transports/verbs/: the library is built with -fvisibility=hidden, so these
 * verbs_ names stay inside it.
 */
#ifndef FR_VERBS_H
#define FR_VERBS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "../common/tp_base.h"
#include "tp_cqring.h"
#include "transport.h"

#define VERBS_MAGIC 0x42565246u /* "FRVB" */
#define VERBS_VERSION 3
#define VERBS_KIND_HELLO 1
#define VERBS_KIND_ACCEPT 2
#define VERBS_KIND_REJECT 3
#define VERBS_KIND_RESUME 4
#define VERBS_HELLO_LEN 28 /* plus 4 bytes per extra QP: 56 at most */
#define VERBS_RESUME_LEN 40
#define VERBS_REPLY_LEN 12
#define VERBS_ACCEPT_LEN 28 /* plus 4 bytes per extra QP */

#define VERBS_ADDR_LEN FR_SOCKADDR_BLOB_LEN
#define VERBS_ADDR_MAGIC 0xfb /* util.h's address blob, tagged as ours */

#define VERBS_RKEY_LEN 24
#define VERBS_RKEY_MAGIC 0xfd
#define VERBS_RKEY_VERSION 1
/* struct fr_tp_rkey.d of a key we unpacked: a zeroed or foreign key has
 * another value and is refused. */
#define VERBS_RKEY_TAG 0x76657262u

/* The default send queue depth and establishment timeout are the base's
 * (FR_TPB_DEFAULT_SQ_DEPTH, FR_TPB_DEFAULT_TIMEOUT_MS). */
#define VERBS_MAX_SQ_DEPTH 16384
/* Ring slots beyond sq_depth, for fences only. */
#define VERBS_FENCE_SLOTS 4
/* At most this many WRs in a row go unsignalled. */
#define VERBS_SIG_INTERVAL 16
/* Inline sizes asked of a QP, largest first: a polled line, then what
 * a small message needs. */
#define VERBS_MAX_INLINE 128
#define VERBS_MIN_INLINE 64
#define VERBS_POLL_BATCH 32
/* One work completion becomes at most this many FR completions (the
 * writes it retires, plus an owed receive error). */
#define VERBS_WC_FANOUT (VERBS_SIG_INTERVAL + 1)
#define VERBS_RESOLVE_MS 2000
#define VERBS_BACKOFF_MIN_MS 10
#define VERBS_BACKOFF_MAX_MS 500
#define VERBS_MAX_SLOTS 65535
#define VERBS_LISTEN_BACKLOG 64
#define VERBS_CQ_ACK_BATCH 64
#define VERBS_RECV_BATCH 64
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
/*
 * A resume's drain: the flushes of a QP moved to the error state should
 * come at once, but not every one always does (Linux 6.1's rxe may leave
 * the last send WR unflushed for good).  Once the QP is in the error state
 * nothing more arrives, so what the CQ holds this long after is all that
 * came; destroying the QP then stops it reading our memory, and what was
 * not flushed is in the log.
 */
#define VERBS_DRAIN_MS 50
/* A resume's dial unanswered this long is dropped and made again; a side
 * waiting for the peer's dial this long dials itself (the peer may not
 * know: its dial, or ours, was lost). */
#define VERBS_RESUME_DIAL_MS 4000
#define VERBS_RESUME_WAIT_MS 1000
/* The IB CM's reject reason when nobody listens on the service (port). */
#define VERBS_REJ_NO_LISTENER 8

#define VERBS_WRID_RECV (1ull << 32)

/* A connection whose sends are not acknowledged for this long (or a tenth
 * of the timeout, if longer) is taken as failed and resumed: a QP that
 * retries for ever (rnr/retry count 7 on rxe) never fails by itself. */
#define VERBS_STALL_MIN_MS 2000
/* Writes of this many bytes or more are signalled, so that a healthy
 * connection busy with large writes still completes something often (the
 * stall detector counts completions). */
#define VERBS_SIG_BYTES (64u * 1024u)

/* ibv_device_attr.vendor_id of the software devices (rxe, siw), where
 * FR_IB_LL is 0 unless set (fr_verbs.c, "Small writes"). */
#define VERBS_VENDOR_RXE 0xffffffu
#define VERBS_VENDOR_SIW 0x626d74u

/* Multi-QP striping (FR_IB_QPS, FR_IB_STRIPE_BYTES; see fr_verbs.c). */
#define VERBS_MAX_QPS 8
#define VERBS_DEFAULT_STRIPE (256u * 1024u)
#define VERBS_MAX_STRIPE (1ul << 30)
/* Parts start on this boundary (except the last one's end). */
#define VERBS_PART_ALIGN 64
/* The payload of a message on lane 0 that is not a write: a
 * notification, lanes ready, a polled-lines key or a wake-up. */
#define VERBS_CTL_LEN 16
#define VERBS_NOTE_MAGIC 0x544f4e46u  /* "FNOT" */
#define VERBS_READY_MAGIC 0x59445246u /* "FRDY" */
#define VERBS_LLKEY_MAGIC 0x594b4c46u /* "FLKY" */
#define VERBS_WAKE_MAGIC 0x4b415746u  /* "FWAK" */

/*
 * Polled lines (fr_verbs.c, "Small writes"): each side of a connection
 * keeps a ring of VERBS_LL_LINES lines of VERBS_LL_LINE bytes that the
 * peer RDMA-writes its small writes into, followed by two words the peer
 * writes too: how many of our lines it has taken (the credit), and its
 * state (a counter, odd while it polls).  A line is 16 words of 8 bytes:
 * 4 payload bytes, then 4 bytes of flag (the line's number + 1), so a
 * line whose 16 flags match is whole, in whatever order its bytes landed.
 */
#define VERBS_LL_LINES 64u
#define VERBS_LL_LINE 128u
#define VERBS_LL_WORDS (VERBS_LL_LINE / 8)
#define VERBS_LL_RX_BYTES (VERBS_LL_LINES * VERBS_LL_LINE)
#define VERBS_LL_BYTES (VERBS_LL_RX_BYTES + 64u)
/* offsets of the peer's words in our region */
#define VERBS_LL_CREDIT_OFF VERBS_LL_RX_BYTES
#define VERBS_LL_STATE_OFF (VERBS_LL_RX_BYTES + 8u)
/* The credit goes back after this many lines taken. */
#define VERBS_LL_CREDIT_BATCH (VERBS_LL_LINES / 4)

struct fr_tp_mr {
	struct fr_tpb_link link; /* in tp->mrs (first: converts back) */
	struct fr_tp *tp;
	struct ibv_mr *mr; /* NULL for an empty region */
	uint8_t *base;
	size_t len;
	unsigned int inflight; /* posted writes still reading from it */
	bool remote;	       /* peers may write into it */
};

enum verbs_sqe_kind {
	VERBS_SQE_FENCE,  /* a zero-length write that only signals the tail */
	VERBS_SQE_PLAIN,  /* QP 0's part of a write, the lanes-ready message */
	VERBS_SQE_USER,	  /* the WR that completes a write_imm(): FR_CQE_SEND */
	VERBS_SQE_PART,	  /* a part on QP 1..n-1: its notification waits */
	VERBS_SQE_INLINE, /* a write_inline(): nobody waits for it */
	VERBS_SQE_LINE,	  /* a write_inline() as a polled line: signalled */
	VERBS_SQE_WORD,	  /* a credit, state or wake-up for polled lines */
};

/* A posted send WR, in posting order. */
struct verbs_sqe {
	uint64_t ctx;
	struct fr_tp_mr *mr; /* NULL once it no longer reads it */
	/* PART: its notification's seq in c->notes; USER, INLINE: its
	 * message's seq in c->log */
	uint64_t seq;
	uint8_t kind; /* enum verbs_sqe_kind */
};

/*
 * A message (a write with immediate, whole) not yet known to have reached
 * the peer, kept so that a resumed connection can send it again: its
 * source (a region and offset, or the bytes of an inline write), its
 * destination and immediate.  Message seqs count every write_imm() and
 * write_inline() of the connection, in the order their immediates leave
 * lane 0, which is the order the peer counts them in (c->rx_msgs).
 */
struct verbs_msg {
	uint64_t ctx;
	struct fr_tp_mr *mr; /* NULL: inline (data) or empty */
	size_t loff;
	uint64_t raddr;
	uint32_t rkey, len, imm;
	bool user; /* a write_imm(): owes an FR_CQE_SEND */
	uint8_t data[FR_TP_INLINE_MAX];
};

/* Where a resume stands (c->rs, while c->b.state is VERBS_RESUME). */
enum verbs_rs {
	VERBS_RS_DRAIN,	  /* our QPs are in the error state: flushing */
	VERBS_RS_DIAL,	  /* our resume request is on its way (c->id) */
	VERBS_RS_BACKOFF, /* the next dial at c->b.retry_ms */
	VERBS_RS_WAIT,	  /* the peer dials us (it won the crossing) */
	VERBS_RS_ACCEPT,  /* we accepted its request (c->id) */
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
	/* ... of them, those someone waits for (all but INLINE): while 0 the
	 * tail needs no fence */
	unsigned int unsig_owed;
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
	uint64_t msg; /* its seq in c->log */
	uint32_t imm, len;
	unsigned int parts_left; /* parts on QPs 1..n-1 not completed yet */
};

/* A receive completion held back until accept() hands the conn out (or
 * the ring of completions has room): a write's, or a polled line's. */
struct verbs_held {
	uint32_t imm, len;
	bool line;
};

/* What the environment sets (fr_verbs.c reads it at open()). */
struct verbs_opts {
	bool spin;	     /* FR_POLL=spin: wait() never blocks */
	bool resume;	     /* FR_IB_RESUME (default 1) */
	bool ll;	     /* polled lines (FR_IB_LL, ll_auto) */
	bool ll_auto;	     /* FR_IB_LL unset: by the device (verbs_limits) */
	int fault_rank;	     /* FR_IB_FAULT=rank:n: fail the QP of every */
	unsigned long fault_every; /* n-th write_imm() (0: never) */
	long stall_ms;		   /* FR_IB_STALL_MS; -1: unset */
	uint8_t ack_timeout; /* FR_IB_TIMEOUT; 0: rdma_cm's own */
	uint8_t retry_cnt;   /* FR_IB_RETRY_CNT */
	unsigned int nqps;   /* FR_IB_QPS: QPs per connection we propose */
	size_t stripe;	     /* FR_IB_STRIPE_BYTES */
};

/* A connection's state (c->b.state): the base's three, then our own. */
enum verbs_state {
	VERBS_RETRY = FR_TPB_RETRY, /* outgoing: waiting for the next attempt */
	VERBS_UP = FR_TPB_UP,	    /* established */
	VERBS_FAILED = FR_TPB_FAILED, /* dead; completions may still be owed */
	VERBS_ADDR = FR_TPB_SETUP,    /* outgoing: resolving the address */
	VERBS_ROUTE,		      /* outgoing: resolving the route */
	VERBS_CONNECTING, /* outgoing: request sent, awaiting the reply */
	VERBS_ACCEPTING,  /* incoming: accepted, awaiting ESTABLISHED */
	VERBS_RESUME,	  /* was up; a QP failed: re-establishing (c->rs) */
};

struct fr_tp_conn {
	/* the base's part (tp_base.h): endpoint, list (tp->b.conns), peer,
	 * state, incoming, owned, error, err_owed (its error FR_CQE_RECV is
	 * not in the ring yet), deadline_ms, retry_ms, backoff_ms; its send
	 * queue stays empty (the lanes below are ours) */
	struct fr_tpb_conn b;
	uint32_t slot; /* in tp->slots, for wr_id */
	uint32_t gen;  /* of the slot, for wr_id */
	struct rdma_cm_id *id;
	bool was_up;	   /* it failed after being established */
	bool synth;	   /* no flush will come: complete the ring ourselves */
	bool disconnected; /* rdma_disconnect() was called */
	bool peer_gone;	   /* DISCONNECTED seen, applied after the CQ drain */
	bool lanes_stopped; /* moved to the error state (resume): flushing */

	/* resume (fr_verbs.c, "Link flaps"): our id and the peer's for the
	 * connection, stable over resumes; the messages not known to have
	 * arrived (seqs msg_head .. msg_tail-1; up to ack_upto the peer has
	 * them, from replay_next on they are still to be posted again); the
	 * messages we received */
	uint32_t cid, peer_cid;
	uint16_t peer_port; /* the peer's listener (its hello) */
	struct verbs_msg *log;
	unsigned int log_cap;
	uint64_t msg_head, msg_tail, ack_upto, replay_next;
	uint64_t rx_msgs;
	unsigned int rq_out; /* receives posted on lane 0, not completed */
	enum verbs_rs rs;
	uint64_t rs_deadline;	   /* give up then */
	uint64_t stop_ms;	   /* when the lanes were stopped */
	uint64_t rs_peer_rx;	   /* the peer's rx_msgs from its request */
	struct rdma_cm_id *rs_req; /* a request held while we drain */
	struct rdma_cm_id *old_id; /* the previous id, until established */
	bool rs_lost;		   /* our dial lost the crossing: wait */
	bool rs_progress; /* something arrived or completed since a resume */
	unsigned int nresumes;
	/* stalls: sends completed, as seen at the last look and since when */
	uint64_t sends_done, stall_seen, stall_ms, stall_look_ms;
	uint64_t bad_msg; /* the message whose WR failed first (+1; 0: none) */
	int bad_st;	  /* ... and its status */
	char rs_why[128]; /* what made us resume */

	/* establishment */
	struct sockaddr_storage dst;
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

	/* receive completions held back until accept() (held_cap: rq_depth
	 * receives and VERBS_LL_LINES lines) */
	struct verbs_held *held;
	unsigned int held_head, held_count, held_cap;

	/*
	 * Polled lines (fr_verbs.c, "Small writes").  ll is our region (the
	 * peer's lines, then its credit and state words; ll_mr), ll_peer_*
	 * the peer's.  ll_rx: we take lines (our key sent, no resume drained
	 * yet); ll_tx: we may send them (the peer's key came, no resume yet).
	 * Our lines: ll_tail sent; the peer's: ll_head taken from the ring,
	 * ll_freed handed out (the credit we give back, last sent
	 * ll_credit_sent).  ll_state: our state as last told the peer (odd:
	 * we poll); ll_rung: the peer's state we last woke it for.  ll_off:
	 * a resume began; no lines either way for good (not even on a key
	 * that arrives late).
	 */
	uint8_t *ll;
	struct ibv_mr *ll_mr;
	uint64_t ll_peer_addr;
	uint32_t ll_peer_rkey;
	bool ll_rx, ll_tx, ll_off;
	bool ll_ring_owed, ll_credit_owed, ll_awake_owed;
	uint64_t ll_tail, ll_head, ll_freed, ll_credit_sent;
	uint64_t ll_state, ll_rung;
	uint64_t ll_sent, ll_taken, ll_rings; /* counted for the close log */
};

struct fr_tp {
	/* the base's part (tp_base.h): rank, nonce, timeout_ms, sq_depth
	 * (writes in flight per QP), wfd (eventfd: wake() ends a wait()),
	 * epfd (wait_fd() for shm+verbs, made on first use; -1 before),
	 * conns, npending (accepted, not handed out), errbuf, and cq, which
	 * points at ring below; no listener fd, no region table */
	struct fr_tpb b;
	unsigned int sq_cap;   /* ring and HW send queue size */
	unsigned int rq_depth; /* receives posted per QP */
	struct verbs_opts opt; /* from the environment, at open() */
	int fatal;	       /* the endpoint itself failed */

	struct rdma_event_channel *ec;
	uint64_t cm_ms; /* fr_coarse_ms() of poll()'s last look at ec; 0: now */
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

	struct fr_tp_conn **slots;
	uint32_t *slot_gen;
	uint32_t nslots;
	struct fr_tpb_link *mrs; /* our registrations (struct fr_tp_mr) */
	unsigned long nwrites;	 /* write_imm()s, for FR_IB_FAULT */
	bool cq_empty;		 /* the last verbs_cq_drain() emptied the CQ */
	struct fr_tp_mr *mr_hint; /* the region a polled line last went to */
	bool woke; /* poll() has not run since a wait() returned */
	unsigned int stall_ms;	 /* FR_IB_STALL_MS (0: no stall detection) */
	uint64_t stall_tick;	 /* fr_coarse_ms() of the last stall scan */

	struct fr_cqring ring; /* the completions poll() hands out (b.cq) */
};

FR_TPB_FIRST(fr_tp);
FR_TPB_FIRST(fr_tp_conn);

/* What verbs_choose() decided, for open() to bind and report. */
struct verbs_choice {
	char dev[IBV_SYSFS_NAME_MAX];
	uint8_t port;
	bool ib;
	int gid_index; /* -1: none (InfiniBand) */
	struct sockaddr_storage sa;
	const char *why;
};

/* ---- shared inline helpers ---------------------------------------------- */

static inline uint64_t verbs_wrid(const struct fr_tp_conn *c, bool recv,
				  uint32_t seq)
{
	return (uint64_t)c->slot << 48 | (uint64_t)(c->gen & 0x7fff) << 33 |
	       (recv ? VERBS_WRID_RECV : 0) | seq;
}

/* A receive slot's payload buffer in c->ctl. */
static inline uint8_t *verbs_recv_buf(const struct fr_tp_conn *c, uint32_t idx)
{
	return c->ctl + (size_t)(c->sq_cap + idx) * VERBS_CTL_LEN;
}

/* c->ctl after the send and receive slots: our outgoing lines (line i
 * from slot i % VERBS_LL_LINES), then the words we send (credit, state). */
static inline uint8_t *verbs_ll_out(const struct fr_tp_conn *c, uint64_t i)
{
	return c->ctl +
	       (size_t)(c->sq_cap + c->b.tp->rq_depth) * VERBS_CTL_LEN +
	       (size_t)(i % VERBS_LL_LINES) * VERBS_LL_LINE;
}

static inline uint8_t *verbs_ll_word_out(const struct fr_tp_conn *c, int w)
{
	return verbs_ll_out(c, 0) + VERBS_LL_RX_BYTES + 8 * w;
}

/* The bytes of c->ctl. */
static inline size_t verbs_ctl_bytes(const struct fr_tp *tp)
{
	return (size_t)(tp->sq_cap + tp->rq_depth) * VERBS_CTL_LEN +
	       VERBS_LL_RX_BYTES + 16;
}

/* ---- verbs_conn.c: error messages, connections and their QPs ------------- */

const char *verbs_strerror(int e, char *buf, size_t len);
void verbs_sa_set_port(struct sockaddr_storage *sa, uint16_t port);
uint16_t verbs_sa_port(const struct sockaddr_storage *sa);
/* A connection with its buffers, slot and control region, in no list
 * (fr_tpb_conn_link); fr_tpb_conn_destroy / fr_tpb_conn_free end it,
 * through the class's hooks: verbs_drop_id, then verbs_conn_release. */
struct fr_tp_conn *verbs_conn_new(struct fr_tp *tp);
void verbs_conn_release(struct fr_tp_conn *c);
void verbs_drop_lane(struct fr_tp_conn *c, unsigned int i);
void verbs_drop_qp(struct fr_tp_conn *c);
void verbs_drop_id(struct fr_tp_conn *c);
void __attribute__((format(printf, 3, 4)))
verbs_conn_fail(struct fr_tp_conn *c, int err, const char *fmt, ...);
void verbs_conn_vfail(struct fr_tp_conn *c, int err, const char *fmt,
		      va_list ap);
void verbs_log_pop(struct fr_tp_conn *c, uint64_t upto);
void verbs_set_ack_timeout(struct fr_tp *tp, struct rdma_cm_id *id);
void verbs_put_reply(uint8_t *b, int kind, int32_t value);
void verbs_refuse(struct rdma_cm_id *id, int status);
int verbs_hello_rank(struct fr_tp *tp, struct rdma_cm_id *id, const uint8_t *pd,
		     int *rank);
void verbs_lanes_stop(struct fr_tp_conn *c);
void verbs_drop_lanes(struct fr_tp_conn *c);
int verbs_post_recvs(struct fr_tp_conn *c, unsigned int n);
int verbs_post_ctl(struct fr_tp_conn *c, const uint8_t *pl, const char *what);
int verbs_ll_send_key(struct fr_tp_conn *c);
int verbs_lane_connect(struct fr_tp_conn *c, unsigned int i, uint32_t peer_qpn);
int verbs_qp_create(struct fr_tp_conn *c);
struct fr_tp_conn *verbs_conn_by_cid(struct fr_tp *tp, uint32_t cid);

/* ---- verbs_dev.c: device choice, probe, limits, locality ----------------- */

void __attribute__((format(printf, 3, 4)))
verbs_msg(char *buf, size_t len, const char *fmt, ...);
int verbs_choose(const struct fr_tp_params *p, struct verbs_choice *ch,
		 char *err, size_t errlen);
int verbs_probe(char *errbuf, size_t errlen);
int verbs_limits(struct fr_tp *tp, char *err, size_t errlen);
int verbs_locality(struct fr_tp *tp, cpu_set_t *cpus);

/* ---- verbs_cm.c: establishment ------------------------------------------- */

void verbs_start_connect(struct fr_tp_conn *c);
void verbs_cm_drain(struct fr_tp *tp);
void verbs_timers(struct fr_tp *tp);
void verbs_sweep(struct fr_tp *tp);

/* ---- verbs_resume.c: a connection that was up, again after a flap -------- */

/* A connection broke: resume it when the cause is the network's (net) and
 * it may, else fail it with err (verbs_conn_fail). */
void __attribute__((format(printf, 4, 5)))
verbs_conn_broke(struct fr_tp_conn *c, int err, bool net, const char *fmt, ...);
void verbs_resume_drained(struct fr_tp_conn *c);
void verbs_resume_request(struct fr_tp *tp, struct rdma_cm_id *id,
			  const uint8_t *pd, size_t pdlen);
bool verbs_resume_event(struct fr_tp_conn *c, enum rdma_cm_event_type type,
			int status, struct rdma_cm_id *id, const uint8_t *pd,
			size_t pdlen);
void verbs_resume_timers(struct fr_tp_conn *c, uint64_t now);
void verbs_resume_arrived(struct fr_tp_conn *c);

/* ---- verbs_mr.c: memory registration and remote keys --------------------- */

int verbs_reg_mem(struct fr_tp *tp, void *buf, size_t len, int access,
		  struct fr_tp_mr **out);
int verbs_dereg_mem(struct fr_tp *tp, struct fr_tp_mr *mr);
int verbs_pack_rkey(struct fr_tp_mr *mr, void *blob, size_t *len);
int verbs_unpack_rkey(struct fr_tp *tp, const void *blob, size_t len,
		      struct fr_tp_rkey *rkey);
struct fr_tp_mr *verbs_mr_find(struct fr_tp *tp, uint32_t rkey, uint64_t addr,
			       size_t len);

/* ---- verbs_post.c: posting on the lanes, the notification FIFO ---------- */

/* a notification (a striped write's send with immediate) is due: its
 * parts are all placed */
bool verbs_note_ready(const struct fr_tp_conn *c);
/* the slots of lane l's send ring that the notifications keep */
unsigned int verbs_lane_reserved(const struct fr_tp_conn *c,
				 const struct verbs_lane *l);
/* room for need more work requests on lane l */
bool verbs_lane_room(const struct fr_tp_conn *c, const struct verbs_lane *l,
		     unsigned int need);
/* post wr on lane i with its ring entry (kind, ctx, mr, the log's seq),
 * signalled where sig or the interval says; 0, or FR_EPEER with the
 * connection failed */
int verbs_lane_post(struct fr_tp_conn *c, unsigned int i,
		    struct ibv_send_wr *wr, enum verbs_sqe_kind kind,
		    uint64_t ctx, struct fr_tp_mr *mr, uint64_t seq, bool sig);
/* the due notifications, in order, as long as lane 0 has room */
void verbs_notes_post(struct fr_tp_conn *c);
/* a consumed receive put back (not on a stopped or failed QP) */
void verbs_repost(struct fr_tp_conn *c);

/* ---- verbs_lines.c: the polled lines' receiving side, delivery ----------- */

/* a word of our polled-lines region: the peer's credit or state */
uint64_t verbs_ll_word(const struct fr_tp_conn *c, size_t off);
/* tell the peer we poll again (the state word) */
void verbs_ll_awake(struct fr_tp_conn *c);
/* a write delivered: by a line (credit owed) or a receive (put back) */
void verbs_delivered(struct fr_tp_conn *c, bool line);
/* a write of len bytes with immediate imm delivered to the completion
 * ring (held for the caller where hold) */
void verbs_deliver(struct fr_tp_conn *c, uint32_t imm, uint32_t len, bool line,
		   bool hold);
/* the lines that are in, in order */
void verbs_lines_take(struct fr_tp_conn *c);

/* ---- verbs_data.c: the data path, completions, the log ------------------- */

void verbs_progress(struct fr_tp *tp, bool eager);
int verbs_write_imm(struct fr_tp_conn *c, struct fr_tp_mr *lmr, size_t loff,
		    const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		    uint32_t imm, uint64_t ctx);
int verbs_write_inline(struct fr_tp_conn *c, const void *buf,
		       const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		       uint32_t imm);
/* the pieces of a poll (verbs_poll.c) */
int verbs_cq_drain(struct fr_tp *tp);
void verbs_apply_peer_gone(struct fr_tp *tp);
void verbs_resume_drains(struct fr_tp *tp);
void verbs_flush_owed(struct fr_tp *tp);
void verbs_notes_post_all(struct fr_tp *tp);
void verbs_post_fences(struct fr_tp *tp);
bool verbs_owes(const struct fr_tp *tp);
bool verbs_rings_empty(const struct fr_tp_conn *c);
void verbs_lines_poll(struct fr_tp *tp);
bool verbs_line_ready(const struct fr_tp_conn *c);
int verbs_ll_sleep(struct fr_tp *tp);

/* ---- verbs_poll.c: poll and wait ----------------------------------------- */

int verbs_poll(struct fr_tp *tp, struct fr_tp_cqe *cqe, int max);
int verbs_wait_prepare(struct fr_tp *tp, int *timeout_ms);
int verbs_wait_fd(struct fr_tp *tp);
void verbs_wait_finish(struct fr_tp *tp);
int verbs_wait(struct fr_tp *tp, int timeout_ms);

#endif /* FR_VERBS_H */
