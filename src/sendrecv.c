/* SPDX-License-Identifier: MIT */
/*
 * sendrecv.c - the public point-to-point calls: argument checks, then a
 * request of the engine's point-to-point (p2p.c, which says how messages
 * travel and match).
 *
 * A refused call fails the communicator on every rank, as a refused
 * collective does (fr_refuse, coll.c): its peer would otherwise wait for a
 * message that never comes.
 *
 * Layer: entry points.  Calls coll.c (fr_refuse), the engine (lock.c,
 * request.c, p2p.c) and the base.
 */
#include <stdint.h>
#include <stdio.h>

#include "internal.h"
#include "peer.h"

static int submit(fr_comm_t *comm, bool send, const void *buf, size_t count,
		  fr_dtype_t dtype, int peer, int tag, fr_request_t **out)
{
	const char *what = send ? "send" : "recv";
	size_t es;

	if (!out)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: %s: NULL request pointer",
				 comm->rank, what);
	*out = NULL;
	if (comm->fail.failed)
		return comm->fail.failed;
	es = fr_dtype_size(dtype);
	if (!es)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: %s: invalid datatype %d", comm->rank,
				 what, (int)dtype);
	if (peer < 0 || peer >= comm->nranks)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: %s: peer %d is not a rank of %d",
				 comm->rank, what, peer, comm->nranks);
	if (tag < 0)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: %s: tag %d is negative", comm->rank,
				 what, tag);
	if (count > SIZE_MAX / es / 2)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: %s: count %zu too large", comm->rank,
				 what, count);
	if (count && !buf)
		return fr_refuse(comm, FR_EINVAL,
				 "rank %d: %s: NULL buffer with count %zu",
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
