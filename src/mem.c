/* SPDX-License-Identifier: MIT */
/*
 * mem.c - registered memory: user registrations and the registration cache.
 *
 * Zero copy needs every buffer registered with the transport, and
 * registering is expensive on RDMA (pinning, NIC page tables), so it must
 * happen once per buffer, not once per call.  fr_mem_register() does that
 * explicitly.  Buffers that were never registered go through a cache keyed
 * by page-aligned ranges: the first collective registers the pages around
 * the buffer, later ones find a cached range containing theirs (exact byte
 * ranges would almost never hit).  The cache is bounded; unreferenced
 * entries are evicted least recently used first.  Each registration gets an
 * id that is never reused in the communicator, which is how peers cache our
 * remote keys (see ring.c).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "log.h"
#include "util.h"

int fr_mem_register_internal(struct fr_comm *comm, void *buf, size_t len,
			     int access, bool user, struct fr_mem **out)
{
	struct fr_mem *m = calloc(1, sizeof(*m));
	int rc;

	if (!m)
		return FR_ENOMEM;
	rc = comm->tp_ops->reg_mem(comm->tp, buf, len, access, &m->tp_mr);
	if (rc) {
		free(m);
		return fr_comm_seterr(
			comm, rc,
			"rank %d: registering %zu bytes at %p with %s failed: %s",
			comm->rank, len, buf, comm->tp_ops->name,
			fr_strerror(rc));
	}
	m->comm = comm;
	m->base = (uintptr_t)buf;
	m->len = len;
	m->access = access;
	m->user = user;
	m->id = ++comm->mem.next_mem_id;
	m->last_use = ++comm->mem.clock;
	comm->stats.mem_registrations++;
	*out = m;
	return 0;
}

int fr_mem_free_internal(struct fr_mem *m)
{
	int rc;

	if (!m)
		return 0;
	rc = m->comm->tp_ops->dereg_mem(m->comm->tp, m->tp_mr);
	free(m);
	return rc;
}

void fr_release_heap(void *buf, size_t len)
{
	(void)len;
	free(buf);
}

void fr_release_pages(void *buf, size_t len)
{
	munmap(buf, len);
}

void fr_mem_keep(struct fr_mem *m, void *buf, size_t len,
		 void (*release)(void *buf, size_t len))
{
	/* if even that fails, the memory stays: a leak, not a late write
	 * into freed memory */
	if (buf)
		(void)fr_share_adopt(m->comm->tp, buf, len, release);
	free(m);
}

void fr_mem_free_buf(struct fr_mem *m, void *buf, size_t len,
		     void (*release)(void *buf, size_t len))
{
	struct fr_tp *view = m ? m->comm->tp : NULL;

	if (!m || !fr_mem_free_internal(m)) {
		if (buf)
			release(buf, len);
	} else if (buf) {
		(void)fr_share_adopt(view, buf, len, release);
	}
}

static bool covers(const struct fr_mem *m, uintptr_t a, size_t len, int access)
{
	return a >= m->base && len <= m->len && a - m->base <= m->len - len &&
	       (m->access & access) == access;
}

/* Unlink *pp from the cache and deregister it. */
static void cache_drop(struct fr_comm *comm, struct fr_mem **pp)
{
	struct fr_mem *m = *pp;

	*pp = m->next;
	comm->mem.cache_entries--;
	comm->stats.regcache_evictions++;
	fr_mem_free_internal(m);
}

/* Evict the least recently used unreferenced cache entry, if any. */
static bool cache_evict_one(struct fr_comm *comm)
{
	struct fr_mem **pp, **victim = NULL;

	for (pp = &comm->mem.cache; *pp; pp = &(*pp)->next)
		if (!(*pp)->refs &&
		    (!victim || (*pp)->last_use <= (*victim)->last_use))
			victim = pp;
	if (!victim)
		return false;
	cache_drop(comm, victim);
	return true;
}

int fr_mem_acquire(struct fr_comm *comm, const void *buf, size_t len,
		   int access, struct fr_mem **out)
{
	uintptr_t a = (uintptr_t)buf, lo, hi;
	size_t ps = fr_page_size();
	struct fr_mem *m;
	int rc;

	for (m = comm->mem.user_mems; m; m = m->next)
		if (covers(m, a, len, access))
			goto found;
	for (m = comm->mem.cache; m; m = m->next)
		if (covers(m, a, len, access)) {
			comm->stats.regcache_hits++;
			goto found;
		}
	comm->stats.regcache_misses++;
	while (comm->mem.cache_entries >= comm->mem.regcache_max &&
	       cache_evict_one(comm))
		;
	lo = a & ~(uintptr_t)(ps - 1);
	hi = (a + len + ps - 1) & ~(uintptr_t)(ps - 1);
	/* Receive buffers also get local read: the all-gather forwards from
	 * them.  Keep the union so a buffer used both ways hits next time. */
	rc = fr_mem_register_internal(comm, (void *)lo, hi - lo, access, false,
				      &m);
	if (rc)
		return rc;
	m->next = comm->mem.cache;
	comm->mem.cache = m;
	comm->mem.cache_entries++;
found:
	m->refs++;
	m->last_use = ++comm->mem.clock;
	*out = m;
	return 0;
}

void fr_mem_release(struct fr_mem *m)
{
	m->refs--;
}

/*
 * A failed collective may return while a peer that has not yet heard of
 * the failure is still writing into our receive buffer (it holds our
 * remote key).  A cached registration would keep that buffer open to such
 * late writes after the application has freed it, so a failed
 * communicator drops every cache entry no collective holds, right after
 * its failed requests have released theirs (request.c, fail_all): the
 * transport then refuses writes into them (TCP and shm check their region
 * table, verbs' rkey is invalid).  Regions the application registered are
 * its own to deregister before it frees them.
 */
void fr_mem_cache_drop_idle(struct fr_comm *comm)
{
	struct fr_mem **pp = &comm->mem.cache;

	while (*pp) {
		if ((*pp)->refs)
			pp = &(*pp)->next;
		else
			cache_drop(comm, pp);
	}
}

void fr_mem_cache_flush(struct fr_comm *comm)
{
	while (comm->mem.cache) {
		struct fr_mem *m = comm->mem.cache;

		comm->mem.cache = m->next;
		fr_mem_free_internal(m);
	}
	comm->mem.cache_entries = 0;
	while (comm->mem.user_mems) {
		struct fr_mem *m = comm->mem.user_mems;

		comm->mem.user_mems = m->next;
		fr_mem_free_internal(m);
	}
}

int fr_mem_user_register(struct fr_comm *comm, void *buf, size_t len,
			 struct fr_mem **mem)
{
	struct fr_mem *m;
	int rc;

	if (!comm || !mem)
		return FR_EINVAL;
	if (!buf || !len)
		return fr_comm_seterr(
			comm, FR_EINVAL, "rank %d: fr_mem_register: %s",
			comm->rank, !buf ? "NULL buffer" : "zero length");
	if ((uintptr_t)buf + len < (uintptr_t)buf)
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: fr_mem_register: range wraps around",
			comm->rank);
	/* A gradient buffer may be a source and a destination. */
	rc = fr_mem_register_internal(comm, buf, len,
				      FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE |
					      FR_TP_REMOTE_WRITE,
				      true, &m);
	if (rc)
		return rc;
	m->next = comm->mem.user_mems;
	comm->mem.user_mems = m;
	*mem = m;
	return 0;
}

int fr_mem_user_deregister(struct fr_mem *mem)
{
	struct fr_comm *comm;
	struct fr_mem **pp;

	if (!mem)
		return 0;
	comm = mem->comm;
	if (mem->refs)
		return fr_comm_seterr(
			comm, FR_EBUSY,
			"rank %d: fr_mem_deregister: a collective in flight uses this buffer",
			comm->rank);
	for (pp = &comm->mem.user_mems; *pp && *pp != mem; pp = &(*pp)->next)
		;
	if (!*pp)
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: fr_mem_deregister: not a registration of this communicator",
			comm->rank);
	*pp = mem->next;
	/* Cached ranges inside the buffer may belong to memory about to be
	 * freed: drop unreferenced ones that overlap. */
	for (pp = &comm->mem.cache; *pp;) {
		struct fr_mem *c = *pp;

		if (!c->refs && c->base < mem->base + mem->len &&
		    mem->base < c->base + c->len) {
			*pp = c->next;
			comm->mem.cache_entries--;
			fr_mem_free_internal(c);
		} else {
			pp = &c->next;
		}
	}
	fr_mem_free_internal(mem);
	return 0;
}

/* ---- remote keys -------------------------------------------------------- */

int fr_mem_pack_key(const struct fr_mem *mem, void *blob, size_t *len)
{
	return mem->comm->tp_ops->pack_rkey(mem->tp_mr, blob, len);
}

int fr_mem_unpack_key(struct fr_comm *comm, const void *blob, size_t len,
		      struct fr_tp_rkey *key)
{
	return comm->tp_ops->unpack_rkey(comm->tp, blob, len, key);
}

/* ---- buffers registered once, grown on demand ------------------------- */

int fr_mem_buf_grow(struct fr_comm *comm, void **buf, size_t *buf_len,
		    struct fr_mem **mem, size_t len, int access)
{
	size_t ps = fr_page_size(), sz = (len + ps - 1) / ps * ps;
	struct fr_mem *m;
	void *b;
	int rc;

	if (*buf_len >= len)
		return 0;
	b = aligned_alloc(ps, sz);
	if (!b)
		return FR_ENOMEM;
	rc = fr_mem_register_internal(comm, b, sz, access, false, &m);
	if (rc) {
		free(b);
		return rc;
	}
	/* peers may hold the old one's key; its id is never used again, so
	 * what names the new one carries the new key */
	fr_mem_buf_free(buf, buf_len, mem);
	*buf = b;
	*buf_len = sz;
	*mem = m;
	return 0;
}

void fr_mem_buf_free(void **buf, size_t *buf_len, struct fr_mem **mem)
{
	if (*mem)
		fr_mem_free_buf(*mem, *buf, *buf_len, fr_release_heap);
	*mem = NULL;
	*buf = NULL;
	*buf_len = 0;
}

/* ---- the scratch buffer ------------------------------------------------- */

int fr_scratch_get(struct fr_comm *c, size_t len)
{
	if (c->mem.scratch_len >= len)
		return 0;
	if (c->mem.scratch_mem && c->mem.scratch_mem->refs)
		return fr_comm_seterr(c, FR_EBUSY, "rank %d: scratch in use",
				      c->rank);
	return fr_mem_buf_grow(c, &c->mem.scratch, &c->mem.scratch_len,
			       &c->mem.scratch_mem, len,
			       FR_TP_LOCAL_READ | FR_TP_LOCAL_WRITE);
}

void fr_scratch_free(struct fr_comm *c)
{
	fr_mem_buf_free(&c->mem.scratch, &c->mem.scratch_len,
			&c->mem.scratch_mem);
}
