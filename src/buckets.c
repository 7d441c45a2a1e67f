/* SPDX-License-Identifier: MIT */
/*
 * buckets.c - gradient buckets: All-Reduce an arena while backward runs.
 *
 * The arena is cut once, at creation, into buckets (from its end by
 * default, since backward produces the last layers first: the first
 * bucket is first_bucket_bytes so that communication starts early, the
 * rest bucket_bytes, as PyTorch DDP does).  Every rank cuts the same way
 * from the same arguments, and buckets are started strictly in order, each
 * as soon as it and all before it are fully marked: ranks may mark ranges
 * in different orders and at different times and still start the same
 * collectives in the same order, which the engine requires.  Marked ranges
 * are kept as sorted, merged intervals, so marking a range twice in one
 * step is caught (FR_EINVAL) instead of silently starting a bucket early.
 * Each bucket is an in-place All-Reduce of its part of the arena, which is
 * registered once here (zero copy on the ring); with compression, its part
 * of the per-element residual gives error feedback.
 *
 * Layer: entry points.  Calls coll.c (fr_iallreduce_locked), the engine
 * (lock, request waits) and the base.
 */
#include <stdlib.h>
#include <string.h>

#include "env.h"
#include "internal.h"
#include "reduce.h"
#include "util.h"

#define FR_DEFAULT_BUCKET_BYTES (25u << 20)
#define FR_DEFAULT_FIRST_BUCKET_BYTES (1u << 20)

struct bucket {
	size_t off, n; /* elements of the arena */
	size_t ready;  /* elements marked this step */
	fr_request_t *req;
	bool started;
};

struct interval {
	size_t lo, hi;
};

struct fr_buckets {
	struct fr_comm *comm;
	uint8_t *arena;
	size_t count, es;
	fr_dtype_t dtype;
	fr_op_t op;
	int compress;
	fr_mem_t *mem;
	float *residual; /* count floats: error feedback, or NULL */
	int nb, next;	 /* buckets; the next one to start */
	struct bucket *b;
	struct interval *iv; /* marked this step, sorted and merged */
	size_t niv, ivcap;
};

void fr_buckets_config_init(fr_buckets_config_t *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof(*cfg));
	cfg->size = sizeof(*cfg);
}

#define BCFG_HAS(cfg, field) \
	((cfg)->size >=      \
	 offsetof(fr_buckets_config_t, field) + sizeof((cfg)->field))

/* Cut the arena: bucket 0 at the end (or start), first_bytes, then
 * bucket_bytes each, in start order. */
static int cut(struct fr_buckets *g, size_t first_bytes, size_t bytes,
	       bool forward)
{
	size_t first = FR_MAX(first_bytes / g->es, (size_t)1);
	size_t each = FR_MAX(bytes / g->es, (size_t)1), done = 0;
	int nb = 0;

	for (size_t left = g->count; left;) {
		size_t n = FR_MIN(left, nb ? each : first);

		left -= n;
		nb++;
	}
	g->b = calloc((size_t)FR_MAX(nb, 1), sizeof(*g->b));
	if (!g->b)
		return FR_ENOMEM;
	for (int i = 0; i < nb; i++) {
		size_t n = FR_MIN(g->count - done, i ? each : first);

		g->b[i].n = n;
		g->b[i].off = forward ? done : g->count - done - n;
		done += n;
	}
	g->nb = nb;
	return 0;
}

int fr_buckets_create(fr_comm_t *comm, void *arena, size_t count,
		      fr_dtype_t dtype, fr_op_t op,
		      const fr_buckets_config_t *cfg, fr_buckets_t **out)
{
	size_t bytes, first;
	char why[200];
	struct fr_buckets *g;
	int rc, compress = FR_COMPRESS_NONE;
	bool ef = false, forward = false;

	if (!comm || !out)
		return FR_EINVAL;
	*out = NULL;
	if (cfg && cfg->size < sizeof(size_t))
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: fr_buckets_create: config size not set (fr_buckets_config_init)",
			comm->rank);
	if (!fr_dtype_size(dtype) || !count || !arena)
		return fr_comm_seterr(comm, FR_EINVAL,
				      "rank %d: fr_buckets_create: %s",
				      comm->rank,
				      !fr_dtype_size(dtype) ? "invalid dtype"
				      : !count		    ? "empty arena"
							    : "NULL arena");
	bytes = FR_DEFAULT_BUCKET_BYTES;
	first = FR_DEFAULT_FIRST_BUCKET_BYTES;
	if (fr_env_size(fr_env_getenv, NULL, "FR_BUCKET_BYTES", 1, SIZE_MAX,
			&bytes, why, sizeof(why)) < 0 ||
	    fr_env_size(fr_env_getenv, NULL, "FR_FIRST_BUCKET_BYTES", 1,
			SIZE_MAX, &first, why, sizeof(why)) < 0)
		return fr_comm_seterr(comm, FR_EINVAL,
				      "rank %d: fr_buckets_create: %s",
				      comm->rank, why);
	if (cfg) {
		if (BCFG_HAS(cfg, bucket_bytes) && cfg->bucket_bytes)
			bytes = cfg->bucket_bytes;
		if (BCFG_HAS(cfg, first_bucket_bytes) &&
		    cfg->first_bucket_bytes)
			first = cfg->first_bucket_bytes;
		if (BCFG_HAS(cfg, compress))
			compress = cfg->compress;
		if (BCFG_HAS(cfg, error_feedback))
			ef = cfg->error_feedback;
		if (BCFG_HAS(cfg, forward))
			forward = cfg->forward;
	}
	if (fr_reduce_check(dtype, op))
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: fr_buckets_create: invalid operation %d for %s",
			comm->rank, (int)op, fr_dtype_name(dtype));
	if (compress < 0 || compress >= FR_COMPRESS_COUNT ||
	    (compress != FR_COMPRESS_NONE && dtype != FR_F32) ||
	    (ef && compress == FR_COMPRESS_NONE))
		return fr_comm_seterr(
			comm, FR_EINVAL, "rank %d: fr_buckets_create: %s",
			comm->rank,
			compress < 0 || compress >= FR_COMPRESS_COUNT
				? "compress is not an fr_compress_t"
			: ef && compress == FR_COMPRESS_NONE
				? "error feedback needs compression"
				: "compression is for f32 gradients");
	g = calloc(1, sizeof(*g));
	if (!g)
		return FR_ENOMEM;
	g->comm = comm;
	g->arena = arena;
	g->count = count;
	g->dtype = dtype;
	g->op = op;
	g->es = fr_dtype_size(dtype);
	g->compress = compress;
	rc = cut(g, first, bytes, forward);
	if (rc)
		goto err_cut;
	if (ef) {
		g->residual = calloc(count, sizeof(float));
		if (!g->residual) {
			rc = FR_ENOMEM;
			goto err_residual;
		}
	}
	/* once, for every step: the buckets then run zero copy */
	rc = fr_mem_register(comm, arena, count * g->es, &g->mem);
	if (rc)
		goto err_register;
	*out = g;
	return 0;

err_register:
	free(g->residual);
err_residual:
	free(g->b);
err_cut:
	free(g);
	return rc;
}

/* Start, in order, every bucket that is complete. */
static int start_ready(struct fr_buckets *g)
{
	while (g->next < g->nb && g->b[g->next].ready == g->b[g->next].n) {
		struct bucket *b = &g->b[g->next];
		fr_coll_opts_t o;
		int rc;

		fr_coll_opts_init(&o);
		o.compress = g->compress;
		o.residual = g->residual ? g->residual + b->off : NULL;
		rc = fr_iallreduce_locked(g->comm, FR_IN_PLACE,
					  g->arena + b->off * g->es, b->n,
					  g->dtype, g->op, &o, &b->req);
		if (rc)
			return rc;
		b->started = true;
		g->next++;
	}
	return 0;
}

/* Record [lo, hi) unless it meets a range marked already. */
static int mark(struct fr_buckets *g, size_t lo, size_t hi)
{
	size_t i = 0;

	while (i < g->niv && g->iv[i].hi <= lo)
		i++;
	if (i < g->niv && g->iv[i].lo < hi)
		return FR_EINVAL;
	if (g->niv == g->ivcap) {
		size_t cap = g->ivcap ? 2 * g->ivcap : 16;
		struct interval *iv = realloc(g->iv, cap * sizeof(*iv));

		if (!iv)
			return FR_ENOMEM;
		g->iv = iv;
		g->ivcap = cap;
	}
	memmove(&g->iv[i + 1], &g->iv[i], (g->niv - i) * sizeof(*g->iv));
	g->iv[i] = (struct interval){lo, hi};
	g->niv++;
	/* merge with touching neighbours, keeping the list short */
	if (i + 1 < g->niv && g->iv[i + 1].lo == hi) {
		g->iv[i].hi = g->iv[i + 1].hi;
		memmove(&g->iv[i + 1], &g->iv[i + 2],
			(g->niv - i - 2) * sizeof(*g->iv));
		g->niv--;
	}
	if (i > 0 && g->iv[i - 1].hi == g->iv[i].lo) {
		g->iv[i - 1].hi = g->iv[i].hi;
		memmove(&g->iv[i], &g->iv[i + 1],
			(g->niv - i - 1) * sizeof(*g->iv));
		g->niv--;
	}
	return 0;
}

int fr_buckets_ready(fr_buckets_t *g, size_t offset, size_t count)
{
	struct fr_comm *comm;
	bool work = false;
	int rc;

	if (!g)
		return FR_EINVAL;
	comm = g->comm;
	fr_lock(comm);
	if (comm->fail.failed) {
		rc = comm->fail.failed;
		goto out;
	}
	if (offset > g->count || count > g->count - offset) {
		rc = fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: fr_buckets_ready: [%zu, %zu) is outside the arena of %zu elements",
			comm->rank, offset, offset + count, g->count);
		goto out;
	}
	rc = count ? mark(g, offset, offset + count) : 0;
	if (rc) {
		if (rc == FR_EINVAL)
			fr_comm_seterr(
				comm, rc,
				"rank %d: fr_buckets_ready: [%zu, %zu) was marked already this step",
				comm->rank, offset, offset + count);
		goto out;
	}
	for (int i = 0; i < g->nb && count; i++) {
		struct bucket *b = &g->b[i];
		size_t lo = FR_MAX(b->off, offset);
		size_t hi = FR_MIN(b->off + b->n, offset + count);

		if (lo < hi)
			b->ready += hi - lo;
	}
	rc = start_ready(g);
	/* let what was started move even if nobody waits yet */
	if (!rc && !comm->thr.pt_running)
		fr_progress_internal(comm, &work);
out:
	fr_unlock(comm);
	return rc;
}

int fr_buckets_wait(fr_buckets_t *g)
{
	struct fr_comm *comm;
	int rc = 0, r;

	if (!g)
		return FR_EINVAL;
	comm = g->comm;
	fr_lock(comm);
	/* the end of backward: what was not marked is final as it is */
	for (int i = g->next; i < g->nb; i++)
		g->b[i].ready = g->b[i].n;
	if (!comm->fail.failed)
		rc = start_ready(g);
	for (int i = 0; i < g->nb; i++) {
		struct bucket *b = &g->b[i];

		if (b->started) {
			r = fr_req_wait_locked(b->req);
			if (!rc)
				rc = r;
		}
		b->req = NULL;
		b->started = false;
		b->ready = 0;
	}
	if (!rc && comm->fail.failed)
		rc = comm->fail.failed;
	g->next = 0;
	g->niv = 0;
	fr_unlock(comm);
	return rc;
}

int fr_buckets_count(const fr_buckets_t *g)
{
	return g ? g->nb : FR_EINVAL;
}

int fr_buckets_range(const fr_buckets_t *g, int i, size_t *offset,
		     size_t *count)
{
	if (!g || i < 0 || i >= g->nb)
		return FR_EINVAL;
	if (offset)
		*offset = g->b[i].off;
	if (count)
		*count = g->b[i].n;
	return 0;
}

int fr_buckets_destroy(fr_buckets_t *g)
{
	struct fr_comm *comm;
	bool busy = false;

	if (!g)
		return 0;
	comm = g->comm;
	fr_lock(comm);
	for (int i = 0; i < g->nb; i++)
		busy |= g->b[i].started;
	fr_unlock(comm);
	if (busy)
		return fr_comm_seterr(
			comm, FR_EBUSY,
			"rank %d: fr_buckets_destroy: a step is in flight (call fr_buckets_wait first)",
			comm->rank);
	fr_mem_deregister(g->mem);
	free(g->iv);
	free(g->residual);
	free(g->b);
	free(g);
	return 0;
}
