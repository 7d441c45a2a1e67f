/* SPDX-License-Identifier: MIT */
/*
 * tp_cqring.h - the ring of completions a transport keeps for poll().
 *
 * Transports produce completions while they make progress (a socket read,
 * a drained CQ) and hand them out in poll(); this fixed ring holds them in
 * between, without a malloc per message.  The producer checks for room
 * first and stops producing while the ring is full.
 */
#ifndef FR_TP_CQRING_H
#define FR_TP_CQRING_H

#include "transport.h"

#define FR_CQRING_SIZE 4096

struct fr_cqring {
	struct fr_tp_cqe e[FR_CQRING_SIZE];
	unsigned int head, count;
};

static inline unsigned int fr_cqring_room(const struct fr_cqring *r)
{
	return FR_CQRING_SIZE - r->count;
}

static inline int fr_cqring_full(const struct fr_cqring *r)
{
	return r->count == FR_CQRING_SIZE;
}

/* The caller has checked that there is room. */
static inline void fr_cqring_push(struct fr_cqring *r, int kind, int status,
				  struct fr_tp_conn *c, uint64_t ctx,
				  uint32_t imm, uint32_t len)
{
	struct fr_tp_cqe *e = &r->e[(r->head + r->count) % FR_CQRING_SIZE];

	e->kind = kind;
	e->status = status;
	e->conn = c;
	e->ctx = ctx;
	e->imm = imm;
	e->len = len;
	r->count++;
}

/* Move up to max completions to out; how many. */
static inline int fr_cqring_pop(struct fr_cqring *r, struct fr_tp_cqe *out,
				int max)
{
	int n = 0;

	while (n < max && r->count) {
		out[n++] = r->e[r->head];
		r->head = (r->head + 1) % FR_CQRING_SIZE;
		r->count--;
	}
	return n;
}

/* Drop the completions naming c: it is being freed. */
static inline void fr_cqring_purge(struct fr_cqring *r,
				   const struct fr_tp_conn *c)
{
	unsigned int i, j = 0;

	for (i = 0; i < r->count; i++) {
		struct fr_tp_cqe *e = &r->e[(r->head + i) % FR_CQRING_SIZE];

		if (e->conn == c)
			continue;
		r->e[(r->head + j) % FR_CQRING_SIZE] = *e;
		j++;
	}
	r->count = j;
}

#endif
