/* SPDX-License-Identifier: MIT */
/*
 * fr_allreduce_perf - collective bandwidth and correctness, nccl-tests style.
 *
 * Uses the public API only, so it measures exactly what an application gets,
 * and creates its communicator with fr_comm_create_from_env() so the same
 * binary runs under frrun, mpirun, srun, torchrun or one rank per host.
 *
 * -C picks the collective: allreduce (default), reduce_scatter, allgather,
 * broadcast, reduce, alltoall, allgatherv or sendrecv, measured as nccl-tests'
 * all_reduce_perf, reduce_scatter_perf, all_gather_perf, broadcast_perf,
 * reduce_perf, alltoall_perf and sendrecv_perf do (allgatherv as
 * allgather, every block the same size; sendrecv: fr_isend to the next
 * rank, fr_irecv from the previous, busbw = algbw; pingpong: fr_send from
 * rank 0 to rank 1 and back, the time a round trip, busbw 2 size / time:
 * the one-way rate).  For every datatype x
 * operation x size it runs -w warm-up and -n timed collectives; each rank
 * averages its own time per iteration and the slowest rank's average is
 * reported (a collective is as fast as its last rank).  Every timed call is
 * also timed on its own on every rank; after the loop one more small All-Reduce
 * (max) of those per-call times gives, per call, the slowest rank's time (what
 * a training step waits for), and median, p99 and min over the calls are
 * reported next to the mean (--stat picks which one the time, algbw and
 * busbw columns use; the mean by default, as nccl-tests).  The columns are
 * those of nccl-tests so numbers can be compared directly:
 *
 *   size  = the largest buffer of the call: count elements for allreduce,
 *           broadcast and reduce, nranks * count for reduce_scatter (send),
 *           allgather(v) (receive) and alltoall (each), count being the
 *           call's count argument
 *   algbw = size / time
 *   busbw = algbw * 2(n-1)/n   allreduce
 *           algbw * (n-1)/n    reduce_scatter, allgather(v), alltoall
 *           algbw              broadcast, reduce
 *           (what each link carries in a bandwidth-optimal algorithm; it
 *           is comparable across rank counts)
 *   algo  = the algorithm the library ran (fr_comm_last_algo())
 *
 * With -c 1 one more collective runs on inputs whose exact result is known
 * and #wrong counts the elements that differ, summed over ranks.  Inputs are
 * small integers (or +-1 for prod), so every partial result is exact in every
 * datatype for up to 64 ranks and the expected value does not depend on the
 * order in which the library combines contributions.
 *
 * -Z none|bf16|fp16|int8 (f32 All-Reduce only) runs fr_allreduce_ex() with
 * that wire compression, --ef with an error-feedback residual per buffer.
 * The inputs are then pseudo-random multiples of 2^-30 in (-1, 1) that
 * every rank can compute for every rank, so the check compares the result
 * with the exact f64 reduction (relerr: ||result - exact|| / ||exact||);
 * busbw still counts the uncompressed bytes, and the wire column gives the
 * bytes each rank put on the wire per call (fr_comm_stats()).
 *
 * --overlap-ms MS times, per size, the collective alone (start + fr_wait),
 * MS of computation alone (sleep or spin, no library call) and the two
 * overlapped (start, compute, fr_wait), and prints wall / max(compute,
 * comm): 1 is a perfect overlap, (compute + comm) / max none.  Overlap
 * needs a progress thread (--progress thread or FR_PROGRESS=thread).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fastreduce.h"
#include "perf_common.h"

/* Slack after each buffer, so writes past the result land in our memory
 * and are caught: GUARD_CHECK bytes of it are checked after each run. */
#define GUARD_BYTES 4096
#define GUARD_CHECK 64
/*
 * What the result area holds before a checked run: all-ones bytes are a NaN
 * in every float type, so a float result the library never wrote cannot
 * pass by accident (for integers it is -1, which few expected values are).
 */
#define SENTINEL 0xff
/* Inputs repeat with this period in rank + index. */
#define PATTERN 7
/* -Z --ef: calls of the check, whose mean result is compared. */
#define EF_CHECK_CALLS 8
#define PC_STR_(x) #x
#define PC_STR(x) PC_STR_(x)

enum { FMT_TABLE, FMT_CSV, FMT_JSON };

/* The collectives, named as -C takes them. */
enum coll {
	COLL_ALLREDUCE,
	COLL_REDUCE_SCATTER,
	COLL_ALLGATHER,
	COLL_BROADCAST,
	COLL_REDUCE,
	COLL_ALLTOALL,
	COLL_ALLGATHERV,
	COLL_SENDRECV,
	COLL_PINGPONG,
	COLL_COUNT
};

static const char *const coll_names[COLL_COUNT] = {
	"allreduce", "reduce_scatter", "allgather", "broadcast", "reduce",
	"alltoall",  "allgatherv",     "sendrecv",  "pingpong"};
/* The library function each one calls, for error messages. */
static const char *const coll_funcs[COLL_COUNT] = {
	"fr_allreduce",	 "fr_reduce_scatter", "fr_allgather",
	"fr_broadcast",	 "fr_reduce",	      "fr_alltoall",
	"fr_allgatherv", "fr_send/fr_recv",   "fr_send/fr_recv"};

/* Long options without a short letter. */
enum {
	OPT_CSV = 256,
	OPT_JSON,
	OPT_EF,
	OPT_OVERLAP,
	OPT_COMPUTE,
	OPT_PROGRESS,
	OPT_STAT,
	OPT_CALLS,
	OPT_BARRIER
};

/* --stat: the statistic of the time column, over the timed calls. */
enum { STAT_MEAN, STAT_MEDIAN, STAT_P99, STAT_MIN, STAT_COUNT };

static const char *const stat_names[STAT_COUNT] = {"mean", "median", "p99",
						   "min"};

/* --compute: what the computation of --overlap-ms does. */
enum { COMPUTE_SLEEP, COMPUTE_SPIN };

struct opts {
	size_t minb, maxb, step; /* step 0: multiply by factor */
	long factor;
	long iters, warmup;
	bool check, inplace, reg;
	long timeout_ms;
	int fmt;
	int coll;  /* enum coll */
	long root; /* broadcast only */
	fr_dtype_t dtypes[FR_DTYPE_COUNT];
	int ndtypes;
	fr_op_t ops[FR_OP_COUNT];
	int nops;
	bool zmode;	   /* -Z or --ef given: f32 allreduce via _ex */
	int compress;	   /* fr_compress_t */
	bool ef;	   /* error feedback */
	double overlap_ms; /* > 0: overlap mode */
	int compute;	   /* COMPUTE_* */
	int progress;	   /* fr_progress_t for fr_config_t */
	int stat;	   /* STAT_*: what time_us is */
	const char *calls; /* --calls: rank 0 writes every call's time here */
	bool barrier;	   /* --barrier: a barrier before every timed call */
};

struct row {
	size_t bytes, count;
	fr_dtype_t dtype;
	fr_op_t op;
	double time_us, algbw, busbw; /* time_us: the --stat statistic */
	/* The slowest rank's average per call (mean), and over the calls of
	 * the per-call slowest rank's time: median, p99, min (us) */
	double mean_us, median_us, p99_us, min_us;
	long long wrong; /* -1: not checked */
	int algo;	 /* fr_comm_last_algo() after the timed loop */
	/* --overlap-ms: time_us is the collective alone (start + wait) */
	double compute_us, wall_us;
	/* -Z: relerr < 0 when not checked; wire bytes per call and rank;
	 * zratio compress_in / compress_out (0: nothing compressed) */
	double relerr, wire, zratio;
};

/* Buffers of the tool's own tiny All-Reduces (timing max, #wrong sum). */
struct meta {
	double t[2];
	uint64_t w[2];
	double d[8]; /* up to 4 values in, 4 out */
	uint64_t u[8];
};

struct ctx {
	struct opts *o;
	fr_comm_t *comm;
	int rank, nranks;
	size_t *vcounts, *vdispls;  /* allgatherv's arrays, nranks each */
	unsigned char *send, *recv; /* send == recv when in place; broadcast
				     * uses recv only (it is always in place) */
	size_t buflen;		    /* usable bytes, guard not included */
	struct meta *meta;	    /* for the tool's own All-Reduces */
	double *percall;	    /* iters + 1: per-call times, then mean */
	fr_mem_t *send_mem, *recv_mem, *meta_mem, *percall_mem;
	struct row *rows;
	size_t nrows, cap;
	double create_ms;     /* the slowest rank's fr_comm_create_from_env */
	fr_coll_opts_t zopts; /* -Z, --ef */
	float *residual;      /* --ef: one per element of the buffer */
	float *acc;	      /* --ef: sum of the check's results */
	FILE *calls;	      /* --calls, on rank 0 */
};

static bool is_float(fr_dtype_t dt)
{
	return dt == FR_F32 || dt == FR_F64 || dt == FR_F16 || dt == FR_BF16;
}

static bool is_signed_int(fr_dtype_t dt)
{
	return dt == FR_I8 || dt == FR_I32 || dt == FR_I64;
}

/* ---- half-precision conversions, round to nearest-even ------------------- */

/*
 * The tool may use only the public API, which has no conversion helpers, so
 * it carries its own.  They matter only for the expected value of avg,
 * which is rounded exactly as the library documents: through float.
 */
static uint16_t f32_to_f16(float fv)
{
	const uint32_t infty = 255u << 23, f16max = (127u + 16) << 23;
	const uint32_t magic_u = ((127u - 15) + (23 - 10) + 1) << 23;
	uint32_t f, sign;
	uint16_t o;
	float ff, magic;

	memcpy(&f, &fv, 4);
	sign = f & 0x80000000u;
	f ^= sign;
	if (f >= f16max) {
		o = f > infty ? 0x7e00 : 0x7c00; /* NaN stays NaN, else inf */
	} else if (f < (113u << 23)) {
		/* Subnormal result: let the FPU round by adding a magic
		 * number whose ulp is the f16 subnormal step. */
		memcpy(&ff, &f, 4);
		memcpy(&magic, &magic_u, 4);
		ff += magic;
		memcpy(&f, &ff, 4);
		o = (uint16_t)(f - magic_u);
	} else {
		uint32_t odd = (f >> 13) & 1;

		f += (uint32_t)((15 - 127) * (1 << 23)) + 0xfff + odd;
		o = (uint16_t)(f >> 13);
	}
	return (uint16_t)(o | (sign >> 16));
}

static float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f;
	uint32_t m = h & 0x3ff, u;
	float f;

	if (e == 0x1f) {
		u = sign | 0x7f800000u | (m << 13);
	} else if (e) {
		u = sign | ((e + 112) << 23) | (m << 13);
	} else {
		f = (float)m * (1.0f / 16777216.0f); /* exact: m * 2^-24 */
		return sign ? -f : f;
	}
	memcpy(&f, &u, 4);
	return f;
}

static uint16_t f32_to_bf16(float fv)
{
	uint32_t u;

	memcpy(&u, &fv, 4);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
	u += 0x7fffu + ((u >> 16) & 1);
	return (uint16_t)(u >> 16);
}

static float bf16_to_f32(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;

	memcpy(&f, &u, 4);
	return f;
}

/* ---- element access ------------------------------------------------------ */

/* Store a value that is exactly representable in dt (floats), or the low
 * bits of v (integers: two's complement wrap, as the library computes). */
static void put_elem(fr_dtype_t dt, void *p, int64_t v, double d)
{
	uint64_t u = (uint64_t)v;

	switch (dt) {
	case FR_F32: {
		float f = (float)d;
		memcpy(p, &f, 4);
		break;
	}
	case FR_F64:
		memcpy(p, &d, 8);
		break;
	case FR_F16: {
		uint16_t h = f32_to_f16((float)d);
		memcpy(p, &h, 2);
		break;
	}
	case FR_BF16: {
		uint16_t h = f32_to_bf16((float)d);
		memcpy(p, &h, 2);
		break;
	}
	case FR_I8:
	case FR_U8: {
		uint8_t b = (uint8_t)u;
		memcpy(p, &b, 1);
		break;
	}
	case FR_I32:
	case FR_U32: {
		uint32_t w = (uint32_t)u;
		memcpy(p, &w, 4);
		break;
	}
	default:
		memcpy(p, &u, 8);
		break;
	}
}

static double get_float(fr_dtype_t dt, const void *p)
{
	float f;
	double d;
	uint16_t h;

	switch (dt) {
	case FR_F32:
		memcpy(&f, p, 4);
		return f;
	case FR_F64:
		memcpy(&d, p, 8);
		return d;
	case FR_F16:
		memcpy(&h, p, 2);
		return f16_to_f32(h);
	default:
		memcpy(&h, p, 2);
		return bf16_to_f32(h);
	}
}

/* Input of rank r at index i, through k = (r + i) % PATTERN. */
static int64_t pattern(fr_op_t op, int k)
{
	if (op == FR_PROD)
		return (k & 1) ? -1 : 1; /* products stay exact and bounded */
	return k - 3; /* -3..3: sums of 64 ranks fit f16/bf16 */
}

/*
 * The exact result for elements with i % PATTERN == k, in dt's memory
 * representation (raw) and, for floats, as a double (val).
 */
static void expected(fr_dtype_t dt, fr_op_t op, int nranks, int k,
		     unsigned char raw[8], double *val)
{
	size_t esz = fr_dtype_size(dt);
	uint64_t mask = esz == 8 ? ~0ull : (1ull << (8 * esz)) - 1;
	int64_t acc = op == FR_PROD ? 1 : 0;
	uint64_t uacc = 0;
	double d;

	for (int r = 0; r < nranks; r++) {
		int64_t v = pattern(op, (r + k) % PATTERN);
		/* The value as an unsigned type of this size holds it. */
		uint64_t u = (uint64_t)v & mask;

		switch (op) {
		case FR_SUM:
		case FR_AVG:
			acc += v;
			break;
		case FR_PROD:
			acc *= v;
			break;
		case FR_MIN:
			if (!r || v < acc)
				acc = v;
			if (!r || u < uacc)
				uacc = u;
			break;
		default:
			if (!r || v > acc)
				acc = v;
			if (!r || u > uacc)
				uacc = u;
			break;
		}
	}
	if ((op == FR_MIN || op == FR_MAX) && !is_float(dt) &&
	    !is_signed_int(dt))
		acc = (int64_t)uacc;
	d = (double)acc;
	if (op == FR_AVG) {
		/* The sum is exact; the division rounds once in the type
		 * (through float for f16/bf16, as the library documents). */
		switch (dt) {
		case FR_F64:
			d = (double)acc / nranks;
			break;
		case FR_F32:
			d = (float)acc / (float)nranks;
			break;
		case FR_F16:
			d = f16_to_f32(f32_to_f16((float)acc / (float)nranks));
			break;
		default:
			d = bf16_to_f32(
				f32_to_bf16((float)acc / (float)nranks));
			break;
		}
	}
	memset(raw, 0, 8);
	put_elem(dt, raw, acc, d);
	*val = d;
}

static void fill(fr_dtype_t dt, fr_op_t op, int rank, void *buf, size_t count)
{
	size_t esz = fr_dtype_size(dt);
	unsigned char vals[PATTERN][8];
	unsigned char *p = buf;
	int k = rank % PATTERN;

	/* Convert the PATTERN distinct inputs once, then copy. */
	for (int j = 0; j < PATTERN; j++)
		put_elem(dt, vals[j], pattern(op, j), (double)pattern(op, j));
	for (size_t i = 0; i < count; i++, p += esz) {
		memcpy(p, vals[k], esz);
		if (++k == PATTERN)
			k = 0;
	}
}

/* ---- -Z inputs: known to every rank, exact in f64 ------------------------ */

/*
 * Input of rank r at index i with -Z: a pseudo-random multiple of 2^-23 in
 * [-1, 1) (splitmix64 of rank and index), scaled by 2^-k with k = 0..7 by
 * index blocks of 64, so that int8 blocks mix magnitudes as gradients do.
 * Every value is a multiple of 2^-30 below 1, so the f64 sum of up to 2^22
 * of them is exact, and every rank can compute any rank's input.
 */
static float zval(int rank, size_t i)
{
	uint64_t x = ((uint64_t)rank << 44) ^ (uint64_t)i;
	int k = (int)(((uint64_t)(i >> 6) * 0x9e3779b97f4a7c15ull) >> 61);

	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	x ^= x >> 31;
	return ldexpf((float)((int32_t)(x >> 40) - (1 << 23)), -23 - k);
}

static void fill_z(int rank, float *buf, size_t count)
{
	for (size_t i = 0; i < count; i++)
		buf[i] = zval(rank, i);
}

/* The exact result at index i, in f64 (avg: the exact sum / nranks). */
static double exact_z(fr_op_t op, int nranks, size_t i)
{
	double acc = zval(0, i);

	for (int r = 1; r < nranks; r++) {
		double v = zval(r, i);

		switch (op) {
		case FR_PROD:
			acc *= v;
			break;
		case FR_MIN:
			acc = v < acc ? v : acc;
			break;
		case FR_MAX:
			acc = v > acc ? v : acc;
			break;
		default:
			acc += v;
			break;
		}
	}
	return op == FR_AVG ? acc / nranks : acc;
}

/* 64-bit hash of a buffer: whether the ranks' results agree bit for bit. */
static uint64_t hash_bytes(const void *p, size_t len)
{
	const unsigned char *b = p;
	uint64_t h = 0xcbf29ce484222325ull, w;
	size_t i = 0;

	for (; i + 8 <= len; i += 8) {
		memcpy(&w, b + i, 8);
		h = (h ^ w) * 0x100000001b3ull;
		h ^= h >> 29;
	}
	for (; i < len; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

/* ---- the collectives ---------------------------------------------------- */

/* Whether the collective reduces (takes an operation). */
static bool coll_reduces(int coll)
{
	return coll == COLL_ALLREDUCE || coll == COLL_REDUCE_SCATTER ||
	       coll == COLL_REDUCE;
}

/* Whether the size is the whole buffer of nranks blocks of count. */
static bool coll_blocks(int coll)
{
	return coll == COLL_REDUCE_SCATTER || coll == COLL_ALLGATHER ||
	       coll == COLL_ALLTOALL || coll == COLL_ALLGATHERV;
}

/* Elements in the largest buffer of a call with this count: what nccl-tests
 * reports as the size (send for reduce_scatter, receive for allgather). */
static size_t coll_elems(const struct ctx *c, size_t count)
{
	if (coll_blocks(c->o->coll))
		return count * (size_t)c->nranks;
	return count;
}

/* busbw / algbw, as nccl-tests defines it. */
static double coll_busbw_factor(int coll, int nranks)
{
	double n = nranks;

	switch (coll) {
	case COLL_ALLREDUCE:
		return 2.0 * (n - 1) / n;
	case COLL_REDUCE_SCATTER:
	case COLL_ALLGATHER:
	case COLL_ALLTOALL:
	case COLL_ALLGATHERV:
		return (n - 1) / n;
	case COLL_PINGPONG:
		return 2.0; /* the message crosses twice per round trip */
	default:
		return 1.0;
	}
}

/*
 * Where the result of a call lies in recv (offset and length in bytes) and
 * where the guard bytes start.  In place, reduce_scatter's result is our
 * block of the send buffer; the other blocks are inputs, so the guard is
 * after the whole buffer.
 */
static void coll_result(const struct ctx *c, size_t count, size_t esz,
			size_t *roff, size_t *rlen, size_t *gstart)
{
	size_t blk = count * esz;

	*roff = 0;
	*rlen = blk;
	*gstart = blk;
	switch (c->o->coll) {
	case COLL_REDUCE_SCATTER:
		if (c->o->inplace) {
			*roff = (size_t)c->rank * blk;
			*gstart = blk * (size_t)c->nranks;
		}
		break;
	case COLL_ALLGATHER:
	case COLL_ALLGATHERV:
	case COLL_ALLTOALL:
		*rlen = *gstart = blk * (size_t)c->nranks;
		break;
	default:
		break;
	}
}

/* allgatherv's counts and displacements: every block count elements. */
static void vblocks(struct ctx *c, size_t count)
{
	for (int q = 0; q < c->nranks; q++) {
		c->vcounts[q] = count;
		c->vdispls[q] = (size_t)q * count;
	}
}

/* One collective on the tool's buffers, count being the call's count. */
static int coll_call(struct ctx *c, fr_dtype_t dt, fr_op_t op, size_t count)
{
	struct opts *o = c->o;
	size_t blk = count * fr_dtype_size(dt);
	unsigned char *own = c->recv + (size_t)c->rank * blk;

	switch (o->coll) {
	case COLL_ALLREDUCE:
		if (o->zmode)
			return fr_allreduce_ex(
				c->comm, o->inplace ? FR_IN_PLACE : c->send,
				c->recv, count, dt, op, &c->zopts);
		return fr_allreduce(c->comm, o->inplace ? FR_IN_PLACE : c->send,
				    c->recv, count, dt, op);
	case COLL_REDUCE_SCATTER:
		/* In place as NCCL: recvbuf == sendbuf + rank * recvcount. */
		return fr_reduce_scatter(
			c->comm, o->inplace ? c->recv : c->send,
			o->inplace ? own : c->recv, count, dt, op);
	case COLL_ALLGATHER:
		/* In place as NCCL: sendbuf == recvbuf + rank * sendcount. */
		return fr_allgather(c->comm, o->inplace ? own : c->send,
				    c->recv, count, dt);
	case COLL_REDUCE:
		return fr_reduce(c->comm, o->inplace ? FR_IN_PLACE : c->send,
				 c->recv, count, dt, op, (int)o->root);
	case COLL_ALLTOALL:
		return fr_alltoall(c->comm, o->inplace ? FR_IN_PLACE : c->send,
				   c->recv, count, dt);
	case COLL_ALLGATHERV:
		vblocks(c, count);
		return fr_allgatherv(c->comm, o->inplace ? own : c->send, count,
				     c->recv, c->vcounts, c->vdispls, dt);
	case COLL_PINGPONG: {
		/* rank 0 sends to rank 1, which sends back: a round trip */
		int rc;

		if (c->rank == 0) {
			rc = fr_send(c->comm, c->send, count, dt, 1, 0);
			return rc ? rc
				  : fr_recv(c->comm, c->recv, count, dt, 1, 0);
		}
		if (c->rank == 1) {
			rc = fr_recv(c->comm, c->recv, count, dt, 0, 0);
			return rc ? rc
				  : fr_send(c->comm, c->send, count, dt, 0, 0);
		}
		return 0;
	}
	case COLL_SENDRECV: {
		/* as nccl-tests' sendrecv_perf: to the next rank, from the
		 * previous, at once */
		int n = c->nranks, rc, rc2;
		fr_request_t *rr, *sr;

		rc = fr_irecv(c->comm, c->recv, count, dt,
			      (c->rank + n - 1) % n, 0, &rr);
		if (rc)
			return rc;
		rc = fr_isend(c->comm, c->send, count, dt, (c->rank + 1) % n, 0,
			      &sr);
		if (!rc)
			rc = fr_wait(&sr);
		/* a failed send failed the communicator: this ends too */
		rc2 = fr_wait(&rr);
		return rc ? rc : rc2;
	}
	default:
		return fr_broadcast(c->comm, c->recv, count, dt, (int)o->root);
	}
}

/* The same collective, started without waiting (--overlap-ms). */
static int coll_start(struct ctx *c, fr_dtype_t dt, fr_op_t op, size_t count,
		      fr_request_t **req)
{
	struct opts *o = c->o;
	size_t blk = count * fr_dtype_size(dt);
	unsigned char *own = c->recv + (size_t)c->rank * blk;

	switch (o->coll) {
	case COLL_ALLREDUCE:
		if (o->zmode)
			return fr_iallreduce_ex(
				c->comm, o->inplace ? FR_IN_PLACE : c->send,
				c->recv, count, dt, op, &c->zopts, req);
		return fr_iallreduce(c->comm,
				     o->inplace ? FR_IN_PLACE : c->send,
				     c->recv, count, dt, op, req);
	case COLL_REDUCE_SCATTER:
		return fr_ireduce_scatter(
			c->comm, o->inplace ? c->recv : c->send,
			o->inplace ? own : c->recv, count, dt, op, req);
	case COLL_ALLGATHER:
		return fr_iallgather(c->comm, o->inplace ? own : c->send,
				     c->recv, count, dt, req);
	case COLL_REDUCE:
		return fr_ireduce(c->comm, o->inplace ? FR_IN_PLACE : c->send,
				  c->recv, count, dt, op, (int)o->root, req);
	case COLL_ALLTOALL:
		return fr_ialltoall(c->comm, o->inplace ? FR_IN_PLACE : c->send,
				    c->recv, count, dt, req);
	case COLL_ALLGATHERV:
		vblocks(c, count);
		return fr_iallgatherv(c->comm, o->inplace ? own : c->send,
				      count, c->recv, c->vcounts, c->vdispls,
				      dt, req);
	default:
		return fr_ibroadcast(c->comm, c->recv, count, dt, (int)o->root,
				     req);
	}
}

/*
 * Before the checked call: fresh inputs where the call takes them from the
 * result buffer (in place, the timed loop overwrote them), a sentinel
 * where the result goes and in the guard after it.
 */
static void prepare_check(struct ctx *c, fr_dtype_t dt, fr_op_t op,
			  size_t count)
{
	size_t esz = fr_dtype_size(dt), blk = count * esz;
	size_t roff, rlen, gstart;

	coll_result(c, count, esz, &roff, &rlen, &gstart);
	switch (c->o->coll) {
	case COLL_ALLREDUCE:
	case COLL_REDUCE:
		if (c->o->inplace)
			fill(dt, op, c->rank, c->recv, count);
		else
			memset(c->recv, SENTINEL, blk);
		break;
	case COLL_ALLTOALL:
		if (c->o->inplace)
			fill(dt, op, c->rank, c->recv,
			     count * (size_t)c->nranks);
		else
			memset(c->recv, SENTINEL, rlen);
		break;
	case COLL_REDUCE_SCATTER:
		if (c->o->inplace)
			fill(dt, op, c->rank, c->recv,
			     count * (size_t)c->nranks);
		else
			memset(c->recv, SENTINEL, blk);
		break;
	case COLL_SENDRECV:
	case COLL_PINGPONG:
		memset(c->recv, SENTINEL, blk);
		break;
	case COLL_ALLGATHER:
	case COLL_ALLGATHERV:
		memset(c->recv, SENTINEL, rlen);
		if (c->o->inplace)
			fill(dt, op, c->rank, c->recv + (size_t)c->rank * blk,
			     count);
		break;
	default:
		if (c->rank == c->o->root)
			fill(dt, op, c->rank, c->recv, count);
		else
			memset(c->recv, SENTINEL, blk);
		break;
	}
	memset(c->recv + gstart, SENTINEL,
	       PC_MIN(GUARD_CHECK, c->buflen + GUARD_BYTES - gstart));
}

/*
 * Elements of the result that differ from the exact result, plus elements
 * of an out-of-place send buffer that the library modified, plus guard
 * bytes written past the end of the result.
 *
 * Element j of rank r's input (j counted from the start of its send buffer,
 * or of its block in place for allgather) is pattern((r + j) % PATTERN), so
 * reduce_scatter's element i on rank r is the reduction at index
 * r * count + i of the full buffer, allgather's block b is rank b's input
 * and broadcast's buffer is the root's input; these three compare bits.
 */
static long long count_wrong(struct ctx *c, fr_dtype_t dt, fr_op_t op,
			     size_t count)
{
	size_t esz = fr_dtype_size(dt), blk = count * esz, gend, nsend = 0;
	size_t roff, rlen, gstart;
	unsigned char raw[PATTERN][8], in[PATTERN][8];
	double val[PATTERN];
	long long wrong = 0;
	int coll = c->o->coll;
	int k0 = 0, k;

	for (int j = 0; j < PATTERN; j++) {
		if (coll_reduces(coll))
			expected(dt, op, c->nranks, j, raw[j], &val[j]);
		put_elem(dt, in[j], pattern(op, j), (double)pattern(op, j));
	}
	coll_result(c, count, esz, &roff, &rlen, &gstart);
	switch (coll) {
	case COLL_ALLREDUCE:
	case COLL_REDUCE:
		nsend = count;
		break;
	case COLL_REDUCE_SCATTER:
		k0 = (int)(((size_t)c->rank * count) % PATTERN);
		nsend = count * (size_t)c->nranks;
		break;
	case COLL_ALLGATHER:
	case COLL_ALLGATHERV:
		nsend = count;
		break;
	case COLL_ALLTOALL:
		nsend = count * (size_t)c->nranks;
		break;
	case COLL_SENDRECV:
		/* the previous rank's input */
		k0 = (c->rank + c->nranks - 1) % c->nranks % PATTERN;
		nsend = count;
		break;
	case COLL_PINGPONG:
		/* the other one's input; ranks past 1 take no part */
		k0 = (1 - c->rank) % PATTERN;
		nsend = count;
		if (c->rank > 1)
			count = 0;
		break;
	default:
		k0 = (int)(c->o->root % PATTERN);
		break;
	}

	if (coll == COLL_REDUCE && c->rank != c->o->root) {
		/* no result here */
	} else if (coll_reduces(coll)) {
		k = k0;
		for (size_t i = 0; i < count; i++) {
			const unsigned char *p = c->recv + roff + i * esz;

			/* Floats by value: +0 and -0 are both right. */
			if (is_float(dt) ? get_float(dt, p) != val[k]
					 : memcmp(p, raw[k], esz) != 0)
				wrong++;
			if (++k == PATTERN)
				k = 0;
		}
	} else {
		/* Allgather: block b holds rank b's input; broadcast: the
		 * root's (k0).  Exact data, bit for bit. */
		bool one = coll == COLL_BROADCAST || coll == COLL_SENDRECV ||
			   coll == COLL_PINGPONG;
		size_t nblk = one ? 1 : (size_t)c->nranks;

		for (size_t b = 0; b < nblk; b++) {
			/* alltoall: block b is elements rank * count.. of
			 * rank b's send buffer */
			k = one ? k0
			    : coll == COLL_ALLTOALL
				    ? (int)((b + (size_t)c->rank * count) %
					    PATTERN)
				    : (int)(b % PATTERN);
			for (size_t i = 0; i < count; i++) {
				if (memcmp(c->recv + b * blk + i * esz, in[k],
					   esz))
					wrong++;
				if (++k == PATTERN)
					k = 0;
			}
		}
	}
	/* The send buffer of an out-of-place call must be left alone. */
	if (!c->o->inplace && coll != COLL_BROADCAST) {
		/* element j of our send buffer, from the start */
		k = c->rank % PATTERN;
		for (size_t j = 0; j < nsend; j++) {
			if (memcmp(c->send + j * esz, in[k], esz))
				wrong++;
			if (++k == PATTERN)
				k = 0;
		}
	}
	gend = PC_MIN(gstart + GUARD_CHECK, c->buflen + GUARD_BYTES);
	for (size_t i = gstart; i < gend; i++)
		if (c->recv[i] != SENTINEL)
			wrong++;
	return wrong;
}

/* ---- reporting ----------------------------------------------------------- */

/* The algorithm column: point-to-point has none. */
static const char *row_algo(const struct ctx *c, const struct row *r)
{
	return c->o->coll == COLL_SENDRECV || c->o->coll == COLL_PINGPONG
		       ? "p2p"
		       : fr_algo_name(r->algo);
}

static void lib_error(struct ctx *c, const char *what, int rc)
{
	fprintf(stderr, "fr_allreduce_perf: rank %d: %s failed: %s (%s)%s%s\n",
		c->rank, what, fr_strerror(rc), fr_errname(rc),
		*fr_comm_last_error(c->comm) ? ": " : "",
		fr_comm_last_error(c->comm));
}

/* "sum", ..., or "none" for the collectives without an operation. */
static const char *op_label(const struct ctx *c, fr_op_t op)
{
	return coll_reduces(c->o->coll) ? fr_op_name(op) : "none";
}

/* The algorithm FR_ALGO asks for, as the header shows it. */
static const char *forced_algo(void)
{
	const char *e = getenv("FR_ALGO");

	return e && *e ? e : "auto";
}

/* Who advances collectives, as the header shows it. */
static const char *progress_label(const struct opts *o)
{
	const char *e = getenv("FR_PROGRESS");

	if (o->progress == FR_PROGRESS_THREAD)
		return "thread";
	if (o->progress == FR_PROGRESS_CALLER)
		return "caller";
	return e && *e ? e : "caller";
}

/* wall / max(compute, comm) of an --overlap-ms row; all three are the
 * slowest rank's averages, whatever --stat says. */
static double overlap_ratio(const struct row *r)
{
	double m = r->compute_us > r->mean_us ? r->compute_us : r->mean_us;

	return m > 0 ? r->wall_us / m : 0;
}

static double max_relerr(const struct ctx *c)
{
	double m = 0;

	for (size_t i = 0; i < c->nrows; i++)
		if (c->rows[i].relerr > m)
			m = c->rows[i].relerr;
	return m;
}

static double avg_overlap(const struct ctx *c)
{
	double sum = 0;

	for (size_t i = 0; i < c->nrows; i++)
		sum += overlap_ratio(&c->rows[i]);
	return c->nrows ? sum / (double)c->nrows : 0;
}

static void print_header(struct ctx *c)
{
	struct opts *o = c->o;
	char b1[32], b2[32], b3[32];

	if (o->fmt == FMT_CSV) {
		printf("size,count,type,redop,inplace,time_us,algbw_GBps,busbw_GBps,time_mean_us,time_median_us,time_p99_us,time_min_us,wrong,algo,collective,root%s%s\n",
		       o->overlap_ms > 0 ? ",compute_us,wall_us,overlap" : "",
		       o->zmode ? ",compress,ef,relerr,wire_bytes,zratio" : "");
		fflush(stdout);
		return;
	}
	if (o->fmt != FMT_TABLE)
		return;
	printf("# fr_allreduce_perf: libfastreduce %s, transport %s, nranks %d\n",
	       fr_version(), fr_comm_transport(c->comm), c->nranks);
	printf("#  collective: %s", coll_names[o->coll]);
	if (o->coll == COLL_BROADCAST || o->coll == COLL_REDUCE)
		printf("  root: %ld", o->root);
	printf("  algorithm: %s (FR_ALGO)\n", forced_algo());
	if (o->step)
		pc_format_size(o->step, b3, sizeof(b3));
	else
		snprintf(b3, sizeof(b3), "%ld", o->factor);
	printf("#  minBytes %s maxBytes %s step: %s(%s) warmup iters: %ld iters: %ld\n",
	       pc_format_size(o->minb, b1, sizeof(b1)),
	       pc_format_size(o->maxb, b2, sizeof(b2)), b3,
	       o->step ? "bytes" : "factor", o->warmup, o->iters);
	printf("#  validation: %d  in-place: %d  registered buffers: %d  progress: %s\n",
	       o->check, o->inplace, o->reg, progress_label(o));
	printf("#  communicator created in %.1f ms (the slowest rank's fr_comm_create_from_env)\n",
	       c->create_ms);
	printf("#  time (--stat): %s; median, p99, min: over the %ld calls, of the slowest rank's time per call\n",
	       o->stat == STAT_MEAN ? "mean, the slowest rank's average"
				    : stat_names[o->stat],
	       o->iters);
	printf("#  calls: %s\n",
	       o->barrier ? "each after a barrier, whose time is no call's "
			    "(--barrier)"
			  : "back to back");
	if (o->zmode)
		printf("#  compression: %s  error feedback: %d  (relerr vs the exact f64 result%s)\n",
		       fr_compress_name(o->compress), o->ef,
		       o->ef ? ", mean of " PC_STR(EF_CHECK_CALLS) " calls"
			     : "");
	if (o->overlap_ms > 0)
		printf("#  overlap: %g ms of %s compute; time = collective alone (start + fr_wait)\n",
		       o->overlap_ms,
		       o->compute == COMPUTE_SPIN ? "spin" : "sleep");
	printf("#\n");
	/* Over the time..#wrong columns, as nccl-tests labels them. */
	printf("#%53s%s\n", "", o->inplace ? "in-place" : "out-of-place");
	printf("#%11s %13s %7s %6s %10s %8s %8s %10s %10s %10s %7s %13s",
	       "size", "count", "type", "redop", "time", "algbw", "busbw",
	       "median", "p99", "min", "#wrong", "algo");
	if (o->overlap_ms > 0)
		printf(" %10s %10s %8s", "compute", "wall", "wall/max");
	if (o->zmode)
		printf(" %8s %9s %11s %6s", "compress", "relerr", "wire",
		       "zratio");
	printf("\n");
	printf("#%11s %13s %7s %6s %10s %8s %8s %10s %10s %10s", "(B)",
	       "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "(us)", "(us)",
	       "(us)");
	if (o->overlap_ms > 0 || o->zmode)
		printf(" %7s %13s", "", "");
	if (o->overlap_ms > 0)
		printf(" %10s %10s %8s", "(us)", "(us)", "");
	if (o->zmode)
		printf(" %8s %9s %11s %6s", "", "", "(B/rank)", "");
	printf("\n");
	fflush(stdout);
}

static void print_row(struct ctx *c, const struct row *r)
{
	char w[32];

	if (r->wrong < 0)
		snprintf(w, sizeof(w), "N/A");
	else
		snprintf(w, sizeof(w), "%lld", r->wrong);
	if (c->o->fmt == FMT_CSV) {
		char root[24] = "";

		if (c->o->coll == COLL_BROADCAST || c->o->coll == COLL_REDUCE)
			snprintf(root, sizeof(root), "%ld", c->o->root);
		printf("%zu,%zu,%s,%s,%d,%.3f,%.4f,%.4f,%.3f,%.3f,%.3f,%.3f,%s,%s,%s,%s",
		       r->bytes, r->count, fr_dtype_name(r->dtype),
		       op_label(c, r->op), c->o->inplace, r->time_us, r->algbw,
		       r->busbw, r->mean_us, r->median_us, r->p99_us, r->min_us,
		       r->wrong < 0 ? "" : w, row_algo(c, r),
		       coll_names[c->o->coll], root);
		if (c->o->overlap_ms > 0)
			printf(",%.3f,%.3f,%.4f", r->compute_us, r->wall_us,
			       overlap_ratio(r));
		if (c->o->zmode) {
			printf(",%s,%d,", fr_compress_name(c->o->compress),
			       c->o->ef);
			if (r->relerr >= 0)
				printf("%.6e", r->relerr);
			printf(",%.1f,%.4f", r->wire, r->zratio);
		}
		printf("\n");
	} else if (c->o->fmt == FMT_TABLE) {
		printf(" %11zu %13zu %7s %6s %10.2f %8.3f %8.3f %10.2f %10.2f %10.2f %7s %13s",
		       r->bytes, r->count, fr_dtype_name(r->dtype),
		       op_label(c, r->op), r->time_us, r->algbw, r->busbw,
		       r->median_us, r->p99_us, r->min_us, w, row_algo(c, r));
		if (c->o->overlap_ms > 0)
			printf(" %10.2f %10.2f %8.3f", r->compute_us,
			       r->wall_us, overlap_ratio(r));
		if (c->o->zmode) {
			char re[32], zr[32];

			if (r->relerr >= 0)
				snprintf(re, sizeof(re), "%.3e", r->relerr);
			else
				snprintf(re, sizeof(re), "N/A");
			if (r->zratio > 0)
				snprintf(zr, sizeof(zr), "%.3f", r->zratio);
			else
				snprintf(zr, sizeof(zr), "-");
			printf(" %8s %9s %11.0f %6s",
			       fr_compress_name(c->o->compress), re, r->wire,
			       zr);
		}
		printf("\n");
	}
	fflush(stdout);
}

static void print_footer(struct ctx *c, long long total_wrong)
{
	double sum = 0, avg;

	for (size_t i = 0; i < c->nrows; i++)
		sum += c->rows[i].busbw;
	avg = c->nrows ? sum / (double)c->nrows : 0;
	if (c->o->fmt == FMT_TABLE) {
		if (c->o->check)
			printf("# Out of bounds values : %lld %s\n",
			       total_wrong, total_wrong ? "FAILED" : "OK");
		else
			printf("# Out of bounds values : N/A (not checked)\n");
		printf("# Avg bus bandwidth : %.3f GB/s\n", avg);
		if (c->o->zmode && c->o->check)
			printf("# Max relative error : %.3e (%s%s)\n",
			       max_relerr(c), fr_compress_name(c->o->compress),
			       c->o->ef ? ", error feedback" : "");
		if (c->o->overlap_ms > 0)
			printf("# Avg wall / max(compute, comm) : %.3f (1: full overlap)\n",
			       avg_overlap(c));
		printf("#\n");
	} else if (c->o->fmt == FMT_JSON) {
		printf("{\"tool\":\"fr_allreduce_perf\",\"version\":\"%s\","
		       "\"transport\":\"%s\",\"nranks\":%d,"
		       "\"collective\":\"%s\",",
		       fr_version(), fr_comm_transport(c->comm), c->nranks,
		       coll_names[c->o->coll]);
		if (c->o->coll == COLL_BROADCAST || c->o->coll == COLL_REDUCE)
			printf("\"root\":%ld,", c->o->root);
		else
			printf("\"root\":null,");
		printf("\"inplace\":%s,\"registered\":%s,\"check\":%s,"
		       "\"iters\":%ld,\"warmup\":%ld,\"progress\":\"%s\","
		       "\"stat\":\"%s\",\"barrier\":%s,",
		       c->o->inplace ? "true" : "false",
		       c->o->reg ? "true" : "false",
		       c->o->check ? "true" : "false", c->o->iters,
		       c->o->warmup, progress_label(c->o),
		       stat_names[c->o->stat],
		       c->o->barrier ? "true" : "false");
		if (c->o->zmode)
			printf("\"compress\":\"%s\",\"ef\":%s,",
			       fr_compress_name(c->o->compress),
			       c->o->ef ? "true" : "false");
		if (c->o->overlap_ms > 0)
			printf("\"overlap_ms\":%g,\"compute\":\"%s\",",
			       c->o->overlap_ms,
			       c->o->compute == COMPUTE_SPIN ? "spin"
							     : "sleep");
		printf("\"rows\":[");
		for (size_t i = 0; i < c->nrows; i++) {
			const struct row *r = &c->rows[i];

			printf("%s{\"size\":%zu,\"count\":%zu,\"type\":\"%s\","
			       "\"redop\":\"%s\",\"time_us\":%.3f,"
			       "\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,"
			       "\"time_mean_us\":%.3f,\"time_median_us\":%.3f,"
			       "\"time_p99_us\":%.3f,\"time_min_us\":%.3f,",
			       i ? "," : "", r->bytes, r->count,
			       fr_dtype_name(r->dtype), op_label(c, r->op),
			       r->time_us, r->algbw, r->busbw, r->mean_us,
			       r->median_us, r->p99_us, r->min_us);
			if (r->wrong < 0)
				printf("\"wrong\":null,");
			else
				printf("\"wrong\":%lld,", r->wrong);
			printf("\"algo\":\"%s\"", row_algo(c, r));
			if (c->o->overlap_ms > 0)
				printf(",\"compute_us\":%.3f,\"wall_us\":%.3f,"
				       "\"overlap\":%.4f",
				       r->compute_us, r->wall_us,
				       overlap_ratio(r));
			if (c->o->zmode) {
				if (r->relerr >= 0)
					printf(",\"relerr\":%.6e", r->relerr);
				else
					printf(",\"relerr\":null");
				printf(",\"wire_bytes\":%.1f,\"zratio\":%.4f",
				       r->wire, r->zratio);
			}
			printf("}");
		}
		printf("],\"avg_busbw_GBps\":%.4f,", avg);
		if (c->o->check)
			printf("\"out_of_bounds\":%lld}\n", total_wrong);
		else
			printf("\"out_of_bounds\":null}\n");
	}
	fflush(stdout);
}

static int add_row(struct ctx *c, const struct row *r)
{
	if (c->nrows == c->cap) {
		size_t ncap = c->cap ? 2 * c->cap : 64;
		struct row *n = realloc(c->rows, ncap * sizeof(*n));

		if (!n)
			return -1;
		c->rows = n;
		c->cap = ncap;
	}
	c->rows[c->nrows++] = *r;
	return 0;
}

/* ---- the measurement ----------------------------------------------------- */

/* The tool's own tiny All-Reduces: one double (max) or one u64 (sum). */
static int reduce_max_f64(struct ctx *c, double *v)
{
	int rc;

	c->meta->t[0] = *v;
	rc = fr_allreduce(c->comm, &c->meta->t[0], &c->meta->t[1], 1, FR_F64,
			  FR_MAX);
	if (rc)
		return rc;
	*v = c->meta->t[1];
	return 0;
}

static int reduce_sum_u64(struct ctx *c, uint64_t *v)
{
	int rc;

	c->meta->w[0] = *v;
	rc = fr_allreduce(c->comm, &c->meta->w[0], &c->meta->w[1], 1, FR_U64,
			  FR_SUM);
	if (rc)
		return rc;
	*v = c->meta->w[1];
	return 0;
}

/* Tiny All-Reduces of up to 4 values of the tool's own (sums, maxima). */
static int reduce_f64n(struct ctx *c, double *v, int n, fr_op_t op)
{
	int rc;

	memcpy(c->meta->d, v, (size_t)n * sizeof(*v));
	rc = fr_allreduce(c->comm, c->meta->d, c->meta->d + 4, (size_t)n,
			  FR_F64, op);
	if (!rc)
		memcpy(v, c->meta->d + 4, (size_t)n * sizeof(*v));
	return rc;
}

static int reduce_u64n(struct ctx *c, uint64_t *v, int n, fr_op_t op)
{
	int rc;

	memcpy(c->meta->u, v, (size_t)n * sizeof(*v));
	rc = fr_allreduce(c->comm, c->meta->u, c->meta->u + 4, (size_t)n,
			  FR_U64, op);
	if (!rc)
		memcpy(v, c->meta->u + 4, (size_t)n * sizeof(*v));
	return rc;
}

/* The library call that a failure of the measured collective names. */
static const char *coll_func(const struct ctx *c, bool nonblocking)
{
	if (c->o->coll == COLL_ALLREDUCE && c->o->zmode)
		return nonblocking ? "fr_iallreduce_ex/fr_wait"
				   : "fr_allreduce_ex";
	if (!nonblocking)
		return coll_funcs[c->o->coll];
	switch (c->o->coll) {
	case COLL_ALLREDUCE:
		return "fr_iallreduce/fr_wait";
	case COLL_REDUCE_SCATTER:
		return "fr_ireduce_scatter/fr_wait";
	case COLL_ALLGATHER:
		return "fr_iallgather/fr_wait";
	case COLL_REDUCE:
		return "fr_ireduce/fr_wait";
	case COLL_ALLTOALL:
		return "fr_ialltoall/fr_wait";
	case COLL_ALLGATHERV:
		return "fr_iallgatherv/fr_wait";
	case COLL_SENDRECV:
		return "fr_isend/fr_irecv/fr_wait";
	case COLL_PINGPONG:
		return "fr_send/fr_recv";
	default:
		return "fr_ibroadcast/fr_wait";
	}
}

/* --overlap-ms: the application's computation, with no library call. */
static void compute(const struct opts *o)
{
	uint64_t ns = (uint64_t)(o->overlap_ms * 1e6);

	if (o->compute == COMPUTE_SPIN) {
		uint64_t end = pc_now_ns() + ns;
		volatile uint64_t sink = 0;

		while (pc_now_ns() < end)
			for (int i = 0; i < 256; i++)
				sink += (uint64_t)i;
	} else {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += (time_t)(ns / 1000000000u);
		ts.tv_nsec += (long)(ns % 1000000000u);
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts,
				       NULL) == EINTR)
			;
	}
}

/* What one timed loop does per iteration. */
enum phase {
	PH_BLOCKING, /* the blocking call */
	PH_COMM,     /* start, fr_wait */
	PH_COMPUTE,  /* compute only */
	PH_OVERLAP   /* start, compute, fr_wait */
};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Per-call statistics of one timed loop, in microseconds. */
struct callstats {
	double mean, median, p99, min;
};

/*
 * Median, p99 and min of n per-call times (sorted in place).  The median of
 * an even number is the mean of the two middle ones; p99 is the nearest
 * rank, the ceil(0.99 n)-th smallest, so below 100 calls it is the largest.
 * mpi_coll_bench.c computes them the same way.
 */
static void call_stats(double *t, long n, struct callstats *st)
{
	long k = (long)ceil(0.99 * (double)n);

	qsort(t, (size_t)n, sizeof(*t), cmp_double);
	st->min = t[0];
	st->median = n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
	st->p99 = t[(k < 1 ? 1 : k) - 1];
}

/*
 * Time n iterations of one phase: line the ranks up so the clock starts
 * together everywhere, time the loop, and take the slowest rank's average
 * (us per iteration).  With n_algo/delta, also the algorithm of the last
 * call and the counters' growth over the loop (before the tool's own
 * All-Reduces change them).  With st, every call is also timed on its own
 * (one clock read after each call, nothing else in the loop), and after
 * the loop one All-Reduce (max) of the n per-call times and the average
 * gives, per call, the slowest rank's time: st gets their median, p99 and
 * min, and the slowest rank's average as the mean.  With --barrier, a
 * barrier before every iteration, whose time and wire bytes are left out
 * of all of these.  Reports its own errors; 0 or -1.
 */
static int timed(struct ctx *c, fr_dtype_t dt, fr_op_t op, size_t count,
		 enum phase ph, long n, double *us, int *algo,
		 fr_stats_t *delta, struct callstats *st)
{
	fr_stats_t s0 = {.size = sizeof(s0)}, s1 = {.size = sizeof(s1)};
	fr_request_t *req;
	double *pc = st ? c->percall : NULL;
	/* idle, bar_wire: --barrier's time, and its bytes on the wire */
	uint64_t t0, t1, prev, now, idle = 0, bar_wire = 0;
	double t = 0;
	int rc = 0;

	rc = reduce_max_f64(c, &t);
	if (rc)
		goto fail_meta;
	if (delta)
		fr_comm_stats(c->comm, &s0);
	t0 = prev = pc_now_ns();
	for (long i = 0; i < n && !rc; i++) {
		if (c->o->barrier) {
			/* no call runs into the next; under delay the
			 * ranks still leave it as far apart as they came
			 * (perf/sim/README.md), so it orders the calls but
			 * is no common start; its time and its bytes are
			 * no call's */
			fr_stats_t b0 = {.size = sizeof(b0)},
				   b1 = {.size = sizeof(b1)};

			if (delta)
				fr_comm_stats(c->comm, &b0);
			rc = fr_barrier(c->comm);
			if (rc) {
				lib_error(c, "fr_barrier (--barrier)", rc);
				return -1;
			}
			if (delta) {
				fr_comm_stats(c->comm, &b1);
				bar_wire += b1.wire_bytes - b0.wire_bytes;
			}
			now = pc_now_ns();
			idle += now - prev;
			prev = now;
		}
		switch (ph) {
		case PH_BLOCKING:
			rc = coll_call(c, dt, op, count);
			break;
		case PH_COMM:
			rc = coll_start(c, dt, op, count, &req);
			if (!rc)
				rc = fr_wait(&req);
			break;
		case PH_COMPUTE:
			compute(c->o);
			break;
		default:
			rc = coll_start(c, dt, op, count, &req);
			if (rc)
				break;
			compute(c->o);
			rc = fr_wait(&req);
			break;
		}
		if (pc || c->o->barrier) {
			now = pc_now_ns();
			if (pc)
				pc[i] = (double)(now - prev);
			prev = now;
		}
	}
	t1 = (pc || c->o->barrier ? prev : pc_now_ns()) - idle;
	if (rc) {
		lib_error(c, coll_func(c, ph != PH_BLOCKING), rc);
		return -1;
	}
	if (algo)
		*algo = fr_comm_last_algo(c->comm);
	if (delta) {
		fr_comm_stats(c->comm, &s1);
		delta->wire_bytes = s1.wire_bytes - s0.wire_bytes - bar_wire;
		delta->compress_in_bytes =
			s1.compress_in_bytes - s0.compress_in_bytes;
		delta->compress_out_bytes =
			s1.compress_out_bytes - s0.compress_out_bytes;
	}
	t = (double)(t1 - t0) / 1e3 / (double)n;
	if (!pc) {
		rc = reduce_max_f64(c, &t);
		if (rc)
			goto fail_meta;
		*us = t;
		return 0;
	}
	/* Per call the slowest rank, and the slowest rank's average, in one
	 * All-Reduce after the timed loop. */
	pc[n] = t * 1e3;
	rc = fr_allreduce(c->comm, FR_IN_PLACE, pc, (size_t)n + 1, FR_F64,
			  FR_MAX);
	if (rc)
		goto fail_meta;
	st->mean = pc[n] / 1e3;
	for (long i = 0; i < n; i++)
		pc[i] /= 1e3;
	/* in the order of the calls, before call_stats sorts them */
	for (long i = 0; c->calls && i < n; i++)
		fprintf(c->calls, "%zu\t%s\t%s\t%ld\t%.3f\n",
			count * fr_dtype_size(dt), fr_dtype_name(dt),
			op_label(c, op), i, pc[i]);
	call_stats(pc, n, st);
	*us = st->mean;
	return 0;

fail_meta:
	lib_error(c, "fr_allreduce (timing exchange)", rc);
	return -1;
}

/*
 * -Z: the check.  One call, or with --ef EF_CHECK_CALLS calls on the same
 * inputs with the residual starting from zero, whose mean result is what
 * is compared (error feedback makes the mean converge, not one result).
 * relerr = ||result - exact|| / ||exact||, each rank summing the squares of
 * its share of the elements.  The format decides how far the result may
 * be from the exact one, so #wrong counts only what holds for every
 * format: elements that are not finite (the exact results are), send
 * buffer elements an out-of-place call changed, guard bytes overwritten,
 * and one for each rank whose result is not bit-identical to the others'.
 */
static int check_z(struct ctx *c, fr_op_t op, size_t count, struct row *r,
		   long long *total_wrong)
{
	int calls = c->o->ef ? EF_CHECK_CALLS : 1;
	float *res = (float *)c->recv;
	const float *snd = (const float *)c->send;
	size_t blk = count * sizeof(float), per, lo, hi;
	size_t gend = PC_MIN(blk + GUARD_CHECK, c->buflen + GUARD_BYTES);
	uint64_t h[2], own, wrong = 0;
	double sums[3] = {0, 0, 0};
	int rc;

	if (c->o->ef)
		memset(c->residual, 0, blk);
	for (int k = 0; k < calls; k++) {
		if (c->o->inplace)
			fill_z(c->rank, res, count);
		else
			memset(c->recv, SENTINEL, blk);
		memset(c->recv + blk, SENTINEL, gend - blk);
		rc = coll_call(c, FR_F32, op, count);
		if (rc) {
			lib_error(c, coll_func(c, false), rc);
			return -1;
		}
		if (calls == 1)
			continue;
		for (size_t i = 0; i < count; i++)
			c->acc[i] = k ? c->acc[i] + res[i] : res[i];
	}
	for (size_t i = 0; i < count; i++)
		if (!isfinite(res[i]))
			wrong++;
	if (!c->o->inplace)
		for (size_t i = 0; i < count; i++) {
			float v = zval(c->rank, i);

			if (memcmp(&snd[i], &v, sizeof(v)))
				wrong++;
		}
	for (size_t i = blk; i < gend; i++)
		if (c->recv[i] != SENTINEL)
			wrong++;
	per = (count + (size_t)c->nranks - 1) / (size_t)c->nranks;
	lo = PC_MIN((size_t)c->rank * per, count);
	hi = PC_MIN(lo + per, count);
	for (size_t i = lo; i < hi; i++) {
		double e = exact_z(op, c->nranks, i);
		double got = calls > 1 ? (double)c->acc[i] / calls : res[i];

		sums[0] += (got - e) * (got - e);
		sums[1] += e * e;
	}
	own = hash_bytes(res, blk);
	h[0] = own;
	h[1] = ~own;
	rc = reduce_u64n(c, h, 2, FR_MAX); /* h[1] = ~(the least hash) */
	if (rc)
		goto fail_meta;
	if (h[0] != ~h[1] && own != h[0])
		wrong++; /* the ranks' results differ: count those below max */
	sums[2] = (double)wrong;
	rc = reduce_f64n(c, sums, 3, FR_SUM);
	if (rc)
		goto fail_meta;
	r->relerr = sums[1] > 0 ? sqrt(sums[0] / sums[1]) : sqrt(sums[0]);
	r->wrong = (long long)sums[2];
	*total_wrong += r->wrong;
	return 0;

fail_meta:
	lib_error(c, "fr_allreduce (check exchange)", rc);
	return -1;
}

/* count: the call's count argument (recvcount for reduce_scatter,
 * sendcount for allgather), as nccl-tests' count column shows it. */
static int run_size(struct ctx *c, fr_dtype_t dt, fr_op_t op, size_t count,
		    long long *total_wrong)
{
	struct opts *o = c->o;
	size_t esz = fr_dtype_size(dt), bytes = coll_elems(c, count) * esz;
	struct row r = {.bytes = bytes,
			.count = count,
			.dtype = dt,
			.op = op,
			.wrong = -1,
			.relerr = -1};
	bool ovl = o->overlap_ms > 0;
	fr_stats_t d = {.size = sizeof(d)};
	struct callstats st;
	uint64_t w;
	double t;
	int rc;

	/* A new buffer for error feedback: its residual starts at zero. */
	if (o->ef)
		memset(c->residual, 0, count * sizeof(float));
	for (long i = 0; i < o->warmup; i++) {
		fr_request_t *req;

		if (ovl) {
			rc = coll_start(c, dt, op, count, &req);
			if (!rc)
				rc = fr_wait(&req);
		} else {
			rc = coll_call(c, dt, op, count);
		}
		if (rc) {
			lib_error(c, coll_func(c, ovl), rc);
			return -1;
		}
	}
	/* The collective alone: blocking, or with --overlap-ms started and
	 * waited for, as the overlapped loop does. */
	if (timed(c, dt, op, count, ovl ? PH_COMM : PH_BLOCKING, o->iters, &t,
		  &r.algo, &d, &st))
		return -1;
	r.mean_us = st.mean;
	r.median_us = st.median;
	r.p99_us = st.p99;
	r.min_us = st.min;
	switch (o->stat) {
	case STAT_MEDIAN:
		t = st.median;
		break;
	case STAT_P99:
		t = st.p99;
		break;
	case STAT_MIN:
		t = st.min;
		break;
	default:
		t = st.mean;
		break;
	}
	r.time_us = t;
	r.algbw = t > 0 ? (double)bytes / (t * 1e3) : 0; /* B/ns = GB/s */
	r.busbw = r.algbw * coll_busbw_factor(o->coll, c->nranks);
	if (ovl && (timed(c, dt, op, count, PH_COMPUTE, o->iters, &r.compute_us,
			  NULL, NULL, NULL) ||
		    timed(c, dt, op, count, PH_OVERLAP, o->iters, &r.wall_us,
			  NULL, NULL, NULL)))
		return -1;
	if (o->zmode) {
		uint64_t v[3] = {d.wire_bytes, d.compress_in_bytes,
				 d.compress_out_bytes};

		rc = reduce_u64n(c, v, 3, FR_SUM);
		if (rc)
			goto fail_meta;
		r.wire = (double)v[0] / (double)o->iters / c->nranks;
		r.zratio = v[2] ? (double)v[1] / (double)v[2] : 0;
	}

	if (o->check && o->zmode) {
		if (check_z(c, op, count, &r, total_wrong))
			return -1;
	} else if (o->check) {
		prepare_check(c, dt, op, count);
		rc = coll_call(c, dt, op, count);
		if (rc) {
			lib_error(c, coll_func(c, false), rc);
			return -1;
		}
		w = (uint64_t)count_wrong(c, dt, op, count);
		rc = reduce_sum_u64(c, &w);
		if (rc)
			goto fail_meta;
		r.wrong = (long long)w;
		*total_wrong += r.wrong;
	}
	if (add_row(c, &r)) {
		fprintf(stderr, "fr_allreduce_perf: out of memory\n");
		return -1;
	}
	if (c->rank == 0)
		print_row(c, &r);
	return 0;

fail_meta:
	lib_error(c, "fr_allreduce (timing/check exchange)", rc);
	return -1;
}

static int run_all(struct ctx *c, long long *total_wrong)
{
	struct opts *o = c->o;
	/* Allgather and broadcast take no operation: one pass, inputs of
	 * sum's pattern, "none" in the redop column. */
	int nops = coll_reduces(o->coll) ? o->nops : 1;

	for (int d = 0; d < o->ndtypes; d++) {
		fr_dtype_t dt = o->dtypes[d];
		size_t esz = fr_dtype_size(dt);

		for (int p = 0; p < nops; p++) {
			fr_op_t op = coll_reduces(o->coll) ? o->ops[p] : FR_SUM;
			size_t size = o->minb;

			if (op == FR_AVG && !is_float(dt))
				continue; /* only with -o all: see parse */
			/* Inputs once per (type, op) for the whole sweep;
			 * the checked run refills what it needs. */
			if (o->zmode)
				fill_z(c->rank,
				       (float *)(o->inplace ? c->recv
							    : c->send),
				       c->buflen / esz);
			else
				fill(dt, op, c->rank,
				     o->inplace ? c->recv : c->send,
				     c->buflen / esz);
			for (;;) {
				/* Per rank for reduce_scatter and allgather,
				 * whose size is the whole buffer. */
				size_t count = size / esz;

				if (coll_blocks(o->coll))
					count /= (size_t)c->nranks;
				if (count &&
				    run_size(c, dt, op, count, total_wrong))
					return -1;
				if (size >= o->maxb)
					break;
				if (o->step)
					size = size > o->maxb - o->step
						       ? o->maxb + 1
						       : size + o->step;
				else
					size = size > o->maxb / (size_t)o->factor
						       ? o->maxb + 1
						       : size * (size_t)o->factor;
				if (size > o->maxb)
					break;
			}
		}
	}
	return 0;
}

/* ---- setup --------------------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f,
		"Usage: fr_allreduce_perf [OPTIONS]\n"
		"Measure libfastreduce collectives (run it under frrun, mpirun, srun, torchrun).\n"
		"\n"
		"  -C, --collective COLL    allreduce (default), reduce_scatter, allgather,\n"
		"                           broadcast, reduce, alltoall, allgatherv or\n"
		"                           sendrecv (to the next rank, from the previous),\n"
		"                           or pingpong (rank 0 to 1 and back; the time is\n"
		"                           the round trip, busbw = 2 size / time)\n"
		"                           (sizes and busbw as nccl-tests; allgatherv\n"
		"                           as allgather, with equal blocks)\n"
		"  -r, --root RANK          the root of broadcast and reduce (default 0)\n"
		"  -b, --minbytes SIZE      smallest message (default 8; K/M/G suffixes)\n"
		"  -e, --maxbytes SIZE      largest message (default 64M)\n"
		"  -f, --stepfactor F       multiply the size by F (default 2)\n"
		"  -i, --stepbytes SIZE     add SIZE instead of multiplying\n"
		"  -n, --iters N            timed iterations per size (default 20)\n"
		"  -w, --warmup_iters N     untimed iterations first (default 5)\n"
		"      --stat STAT          what time, algbw and busbw use: mean (default: the\n"
		"                           slowest rank's average, as nccl-tests), median,\n"
		"                           p99 or min over the calls of the slowest rank's\n"
		"                           time per call (the median, p99 and min columns)\n"
		"      --calls FILE         rank 0 writes every timed call's time there, in\n"
		"                           order: bytes, dtype, op, call, us (per call the\n"
		"                           slowest rank)\n"
		"      --barrier            a barrier before every timed call, outside its\n"
		"                           time (as the OSU benchmarks): no call runs into\n"
		"                           the next (default: back to back, as nccl-tests)\n"
		"  -d, --datatype TYPE      f32 (default), f64, f16, bf16, i8, u8, i32, u32,\n"
		"                           i64, u64, or all\n"
		"  -o, --op OP              sum (default), prod, min, max, avg, or all\n"
		"                           (allreduce and reduce_scatter only)\n"
		"  -c, --check 0|1          verify the results (default 1)\n"
		"  -I, --inplace 0|1        in place (default 0: out of place; broadcast\n"
		"                           is always in place)\n"
		"  -R, --register 0|1       register buffers once (default 1; 0: rely on\n"
		"                           the library's registration cache)\n"
		"  -t, --timeout MS         peer timeout in milliseconds (FR_TIMEOUT_MS)\n"
		"  -Z, --compress FMT       f32 allreduce with none, bf16, fp16 or int8 on the\n"
		"                           wire (fr_allreduce_ex); adds compress, relerr (vs\n"
		"                           the exact result), wire (B/rank/call), zratio\n"
		"      --ef                 with -Z: error feedback, a residual per buffer\n"
		"      --overlap-ms MS      also time MS of compute alone and overlapped with\n"
		"                           the collective (start, compute, fr_wait)\n"
		"      --compute sleep|spin what that compute does (default sleep)\n"
		"      --progress thread|caller  the communicator's progress mode (default:\n"
		"                           FR_PROGRESS, else caller)\n"
		"      --csv                CSV rows on stdout instead of the table\n"
		"      --json               one JSON object on stdout instead of the table\n"
		"  -h, --help               this text\n"
		"\n"
		"FR_ALGO=ring|rd|rabenseifner|tree forces an algorithm; the algo column\n"
		"shows the one each row ran.\n");
}

static int bad(const char *what, const char *arg)
{
	fprintf(stderr,
		"fr_allreduce_perf: invalid %s '%s'\n"
		"Try 'fr_allreduce_perf --help' for more information.\n",
		what, arg);
	return 2;
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
	static const struct option lopts[] = {
		{"minbytes", required_argument, NULL, 'b'},
		{"maxbytes", required_argument, NULL, 'e'},
		{"stepfactor", required_argument, NULL, 'f'},
		{"stepbytes", required_argument, NULL, 'i'},
		{"iters", required_argument, NULL, 'n'},
		{"warmup_iters", required_argument, NULL, 'w'},
		{"datatype", required_argument, NULL, 'd'},
		{"op", required_argument, NULL, 'o'},
		{"check", required_argument, NULL, 'c'},
		{"inplace", required_argument, NULL, 'I'},
		{"register", required_argument, NULL, 'R'},
		{"timeout", required_argument, NULL, 't'},
		{"csv", no_argument, NULL, OPT_CSV},
		{"json", no_argument, NULL, OPT_JSON},
		{"collective", required_argument, NULL, 'C'},
		{"coll", required_argument, NULL, 'C'},
		{"root", required_argument, NULL, 'r'},
		{"compress", required_argument, NULL, 'Z'},
		{"ef", no_argument, NULL, OPT_EF},
		{"overlap-ms", required_argument, NULL, OPT_OVERLAP},
		{"compute", required_argument, NULL, OPT_COMPUTE},
		{"progress", required_argument, NULL, OPT_PROGRESS},
		{"stat", required_argument, NULL, OPT_STAT},
		{"calls", required_argument, NULL, OPT_CALLS},
		{"barrier", no_argument, NULL, OPT_BARRIER},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	/* nccl-tests' spellings are accepted too. */
	static const struct {
		const char *name;
		int coll;
	} coll_alias[] = {
		{"all_reduce", COLL_ALLREDUCE},
		{"reducescatter", COLL_REDUCE_SCATTER},
		{"all_gather", COLL_ALLGATHER},
		{"bcast", COLL_BROADCAST},
		{"all_to_all", COLL_ALLTOALL},
	};
	const char *dname = "f32", *oname = "sum";
	int ch;

	memset(o, 0, sizeof(*o));
	o->minb = 8;
	o->maxb = 64u << 20;
	o->factor = 2;
	o->iters = 20;
	o->warmup = 5;
	o->check = true;
	o->reg = true;
	o->fmt = FMT_TABLE;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, ":b:e:f:i:n:w:d:o:c:I:R:t:C:r:Z:h",
				 lopts, NULL)) != -1) {
		switch (ch) {
		case 'b':
			if (pc_parse_size(optarg, &o->minb))
				return bad("minimum size", optarg);
			break;
		case 'e':
			if (pc_parse_size(optarg, &o->maxb))
				return bad("maximum size", optarg);
			break;
		case 'f':
			if (pc_parse_long(optarg, 2, 1 << 20, &o->factor))
				return bad("step factor (integer >= 2)",
					   optarg);
			o->step = 0;
			break;
		case 'i':
			if (pc_parse_size(optarg, &o->step) || !o->step)
				return bad("step size", optarg);
			break;
		case 'n':
			if (pc_parse_long(optarg, 1, 1000000000, &o->iters))
				return bad("iteration count", optarg);
			break;
		case 'w':
			if (pc_parse_long(optarg, 0, 1000000000, &o->warmup))
				return bad("warm-up count", optarg);
			break;
		case 'd':
			dname = optarg;
			break;
		case 'o':
			oname = optarg;
			break;
		case 'c':
			if (pc_parse_bool(optarg, &o->check))
				return bad("-c value (0 or 1)", optarg);
			break;
		case 'I':
			if (pc_parse_bool(optarg, &o->inplace))
				return bad("-I value (0 or 1)", optarg);
			break;
		case 'R':
			if (pc_parse_bool(optarg, &o->reg))
				return bad("-R value (0 or 1)", optarg);
			break;
		case 't':
			if (pc_parse_long(optarg, 1, 86400000, &o->timeout_ms))
				return bad("timeout (milliseconds)", optarg);
			break;
		case OPT_CSV:
			o->fmt = FMT_CSV;
			break;
		case OPT_JSON:
			o->fmt = FMT_JSON;
			break;
		case 'C':
			o->coll = -1;
			for (int i = 0; i < COLL_COUNT; i++)
				if (!strcmp(optarg, coll_names[i]))
					o->coll = i;
			for (size_t i = 0; i < PC_ARRAY_SIZE(coll_alias); i++)
				if (!strcmp(optarg, coll_alias[i].name))
					o->coll = coll_alias[i].coll;
			if (o->coll < 0)
				return bad(
					"collective (allreduce, reduce_scatter, allgather, broadcast)",
					optarg);
			break;
		case 'r':
			/* Checked against the number of ranks once known. */
			if (pc_parse_long(optarg, 0, 1 << 30, &o->root))
				return bad("root rank", optarg);
			break;
		case 'Z': {
			fr_compress_t z;

			if (fr_compress_from_name(optarg, &z))
				return bad(
					"compression (none, bf16, fp16, int8)",
					optarg);
			o->compress = (int)z;
			o->zmode = true;
			break;
		}
		case OPT_EF:
			o->ef = true;
			o->zmode = true;
			break;
		case OPT_OVERLAP:
			if (pc_parse_seconds(optarg, &o->overlap_ms) ||
			    !(o->overlap_ms > 0) || o->overlap_ms > 1e6)
				return bad("--overlap-ms (milliseconds, > 0)",
					   optarg);
			break;
		case OPT_COMPUTE:
			if (!strcmp(optarg, "sleep"))
				o->compute = COMPUTE_SLEEP;
			else if (!strcmp(optarg, "spin"))
				o->compute = COMPUTE_SPIN;
			else
				return bad("--compute (sleep or spin)", optarg);
			break;
		case OPT_PROGRESS:
			if (!strcmp(optarg, "thread"))
				o->progress = FR_PROGRESS_THREAD;
			else if (!strcmp(optarg, "caller"))
				o->progress = FR_PROGRESS_CALLER;
			else
				return bad("--progress (thread or caller)",
					   optarg);
			break;
		case OPT_STAT:
			o->stat = -1;
			for (int i = 0; i < STAT_COUNT; i++)
				if (!strcmp(optarg, stat_names[i]))
					o->stat = i;
			if (o->stat < 0)
				return bad("--stat (mean, median, p99, min)",
					   optarg);
			break;
		case OPT_CALLS:
			o->calls = optarg;
			break;
		case OPT_BARRIER:
			o->barrier = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case ':':
			return bad("use of option without a value",
				   argv[optind - 1]);
		default:
			return bad("option", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return bad("argument", argv[optind]);
	if (!o->minb)
		return bad("minimum size (must be at least 1)", "0");
	if (o->minb > o->maxb)
		return bad("size range (-b is larger than -e)", "");

	if (o->zmode && o->coll != COLL_ALLREDUCE)
		return bad("-Z/--ef with this collective (allreduce only)",
			   coll_names[o->coll]);
	if (o->ef && o->compress == FR_COMPRESS_NONE)
		return bad("--ef without compression (-Z bf16, fp16 or int8)",
			   fr_compress_name(o->compress));
	if (o->zmode && !strcmp(dname, "all")) {
		/* compression is for f32 only */
		o->dtypes[o->ndtypes++] = FR_F32;
	} else if (!strcmp(dname, "all")) {
		for (int d = 0; d < FR_DTYPE_COUNT; d++)
			o->dtypes[o->ndtypes++] = (fr_dtype_t)d;
	} else if (fr_dtype_from_name(dname, &o->dtypes[0])) {
		return bad("datatype", dname);
	} else {
		o->ndtypes = 1;
	}
	if (!strcmp(oname, "all")) {
		for (int p = 0; p < FR_OP_COUNT; p++)
			o->ops[o->nops++] = (fr_op_t)p;
	} else if (fr_op_from_name(oname, &o->ops[0])) {
		return bad("operation", oname);
	} else {
		o->nops = 1;
	}
	if (o->zmode && o->dtypes[0] != FR_F32)
		return bad("datatype for -Z/--ef (f32 only)", dname);
	/* Broadcast has one buffer: it is in place by nature. */
	if (o->coll == COLL_BROADCAST)
		o->inplace = true;
	/* A send and a receive: two buffers by nature. */
	if (o->coll == COLL_SENDRECV || o->coll == COLL_PINGPONG)
		o->inplace = false;
	if ((o->coll == COLL_SENDRECV || o->coll == COLL_PINGPONG) &&
	    o->overlap_ms > 0)
		return bad("collective for --overlap-ms (one request per call)",
			   "sendrecv");
	/* An explicit avg on an integer type is a mistake, not a skip. */
	if (coll_reduces(o->coll) && o->ndtypes == 1 && o->nops == 1 &&
	    o->ops[0] == FR_AVG && !is_float(o->dtypes[0]))
		return bad("operation for an integer type (avg needs floats)",
			   oname);
	return 0;
}

static void *alloc_buf(size_t len)
{
	size_t total = (len + GUARD_BYTES + 4095) & ~(size_t)4095;
	void *p = aligned_alloc(4096, total);

	if (p)
		memset(p, SENTINEL, total); /* also faults the pages in */
	return p;
}

int main(int argc, char **argv)
{
	struct opts o;
	struct ctx c;
	fr_config_t cfg;
	long long total_wrong = 0;
	int rc, ret = 1;

	rc = parse_opts(argc, argv, &o);
	if (rc)
		return rc;
	memset(&c, 0, sizeof(c));
	c.o = &o;

	fr_config_init(&cfg);
	if (o.timeout_ms)
		cfg.timeout_ms = (int)o.timeout_ms;
	cfg.progress = o.progress;
	c.create_ms = (double)pc_now_ns();
	rc = fr_comm_create_from_env(&cfg, &c.comm);
	if (rc) {
		fprintf(stderr,
			"fr_allreduce_perf: cannot create the communicator: %s (%s): %s\n",
			fr_strerror(rc), fr_errname(rc),
			fr_comm_last_error(NULL));
		return 1;
	}
	c.create_ms = ((double)pc_now_ns() - c.create_ms) / 1e6;
	rc = fr_allreduce(c.comm, FR_IN_PLACE, &c.create_ms, 1, FR_F64, FR_MAX);
	if (rc) {
		fprintf(stderr, "fr_allreduce_perf: %s\n",
			fr_comm_last_error(c.comm));
		return 1;
	}
	c.rank = fr_comm_rank(c.comm);
	c.nranks = fr_comm_size(c.comm);
	if ((o.coll == COLL_BROADCAST || o.coll == COLL_REDUCE) &&
	    o.root >= c.nranks) {
		if (c.rank == 0)
			fprintf(stderr,
				"fr_allreduce_perf: invalid root rank '%ld' (there are %d ranks)\n",
				o.root, c.nranks);
		fr_comm_destroy(c.comm);
		return 2;
	}

	/* Room for the largest message of any requested type. */
	c.buflen = o.maxb < 64 ? 64 : o.maxb;
	c.recv = alloc_buf(c.buflen);
	c.send = o.inplace ? c.recv : alloc_buf(c.buflen);
	c.vcounts = calloc((size_t)c.nranks, sizeof(size_t));
	c.vdispls = calloc((size_t)c.nranks, sizeof(size_t));
	if (!c.vcounts || !c.vdispls) {
		fprintf(stderr, "fr_allreduce_perf: out of memory\n");
		return 1;
	}
	c.meta = alloc_buf(sizeof(*c.meta));
	/* Per-call times of a row, and its mean, for one All-Reduce (max). */
	c.percall = alloc_buf(((size_t)o.iters + 1) * sizeof(double));
	if (o.ef) {
		c.residual = calloc(c.buflen / sizeof(float), sizeof(float));
		if (o.check)
			c.acc = malloc(c.buflen);
	}
	fr_coll_opts_init(&c.zopts);
	c.zopts.compress = o.compress;
	c.zopts.residual = c.residual;
	if (!c.recv || !c.send || !c.meta || !c.percall ||
	    (o.ef && !c.residual) || (o.ef && o.check && !c.acc)) {
		fprintf(stderr,
			"fr_allreduce_perf: rank %d: cannot allocate 2 x %zu bytes\n",
			c.rank, c.buflen);
		goto out;
	}
	if (o.reg) {
		rc = fr_mem_register(c.comm, c.recv, c.buflen, &c.recv_mem);
		if (!rc && !o.inplace)
			rc = fr_mem_register(c.comm, c.send, c.buflen,
					     &c.send_mem);
		if (!rc)
			rc = fr_mem_register(c.comm, c.meta, sizeof(*c.meta),
					     &c.meta_mem);
		if (!rc)
			rc = fr_mem_register(c.comm, c.percall,
					     ((size_t)o.iters + 1) *
						     sizeof(double),
					     &c.percall_mem);
		if (rc) {
			lib_error(&c, "fr_mem_register", rc);
			goto out;
		}
	}

	if (o.calls) {
		/* only rank 0 writes, and every rank stops if it cannot */
		int32_t ok = 1;

		if (c.rank == 0) {
			c.calls = fopen(o.calls, "w");
			if (c.calls)
				fprintf(c.calls,
					"# bytes\tdtype\top\tcall\tus\n");
			else
				fprintf(stderr,
					"fr_allreduce_perf: --calls %s: %s\n",
					o.calls, strerror(errno));
			ok = c.calls != NULL;
		}
		rc = fr_broadcast(c.comm, &ok, 1, FR_I32, 0);
		if (rc) {
			lib_error(&c, "fr_broadcast", rc);
			goto out;
		}
		if (!ok)
			goto out;
	}
	if (c.rank == 0)
		print_header(&c);
	if (run_all(&c, &total_wrong))
		goto out;
	if (c.rank == 0)
		print_footer(&c, total_wrong);
	/* Wait for rank 0's report before anyone exits: a launcher that
	 * stops the job at the first failing rank would cut it off. */
	rc = fr_barrier(c.comm);
	if (rc) {
		lib_error(&c, "fr_barrier", rc);
		goto out;
	}
	ret = total_wrong ? 1 : 0;

out:
	/* Teardown continues past a failure: free everything we hold. */
	rc = fr_mem_deregister(c.percall_mem);
	if (rc)
		lib_error(&c, "fr_mem_deregister", rc);
	rc = fr_mem_deregister(c.meta_mem);
	if (rc)
		lib_error(&c, "fr_mem_deregister", rc);
	rc = fr_mem_deregister(c.send_mem);
	if (rc)
		lib_error(&c, "fr_mem_deregister", rc);
	rc = fr_mem_deregister(c.recv_mem);
	if (rc)
		lib_error(&c, "fr_mem_deregister", rc);
	rc = fr_comm_destroy(c.comm);
	if (rc) {
		fprintf(stderr,
			"fr_allreduce_perf: rank %d: fr_comm_destroy failed: %s\n",
			c.rank, fr_strerror(rc));
		ret = 1;
	}
	if (c.send != c.recv)
		free(c.send);
	free(c.recv);
	free(c.vcounts);
	free(c.vdispls);
	free(c.meta);
	free(c.percall);
	free(c.residual);
	free(c.acc);
	free(c.rows);
	if (c.calls && fclose(c.calls)) {
		fprintf(stderr, "fr_allreduce_perf: --calls %s: %s\n", o.calls,
			strerror(errno));
		ret = 1;
	}
	return ret;
}
