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
#include <string.h>

#include "algo/algo.h"
#include "internal.h"
#include "peer.h"
#include "reduce.h"

static int refuse(fr_comm_t *comm, int err, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int refuse(fr_comm_t *comm, int err, const char *fmt, ...)
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
		return refuse(comm, FR_EINVAL, "rank %d: NULL request pointer",
			      comm->rank);
	*out = NULL;
	if (comm->fail.failed)
		return comm->fail.failed;
	es = fr_dtype_size(dtype);
	if (!es || (reduces && fr_reduce_check(dtype, op)))
		return refuse(
			comm, FR_EINVAL,
			"rank %d: %s: invalid datatype/operation (%d, %d)%s",
			comm->rank, name, (int)dtype, (int)op,
			es && op == FR_AVG ? ": avg needs a floating type"
					   : "");
	if (count > SIZE_MAX / es / 2 / (size_t)comm->nranks)
		return refuse(comm, FR_EINVAL,
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
		return refuse(
			comm, FR_EINVAL,
			"rank %d: allreduce: fr_coll_opts_t.size %zu is not set (fr_coll_opts_init)",
			comm->rank, opts->size);
	if (opts->compress < 0 || opts->compress >= FR_COMPRESS_COUNT)
		return refuse(
			comm, FR_EINVAL,
			"rank %d: allreduce: compress %d is not an fr_compress_t",
			comm->rank, opts->compress);
	if (opts->compress == FR_COMPRESS_NONE) {
		if (opts->residual)
			return refuse(
				comm, FR_EINVAL,
				"rank %d: allreduce: a residual (error feedback) needs compression",
				comm->rank);
		return 0;
	}
	if (r->dtype != FR_F32)
		return refuse(
			comm, FR_EINVAL,
			"rank %d: allreduce: %s compression is for f32 data, not %s",
			comm->rank, fr_compress_name(opts->compress),
			fr_dtype_name(r->dtype));
	rbytes = r->count * sizeof(float);
	if (opts->residual && r->count &&
	    (overlaps(opts->residual, rbytes, r->recvbuf, bytes) ||
	     (r->sendbuf != FR_IN_PLACE &&
	      overlaps(opts->residual, rbytes, r->sendbuf, bytes))))
		return refuse(
			comm, FR_EINVAL,
			"rank %d: allreduce: the residual overlaps the data",
			comm->rank);
	r->compress = opts->compress;
	r->residual = opts->residual;
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
	if (sendbuf == recvbuf)
		sendbuf = FR_IN_PLACE;
	if (count && (!recvbuf || !sendbuf))
		return refuse(comm, FR_EINVAL,
			      "rank %d: allreduce: NULL buffer with count %zu",
			      comm->rank, count);
	if (count && sendbuf != FR_IN_PLACE &&
	    overlaps(sendbuf, bytes, recvbuf, bytes))
		return refuse(
			comm, FR_EINVAL,
			"rank %d: allreduce: send and receive buffers overlap without being equal",
			comm->rank);
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
		return refuse(
			comm, FR_EINVAL,
			"rank %d: reduce_scatter: %s with count %zu (in place is recvbuf == sendbuf + rank * recvcount)",
			comm->rank,
			sendbuf == FR_IN_PLACE ? "FR_IN_PLACE" : "NULL buffer",
			recvcount);
	if (recvcount &&
	    (const uint8_t *)recvbuf !=
		    (const uint8_t *)sendbuf + (size_t)comm->rank * blk &&
	    overlaps(sendbuf, total, recvbuf, blk))
		return refuse(
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
	if (sendcount && (uint8_t *)recvbuf + (size_t)comm->rank * blk ==
				 (const uint8_t *)sendbuf)
		sendbuf = FR_IN_PLACE;
	if (sendcount && (!recvbuf || !sendbuf))
		return refuse(comm, FR_EINVAL,
			      "rank %d: allgather: NULL buffer with count %zu",
			      comm->rank, sendcount);
	if (sendcount && sendbuf != FR_IN_PLACE &&
	    overlaps(sendbuf, blk, recvbuf, total))
		return refuse(
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
		return refuse(comm, FR_EINVAL,
			      "rank %d: broadcast: root %d is not a rank of %d",
			      comm->rank, root, comm->nranks);
	if (count && !buf)
		return refuse(comm, FR_EINVAL,
			      "rank %d: broadcast: NULL buffer with count %zu",
			      comm->rank, count);
	r.sendbuf = FR_IN_PLACE;
	r.recvbuf = buf;
	r.root = root;
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
