/* SPDX-License-Identifier: MIT */
/*
 * ring.h - the pipelined ring All-Reduce: schedule arithmetic (pure, unit
 * tested) and the protocol engine driven by request.c.
 */
#ifndef FR_RING_H
#define FR_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* Element range of chunk c when count elements are split over n ranks:
 * the first count % n chunks get one element more. */
static inline void fr_ring_chunk(size_t count, int n, int c, size_t *off,
				 size_t *cnt)
{
	size_t base = count / (size_t)n, rem = count % (size_t)n;
	size_t uc = (size_t)c;

	*cnt = base + (uc < rem ? 1 : 0);
	*off = uc * base + (uc < rem ? uc : rem);
}

static inline int fr_ring_mod(long a, int n)
{
	long m = a % n;

	return (int)(m < 0 ? m + n : m);
}

/* Chunks handled at step k (0 <= k < n-1) by rank r. */
static inline int fr_ring_rs_send_chunk(int r, int k, int n)
{
	return fr_ring_mod((long)r - k, n);
}
static inline int fr_ring_rs_recv_chunk(int r, int k, int n)
{
	return fr_ring_mod((long)r - k - 1, n);
}
static inline int fr_ring_ag_send_chunk(int r, int k, int n)
{
	return fr_ring_mod((long)r + 1 - k, n);
}
static inline int fr_ring_ag_recv_chunk(int r, int k, int n)
{
	return fr_ring_mod((long)r - k, n);
}
/* The chunk rank r owns (reduces last) and sends first in the all-gather. */
static inline int fr_ring_owned_chunk(int r, int n)
{
	return fr_ring_mod((long)r + 1, n);
}

/* Segments of a chunk of cnt elements with seg_elems per segment. */
static inline size_t fr_ring_nsegs(size_t cnt, size_t seg_elems)
{
	return (cnt + seg_elems - 1) / seg_elems;
}

/* Immediate encoding: 4-bit type, 28-bit payload. */
#define FR_IMM_TYPE(imm) ((imm) >> 28)
#define FR_IMM_PAYLOAD(imm) ((imm)&0x0fffffffu)
#define FR_IMM(type, payload) (((uint32_t)(type) << 28) | ((payload)&0x0fffffffu))
enum fr_imm_type {
	FR_IMM_CTRL = 1,   /* payload: control inbox slot            */
	FR_IMM_CREDIT = 2, /* payload: staging slots freed           */
	FR_IMM_RS = 3,     /* payload: (segment serial << 8) | slot  */
	FR_IMM_AG = 4,     /* payload: segment index in collective   */
};

/* Control messages (FR_CTRL_MSG_SIZE bytes, little-endian). */
enum fr_ctrl_type { FR_CTRL_READY = 1, FR_CTRL_ABORT = 2, FR_CTRL_BYE = 3 };
#define FR_CTRL_MAGIC 0x31435246u /* "FRC1" */

struct fr_ctrl {
	uint16_t type;
	uint16_t has_key;
	uint32_t seq;
	int32_t err;       /* ABORT */
	int32_t origin;    /* ABORT: the rank that failed first */
	uint64_t count;    /* READY */
	uint8_t dtype, op; /* READY */
	uint8_t keylen;
	uint8_t credits;   /* READY to prev: staging slots freed */
	uint32_t mem_id;   /* READY: our receive buffer's registration */
	uint64_t dest_off; /* READY: its offset in the registration */
	uint8_t key[FR_TP_RKEY_MAX];
};

void fr_ctrl_encode(const struct fr_ctrl *m, uint8_t *buf);
int fr_ctrl_decode(const uint8_t *buf, struct fr_ctrl *m);

/* The engine (ring.c). */
int fr_ring_start(struct fr_comm *comm, struct fr_request *req);
int fr_ring_advance(struct fr_comm *comm, struct fr_request *req,
		    bool *did_work);
bool fr_ring_done(const struct fr_request *req);
void fr_ring_free(struct fr_request *req);
int fr_ring_on_cqe(struct fr_comm *comm, const struct fr_tp_cqe *cqe);
/* The neighbour an active collective waits on, for timeout messages. */
const char *fr_ring_waiting_on(const struct fr_comm *comm,
			       const struct fr_request *req, int *peer);
/* Best-effort ABORT to both neighbours. */
void fr_ring_send_abort(struct fr_comm *comm, int err, int origin);
/* BYE to one neighbour (fr_comm_destroy); FR_EAGAIN to retry. */
int fr_ring_send_bye(struct fr_comm *comm, bool to_next);
/* Handle a completion while saying goodbye (see fr_comm_destroy). */
void fr_ring_goodbye_cqe(struct fr_comm *comm, const struct fr_tp_cqe *cqe);
/* Return staging credits owed to the previous rank. */
int fr_ring_flush_credits(struct fr_comm *comm, bool *did_work);

#endif
