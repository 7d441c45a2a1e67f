/* SPDX-License-Identifier: MIT */
/*
 * mem.h - registered memory: user registrations, the registration cache,
 * remote keys and the communicator's scratch buffer.
 *
 * Layer: memory.  Calls the transport (reg_mem, dereg_mem, pack_rkey,
 * unpack_rkey, fr_share_adopt) and the base (errors.c, log, util); called
 * by the peers, the algorithms and the entry points.  Owns struct
 * fr_mem_layer.
 */
#ifndef FR_MEM_H
#define FR_MEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "transport.h"

struct fr_comm;

/* A registration: user-owned (fr_mem_register) or cached. */
struct fr_mem {
	struct fr_comm *comm;
	struct fr_tp_mr *tp_mr;
	uintptr_t base; /* registered range [base, base + len) */
	size_t len;
	uint32_t id; /* unique in the communicator, never reused */
	int access;
	int refs;  /* collectives in flight using it */
	bool user; /* from fr_mem_register, else cache-owned */
	uint64_t last_use;
	struct fr_mem *next; /* in comm->user_mems or comm->cache */
};

/* The memory layer's state in the communicator (comm->mem). */
struct fr_mem_layer {
	struct fr_mem *user_mems; /* fr_mem_register's, newest first */
	struct fr_mem *cache;	  /* cached ranges, newest first */
	int cache_entries;
	int regcache_max; /* FR_REGCACHE */
	uint32_t next_mem_id;
	uint64_t clock; /* acquisitions so far: the cache's LRU order */
	/* a scratch buffer registered once, grown on demand */
	void *scratch;
	size_t scratch_len;
	struct fr_mem *scratch_mem;
};

int fr_mem_acquire(struct fr_comm *comm, const void *buf, size_t len,
		   int access, struct fr_mem **mem);
void fr_mem_release(struct fr_mem *mem);
int fr_mem_register_internal(struct fr_comm *comm, void *buf, size_t len,
			     int access, bool user, struct fr_mem **mem);
/* 0, or not when the transport keeps the region registered (a closing
 * shared view's quarantine, or queued writes that still read it): its
 * memory must then stay allocated, since a late write may land in it. */
int fr_mem_free_internal(struct fr_mem *mem);
/* Deregister mem and release buf, the len bytes it covers, by release; or,
 * where the transport keeps the region registered, hand buf to the
 * endpoint, which releases it when it closes. */
void fr_mem_free_buf(struct fr_mem *mem, void *buf, size_t len,
		     void (*release)(void *buf, size_t len));
/* Leave mem registered and buf allocated until the endpoint closes (peers
 * may already write into it), and forget them. */
void fr_mem_keep(struct fr_mem *mem, void *buf, size_t len,
		 void (*release)(void *buf, size_t len));
/* release functions for the two: free() and munmap() */
void fr_release_heap(void *buf, size_t len);
void fr_release_pages(void *buf, size_t len);
void fr_mem_cache_drop_idle(struct fr_comm *comm);
void fr_mem_cache_flush(struct fr_comm *comm);
/* fr_mem_register() / fr_mem_deregister() with the lock held. */
int fr_mem_user_register(struct fr_comm *comm, void *buf, size_t len,
			 struct fr_mem **mem);
int fr_mem_user_deregister(struct fr_mem *mem);

/* A registration's remote key as a blob for a peer, and a peer's blob as
 * a key to write with (the transport checks it). */
int fr_mem_pack_key(const struct fr_mem *mem, void *blob, size_t *len);
int fr_mem_unpack_key(struct fr_comm *comm, const void *blob, size_t len,
		      struct fr_tp_rkey *key);

/* A buffer registered once and grown on demand (the scratch buffer, the
 * zero-copy steps' staging area): at least len bytes at *buf, page-aligned
 * and registered with access; a larger one replaces a smaller one, which
 * is deregistered and freed (kept where the new one cannot be had).  0,
 * FR_ENOMEM or the registration's error.  fr_mem_buf_free releases it. */
int fr_mem_buf_grow(struct fr_comm *comm, void **buf, size_t *buf_len,
		    struct fr_mem **mem, size_t len, int access);
void fr_mem_buf_free(void **buf, size_t *buf_len, struct fr_mem **mem);

/* The scratch buffer (comm->mem.scratch), at least len bytes: 0, FR_ENOMEM,
 * or FR_EBUSY while a collective uses it; freed by fr_scratch_free(). */
int fr_scratch_get(struct fr_comm *comm, size_t len);
void fr_scratch_free(struct fr_comm *comm);

#endif
