/* SPDX-License-Identifier: MIT */
/*
 * log.c - leveled logging to stderr, level from FR_LOG (read once).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "log.h"

/*
 * Documented global state: the level, resolved from FR_LOG on first use.
 * -1 = not read yet.  Races only write the same value twice.
 */
static volatile int fr_log_level = -1;

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
	int l = fr_log_level;

	if (l < 0)
		fr_log_level = l = read_level();
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
