/* SPDX-License-Identifier: MIT */
/*
 * envvar.c - settings read from the environment, and the address rank 0
 * publishes through a launcher's key-value store.
 *
 * The bottom of the launcher code: env.c (which launcher started us),
 * pmi.c and pmix.c (rank 0's address through PMI-1 / PMIx) all read
 * settings through these, and none of these calls back up into them.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "envvar.h"
#include "fastreduce.h"
#include "util.h"

const char *fr_env_getenv(const char *name, void *arg)
{
	(void)arg;
	return getenv(name);
}

const char *fr_env_get(fr_getenv_fn get, void *arg, const char *name)
{
	const char *v = get(name, arg);

	return v && *v ? v : NULL;
}

int fr_env_long(fr_getenv_fn get, void *arg, const char *name, long min,
		long max, long *out, char *err, size_t errlen)
{
	const char *v = fr_env_get(get, arg, name);

	if (!v)
		return 0;
	if (fr_parse_long(v, min, max, out)) {
		snprintf(err, errlen,
			 "%s=\"%s\" is not an integer in [%ld, %ld]", name, v,
			 min, max);
		return FR_EINVAL;
	}
	return 1;
}

int fr_env_boot_timeout(fr_getenv_fn get, void *arg, long timeout_ms, long *out,
			char *err, size_t errlen)
{
	int rc;

	*out = timeout_ms > FR_BOOT_MIN_TIMEOUT_MS ? timeout_ms
						   : FR_BOOT_MIN_TIMEOUT_MS;
	rc = fr_env_long(get, arg, "FR_BOOT_TIMEOUT_MS", 1, 86400000L, out, err,
			 errlen);
	return rc < 0 ? rc : 0;
}

int fr_env_size(fr_getenv_fn get, void *arg, const char *name, size_t min,
		size_t max, size_t *out, char *err, size_t errlen)
{
	const char *v = fr_env_get(get, arg, name);
	size_t s;

	if (!v)
		return 0;
	if (fr_parse_size(v, &s) || s < min || s > max) {
		snprintf(
			err, errlen,
			"%s=\"%s\" is not a size in [%zu, %zu] (K/M/G allowed)",
			name, v, min, max);
		return FR_EINVAL;
	}
	*out = s;
	return 1;
}

/* FNV-1a over the job id text: the same on every rank of the job. */
uint32_t fr_env_hash(uint32_t h, const char *s)
{
	for (; *s; s++) {
		h ^= (unsigned char)*s;
		h *= 16777619u;
	}
	return h;
}

void fr_env_rank0_addr(const char *job, bool local, const char *host, char *out,
		       size_t len)
{
	uint16_t port =
		(uint16_t)(20000u + fr_env_hash(2166136261u, job) % 40000u);
	char name[256];

	if (local)
		snprintf(name, sizeof(name), "127.0.0.1");
	else if (host && *host)
		snprintf(name, sizeof(name), "%s", host);
	else if (gethostname(name, sizeof(name)))
		snprintf(name, sizeof(name), "127.0.0.1");
	name[sizeof(name) - 1] = '\0';
	snprintf(out, len, strchr(name, ':') ? "[%s]:%u" : "%s:%u", name,
		 fr_free_port(local, port));
}
