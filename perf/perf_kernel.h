/* SPDX-License-Identifier: MIT */
/*
 * perf_kernel.h - the reduction kernels timed as the cost model's gamma
 * (fr_tune and fr_step, which link the library's internals).
 */
#ifndef FR_PERF_KERNEL_H
#define FR_PERF_KERNEL_H

#include "fastreduce.h"

/* ns per byte of one input of dtype's sum kernel, in cache (best of 7
 * rounds of 20 sums over 256 KiB); negative if out of memory. */
double pc_kernel_ns(fr_dtype_t dtype);

#endif
