/* SPDX-License-Identifier: MIT */
/*
 * shm.h - the shared-memory transport's own declarations: constants, the
 * segment and ring layout (fr_shm.c says what each field means on the
 * wire), the connection and the transport, and what its files call of
 * each other.  They call downward only:
 *
 *   fr_shm.c    the design and the wire format; the interface (open,
 *               connect, write, wait) and the progress pass, which calls
 *   shm_conn.c  everything about a connection but its data: listening,
 *               the hello that hands over the segment, the reply, the pull
 *               probe, retries, deadlines, the sockets' events, going down
 *   shm_data.c  the data path: pushing queued writes into the ring, taking
 *               them out (copies, and pulls by cross-memory attach),
 *               retiring sends, whether anything is ready
 *
 * All sit on the shared transport base (../common/tp_base.h) and nothing
 * else of the library but its utilities and logging.
 */
#ifndef FR_SHM_H
#define FR_SHM_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/un.h>

#include "../common/tp_base.h"
#include "transport.h"

#define SHM_MAGIC 0x4d485346u /* "FSHM" */
/* 2: PULL slots replaced writes placed by the writer; 3: the consumer
 * polls the slot's own sequence number instead of the ring's tail; 4:
 * seq first in the slot, INLINE slots (write_inline); 5: lines */
#define SHM_VERSION 5
#define SHM_KIND_HELLO 1
#define SHM_KIND_REPLY 2
#define SHM_HELLO_LEN 24
#define SHM_REPLY_LEN 12

#define SHM_SLOTS 64u
#define SHM_SLOT_BYTES 8192u
#define SHM_SLOT_HDR 64u
#define SHM_SLOT_DATA (SHM_SLOT_BYTES - SHM_SLOT_HDR)
#define SHM_SLOT_INLINE 32u /* bytes an INLINE slot carries */
#define SLOT_FIRST 1u
#define SLOT_LAST 2u
#define SLOT_PULL 4u   /* no payload: the receiver reads it from src */
#define SLOT_INLINE 8u /* the whole write in inl, in the line seq is in */
#define SLOT_FLAGS (SLOT_FIRST | SLOT_LAST | SLOT_PULL | SLOT_INLINE)
#define SLOT_INL_SHIFT 16 /* an INLINE slot's bytes: flags >> 16 */

#define SHM_NAME_LEN 48
#define SHM_ADDR_MAGIC 0xfd
#define SHM_ADDR_LEN (16 + SHM_NAME_LEN)
#define SHM_RKEY_MAGIC 0xfe
#define SHM_RKEY_LEN 28

#define SHM_MAX_SQ_DEPTH 65536
#define SHM_CMA_DEFAULT (4u << 20)
/* Bytes the receiver pulls per cross-memory attach call and per pass of
 * its progress (at most one pulled write per pass, too), so that one huge
 * write does not hold up the other connections for long. */
#define SHM_CMA_CHUNK (4u << 20)
#define SHM_BACKOFF_MIN_MS 5
#define SHM_BACKOFF_MAX_MS 500

struct shm_slot {
	/* Written last (release): the slot's index in the ring plus one,
	 * once the rest is in place.  The consumer polls this word, in the
	 * line it reads next anyway, instead of a tail in a line of its own:
	 * one cache miss between cores per message instead of two in a
	 * row, and for an INLINE slot the only one. */
	_Atomic uint64_t seq;
	uint32_t imm, flags, region, gen;
	uint64_t off;
	union {
		struct {
			uint32_t len, total;
			uint64_t src; /* PULL: the source, in the writer's
				       * address space */
		};
		uint8_t inl[SHM_SLOT_INLINE]; /* INLINE: the bytes */
	};
	uint8_t data[SHM_SLOT_DATA];
};

struct shm_ring {
	_Alignas(64) _Atomic uint64_t head; /* written by the consumer */
	/* Producer, rarely: where this ring is mapped in its process (read
	 * back by the consumer's probe), and "closed": it has given up on
	 * the connection, its sources may be gone (shm_pull()). */
	_Alignas(64) _Atomic uint64_t self;
	_Atomic uint32_t closed;
	/* Consumer: its probe succeeded, it pulls large writes. */
	_Alignas(64) _Atomic uint32_t pull_ok;
	_Alignas(64) struct shm_slot slot[SHM_SLOTS];
};

/* A line (transport.h, line_put): the bytes and len, then seq (release),
 * which the reader polls; a short line's bytes share seq's cache line. */
struct shm_line {
	_Alignas(64) _Atomic uint64_t seq;
	uint32_t len, pad;
	uint8_t data[FR_TP_LINE_MAX];
};

/* ring[s] carries side s's writes to side 1 - s (0 = connector), line[s]
 * its lines (by the parity of their numbers). */
struct shm_seg {
	_Alignas(64) _Atomic uint32_t sleeping0;
	_Alignas(64) _Atomic uint32_t sleeping1;
	_Alignas(64) struct shm_line line[2][2];
	_Alignas(64) struct shm_ring ring[2];
};

_Static_assert(sizeof(struct shm_slot) == SHM_SLOT_BYTES, "slot layout");
_Static_assert(sizeof(struct shm_line) == 256, "line layout");
_Static_assert(offsetof(struct shm_slot, data) == SHM_SLOT_HDR, "slot header");
_Static_assert(SHM_SLOT_INLINE >= FR_TP_INLINE_MAX, "write_inline fits");
/* what shm_rx copies before judging it (seq is read on its own): the
 * header after seq */
#define SHM_SLOT_FIELDS_AT offsetof(struct shm_slot, imm)
#define SHM_SLOT_FIELDS (SHM_SLOT_HDR - SHM_SLOT_FIELDS_AT)

/* A registered region is the base's (struct fr_tpb_mr, tp_base.h): its
 * slot in the region table is its remote key. */

/* A queued write: points at the caller's memory, never copies it early. */
struct shm_sqe {
	struct fr_tpb_sqe b;	/* its region and ctx */
	size_t loff, len, done; /* done: bytes in the ring (or to be pulled) */
	uint64_t roff;
	uint32_t rid, rgen, imm;
	uint64_t seq; /* pushed: its last slot's index in the ring */
	bool pull; /* went as a PULL slot: retired when the peer is past seq */
};

enum shm_state {
	/* outgoing: nobody listening yet, trying again later */
	SHM_RETRY = FR_TPB_RETRY,
	/* established */
	SHM_UP = FR_TPB_UP,
	/* socket closed; error completions may be owed */
	SHM_FAILED = FR_TPB_FAILED,
	/* outgoing: hello sent, awaiting the reply */
	SHM_HELLO = FR_TPB_SETUP,
	/* incoming: awaiting the hello */
	SHM_GREET,
};

struct fr_tp_conn {
	struct fr_tpb_conn b; /* endpoint, list, peer, state, failure,
			       * establishment deadlines */
	int fd;
	int side; /* 0 connector, 1 acceptor */
	pid_t peer_pid;
	bool cma;     /* FR_SHM_CMA_BYTES allows cross-memory attach here */
	bool pull_tx; /* the peer pulls our large writes (it set pull_ok) */
	bool pull_rx; /* we pull the peer's (our probe succeeded) */
	struct sockaddr_un sa;
	socklen_t salen;

	struct shm_seg *seg;
	size_t seg_len;
	struct shm_ring *tx, *rx;
	_Atomic uint32_t *my_sleep, *peer_sleep;
	struct shm_line *line_tx, *line_rx; /* [2], by parity */
	/* the number the next line_get waits for (shm_ready looks for it),
	 * and the last one shm_ready reported (once is enough) */
	uint64_t line_want, line_told;
	uint64_t tx_tail, rx_head;
	uint64_t tx_head; /* the consumer's head as we last read it */
	size_t rx_pulled; /* bytes of the PULL slot at rx_head read so far */

	/*
	 * The send queue is b.sq, of struct shm_sqe: the first sq_push of its
	 * entries are entirely in the ring but not retired yet (a pull still
	 * reading the source, or no room for the completion), the others
	 * wait for room in the ring (the first of them may be in part).
	 */
	unsigned int sq_push;
};

/* The base (rank, connections, regions, listener, wake eventfd, epoll
 * set, error text), the listener's name and the completions. */
struct fr_tp {
	struct fr_tpb b;
	uint64_t node;
	size_t cma_bytes;
	char name[SHM_NAME_LEN];
	uint64_t events_ms; /* fr_coarse_ms() of the last look at the sockets */
	struct fr_cqring cq;
};

FR_TPB_FIRST(fr_tp);
FR_TPB_FIRST(fr_tp_conn);
FR_TPB_FIRST(shm_sqe);

/* shm_conn.c */
void shm_name_addr(const char *name, struct sockaddr_un *sa, socklen_t *len);
struct fr_tp_conn *shm_conn_new(struct fr_tp *tp);
void shm_conn_down(struct fr_tp_conn *c);
void shm_conn_free(struct fr_tp_conn *c);
int shm_start_connect(struct fr_tp_conn *c, uint64_t now);
void shm_events(struct fr_tp *tp);
void shm_timers(struct fr_tp *tp);

/* shm_data.c */
void shm_tx(struct fr_tp_conn *c);
int shm_write_inline(struct fr_tp_conn *c, const void *buf,
		     const struct fr_tp_rkey *rkey, uint64_t roff, size_t len,
		     uint32_t imm);
int shm_line_put(struct fr_tp_conn *c, uint64_t seq, const void *buf,
		 size_t len);
int shm_line_get(struct fr_tp_conn *c, uint64_t seq, void *buf, size_t len);
void shm_rx(struct fr_tp_conn *c);
bool shm_ready(struct fr_tp_conn *c);

#endif /* FR_SHM_H */
