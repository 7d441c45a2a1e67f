/* SPDX-License-Identifier: MIT */
/*
 * errors.c - error codes, version, datatype, operation, algorithm and
 * collective names, and a communicator's last error message.
 *
 * Layer: base (below everything that has a communicator): every layer may
 * call it, it calls nothing of the library's.
 *
 * Everything here is generated from the tables in fastreduce.h or below, so
 * a new code or dtype is added in exactly one place.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "fastreduce.h"
#include "internal.h"

const char *fr_version(void)
{
	return FR_VERSION_STRING;
}

unsigned fr_version_number(void)
{
	return FR_VERSION_NUMBER;
}

const char *fr_strerror(int err)
{
	switch (err) {
	case FR_OK:
		return "success";
#define FR_ERRNO_MSG_(name, val, msg) \
	case FR_##name:               \
		return msg;
		FR_ERRNO_MAP(FR_ERRNO_MSG_)
#undef FR_ERRNO_MSG_
	}
	return "unknown error";
}

const char *fr_errname(int err)
{
	switch (err) {
	case FR_OK:
		return "FR_OK";
#define FR_ERRNO_NAME_(name, val, msg) \
	case FR_##name:                \
		return "FR_" #name;
		FR_ERRNO_MAP(FR_ERRNO_NAME_)
#undef FR_ERRNO_NAME_
	}
	return "FR_E?";
}

/* name, size, aliases (NULL-terminated) per dtype, indexed by fr_dtype_t. */
static const struct {
	const char *name;
	size_t size;
	const char *alias[3];
} dtypes[FR_DTYPE_COUNT] = {
	[FR_F32] = {"f32", 4, {"float", "float32", NULL}},
	[FR_F64] = {"f64", 8, {"double", "float64", NULL}},
	[FR_F16] = {"f16", 2, {"half", "float16", NULL}},
	[FR_BF16] = {"bf16", 2, {"bfloat16", NULL, NULL}},
	[FR_I8] = {"i8", 1, {"int8", NULL, NULL}},
	[FR_U8] = {"u8", 1, {"uint8", NULL, NULL}},
	[FR_I32] = {"i32", 4, {"int32", "int", NULL}},
	[FR_U32] = {"u32", 4, {"uint32", NULL, NULL}},
	[FR_I64] = {"i64", 8, {"int64", NULL, NULL}},
	[FR_U64] = {"u64", 8, {"uint64", NULL, NULL}},
};

static const char *const ops[FR_OP_COUNT] = {
	[FR_SUM] = "sum", [FR_PROD] = "prod", [FR_MIN] = "min",
	[FR_MAX] = "max", [FR_AVG] = "avg",
};

size_t fr_dtype_size(fr_dtype_t dtype)
{
	if ((unsigned)dtype >= FR_DTYPE_COUNT)
		return 0;
	return dtypes[dtype].size;
}

const char *fr_dtype_name(fr_dtype_t dtype)
{
	if ((unsigned)dtype >= FR_DTYPE_COUNT)
		return "?";
	return dtypes[dtype].name;
}

const char *fr_op_name(fr_op_t op)
{
	if ((unsigned)op >= FR_OP_COUNT)
		return "?";
	return ops[op];
}

int fr_dtype_from_name(const char *name, fr_dtype_t *dtype)
{
	if (!name || !dtype)
		return FR_EINVAL;
	for (int i = 0; i < FR_DTYPE_COUNT; i++) {
		if (!strcasecmp(name, dtypes[i].name))
			goto found;
		for (int a = 0; a < 3 && dtypes[i].alias[a]; a++)
			if (!strcasecmp(name, dtypes[i].alias[a]))
				goto found;
		continue;
	found:
		*dtype = (fr_dtype_t)i;
		return 0;
	}
	return FR_EINVAL;
}

int fr_op_from_name(const char *name, fr_op_t *op)
{
	if (!name || !op)
		return FR_EINVAL;
	for (int i = 0; i < FR_OP_COUNT; i++) {
		if (!strcasecmp(name, ops[i])) {
			*op = (fr_op_t)i;
			return 0;
		}
	}
	if (!strcasecmp(name, "mean")) {
		*op = FR_AVG;
		return 0;
	}
	return FR_EINVAL;
}

static const char *const algo_names[FR_ALGO_COUNT] = {
	[FR_ALGO_AUTO] = "auto",
	[FR_ALGO_RING] = "ring",
	[FR_ALGO_RD] = "rd",
	[FR_ALGO_RABENSEIFNER] = "rabenseifner",
	[FR_ALGO_TREE] = "tree",
	[FR_ALGO_DISSEMINATION] = "dissemination",
	[FR_ALGO_HIER] = "hier",
	[FR_ALGO_ONESHOT] = "oneshot",
	[FR_ALGO_PAIRWISE] = "pairwise",
	[FR_ALGO_BRUCK] = "bruck",
};

const char *fr_algo_name(int algo)
{
	return algo >= 0 && algo < FR_ALGO_COUNT ? algo_names[algo] : "?";
}

int fr_algo_from_name(const char *name, fr_algo_t *algo)
{
	if (!name || !algo)
		return FR_EINVAL;
	for (int i = 0; i < FR_ALGO_COUNT; i++)
		if (!strcmp(name, algo_names[i])) {
			*algo = (fr_algo_t)i;
			return 0;
		}
	if (!strcmp(name, "recursive_doubling")) {
		*algo = FR_ALGO_RD;
		return 0;
	}
	return FR_EINVAL;
}

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
	case FR_COLL_REDUCE:
		return "reduce";
	case FR_COLL_ALLTOALL:
		return "alltoall";
	case FR_COLL_ALLTOALLV:
		return "alltoallv";
	case FR_COLL_ALLGATHERV:
		return "allgatherv";
	case FR_COLL_REDUCE_SCATTERV:
		return "reduce_scatterv";
	}
	return "?";
}

int fr_comm_seterr(struct fr_comm *comm, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(comm->errmsg, sizeof(comm->errmsg), fmt, ap);
	va_end(ap);
	fr_comm_errmsg_tag(comm);
	return err;
}

void fr_comm_errmsg_tag(struct fr_comm *comm)
{
	size_t len = strlen(comm->errmsg);

	if (!comm->id || len >= sizeof(comm->errmsg) - 1)
		return;
	snprintf(comm->errmsg + len, sizeof(comm->errmsg) - len,
		 " [communicator %d: rank %d of %d, job rank %d]", comm->id,
		 comm->rank, comm->nranks, comm->job_rank);
}
