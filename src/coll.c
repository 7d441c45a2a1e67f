/* SPDX-License-Identifier: MIT */
/*
 * coll.c - the public collectives: argument checks, then a request.
 *
 * Arguments are checked here, locally; that the ranks agree with each other
 * is checked on the wire (every message names the collective, count,
 * dtype, op, root and algorithm, see peer.c).
 */
#include <string.h>

#include "algo/algo.h"
#include "internal.h"
#include "reduce.h"

const char *fr_coll_name(enum fr_coll coll)
{
	switch (coll) {
	case FR_COLL_ALLREDUCE:
		return "allreduce";
	case FR_COLL_REDUCE_SCATTER:
		return "reduce_scatter";
	case FR_COLL_ALLGATHER:
		return "allgather";
	case FR_COLL_BROADCAST:
		return "broadcast";
	case FR_COLL_BARRIER:
		return "barrier";
	}
	return "?";
}

size_t fr_coll_count_total(const struct fr_request *req)
{
	if (req->coll == FR_COLL_REDUCE_SCATTER ||
	    req->coll == FR_COLL_ALLGATHER)
		return req->count * (size_t)req->comm->nranks;
	return req->count;
}

static bool overlaps(const void *a, size_t alen, const void *b, size_t blen)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	return x < y ? y - x < alen : x - y < blen;
}

/* Checks shared by every collective; fills req. */
static int check(fr_comm_t *comm, enum fr_coll coll, size_t count,
		 fr_dtype_t dtype, fr_op_t op, bool reduces,
		 struct fr_request *req)
{
	const char *name = fr_coll_name(coll);
	size_t es;

	if (comm->failed)
		return comm->failed;
	es = fr_dtype_size(dtype);
	if (!es || (reduces && fr_reduce_check(dtype, op)))
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: %s: invalid datatype/operation (%d, %d)%s",
			comm->rank, name, (int)dtype, (int)op,
			es && op == FR_AVG ? ": avg needs a floating type"
					   : "");
	if (count > SIZE_MAX / es / 2 / (size_t)comm->nranks)
		return fr_comm_seterr(comm, FR_EINVAL,
				      "rank %d: %s: count %zu too large",
				      comm->rank, name, count);
	memset(req, 0, sizeof(*req));
	req->comm = comm;
	req->coll = coll;
	req->count = count;
	req->dtype = dtype;
	req->op = reduces ? op : FR_SUM;
	req->forced = comm->algo_forced;
	return 0;
}

int fr_iallreduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		  size_t count, fr_dtype_t dtype, fr_op_t op,
		  fr_request_t **out)
{
	struct fr_request r;
	size_t bytes;
	int rc;

	if (!comm || !out)
		return FR_EINVAL;
	*out = NULL;
	rc = check(comm, FR_COLL_ALLREDUCE, count, dtype, op, true, &r);
	if (rc)
		return rc;
	bytes = count * fr_dtype_size(dtype);
	if (sendbuf == recvbuf)
		sendbuf = FR_IN_PLACE;
	if (count && (!recvbuf || !sendbuf))
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: allreduce: NULL buffer with count %zu",
			comm->rank, count);
	if (count && sendbuf != FR_IN_PLACE &&
	    overlaps(sendbuf, bytes, recvbuf, bytes))
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: allreduce: send and receive buffers overlap without being equal",
			comm->rank);
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	return fr_req_submit(comm, &r, out);
}

int fr_ireduce_scatter(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		       size_t recvcount, fr_dtype_t dtype, fr_op_t op,
		       fr_request_t **out)
{
	struct fr_request r;
	size_t blk, total;
	int rc;

	if (!comm || !out)
		return FR_EINVAL;
	*out = NULL;
	rc = check(comm, FR_COLL_REDUCE_SCATTER, recvcount, dtype, op, true,
		   &r);
	if (rc)
		return rc;
	blk = recvcount * fr_dtype_size(dtype);
	total = blk * (size_t)comm->nranks;
	if (recvcount && (!recvbuf || !sendbuf || sendbuf == FR_IN_PLACE))
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: reduce_scatter: %s with count %zu (in place is recvbuf == sendbuf + rank * recvcount)",
			comm->rank,
			sendbuf == FR_IN_PLACE ? "FR_IN_PLACE" : "NULL buffer",
			recvcount);
	if (recvcount &&
	    (const uint8_t *)recvbuf !=
		    (const uint8_t *)sendbuf + (size_t)comm->rank * blk &&
	    overlaps(sendbuf, total, recvbuf, blk))
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: reduce_scatter: buffers overlap other than in place (recvbuf == sendbuf + rank * recvcount)",
			comm->rank);
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	return fr_req_submit(comm, &r, out);
}

int fr_iallgather(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		  size_t sendcount, fr_dtype_t dtype, fr_request_t **out)
{
	struct fr_request r;
	size_t blk, total;
	int rc;

	if (!comm || !out)
		return FR_EINVAL;
	*out = NULL;
	rc = check(comm, FR_COLL_ALLGATHER, sendcount, dtype, FR_SUM, false,
		   &r);
	if (rc)
		return rc;
	blk = sendcount * fr_dtype_size(dtype);
	total = blk * (size_t)comm->nranks;
	if (sendcount && (uint8_t *)recvbuf + (size_t)comm->rank * blk ==
				 (const uint8_t *)sendbuf)
		sendbuf = FR_IN_PLACE;
	if (sendcount && (!recvbuf || !sendbuf))
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: allgather: NULL buffer with count %zu",
			comm->rank, sendcount);
	if (sendcount && sendbuf != FR_IN_PLACE &&
	    overlaps(sendbuf, blk, recvbuf, total))
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: allgather: buffers overlap other than in place (sendbuf == recvbuf + rank * sendcount)",
			comm->rank);
	r.sendbuf = sendbuf;
	r.recvbuf = recvbuf;
	return fr_req_submit(comm, &r, out);
}

int fr_ibroadcast(fr_comm_t *comm, void *buf, size_t count, fr_dtype_t dtype,
		  int root, fr_request_t **out)
{
	struct fr_request r;
	int rc;

	if (!comm || !out)
		return FR_EINVAL;
	*out = NULL;
	rc = check(comm, FR_COLL_BROADCAST, count, dtype, FR_SUM, false, &r);
	if (rc)
		return rc;
	if (root < 0 || root >= comm->nranks)
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: broadcast: root %d is not a rank of %d",
			comm->rank, root, comm->nranks);
	if (count && !buf)
		return fr_comm_seterr(
			comm, FR_EINVAL,
			"rank %d: broadcast: NULL buffer with count %zu",
			comm->rank, count);
	r.sendbuf = FR_IN_PLACE;
	r.recvbuf = buf;
	r.root = root;
	return fr_req_submit(comm, &r, out);
}

int fr_ibarrier(fr_comm_t *comm, fr_request_t **out)
{
	struct fr_request r;
	int rc;

	if (!comm || !out)
		return FR_EINVAL;
	*out = NULL;
	rc = check(comm, FR_COLL_BARRIER, 0, FR_U8, FR_SUM, false, &r);
	if (rc)
		return rc;
	r.sendbuf = FR_IN_PLACE;
	return fr_req_submit(comm, &r, out);
}

int fr_allreduce(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		 size_t count, fr_dtype_t dtype, fr_op_t op)
{
	fr_request_t *req;
	int rc = fr_iallreduce(comm, sendbuf, recvbuf, count, dtype, op, &req);

	return rc ? rc : fr_wait(&req);
}

int fr_reduce_scatter(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		      size_t recvcount, fr_dtype_t dtype, fr_op_t op)
{
	fr_request_t *req;
	int rc = fr_ireduce_scatter(comm, sendbuf, recvbuf, recvcount, dtype,
				    op, &req);

	return rc ? rc : fr_wait(&req);
}

int fr_allgather(fr_comm_t *comm, const void *sendbuf, void *recvbuf,
		 size_t sendcount, fr_dtype_t dtype)
{
	fr_request_t *req;
	int rc = fr_iallgather(comm, sendbuf, recvbuf, sendcount, dtype, &req);

	return rc ? rc : fr_wait(&req);
}

int fr_broadcast(fr_comm_t *comm, void *buf, size_t count, fr_dtype_t dtype,
		 int root)
{
	fr_request_t *req;
	int rc = fr_ibroadcast(comm, buf, count, dtype, root, &req);

	return rc ? rc : fr_wait(&req);
}

int fr_barrier(fr_comm_t *comm)
{
	fr_request_t *req;
	int rc = fr_ibarrier(comm, &req);

	return rc ? rc : fr_wait(&req);
}
