/* SPDX-License-Identifier: MIT */
/*
 * sendrecv.c - the public point-to-point calls: argument checks, then a
 * request of the engine's point-to-point (p2p.c, which says how messages
 * travel and match).
 *
 * A refused call fails the communicator on every rank, as a refused
 * collective does (coll.c): its peer would otherwise wait for a message
 * that never comes.
 *
 * Layer: entry points.  Calls the engine (lock.c, request.c, p2p.c), the
 * peers (fr_comm_fail, fr_peers_tell_all) and the base.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

#include "internal.h"
#include "peer.h"

static int refuse(fr_comm_t *comm, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static int refuse(fr_comm_t *comm, const char *fmt, ...)
{
	char msg[FR_ERRMSG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (comm->nranks < 2 || comm->fail.failed)
		return fr_comm_seterr(comm, FR_EINVAL, "%s", msg);
	fr_comm_fail(comm, FR_EINVAL, "%s", msg);
	fr_peers_tell_all(comm);
	return FR_EINVAL;
}

static int submit(fr_comm_t *comm, bool send, const void *buf, size_t count,
		  fr_dtype_t dtype, int peer, int tag, fr_request_t **out)
{
	const char *what = send ? "send" : "recv";
	size_t es;

	if (!out)
		return refuse(comm, "rank %d: %s: NULL request pointer",
			      comm->rank, what);
	*out = NULL;
	if (comm->fail.failed)
		return comm->fail.failed;
	es = fr_dtype_size(dtype);
	if (!es)
		return refuse(comm, "rank %d: %s: invalid datatype %d",
			      comm->rank, what, (int)dtype);
	if (peer < 0 || peer >= comm->nranks)
		return refuse(comm, "rank %d: %s: peer %d is not a rank of %d",
			      comm->rank, what, peer, comm->nranks);
	if (tag < 0)
		return refuse(comm, "rank %d: %s: tag %d is negative",
			      comm->rank, what, tag);
	if (count > SIZE_MAX / es / 2)
		return refuse(comm, "rank %d: %s: count %zu too large",
			      comm->rank, what, count);
	if (count && !buf)
		return refuse(comm, "rank %d: %s: NULL buffer with count %zu",
			      comm->rank, what, count);
	return fr_p2p_submit(comm, send, (void *)buf, count, dtype, peer, tag,
			     out);
}

int fr_isend(fr_comm_t *comm, const void *buf, size_t count, fr_dtype_t dtype,
	     int peer, int tag, fr_request_t **req)
{
	int rc;

	if (!comm)
		return FR_EINVAL;
	fr_lock(comm);
	rc = submit(comm, true, buf, count, dtype, peer, tag, req);
	fr_unlock(comm);
	return rc;
}

int fr_irecv(fr_comm_t *comm, void *buf, size_t count, fr_dtype_t dtype,
	     int peer, int tag, fr_request_t **req)
{
	int rc;

	if (!comm)
		return FR_EINVAL;
	fr_lock(comm);
	rc = submit(comm, false, buf, count, dtype, peer, tag, req);
	fr_unlock(comm);
	return rc;
}

static int blocking(fr_comm_t *comm, bool send, const void *buf, size_t count,
		    fr_dtype_t dtype, int peer, int tag)
{
	fr_request_t *req;
	int rc;

	if (!comm)
		return FR_EINVAL;
	fr_lock(comm);
	rc = submit(comm, send, buf, count, dtype, peer, tag, &req);
	if (!rc)
		rc = fr_req_wait_locked(req);
	fr_unlock(comm);
	return rc;
}

int fr_send(fr_comm_t *comm, const void *buf, size_t count, fr_dtype_t dtype,
	    int peer, int tag)
{
	return blocking(comm, true, buf, count, dtype, peer, tag);
}

int fr_recv(fr_comm_t *comm, void *buf, size_t count, fr_dtype_t dtype,
	    int peer, int tag)
{
	return blocking(comm, false, buf, count, dtype, peer, tag);
}
