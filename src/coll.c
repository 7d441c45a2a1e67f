/* SPDX-License-Identifier: MIT */
/*
 * coll.c - the public collectives: argument checks, then a request.
 *
 * Arguments are checked here, locally; that the ranks agree with each other
 * is checked on the wire (every message names the collective, count,
 * dtype, op, root and algorithm, see peer.c).
 *
 * A refused call fails the communicator on every rank.  The other ranks
 * are about to run (or already run) this collective and would wait for this
 * rank until the timeout; worse, if this rank went on to its next call,
 * that call would meet the others' current one.  So a refusal is a failure
 * like a dead peer: FR_EINVAL here, and every other rank fails at once with
 * FR_EPEER and this rank's message (peer.c, fr_peers_tell_all).  A
 * single-rank communicator keeps working: nobody waits for it.
 *
 * Layer: entry points (with comm.c and buckets.c).  Calls the engine
 * (lock.c, request.c), the peers (fr_comm_fail, fr_peers_tell_all) and the
 * base.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo/algo.h"
#include "internal.h"
#include "peer.h"
#include "reduce.h"

int fr_refuse(struct fr_comm *comm, int err, const char *fmt, ...)
{
	char msg[FR_ERRMSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (comm->nranks < 2 || comm->fail.failed)
		return fr_comm_seterr(comm, err, "%s", msg);
	fr_comm_fail(comm, err, "%s", msg);
	fr_peers_tell_all(comm);
	return err;
}

static bool overlaps(const void *a, size_t alen, const void *b, size_t blen)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return x < y ? y - x < alen : x - y < blen;
}

/* Checks shared by every collective; fills req, clears *out. */
static int check(fr_comm_t *comm, fr_request_t **out, enum fr_coll coll,
		 size_t count, fr_dtype_t dtype, fr_op_t op, bool reduces,
		 struct fr_request *req)
{
	const char *name = fr_coll_name(coll);
	size_t es;

	if (!comm)
		return FR_EINVAL;
	if (!out)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: NULL request pointer", comm->rank);
	*out = NULL;
	if (comm->fail.failed)
		return comm->fail.failed;
	es = fr_dtype_size(dtype);
	if (!es || (reduces && fr_reduce_check(dtype, op)))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: %s: invalid datatype/operation (%d, %d)%s",
			comm->rank, name, (int)dtype, (int)op,
			es && op == FR_AVG ? ": avg needs a floating type"
					   : "");
	if (count > SIZE_MAX / es / 2 / (size_t)comm->nranks)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: %s: count %zu too large", comm->rank,
				 name, count);
	memset(req, 0, FR_REQ_HEAD);
	req->comm = comm;
	req->coll = coll;
	req->count = count;
	req->dtype = dtype;
	req->op = reduces ? op : FR_SUM;
	req->forced = comm->algo.forced;
	return 0;
}

/* Per-call options: compression of f32 data and its error feedback. */
static int take_opts(fr_comm_t *comm, const fr_coll_opts_t *opts,
		     struct fr_request *r, size_t bytes)
{
	size_t rbytes;

	if (!opts)
		return 0;
	if (opts->size < sizeof(size_t) ||
	    opts->size < offsetof(fr_coll_opts_t, residual) + sizeof(float *))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allreduce: fr_coll_opts_t.size %zu is not set (fr_coll_opts_init)",
			comm->rank, opts->size);
	if (opts->compress < 0 || opts->compress >= FR_COMPRESS_COUNT)
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allreduce: compress %d is not an fr_compress_t",
			comm->rank, opts->compress);
	if (opts->compress == FR_COMPRESS_NONE) {
		if (opts->residual)
			return fr_refuse(
				comm, FR_EINVAL,
				"rank %d: allreduce: a residual (error feedback) needs compression",
				comm->rank);
		return 0;
	}
	if (r->dtype != FR_F32)
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allreduce: %s compression is for f32 data, not %s",
			comm->rank, fr_compress_name(opts->compress),
			fr_dtype_name(r->dtype));
	rbytes = r->count * sizeof(float);
	if (opts->residual && r->count &&
	    (overlaps(opts->residual, rbytes, r->recvbuf, bytes) ||
	     (r->sendbuf != FR_IN_PLACE &&
	      overlaps(opts->residual, rbytes, r->sendbuf, bytes))))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allreduce: the residual overlaps the data",
			comm->rank);
	r->compress = opts->compress;
	r->residual = opts->residual;
	return 0;
}

/* The buffers of a collective whose send and receive buffers are both
 * bytes long (All-Reduce, all-to-all): the same pointer twice is in
 * place; with data (count), neither may be NULL nor may they overlap. */
static int plain_bufs(fr_comm_t *comm, const char *what, const void **sendbuf,
		      const void *recvbuf, size_t count, size_t bytes)
{
	if (*sendbuf == recvbuf)
		*sendbuf = FR_IN_PLACE;
	if (count && (!recvbuf || !*sendbuf))
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: %s: NULL buffer with count %zu",
				 comm->rank, what, count);
	if (count && *sendbuf != FR_IN_PLACE &&
	    overlaps(*sendbuf, bytes, recvbuf, bytes))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: %s: send and receive buffers overlap without being equal",
			comm->rank, what);
	return 0;
}

static int iallreduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		      size_t count, fr_dtype_t dtype, fr_op_t op,
		      const fr_coll_opts_t *opts, fr_request_t **out)
{
	struct fr_request r;
	size_t bytes;
	int rc;

	rc = check(comm, out, FR_COLL_ALLREDUCE, count, dtype, op, true, &r);
	if (rc)
		return rc;
	bytes = count * fr_dtype_size(dtype);
	rc = plain_bufs(comm, "allreduce", &sendbuf, recvbuf, count, bytes);
	if (rc)
		return rc;
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	rc = take_opts(comm, opts, &r, bytes);
	if (rc)
		return rc;
	return fr_req_submit(comm, &r, out);
}

static int ireduce_scatter(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
			   size_t recvcount, fr_dtype_t dtype, fr_op_t op,
			   fr_request_t **out)
{
	struct fr_request r;
	size_t blk, total;
	int rc;

	rc = check(comm, out, FR_COLL_REDUCE_SCATTER, recvcount, dtype, op,
		   true, &r);
	if (rc)
		return rc;
	blk = recvcount * fr_dtype_size(dtype);
	total = blk * (size_t)comm->nranks;
	if (recvcount && (!recvbuf || !sendbuf || sendbuf == FR_IN_PLACE))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: reduce_scatter: %s with count %zu (in place is recvbuf == sendbuf + rank * recvcount)",
			comm->rank,
			sendbuf == FR_IN_PLACE ? "FR_IN_PLACE" : "NULL buffer",
			recvcount);
	if (recvcount &&
	    (const uint8_t *)recvbuf !=
		    (const uint8_t *)sendbuf + (size_t)comm->rank * blk &&
	    overlaps(sendbuf, total, recvbuf, blk))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: reduce_scatter: buffers overlap other than in place (recvbuf == sendbuf + rank * recvcount)",
			comm->rank);
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	return fr_req_submit(comm, &r, out);
}

static int iallgather(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		      size_t sendcount, fr_dtype_t dtype, fr_request_t **out)
{
	struct fr_request r;
	size_t blk, total;
	int rc;

	rc = check(comm, out, FR_COLL_ALLGATHER, sendcount, dtype, FR_SUM,
		   false, &r);
	if (rc)
		return rc;
	blk = sendcount * fr_dtype_size(dtype);
	total = blk * (size_t)comm->nranks;
	if (sendcount && (!recvbuf || !sendbuf))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allgather: NULL buffer with count %zu",
			comm->rank, sendcount);
	if (sendcount && (uint8_t *)recvbuf + (size_t)comm->rank * blk ==
				 (const uint8_t *)sendbuf)
		sendbuf = FR_IN_PLACE;
	if (sendcount && sendbuf != FR_IN_PLACE &&
	    overlaps(sendbuf, blk, recvbuf, total))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allgather: buffers overlap other than in place (sendbuf == recvbuf + rank * sendcount)",
			comm->rank);
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	return fr_req_submit(comm, &r, out);
}

static int ibroadcast(fr_comm_t *comm, void *buf, size_t count,
		      fr_dtype_t dtype, int root, fr_request_t **out)
{
	struct fr_request r;
	int rc;

	rc = check(comm, out, FR_COLL_BROADCAST, count, dtype, FR_SUM, false,
		   &r);
	if (rc)
		return rc;
	if (root < 0 || root >= comm->nranks)
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: broadcast: root %d is not a rank of %d",
			comm->rank, root, comm->nranks);
	if (count && !buf)
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: broadcast: NULL buffer with count %zu",
			comm->rank, count);
	r.sendbuf = FR_IN_PLACE;
	r.recvbuf = buf;
	r.root = root;
	return fr_req_submit(comm, &r, out);
}

/* The v-collectives' arrays, copied into the request (FR_VEC_*). */
static size_t *vec_new(fr_comm_t *comm, const char *name)
{
	size_t *v = calloc(4 * (size_t)comm->nranks, sizeof(size_t));

	if (!v)
		fr_refuse(comm, FR_ENOMEM,
			  "rank %d: %s: out of memory for %d counts",
			  comm->rank, name, comm->nranks);
	return v;
}

/* Elements counts[0..n) (at displs, when given) of es bytes each: their
 * total and the extent they span, or FR_EINVAL when either overflows. */
static int span(const size_t *counts, const size_t *displs, int n, size_t es,
		size_t *total, size_t *extent)
{
	size_t max = SIZE_MAX / es / 2;

	*total = *extent = 0;
	for (int r = 0; r < n; r++) {
		size_t d = displs ? displs[r] : *total;

		if (counts[r] > max || *total > max - counts[r])
			return FR_EINVAL;
		*total += counts[r];
		/* an empty block's displacement is anything: not an extent */
		if (!counts[r])
			continue;
		if (d > max - counts[r])
			return FR_EINVAL;
		*extent = FR_MAX(*extent, d + counts[r]);
	}
	return 0;
}

static int ireduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		   size_t count, fr_dtype_t dtype, fr_op_t op, int root,
		   fr_request_t **out)
{
	struct fr_request r;
	size_t bytes;
	int rc;

	rc = check(comm, out, FR_COLL_REDUCE, count, dtype, op, true, &r);
	if (rc)
		return rc;
	if (root < 0 || root >= comm->nranks)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: reduce: root %d is not a rank of %d",
				 comm->rank, root, comm->nranks);
	bytes = count * fr_dtype_size(dtype);
	if (recvbuf && sendbuf == recvbuf)
		sendbuf = FR_IN_PLACE;
	if (count && (!sendbuf || (sendbuf == FR_IN_PLACE && !recvbuf) ||
		      (comm->rank == root && !recvbuf)))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: reduce: NULL buffer with count %zu%s",
			comm->rank, count,
			comm->rank == root ? " (the root needs recvbuf)" : "");
	if (count && comm->rank == root && sendbuf != FR_IN_PLACE &&
	    overlaps(sendbuf, bytes, recvbuf, bytes))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: reduce: send and receive buffers overlap without being equal",
			comm->rank);
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	r.root = root;
	return fr_req_submit(comm, &r, out);
}

static int ialltoall(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		     size_t count, fr_dtype_t dtype, fr_request_t **out)
{
	struct fr_request r;
	size_t total;
	int rc;

	rc = check(comm, out, FR_COLL_ALLTOALL, count, dtype, FR_SUM, false,
		   &r);
	if (rc)
		return rc;
	total = count * fr_dtype_size(dtype) * (size_t)comm->nranks;
	rc = plain_bufs(comm, "alltoall", &sendbuf, recvbuf, count, total);
	if (rc)
		return rc;
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	return fr_req_submit(comm, &r, out);
}

static int ialltoallv(fr_comm_t *comm, const void *sendbuf,
		      const size_t *scounts, const size_t *sdispls,
		      void *recvbuf, const size_t *rcounts,
		      const size_t *rdispls, fr_dtype_t dtype,
		      fr_request_t **out)
{
	struct fr_request r;
	int n, me, rc;
	size_t es, stotal = 0, sext = 0, rtotal, rext;
	size_t *v;

	/* the header carries no count: each block's length is checked by
	 * its receiver (alltoall.c) */
	rc = check(comm, out, FR_COLL_ALLTOALLV, 0, dtype, FR_SUM, false, &r);
	if (rc)
		return rc;
	n = comm->nranks;
	me = comm->rank;
	es = fr_dtype_size(dtype);
	if (sendbuf == recvbuf)
		sendbuf = FR_IN_PLACE;
	if (!rcounts || !rdispls ||
	    (sendbuf != FR_IN_PLACE && (!scounts || !sdispls)))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: alltoallv: NULL count or displacement array",
			comm->rank);
	if (span(rcounts, rdispls, n, es, &rtotal, &rext) ||
	    (sendbuf != FR_IN_PLACE &&
	     span(scounts, sdispls, n, es, &stotal, &sext)))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: alltoallv: counts or displacements too large",
			comm->rank);
	if (sendbuf != FR_IN_PLACE && scounts[me] != rcounts[me])
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: alltoallv: sendcounts[%d] = %zu but recvcounts[%d] = %zu (what a rank sends itself)",
			me, me, scounts[me], me, rcounts[me]);
	if ((rtotal && !recvbuf) ||
	    (stotal && sendbuf != FR_IN_PLACE && !sendbuf))
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: alltoallv: NULL buffer with counts",
				 comm->rank);
	if (stotal && rtotal && sendbuf != FR_IN_PLACE &&
	    overlaps(sendbuf, sext * es, recvbuf, rext * es))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: alltoallv: send and receive buffers overlap without being equal",
			comm->rank);
	v = vec_new(comm, "alltoallv");
	if (!v)
		return FR_ENOMEM;
	if (sendbuf != FR_IN_PLACE) {
		memcpy(v + FR_VEC_SCOUNTS * n, scounts, (size_t)n * sizeof(*v));
		memcpy(v + FR_VEC_SDISPLS * n, sdispls, (size_t)n * sizeof(*v));
	}
	memcpy(v + FR_VEC_RCOUNTS * n, rcounts, (size_t)n * sizeof(*v));
	memcpy(v + FR_VEC_RDISPLS * n, rdispls, (size_t)n * sizeof(*v));
	r.vec = v;
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	return fr_req_submit(comm, &r, out);
}

static int iallgatherv(fr_comm_t *comm, const void *sendbuf, size_t sendcount,
		       void *recvbuf, const size_t *rcounts,
		       const size_t *displs, fr_dtype_t dtype,
		       fr_request_t **out)
{
	struct fr_request r;
	int n, me, rc;
	size_t es, total = 0, ext = 0;
	size_t *v;

	if (!comm)
		return FR_EINVAL;
	n = comm->nranks;
	me = comm->rank;
	es = fr_dtype_size(dtype);
	if (out)
		*out = NULL;
	if (!rcounts || !displs)
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allgatherv: NULL count or displacement array",
			me);
	if (es && span(rcounts, displs, n, es, &total, &ext))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allgatherv: counts or displacements too large",
			me);
	/* the header carries the total, which every rank must agree on */
	rc = check(comm, out, FR_COLL_ALLGATHERV, es ? total : 0, dtype, FR_SUM,
		   false, &r);
	if (rc)
		return rc;
	if (sendcount != rcounts[me])
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allgatherv: sendcount %zu but recvcounts[%d] = %zu",
			me, sendcount, me, rcounts[me]);
	if ((total && !recvbuf) || (sendcount && !sendbuf))
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: allgatherv: NULL buffer with counts",
				 me);
	if (sendcount &&
	    (const uint8_t *)sendbuf == (uint8_t *)recvbuf + displs[me] * es)
		sendbuf = FR_IN_PLACE;
	if (sendcount && sendbuf != FR_IN_PLACE &&
	    overlaps(sendbuf, sendcount * es, recvbuf, ext * es))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: allgatherv: buffers overlap other than in place (sendbuf == recvbuf + displs[rank])",
			me);
	v = vec_new(comm, "allgatherv");
	if (!v)
		return FR_ENOMEM;
	memcpy(v + FR_VEC_RCOUNTS * n, rcounts, (size_t)n * sizeof(*v));
	memcpy(v + FR_VEC_RDISPLS * n, displs, (size_t)n * sizeof(*v));
	r.vec = v;
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	return fr_req_submit(comm, &r, out);
}

static int ireduce_scatterv(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
			    const size_t *rcounts, fr_dtype_t dtype, fr_op_t op,
			    fr_request_t **out)
{
	struct fr_request r;
	int n, me, rc;
	size_t es, total = 0, ext = 0, off = 0;
	size_t *v;

	if (!comm)
		return FR_EINVAL;
	n = comm->nranks;
	me = comm->rank;
	es = fr_dtype_size(dtype);
	if (out)
		*out = NULL;
	if (!rcounts)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: reduce_scatterv: NULL recvcounts",
				 me);
	if (es && span(rcounts, NULL, n, es, &total, &ext))
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: reduce_scatterv: counts too large",
				 me);
	rc = check(comm, out, FR_COLL_REDUCE_SCATTERV, es ? total : 0, dtype,
		   op, true, &r);
	if (rc)
		return rc;
	for (int i = 0; i < me; i++)
		off += rcounts[i];
	if (total &&
	    (!sendbuf || sendbuf == FR_IN_PLACE || (rcounts[me] && !recvbuf)))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: reduce_scatterv: %s with counts (in place is recvbuf == sendbuf + the offset of this rank's block)",
			me,
			sendbuf == FR_IN_PLACE ? "FR_IN_PLACE" : "NULL buffer");
	if (rcounts[me] &&
	    (const uint8_t *)recvbuf != (const uint8_t *)sendbuf + off * es &&
	    overlaps(sendbuf, total * es, recvbuf, rcounts[me] * es))
		return fr_refuse(
			comm, FR_EINVAL,
			"rank %d: reduce_scatterv: buffers overlap other than in place (recvbuf == sendbuf + the offset of this rank's block)",
			me);
	v = vec_new(comm, "reduce_scatterv");
	if (!v)
		return FR_ENOMEM;
	memcpy(v + FR_VEC_RCOUNTS * n, rcounts, (size_t)n * sizeof(*v));
	off = 0;
	for (int i = 0; i < n; i++) {
		v[FR_VEC_SDISPLS * n + i] = off;
		off += rcounts[i];
	}
	r.vec = v;
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	return fr_req_submit(comm, &r, out);
}

static int ibarrier(fr_comm_t *comm, fr_request_t **out)
{
	struct fr_request r;
	int rc;

	rc = check(comm, out, FR_COLL_BARRIER, 0, FR_U8, FR_SUM, false, &r);
	if (rc)
		return rc;
	r.sendbuf = FR_IN_PLACE;
	return fr_req_submit(comm, &r, out);
}

/*
 * The public entry points: the communicator's lock around the checks and
 * the submission (progress.c), then for the blocking ones the wait.
 */
#define LOCKED(comm, call)                \
	do {                              \
		int rc_;                  \
		if (!(comm))              \
			return FR_EINVAL; \
		fr_lock(comm);            \
		rc_ = (call);             \
		fr_unlock(comm);          \
		return rc_;               \
	} while (0)

/* Submit with the lock held, then wait for it (blocking collectives). */
#define LOCKED_WAIT(comm, call)                         \
	do {                                            \
		fr_request_t *req_;                     \
		int rc_;                                \
		if (!(comm))                            \
			return FR_EINVAL;               \
		fr_lock(comm);                          \
		rc_ = (call);                           \
		if (!rc_)                               \
			rc_ = fr_req_wait_locked(req_); \
		fr_unlock(comm);                        \
		return rc_;                             \
	} while (0)

int fr_iallreduce_locked(struct fr_comm *comm, const void *sendbuf,
			 void *recvbuf, size_t count, fr_dtype_t dtype,
			 fr_op_t op, const fr_coll_opts_t *opts,
			 fr_request_t **req)
{
	return iallreduce(comm, sendbuf, recvbuf, count, dtype, op, opts, req);
}

void fr_coll_opts_init(fr_coll_opts_t *opts)
{
	if (!opts)
		return;
	memset(opts, 0, sizeof(*opts));
	opts->size = sizeof(*opts);
}

int fr_iallreduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		  size_t count, fr_dtype_t dtype, fr_op_t op,
		  fr_request_t **out)
{
	LOCKED(comm,
	       iallreduce(comm, sendbuf, recvbuf, count, dtype, op, NULL, out));
}

int fr_iallreduce_ex(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		     size_t count, fr_dtype_t dtype, fr_op_t op,
		     const fr_coll_opts_t *opts, fr_request_t **out)
{
	LOCKED(comm,
	       iallreduce(comm, sendbuf, recvbuf, count, dtype, op, opts, out));
}

int fr_ireduce_scatter(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		       size_t recvcount, fr_dtype_t dtype, fr_op_t op,
		       fr_request_t **out)
{
	LOCKED(comm, ireduce_scatter(comm, sendbuf, recvbuf, recvcount, dtype,
				     op, out));
}

int fr_iallgather(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		  size_t sendcount, fr_dtype_t dtype, fr_request_t **out)
{
	LOCKED(comm, iallgather(comm, sendbuf, recvbuf, sendcount, dtype, out));
}

int fr_ibroadcast(fr_comm_t *comm, void *buf, size_t count, fr_dtype_t dtype,
		  int root, fr_request_t **out)
{
	LOCKED(comm, ibroadcast(comm, buf, count, dtype, root, out));
}

int fr_ibarrier(fr_comm_t *comm, fr_request_t **out)
{
	LOCKED(comm, ibarrier(comm, out));
}

int fr_allreduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		 size_t count, fr_dtype_t dtype, fr_op_t op)
{
	LOCKED_WAIT(comm, iallreduce(comm, sendbuf, recvbuf, count, dtype, op,
				     NULL, &req_));
}

int fr_allreduce_ex(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		    size_t count, fr_dtype_t dtype, fr_op_t op,
		    const fr_coll_opts_t *opts)
{
	LOCKED_WAIT(comm, iallreduce(comm, sendbuf, recvbuf, count, dtype, op,
				     opts, &req_));
}

int fr_reduce_scatter(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		      size_t recvcount, fr_dtype_t dtype, fr_op_t op)
{
	LOCKED_WAIT(comm, ireduce_scatter(comm, sendbuf, recvbuf, recvcount,
					  dtype, op, &req_));
}

int fr_allgather(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		 size_t sendcount, fr_dtype_t dtype)
{
	LOCKED_WAIT(comm, iallgather(comm, sendbuf, recvbuf, sendcount, dtype,
				     &req_));
}

int fr_broadcast(fr_comm_t *comm, void *buf, size_t count, fr_dtype_t dtype,
		 int root)
{
	LOCKED_WAIT(comm, ibroadcast(comm, buf, count, dtype, root, &req_));
}

int fr_barrier(fr_comm_t *comm)
{
	LOCKED_WAIT(comm, ibarrier(comm, &req_));
}

int fr_ireduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
	       size_t count, fr_dtype_t dtype, fr_op_t op, int root,
	       fr_request_t **out)
{
	LOCKED(comm,
	       ireduce(comm, sendbuf, recvbuf, count, dtype, op, root, out));
}

int fr_reduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf, size_t count,
	      fr_dtype_t dtype, fr_op_t op, int root)
{
	LOCKED_WAIT(comm, ireduce(comm, sendbuf, recvbuf, count, dtype, op,
				  root, &req_));
}

int fr_ialltoall(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		 size_t count, fr_dtype_t dtype, fr_request_t **out)
{
	LOCKED(comm, ialltoall(comm, sendbuf, recvbuf, count, dtype, out));
}

int fr_alltoall(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		size_t count, fr_dtype_t dtype)
{
	LOCKED_WAIT(comm,
		    ialltoall(comm, sendbuf, recvbuf, count, dtype, &req_));
}

int fr_ialltoallv(fr_comm_t *comm, const void *sendbuf,
		  const size_t *sendcounts, const size_t *sdispls,
		  void *recvbuf, const size_t *recvcounts,
		  const size_t *rdispls, fr_dtype_t dtype, fr_request_t **out)
{
	LOCKED(comm, ialltoallv(comm, sendbuf, sendcounts, sdispls, recvbuf,
				recvcounts, rdispls, dtype, out));
}

int fr_alltoallv(fr_comm_t *comm, const void *sendbuf, const size_t *sendcounts,
		 const size_t *sdispls, void *recvbuf, const size_t *recvcounts,
		 const size_t *rdispls, fr_dtype_t dtype)
{
	LOCKED_WAIT(comm,
		    ialltoallv(comm, sendbuf, sendcounts, sdispls, recvbuf,
			       recvcounts, rdispls, dtype, &req_));
}

int fr_iallgatherv(fr_comm_t *comm, const void *sendbuf, size_t sendcount,
		   void *recvbuf, const size_t *recvcounts,
		   const size_t *displs, fr_dtype_t dtype, fr_request_t **out)
{
	LOCKED(comm, iallgatherv(comm, sendbuf, sendcount, recvbuf, recvcounts,
				 displs, dtype, out));
}

int fr_allgatherv(fr_comm_t *comm, const void *sendbuf, size_t sendcount,
		  void *recvbuf, const size_t *recvcounts, const size_t *displs,
		  fr_dtype_t dtype)
{
	LOCKED_WAIT(comm, iallgatherv(comm, sendbuf, sendcount, recvbuf,
				      recvcounts, displs, dtype, &req_));
}

int fr_ireduce_scatterv(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
			const size_t *recvcounts, fr_dtype_t dtype, fr_op_t op,
			fr_request_t **out)
{
	LOCKED(comm, ireduce_scatterv(comm, sendbuf, recvbuf, recvcounts, dtype,
				      op, out));
}

int fr_reduce_scatterv(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		       const size_t *recvcounts, fr_dtype_t dtype, fr_op_t op)
{
	LOCKED_WAIT(comm, ireduce_scatterv(comm, sendbuf, recvbuf, recvcounts,
					   dtype, op, &req_));
}
