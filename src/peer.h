/* SPDX-License-Identifier: MIT */
/*
 * peer.h - peers connected on first use, and the mailbox message layer.
 *
 * Every algorithm talks to other ranks through two things only:
 *   - messages (fr_msg_send / fr_msg_get / fr_msg_consume): a header plus
 *     up to fr_msg_payload_max() bytes, written in one write-with-immediate
 *     into a slot of the receiver's mailbox (the eager protocol: no
 *     ready-to-receive round trip); a small one (FR_MSG_COMPACT_MAX bytes
 *     or less) under a 16-byte header by the transport's write_inline, from
 *     the stack, where it has one (FR_LL; peer.c says when).  Slots are per
 * sender, so flow control is per peer: a credit per slot, returned on later
 * messages or, when half the slots are owed, by a zero-length write.  Messages
 * from one peer are consumed in the order they were sent; a message for a
 *     collective this rank has not reached yet stays in its slot until then.
 *   - one-sided writes into a peer's registered memory (fr_peer_write), for
 *     zero-copy algorithms that exchanged remote keys (the ring).
 * The layer also watches its peers (PING/PONG liveness, timeouts, a peer
 * that said goodbye) and owns the communicator's failure: fr_comm_fail()
 * records the first error and sends ABORT to every connected peer.
 *
 * Layer: peers.  Calls the memory layer (mem.h), the transport and the
 * base; called by the algorithms, the engine and the entry points.
 * Immediate types that are not its own it hands up, unread, to whoever
 * polled (FR_PEERS_FOR_ALGO): the engine passes them to the algorithm that
 * claims them (struct fr_algo.imm_types).  Owns struct fr_peer_layer and
 * struct fr_fail.
 */
#ifndef FR_PEER_H
#define FR_PEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"
#include "util.h"

struct fr_comm;
struct fr_mem;
struct fr_request;

/* Mailbox data slots per peer (credits). */
#define FR_MBX_SLOTS 8
/* Recovery's channels (agree.c): a CTRL slot each, of ctrl_size bytes,
 * after a sender's data, ABORT and BYE slots. */
#define FR_CTRL_CHANNELS 2
/* Outbox slots only ABORT and BYE may use. */
#define FR_OUT_RESERVED 2
/* Peers' remote keys are cached direct-mapped by registration id. */
#define FR_RKEY_CACHE 64

/* Collectives (the wire carries these numbers: append only). */
enum fr_coll {
	FR_COLL_ALLREDUCE = 1,
	FR_COLL_REDUCE_SCATTER = 2,
	FR_COLL_ALLGATHER = 3,
	FR_COLL_BROADCAST = 4,
	FR_COLL_BARRIER = 5,
	FR_COLL_REDUCE = 6,
	FR_COLL_ALLTOALL = 7,
	FR_COLL_ALLTOALLV = 8,
	FR_COLL_ALLGATHERV = 9,
	FR_COLL_REDUCE_SCATTERV = 10,
};

/* Immediate: 4-bit type, 20-bit payload; bits 20..27 are the shared
 * endpoint's (the communicator's id, transport.h), 0 here. */
#define FR_IMM_PAYLOAD_MASK 0x000fffffu
#define FR_IMM_TYPE(imm) ((imm) >> 28)
#define FR_IMM_PAYLOAD(imm) ((imm)&FR_IMM_PAYLOAD_MASK)
#define FR_IMM(type, payload) \
	(((uint32_t)(type) << 28) | ((payload)&FR_IMM_PAYLOAD_MASK))
enum fr_imm_type {
	FR_IMM_MSG = 1,	   /* payload: mailbox slot                 */
	FR_IMM_CREDIT = 2, /* payload: mailbox slots freed          */
	/* 3, 4, 5 and 8..15 are the algorithms' (struct fr_algo.imm_types);
	 * numbered here so that no two take the same */
	FR_IMM_RS = 3,	    /* ring: (segment serial << 8) | slot    */
	FR_IMM_AG = 4,	    /* ring: segment index in the collective */
	FR_IMM_RCREDIT = 5, /* ring: staging slots freed             */
	FR_IMM_PING = 6,    /* are you alive?                        */
	FR_IMM_PONG = 7,    /* yes: late level << 12 | started mod 2^12 */
	/* the engine's point-to-point (p2p.c), not an algorithm's */
	FR_IMM_P2P = 8, /* rendezvous write: payload = the receiver's id */
	/* an algorithm's zero-copy step (xfer.c): slot << 14 | segment */
	FR_IMM_ZX = 9,
};
/* The types the peer layer reads itself. */
#define FR_IMM_PEER_TYPES                                             \
	(1u << FR_IMM_MSG | 1u << FR_IMM_CREDIT | 1u << FR_IMM_PING | \
	 1u << FR_IMM_PONG)

/* A decoded mailbox message header (see peer.c for the wire layout). */
struct fr_msg {
	uint8_t type; /* enum fr_msg_type */
	uint8_t coll, algo, dtype, op;
	uint16_t step;
	uint32_t seq;
	uint64_t count;
	int32_t root;
	uint32_t credits;    /* our mailbox slots the sender has freed */
	uint64_t offset;     /* DATA: byte offset of the payload in the step */
	uint32_t len;	     /* payload bytes after the header */
	int32_t err, origin; /* ABORT */
	uint32_t aux;	     /* algorithm's own */
	uint8_t hdr;	     /* header bytes before the payload */
};

enum fr_msg_type {
	FR_MSG_DATA = 1,  /* a fragment of a step's data */
	FR_MSG_READY = 2, /* ready to receive: names the buffer */
	FR_MSG_ABORT = 3, /* the job failed (special slot, sent once) */
	FR_MSG_BYE = 4,	  /* the communicator is destroyed (special slot) */
	/* point-to-point (p2p.c): aux = tag, seq = the sender's number */
	FR_MSG_P2P = 5, /* eager data, all of it */
	FR_MSG_RTS = 6, /* ready to send count elements (rendezvous) */
	FR_MSG_CTS = 7, /* clear to send: aux = id, offset, payload = key */
	/* the sender's latest recovery state (agree.c): a special slot that
	 * each new one overwrites; aux = a checksum of the payload */
	FR_MSG_CTRL = 8,
};
#define FR_MSG_TYPE_MAX FR_MSG_CTRL /* the highest type on the wire */
#define FR_MSG_IS_P2P(t) ((t) >= FR_MSG_P2P && (t) <= FR_MSG_CTS)

/* A collective's message moved out of its mailbox slot because a
 * point-to-point message behind it was wanted (fr_msg_p2p_next). */
struct fr_stashed {
	struct fr_stashed *next;
	struct fr_msg m;
	uint8_t data[];
};

#define FR_MSG_HDR 64
/* The small messages' header, and their largest payload (peer.c). */
#define FR_MSG_COMPACT 16
#define FR_MSG_COMPACT_MAX (FR_TP_INLINE_MAX - FR_MSG_COMPACT)

enum fr_peer_state {
	FR_PEER_IDLE = 0, /* never needed */
	FR_PEER_CONNECTING,
	FR_PEER_UP,
	FR_PEER_DOWN, /* failed or closed */
};

/* What we know about one other rank. */
struct fr_peer {
	enum fr_peer_state state;
	struct fr_tp_conn *conn;
	struct fr_peer
		*next_active; /* comm->active list (connected or connecting) */
	/* sending into its mailbox */
	int credits;	   /* free data slots there for us */
	uint32_t send_seq; /* data slots used so far */
	int user_unsent;   /* fr_peer_write()s with no SEND completion yet */
	bool abort_sent, bye_sent;
	bool revoke_sent; /* our revoke notice went (fr_comm_revoke) */
	bool told_only; /* connected only to hand it our ABORT */
	/* it failed: its connection closed or failed, it never answered
	 * within the timeout, or a peer's ABORT or agreement said so
	 * (fr_peers_mark_dead); never undone */
	bool dead;
	/* its latest CTRL message's payload on each channel, and whether
	 * it is unread (fr_peers_ctrl_take) */
	uint8_t *ctrl[FR_CTRL_CHANNELS];
	uint32_t ctrl_len[FR_CTRL_CHANNELS];
	bool ctrl_new[FR_CTRL_CHANNELS];
	/* receiving from it into our mailbox */
	uint32_t recv_arrived; /* data messages landed */
	uint32_t recv_taken;   /* data messages consumed (in order) */
	int credits_owed;      /* consumed, not yet returned */
	bool have_peek;	       /* msg below is the decoded head */
	struct fr_msg peek;
	/* collectives' messages taken out of the slots, oldest first: they
	 * come before anything still in a slot */
	struct fr_stashed *stash, *stash_tail;
	uint32_t p2p_unread; /* point-to-point messages in its slots */
	bool bye;	     /* it destroyed its communicator */
	uint32_t bye_seq;    /* the collectives it had started by then */
	/* liveness (peer.c, "Slow or dead"): our last PING to it, its last
	 * PONG, and what that said: how many collectives it had started, and
	 * whether it is itself waiting for a late rank */
	uint64_t ping_ms, pong_ms;
	uint32_t pong_started;
	uint16_t pong_level; /* 0, or it waits for a late rank (peer.c) */
	bool pong_owed;
	/* the registrations' keys traded with it (peer.c), made on first
	 * use (fr_peer_key_offer / fr_peer_key_learn): 3.5 KiB a peer that most
	 * peers of a large job never need, as only the ring's neighbours trade
	 * keys */
	struct fr_peer_keys *keys;
};

/* The peer layer's state in the communicator (comm->peer). */
struct fr_peer_layer {
	/*
	 * peers[rank]; peers[rank == ours] is unused.  Zeroed pages that a
	 * peer's entry takes only once it is written (fr_peers_alloc): a
	 * rank of a large job writes to few of its peers, and a full table
	 * in every rank is O(n^2) (256 bytes a peer: 17 GB for 8,192 ranks
	 * simulated on one host).  Nothing is kept in an entry that every
	 * peer needs: its rank is its index (fr_peer_rank), its mailbox key
	 * is in mbx_rkeys.
	 */
	struct fr_peer *peers;
	size_t peers_len; /* bytes mapped */
	/* every peer's mailbox key, from its card */
	struct fr_tp_rkey *mbx_rkeys;
	struct fr_peer *active; /* peers connected or connecting */
	/*
	 * Mailbox: peer p writes into slots [p][0 .. mbx_slots + 1]; the
	 * last two are for its ABORT and BYE.  Outbox: where messages are
	 * assembled before the write.
	 */
	int mbx_slots;	      /* data slots per peer */
	size_t mbx_slot_size; /* header + eager payload */
	size_t ctrl_size;     /* a CTRL slot: header + recovery's state */
	uint8_t *mbx;
	size_t mbx_len; /* mapped bytes (a multiple of the page) */
	struct fr_mem *mbx_mem;
	int out_slots;
	uint8_t *out;
	size_t out_len;
	struct fr_mem *out_mem;
	uint64_t out_busy; /* bitmap: outbox slots awaiting completion */
	uint32_t out_next;
	bool ll; /* small messages by the transport's write_inline (FR_LL) */
	uint32_t unread;      /* data messages landed, not yet consumed */
	uint32_t p2p_unread;  /* ... of them point-to-point ones */
	int ctrl_new;	      /* unread CTRL messages (all channels) */
	int ndead;	      /* peers found dead */
	int outstanding;      /* our writes without a SEND completion */
	int user_outstanding; /* ... of them, writes from user buffers */
	/* liveness ("Slow or dead" in peer.c) */
	int timeout_ms;
	long slow_timeout_ms; /* patience with a peer that is alive but late */
	/* what we wait on is alive but late: 0 no, 1 it has not entered our
	 * collective, k it waits on a rank at level k - 1 (PONGs carry it) */
	uint16_t late_level;
	uint64_t last_activity_ms; /* last completion seen, for timeouts */
	/* collectives as the peers see them: how many started (PONGs and
	 * ABORTs carry it), and whether the last one still runs */
	uint32_t seq;
	bool in_coll;
};

/* A peer's rank: its index in the table. */
static inline int fr_peer_rank(const struct fr_peer_layer *l,
			       const struct fr_peer *p)
{
	return (int)(p - l->peers);
}

/* The communicator's failure (comm->fail), written by fr_comm_fail() and
 * the ABORTs that arrive. */
struct fr_fail {
	int failed;	 /* 0 or the error that failed the communicator */
	int fail_origin; /* the rank that failed first, -1: this one */
	int dead_first;	 /* the first peer found dead here, or -1 */
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
	bool told_all;	   /* fr_peers_tell_all has run */
	/* revoked (fr_comm_revoke), here or by revoke_origin: its notice
	 * goes to every peer once more, whatever failed before */
	bool revoked;
	int revoke_origin;
	char fail_text[FR_ERRMSG_MAX];
};

/* Fail the communicator (the first error wins; later calls return it):
 * record err and the message, and send ABORT to every connected peer. */
int fr_comm_fail(struct fr_comm *comm, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* The peers of comm->nranks and the mailbox (fr_peers_mailbox with
 * nranks rows, populated); fr_peers_fini undoes either or both. */
int fr_peers_init(struct fr_comm *comm);
/* The peers' state only (comm->nranks of them), where the mailbox came
 * first (a split's, made before its group is known). */
int fr_peers_alloc(struct fr_comm *comm);
/* The peers' table and mailbox keys, as fr_peers_alloc made them. */
void fr_peers_free(struct fr_comm *comm);
/* The mailbox, registered, with a row for each of up to rows senders, and
 * the outbox; populate: their pages faulted in now, not on first use. */
int fr_peers_mailbox(struct fr_comm *comm, int rows, bool populate);
void fr_peers_fini(struct fr_comm *comm);
/* Connect (or accept) rank on first use: 0 once connected, FR_EAGAIN while
 * connecting, or the error that failed the communicator.  A collective's
 * step (fr_peer_need) also gets 0 for a rank that destroyed its
 * communicator after it had started the running collective (what it sent
 * is read, writes to it wait: fr_peers_check_gone decides); point-to-point
 * (fr_peer_need_p2p) fails for it. */
int fr_peer_need(struct fr_comm *comm, int rank);
int fr_peer_need_p2p(struct fr_comm *comm, int rank);
/* Advance connections, return credits owed. */
int fr_peers_progress(struct fr_comm *comm, bool *did_work);
/* A completion from the transport: 0 or the error that failed the
 * communicator, or FR_PEERS_FOR_ALGO with the sender in *from for an
 * immediate type the peer layer does not read (an algorithm's). */
#define FR_PEERS_FOR_ALGO 1
int fr_peers_on_cqe(struct fr_comm *comm, const struct fr_tp_cqe *cqe,
		    int *from);

/* A collective starts (its number in *seq; 0, or the error of an ABORT
 * that was waiting for it) and ends (completed or failed). */
int fr_peers_coll_begin(struct fr_comm *comm, uint32_t *seq);
void fr_peers_coll_end(struct fr_comm *comm);
/* The timeout, and patience with a rank that is alive but late, for the
 * first pending collective req (NULL: none), which waits on rank peer
 * (-1: unknown): 0, or FR_ETIMEDOUT having failed the communicator. */
int fr_peers_watch(struct fr_comm *comm, const struct fr_request *req,
		   int peer);
/* The active collective req waits on rank peer, which has destroyed its
 * communicator and left nothing unread: FR_EPEER (failed), else 0. */
int fr_peers_check_gone(struct fr_comm *comm, const struct fr_request *req,
			int peer);

/* The 64-byte wire header (layout in peer.c); decode takes it or the
 * 16-byte one of a small message (m->hdr says which) and checks the magic,
 * the type and len <= maxlen. */
void fr_msg_encode(const struct fr_msg *m, uint8_t *b);
int fr_msg_decode(const uint8_t *b, size_t maxlen, struct fr_msg *m);
/* A small message: m's 16-byte header and len bytes of payload at b, or
 * false (nothing written) when m or len does not fit that header. */
bool fr_msg_encode_compact(const struct fr_msg *m, const void *payload,
			   size_t len, uint8_t *b);

/* Largest payload of one message. */
size_t fr_msg_payload_max(const struct fr_comm *comm);
/* Send m (type, coll, seq, ... filled by the caller) with payload; FR_EAGAIN
 * when the peer has no free slot or our outbox is full. */
int fr_msg_send(struct fr_comm *comm, int rank, struct fr_msg *m,
		const void *payload, size_t len);
/* Fill the header of a message for req. */
void fr_msg_for(const struct fr_request *req, uint8_t type, struct fr_msg *m);
/*
 * The oldest unconsumed message from rank, if it belongs to req: 0 and
 * *m / *payload set; FR_EAGAIN if there is none yet or it belongs to a later
 * collective; FR_EMISMATCH/FR_EPROTO (the communicator failed) if the peer
 * called something else.
 */
int fr_msg_get(struct fr_comm *comm, const struct fr_request *req, int rank,
	       const struct fr_msg **m, const uint8_t **payload);
void fr_msg_consume(struct fr_comm *comm, int rank);
/*
 * Point-to-point messages (FR_MSG_IS_P2P) are not a collective's: the next
 * one from rank, 0 with *m and *payload, or FR_EAGAIN.  Collectives'
 * messages ahead of it move to the peer's stash, where fr_msg_get finds
 * them first, so that both kinds flow whatever order the application
 * calls them in.  fr_msg_p2p_consume() frees its slot.
 */
int fr_msg_p2p_next(struct fr_comm *comm, int rank, const struct fr_msg **m,
		    const uint8_t **payload);
void fr_msg_p2p_consume(struct fr_comm *comm, int rank);
/*
 * The engine waits for a point-to-point message or write from peer: PING it
 * now and then; fail the communicator (FR_ETIMEDOUT) once it has answered
 * nothing for the timeout.  A peer that answers may take as long as it
 * likes to send.
 */
int fr_peers_watch_p2p(struct fr_comm *comm, int peer);
/* A collective is done: a message for it from any peer that is still
 * unconsumed means the ranks disagree on its schedule (roots, counts), and
 * fails the communicator with FR_EMISMATCH; else 0. */
int fr_msg_leftover(struct fr_comm *comm, const struct fr_request *req);

/* A write from a registered buffer into a peer's; user marks writes whose
 * source is the caller's memory (a collective is not done before they
 * complete). */
int fr_peer_write(struct fr_comm *comm, int rank, struct fr_mem *lmem,
		  size_t loff, const struct fr_tp_rkey *rkey, uint64_t roff,
		  size_t len, uint32_t imm, bool user);
/* The user writes to rank that the transport has not yet handed on (no
 * SEND completion): what is queued behind a write posted now. */
int fr_peer_unsent(const struct fr_comm *comm, int rank);

/*
 * Lines (transport.h, line_put): a collective that goes whole in one
 * message per peer (algo/ll.c).  fr_peer_line_bytes: the largest, 0 where
 * the transport has none (then neither call may be used).
 * fr_peer_line_put: seq's bytes to rank (connecting on first use): 0,
 * FR_EAGAIN (connecting), or the error that failed the communicator.
 * fr_peer_line_get: rank's line seq into buf (at most len bytes): the
 * count the peer put, 0 while it has not, or the error that failed the
 * communicator.  The caller keeps the order the transport asks for.
 */
size_t fr_peer_line_bytes(const struct fr_comm *comm);
int fr_peer_line_put(struct fr_comm *comm, int rank, uint64_t seq,
		     const void *buf, size_t len);
int fr_peer_line_get(struct fr_comm *comm, int rank, uint64_t seq, void *buf,
		     size_t len);

/* Best-effort ABORT to every connected peer. */
void fr_peers_send_abort(struct fr_comm *comm, int err, int origin);
/* A failed rank's ABORT to every rank, connecting as needed (bounded). */
void fr_peers_tell_all(struct fr_comm *comm);
/*
 * The registrations' keys traded with a peer, in the READY messages that
 * name where a peer writes (the ring's all-gather, the zero-copy steps):
 * each key goes to a peer once, and each of its keys is unpacked once,
 * held by registration id (direct-mapped, FR_RKEY_CACHE of them).
 *
 * fr_peer_key_offer: rank needs mem's key unless it was sent it before:
 * 1 and the key packed into key (*keylen: its room in, the key's length
 * out), to go in the READY (fr_peer_key_sent once the READY went); 0 (rank
 * has it); or the error (FR_ENOMEM, the packing's).
 * fr_peer_key_learn: rank's registration id, with its key (keylen bytes)
 * where key is not NULL: keeps the key, and where out is not NULL points
 * it at the one held for id.  0, FR_ENOMEM, FR_EINVAL (id 0, or a key
 * that does not unpack: a malformed READY) or FR_EPROTO (no key ever came
 * for id).
 */
int fr_peer_key_offer(struct fr_comm *comm, int rank, const struct fr_mem *mem,
		      void *key, size_t *keylen);
void fr_peer_key_sent(struct fr_comm *comm, int rank, const struct fr_mem *mem);
int fr_peer_key_learn(struct fr_comm *comm, int rank, uint32_t id,
		      const void *key, size_t keylen,
		      const struct fr_tp_rkey **out);

/* BYE to every connected peer, wait (bounded) for theirs: true if all came
 * (nothing more can come from them). */
bool fr_peers_goodbye(struct fr_comm *comm);
/* The same in steps, for ranks of one process driven in turn
 * (fr_comm_destroy_local): one pass sends what it can and takes what came;
 * 1 once done (*clean: as fr_peers_goodbye's result), 0 for more passes
 * (*idle: this one found nothing), negative if the endpoint failed.  The
 * bound a goodbye waits for is fr_peers_goodbye_ms. */
int fr_peers_goodbye_step(struct fr_comm *comm, bool *clean, bool *idle);
uint64_t fr_peers_goodbye_ms(const struct fr_comm *comm);
/* A failed communicator whose sends still read the application's buffers:
 * let them finish for a moment, then cut every connection (see peer.c). */
void fr_peers_quiesce(struct fr_comm *comm);

/*
 * Failure knowledge and recovery's messages (for agree.c).  A peer is
 * dead on evidence only: its connection closed or failed, it answered no
 * PING for the timeout, or another rank's ABORT or agreement named it; a
 * connection that fr_peers_quiesce cut is no evidence (fr_peers_reach
 * opens a new one).  Marking a peer dead does not fail the communicator.
 */
void fr_peers_mark_dead(struct fr_comm *comm, int rank);
/* Connect to rank on a communicator failed or not: 0 once connected,
 * FR_EAGAIN while connecting, FR_EPEER if it is dead (found so now). */
int fr_peers_reach(struct fr_comm *comm, int rank);
/* Our state (len bytes, at most fr_msg_payload_max) into rank's CTRL slot
 * of channel ch, overwriting the previous one: 0, FR_EAGAIN (not connected
 * yet, or no outbox slot free), or FR_EPEER (dead). */
int fr_peers_ctrl_send(struct fr_comm *comm, int rank, int ch,
		       const void *payload, size_t len);
/* rank's latest CTRL payload on channel ch if it is new since the last
 * call: true and *payload, *len (valid until the next poll); else false. */
bool fr_peers_ctrl_take(struct fr_comm *comm, int rank, int ch,
			const uint8_t **payload, size_t *len);
/* PING rank if one is due; whether it answered one within three ping
 * intervals (alive), whatever the communicator's state. */
bool fr_peers_probe(struct fr_comm *comm, int rank);
/* A failed communicator's round for recovery: accept the peers that
 * connect to us, advance connections coming up, send owed PONGs. */
void fr_peers_recovery_progress(struct fr_comm *comm, bool *did_work);

/* Mailbox card: our mailbox's key, for the rendezvous. */
int fr_peers_pack_card_key(struct fr_comm *comm, void *blob, size_t *len);

#endif
