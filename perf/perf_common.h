/* SPDX-License-Identifier: MIT */
/*
 * perf_common.h - small helpers shared by the perf tools and frrun.
 *
 * Header-only (static inline) on purpose: frrun links no library at all and
 * fr_allreduce_perf may use only the public API, so these helpers cannot
 * live in libfrcore.  Keep this file small; anything bigger belongs in the
 * tool that needs it.
 */
#ifndef FR_PERF_COMMON_H
#define FR_PERF_COMMON_H

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PC_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define PC_MIN(a, b) ((a) < (b) ? (a) : (b))

/* qsort's comparison of two uint64_t, ascending. */
static inline int pc_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Monotonic clock in nanoseconds: immune to NTP steps during a run. */
static inline uint64_t pc_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * Parse a whole decimal number into [min, max].  Returns 0 or -1.  Rejects
 * empty strings, leading blanks and trailing garbage, which strtol alone
 * would accept silently ("-n 4x" must be an error, not 4).
 */
static inline int pc_parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	if (!s || !*s || isspace((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* A non-negative decimal number of seconds ("2", "0.5"); 0 or -1. */
static inline int pc_parse_seconds(const char *s, double *out)
{
	char *end;
	double v;

	if (!s || !*s || isspace((unsigned char)*s) || *s == '-')
		return -1;
	errno = 0;
	v = strtod(s, &end);
	if (errno || *end || !(v >= 0) || v > 1e9)
		return -1;
	*out = v;
	return 0;
}

/*
 * Parse a byte count with an optional K/M/G suffix (powers of 1024, as in
 * nccl-tests and perftest) and an optional trailing "B": "8", "64M", "1GB".
 * Returns 0 or -1 (syntax error or overflow).
 */
static inline int pc_parse_size(const char *s, size_t *out)
{
	unsigned long long v, mul = 1;
	char *end;

	if (!s || !isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	switch (*end) {
	case 'k':
	case 'K':
		mul = 1ull << 10;
		end++;
		break;
	case 'm':
	case 'M':
		mul = 1ull << 20;
		end++;
		break;
	case 'g':
	case 'G':
		mul = 1ull << 30;
		end++;
		break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end || (v && mul > SIZE_MAX / v))
		return -1;
	*out = (size_t)(v * mul);
	return 0;
}

/*
 * Format a byte count the way pc_parse_size reads it, exactly: "64M" only
 * when the value is a multiple of 1 MiB, else the plain number, so that
 * printed sizes can be pasted back on a command line.
 */
static inline const char *pc_format_size(size_t v, char *buf, size_t len)
{
	static const char units[] = "GMK";

	for (int i = 0; i < 3; i++) {
		size_t u = (size_t)1 << (10 * (3 - i));

		if (v >= u && v % u == 0) {
			snprintf(buf, len, "%zu%c", v / u, units[i]);
			return buf;
		}
	}
	snprintf(buf, len, "%zu", v);
	return buf;
}

/* A 0|1 switch value ("-c 0"); 0 or -1.  Anything else is a typo worth
 * reporting, not a true value. */
static inline int pc_parse_bool(const char *s, bool *out)
{
	if (!s || (strcmp(s, "0") && strcmp(s, "1")))
		return -1;
	*out = s[0] == '1';
	return 0;
}

#endif /* FR_PERF_COMMON_H */
