/* SPDX-License-Identifier: MIT */
/*
 * compress.c - the wire formats of compressed All-Reduce (compress.h).
 *
 * bf16 and fp16 round to nearest even through the same conversions the
 * f16/bf16 reduction kernels use (reduce.c).  int8 keeps, per block of
 * FR_INT8_BLOCK values, the scale s = max|x| / 127 as an f32 and each value
 * as round(x / s) in [-127, 127]; it decodes as q * s, one IEEE multiply,
 * so every rank that decodes the same bytes gets the same bits.  A block
 * holding inf or NaN has no finite scale: it is sent with a NaN scale and
 * arrives as NaN (and leaves no residual behind, which would poison every
 * later step).
 */
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* hot loops over every gradient value: let GCC vectorize them */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize")
#endif

#include "compress.h"
#include "reduce.h"

static const char *const names[FR_COMPRESS_COUNT] = {
	[FR_COMPRESS_NONE] = "none",
	[FR_COMPRESS_BF16] = "bf16",
	[FR_COMPRESS_FP16] = "fp16",
	[FR_COMPRESS_INT8] = "int8",
};

const char *fr_compress_name(int compress)
{
	return compress >= 0 && compress < FR_COMPRESS_COUNT ? names[compress]
							     : "?";
}

int fr_compress_from_name(const char *name, fr_compress_t *compress)
{
	static const struct {
		const char *name;
		fr_compress_t c;
	} alias[] = {
		{"fp32", FR_COMPRESS_NONE},	{"f32", FR_COMPRESS_NONE},
		{"f16", FR_COMPRESS_FP16},	{"half", FR_COMPRESS_FP16},
		{"bfloat16", FR_COMPRESS_BF16},
	};

	if (!name || !compress)
		return FR_EINVAL;
	for (int i = 0; i < FR_COMPRESS_COUNT; i++)
		if (!strcmp(name, names[i])) {
			*compress = (fr_compress_t)i;
			return 0;
		}
	for (size_t i = 0; i < sizeof(alias) / sizeof(alias[0]); i++)
		if (!strcmp(name, alias[i].name)) {
			*compress = alias[i].c;
			return 0;
		}
	return FR_EINVAL;
}

size_t fr_compress_bytes(int compress, size_t count)
{
	switch (compress) {
	case FR_COMPRESS_NONE:
		return count * sizeof(float);
	case FR_COMPRESS_BF16:
	case FR_COMPRESS_FP16:
		return count * sizeof(uint16_t);
	case FR_COMPRESS_INT8:
		return count + (count + FR_INT8_BLOCK - 1) / FR_INT8_BLOCK *
				       sizeof(float);
	}
	return 0;
}

size_t fr_codec_unit(int fmt)
{
	return fmt == FR_COMPRESS_INT8 ? FR_INT8_BLOCK : 1;
}

size_t fr_codec_values_in(int fmt, size_t bytes, size_t chunk_count)
{
	size_t full = FR_INT8_BLOCK + sizeof(float), v;

	if (bytes >= fr_compress_bytes(fmt, chunk_count))
		return chunk_count;
	switch (fmt) {
	case FR_COMPRESS_BF16:
	case FR_COMPRESS_FP16:
		v = bytes / sizeof(uint16_t);
		break;
	case FR_COMPRESS_INT8:
		v = bytes / full * FR_INT8_BLOCK;
		break;
	default:
		v = bytes / sizeof(float);
	}
	return v < chunk_count ? v : chunk_count;
}

/* bf16 inline (the kernels' converters live in another file and would be
 * a call per value): round to nearest even, NaN stays a quiet NaN. */
static inline uint16_t bf16_enc(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (uint16_t)((u >> 16) | 0x40);
	return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline float bf16_dec(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

/* Branch-free loops over a block, so that the compiler vectorizes them. */
static void int8_block(uint8_t *dst, const float *src, size_t n, float *res,
		       float *out)
{
	float x[FR_INT8_BLOCK], m = 0, s, inv;
	int8_t *q = (int8_t *)(dst + sizeof(float));
	int nan = 0;

	if (res)
		for (size_t i = 0; i < n; i++)
			x[i] = src[i] + res[i];
	else
		memcpy(x, src, n * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		float a = fabsf(x[i]);

		m = a > m ? a : m;
		nan |= a != a;
	}
	if (nan || !(m <= 3.4028234e38f)) {
		/* no finite scale: the block arrives as NaN */
		s = NAN;
		memcpy(dst, &s, sizeof(s));
		memset(q, 0, n);
		for (size_t i = 0; i < n; i++) {
			if (res)
				res[i] = 0;
			if (out)
				out[i] = NAN;
		}
		return;
	}
	s = m / 127.0f;
	memcpy(dst, &s, sizeof(s));
	inv = m > 0 ? 127.0f / m : 0;
	for (size_t i = 0; i < n; i++) {
		/* round half away from zero by truncation: no libm call, and
		 * only the encoder rounds (decoding is one multiply); x * (127
		 * / m) can land a hair past 127 */
		float v = x[i] * inv;

		v += v >= 0 ? 0.5f : -0.5f;
		v = v > 127.0f ? 127.0f : v;
		v = v < -127.0f ? -127.0f : v;
		q[i] = (int8_t)(int)v;
	}
	if (res)
		for (size_t i = 0; i < n; i++)
			res[i] = x[i] - (float)q[i] * s;
	if (out)
		for (size_t i = 0; i < n; i++)
			out[i] = (float)q[i] * s;
}

void fr_codec_encode(int fmt, void *dst, const float *src, size_t count,
		     float *residual, float *out)
{
	uint16_t *h = dst;
	uint8_t *b = dst;

	switch (fmt) {
	case FR_COMPRESS_BF16:
		if (!residual && !out) {
			for (size_t i = 0; i < count; i++)
				h[i] = bf16_enc(src[i]);
			break;
		}
		for (size_t i = 0; i < count; i++) {
			float x = residual ? src[i] + residual[i] : src[i], d;

			h[i] = bf16_enc(x);
			d = bf16_dec(h[i]);
			/* inf - inf would leave NaN behind for good */
			if (residual)
				residual[i] = isfinite(d) ? x - d : 0;
			if (out)
				out[i] = d;
		}
		break;
	case FR_COMPRESS_FP16:
		for (size_t i = 0; i < count; i++) {
			float x = residual ? src[i] + residual[i] : src[i], d;

			h[i] = fr_f32_to_f16(x);
			d = fr_f16_to_f32(h[i]);
			/* inf - inf would leave NaN behind for good */
			if (residual)
				residual[i] = isfinite(d) ? x - d : 0;
			if (out)
				out[i] = d;
		}
		break;
	case FR_COMPRESS_INT8:
		for (size_t i = 0; i < count; i += FR_INT8_BLOCK) {
			size_t n = count - i < FR_INT8_BLOCK ? count - i
							     : FR_INT8_BLOCK;

			int8_block(b, src + i, n,
				   residual ? residual + i : NULL,
				   out ? out + i : NULL);
			b += sizeof(float) + n;
		}
		break;
	default:
		if (out)
			memcpy(out, src, count * sizeof(float));
		memcpy(dst, src, count * sizeof(float));
	}
}

void fr_codec_decode(int fmt, float *dst, const void *src, size_t count)
{
	const uint16_t *h = src;
	const uint8_t *b = src;

	switch (fmt) {
	case FR_COMPRESS_BF16:
		for (size_t i = 0; i < count; i++)
			dst[i] = bf16_dec(h[i]);
		break;
	case FR_COMPRESS_FP16:
		for (size_t i = 0; i < count; i++)
			dst[i] = fr_f16_to_f32(h[i]);
		break;
	case FR_COMPRESS_INT8:
		for (size_t i = 0; i < count; i += FR_INT8_BLOCK) {
			size_t n = count - i < FR_INT8_BLOCK ? count - i
							     : FR_INT8_BLOCK;
			const int8_t *q = (const int8_t *)(b + sizeof(float));
			float s;

			memcpy(&s, b, sizeof(s));
			for (size_t j = 0; j < n; j++)
				dst[i + j] = (float)q[j] * s;
			b += sizeof(float) + n;
		}
		break;
	default:
		memcpy(dst, src, count * sizeof(float));
	}
}
