/* SPDX-License-Identifier: MIT */
/*
 * ring.h - the pipelined ring's schedule arithmetic (pure, unit tested).
 */
#ifndef FR_RING_H
#define FR_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>


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

#endif
