/* SPDX-License-Identifier: MIT */
/*
 * fr_reduce_perf - throughput of the reduction kernels, next to memcpy.
 *
 * For each dtype x op and buffer size the kernel combines two vectors into a
 * third (dst[i] = a[i] OP b[i], three separate buffers) and memcpy copies a
 * into dst.  Both are reported as bytes moved per second: 3 * size for the
 * kernel (read a, read b, write dst) and 2 * size for memcpy (read, write),
 * so the ratio kernel/memcpy says how close the kernel comes to moving
 * memory as fast as the C library does.  Samples of the two alternate, so
 * that a noisy machine slows both alike, and the median is reported.
 *
 * The goals the project sets are checked in the summary: f32 sum at least
 * 0.8 of memcpy, f16/bf16 sum at least 0.5, both in cache and out of it.
 *
 * The kernels are those of the level (reduce.h) the library would pick on
 * this CPU, or of the one given with -k, and the output says which.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <fastreduce.h>

#include "reduce.h"

#define KIB ((size_t)1024)
#define MIB (KIB * 1024)
/* One timed sample repeats the call on at least this many bytes of vector,
 * so small sizes are not measured at the resolution of the clock. */
#define SAMPLE_BYTES (2 * MIB)
/* The size the summary calls "in cache": three 256 KiB vectors fit L2. */
#define CACHE_SIZE (256 * KIB)

static const char *const dt_names[FR_DTYPE_COUNT] = {
	"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64",
};
static const size_t dt_sizes[FR_DTYPE_COUNT] = {
	4, 8, 2, 2, 1, 1, 4, 4, 8, 8,
};
static const char *const op_names[FR_OP_COUNT] = {
	"sum", "prod", "min", "max", "avg",
};

struct opts {
	int dtype;		/* -1: all */
	int op;			/* -1: all */
	int level;		/* -1: the best the CPU has */
	size_t minbytes, maxbytes, factor;
	int iters, warmup, csv;
};

/* One measured point, kept for the summary. */
struct result {
	int dtype, op;
	size_t size;
	double kernel_gbps, memcpy_gbps;
};

static void usage(FILE *f, const char *prog)
{
	fprintf(f,
		"usage: %s [-d dtype] [-o op] [-b minbytes] [-e maxbytes]\n"
		"          [-f factor] [-n iters] [-w warmup] [-k level]\n"
		"          [--csv] [-h]\n"
		"  -d dtype    f32 f64 f16 bf16 i8 u8 i32 u32 i64 u64, or all\n"
		"              (default all)\n"
		"  -o op       sum prod min max avg, or all (default all);\n"
		"              avg runs the sum kernel, floating types only\n"
		"  -b minbytes smallest vector, K/M/G suffixes (default 4K)\n"
		"  -e maxbytes largest vector (default 64M)\n"
		"  -f factor   size multiplier per step, >= 2 (default 4)\n"
		"  -n iters    timed samples per point (median; default 10)\n"
		"  -w warmup   untimed samples per point (default 2)\n"
		"  -k level    kernels: portable avx2 avx512 avx512-bf16, or\n"
		"              auto (default: the best this CPU has)\n"
		"  --csv       comma-separated output\n"
		"  -h          this help\n",
		prog);
}

static int parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;
	size_t mul = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (end == s || errno)
		return -1;
	switch (*end) {
	case 'k':
	case 'K':
		mul = KIB;
		end++;
		break;
	case 'm':
	case 'M':
		mul = MIB;
		end++;
		break;
	case 'g':
	case 'G':
		mul = MIB * 1024;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' && end[1] == 'B')	/* also "64MiB" */
		end += 2;
	else if (*end == 'B' && mul != 1)
		end++;
	if (*end || v == 0 || v > SIZE_MAX / mul)
		return -1;
	*out = (size_t)v * mul;
	return 0;
}

static int parse_int(const char *s, int min, int *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (end == s || *end || errno || v < min || v > 1000000)
		return -1;
	*out = (int)v;
	return 0;
}

static int lookup(const char *s, const char *const *names, int n, int *out)
{
	if (strcmp(s, "all") == 0) {
		*out = -1;
		return 0;
	}
	for (int i = 0; i < n; i++)
		if (strcmp(s, names[i]) == 0) {
			*out = i;
			return 0;
		}
	return -1;
}

/* A kernel level by name (reduce.h), or "auto" for -1. */
static int parse_level(const char *s, int *out)
{
	if (strcmp(s, "auto") == 0) {
		*out = -1;
		return 0;
	}
	for (int l = 0; l < FR_REDUCE_LEVEL_COUNT; l++)
		if (strcmp(s, fr_reduce_level_name(l)) == 0) {
			*out = l;
			return 0;
		}
	return -1;
}

static int parse_args(int argc, char **argv, struct opts *o)
{
	o->dtype = -1;
	o->op = -1;
	o->level = -1;
	o->minbytes = 4 * KIB;
	o->maxbytes = 64 * MIB;
	o->factor = 4;
	o->iters = 10;
	o->warmup = 2;
	o->csv = 0;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0, factor;

		if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage(stdout, argv[0]);
			exit(0);
		} else if (strcmp(a, "--csv") == 0) {
			o->csv = 1;
			continue;
		}
		if (a[0] != '-' || !a[1] || a[2] || !v) {
			fprintf(stderr, "%s: bad argument '%s'\n", argv[0], a);
			return -1;
		}
		switch (a[1]) {
		case 'd':
			bad = lookup(v, dt_names, FR_DTYPE_COUNT, &o->dtype);
			break;
		case 'o':
			bad = lookup(v, op_names, FR_OP_COUNT, &o->op);
			break;
		case 'b':
			bad = parse_size(v, &o->minbytes);
			break;
		case 'e':
			bad = parse_size(v, &o->maxbytes);
			break;
		case 'f':
			bad = parse_int(v, 2, &factor);
			o->factor = (size_t)factor;
			break;
		case 'n':
			bad = parse_int(v, 1, &o->iters);
			break;
		case 'w':
			bad = parse_int(v, 0, &o->warmup);
			break;
		case 'k':
			bad = parse_level(v, &o->level);
			break;
		default:
			fprintf(stderr, "%s: unknown option '%s'\n", argv[0],
				a);
			return -1;
		}
		if (bad) {
			fprintf(stderr, "%s: bad value '%s' for %s\n", argv[0],
				v, a);
			return -1;
		}
		i++;
	}
	if (o->minbytes > o->maxbytes) {
		fprintf(stderr, "%s: -b is larger than -e\n", argv[0]);
		return -1;
	}
	if (o->level > fr_reduce_level_max()) {
		fprintf(stderr,
			"%s: this CPU (or build) has no %s kernels; "
			"the best it has is %s\n",
			argv[0], fr_reduce_level_name(o->level),
			fr_reduce_level_name(fr_reduce_level_max()));
		return -1;
	}
	if (o->dtype >= 0 && o->op >= 0 &&
	    !fr_reduce_kernel((fr_dtype_t)o->dtype, (fr_op_t)o->op)) {
		fprintf(stderr, "%s: %s is not defined for %s\n", argv[0],
			op_names[o->op], dt_names[o->dtype]);
		return -1;
	}
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * Inputs for one dtype: floats near 1 so that products stay normal (a
 * subnormal would time the CPU's slow path, not the kernel), integers
 * anything.
 */
static void fill(int dt, unsigned char *buf, size_t bytes, unsigned seed)
{
	size_t n = bytes / dt_sizes[dt];
	uint32_t x = seed * 2654435761u + 1;

	for (size_t i = 0; i < n; i++) {
		float f;
		double d;
		uint16_t h;

		x = x * 1664525u + 1013904223u;
		/* [0.75, 1.75) */
		f = 0.75f + (float)(x >> 8) * 0x1p-24f;
		switch (dt) {
		case FR_F32:
			memcpy(buf + i * 4, &f, 4);
			break;
		case FR_F64:
			d = f;
			memcpy(buf + i * 8, &d, 8);
			break;
		case FR_F16:
			h = fr_f32_to_f16(f);
			memcpy(buf + i * 2, &h, 2);
			break;
		case FR_BF16:
			h = fr_f32_to_bf16(f);
			memcpy(buf + i * 2, &h, 2);
			break;
		default:
			for (size_t k = 0; k < dt_sizes[dt]; k++)
				buf[i * dt_sizes[dt] + k] =
					(unsigned char)(x >> (8 * (k % 4)));
			break;
		}
	}
}

static void human(size_t bytes, char *buf, size_t len)
{
	if (bytes >= MIB && bytes % MIB == 0)
		snprintf(buf, len, "%zu MiB", bytes / MIB);
	else if (bytes >= KIB && bytes % KIB == 0)
		snprintf(buf, len, "%zu KiB", bytes / KIB);
	else
		snprintf(buf, len, "%zu B", bytes);
}

/*
 * Median GB/s of the kernel and of memcpy on the same buffers, samples of
 * the two interleaved.
 */
static void measure(const struct opts *o, fr_reduce_fn k, void *d,
		    const void *a, const void *b, size_t n, size_t bytes,
		    double *kgbps, double *mgbps, double *kt, double *mt)
{
	/* Called through a volatile pointer: the copy is the point. */
	void *(*volatile copy)(void *, const void *, size_t) = memcpy;
	size_t reps = bytes >= SAMPLE_BYTES ? 1 : SAMPLE_BYTES / bytes;

	for (int s = -o->warmup; s < o->iters; s++) {
		double t0, t1, t2;

		t0 = now_s();
		for (size_t r = 0; r < reps; r++)
			k(d, a, b, n);
		t1 = now_s();
		for (size_t r = 0; r < reps; r++)
			copy(d, a, bytes);
		t2 = now_s();
		if (s >= 0) {
			kt[s] = (t1 - t0) / (double)reps;
			mt[s] = (t2 - t1) / (double)reps;
		}
	}
	*kgbps = 3.0 * (double)bytes / median(kt, o->iters) / 1e9;
	*mgbps = 2.0 * (double)bytes / median(mt, o->iters) / 1e9;
}

static void *alloc_buf(size_t bytes)
{
	/* aligned_alloc wants a multiple of the alignment. */
	size_t len = (bytes + 63) / 64 * 64;
	void *p = aligned_alloc(64, len);

	if (p)
		memset(p, 0, len);	/* fault the pages in now */
	return p;
}

/* One row of the table (or of the CSV). */
static void report(const struct opts *o, const struct result *r,
		   const char *hsize, size_t n)
{
	double ratio = r->kernel_gbps / r->memcpy_gbps;

	if (o->csv)
		printf("%zu,%s,%s,%zu,%.3f,%.3f,%.3f\n", r->size,
		       dt_names[r->dtype], op_names[r->op], n, r->kernel_gbps,
		       r->memcpy_gbps, ratio);
	else
		printf("%10s  %-5s %-5s %12.2f %12.2f %6.2f\n", hsize,
		       dt_names[r->dtype], op_names[r->op], r->kernel_gbps,
		       r->memcpy_gbps, ratio);
}

/* Which kernels are measured, as a comment line. */
static void print_level(void)
{
	printf("# kernels: %s (the best this CPU has: %s)\n",
	       fr_reduce_level_name(fr_reduce_level()),
	       fr_reduce_level_name(fr_reduce_level_max()));
}

static void summary(const struct opts *o, const struct result *res,
		    size_t nres)
{
	const char *pre = o->csv ? "# " : "";

	printf("%s%ssummary: ratio kernel/memcpy in cache (size nearest "
	       "256 KiB) and out of it (largest size)\n",
	       o->csv ? "" : "\n", pre);
	for (size_t i = 0; i < nres; i++) {
		const struct result *small = NULL, *large = NULL;
		double goal = 0;
		const char *verdict = "";
		char sbuf[32], lbuf[32];
		size_t best = SIZE_MAX;

		/* First row of each dtype/op: gather its sizes. */
		if (i > 0 && res[i - 1].dtype == res[i].dtype &&
		    res[i - 1].op == res[i].op)
			continue;
		for (size_t j = i; j < nres && res[j].dtype == res[i].dtype &&
				   res[j].op == res[i].op; j++) {
			size_t dist = res[j].size > CACHE_SIZE
					      ? res[j].size - CACHE_SIZE
					      : CACHE_SIZE - res[j].size;

			if (dist < best) {
				best = dist;
				small = &res[j];
			}
			large = &res[j];
		}
		if (res[i].op == FR_SUM && res[i].dtype == FR_F32)
			goal = 0.8;
		if (res[i].op == FR_SUM &&
		    (res[i].dtype == FR_F16 || res[i].dtype == FR_BF16))
			goal = 0.5;
		human(small->size, sbuf, sizeof(sbuf));
		human(large->size, lbuf, sizeof(lbuf));
		if (goal > 0) {
			double rs = small->kernel_gbps / small->memcpy_gbps;
			double rl = large->kernel_gbps / large->memcpy_gbps;

			verdict = rs >= goal && rl >= goal ? "met" : "MISSED";
		}
		printf("%s%-5s %-5s %8s %5.2f   %8s %5.2f", pre,
		       dt_names[res[i].dtype], op_names[res[i].op], sbuf,
		       small->kernel_gbps / small->memcpy_gbps, lbuf,
		       large->kernel_gbps / large->memcpy_gbps);
		if (goal > 0)
			printf("   goal >= %.1f: %s", goal, verdict);
		printf("\n");
	}
}

int main(int argc, char **argv)
{
	struct opts o;
	unsigned char *a, *b, *d;
	double *kt, *mt;
	struct result *res;
	size_t nres = 0, nsizes = 0;

	if (parse_args(argc, argv, &o)) {
		usage(stderr, argv[0]);
		return 2;
	}
	/* Before the kernels are looked up: each keeps the level it had. */
	fr_reduce_set_level(o.level);
	for (size_t s = o.minbytes; s <= o.maxbytes; s *= o.factor) {
		nsizes++;
		if (s > SIZE_MAX / o.factor)
			break;
	}
	a = alloc_buf(o.maxbytes);
	b = alloc_buf(o.maxbytes);
	d = alloc_buf(o.maxbytes);
	kt = calloc((size_t)o.iters, sizeof(*kt));
	mt = calloc((size_t)o.iters, sizeof(*mt));
	res = calloc(nsizes * FR_DTYPE_COUNT * FR_OP_COUNT, sizeof(*res));
	if (!a || !b || !d || !kt || !mt || !res) {
		fprintf(stderr, "%s: out of memory\n", argv[0]);
		return 1;
	}

	if (o.csv) {
		print_level();
		printf("# kernel bytes = 3*size (read a, read b, write dst); "
		       "memcpy bytes = 2*size (read, write); "
		       "ratio = kernel GB/s / memcpy GB/s; median of %d\n",
		       o.iters);
		printf("size_bytes,dtype,op,elements,kernel_gbps,memcpy_gbps,"
		       "ratio\n");
	} else {
		printf("# fr_reduce_perf: dst[i] = a[i] OP b[i], three "
		       "separate buffers of 'size' bytes each\n");
		print_level();
		printf("# GB/s = bytes moved per second: kernel 3*size "
		       "(read a, read b, write dst), memcpy 2*size "
		       "(read, write)\n");
		printf("# ratio = kernel GB/s / memcpy GB/s on the same "
		       "buffers; median of %d samples, %d warm-up\n",
		       o.iters, o.warmup);
		printf("%10s  %-5s %-5s %12s %12s %6s\n", "size", "dtype", "op",
		       "kernel GB/s", "memcpy GB/s", "ratio");
	}

	for (int dt = 0; dt < FR_DTYPE_COUNT; dt++) {
		if (o.dtype >= 0 && dt != o.dtype)
			continue;
		fill(dt, a, o.maxbytes, 1);
		fill(dt, b, o.maxbytes, 2);
		for (int op = 0; op < FR_OP_COUNT; op++) {
			fr_reduce_fn k = fr_reduce_kernel((fr_dtype_t)dt,
							  (fr_op_t)op);

			if ((o.op >= 0 && op != o.op) || !k)
				continue;
			for (size_t s = o.minbytes, i = 0; i < nsizes;
			     i++, s *= o.factor) {
				size_t n = s / dt_sizes[dt];
				size_t bytes = n * dt_sizes[dt];
				struct result *r = &res[nres];
				char hb[32];

				if (n == 0)
					continue;
				measure(&o, k, d, a, b, n, bytes,
					&r->kernel_gbps, &r->memcpy_gbps, kt,
					mt);
				r->dtype = dt;
				r->op = op;
				r->size = bytes;
				nres++;
				human(bytes, hb, sizeof(hb));
				report(&o, r, hb, n);
				fflush(stdout);
			}
		}
	}
	if (nres)
		summary(&o, res, nres);
	free(a);
	free(b);
	free(d);
	free(kt);
	free(mt);
	free(res);
	return 0;
}
