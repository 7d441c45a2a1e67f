/* SPDX-License-Identifier: MIT */
/*
 * log.c - leveled logging to stderr, level from FR_LOG (read once).
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log.h"

/*
 * Documented global state: the level, resolved from FR_LOG on first use.
 * -1 = not read yet.  Threads that race there write the same value; the
 * atomic (relaxed: nothing else is published with it) makes that a race in
 * no memory model's sense either, so ThreadSanitizer has nothing to say.
 */
static atomic_int fr_log_level = -1;

static int read_level(void)
{
	static const char *const names[] = { "error", "warn", "info", "debug" };
	const char *s = getenv("FR_LOG");

	if (s && *s) {
		for (int i = 0; i < 4; i++)
			if (!strcasecmp(s, names[i]))
				return i;
		if (s[0] >= '0' && s[0] <= '3' && !s[1])
			return s[0] - '0';
	}
	return FR_LOG_WARN;
}

int fr_log_enabled(int level)
{
	int l = atomic_load_explicit(&fr_log_level, memory_order_relaxed);

	if (l < 0) {
		l = read_level();
		atomic_store_explicit(&fr_log_level, l, memory_order_relaxed);
	}
	return level <= l;
}

void fr_log_msg(int level, const char *fmt, ...)
{
	static const char *const tags[] = { "ERROR", "WARN", "INFO", "DEBUG" };
	char buf[1024];
	va_list ap;
	int n;

	n = snprintf(buf, sizeof(buf), "fastreduce[%ld] %s: ", (long)getpid(),
		     tags[level < 0 ? 0 : level > 3 ? 3 : level]);
	va_start(ap, fmt);
	vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	/* One write so lines of concurrent ranks do not interleave. */
	strcat(buf, "\n");
	fputs(buf, stderr);
}
