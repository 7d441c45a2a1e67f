/* SPDX-License-Identifier: MIT */
/*
 * reduce.h - reduction kernels: one table of dtype x op.
 *
 * dst[i] = a[i] OP b[i] for i < n.  dst may alias a or b (exactly, not
 * partially).  Every kernel is commutative bit for bit (a OP b has the same
 * bits as b OP a), which with the ring's fixed order makes results
 * deterministic:
 *   - f16/bf16 are converted to float, combined, and rounded back to
 *     nearest-even after every call;
 *   - min/max return NaN if either input is NaN; between +0 and -0 min
 *     gives -0 and max gives +0;
 *   - integer sum/prod wrap modulo 2^bits.
 * FR_AVG uses the SUM kernel; the final division by the number of ranks is
 * fr_reduce_scale_avg().
 */
#ifndef FR_REDUCE_H
#define FR_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "fastreduce.h"

typedef void (*fr_reduce_fn)(void *dst, const void *a, const void *b,
			     size_t n);

/* The kernel for (dtype, op), or NULL if the pair is invalid (AVG on an
 * integer type, out-of-range values). */
fr_reduce_fn fr_reduce_kernel(fr_dtype_t dtype, fr_op_t op);
/*
 * For the simulator (perf/sim), which times schedules without their data:
 * from now on fr_reduce_kernel() returns fn for every valid pair (NULL:
 * the real kernels again).  Process-wide and not thread-safe: set it
 * while no communicator runs a collective; kernels already returned keep
 * theirs.
 */
void fr_reduce_set_hook(fr_reduce_fn fn);
/* 0 if (dtype, op) is a valid pair, else FR_EINVAL. */
int fr_reduce_check(fr_dtype_t dtype, fr_op_t op);
/* buf[i] = buf[i] / nranks for a floating dtype (f16/bf16 through float,
 * rounded to nearest-even); no-op for other types. */
void fr_reduce_scale_avg(fr_dtype_t dtype, void *buf, size_t n, int nranks);

/*
 * Kernel sets.  Every set gives the same bits for every input; they differ
 * only in the instructions used.  The best set the CPU supports is chosen
 * once, on first use.
 */
enum fr_reduce_level {
	FR_REDUCE_PORTABLE,	/* plain C for the compiler's baseline */
	FR_REDUCE_AVX2,		/* AVX2 + F16C */
	FR_REDUCE_AVX512,	/* AVX-512 F, BW, DQ and VL */
	FR_REDUCE_AVX512_BF16,	/* the same and AVX512_BF16 */
	FR_REDUCE_LEVEL_COUNT
};

/* The set fr_reduce_kernel() and fr_reduce_scale_avg() use now. */
int fr_reduce_level(void);
/* The best set this CPU and this build support. */
int fr_reduce_level_max(void);
/*
 * For tests and benchmarks: use `level` from now on, or the best supported
 * set below it; a negative level goes back to the best.  Returns the set
 * now in use.  Kernels fr_reduce_kernel() has already returned keep theirs.
 */
int fr_reduce_set_level(int level);
/* "portable", "avx2", "avx512", "avx512-bf16"; NULL if out of range. */
const char *fr_reduce_level_name(int level);

/* Conversions (round to nearest-even; NaN stays NaN, keeping its sign). */
float fr_f16_to_f32(uint16_t h);
uint16_t fr_f32_to_f16(float f);
float fr_bf16_to_f32(uint16_t h);
uint16_t fr_f32_to_bf16(float f);

#endif
