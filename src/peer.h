/* SPDX-License-Identifier: MIT */
/*
 * peer.h - peers connected on first use, and the mailbox message layer.
 *
 * Every algorithm talks to other ranks through two things only:
 *   - messages (fr_msg_send / fr_msg_peek / fr_msg_consume): a header plus
 *     up to fr_msg_payload_max() bytes, written in one write-with-immediate
 *     into a slot of the receiver's mailbox (the eager protocol: no
 *     ready-to-receive round trip).  Slots are per sender, so flow control
 *     is per peer: a credit per slot, returned on later messages or, when
 *     half the slots are owed, by a zero-length write.  Messages from one
 *     peer are consumed in the order they were sent; a message for a
 *     collective this rank has not reached yet stays in its slot until then.
 *   - one-sided writes into a peer's registered memory (fr_peer_write), for
 *     zero-copy algorithms that exchanged remote keys (the ring).
 */
#ifndef FR_PEER_H
#define FR_PEER_H

#include "internal.h"

/* Immediate: 4-bit type, 28-bit payload. */
#define FR_IMM_TYPE(imm) ((imm) >> 28)
#define FR_IMM_PAYLOAD(imm) ((imm)&0x0fffffffu)
#define FR_IMM(type, payload) \
	(((uint32_t)(type) << 28) | ((payload)&0x0fffffffu))
enum fr_imm_type {
	FR_IMM_MSG = 1,	    /* payload: mailbox slot                 */
	FR_IMM_CREDIT = 2,  /* payload: mailbox slots freed          */
	FR_IMM_RS = 3,	    /* ring: (segment serial << 8) | slot    */
	FR_IMM_AG = 4,	    /* ring: segment index in the collective */
	FR_IMM_RCREDIT = 5, /* ring: staging slots freed             */
	FR_IMM_PING = 6,    /* are you alive?                        */
	FR_IMM_PONG = 7,    /* yes: late flag << 27 | collectives started */
};

int fr_peers_init(struct fr_comm *comm);
void fr_peers_fini(struct fr_comm *comm);
/* Connect (or accept) rank on first use: 0 once connected, FR_EAGAIN while
 * connecting, or the error that failed the communicator. */
int fr_peer_need(struct fr_comm *comm, int rank);
/* Advance connections, return credits owed. */
int fr_peers_progress(struct fr_comm *comm, bool *did_work);
/* A completion from the transport. */
int fr_peers_on_cqe(struct fr_comm *comm, const struct fr_tp_cqe *cqe);

/* The 64-byte wire header (layout in peer.c); decode checks the magic, the
 * type and len <= maxlen. */
void fr_msg_encode(const struct fr_msg *m, uint8_t *b);
int fr_msg_decode(const uint8_t *b, size_t maxlen, struct fr_msg *m);

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

/* A write from a registered buffer into a peer's; user marks writes whose
 * source is the caller's memory (a collective is not done before they
 * complete). */
int fr_peer_write(struct fr_comm *comm, int rank, struct fr_mem *lmem,
		  size_t loff, const struct fr_tp_rkey *rkey, uint64_t roff,
		  size_t len, uint32_t imm, bool user);

/* Best-effort ABORT to every connected peer. */
void fr_peers_send_abort(struct fr_comm *comm, int err, int origin);
/* Liveness: a completion that only says a peer is alive (a PING, a PONG,
 * the send of one) is no progress of a collective. */
bool fr_peers_cqe_is_liveness(const struct fr_tp_cqe *cqe);
/* PING the peer we wait on now and then; afterwards, what its PONGs say:
 * 1 alive but late (not in our collective, or itself waiting for a late
 * rank), 0 alive and in it, -1 no fresh answer. */
int fr_peer_liveness(struct fr_comm *comm, int rank, uint32_t seq,
		     uint64_t idle_ms);
void fr_peers_announce_late(struct fr_comm *comm);
/* A failed rank's ABORT to every rank, connecting as needed (bounded). */
void fr_peers_tell_all(struct fr_comm *comm);
/* BYE to every connected peer, wait (bounded) for theirs, close. */
void fr_peers_goodbye(struct fr_comm *comm);
/* A failed communicator whose sends still read the application's buffers:
 * let them finish for a moment, then cut every connection (see peer.c). */
void fr_peers_quiesce(struct fr_comm *comm);

/* Mailbox card: our mailbox's key, for the rendezvous. */
int fr_peers_pack_card_key(struct fr_comm *comm, void *blob, size_t *len);

/* The ring's completion handler (algo/ring.c), called for its imm types. */
int fr_ring_on_cqe(struct fr_comm *comm, int peer, const struct fr_tp_cqe *cqe);
void fr_ring_comm_free(struct fr_comm *comm);

#endif
