/* SPDX-License-Identifier: MIT */
/*
 * reference.h - a deliberately simple scalar model of the reduction kernels,
 * for tests (the kernel unit test and the multi-process All-Reduce test).
 *
 * It is written apart from src/reduce.c on purpose: its own f16/bf16
 * conversions (integer rounding with guard and sticky bits, where the
 * kernels use float tricks or F16C), its own NaN and signed-zero handling
 * (isnan/signbit, where the kernels compare integer keys).  The semantics it
 * encodes, element by element:
 *   - sum/prod/avg: the IEEE operation in the type (f16 and bf16 in float,
 *     then rounded to nearest-even); integer sum/prod wrap.  FR_AVG combines
 *     as FR_SUM; ref_scale_avg() is the final division.
 *   - min/max: NaN if either input is NaN; min(-0, +0) = -0,
 *     max(-0, +0) = +0.
 *   - Any NaN a combination produces is the canonical quiet NaN:
 *     0x7fc00000, 0x7ff8000000000000, 0x7e00 (f16), 0x7fc0 (bf16).
 *   - Conversions keep a NaN's sign, make it quiet and keep the top of its
 *     payload.
 * Everything is static inline and reads and writes memory with memcpy, so
 * the buffers need no particular alignment.
 */
#ifndef FR_TESTS_REFERENCE_H
#define FR_TESTS_REFERENCE_H

#include <fastreduce.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* ---- bits ---------------------------------------------------------------- */

static inline uint32_t ref_f32_bits(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline float ref_f32_from(uint32_t u)
{
	float f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline uint64_t ref_f64_bits(double f)
{
	uint64_t u;

	memcpy(&u, &f, sizeof(u));
	return u;
}

static inline double ref_f64_from(uint64_t u)
{
	double f;

	memcpy(&f, &u, sizeof(f));
	return f;
}

static inline size_t ref_dtype_size(fr_dtype_t dt)
{
	switch (dt) {
	case FR_I8:
	case FR_U8:
		return 1;
	case FR_F16:
	case FR_BF16:
		return 2;
	case FR_F32:
	case FR_I32:
	case FR_U32:
		return 4;
	case FR_F64:
	case FR_I64:
	case FR_U64:
		return 8;
	default:
		return 0;
	}
}

/* ---- f16 / bf16 conversions --------------------------------------------- */

/*
 * Shift v right by s bits, rounding to nearest-even on the bits shifted out.
 * Any s >= 0 works (v < 2^32).
 */
static inline uint32_t ref_shift_rne(uint32_t v, unsigned s)
{
	uint32_t q, rem, half;

	if (s == 0)
		return v;
	if (s > 32)
		return 0;	/* v < 2^32 <= 2^(s-1): below one half */
	q = s == 32 ? 0 : v >> s;
	rem = s == 32 ? v : v & ((UINT32_C(1) << s) - 1);
	half = UINT32_C(1) << (s - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return q;
}

static inline float ref_f16_to_f32(uint16_t h)
{
	int sign = h >> 15;
	int exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	float v;

	if (exp == 0x1f) {
		if (man)	/* NaN: quiet, payload on top */
			return ref_f32_from((uint32_t)sign << 31 | 0x7fc00000u |
					    man << 13);
		v = INFINITY;
	} else if (exp == 0) {
		v = ldexpf((float)man, -24);
	} else {
		v = ldexpf((float)(man | 0x400), exp - 25);
	}
	return sign ? -v : v;
}

static inline uint16_t ref_f32_to_f16(float f)
{
	uint32_t x = ref_f32_bits(f);
	uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
	int exp = (int)((x >> 23) & 0xff);
	uint32_t man = x & 0x7fffff;
	uint32_t sig, q;
	int e;

	if (exp == 0xff) {
		if (man)
			return (uint16_t)(sign | 0x7e00 | (man >> 13));
		return (uint16_t)(sign | 0x7c00);
	}
	if (exp == 0 && man == 0)
		return sign;
	/* value = sig * 2^(e - 23), sig with its leading one where there is
	 * one (float subnormals have none). */
	if (exp == 0) {
		sig = man;
		e = -126;
	} else {
		sig = man | 0x800000;
		e = exp - 127;
	}
	if (e >= 16)
		return (uint16_t)(sign | 0x7c00);
	if (e >= -14) {
		/* f16 normal range: keep 11 significant bits. */
		q = ref_shift_rne(sig, 13);	/* 0x400 .. 0x800 */
		q = (uint32_t)(e + 15) * 0x400 + (q - 0x400);
		if (q >= 0x7c00)
			return (uint16_t)(sign | 0x7c00);
		return (uint16_t)(sign | q);
	}
	/* f16 subnormal: multiples of 2^-24, i.e. shift 13 + (-14 - e). */
	q = ref_shift_rne(sig, (unsigned)(13 + (-14 - e)));
	/* q == 0x400 here is right too: the smallest normal. */
	return (uint16_t)(sign | q);
}

static inline float ref_bf16_to_f32(uint16_t h)
{
	return ref_f32_from((uint32_t)h << 16);
}

static inline uint16_t ref_f32_to_bf16(float f)
{
	uint32_t x = ref_f32_bits(f);

	if (isnan(f))
		return (uint16_t)((x >> 16) | 0x40);
	/* A carry out of the mantissa rightly gives Inf. */
	return (uint16_t)ref_shift_rne(x, 16);
}

static inline float ref_half_to_f32(fr_dtype_t dt, uint16_t h)
{
	return dt == FR_F16 ? ref_f16_to_f32(h) : ref_bf16_to_f32(h);
}

static inline uint16_t ref_f32_to_half(fr_dtype_t dt, float f)
{
	return dt == FR_F16 ? ref_f32_to_f16(f) : ref_f32_to_bf16(f);
}

/* ---- one element ------------------------------------------------------- */

static inline int ref_is_float(fr_dtype_t dt)
{
	return dt == FR_F32 || dt == FR_F64 || dt == FR_F16 || dt == FR_BF16;
}

/* Combine in double; exact for min/max, and for sum/prod the caller rounds
 * (float) or the operation is done in double precision (f64). */
static inline double ref_fminmax(fr_op_t op, double x, double y)
{
	if (isnan(x) || isnan(y))
		return NAN;
	if (x == y) {
		/* Equal, but maybe zeros of different signs. */
		int neg = op == FR_MIN ? (signbit(x) || signbit(y))
				       : (signbit(x) && signbit(y));

		return x == 0 ? (neg ? -0.0 : 0.0) : x;
	}
	if (op == FR_MIN)
		return x < y ? x : y;
	return x > y ? x : y;
}

static inline float ref_f32_op(fr_op_t op, float x, float y)
{
	float r;

	switch (op) {
	case FR_SUM:
	case FR_AVG:
		r = x + y;
		break;
	case FR_PROD:
		r = x * y;
		break;
	default:
		r = (float)ref_fminmax(op, x, y);
		break;
	}
	return isnan(r) ? ref_f32_from(0x7fc00000u) : r;
}

static inline double ref_f64_op(fr_op_t op, double x, double y)
{
	double r;

	switch (op) {
	case FR_SUM:
	case FR_AVG:
		r = x + y;
		break;
	case FR_PROD:
		r = x * y;
		break;
	default:
		r = ref_fminmax(op, x, y);
		break;
	}
	return isnan(r) ? ref_f64_from(UINT64_C(0x7ff8000000000000)) : r;
}

/* Wrapping integer combination, on values widened to 64 bits; the caller
 * truncates.  Unsigned arithmetic wraps modulo 2^64, which is also right
 * modulo 2^8 and 2^32. */
static inline uint64_t ref_int_op(fr_op_t op, int is_signed, uint64_t x,
				  uint64_t y)
{
	switch (op) {
	case FR_SUM:
		return x + y;
	case FR_PROD:
		return x * y;
	case FR_MIN:
	case FR_MAX: {
		int less = is_signed ? (int64_t)x < (int64_t)y : x < y;

		if (op == FR_MIN)
			return less ? x : y;
		return less ? y : x;
	}
	default:
		return 0;
	}
}

/* ---- public helpers ------------------------------------------------------ */

/*
 * dst[i] = a[i] op b[i], the reference semantics.  dst may alias a or b.
 * Invalid pairs (avg on integers, out-of-range values) leave dst alone.
 */
static inline void ref_combine(fr_dtype_t dt, fr_op_t op, void *dst,
			       const void *a, const void *b, size_t n)
{
	size_t es = ref_dtype_size(dt);
	unsigned char *d = (unsigned char *)dst;
	const unsigned char *pa = (const unsigned char *)a;
	const unsigned char *pb = (const unsigned char *)b;

	if (es == 0 || (unsigned)op >= FR_OP_COUNT)
		return;
	if (op == FR_AVG && !ref_is_float(dt))
		return;
	for (size_t i = 0; i < n; i++) {
		const unsigned char *xa = pa + i * es, *xb = pb + i * es;
		unsigned char *xd = d + i * es;

		switch (dt) {
		case FR_F32: {
			float x, y, r;

			memcpy(&x, xa, 4);
			memcpy(&y, xb, 4);
			r = ref_f32_op(op, x, y);
			memcpy(xd, &r, 4);
			break;
		}
		case FR_F64: {
			double x, y, r;

			memcpy(&x, xa, 8);
			memcpy(&y, xb, 8);
			r = ref_f64_op(op, x, y);
			memcpy(xd, &r, 8);
			break;
		}
		case FR_F16:
		case FR_BF16: {
			uint16_t hx, hy, hr;
			float x, y;

			memcpy(&hx, xa, 2);
			memcpy(&hy, xb, 2);
			x = ref_half_to_f32(dt, hx);
			y = ref_half_to_f32(dt, hy);
			hr = ref_f32_to_half(dt, ref_f32_op(op, x, y));
			memcpy(xd, &hr, 2);
			break;
		}
		default: {
			/* Integers, via their own types (any byte order). */
			uint64_t x = 0, y = 0, r;
			int sgn = dt == FR_I8 || dt == FR_I32 || dt == FR_I64;

			if (es == 1) {
				int8_t sx, sy;
				uint8_t ux, uy;

				memcpy(&sx, xa, 1);
				memcpy(&sy, xb, 1);
				memcpy(&ux, xa, 1);
				memcpy(&uy, xb, 1);
				x = sgn ? (uint64_t)(int64_t)sx : ux;
				y = sgn ? (uint64_t)(int64_t)sy : uy;
			} else if (es == 4) {
				int32_t sx, sy;
				uint32_t ux, uy;

				memcpy(&sx, xa, 4);
				memcpy(&sy, xb, 4);
				memcpy(&ux, xa, 4);
				memcpy(&uy, xb, 4);
				x = sgn ? (uint64_t)(int64_t)sx : ux;
				y = sgn ? (uint64_t)(int64_t)sy : uy;
			} else {
				memcpy(&x, xa, 8);
				memcpy(&y, xb, 8);
			}
			r = ref_int_op(op, sgn, x, y);
			if (es == 1) {
				uint8_t v = (uint8_t)r;

				memcpy(xd, &v, 1);
			} else if (es == 4) {
				uint32_t v = (uint32_t)r;

				memcpy(xd, &v, 4);
			} else {
				memcpy(xd, &r, 8);
			}
			break;
		}
		}
	}
}

/*
 * buf[i] /= nranks for floating types (f16/bf16 in float, rounded to
 * nearest-even; a NaN result is the canonical NaN).  Integers, and
 * nranks <= 1, leave buf alone.
 */
static inline void ref_scale_avg(fr_dtype_t dt, void *buf, size_t n,
				 int nranks)
{
	unsigned char *p = (unsigned char *)buf;

	if (nranks <= 1 || !ref_is_float(dt))
		return;
	for (size_t i = 0; i < n; i++) {
		if (dt == FR_F64) {
			double v;

			memcpy(&v, p + i * 8, 8);
			v = v / (double)nranks;
			if (isnan(v))
				v = ref_f64_from(UINT64_C(0x7ff8000000000000));
			memcpy(p + i * 8, &v, 8);
		} else if (dt == FR_F32) {
			float v;

			memcpy(&v, p + i * 4, 4);
			v = v / (float)nranks;
			if (isnan(v))
				v = ref_f32_from(0x7fc00000u);
			memcpy(p + i * 4, &v, 4);
		} else {
			uint16_t h;
			float v;

			memcpy(&h, p + i * 2, 2);
			v = ref_half_to_f32(dt, h);
			v = v / (float)nranks;
			if (isnan(v))
				v = ref_f32_from(0x7fc00000u);
			h = ref_f32_to_half(dt, v);
			memcpy(p + i * 2, &h, 2);
		}
	}
}

/* A 32-bit hash of (seed, rank, index), so that element i of a rank's
 * input does not depend on the length of the buffer (splitmix64). */
static inline uint32_t ref_hash(uint32_t seed, int rank, size_t i)
{
	uint64_t z = ((uint64_t)seed * UINT64_C(0x9e3779b97f4a7c15)) ^
		     ((uint64_t)(uint32_t)rank << 40) ^ (uint64_t)i;

	z += UINT64_C(0x9e3779b97f4a7c15);
	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	z ^= z >> 31;
	return (uint32_t)(z >> 32);
}

/*
 * Deterministic input for one rank.  Floats: +-k/16 for k in 8..32
 * (magnitudes 0.5..2, exact in every floating type), one in 32 a signed
 * zero: sums over 8 ranks stay within +-16, products within 2^+-8, and the
 * order of the operations still matters in the last bits of products.
 * Integers: -8..8 (0..16 unsigned), one in 16 an extreme of the type, so
 * 8-bit products wrap and sums of extremes wrap, deterministically.
 */
static inline void ref_fill(fr_dtype_t dt, void *buf, size_t n, int rank,
			    uint32_t seed)
{
	size_t es = ref_dtype_size(dt);
	unsigned char *p = (unsigned char *)buf;

	for (size_t i = 0; i < n; i++) {
		uint32_t dseed = seed ^ (uint32_t)dt * 0x1000193u;
		uint32_t h = ref_hash(dseed, rank, i);
		unsigned char *x = p + i * es;

		if (ref_is_float(dt)) {
			float v = (float)(8 + (h >> 8) % 25) / 16.0f;

			if ((h & 31) == 0)
				v = 0.0f;
			if (h & 0x80)
				v = -v;
			if (dt == FR_F32) {
				memcpy(x, &v, 4);
			} else if (dt == FR_F64) {
				double dv = v;

				memcpy(x, &dv, 8);
			} else {
				uint16_t hv = ref_f32_to_half(dt, v);

				memcpy(x, &hv, 2);
			}
			continue;
		}
		{
			int sgn = dt == FR_I8 || dt == FR_I32 || dt == FR_I64;
			int64_t v = (int64_t)((h >> 8) % 17) - (sgn ? 8 : 0);

			if ((h & 15) == 0) {
				/* An extreme: the maximum, or the minimum
				 * for signed types. */
				int top = (h & 0x10) != 0;

				if (es == 1)
					v = sgn ? (top ? 127 : -128) : 255;
				else if (es == 4)
					v = sgn ? (top ? INT32_MAX : INT32_MIN)
						: (int64_t)UINT32_MAX;
				else
					v = sgn && !top ? INT64_MIN : INT64_MAX;
			}
			if (es == 1) {
				uint8_t u = (uint8_t)v;

				memcpy(x, &u, 1);
			} else if (es == 4) {
				uint32_t u = (uint32_t)v;

				memcpy(x, &u, 4);
			} else {
				uint64_t u = (uint64_t)v;

				if (!sgn && (h & 15) == 0)
					u = UINT64_MAX;
				memcpy(x, &u, 8);
			}
		}
	}
}

static inline int ref_equal_bits(const void *a, const void *b, size_t bytes)
{
	return bytes == 0 || memcmp(a, b, bytes) == 0;
}

/* One element as text: its value and, for floats, its bits. */
static inline void ref_format(fr_dtype_t dt, const void *p, char *buf,
			      size_t len)
{
	switch (dt) {
	case FR_F32: {
		float v;

		memcpy(&v, p, 4);
		snprintf(buf, len, "%.9g (0x%08lx)", (double)v,
			 (unsigned long)ref_f32_bits(v));
		break;
	}
	case FR_F64: {
		double v;

		memcpy(&v, p, 8);
		snprintf(buf, len, "%.17g (0x%016llx)", v,
			 (unsigned long long)ref_f64_bits(v));
		break;
	}
	case FR_F16:
	case FR_BF16: {
		uint16_t h;

		memcpy(&h, p, 2);
		snprintf(buf, len, "%.9g (0x%04x)",
			 (double)ref_half_to_f32(dt, h), (unsigned)h);
		break;
	}
	case FR_I8: {
		int8_t v;

		memcpy(&v, p, 1);
		snprintf(buf, len, "%d", v);
		break;
	}
	case FR_U8: {
		uint8_t v;

		memcpy(&v, p, 1);
		snprintf(buf, len, "%u", v);
		break;
	}
	case FR_I32: {
		int32_t v;

		memcpy(&v, p, 4);
		snprintf(buf, len, "%ld", (long)v);
		break;
	}
	case FR_U32: {
		uint32_t v;

		memcpy(&v, p, 4);
		snprintf(buf, len, "%lu", (unsigned long)v);
		break;
	}
	case FR_I64: {
		int64_t v;

		memcpy(&v, p, 8);
		snprintf(buf, len, "%lld", (long long)v);
		break;
	}
	case FR_U64: {
		uint64_t v;

		memcpy(&v, p, 8);
		snprintf(buf, len, "%llu", (unsigned long long)v);
		break;
	}
	default:
		snprintf(buf, len, "?");
		break;
	}
}

/*
 * NULL if got and want have the same bits, else "index I: got G, want W"
 * for the first element that differs, written into buf.
 */
static inline const char *ref_first_diff(fr_dtype_t dt, const void *got,
					 const void *want, size_t n, char *buf,
					 size_t len)
{
	size_t es = ref_dtype_size(dt);
	const unsigned char *g = (const unsigned char *)got;
	const unsigned char *w = (const unsigned char *)want;
	char gs[64], ws[64], msg[192];
	size_t k;

	if (es == 0) {
		if (len)
			snprintf(buf, len, "invalid dtype %d", (int)dt);
		return buf;
	}
	for (size_t i = 0; i < n; i++) {
		if (memcmp(g + i * es, w + i * es, es) == 0)
			continue;
		ref_format(dt, g + i * es, gs, sizeof(gs));
		ref_format(dt, w + i * es, ws, sizeof(ws));
		/* msg has room for everything; buf may cut it short. */
		snprintf(msg, sizeof(msg), "index %zu of %zu: got %s, want %s",
			 i, n, gs, ws);
		k = strlen(msg);
		if (len == 0)
			return buf;
		if (k >= len)
			k = len - 1;
		memcpy(buf, msg, k);
		buf[k] = '\0';
		return buf;
	}
	return NULL;
}

#endif
