/* SPDX-License-Identifier: MIT */
/*
 * fuzz_env.c - libFuzzer harness: what the library reads from its launcher
 * and its user before anything else.  The first byte picks:
 *   even: the input is an environment, lines "NAME=VALUE": the launcher
 *         detection (frrun, Open MPI, MPICH, torchrun, Slurm variables),
 *         the all-local test, the numeric settings and every value through
 *         the size, number, host:port and name parsers;
 *   odd:  the input is what a PMI-1 server (MPICH's Hydra) answers, read
 *         over PMI_FD by the PMI client (pmi.c) for rank 0 and rank 1.
 * Nothing may crash or hang; what is accepted must be in range.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "env.h"
#include "fastreduce.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAXVARS 32

struct env {
	int n;
	char *name[MAXVARS], *value[MAXVARS];
	char pmi_fd[16];
};

static const char *get(const char *name, void *arg)
{
	struct env *e = arg;

	if (!strcmp(name, "PMI_FD") && e->pmi_fd[0])
		return e->pmi_fd;
	for (int i = e->n - 1; i >= 0; i--)
		if (!strcmp(e->name[i], name))
			return e->value[i];
	return NULL;
}

static void parse_env(struct env *e, char *text)
{
	for (char *line = strtok(text, "\n"); line && e->n < MAXVARS;
	     line = strtok(NULL, "\n")) {
		char *eq = strchr(line, '=');

		if (!eq)
			continue;
		*eq = '\0';
		e->name[e->n] = line;
		e->value[e->n] = eq + 1;
		e->n++;
	}
}

static void values(const struct env *e)
{
	for (int i = 0; i < e->n; i++) {
		const char *v = e->value[i];
		char host[256];
		uint16_t port;
		size_t sz;
		long l;
		fr_dtype_t dt;
		fr_op_t op;
		fr_algo_t al;

		if (!fr_parse_long(v, -5, 1000000, &l) && (l < -5 || l > 1000000))
			abort();
		(void)fr_parse_size(v, &sz);
		if (!fr_parse_hostport(v, host, sizeof(host), &port) &&
		    !memchr(host, '\0', sizeof(host)))
			abort();
		if (!fr_dtype_from_name(v, &dt) && (int)dt >= FR_DTYPE_COUNT)
			abort();
		if (!fr_op_from_name(v, &op) && (int)op >= FR_OP_COUNT)
			abort();
		(void)fr_algo_from_name(v, &al);
	}
}

static void launcher(struct env *e)
{
	struct fr_launch l;
	char err[256];
	long v;
	size_t s;

	if (!fr_env_detect(get, e, &l, err, sizeof(err))) {
		if (l.nranks < 1 || l.rank < 0 || l.rank >= l.nranks ||
		    !memchr(l.rendezvous, '\0', sizeof(l.rendezvous)))
			abort();
		(void)fr_env_all_local(get, e, l.nranks);
	} else if (!memchr(err, '\0', sizeof(err))) {
		abort();
	}
	if (fr_env_long(get, e, "FR_TIMEOUT_MS", 1, 86400000L, &v, err,
			sizeof(err)) == 1 &&
	    (v < 1 || v > 86400000L))
		abort();
	if (fr_env_size(get, e, "FR_SEGMENT_BYTES", 256, 1u << 30, &s, err,
			sizeof(err)) == 1 &&
	    (s < 256 || s > (1u << 30)))
		abort();
}

/* The PMI client against a "server" that says whatever the input says,
 * then hangs up: it must fail cleanly (or succeed) without waiting. */
static void pmi(struct env *e, const uint8_t *data, size_t size, int rank)
{
	char rdv[300], err[256];
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		exit(1);
	/* the client's requests go to a buffer nobody reads: keep it small
	 * enough to fit (they are a few lines) */
	if (size && write(sv[1], data, size) != (ssize_t)size) {
		close(sv[0]);
		close(sv[1]);
		return;
	}
	shutdown(sv[1], SHUT_WR);
	snprintf(e->pmi_fd, sizeof(e->pmi_fd), "%d", sv[0]);
	if (!fr_pmi_rendezvous(get, e, rank, rank == 1, rdv, sizeof(rdv), err,
			       sizeof(err)) &&
	    !memchr(rdv, '\0', sizeof(rdv)))
		abort();
	e->pmi_fd[0] = '\0';
	close(sv[0]);
	close(sv[1]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct env e;
	char *text;

	if (!size)
		return 0;
	memset(&e, 0, sizeof(e));
	if (data[0] & 1) {
		/* PMI answers are at most a few KiB: a socket buffer holds them */
		if (size > 65536)
			return 0;
		pmi(&e, data + 1, size - 1, size & 2 ? 1 : 0);
		return 0;
	}
	text = strndup((const char *)data + 1, size - 1);
	if (!text)
		return 0;
	parse_env(&e, text);
	values(&e);
	launcher(&e);
	free(text);
	return 0;
}
