/* SPDX-License-Identifier: MIT */
/*
 * simrun.c - All-Reduce times from fr_sim, the simulator that runs the
 * library's own schedules (perf/sim), instead of the closed form.
 *
 * Why a child process: fr_sim runs every rank of a job in one process, on
 * an in-process transport, in virtual time; it is a tool of its own with
 * its own options (topologies, the CPU model), and a step's projection
 * needs only its answer for a few sizes per job size and link.  So each
 * (ranks, link) point is one fr_sim run over all the sizes the step asks
 * for there, its table read back.
 *
 * The link maps onto fr_sim's options as the library's model has it:
 * --gbps 8 / beta, --lat-us alpha, --cpu-reduce-GBps 1 / gamma(f32), the
 * algorithm the library's own choice (-a auto) with --sizes-only.  Copies
 * (the tune's copy_ns) are not simulated; fr_sim's README says what is.
 */
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "step.h"

extern char **environ;

#define SIMTAB_MAX_ARGS 64

/* one (job size, link, size) point */
struct st_simpt {
	int nranks;
	double alpha_us, beta_ns, gamma_ns;
	size_t bytes;
	int state; /* 0 pending, 1 done */
	double us;
	int algo;
};

static int same_link(const struct st_simpt *a, const struct st_simpt *b)
{
	return a->nranks == b->nranks && a->alpha_us == b->alpha_us &&
	       a->beta_ns == b->beta_ns && a->gamma_ns == b->gamma_ns;
}

void st_simtab_init(struct st_simtab *t, const char *exe, const char *args)
{
	memset(t, 0, sizeof(*t));
	t->exe = exe;
	t->args = args;
}

void st_simtab_free(struct st_simtab *t)
{
	free(t->pts);
	t->pts = NULL;
	t->npts = t->cap = 0;
}

static struct st_simpt *find(struct st_simtab *t, const struct st_simpt *k)
{
	for (int i = 0; i < t->npts; i++)
		if (same_link(&t->pts[i], k) && t->pts[i].bytes == k->bytes)
			return &t->pts[i];
	return NULL;
}

static struct st_simpt *add(struct st_simtab *t, const struct st_simpt *k)
{
	if (t->npts == t->cap) {
		int cap = t->cap ? 2 * t->cap : 64;
		struct st_simpt *p = realloc(t->pts, (size_t)cap * sizeof(*p));

		if (!p)
			return NULL;
		t->pts = p;
		t->cap = cap;
	}
	t->pts[t->npts] = *k;
	return &t->pts[t->npts++];
}

static int algo_by_name(const char *s)
{
	if (!strncmp(s, "auto:", 5))
		s += 5;
	for (int a = 1; a < FR_ALGO_COUNT; a++)
		if (!strcmp(s, fr_algo_name(a)))
			return a;
	return -1;
}

/* Run argv, its stdout into a malloc'ed string; 0 on a clean exit. */
static int run_capture(struct st_simtab *t, char **argv, char **out)
{
	posix_spawn_file_actions_t fa;
	size_t len = 0, cap = 4096;
	char *buf = malloc(cap);
	int fd[2], st, rc;
	ssize_t r;
	pid_t pid;

	*out = NULL;
	if (!buf)
		return -1;
	if (pipe(fd)) {
		snprintf(t->err, sizeof(t->err), "pipe: %s", strerror(errno));
		goto err_buf;
	}
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
	posix_spawn_file_actions_addclose(&fa, fd[0]);
	posix_spawn_file_actions_addclose(&fa, fd[1]);
	rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(fd[1]);
	if (rc) {
		snprintf(t->err, sizeof(t->err), "%s: %s", argv[0],
			 strerror(rc));
		goto err_pipe;
	}
	for (;;) {
		if (len + 1 == cap) {
			char *b = realloc(buf, cap * 2);

			if (!b)
				break;
			buf = b;
			cap *= 2;
		}
		r = read(fd[0], buf + len, cap - len - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		len += (size_t)r;
	}
	buf[len] = '\0';
	close(fd[0]);
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR) {
			st = -1;
			break;
		}
	if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st)) {
		snprintf(t->err, sizeof(t->err), "%s failed (%s %d)", argv[0],
			 st != -1 && WIFEXITED(st) ? "exit" : "status",
			 st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : st);
		free(buf);
		return -1;
	}
	*out = buf;
	return 0;

err_pipe:
	close(fd[0]);
err_buf:
	free(buf);
	return -1;
}

/* One fr_sim run for every pending point of p's link. */
static int run_link(struct st_simtab *t, const struct st_simpt *p)
{
	char num[5][32], *argv[SIMTAB_MAX_ARGS], *sizes,
		*out = NULL, *line, *save = NULL, *extra = NULL;
	size_t slen = 0, scap = 64;
	int argc = 0, rc = -1, left = 0;
	struct timespec t0, t1;

	if (!(p->beta_ns > 0)) {
		snprintf(t->err, sizeof(t->err),
			 "beta %g ns/B: no link rate to simulate", p->beta_ns);
		return -1;
	}
	sizes = malloc(scap);
	if (!sizes) {
		snprintf(t->err, sizeof(t->err), "out of memory");
		return -1;
	}
	sizes[0] = '\0';
	for (int i = 0; i < t->npts; i++) {
		const struct st_simpt *q = &t->pts[i];
		char b[32];
		int n;

		if (q->state || !same_link(q, p))
			continue;
		n = snprintf(b, sizeof(b), "%s%zu", slen ? "," : "", q->bytes);
		if (slen + (size_t)n + 1 > scap) {
			char *s = realloc(sizes, scap * 2 + (size_t)n);

			if (!s) {
				snprintf(t->err, sizeof(t->err),
					 "out of memory");
				goto out;
			}
			sizes = s;
			scap = scap * 2 + (size_t)n;
		}
		memcpy(sizes + slen, b, (size_t)n + 1);
		slen += (size_t)n;
		left++;
	}
	snprintf(num[0], sizeof(num[0]), "%d", p->nranks);
	snprintf(num[1], sizeof(num[1]), "%.9g", 8 / p->beta_ns);
	snprintf(num[2], sizeof(num[2]), "%.9g", p->alpha_us);
	argv[argc++] = (char *)t->exe;
	argv[argc++] = "-n";
	argv[argc++] = num[0];
	argv[argc++] = "--gbps";
	argv[argc++] = num[1];
	argv[argc++] = "--lat-us";
	argv[argc++] = num[2];
	if (p->gamma_ns > 0) {
		snprintf(num[3], sizeof(num[3]), "%.9g", 1 / p->gamma_ns);
		argv[argc++] = "--cpu-reduce-GBps";
		argv[argc++] = num[3];
	}
	argv[argc++] = "-a";
	argv[argc++] = "auto";
	argv[argc++] = "--sizes-only";
	argv[argc++] = "--sizes";
	argv[argc++] = sizes;
	if (t->args) {
		/* --sim-args, split on blanks; later options win in fr_sim */
		char *tok, *s2 = NULL;

		extra = strdup(t->args);
		if (!extra) {
			snprintf(t->err, sizeof(t->err), "out of memory");
			goto out;
		}
		for (tok = strtok_r(extra, " \t", &s2); tok;
		     tok = strtok_r(NULL, " \t", &s2)) {
			if (argc == SIMTAB_MAX_ARGS - 1) {
				snprintf(t->err, sizeof(t->err),
					 "--sim-args: too many words");
				goto out;
			}
			argv[argc++] = tok;
		}
	}
	argv[argc] = NULL;
	if (t->progress)
		fprintf(stderr,
			"# fr_sim -n %d --gbps %s --lat-us %s: %d sizes",
			p->nranks, num[1], num[2], left);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (run_capture(t, argv, &out)) {
		if (t->progress)
			fprintf(stderr, ": failed\n");
		goto out;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	if (t->progress)
		fprintf(stderr, ", %.1f s\n",
			(double)(t1.tv_sec - t0.tv_sec) +
				(double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
	t->runs++;
	/* "bytes algo time_us ..." rows; '#' lines and the header skipped */
	for (line = strtok_r(out, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		struct st_simpt k = *p, *q;
		char name[40];
		double us;

		if (sscanf(line, " %zu %39s %lf", &k.bytes, name, &us) != 3)
			continue;
		q = find(t, &k);
		if (!q || q->state)
			continue;
		q->us = us;
		q->algo = algo_by_name(name);
		q->state = 1;
		left--;
	}
	if (left) {
		snprintf(t->err, sizeof(t->err),
			 "fr_sim -n %d gave no time for %d of the sizes",
			 p->nranks, left);
		goto out;
	}
	rc = 0;
out:
	free(extra);
	free(out);
	free(sizes);
	return rc;
}

int st_simtab_run(struct st_simtab *t)
{
	for (int i = 0; i < t->npts && !t->failed; i++)
		if (!t->pts[i].state && run_link(t, &t->pts[i]))
			t->failed = 1;
	return t->failed ? -1 : 0;
}

double st_simtab_us(struct st_simtab *t, const struct fr_tune *tune, int p,
		    size_t bytes, int *algo)
{
	struct st_simpt k = {
		.nranks = p,
		.alpha_us = tune->alpha_us,
		.beta_ns = tune->beta_ns,
		.gamma_ns = tune->gamma_ns[FR_F32],
		.bytes = bytes,
	};
	struct st_simpt *q = find(t, &k);

	if (!q) {
		q = add(t, &k);
		if (!q) {
			snprintf(t->err, sizeof(t->err), "out of memory");
			t->failed = 1;
			return -1;
		}
	}
	if (!q->state && !t->recording && !t->failed)
		st_simtab_run(t);
	if (!q->state) /* recording, or fr_sim failed */
		return -1;
	if (algo)
		*algo = q->algo;
	return q->us;
}
