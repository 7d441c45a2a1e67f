/* SPDX-License-Identifier: MIT */
/*
 * fuzz_tune.c - libFuzzer harness: the tune file (FR_TUNE_FILE, written by
 * fr_tune(1), read by every rank at fr_comm_create).  The input is the
 * file.  Loading must not crash; it either refuses the file with a message
 * or leaves finite, non-negative costs for the model to use.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "algo.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int fd = -1;
static struct fr_tune tune;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *transports[] = {"tcp", "shm", "verbs", "shm+tcp"};
	char err[256], path[64];

	if (fd < 0) {
		fd = memfd_create("fuzz_tune", MFD_CLOEXEC);
		if (fd < 0)
			exit(1);
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		setenv("FR_TUNE_FILE", path, 1);
		setenv("FR_LOG", "error", 1); /* no warning per key */
	}
	if (ftruncate(fd, 0) ||
	    (size && pwrite(fd, data, size, 0) != (ssize_t)size))
		exit(1);
	memset(&tune, 0, sizeof(tune));
	if (fr_tune_load(&tune, transports[size % 4], err, sizeof(err))) {
		if (!memchr(err, '\0', sizeof(err)))
			abort();
		return 0;
	}
	if (!isfinite(tune.alpha_us) || tune.alpha_us < 0 ||
	    !isfinite(tune.beta_ns) || tune.beta_ns < 0 ||
	    !isfinite(tune.copy_ns) || tune.copy_ns < 0)
		abort();
	for (int i = 0; i < FR_DTYPE_COUNT; i++)
		if (!isfinite(tune.gamma_ns[i]) || tune.gamma_ns[i] < 0)
			abort();
	return 0;
}
