/* SPDX-License-Identifier: MIT */
/*
 * envvar.h - settings from the environment (or a table in tests).
 *
 * Layer: base.  Calls util.c only; env.c, pmi.c, pmix.c and comm.c call it.
 */
#ifndef FR_ENVVAR_H
#define FR_ENVVAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* getenv(3) or a table in tests. */
typedef const char *(*fr_getenv_fn)(const char *name, void *arg);

/* The process environment as an fr_getenv_fn. */
const char *fr_env_getenv(const char *name, void *arg);
/* name's value if set and not empty, else NULL. */
const char *fr_env_get(fr_getenv_fn get, void *arg, const char *name);

/* Read an integer / size setting: 0 if unset (*out untouched), 1 if set,
 * FR_EINVAL (message in err) if malformed or outside [min, max]. */
int fr_env_long(fr_getenv_fn get, void *arg, const char *name, long min,
		long max, long *out, char *err, size_t errlen);
int fr_env_size(fr_getenv_fn get, void *arg, const char *name, size_t min,
		size_t max, size_t *out, char *err, size_t errlen);

/*
 * How long a rendezvous waits for every rank to arrive, in *out:
 * FR_BOOT_TIMEOUT_MS if set, else the peer timeout timeout_ms but at least
 * FR_BOOT_MIN_TIMEOUT_MS.  Launchers start ranks seconds apart (a Python
 * interpreter's imports, srun across nodes, a loaded VM), and a short
 * FR_TIMEOUT_MS is meant for noticing a dead peer, not a late start.
 * 0 or FR_EINVAL as fr_env_long.
 */
#define FR_BOOT_MIN_TIMEOUT_MS 30000L
int fr_env_boot_timeout(fr_getenv_fn get, void *arg, long timeout_ms, long *out,
			char *err, size_t errlen);

/* FNV-1a of s continuing from h (2166136261 to start): the same on every
 * rank of a job for the same text. */
uint32_t fr_env_hash(uint32_t h, const char *s);

/*
 * The "host:port" that rank 0 publishes through a launcher's key-value
 * store (pmi.c, pmix.c): host 127.0.0.1 when local, else host (a name the
 * launcher or user gave) if set, else gethostname(); the port one that is
 * free now (fr_free_port), else hashed from job (the store's name, unique
 * to the job) into [20000, 60000).
 */
void fr_env_rank0_addr(const char *job, bool local, const char *host, char *out,
		       size_t len);

#endif
