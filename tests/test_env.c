/* SPDX-License-Identifier: MIT */
/*
 * test_env.c - launcher environments (src/env.c) and the number and address
 * parsers they rest on (src/util.c).  The environment is a table handed to
 * fr_env_detect() as its getenv function, so nothing here touches the real
 * process environment.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "env.h"
#include "fastreduce.h"
#include "util.h"

/* ---- a table as the environment --------------------------------------------------- */

struct kv {
	const char *k, *v;
};

/* The table ends with a { NULL, NULL } entry. */
static const char *table_get(const char *name, void *arg)
{
	for (const struct kv *e = arg; e->k; e++)
		if (!strcmp(e->k, name))
			return e->v;
	return NULL;
}

#define ENV(...) ((const struct kv[]){ __VA_ARGS__, { NULL, NULL } })

/* Detect from env; on success check the result is sane (rendezvous parses). */
static int detect(const struct kv *env, struct fr_launch *l, char *err,
		  size_t errlen)
{
	int rc;

	memset(l, 0xa5, sizeof(*l));
	memset(err, 0x5a, errlen);
	rc = fr_env_detect(table_get, (void *)env, l, err, errlen);
	/* err is always a terminated string. */
	assert_non_null(memchr(err, '\0', errlen));
	if (rc == 0) {
		char host[256];
		uint16_t port;

		assert_true(l->rank >= 0 && l->rank < l->nranks);
		assert_non_null(l->launcher);
		if (fr_parse_hostport(l->rendezvous, host, sizeof(host), &port))
			fail_msg("rendezvous \"%s\" is not host:port",
				 l->rendezvous);
	}
	return rc;
}

static void expect_ok(const struct kv *env, int rank, int nranks,
		      const char *rendezvous, const char *launcher)
{
	struct fr_launch l;
	char err[512];
	int rc = detect(env, &l, err, sizeof(err));

	if (rc)
		fail_msg("fr_env_detect failed (%d): %s", rc, err);
	assert_int_equal(l.rank, rank);
	assert_int_equal(l.nranks, nranks);
	if (rendezvous)
		assert_string_equal(l.rendezvous, rendezvous);
	assert_string_equal(l.launcher, launcher);
}

/* FR_EINVAL with each of the words in the message. */
static void expect_einval(const struct kv *env, const char *w1,
			  const char *w2)
{
	struct fr_launch l;
	char err[512];
	int rc = detect(env, &l, err, sizeof(err));

	if (rc != FR_EINVAL)
		fail_msg("fr_env_detect returned %d, want FR_EINVAL (rank %d/%d rendezvous \"%s\")",
			 rc, l.rank, l.nranks, rc ? "" : l.rendezvous);
	assert_true(strlen(err) > 0);
	if (w1 && !strstr(err, w1))
		fail_msg("message \"%s\" does not mention %s", err, w1);
	if (w2 && !strstr(err, w2))
		fail_msg("message \"%s\" does not mention %s", err, w2);
}

/* The port of a "127.0.0.1:port" rendezvous. */
static unsigned local_port(const struct kv *env, int rank, int nranks,
			   const char *launcher)
{
	struct fr_launch l;
	char err[512], host[256];
	uint16_t port;
	int rc = detect(env, &l, err, sizeof(err));

	if (rc)
		fail_msg("fr_env_detect failed (%d): %s", rc, err);
	assert_int_equal(l.rank, rank);
	assert_int_equal(l.nranks, nranks);
	assert_string_equal(l.launcher, launcher);
	assert_int_equal(fr_parse_hostport(l.rendezvous, host, sizeof(host),
					   &port),
			 0);
	assert_string_equal(host, "127.0.0.1");
	assert_in_range(port, 20000, 59999);
	return port;
}

/* ---- launchers ---------------------------------------------------------------------- */

static void test_frrun(void **state)
{
	(void)state;
	expect_ok(ENV({ "FR_RANK", "2" }, { "FR_NRANKS", "4" },
		      { "FR_RENDEZVOUS", "node1:29500" }),
		  2, 4, "node1:29500", "frrun");
	expect_ok(ENV({ "FR_RANK", "0" }, { "FR_NRANKS", "16" },
		      { "FR_RENDEZVOUS", "[fe80::1]:7000" }),
		  0, 16, "[fe80::1]:7000", "frrun");
	expect_ok(ENV({ "FR_RANK", "15" }, { "FR_NRANKS", "16" },
		      { "FR_RENDEZVOUS", "10.0.0.1:1" }),
		  15, 16, "10.0.0.1:1", "frrun");
	/* frrun on one host: local size and a job token give a port. */
	unsigned p1 = local_port(ENV({ "FR_RANK", "1" }, { "FR_NRANKS", "3" },
				     { "FR_LOCAL_SIZE", "3" },
				     { "FR_JOB_TOKEN", "secret" }),
				 1, 3, "frrun");
	unsigned p2 = local_port(ENV({ "FR_RANK", "2" }, { "FR_NRANKS", "3" },
				     { "FR_LOCAL_SIZE", "3" },
				     { "FR_JOB_TOKEN", "secret" }),
				 2, 3, "frrun");
	assert_int_equal(p1, p2);
	/* Several hosts and no FR_RENDEZVOUS: there is no way to tell. */
	expect_einval(ENV({ "FR_RANK", "1" }, { "FR_NRANKS", "3" }),
		      "FR_RENDEZVOUS", NULL);
}

static void test_ompi_rendezvous(void **state)
{
	(void)state;
	expect_ok(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
		      { "OMPI_COMM_WORLD_SIZE", "8" },
		      { "OMPI_COMM_WORLD_LOCAL_SIZE", "4" },
		      { "FR_RENDEZVOUS", "10.0.0.1:5000" }),
		  1, 8, "10.0.0.1:5000", "Open MPI");
	/* FR_RENDEZVOUS also wins over a local default. */
	expect_ok(ENV({ "OMPI_COMM_WORLD_RANK", "0" },
		      { "OMPI_COMM_WORLD_SIZE", "2" },
		      { "OMPI_COMM_WORLD_LOCAL_SIZE", "2" },
		      { "OMPI_MCA_ess_base_jobid", "42" },
		      { "FR_RENDEZVOUS", "h:9" }),
		  0, 2, "h:9", "Open MPI");
	/* ... and over MASTER_ADDR. */
	expect_ok(ENV({ "OMPI_COMM_WORLD_RANK", "0" },
		      { "OMPI_COMM_WORLD_SIZE", "2" },
		      { "MASTER_ADDR", "10.9.9.9" }, { "MASTER_PORT", "100" },
		      { "FR_RENDEZVOUS", "h:9" }),
		  0, 2, "h:9", "Open MPI");
}

static void test_ompi_local(void **state)
{
	unsigned a0, a3, b, c;

	(void)state;
	a0 = local_port(ENV({ "OMPI_COMM_WORLD_RANK", "0" },
			    { "OMPI_COMM_WORLD_SIZE", "4" },
			    { "OMPI_COMM_WORLD_LOCAL_SIZE", "4" },
			    { "OMPI_MCA_ess_base_jobid", "3735158785" }),
			0, 4, "Open MPI");
	a3 = local_port(ENV({ "OMPI_COMM_WORLD_RANK", "3" },
			    { "OMPI_COMM_WORLD_SIZE", "4" },
			    { "OMPI_COMM_WORLD_LOCAL_SIZE", "4" },
			    { "OMPI_MCA_ess_base_jobid", "3735158785" }),
			3, 4, "Open MPI");
	assert_int_equal(a0, a3); /* every rank of the job agrees */
	b = local_port(ENV({ "OMPI_COMM_WORLD_RANK", "0" },
			   { "OMPI_COMM_WORLD_SIZE", "4" },
			   { "OMPI_COMM_WORLD_LOCAL_SIZE", "4" },
			   { "OMPI_MCA_ess_base_jobid", "3735158786" }),
		       0, 4, "Open MPI");
	assert_int_not_equal(a0, b); /* another job, another port */
	/* PMIx namespace (Open MPI 5) alone is a job id too. */
	c = local_port(ENV({ "OMPI_COMM_WORLD_RANK", "2" },
			   { "OMPI_COMM_WORLD_SIZE", "3" },
			   { "OMPI_COMM_WORLD_LOCAL_SIZE", "3" },
			   { "PMIX_NAMESPACE", "prterun-host-1234@1" }),
		       2, 3, "Open MPI");
	assert_int_equal(c, local_port(ENV({ "OMPI_COMM_WORLD_RANK", "0" },
					   { "OMPI_COMM_WORLD_SIZE", "3" },
					   { "OMPI_COMM_WORLD_LOCAL_SIZE", "3" },
					   { "PMIX_NAMESPACE",
					     "prterun-host-1234@1" }),
				       0, 3, "Open MPI"));
	assert_int_not_equal(c, local_port(ENV({ "OMPI_COMM_WORLD_RANK", "0" },
					       { "OMPI_COMM_WORLD_SIZE", "3" },
					       { "OMPI_COMM_WORLD_LOCAL_SIZE",
						 "3" },
					       { "PMIX_NAMESPACE",
						 "prterun-host-1235@1" }),
					   0, 3, "Open MPI"));
}

static void test_ompi_multihost(void **state)
{
	(void)state;
	/* Local size below the size: ranks on several hosts. */
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "8" },
			  { "OMPI_COMM_WORLD_LOCAL_SIZE", "4" },
			  { "OMPI_MCA_ess_base_jobid", "77" }),
		      "FR_RENDEZVOUS", NULL);
	/* No local size at all. */
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "8" },
			  { "OMPI_MCA_ess_base_jobid", "77" }),
		      "FR_RENDEZVOUS", NULL);
	/* All local but no job id to derive a port from. */
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "4" },
			  { "OMPI_COMM_WORLD_LOCAL_SIZE", "4" }),
		      "FR_RENDEZVOUS", NULL);
	/* A malformed local size is not "local". */
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "4" },
			  { "OMPI_COMM_WORLD_LOCAL_SIZE", "four" },
			  { "OMPI_MCA_ess_base_jobid", "77" }),
		      "FR_RENDEZVOUS", NULL);
	/* A malformed FR_RENDEZVOUS is named. */
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "4" },
			  { "FR_RENDEZVOUS", "nocolon" }),
		      "FR_RENDEZVOUS", "nocolon");
}

static void test_mpich(void **state)
{
	unsigned a, b;

	(void)state;
	expect_ok(ENV({ "PMI_RANK", "3" }, { "PMI_SIZE", "5" },
		      { "FR_RENDEZVOUS", "head:4000" }),
		  3, 5, "head:4000", "MPICH/Hydra");
	a = local_port(ENV({ "PMI_RANK", "0" }, { "PMI_SIZE", "2" },
			   { "MPI_LOCALNRANKS", "2" },
			   { "PMI_KVSNAME", "kvs_1234_0" }),
		       0, 2, "MPICH/Hydra");
	b = local_port(ENV({ "PMI_RANK", "1" }, { "PMI_SIZE", "2" },
			   { "MPI_LOCALNRANKS", "2" },
			   { "PMI_KVSNAME", "kvs_1234_0" }),
		       1, 2, "MPICH/Hydra");
	assert_int_equal(a, b);
	expect_einval(ENV({ "PMI_RANK", "0" }, { "PMI_SIZE", "2" },
			  { "MPI_LOCALNRANKS", "1" },
			  { "PMI_KVSNAME", "kvs_1234_0" }),
		      "FR_RENDEZVOUS", NULL);
	expect_einval(ENV({ "PMI_RANK", "2" }, { "PMI_SIZE", "2" },
			  { "FR_RENDEZVOUS", "head:4000" }),
		      "PMI_RANK", NULL);
}

/*
 * PMI-1 over PMI_FD (Hydra): a fake server on a socketpair answers the
 * commands, checks what rank 0 puts and what the others get, and plays
 * refusals.  mode 0: serve rank 0 (expects the put), 1: serve rank 1 (get
 * returns value), 2: refuse init.
 */
static void pmi_server(int fd, int mode)
{
	char line[512];
	FILE *f = fdopen(fd, "r+");

	setvbuf(f, NULL, _IONBF, 0);
	while (fgets(line, sizeof(line), f)) {
		if (strstr(line, "cmd=init"))
			fputs(mode == 2 ? "cmd=response_to_init rc=-1\n"
					: "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
			      f);
		else if (strstr(line, "cmd=get_my_kvsname"))
			fputs("cmd=my_kvsname kvsname=kvs_42_0\n", f);
		else if (strstr(line, "cmd=put")) {
			/* rank 0 on one host: 127.0.0.1 and a port */
			if (!strstr(line, "kvsname=kvs_42_0") ||
			    !strstr(line, "key=fastreduce_rendezvous") ||
			    !strstr(line, "value=127.0.0.1:"))
				_exit(3);
			fputs("cmd=put_result rc=0\n", f);
		} else if (strstr(line, "cmd=barrier_in"))
			fputs("cmd=barrier_out\n", f);
		else if (strstr(line, "cmd=get "))
			fputs("cmd=get_result rc=0 value=node7:31234\n", f);
		else if (strstr(line, "cmd=finalize")) {
			fputs("cmd=finalize_ack\n", f);
			_exit(0);
		} else
			_exit(4);
	}
	_exit(mode == 2 ? 0 : 5);
}

static int pmi_run(int rank, int mode, const char *local, struct fr_launch *l,
		   char *err, size_t errlen)
{
	char fdtext[16], ranktext[16];
	int sv[2], rc, status;
	pid_t pid;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	fflush(NULL);
	pid = fork();
	assert_true(pid >= 0);
	if (!pid) {
		close(sv[0]);
		pmi_server(sv[1], mode);
	}
	close(sv[1]);
	snprintf(fdtext, sizeof(fdtext), "%d", sv[0]);
	snprintf(ranktext, sizeof(ranktext), "%d", rank);
	rc = detect(ENV({ "PMI_RANK", ranktext }, { "PMI_SIZE", "4" },
			{ "PMI_FD", fdtext }, { "MPI_LOCALNRANKS", local }),
		    l, err, errlen);
	close(sv[0]);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	return rc;
}

static void test_mpich_pmi(void **state)
{
	struct fr_launch l;
	char err[256];

	(void)state;
	assert_int_equal(pmi_run(0, 0, "4", &l, err, sizeof(err)), 0);
	assert_non_null(strstr(l.rendezvous, "127.0.0.1:"));
	assert_int_equal(pmi_run(1, 1, "2", &l, err, sizeof(err)), 0);
	assert_string_equal(l.rendezvous, "node7:31234");
	assert_int_equal(l.rank, 1);
	assert_int_equal(pmi_run(1, 2, "4", &l, err, sizeof(err)),
			 FR_EBOOTSTRAP);
	assert_non_null(strstr(err, "PMI-1"));
	expect_einval(ENV({ "PMI_RANK", "0" }, { "PMI_SIZE", "2" },
			  { "PMI_FD", "x" }),
		      "PMI_FD", NULL);
}

/*
 * When PMIx is chosen (FR_PMIX, PMIX_NAMESPACE, several hosts).  The cases
 * here never reach PMIx itself: PMIx_Init reads the real environment, not
 * the table, and a failed one leaks inside libpmix (valgrind.sh, ASan).
 * tests/mp_launchers.sh runs it under Open MPI's mpirun.
 */
static void test_pmix_choice(void **state)
{
	unsigned a, b;

	(void)state;
	/* one host: the job id's port, PMIx or not ... */
	a = local_port(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			   { "OMPI_COMM_WORLD_SIZE", "3" },
			   { "OMPI_COMM_WORLD_LOCAL_SIZE", "3" },
			   { "PMIX_NAMESPACE", "1234" }, { "PMIX_RANK", "1" }),
		       1, 3, "Open MPI");
	b = local_port(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			   { "OMPI_COMM_WORLD_SIZE", "3" },
			   { "OMPI_COMM_WORLD_LOCAL_SIZE", "3" },
			   { "PMIX_NAMESPACE", "1234" }, { "PMIX_RANK", "1" },
			   { "FR_PMIX", "0" }),
		       1, 3, "Open MPI");
	assert_int_equal(a, b);
	/* ... and FR_RENDEZVOUS / MASTER_ADDR before PMIx even when forced */
	expect_ok(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
		      { "OMPI_COMM_WORLD_SIZE", "3" },
		      { "PMIX_NAMESPACE", "1234" }, { "FR_PMIX", "1" },
		      { "FR_RENDEZVOUS", "h:9" }),
		  1, 3, "h:9", "Open MPI");
	expect_ok(ENV({ "SLURM_PROCID", "1" }, { "SLURM_NTASKS", "3" },
		      { "PMIX_RANK", "1" }, { "FR_PMIX", "1" },
		      { "MASTER_ADDR", "m" }, { "MASTER_PORT", "99" }),
		  1, 3, "m:100", "Slurm");
	/* FR_PMIX is 0 or 1 */
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "3" },
			  { "PMIX_NAMESPACE", "1234" }, { "FR_PMIX", "yes" }),
		      "FR_PMIX", "yes");
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "3" },
			  { "PMIX_NAMESPACE", "1234" }, { "FR_PMIX", "2" }),
		      "FR_PMIX", NULL);
	/* forced, but impossible: said so, not silently another way */
#ifdef FR_HAVE_PMIX
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "3" },
			  { "OMPI_COMM_WORLD_LOCAL_SIZE", "3" },
			  { "OMPI_MCA_ess_base_jobid", "5" },
			  { "FR_PMIX", "1" }),
		      "FR_PMIX=1", "PMIX_NAMESPACE");
#else
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "3" },
			  { "OMPI_COMM_WORLD_LOCAL_SIZE", "3" },
			  { "PMIX_NAMESPACE", "1234" }, { "FR_PMIX", "1" }),
		      "FR_PMIX=1", "without PMIx");
	/* several hosts, a PMIx launcher, no PMIx here: say how to get it */
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "8" },
			  { "OMPI_COMM_WORLD_LOCAL_SIZE", "4" },
			  { "PMIX_NAMESPACE", "1234" }),
		      "FR_RENDEZVOUS", "libpmix-dev");
#endif
	/* several hosts, PMIx turned off: FR_RENDEZVOUS is the way */
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "1" },
			  { "OMPI_COMM_WORLD_SIZE", "8" },
			  { "OMPI_COMM_WORLD_LOCAL_SIZE", "4" },
			  { "PMIX_NAMESPACE", "1234" }, { "FR_PMIX", "0" }),
		      "FR_RENDEZVOUS", "several hosts");
	/* srun on several nodes, PMIx off: the step's first node */
	expect_ok(ENV({ "SLURM_PROCID", "1" }, { "SLURM_NTASKS", "4" },
		      { "SLURM_NNODES", "2" }, { "SLURM_JOB_ID", "7" },
		      { "SLURM_STEP_NODELIST", "n[3-4]" },
		      { "PMIX_NAMESPACE", "slurm.pmix.7.0" },
		      { "FR_PMIX", "0" }),
		  1, 4, NULL, "Slurm");
}

static void test_ct_equal(void **state)
{
	(void)state;
	assert_true(fr_ct_equal("secret", 6, "secret", 6));
	assert_true(fr_ct_equal("", 0, "", 0));
	assert_false(fr_ct_equal("secret", 6, "secreT", 6));
	assert_false(fr_ct_equal("Secret", 6, "secret", 6));
	assert_false(fr_ct_equal("secret", 6, "secret!", 7));
	assert_false(fr_ct_equal("secret", 6, "", 0));
	assert_false(fr_ct_equal("ab\0", 3, "ab", 2));
}

static void test_slurm(void **state)
{
	unsigned a, b, c;

	(void)state;
	expect_ok(ENV({ "SLURM_PROCID", "5" }, { "SLURM_NTASKS", "8" },
		      { "SLURM_NNODES", "2" }, { "FR_RENDEZVOUS", "n01:1234" }),
		  5, 8, "n01:1234", "Slurm");
	a = local_port(ENV({ "SLURM_PROCID", "1" }, { "SLURM_NTASKS", "4" },
			   { "SLURM_NNODES", "1" }, { "SLURM_JOB_ID", "777" },
			   { "SLURM_STEP_ID", "0" }),
		       1, 4, "Slurm");
	b = local_port(ENV({ "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "4" },
			   { "SLURM_NNODES", "1" }, { "SLURM_JOB_ID", "777" },
			   { "SLURM_STEP_ID", "0" }),
		       0, 4, "Slurm");
	assert_int_equal(a, b);
	/* Another step of the same job is another rendezvous. */
	c = local_port(ENV({ "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "4" },
			   { "SLURM_NNODES", "1" }, { "SLURM_JOB_ID", "777" },
			   { "SLURM_STEP_ID", "1" }),
		       0, 4, "Slurm");
	assert_int_not_equal(a, c);
	/* SLURM_JOB_NUM_NODES is the other spelling. */
	local_port(ENV({ "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "2" },
		       { "SLURM_JOB_NUM_NODES", "1" }, { "SLURM_JOB_ID", "9" }),
		   0, 2, "Slurm");
	expect_einval(ENV({ "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "4" },
			  { "SLURM_NNODES", "2" }, { "SLURM_JOB_ID", "777" }),
		      "FR_RENDEZVOUS", NULL);
	/* several nodes: the step's first node, the job's port */
	{
		static const struct {
			const char *list, *host;
		} lists[] = {
			{ "node[07-09,12],gpu1", "node07" },
			{ "a1,a2", "a1" },
			{ "solo", "solo" },
			{ "rack[2-3]-n[1-4]", "rack2-n1" },
			{ "x[003]", "x003" },
		};
		struct fr_launch l;
		char err[256], want[300];

		for (size_t i = 0; i < sizeof(lists) / sizeof(lists[0]); i++) {
			assert_int_equal(
				detect(ENV({ "SLURM_PROCID", "3" },
					   { "SLURM_NTASKS", "8" },
					   { "SLURM_NNODES", "2" },
					   { "SLURM_JOB_ID", "777" },
					   { "SLURM_STEP_ID", "0" },
					   { "SLURM_STEP_NODELIST",
					     lists[i].list }),
				       &l, err, sizeof(err)),
				0);
			snprintf(want, sizeof(want), "%s:%u", lists[i].host,
				 a);
			assert_string_equal(l.rendezvous, want);
		}
		/* the job's list when the step's is missing */
		assert_int_equal(detect(ENV({ "SLURM_PROCID", "0" },
					    { "SLURM_NTASKS", "2" },
					    { "SLURM_NNODES", "2" },
					    { "SLURM_JOB_ID", "777" },
					    { "SLURM_STEP_ID", "0" },
					    { "SLURM_JOB_NODELIST", "c[5-6]" }),
					&l, err, sizeof(err)),
				 0);
		snprintf(want, sizeof(want), "c5:%u", a);
		assert_string_equal(l.rendezvous, want);
		/* not a host list: ask for FR_RENDEZVOUS */
		expect_einval(ENV({ "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "2" },
				  { "SLURM_NNODES", "2" }, { "SLURM_JOB_ID", "7" },
				  { "SLURM_STEP_NODELIST", "n[x-y]" }),
			      "FR_RENDEZVOUS", NULL);
	}
}

static void test_torchrun(void **state)
{
	(void)state;
	/* MASTER_PORT belongs to torch's TCPStore: we take the next one. */
	expect_ok(ENV({ "RANK", "1" }, { "WORLD_SIZE", "4" },
		      { "MASTER_ADDR", "10.1.2.3" }, { "MASTER_PORT", "29500" }),
		  1, 4, "10.1.2.3:29501", "torchrun");
	expect_ok(ENV({ "RANK", "0" }, { "WORLD_SIZE", "2" },
		      { "MASTER_ADDR", "master.example" },
		      { "MASTER_PORT", "1" }),
		  0, 2, "master.example:2", "torchrun");
	expect_ok(ENV({ "RANK", "3" }, { "WORLD_SIZE", "4" },
		      { "MASTER_ADDR", "fe80::1" }, { "MASTER_PORT", "29500" }),
		  3, 4, "[fe80::1]:29501", "torchrun");
	expect_ok(ENV({ "RANK", "3" }, { "WORLD_SIZE", "4" },
		      { "MASTER_ADDR", "::1" }, { "MASTER_PORT", "65534" }),
		  3, 4, "[::1]:65535", "torchrun");
	/* The next port after 65535 does not exist. */
	expect_einval(ENV({ "RANK", "0" }, { "WORLD_SIZE", "2" },
			  { "MASTER_ADDR", "h" }, { "MASTER_PORT", "65535" }),
		      "MASTER_PORT", NULL);
	expect_einval(ENV({ "RANK", "0" }, { "WORLD_SIZE", "2" },
			  { "MASTER_ADDR", "h" }, { "MASTER_PORT", "http" }),
		      "MASTER_PORT", NULL);
	expect_einval(ENV({ "RANK", "0" }, { "WORLD_SIZE", "2" },
			  { "MASTER_ADDR", "h" }),
		      "MASTER_PORT", NULL);
	expect_einval(ENV({ "RANK", "0" }, { "WORLD_SIZE", "2" },
			  { "MASTER_ADDR", "h" }, { "MASTER_PORT", "" }),
		      "MASTER_PORT", NULL);
}

static void test_precedence(void **state)
{
	(void)state;
	/* FR_RANK/FR_NRANKS win over everything. */
	expect_ok(ENV({ "OMPI_COMM_WORLD_RANK", "0" },
		      { "OMPI_COMM_WORLD_SIZE", "4" }, { "FR_RANK", "1" },
		      { "FR_NRANKS", "2" }, { "PMI_RANK", "3" },
		      { "PMI_SIZE", "4" }, { "RANK", "0" },
		      { "WORLD_SIZE", "9" }, { "FR_RENDEZVOUS", "x:1" }),
		  1, 2, "x:1", "frrun");
	/* Open MPI over MPICH, Slurm and torchrun (mpirun inside srun). */
	expect_ok(ENV({ "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "1" },
		      { "OMPI_COMM_WORLD_RANK", "3" },
		      { "OMPI_COMM_WORLD_SIZE", "4" }, { "PMI_RANK", "1" },
		      { "PMI_SIZE", "2" }, { "FR_RENDEZVOUS", "x:1" }),
		  3, 4, "x:1", "Open MPI");
	/* MPICH over torchrun and Slurm. */
	expect_ok(ENV({ "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "1" },
		      { "PMI_RANK", "1" }, { "PMI_SIZE", "2" },
		      { "RANK", "0" }, { "WORLD_SIZE", "3" },
		      { "FR_RENDEZVOUS", "x:1" }),
		  1, 2, "x:1", "MPICH/Hydra");
	/* torchrun over Slurm: `srun torchrun ...` leaves the srun task's
	 * SLURM_PROCID in every worker. */
	expect_ok(ENV({ "RANK", "3" }, { "WORLD_SIZE", "4" },
		      { "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "1" },
		      { "SLURM_NNODES", "1" }, { "SLURM_JOB_ID", "5" },
		      { "MASTER_ADDR", "10.0.0.2" }, { "MASTER_PORT", "29500" }),
		  3, 4, "10.0.0.2:29501", "torchrun");
	/* Slurm alone. */
	expect_ok(ENV({ "SLURM_PROCID", "2" }, { "SLURM_NTASKS", "5" },
		      { "FR_RENDEZVOUS", "x:1" }),
		  2, 5, "x:1", "Slurm");
	/* FR_RENDEZVOUS wins over MASTER_ADDR/MASTER_PORT. */
	expect_ok(ENV({ "RANK", "1" }, { "WORLD_SIZE", "2" },
		      { "MASTER_ADDR", "10.1.2.3" }, { "MASTER_PORT", "29500" },
		      { "FR_RENDEZVOUS", "y:2" }),
		  1, 2, "y:2", "torchrun");
	/* Empty variables count as unset. */
	expect_ok(ENV({ "FR_RANK", "" }, { "FR_NRANKS", "" },
		      { "RANK", "0" }, { "WORLD_SIZE", "2" },
		      { "FR_RENDEZVOUS", "y:2" }),
		  0, 2, "y:2", "torchrun");
}

static void test_errors(void **state)
{
	(void)state;
	/* rank >= size */
	expect_einval(ENV({ "FR_RANK", "4" }, { "FR_NRANKS", "4" },
			  { "FR_RENDEZVOUS", "h:1" }),
		      "FR_RANK", NULL);
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "2" },
			  { "OMPI_COMM_WORLD_SIZE", "2" },
			  { "FR_RENDEZVOUS", "h:1" }),
		      "OMPI_COMM_WORLD_RANK", NULL);
	/* negative */
	expect_einval(ENV({ "FR_RANK", "-1" }, { "FR_NRANKS", "4" },
			  { "FR_RENDEZVOUS", "h:1" }),
		      "FR_RANK", NULL);
	expect_einval(ENV({ "FR_RANK", "0" }, { "FR_NRANKS", "-4" },
			  { "FR_RENDEZVOUS", "h:1" }),
		      "FR_NRANKS", NULL);
	expect_einval(ENV({ "FR_RANK", "0" }, { "FR_NRANKS", "0" },
			  { "FR_RENDEZVOUS", "h:1" }),
		      "FR_NRANKS", NULL);
	/* non-numeric */
	expect_einval(ENV({ "FR_RANK", "one" }, { "FR_NRANKS", "4" },
			  { "FR_RENDEZVOUS", "h:1" }),
		      "FR_RANK", NULL);
	expect_einval(ENV({ "FR_RANK", "1" }, { "FR_NRANKS", "4x" },
			  { "FR_RENDEZVOUS", "h:1" }),
		      "FR_NRANKS", NULL);
	expect_einval(ENV({ "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "2.5" },
			  { "FR_RENDEZVOUS", "h:1" }),
		      "SLURM_NTASKS", NULL);
	expect_einval(ENV({ "RANK", " 1" }, { "WORLD_SIZE", "2" },
			  { "MASTER_ADDR", "h" }, { "MASTER_PORT", "5" }),
		      "RANK", NULL);
	/* rank without size, size without rank */
	expect_einval(ENV({ "FR_RANK", "0" }, { "FR_RENDEZVOUS", "h:1" }),
		      "FR_NRANKS", NULL);
	expect_einval(ENV({ "FR_NRANKS", "2" }, { "FR_RENDEZVOUS", "h:1" }),
		      "FR_RANK", NULL);
	expect_einval(ENV({ "PMI_SIZE", "2" }), "PMI_RANK", NULL);
	expect_einval(ENV({ "OMPI_COMM_WORLD_RANK", "0" }),
		      "OMPI_COMM_WORLD_SIZE", NULL);
	expect_einval(ENV({ "RANK", "0" }, { "MASTER_ADDR", "h" },
			  { "MASTER_PORT", "5" }),
		      "WORLD_SIZE", NULL);
	/* no launcher at all */
	expect_einval(ENV({ "HOME", "/root" }, { "PATH", "/bin" }), "FR_RANK",
		      NULL);
	expect_einval(ENV({ "FR_RENDEZVOUS", "h:1" }, { "MASTER_ADDR", "h" },
			  { "MASTER_PORT", "5" }),
		      "FR_RANK", NULL);
	expect_einval(ENV({ "FR_RANK", "" }, { "FR_NRANKS", "" }), "FR_RANK",
		      NULL);
}

static void test_error_message_truncated(void **state)
{
	struct fr_launch l;
	char buf[24];

	(void)state;
	/* A short err buffer is filled and terminated, never overrun. */
	memset(buf, 0x7e, sizeof(buf));
	assert_int_equal(fr_env_detect(table_get,
				       (void *)ENV({ "FR_RANK", "9" },
						   { "FR_NRANKS", "2" }),
				       &l, buf, 8),
			 FR_EINVAL);
	assert_int_equal(strlen(buf), 7);
	for (size_t i = 8; i < sizeof(buf); i++)
		assert_int_equal((unsigned char)buf[i], 0x7e);
}

static void test_single_rank(void **state)
{
	(void)state;
	/* One rank needs no rendezvous, whatever the launcher. */
	expect_ok(ENV({ "FR_RANK", "0" }, { "FR_NRANKS", "1" }), 0, 1, NULL,
		  "frrun");
	expect_ok(ENV({ "OMPI_COMM_WORLD_RANK", "0" },
		      { "OMPI_COMM_WORLD_SIZE", "1" }),
		  0, 1, NULL, "Open MPI");
	expect_ok(ENV({ "SLURM_PROCID", "0" }, { "SLURM_NTASKS", "1" },
		      { "SLURM_NNODES", "3" }),
		  0, 1, NULL, "Slurm");
	expect_ok(ENV({ "RANK", "0" }, { "WORLD_SIZE", "1" }), 0, 1, NULL,
		  "torchrun");
	/* ... but a given one is still kept. */
	expect_ok(ENV({ "FR_RANK", "0" }, { "FR_NRANKS", "1" },
		      { "FR_RENDEZVOUS", "h:3" }),
		  0, 1, "h:3", "frrun");
	expect_einval(ENV({ "FR_RANK", "1" }, { "FR_NRANKS", "1" }), "FR_RANK",
		      NULL);
}

/* ---- fr_env_long / fr_env_size ---------------------------------------------------------- */

static void test_env_long(void **state)
{
	const struct kv *env = ENV({ "A", "42" }, { "B", "" }, { "C", "x1" },
				   { "D", "-7" }, { "E", "100" });
	char err[256];
	long v;

	(void)state;
	v = 5;
	err[0] = '\0';
	assert_int_equal(fr_env_long(table_get, (void *)env, "UNSET", 0, 10,
				     &v, err, sizeof(err)),
			 0);
	assert_int_equal(v, 5); /* untouched */
	assert_string_equal(err, "");
	assert_int_equal(fr_env_long(table_get, (void *)env, "B", 0, 10, &v,
				     err, sizeof(err)),
			 0);
	assert_int_equal(v, 5);
	assert_int_equal(fr_env_long(table_get, (void *)env, "A", 0, 100, &v,
				     err, sizeof(err)),
			 1);
	assert_int_equal(v, 42);
	assert_int_equal(fr_env_long(table_get, (void *)env, "D", -7, -7, &v,
				     err, sizeof(err)),
			 1);
	assert_int_equal(v, -7);
	assert_int_equal(fr_env_long(table_get, (void *)env, "E", 0, 100, &v,
				     err, sizeof(err)),
			 1);
	assert_int_equal(v, 100);
	v = 5;
	assert_int_equal(fr_env_long(table_get, (void *)env, "E", 0, 99, &v,
				     err, sizeof(err)),
			 FR_EINVAL);
	assert_non_null(strstr(err, "E="));
	assert_int_equal(v, 5);
	assert_int_equal(fr_env_long(table_get, (void *)env, "C", 0, 99, &v,
				     err, sizeof(err)),
			 FR_EINVAL);
	assert_non_null(strstr(err, "C="));
	assert_non_null(strstr(err, "x1"));
	assert_int_equal(fr_env_long(table_get, (void *)env, "D", 0, 99, &v,
				     err, sizeof(err)),
			 FR_EINVAL);
	assert_non_null(strstr(err, "D="));
}

/* The rendezvous's timeout: FR_BOOT_TIMEOUT_MS, else the peer timeout but
 * at least 30 s, so that a short FR_TIMEOUT_MS does not fail a late start. */
static void test_boot_timeout(void **state)
{
	const struct kv *none = ENV({"FR_TIMEOUT_MS", "1000"});
	const struct kv *set = ENV({"FR_BOOT_TIMEOUT_MS", "500"});
	const struct kv *bad = ENV({"FR_BOOT_TIMEOUT_MS", "0"});
	char err[256] = "";
	long v = -1;

	(void)state;
	assert_int_equal(fr_env_boot_timeout(table_get, (void *)none, 1000, &v,
					     err, sizeof(err)),
			 0);
	assert_int_equal(v, 30000);
	assert_int_equal(fr_env_boot_timeout(table_get, (void *)none, 90000, &v,
					     err, sizeof(err)),
			 0);
	assert_int_equal(v, 90000);
	/* set: it alone decides, also below the peer timeout */
	assert_int_equal(fr_env_boot_timeout(table_get, (void *)set, 90000, &v,
					     err, sizeof(err)),
			 0);
	assert_int_equal(v, 500);
	assert_int_equal(fr_env_boot_timeout(table_get, (void *)bad, 1000, &v,
					     err, sizeof(err)),
			 FR_EINVAL);
	assert_non_null(strstr(err, "FR_BOOT_TIMEOUT_MS="));
}

static void test_env_size(void **state)
{
	const struct kv *env = ENV({ "S1", "4K" }, { "S2", "512" },
				   { "S3", "2m" }, { "S4", "1G" },
				   { "S5", "8KB" }, { "S6", "lots" },
				   { "S7", "100" }, { "S8", "" });
	char err[256];
	size_t v;

	(void)state;
	v = 3;
	assert_int_equal(fr_env_size(table_get, (void *)env, "NOPE", 0, 1, &v,
				     err, sizeof(err)),
			 0);
	assert_int_equal(v, 3);
	assert_int_equal(fr_env_size(table_get, (void *)env, "S8", 0, 1, &v,
				     err, sizeof(err)),
			 0);
	assert_int_equal(v, 3);
	assert_int_equal(fr_env_size(table_get, (void *)env, "S1", 0, SIZE_MAX,
				     &v, err, sizeof(err)),
			 1);
	assert_int_equal(v, 4096);
	assert_int_equal(fr_env_size(table_get, (void *)env, "S2", 0, SIZE_MAX,
				     &v, err, sizeof(err)),
			 1);
	assert_int_equal(v, 512);
	assert_int_equal(fr_env_size(table_get, (void *)env, "S3", 0, SIZE_MAX,
				     &v, err, sizeof(err)),
			 1);
	assert_int_equal(v, 2u << 20);
	assert_int_equal(fr_env_size(table_get, (void *)env, "S4", 0, SIZE_MAX,
				     &v, err, sizeof(err)),
			 1);
	assert_int_equal(v, 1u << 30);
	assert_int_equal(fr_env_size(table_get, (void *)env, "S5", 0, SIZE_MAX,
				     &v, err, sizeof(err)),
			 1);
	assert_int_equal(v, 8192);
	v = 3;
	assert_int_equal(fr_env_size(table_get, (void *)env, "S6", 0, SIZE_MAX,
				     &v, err, sizeof(err)),
			 FR_EINVAL);
	assert_non_null(strstr(err, "S6"));
	assert_int_equal(v, 3);
	/* Bounds are inclusive. */
	assert_int_equal(fr_env_size(table_get, (void *)env, "S7", 100, 100,
				     &v, err, sizeof(err)),
			 1);
	assert_int_equal(fr_env_size(table_get, (void *)env, "S7", 101, 200,
				     &v, err, sizeof(err)),
			 FR_EINVAL);
	assert_non_null(strstr(err, "S7"));
	assert_int_equal(fr_env_size(table_get, (void *)env, "S1", 0, 4095, &v,
				     err, sizeof(err)),
			 FR_EINVAL);
	assert_non_null(strstr(err, "S1"));
}

/* ---- util.c ---------------------------------------------------------------------- */

static void test_parse_long(void **state)
{
	static const struct {
		const char *s;
		long min, max, want;
	} ok[] = {
		{ "0", 0, 0, 0 },
		{ "42", 0, 100, 42 },
		{ "-5", -10, 10, -5 },
		{ "100", 0, 100, 100 },
		{ "-10", -10, 10, -10 },
		{ "007", 0, 10, 7 },
		{ "9223372036854775807", 0, LONG_MAX, LONG_MAX },
		{ "-9223372036854775808", LONG_MIN, 0, LONG_MIN },
	};
	static const struct {
		const char *s;
		long min, max;
	} bad[] = {
		{ "", 0, 10 },        { " 5", 0, 10 },    { "5 ", 0, 10 },
		{ "\t5", 0, 10 },     { "5x", 0, 10 },    { "x5", 0, 10 },
		{ "0x10", 0, 100 },   { "1e3", 0, 5000 }, { "11", 0, 10 },
		{ "-1", 0, 10 },      { "-", 0, 10 },     { "1.0", 0, 10 },
		{ "9223372036854775808", 0, LONG_MAX },
		{ "-9223372036854775809", LONG_MIN, 0 },
		{ "99999999999999999999999", LONG_MIN, LONG_MAX },
	};
	long v;

	(void)state;
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		v = -12345;
		if (fr_parse_long(ok[i].s, ok[i].min, ok[i].max, &v))
			fail_msg("fr_parse_long(\"%s\") failed", ok[i].s);
		assert_true(v == ok[i].want);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = -12345;
		if (fr_parse_long(bad[i].s, bad[i].min, bad[i].max, &v) !=
		    FR_EINVAL)
			fail_msg("fr_parse_long(\"%s\", %ld, %ld) accepted",
				 bad[i].s, bad[i].min, bad[i].max);
		assert_true(v == -12345);
	}
	assert_int_equal(fr_parse_long(NULL, 0, 10, &v), FR_EINVAL);
}

static void test_parse_size(void **state)
{
	static const struct {
		const char *s;
		unsigned long long want;
	} ok[] = {
		{ "0", 0 },
		{ "1", 1 },
		{ "1k", 1024 },
		{ "1K", 1024 },
		{ "3M", 3ull << 20 },
		{ "3m", 3ull << 20 },
		{ "2G", 2ull << 30 },
		{ "2g", 2ull << 30 },
		{ "10B", 10 },
		{ "10b", 10 },
		{ "4KB", 4096 },
		{ "4kb", 4096 },
		{ "0K", 0 },
		{ "512K", 512ull << 10 },
		{ "18446744073709551615", 18446744073709551615ull },
		{ "17179869183G", 17179869183ull << 30 },
	};
	static const char *const bad[] = {
		"", "K", "-1", " 1", "1 ", "1T", "1KK", "1BB", "1Kx", "x",
		"1.5K", "+1", "0x10",
		"18446744073709551616",  /* > ULLONG_MAX */
		"17179869184G",          /* 2^64 */
		"18014398509481984K",    /* 2^64 */
	};
	size_t v;

	(void)state;
	assert_true(sizeof(size_t) == 8); /* the large cases assume LP64 */
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		v = 12345;
		if (fr_parse_size(ok[i].s, &v))
			fail_msg("fr_parse_size(\"%s\") failed", ok[i].s);
		if (v != ok[i].want)
			fail_msg("fr_parse_size(\"%s\") = %zu, want %llu",
				 ok[i].s, v, ok[i].want);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		v = 12345;
		if (fr_parse_size(bad[i], &v) != FR_EINVAL)
			fail_msg("fr_parse_size(\"%s\") accepted (%zu)", bad[i],
				 v);
		assert_int_equal(v, 12345);
	}
	assert_int_equal(fr_parse_size(NULL, &v), FR_EINVAL);
}

static void test_parse_hostport(void **state)
{
	static const struct {
		const char *s, *host;
		unsigned port;
	} ok[] = {
		{ "host:80", "host", 80 },
		{ "127.0.0.1:1", "127.0.0.1", 1 },
		{ "node-01.cluster:65535", "node-01.cluster", 65535 },
		{ "[::1]:5000", "::1", 5000 },
		{ "[fe80::1%eth0]:29500", "fe80::1%eth0", 29500 },
		{ "[2001:db8::7]:443", "2001:db8::7", 443 },
		{ "h:0080", "h", 80 },
	};
	static const char *const bad[] = {
		"",            "host",        "host:",      ":80",
		"host:0",      "host:65536",  "host:x",     "host:-1",
		"host:80x",    "host: 80",    "::1:80",     "fe80::1",
		"[::1]",       "[::1]80",     "[::1]:",     "[::1",
		"[]:80",       "[::1]:0",     "[::1]:65536", "host:99999999999999999999",
		"a:b:80",
	};
	char host[64];
	uint16_t port;

	(void)state;
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		memset(host, 'X', sizeof(host));
		port = 0;
		if (fr_parse_hostport(ok[i].s, host, sizeof(host), &port))
			fail_msg("fr_parse_hostport(\"%s\") failed", ok[i].s);
		assert_string_equal(host, ok[i].host);
		assert_int_equal(port, ok[i].port);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (fr_parse_hostport(bad[i], host, sizeof(host), &port) !=
		    FR_EINVAL)
			fail_msg("fr_parse_hostport(\"%s\") accepted", bad[i]);
	assert_int_equal(fr_parse_hostport(NULL, host, sizeof(host), &port),
			 FR_EINVAL);

	/* The host must fit with its NUL: "abcdef" needs 7 bytes. */
	char small[16];

	memset(small, 'Z', sizeof(small));
	assert_int_equal(fr_parse_hostport("abcdef:1", small, 6, &port),
			 FR_EINVAL);
	for (size_t i = 0; i < sizeof(small); i++)
		assert_int_equal(small[i], 'Z');
	assert_int_equal(fr_parse_hostport("abcdef:1", small, 7, &port), 0);
	assert_string_equal(small, "abcdef");
	assert_int_equal(small[7], 'Z');
	assert_int_equal(fr_parse_hostport("[::1]:9", small, 3, &port),
			 FR_EINVAL);
	assert_int_equal(fr_parse_hostport("[::1]:9", small, 4, &port), 0);
	assert_string_equal(small, "::1");
	assert_int_equal(port, 9);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frrun),
		cmocka_unit_test(test_mpich_pmi),
		cmocka_unit_test(test_ompi_rendezvous),
		cmocka_unit_test(test_ompi_local),
		cmocka_unit_test(test_ompi_multihost),
		cmocka_unit_test(test_mpich),
		cmocka_unit_test(test_pmix_choice),
		cmocka_unit_test(test_slurm),
		cmocka_unit_test(test_ct_equal),
		cmocka_unit_test(test_torchrun),
		cmocka_unit_test(test_precedence),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_error_message_truncated),
		cmocka_unit_test(test_single_rank),
		cmocka_unit_test(test_env_long),
		cmocka_unit_test(test_boot_timeout),
		cmocka_unit_test(test_env_size),
		cmocka_unit_test(test_parse_long),
		cmocka_unit_test(test_parse_size),
		cmocka_unit_test(test_parse_hostport),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
