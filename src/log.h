/* SPDX-License-Identifier: MIT */
/*
 * log.h - leveled logging to stderr.
 *
 * The level comes from FR_LOG (error, warn, info, debug; default warn),
 * read once.  That cached level is the library's only global mutable state
 * besides the per-thread last-create error (see comm.c) and the PMIx
 * reference kept until exit (pmix.c); all are documented in fastreduce(7).
 */
#ifndef FR_LOG_H
#define FR_LOG_H

enum fr_log_level { FR_LOG_ERROR = 0, FR_LOG_WARN, FR_LOG_INFO, FR_LOG_DEBUG };

int fr_log_enabled(int level);
void fr_log_msg(int level, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

#define fr_log(level, ...)                                                     \
	do {                                                                   \
		if (fr_log_enabled(level))                                     \
			fr_log_msg(level, __VA_ARGS__);                        \
	} while (0)
#define fr_err(...) fr_log(FR_LOG_ERROR, __VA_ARGS__)
#define fr_warn(...) fr_log(FR_LOG_WARN, __VA_ARGS__)
#define fr_info(...) fr_log(FR_LOG_INFO, __VA_ARGS__)
#define fr_dbg(...) fr_log(FR_LOG_DEBUG, __VA_ARGS__)

#endif
