/* SPDX-License-Identifier: MIT */
/*
 * perf_kernel.c - the reduction kernels timed as the cost model's gamma,
 * the same way for fr_tune(1) and fr_step(1).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "perf_common.h"
#include "perf_kernel.h"
#include "reduce.h"

double pc_kernel_ns(fr_dtype_t dtype)
{
	size_t bytes = 256u << 10, n = bytes / fr_dtype_size(dtype);
	uint8_t *a = calloc(1, bytes), *b = calloc(1, bytes);
	fr_reduce_fn k = fr_reduce_kernel(dtype, FR_SUM);
	double best = 1e30;

	if (!a || !b || !k) {
		free(a);
		free(b);
		return -1;
	}
	for (int r = 0; r < 7; r++) {
		uint64_t t0 = pc_now_ns();

		for (int i = 0; i < 20; i++)
			k(a, a, b, n);
		best = fmin(best, (double)(pc_now_ns() - t0) / (20.0 * bytes));
	}
	free(a);
	free(b);
	return best;
}
