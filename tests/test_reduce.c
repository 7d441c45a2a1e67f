/* SPDX-License-Identifier: MIT */
/*
 * test_reduce.c - the reduction kernels against tests/reference.h, bit for
 * bit: every dtype x op, awkward lengths, dst aliasing a or b, special
 * floating values, rounding ties, commutativity, the f16/bf16 conversions
 * and fr_reduce_scale_avg().  Where a result is easy to state it is also
 * checked against a hand-written constant, so that the reference itself
 * is tested.
 *
 * The kernel tests run once for every kernel level (reduce.h) this CPU and
 * build have - portable, AVX2, AVX-512, AVX-512 BF16 - forced with
 * fr_reduce_set_level(); more tests then compare the levels with each
 * other: f16/bf16 over all 65536 patterns against many partners, under
 * every MXCSR denormal mode, and (FR_TEST_EXHAUSTIVE=1) over all 2^32
 * pairs.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#if (defined(__x86_64__) || defined(__i386__)) && defined(__SSE__)
#include <xmmintrin.h>
#define HAVE_MXCSR 1
#endif

#include "fastreduce.h"
#include "reduce.h"
#include "reference.h"

static const size_t lengths[] = { 0, 1, 7, 8, 15, 16, 17, 255, 256, 257,
				  1023, 4099 };
#define NLENGTHS (sizeof(lengths) / sizeof(lengths[0]))
#define MAXLEN 4099
#define GUARD 64	/* bytes after dst that must stay untouched */

static const char *const dt_names[FR_DTYPE_COUNT] = {
	"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "u32", "i64", "u64",
};
static const char *const op_names[FR_OP_COUNT] = {
	"sum", "prod", "min", "max", "avg",
};

static int is_float(fr_dtype_t dt)
{
	return dt == FR_F32 || dt == FR_F64 || dt == FR_F16 || dt == FR_BF16;
}

static int valid_pair(fr_dtype_t dt, fr_op_t op)
{
	return op != FR_AVG || is_float(dt);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	assert_non_null(p);
	return p;
}

/* xorshift64*: reproducible raw bit patterns. */
static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * UINT64_C(0x2545f4914f6cdd1d);
}

static void fill_raw(void *buf, size_t bytes, uint64_t *s)
{
	unsigned char *p = buf;

	for (size_t i = 0; i < bytes; i++)
		p[i] = (unsigned char)(rng_next(s) >> 56);
}

static void expect_same(fr_dtype_t dt, fr_op_t op, const void *got,
			const void *want, size_t n, const char *what)
{
	char msg[256];
	const char *d = ref_first_diff(dt, got, want, n, msg, sizeof(msg));

	if (d)
		fail_msg("%s %s (%s): %s", dt_names[dt], op_names[op], what, d);
}

/* ---- the table ---------------------------------------------------------- */

static void test_table(void **state)
{
	(void)state;
	for (int d = 0; d < FR_DTYPE_COUNT; d++) {
		for (int o = 0; o < FR_OP_COUNT; o++) {
			fr_dtype_t dt = (fr_dtype_t)d;
			fr_op_t op = (fr_op_t)o;
			fr_reduce_fn k = fr_reduce_kernel(dt, op);

			if (valid_pair(dt, op)) {
				assert_non_null(k);
				assert_int_equal(fr_reduce_check(dt, op), 0);
			} else {
				assert_null(k);
				assert_int_equal(fr_reduce_check(dt, op),
						 FR_EINVAL);
			}
		}
		/* avg combines with the sum kernel itself. */
		if (is_float((fr_dtype_t)d))
			assert_true(fr_reduce_kernel((fr_dtype_t)d, FR_AVG) ==
				    fr_reduce_kernel((fr_dtype_t)d, FR_SUM));
	}

	static const int bad_dt[] = { FR_DTYPE_COUNT, -1, 1000, 0x7fffffff };
	static const int bad_op[] = { FR_OP_COUNT, -1, 77, 0x7fffffff };

	for (size_t i = 0; i < 4; i++) {
		for (int o = 0; o < FR_OP_COUNT; o++) {
			assert_null(fr_reduce_kernel((fr_dtype_t)bad_dt[i],
						     (fr_op_t)o));
			assert_int_equal(fr_reduce_check((fr_dtype_t)bad_dt[i],
							 (fr_op_t)o),
					 FR_EINVAL);
		}
		for (int d = 0; d < FR_DTYPE_COUNT; d++) {
			assert_null(fr_reduce_kernel((fr_dtype_t)d,
						     (fr_op_t)bad_op[i]));
			assert_int_equal(fr_reduce_check((fr_dtype_t)d,
							 (fr_op_t)bad_op[i]),
					 FR_EINVAL);
		}
		assert_null(fr_reduce_kernel((fr_dtype_t)bad_dt[i],
					     (fr_op_t)bad_op[i]));
	}
}

/* ---- lengths and aliasing ---------------------------------------------- */

enum alias { SEPARATE, DST_IS_A, DST_IS_B, MISALIGNED, NALIAS };
static const char *const alias_names[NALIAS] = {
	"separate", "dst == a", "dst == b", "separate, vector-misaligned",
};

/*
 * One kernel call on n elements of a and b, checked against the reference
 * and for writes past the end of dst or into the input not aliased.
 */
static void check_one(fr_dtype_t dt, fr_op_t op, enum alias mode,
		      const unsigned char *a0, const unsigned char *b0,
		      size_t n)
{
	size_t es = ref_dtype_size(dt), bytes = n * es;
	fr_reduce_fn k = fr_reduce_kernel(dt, op);
	unsigned char *want = xmalloc(bytes);
	/* Exact sizes, so that AddressSanitizer sees any overread. */
	unsigned char *a = xmalloc(bytes), *b = xmalloc(bytes);
	unsigned char *dbuf = xmalloc(bytes + es + GUARD);
	unsigned char *d, *pa = a, *pb = b;
	char what[96];

	memcpy(a, a0, bytes);
	memcpy(b, b0, bytes);
	ref_combine(dt, op, want, a0, b0, n);
	/* One element in: aligned to the element, not to a vector. */
	d = mode == MISALIGNED ? dbuf + es : dbuf;
	memset(dbuf, 0xa5, bytes + es + GUARD);
	if (mode == DST_IS_A) {
		d = a;
	} else if (mode == DST_IS_B) {
		d = b;
	} else if (mode == MISALIGNED) {
		/* Inputs misaligned too: copies one element in. */
		pa = xmalloc(bytes + es);
		pb = xmalloc(bytes + es);
		memcpy(pa + es, a0, bytes);
		memcpy(pb + es, b0, bytes);
		pa += es;
		pb += es;
	}
	k(d, pa, pb, n);
	snprintf(what, sizeof(what), "n=%zu, %s", n, alias_names[mode]);
	expect_same(dt, op, d, want, n, what);
	if (mode != DST_IS_A && !ref_equal_bits(pa, a0, bytes))
		fail_msg("%s %s (%s): input a modified", dt_names[dt],
			 op_names[op], what);
	if (mode != DST_IS_B && !ref_equal_bits(pb, b0, bytes))
		fail_msg("%s %s (%s): input b modified", dt_names[dt],
			 op_names[op], what);
	if (mode == SEPARATE || mode == MISALIGNED) {
		unsigned char *end = d + bytes;
		size_t tail = (size_t)(dbuf + bytes + es + GUARD - end);

		for (size_t i = 0; i < tail; i++)
			if (end[i] != 0xa5)
				fail_msg("%s %s (%s): wrote %zu bytes past dst",
					 dt_names[dt], op_names[op], what,
					 i + 1);
		if (mode == MISALIGNED && dbuf[0] != 0xa5)
			fail_msg("%s %s (%s): wrote before dst", dt_names[dt],
				 op_names[op], what);
	}
	if (mode == MISALIGNED) {
		free(pa - es);
		free(pb - es);
	}
	free(dbuf);
	free(a);
	free(b);
	free(want);
}

static void run_lengths(int raw)
{
	uint64_t s = 0x1234567887654321u;
	size_t maxbytes = MAXLEN * 8;
	unsigned char *a = xmalloc(maxbytes), *b = xmalloc(maxbytes);

	for (int di = 0; di < FR_DTYPE_COUNT; di++) {
		fr_dtype_t dt = (fr_dtype_t)di;

		for (int oi = 0; oi < FR_OP_COUNT; oi++) {
			fr_op_t op = (fr_op_t)oi;

			if (!valid_pair(dt, op))
				continue;
			for (size_t li = 0; li < NLENGTHS; li++) {
				size_t n = lengths[li];

				if (raw) {
					fill_raw(a, n * ref_dtype_size(dt), &s);
					fill_raw(b, n * ref_dtype_size(dt), &s);
				} else {
					ref_fill(dt, a, n, 0, (uint32_t)li);
					ref_fill(dt, b, n, 1, (uint32_t)li);
				}
				for (int m = 0; m < NALIAS; m++)
					check_one(dt, op, (enum alias)m, a, b,
						  n);
			}
		}
	}
	free(a);
	free(b);
}

/* Values as ref_fill makes them (what the All-Reduce tests use). */
static void test_lengths_filled(void **state)
{
	(void)state;
	run_lengths(0);
}

/* Uniformly random bit patterns: NaN payloads, Inf, subnormals, ... */
static void test_lengths_raw(void **state)
{
	(void)state;
	run_lengths(1);
}

/* n == 0 touches nothing, so no buffer at all is needed. */
static void test_zero_length(void **state)
{
	(void)state;
	for (int d = 0; d < FR_DTYPE_COUNT; d++)
		for (int o = 0; o < FR_OP_COUNT; o++) {
			fr_reduce_fn k = fr_reduce_kernel((fr_dtype_t)d,
							  (fr_op_t)o);

			if (k)
				k(NULL, NULL, NULL, 0);
		}
	fr_reduce_scale_avg(FR_F16, NULL, 0, 4);
	fr_reduce_scale_avg(FR_F32, NULL, 0, 4);
}

/* ---- special values ----------------------------------------------------- */

static const uint32_t f32_special[] = {
	0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x3fc00000,
	0x40000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,
	0x7fc12345, 0xff812345, /* signalling, payload */ 0x7f800001,
	0x00000001, 0x80000001, 0x007fffff, 0x00800000, 0x80800000,
	0x7f7fffff, 0xff7fffff, 0x7f000000, 0x33800000, 0x3f800001,
	0x477ff000, 0x477fefff, 0x38800000, 0x33000000,
};

static const uint64_t f64_special[] = {
	0, UINT64_C(0x8000000000000000), UINT64_C(0x3ff0000000000000),
	UINT64_C(0xbff0000000000000), UINT64_C(0x7ff0000000000000),
	UINT64_C(0xfff0000000000000), UINT64_C(0x7ff8000000000000),
	UINT64_C(0xfff8000000000000), UINT64_C(0x7ff0000000000001),
	UINT64_C(0xfff4000000000123), 1, UINT64_C(0x8000000000000001),
	UINT64_C(0x000fffffffffffff), UINT64_C(0x0010000000000000),
	UINT64_C(0x7fefffffffffffff), UINT64_C(0xffefffffffffffff),
	UINT64_C(0x3ca0000000000000), UINT64_C(0x3ff0000000000001),
};

/* f16: zeros, ones, Inf, NaNs, subnormals, max, and values whose sums and
 * products land exactly on rounding ties (1 + 2^-11, 65504 + 16, ...). */
static const uint16_t f16_special[] = {
	0x0000, 0x8000, 0x3c00, 0xbc00, 0x3c01, 0x3c02, 0x1000, 0x9000,
	0x0c00, 0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0xfd55, 0x0001,
	0x8001, 0x0003, 0x03ff, 0x0400, 0x8400, 0x7bff, 0xfbff, 0x4c00,
	0x4b00, 0x3800, 0xb800, 0x3555, 0x5bff, 0x7800,
};

static const uint16_t bf16_special[] = {
	0x0000, 0x8000, 0x3f80, 0xbf80, 0x3f81, 0x3f82, 0x3b80, 0xbb80,
	0x3c00, 0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0xffa5, 0x0001,
	0x8001, 0x0003, 0x007f, 0x0080, 0x8080, 0x7f7f, 0xff7f, 0x7f00,
	0x3f00, 0xbf00, 0x3eab, 0x4040,
};

/* Lay out every ordered pair (v[i], v[j]) of a value list as two arrays. */
static size_t make_pairs(const void *vals, size_t nv, size_t es,
			 unsigned char **pa, unsigned char **pb)
{
	size_t n = nv * nv;
	unsigned char *a = xmalloc(n * es), *b = xmalloc(n * es);
	const unsigned char *v = vals;

	for (size_t i = 0; i < nv; i++)
		for (size_t j = 0; j < nv; j++) {
			memcpy(a + (i * nv + j) * es, v + i * es, es);
			memcpy(b + (i * nv + j) * es, v + j * es, es);
		}
	*pa = a;
	*pb = b;
	return n;
}

static void check_pairs(fr_dtype_t dt, const void *vals, size_t nv)
{
	size_t es = ref_dtype_size(dt);
	unsigned char *a, *b;
	size_t n = make_pairs(vals, nv, es, &a, &b);
	unsigned char *want = xmalloc(n * es), *got = xmalloc(n * es);
	unsigned char *rev = xmalloc(n * es);

	for (int oi = 0; oi < FR_OP_COUNT; oi++) {
		fr_op_t op = (fr_op_t)oi;
		fr_reduce_fn k = fr_reduce_kernel(dt, op);

		ref_combine(dt, op, want, a, b, n);
		k(got, a, b, n);
		expect_same(dt, op, got, want, n, "special pairs");
		k(rev, b, a, n);
		expect_same(dt, op, rev, got, n, "b op a vs a op b");
	}
	free(a);
	free(b);
	free(want);
	free(got);
	free(rev);
}

static void test_special_pairs(void **state)
{
	(void)state;
	check_pairs(FR_F32, f32_special,
		    sizeof(f32_special) / sizeof(f32_special[0]));
	check_pairs(FR_F64, f64_special,
		    sizeof(f64_special) / sizeof(f64_special[0]));
	check_pairs(FR_F16, f16_special,
		    sizeof(f16_special) / sizeof(f16_special[0]));
	check_pairs(FR_BF16, bf16_special,
		    sizeof(bf16_special) / sizeof(bf16_special[0]));
}

/* A result stated by hand: the kernel (and the reference) must give it. */
struct known {
	fr_dtype_t dt;
	fr_op_t op;
	uint64_t x, y, want;
};

static const struct known known[] = {
	/* f32: signed zeros. */
	{ FR_F32, FR_SUM, 0x00000000, 0x80000000, 0x00000000 },
	{ FR_F32, FR_SUM, 0x80000000, 0x80000000, 0x80000000 },
	{ FR_F32, FR_MIN, 0x00000000, 0x80000000, 0x80000000 },
	{ FR_F32, FR_MIN, 0x80000000, 0x00000000, 0x80000000 },
	{ FR_F32, FR_MAX, 0x80000000, 0x00000000, 0x00000000 },
	{ FR_F32, FR_MAX, 0x00000000, 0x80000000, 0x00000000 },
	/* NaNs come out canonical, whatever went in. */
	{ FR_F32, FR_SUM, 0x7fc00000, 0x3f800000, 0x7fc00000 },
	{ FR_F32, FR_SUM, 0xffc00000, 0x3f800000, 0x7fc00000 },
	{ FR_F32, FR_SUM, 0xff812345, 0x7fc54321, 0x7fc00000 },
	{ FR_F32, FR_SUM, 0x7f800000, 0xff800000, 0x7fc00000 },
	{ FR_F32, FR_PROD, 0x7f800000, 0x00000000, 0x7fc00000 },
	{ FR_F32, FR_MIN, 0x3f800000, 0xffc00000, 0x7fc00000 },
	{ FR_F32, FR_MAX, 0x7f800001, 0x7f800000, 0x7fc00000 },
	{ FR_F32, FR_MIN, 0xff800000, 0x7fc00000, 0x7fc00000 },
	/* Overflow to Inf, subnormals, infinities. */
	{ FR_F32, FR_SUM, 0x7f7fffff, 0x7f7fffff, 0x7f800000 },
	{ FR_F32, FR_PROD, 0xff7fffff, 0x40000000, 0xff800000 },
	{ FR_F32, FR_SUM, 0x00000001, 0x00000001, 0x00000002 },
	{ FR_F32, FR_PROD, 0x00000001, 0x3f000000, 0x00000000 },
	{ FR_F32, FR_MIN, 0xff800000, 0xff7fffff, 0xff800000 },
	{ FR_F32, FR_MAX, 0x00000001, 0x80000001, 0x00000001 },
	{ FR_F32, FR_MIN, 0x00000001, 0x80000001, 0x80000001 },
	{ FR_F32, FR_AVG, 0x3fc00000, 0x3fc00000, 0x40400000 },
	/* f64. */
	{ FR_F64, FR_MIN, 0, UINT64_C(0x8000000000000000),
	  UINT64_C(0x8000000000000000) },
	{ FR_F64, FR_MAX, UINT64_C(0x8000000000000000), 0, 0 },
	{ FR_F64, FR_SUM, UINT64_C(0xfff0000000000001),
	  UINT64_C(0x3ff0000000000000), UINT64_C(0x7ff8000000000000) },
	{ FR_F64, FR_SUM, UINT64_C(0x7fefffffffffffff),
	  UINT64_C(0x7fefffffffffffff), UINT64_C(0x7ff0000000000000) },
	{ FR_F64, FR_MAX, UINT64_C(0x3ff0000000000000),
	  UINT64_C(0xfff8000000000000), UINT64_C(0x7ff8000000000000) },
	/* f16: ties to even, overflow at 65520, subnormals. */
	{ FR_F16, FR_SUM, 0x3c00, 0x1000, 0x3c00 },	/* 1 + 2^-11 */
	{ FR_F16, FR_SUM, 0x3c01, 0x1000, 0x3c02 },
	{ FR_F16, FR_SUM, 0x7bff, 0x4c00, 0x7c00 },	/* 65504 + 16 */
	{ FR_F16, FR_SUM, 0x7bff, 0x4b00, 0x7bff },	/* 65504 + 14 */
	{ FR_F16, FR_SUM, 0x0001, 0x0001, 0x0002 },
	{ FR_F16, FR_SUM, 0x3c00, 0x0000, 0x3c00 },
	{ FR_F16, FR_SUM, 0x8000, 0x0000, 0x0000 },
	{ FR_F16, FR_PROD, 0x0001, 0x3800, 0x0000 },	/* 2^-25: to 0 */
	{ FR_F16, FR_PROD, 0x0003, 0x3800, 0x0002 },	/* 1.5 ulp: to 2 */
	{ FR_F16, FR_PROD, 0x8001, 0x3800, 0x8000 },
	{ FR_F16, FR_PROD, 0x7800, 0x7800, 0x7c00 },	/* 32768^2 */
	{ FR_F16, FR_PROD, 0x3c00, 0x3555, 0x3555 },
	{ FR_F16, FR_SUM, 0x7c00, 0xfc00, 0x7e00 },
	{ FR_F16, FR_SUM, 0xfd55, 0x3c00, 0x7e00 },
	{ FR_F16, FR_MIN, 0x0000, 0x8000, 0x8000 },
	{ FR_F16, FR_MAX, 0x8000, 0x0000, 0x0000 },
	{ FR_F16, FR_MIN, 0x7c01, 0x3c00, 0x7e00 },
	{ FR_F16, FR_MAX, 0xfbff, 0xfc00, 0xfbff },
	{ FR_F16, FR_MIN, 0x8001, 0x0001, 0x8001 },
	{ FR_F16, FR_AVG, 0x3c00, 0x3c00, 0x4000 },
	/* bf16. */
	{ FR_BF16, FR_SUM, 0x3f80, 0x3b80, 0x3f80 },	/* 1 + 2^-8 */
	{ FR_BF16, FR_SUM, 0x3f81, 0x3b80, 0x3f82 },
	{ FR_BF16, FR_SUM, 0x7f7f, 0x7f7f, 0x7f80 },
	{ FR_BF16, FR_SUM, 0x0001, 0x0001, 0x0002 },
	{ FR_BF16, FR_PROD, 0x7f81, 0x3f80, 0x7fc0 },
	{ FR_BF16, FR_MIN, 0x0000, 0x8000, 0x8000 },
	{ FR_BF16, FR_MAX, 0x8000, 0x0000, 0x0000 },
	{ FR_BF16, FR_MAX, 0xffc0, 0x3f80, 0x7fc0 },
	{ FR_BF16, FR_MIN, 0xff80, 0xff7f, 0xff80 },
	/* Integers wrap; signed and unsigned min/max differ. */
	{ FR_I8, FR_SUM, 0x7f, 0x01, 0x80 },
	{ FR_I8, FR_PROD, 0x10, 0x10, 0x00 },
	{ FR_I8, FR_PROD, 0xff, 0x80, 0x80 },		/* -1 * -128 */
	{ FR_I8, FR_MIN, 0xff, 0x01, 0xff },
	{ FR_U8, FR_MIN, 0xff, 0x01, 0x01 },
	{ FR_I8, FR_MAX, 0x80, 0x7f, 0x7f },
	{ FR_U8, FR_MAX, 0x80, 0x7f, 0x80 },
	{ FR_U8, FR_PROD, 0xff, 0xff, 0x01 },
	{ FR_I32, FR_SUM, 0x7fffffff, 0x1, 0x80000000 },
	{ FR_I32, FR_PROD, 0x80000000, 0xffffffff, 0x80000000 },
	{ FR_I32, FR_MIN, 0x80000000, 0x7fffffff, 0x80000000 },
	{ FR_U32, FR_MIN, 0x80000000, 0x7fffffff, 0x7fffffff },
	{ FR_U32, FR_PROD, 0x10000, 0x10000, 0 },
	{ FR_I64, FR_SUM, UINT64_C(0x7fffffffffffffff), 1,
	  UINT64_C(0x8000000000000000) },
	{ FR_I64, FR_PROD, UINT64_C(0x8000000000000000), UINT64_MAX,
	  UINT64_C(0x8000000000000000) },
	{ FR_I64, FR_MAX, UINT64_MAX, 0, 0 },
	{ FR_U64, FR_MAX, UINT64_MAX, 0, UINT64_MAX },
	{ FR_U64, FR_SUM, UINT64_MAX, 2, 1 },
	{ FR_U64, FR_PROD, UINT64_C(0x100000000), UINT64_C(0x100000000), 0 },
};

/* Store the low es bytes of v as one element (host order). */
static void put_elem(void *p, size_t es, uint64_t v)
{
	uint8_t u8 = (uint8_t)v;
	uint16_t u16 = (uint16_t)v;
	uint32_t u32 = (uint32_t)v;

	switch (es) {
	case 1:
		memcpy(p, &u8, 1);
		break;
	case 2:
		memcpy(p, &u16, 2);
		break;
	case 4:
		memcpy(p, &u32, 4);
		break;
	default:
		memcpy(p, &v, 8);
		break;
	}
}

static void test_known_values(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++) {
		const struct known *t = &known[i];
		size_t es = ref_dtype_size(t->dt);
		/* Repeat the pair so both vector and scalar code see it. */
		enum { N = 131 };
		unsigned char a[N * 8], b[N * 8], w[N * 8], g[N * 8];
		char what[64];

		for (size_t j = 0; j < N; j++) {
			put_elem(a + j * es, es, t->x);
			put_elem(b + j * es, es, t->y);
			put_elem(w + j * es, es, t->want);
		}
		snprintf(what, sizeof(what), "known value #%zu", i);
		fr_reduce_kernel(t->dt, t->op)(g, a, b, N);
		expect_same(t->dt, t->op, g, w, N, what);
		fr_reduce_kernel(t->dt, t->op)(g, b, a, N);
		expect_same(t->dt, t->op, g, w, N, what);
		ref_combine(t->dt, t->op, g, a, b, N);
		if (!ref_equal_bits(g, w, N * es))
			fail_msg("reference disagrees with %s", what);
	}
}

/* a op b == b op a on random bits, every dtype and op. */
static void test_commutative(void **state)
{
	uint64_t s = 42;
	enum { N = 4099 };
	unsigned char *a = xmalloc(N * 8), *b = xmalloc(N * 8);
	unsigned char *ab = xmalloc(N * 8), *ba = xmalloc(N * 8);

	(void)state;
	for (int round = 0; round < 4; round++) {
		for (int di = 0; di < FR_DTYPE_COUNT; di++) {
			fr_dtype_t dt = (fr_dtype_t)di;
			size_t es = ref_dtype_size(dt);

			fill_raw(a, N * es, &s);
			fill_raw(b, N * es, &s);
			/* Every other round: b is a with random signs, to
			 * hit the signed-zero and equal-value rules. */
			if (round & 1) {
				uint16_t one = 1;
				unsigned char little;
				size_t top;

				memcpy(&little, &one, 1);
				top = little ? es - 1 : 0;
				memcpy(b, a, N * es);
				for (size_t i = 0; i < N; i++)
					b[i * es + top] ^=
						(unsigned char)(rng_next(&s) &
								0x80);
			}
			for (int oi = 0; oi < FR_OP_COUNT; oi++) {
				fr_op_t op = (fr_op_t)oi;
				fr_reduce_fn k = fr_reduce_kernel(dt, op);

				if (!k)
					continue;
				k(ab, a, b, N);
				k(ba, b, a, N);
				expect_same(dt, op, ba, ab, N, "commutativity");
			}
		}
	}
	free(a);
	free(b);
	free(ab);
	free(ba);
}

/* ---- conversions ------------------------------------------------------- */

static void test_f16_roundtrip(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = fr_f16_to_f32((uint16_t)h);
		uint16_t back = fr_f32_to_f16(f);
		uint32_t fb = ref_f32_bits(f);

		if (fb != ref_f32_bits(ref_f16_to_f32((uint16_t)h)))
			fail_msg("f16 0x%04x -> f32 0x%08lx, reference 0x%08lx",
				 (unsigned)h, (unsigned long)fb,
				 (unsigned long)ref_f32_bits(
					 ref_f16_to_f32((uint16_t)h)));
		if ((h & 0x7fff) > 0x7c00) {
			/* NaN stays NaN: same sign, made quiet. */
			assert_true(isnan(f));
			assert_int_equal(!!signbit(f), h >> 15);
			assert_int_equal(back, h | 0x200);
		} else {
			assert_false(isnan(f));
			if (back != h)
				fail_msg("f16 0x%04x -> %g -> 0x%04x",
					 (unsigned)h, (double)f, back);
		}
	}
}

static void test_bf16_roundtrip(void **state)
{
	(void)state;
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = fr_bf16_to_f32((uint16_t)h);
		uint16_t back = fr_f32_to_bf16(f);

		/* bf16 -> f32 is exact, even for NaN payloads. */
		assert_int_equal(ref_f32_bits(f), h << 16);
		if ((h & 0x7fff) > 0x7f80) {
			assert_true(isnan(f));
			assert_int_equal(!!signbit(f), h >> 15);
			assert_int_equal(back, h | 0x40);
		} else if (back != h) {
			fail_msg("bf16 0x%04x -> %g -> 0x%04x", (unsigned)h,
				 (double)f, back);
		}
	}
}

static void check_f32_to_half(uint32_t x)
{
	float f = ref_f32_from(x);
	uint16_t h = fr_f32_to_f16(f), rh = ref_f32_to_f16(f);
	uint16_t b = fr_f32_to_bf16(f), rb = ref_f32_to_bf16(f);

	if (h != rh)
		fail_msg("f32 0x%08lx -> f16 0x%04x, reference 0x%04x",
			 (unsigned long)x, h, rh);
	if (b != rb)
		fail_msg("f32 0x%08lx -> bf16 0x%04x, reference 0x%04x",
			 (unsigned long)x, b, rb);
}

/* f32 -> f16/bf16 against the reference: around every f16 value and every
 * midpoint between neighbours, every bf16 midpoint, and random patterns. */
static void test_f32_to_half(void **state)
{
	uint64_t s = 7;

	(void)state;
	for (uint32_t h = 0; h < 0x10000; h++) {
		uint32_t x = ref_f32_bits(ref_f16_to_f32((uint16_t)h));
		uint32_t mid = ref_f32_bits(
			(ref_f16_to_f32((uint16_t)h) +
			 ref_f16_to_f32((uint16_t)(h + 1))) / 2);

		for (int k = -2; k <= 2; k++) {
			check_f32_to_half(x + (uint32_t)k);
			check_f32_to_half(mid + (uint32_t)k);
			/* bf16 midpoints and their neighbours. */
			check_f32_to_half((h << 16) + 0x8000u + (uint32_t)k);
		}
	}
	for (int i = 0; i < (1 << 20); i++)
		check_f32_to_half((uint32_t)rng_next(&s));
}

static void test_known_conversions(void **state)
{
	(void)state;
	/* f16: overflow threshold, ties, subnormals, NaN. */
	assert_int_equal(fr_f32_to_f16(65520.0f), 0x7c00);
	assert_int_equal(fr_f32_to_f16(65519.99f), 0x7bff);
	assert_int_equal(fr_f32_to_f16(65504.0f), 0x7bff);
	assert_int_equal(fr_f32_to_f16(-65520.0f), 0xfc00);
	assert_int_equal(fr_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	assert_int_equal(fr_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
	assert_int_equal(fr_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01);
	assert_int_equal(fr_f32_to_f16(0x1p-24f), 0x0001);
	assert_int_equal(fr_f32_to_f16(0x1p-25f), 0x0000);
	assert_int_equal(fr_f32_to_f16(0x1.8p-24f), 0x0002);
	assert_int_equal(fr_f32_to_f16(0x1.0002p-25f), 0x0001);
	assert_int_equal(fr_f32_to_f16(0x1p-14f), 0x0400);
	assert_int_equal(fr_f32_to_f16(0x1.ff8p-15f), 0x03ff);
	assert_int_equal(fr_f32_to_f16(0x1.ffcp-15f), 0x0400);	/* tie */
	assert_int_equal(fr_f32_to_f16(0x1.ff4p-15f), 0x03fe);	/* tie */
	assert_int_equal(fr_f32_to_f16(-0.0f), 0x8000);
	assert_int_equal(fr_f32_to_f16(INFINITY), 0x7c00);
	assert_int_equal(fr_f32_to_f16(-INFINITY), 0xfc00);
	assert_int_equal(fr_f32_to_f16(ref_f32_from(0x7fc00000)), 0x7e00);
	assert_int_equal(fr_f32_to_f16(ref_f32_from(0xff800001)), 0xfe00);
	assert_int_equal(fr_f32_to_f16(ref_f32_from(0x7f802000)), 0x7e01);
	assert_int_equal(fr_f32_to_f16(ref_f32_from(0x00000001)), 0x0000);
	assert_true(fr_f16_to_f32(0x7bff) == 65504.0f);
	assert_true(fr_f16_to_f32(0x0001) == 0x1p-24f);
	assert_true(fr_f16_to_f32(0x3555) == 0x1.554p-2f);
	assert_int_equal(ref_f32_bits(fr_f16_to_f32(0x8000)), 0x80000000);
	assert_true(fr_f16_to_f32(0xfc00) == -INFINITY);
	assert_int_equal(ref_f32_bits(fr_f16_to_f32(0x7c01)), 0x7fc02000);
	/* bf16. */
	assert_int_equal(fr_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	assert_int_equal(fr_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
	assert_int_equal(fr_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
	assert_int_equal(fr_f32_to_bf16(ref_f32_from(0x7f7fffff)), 0x7f80);
	assert_int_equal(fr_f32_to_bf16(ref_f32_from(0x7f7f7fff)), 0x7f7f);
	assert_int_equal(fr_f32_to_bf16(ref_f32_from(0x00018000)), 0x0002);
	assert_int_equal(fr_f32_to_bf16(ref_f32_from(0xff800001)), 0xffc0);
	assert_int_equal(fr_f32_to_bf16(ref_f32_from(0x7fff0000)), 0x7fff);
	assert_true(fr_bf16_to_f32(0x3f80) == 1.0f);
	assert_true(fr_bf16_to_f32(0xff80) == -INFINITY);
}

/*
 * The f16 kernels convert by their own route (F16C where the CPU has it):
 * x + -0 is x for every non-NaN f16, so this round-trips all 65536
 * patterns through that route; and x * 1 must match too.
 */
static void test_f16_kernel_roundtrip(void **state)
{
	enum { N = 0x10000 };
	uint16_t *a = xmalloc(N * 2), *b = xmalloc(N * 2), *d = xmalloc(N * 2);
	fr_dtype_t dts[2] = { FR_F16, FR_BF16 };

	(void)state;
	for (int t = 0; t < 2; t++) {
		uint16_t nan = dts[t] == FR_F16 ? 0x7e00 : 0x7fc0;
		uint16_t inf = dts[t] == FR_F16 ? 0x7c00 : 0x7f80;
		uint16_t one = dts[t] == FR_F16 ? 0x3c00 : 0x3f80;

		for (uint32_t i = 0; i < N; i++) {
			a[i] = (uint16_t)i;
			b[i] = 0x8000;
		}
		fr_reduce_kernel(dts[t], FR_SUM)(d, a, b, N);
		for (uint32_t i = 0; i < N; i++) {
			uint16_t want = (i & 0x7fff) > inf ? nan : (uint16_t)i;

			if (d[i] != want)
				fail_msg("%s 0x%04x + -0 = 0x%04x",
					 dt_names[dts[t]], (unsigned)i, d[i]);
		}
		for (uint32_t i = 0; i < N; i++)
			b[i] = one;
		fr_reduce_kernel(dts[t], FR_PROD)(d, a, b, N);
		for (uint32_t i = 0; i < N; i++) {
			uint16_t want = (i & 0x7fff) > inf ? nan : (uint16_t)i;

			if (d[i] != want)
				fail_msg("%s 0x%04x * 1 = 0x%04x",
					 dt_names[dts[t]], (unsigned)i, d[i]);
		}
	}
	free(a);
	free(b);
	free(d);
}

/* ---- scale_avg --------------------------------------------------------- */

static void test_scale_avg(void **state)
{
	static const int nranks[] = { 1, 2, 3, 7, 8, 1000 };
	uint64_t s = 99;
	unsigned char *orig = xmalloc(MAXLEN * 8);
	unsigned char *got = xmalloc(MAXLEN * 8), *want = xmalloc(MAXLEN * 8);

	(void)state;
	for (int di = 0; di < FR_DTYPE_COUNT; di++) {
		fr_dtype_t dt = (fr_dtype_t)di;
		size_t es = ref_dtype_size(dt);

		for (size_t li = 0; li < NLENGTHS; li++) {
			size_t n = lengths[li];

			for (int raw = 0; raw < 2; raw++) {
				if (raw)
					fill_raw(orig, n * es, &s);
				else
					ref_fill(dt, orig, n, 3, 5);
				for (size_t r = 0; r < 6; r++) {
					char what[64];

					memcpy(got, orig, n * es);
					memcpy(want, orig, n * es);
					fr_reduce_scale_avg(dt, got, n,
							    nranks[r]);
					ref_scale_avg(dt, want, n, nranks[r]);
					snprintf(what, sizeof(what),
						 "scale_avg n=%zu nranks=%d", n,
						 nranks[r]);
					expect_same(dt, FR_AVG, got, want, n,
						    what);
					/* Integers and one rank: untouched. */
					if ((!is_float(dt) || nranks[r] == 1) &&
					    !ref_equal_bits(got, orig, n * es))
						fail_msg("%s %s changed",
							 dt_names[dt], what);
				}
			}
		}
	}
	free(orig);
	free(got);
	free(want);
}

static void test_scale_avg_known(void **state)
{
	float f[4] = { 3.0f, -1.0f, 0.0f, 1.0f };
	uint16_t h[3] = { 0x3c00, 0x7bff, 0xfe01 };
	uint16_t bh[2] = { 0x4040, 0x0001 };
	double d[2] = { 1.0, -0.0 };
	int32_t iv[2] = { 7, -7 };

	(void)state;
	f[3] = ref_f32_from(0xffc12345);	/* a NaN becomes canonical */
	fr_reduce_scale_avg(FR_F32, f, 4, 2);
	assert_true(f[0] == 1.5f);
	assert_true(f[1] == -0.5f);
	assert_int_equal(ref_f32_bits(f[2]), 0);
	assert_int_equal(ref_f32_bits(f[3]), 0x7fc00000);
	fr_reduce_scale_avg(FR_F16, h, 3, 3);
	assert_int_equal(h[0], 0x3555);		/* 1/3 */
	assert_int_equal(h[1], 0x7555);		/* 65504/3 = 21834.67 */
	assert_int_equal(h[2], 0x7e00);
	fr_reduce_scale_avg(FR_BF16, bh, 2, 2);
	assert_int_equal(bh[0], 0x3fc0);	/* 3 / 2 */
	assert_int_equal(bh[1], 0x0000);	/* tiniest / 2: tie to even */
	fr_reduce_scale_avg(FR_F64, d, 2, 4);
	assert_true(d[0] == 0.25);
	assert_int_equal(ref_f64_bits(d[1]), UINT64_C(0x8000000000000000));
	fr_reduce_scale_avg(FR_I32, iv, 2, 7);
	assert_int_equal(iv[0], 7);
	assert_int_equal(iv[1], -7);
	/* Not a rank count: nothing happens. */
	f[0] = 5.0f;
	fr_reduce_scale_avg(FR_F32, f, 1, 0);
	fr_reduce_scale_avg(FR_F32, f, 1, -3);
	assert_true(f[0] == 5.0f);
}

/* ---- the reference's own fill ----------------------------------------- */

/* ref_fill is deterministic, rank dependent and stays finite when 8 ranks
 * are summed or multiplied (the contract the All-Reduce tests rely on). */
static void test_ref_fill(void **state)
{
	enum { N = 1000, R = 8 };
	unsigned char *x = xmalloc(N * 8), *y = xmalloc(N * 8);
	unsigned char *acc = xmalloc(N * 8);

	(void)state;
	for (int di = 0; di < FR_DTYPE_COUNT; di++) {
		fr_dtype_t dt = (fr_dtype_t)di;
		size_t es = ref_dtype_size(dt);

		ref_fill(dt, x, N, 0, 1);
		ref_fill(dt, y, N, 0, 1);
		assert_true(ref_equal_bits(x, y, N * es));
		ref_fill(dt, y, N, 1, 1);
		assert_false(ref_equal_bits(x, y, N * es));
		ref_fill(dt, y, N, 0, 2);
		assert_false(ref_equal_bits(x, y, N * es));
		/* Element i does not depend on the length. */
		memset(y, 0, N * es);
		ref_fill(dt, y, N / 2, 0, 1);
		assert_true(ref_equal_bits(x, y, N / 2 * es));
		assert_false(ref_equal_bits(x, y, N * es));
		if (!is_float(dt))
			continue;
		for (int op = FR_SUM; op <= FR_PROD; op++) {
			ref_fill(dt, acc, N, 0, 1);
			for (int r = 1; r < R; r++) {
				ref_fill(dt, x, N, r, 1);
				ref_combine(dt, (fr_op_t)op, acc, acc, x, N);
			}
			for (size_t i = 0; i < N; i++) {
				double v;

				if (dt == FR_F32) {
					float fv;

					memcpy(&fv, acc + i * 4, 4);
					v = fv;
				} else if (dt == FR_F64) {
					memcpy(&v, acc + i * 8, 8);
				} else {
					uint16_t hv;

					memcpy(&hv, acc + i * 2, 2);
					v = ref_half_to_f32(dt, hv);
				}
				assert_true(isfinite(v));
			}
		}
	}
	free(x);
	free(y);
	free(acc);
}

static void test_first_diff(void **state)
{
	float a[3] = { 1.0f, 2.0f, 3.0f }, b[3] = { 1.0f, 2.5f, 3.0f };
	char buf[128];
	const char *m;

	(void)state;
	assert_null(ref_first_diff(FR_F32, a, a, 3, buf, sizeof(buf)));
	m = ref_first_diff(FR_F32, a, b, 3, buf, sizeof(buf));
	assert_non_null(m);
	assert_non_null(strstr(m, "index 1"));
	assert_non_null(strstr(m, "2.5"));
	assert_non_null(strstr(m, "0x40000000"));
	b[1] = -0.0f;
	a[1] = 0.0f;
	assert_non_null(ref_first_diff(FR_F32, a, b, 3, buf, sizeof(buf)));
	assert_true(ref_equal_bits(a, a, sizeof(a)));
	assert_false(ref_equal_bits(a, b, sizeof(a)));
}

/* ---- tails against guard pages ---------------------------------------- */

/*
 * A mapping whose usable part ends where an inaccessible page begins, so
 * that a kernel reading or writing one byte past a buffer that ends there
 * faults (vector tails must stay inside the buffer even where a sanitizer
 * does not see the access, as with masked loads).
 */
struct guarded {
	unsigned char *map;
	size_t maplen;
	unsigned char *end;	/* first inaccessible byte */
};

static void guarded_init(struct guarded *g, size_t bytes)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t len = (bytes + page - 1) / page * page;
	void *p = mmap(NULL, len + page, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	g->map = p;
	g->maplen = len + page;
	g->end = g->map + len;
	assert_int_equal(mprotect(g->end, page, PROT_NONE), 0);
}

static void guarded_free(struct guarded *g)
{
	munmap(g->map, g->maplen);
}

static const size_t tail_lengths[] = {
	0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33,
	34, 39, 40, 41, 47, 48, 49, 55, 63, 64, 65, 66, 79, 95, 96, 97, 127,
	128, 129, 130, 255, 256, 257, 511, 513, 1025,
};
#define TAIL_MAX 1025

/* Elements between each buffer's end and its guard page: a, b, dst. */
static const unsigned tail_gaps[][3] = {
	{ 0, 0, 0 }, { 1, 0, 3 }, { 0, 2, 1 }, { 3, 1, 0 }, { 0, 0, 7 },
};
#define NGAPS (sizeof(tail_gaps) / sizeof(tail_gaps[0]))

enum { ALIAS_NONE, ALIAS_A, ALIAS_B };

/*
 * One call on n elements, a, b and dst ending gap[0], gap[1] and gap[2]
 * elements before their guard pages (g[0..2]), or dst being a or b.  The
 * bytes between dst and its guard page must stay untouched.
 */
static void check_guarded(fr_dtype_t dt, fr_op_t op, struct guarded *g,
			  const unsigned char *a0, const unsigned char *b0,
			  const unsigned char *want, size_t n,
			  const unsigned *gap, int alias)
{
	static const char *const alias_what[] = { "", ", dst == a",
						  ", dst == b" };
	size_t es = ref_dtype_size(dt), bytes = n * es;
	unsigned char *a = g[0].end - (gap[0] * es + bytes);
	unsigned char *b = g[1].end - (gap[1] * es + bytes);
	unsigned char *d = g[2].end - (gap[2] * es + bytes);
	char what[96];

	snprintf(what, sizeof(what), "n=%zu, gaps %u/%u/%u%s", n, gap[0],
		 gap[1], gap[2], alias_what[alias]);
	memcpy(a, a0, bytes);
	memcpy(b, b0, bytes);
	memset(d + bytes, 0xa5, gap[2] * es);
	if (alias == ALIAS_A)
		d = a;
	else if (alias == ALIAS_B)
		d = b;
	fr_reduce_kernel(dt, op)(d, a, b, n);
	expect_same(dt, op, d, want, n, what);
	if (d != a && !ref_equal_bits(a, a0, bytes))
		fail_msg("%s %s (%s): a modified", dt_names[dt], op_names[op],
			 what);
	if (d != b && !ref_equal_bits(b, b0, bytes))
		fail_msg("%s %s (%s): b modified", dt_names[dt], op_names[op],
			 what);
	for (size_t i = 0; alias == ALIAS_NONE && i < gap[2] * es; i++)
		if (d[bytes + i] != 0xa5)
			fail_msg("%s %s (%s): wrote past dst", dt_names[dt],
				 op_names[op], what);
}

/*
 * Every dtype x op on every tail length, each buffer ending at or a few
 * elements before a guard page (which also varies how the three are
 * aligned to a vector), dst separate or equal to a or b.
 */
static void test_tails_guarded(void **state)
{
	static const unsigned no_gap[3] = { 0, 0, 0 };
	struct guarded g[3];
	size_t room = (TAIL_MAX + 8) * 8;
	unsigned char *a0 = xmalloc(room), *b0 = xmalloc(room);
	unsigned char *want = xmalloc(room);
	uint64_t s = 0x5eed;

	(void)state;
	for (int i = 0; i < 3; i++)
		guarded_init(&g[i], room);
	for (int di = 0; di < FR_DTYPE_COUNT; di++) {
		for (int oi = 0; oi < FR_OP_COUNT; oi++) {
			fr_dtype_t dt = (fr_dtype_t)di;
			fr_op_t op = (fr_op_t)oi;

			if (!valid_pair(dt, op))
				continue;
			for (size_t li = 0;
			     li < sizeof(tail_lengths) / sizeof(*tail_lengths);
			     li++) {
				size_t n = tail_lengths[li];
				size_t bytes = n * ref_dtype_size(dt);

				fill_raw(a0, bytes, &s);
				fill_raw(b0, bytes, &s);
				ref_combine(dt, op, want, a0, b0, n);
				for (size_t j = 0; j < NGAPS; j++)
					check_guarded(dt, op, g, a0, b0, want,
						      n, tail_gaps[j],
						      ALIAS_NONE);
				check_guarded(dt, op, g, a0, b0, want, n,
					      no_gap, ALIAS_A);
				check_guarded(dt, op, g, a0, b0, want, n,
					      no_gap, ALIAS_B);
			}
		}
	}
	for (int i = 0; i < 3; i++)
		guarded_free(&g[i]);
	free(a0);
	free(b0);
	free(want);
}

/* ---- the levels against each other --------------------------------------- */

/* The levels this CPU and build have: 0 .. fr_reduce_level_max(). */
static int nlevels(void)
{
	return fr_reduce_level_max() + 1;
}

/* The kernel of (dt, op) at a level; the level in use is put back. */
static fr_reduce_fn kernel_at(int level, fr_dtype_t dt, fr_op_t op)
{
	int was = fr_reduce_level();
	fr_reduce_fn k;

	assert_int_equal(fr_reduce_set_level(level), level);
	k = fr_reduce_kernel(dt, op);
	fr_reduce_set_level(was);
	return k;
}

/*
 * Partners for the 65536 patterns: b[i] = i * mul + add (odd mul: every
 * pattern once).  They cover x + x, neighbours, x + -x (signed zeros) and
 * x + -(x -/+ 1 ulp) (cancellation down to the subnormals), and a mix.
 */
static const uint16_t perm_rounds[][2] = {
	{ 1, 0 },	  { 1, 1 },	    { 1, 0xffff },    { 1, 0x8000 },
	{ 1, 0x7fff },	  { 1, 0x8001 },    { 1, 0x8002 },    { 3, 0 },
	{ 0x101, 0x8000 }, { 0x9e37, 0x1234 }, { 0x2f1, 0x8765 },
	{ 0xfff1, 0x55 }, { 0x4001, 0x3c00 }, { 0x8001, 0x7f80 },
	{ 0x1235, 0xbeef }, { 0x0403, 0x0401 },
};
#define NPERM (sizeof(perm_rounds) / sizeof(perm_rounds[0]))

/* Constant partners: the special lists. */
static size_t half_specials(fr_dtype_t dt, const uint16_t **v)
{
	if (dt == FR_F16) {
		*v = f16_special;
		return sizeof(f16_special) / sizeof(f16_special[0]);
	}
	*v = bf16_special;
	return sizeof(bf16_special) / sizeof(bf16_special[0]);
}

/*
 * Round r of the pattern tests: a = all 65536 patterns, b = a partner
 * for each.  (The other operand order is test_commutative's business.)
 */
static size_t half_rounds(fr_dtype_t dt)
{
	const uint16_t *v;

	return NPERM + half_specials(dt, &v);
}

static void half_round(fr_dtype_t dt, size_t r, uint16_t *a, uint16_t *b)
{
	const uint16_t *v;

	half_specials(dt, &v);
	for (uint32_t i = 0; i < 0x10000; i++) {
		a[i] = (uint16_t)i;
		b[i] = r < NPERM ? (uint16_t)(i * perm_rounds[r][0] +
					      perm_rounds[r][1])
				 : v[r - NPERM];
	}
}

/*
 * f16/bf16, every op: all 65536 patterns against the partners above, every
 * level against the reference (and so against each other), bit for bit.
 * The calls start one element into the buffers, so the vectors are
 * misaligned, and the length is odd, so there is a tail.
 */
static void test_half_patterns(void **state)
{
	enum { N = 0x10000 };
	uint16_t *a = xmalloc((N + 1) * 2), *b = xmalloc((N + 1) * 2);
	uint16_t *want = xmalloc(N * 2), *got = xmalloc((N + 1) * 2);
	fr_dtype_t dts[2] = { FR_F16, FR_BF16 };

	(void)state;
	for (int t = 0; t < 2; t++) {
		fr_dtype_t dt = dts[t];

		for (size_t r = 0; r < half_rounds(dt); r++) {
			half_round(dt, r, a + 1, b + 1);
			/* FR_AVG is the FR_SUM kernel. */
			for (int oi = 0; oi < FR_AVG; oi++) {
				fr_op_t op = (fr_op_t)oi;

				ref_combine(dt, op, want, a + 1, b + 1, N);
				for (int l = 0; l < nlevels(); l++) {
					char what[64];

					kernel_at(l, dt, op)(got + 1, a + 1,
							     b + 1, N);
					snprintf(what, sizeof(what),
						 "%s, pattern round %zu",
						 fr_reduce_level_name(l), r);
					expect_same(dt, op, got + 1, want, N,
						    what);
					/* Odd length, other alignments. */
					kernel_at(l, dt, op)(got, a + 2, b + 2,
							     N - 1);
					expect_same(dt, op, got, want + 1,
						    N - 1, what);
				}
			}
		}
	}
	free(a);
	free(b);
	free(want);
	free(got);
}

/*
 * Raw random bits, every dtype and op, a length with a tail: every level
 * gives the portable level's bits.
 */
static void test_levels_agree(void **state)
{
	enum { N = 100003 };
	uint64_t s = 0xfeed;
	unsigned char *a = xmalloc(N * 8 + 8), *b = xmalloc(N * 8 + 8);
	unsigned char *want = xmalloc(N * 8 + 8), *got = xmalloc(N * 8 + 8);

	(void)state;
	for (int di = 0; di < FR_DTYPE_COUNT; di++) {
		fr_dtype_t dt = (fr_dtype_t)di;
		size_t es = ref_dtype_size(dt);

		fill_raw(a, N * es + es, &s);
		fill_raw(b, N * es + es, &s);
		for (int oi = 0; oi < FR_OP_COUNT; oi++) {
			fr_op_t op = (fr_op_t)oi;

			if (!valid_pair(dt, op))
				continue;
			kernel_at(FR_REDUCE_PORTABLE, dt, op)(want, a + es, b,
							       N);
			for (int l = 1; l < nlevels(); l++) {
				kernel_at(l, dt, op)(got, a + es, b, N);
				expect_same(dt, op, got, want, N,
					    fr_reduce_level_name(l));
			}
		}
	}
	free(a);
	free(b);
	free(want);
	free(got);
}

#ifdef HAVE_MXCSR
/*
 * Flush-to-zero and denormals-are-zero change float results, so the
 * reference no longer applies - but the levels must still agree with
 * each other.  This is what checks that the AVX-512 BF16 kernels, whose
 * conversion and denormal test do not follow MXCSR the way float
 * arithmetic does, give the portable bits under every mode.
 */
static void test_levels_mxcsr(void **state)
{
	/* FTZ, DAZ, both. */
	static const unsigned modes[] = { 0x8000, 0x0040, 0x8040 };
	enum { N = 0x10000 };
	uint16_t *a = xmalloc(N * 2), *b = xmalloc(N * 2);
	uint16_t *want = xmalloc(N * 2), *got = xmalloc(N * 2);
	fr_dtype_t dts[2] = { FR_F16, FR_BF16 };
	unsigned csr = _mm_getcsr();

	(void)state;
	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		for (int t = 0; t < 2; t++) {
			fr_dtype_t dt = dts[t];

			/* The permutations: they make the subnormals. */
			for (size_t r = 0; r < NPERM; r++) {
				half_round(dt, r, a, b);
				/* min/max compare bits: no MXCSR there. */
				for (int oi = FR_SUM; oi <= FR_PROD; oi++) {
					fr_op_t op = (fr_op_t)oi;
					char what[64];

					_mm_setcsr(csr | modes[m]);
					kernel_at(FR_REDUCE_PORTABLE, dt,
						  op)(want, a, b, N);
					for (int l = 1; l < nlevels(); l++) {
						kernel_at(l, dt, op)(got, a, b,
								     N);
						_mm_setcsr(csr);
						snprintf(what, sizeof(what),
							 "%s, MXCSR | 0x%04x, "
							 "round %zu",
							 fr_reduce_level_name(l),
							 modes[m], r);
						expect_same(dt, op, got, want,
							    N, what);
						_mm_setcsr(csr | modes[m]);
					}
					_mm_setcsr(csr);
				}
			}
		}
	}
	_mm_setcsr(csr);
	free(a);
	free(b);
	free(want);
	free(got);
}
#endif

/*
 * FR_TEST_EXHAUSTIVE=1: f16/bf16 sum, prod, min and max on all 2^32 pairs,
 * every level against the portable one (minutes, so not by default).
 */
static void test_half_exhaustive(void **state)
{
	enum { N = 0x10000 };
	const char *env = getenv("FR_TEST_EXHAUSTIVE");
	uint16_t *a, *b, *want, *got;
	fr_dtype_t dts[2] = { FR_F16, FR_BF16 };

	(void)state;
	if (!env || strcmp(env, "1") != 0 || nlevels() < 2)
		skip();
	a = xmalloc(N * 2);
	b = xmalloc(N * 2);
	want = xmalloc(N * 2);
	got = xmalloc(N * 2);
	for (uint32_t i = 0; i < N; i++)
		a[i] = (uint16_t)i;
	for (int t = 0; t < 2; t++) {
		for (int oi = 0; oi < FR_AVG; oi++) {
			fr_dtype_t dt = dts[t];
			fr_op_t op = (fr_op_t)oi;
			fr_reduce_fn k[FR_REDUCE_LEVEL_COUNT];

			for (int l = 0; l < nlevels(); l++)
				k[l] = kernel_at(l, dt, op);
			for (uint32_t y = 0; y < N; y++) {
				for (uint32_t i = 0; i < N; i++)
					b[i] = (uint16_t)y;
				k[0](want, a, b, N);
				for (int l = 1; l < nlevels(); l++) {
					char what[64];

					k[l](got, a, b, N);
					if (memcmp(got, want, N * 2) == 0)
						continue;
					snprintf(what, sizeof(what),
						 "%s, b = 0x%04x",
						 fr_reduce_level_name(l),
						 (unsigned)y);
					expect_same(dt, op, got, want, N, what);
				}
			}
		}
	}
	free(a);
	free(b);
	free(want);
	free(got);
}

/* The level interface itself. */
static void test_level_api(void **state)
{
	int max = fr_reduce_level_max();

	(void)state;
	assert_true(max >= FR_REDUCE_PORTABLE && max < FR_REDUCE_LEVEL_COUNT);
	for (int l = 0; l < FR_REDUCE_LEVEL_COUNT; l++) {
		assert_non_null(fr_reduce_level_name(l));
		assert_int_equal(fr_reduce_set_level(l), l <= max ? l : max);
		assert_int_equal(fr_reduce_level(), l <= max ? l : max);
	}
	assert_null(fr_reduce_level_name(-1));
	assert_null(fr_reduce_level_name(FR_REDUCE_LEVEL_COUNT));
	assert_string_equal(fr_reduce_level_name(FR_REDUCE_PORTABLE),
			    "portable");
	/* Negative: back to the best. */
	assert_int_equal(fr_reduce_set_level(-1), max);
	assert_int_equal(fr_reduce_level(), max);
#ifdef FR_REDUCE_NO_DISPATCH
	assert_int_equal(max, FR_REDUCE_PORTABLE);
#endif
}

/* The level the per-level group runs at. */
static int group_level;

static int group_setup(void **state)
{
	(void)state;
	return fr_reduce_set_level(group_level) == group_level ? 0 : -1;
}

static int group_teardown(void **state)
{
	(void)state;
	fr_reduce_set_level(-1);
	return 0;
}

int main(void)
{
	/* Run once per level: everything that calls a kernel. */
	const struct CMUnitTest per_level[] = {
		cmocka_unit_test(test_table),
		cmocka_unit_test(test_zero_length),
		cmocka_unit_test(test_lengths_filled),
		cmocka_unit_test(test_lengths_raw),
		cmocka_unit_test(test_tails_guarded),
		cmocka_unit_test(test_special_pairs),
		cmocka_unit_test(test_known_values),
		cmocka_unit_test(test_commutative),
		cmocka_unit_test(test_f16_kernel_roundtrip),
		cmocka_unit_test(test_scale_avg),
		cmocka_unit_test(test_scale_avg_known),
	};
	const struct CMUnitTest once[] = {
		cmocka_unit_test(test_level_api),
		cmocka_unit_test(test_half_patterns),
		cmocka_unit_test(test_levels_agree),
#ifdef HAVE_MXCSR
		cmocka_unit_test(test_levels_mxcsr),
#endif
		cmocka_unit_test(test_half_exhaustive),
		cmocka_unit_test(test_f16_roundtrip),
		cmocka_unit_test(test_bf16_roundtrip),
		cmocka_unit_test(test_f32_to_half),
		cmocka_unit_test(test_known_conversions),
		cmocka_unit_test(test_ref_fill),
		cmocka_unit_test(test_first_diff),
	};
	int failed = 0;

	for (int l = 0; l < FR_REDUCE_LEVEL_COUNT; l++) {
		char name[64];

		snprintf(name, sizeof(name), "kernels, level %s",
			 fr_reduce_level_name(l));
		if (l > fr_reduce_level_max()) {
			printf("[ SKIPPED  ] %s: not on this CPU or build\n",
			       name);
			continue;
		}
		group_level = l;
		/* cmocka does not print a group's name; say which it is. */
		printf("[==========] %s\n", name);
		fflush(stdout);
		failed += _cmocka_run_group_tests(
			name, per_level, sizeof(per_level) / sizeof(*per_level),
			group_setup, group_teardown);
	}
	printf("[==========] conversions, levels compared\n");
	fflush(stdout);
	failed += cmocka_run_group_tests_name("conversions, levels compared",
					      once, NULL, NULL);
	return failed;
}
