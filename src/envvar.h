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
