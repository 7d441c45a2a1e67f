/* SPDX-License-Identifier: MIT */
/*
 * compress.h - wire formats for f32 data (bf16, fp16, int8 with a scale per
 * block), see fr_compress_t in fastreduce.h.
 *
 * A format encodes `count` values from their start independently of what
 * comes before, in units: one value for bf16/fp16, one block of
 * FR_INT8_BLOCK values (f32 scale, then the bytes) for int8; so the first
 * k values (k a whole number of units, or all of them) take
 * fr_compress_bytes(fmt, k) bytes and can be decoded on their own.
 */
#ifndef FR_COMPRESS_H
#define FR_COMPRESS_H

#include <stddef.h>

#include "fastreduce.h"

/* Values per unit (1, or FR_INT8_BLOCK for int8). */
size_t fr_codec_unit(int fmt);
/*
 * Encode src[0, count) into dst (count a whole number of units, or the
 * tail of a chunk).  With residual (error feedback): x = src + residual is
 * encoded and residual = x - decode(encode(x)).  When out is not NULL it
 * receives decode(encode(x)), the value every other rank will see.
 */
void fr_codec_encode(int fmt, void *dst, const float *src, size_t count,
		     float *residual, float *out);
/* dst[0, count) = the values encoded at src. */
void fr_codec_decode(int fmt, float *dst, const void *src, size_t count);
/* Values of a chunk of chunk_count fully present in its first `bytes`
 * encoded bytes (whole units only, or the whole chunk). */
size_t fr_codec_values_in(int fmt, size_t bytes, size_t chunk_count);

#endif
