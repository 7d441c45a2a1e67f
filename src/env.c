/* SPDX-License-Identifier: MIT */
/*
 * env.c - launcher environments.
 *
 * Rank and size come from the first launcher whose variables are present:
 * frrun (or a user) FR_RANK/FR_NRANKS, Open MPI, MPICH/Hydra, torchrun,
 * Slurm.  torchrun comes before Slurm because `srun torchrun ...` leaves
 * the srun task's SLURM_PROCID in every worker torchrun starts.  The rendezvous address is FR_RENDEZVOUS, else torchrun-style
 * MASTER_ADDR:MASTER_PORT+1 (MASTER_PORT itself belongs to torch's own
 * TCPStore), else - when the launcher says every rank is on this host -
 * 127.0.0.1 with a port derived from the launcher's job id, so that plain
 * `mpirun -np 4 prog` works without extra variables.  On several hosts,
 * rank 0 publishes its address through the launcher: PMI-1 under Hydra
 * (pmi.c), PMIx under Open MPI and srun --mpi=pmix (pmix.c, when built).
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "env.h"
#include "envvar.h"
#include "fastreduce.h"
#include "util.h"

struct launcher {
	const char *name;
	const char *rank_var, *size_var;
	/* Variables that, equal to the size, say "all ranks on one host". */
	const char *local_size_var; /* compared with size */
	const char *nnodes_var;     /* compared with 1 */
	/* Variables whose text identifies the job (for the default port). */
	const char *jobid_vars[3];
};

static const struct launcher launchers[] = {
	{ "frrun", "FR_RANK", "FR_NRANKS", "FR_LOCAL_SIZE", NULL,
	  { "FR_JOB_TOKEN", NULL, NULL } },
	{ "Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	  "OMPI_COMM_WORLD_LOCAL_SIZE", NULL,
	  { "OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid",
	    "PMIX_NAMESPACE" } },
	{ "MPICH/Hydra", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", NULL,
	  { "PMI_KVSNAME", "PMI_JOBID", "PMI_PORT" } },
	{ "torchrun", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", NULL,
	  { "TORCHELASTIC_RUN_ID", NULL, NULL } },
	{ "Slurm", "SLURM_PROCID", "SLURM_NTASKS", NULL, "SLURM_NNODES",
	  { "SLURM_JOB_ID", "SLURM_STEP_ID", NULL } },
};


/* Does the launcher say that all nranks ranks run on this host? */
static bool launcher_local(fr_getenv_fn get, void *arg,
			   const struct launcher *l, long nranks)
{
	char err[160];
	long n;

	if (l->local_size_var &&
	    fr_env_long(get, arg, l->local_size_var, 1, 1 << 24, &n, err,
			sizeof(err)) == 1 && n == nranks)
		return true;
	if (l->nnodes_var &&
	    fr_env_long(get, arg, l->nnodes_var, 1, 1 << 24, &n, err,
			sizeof(err)) == 1 && n == 1)
		return true;
	return l->nnodes_var && !strcmp(l->name, "Slurm") &&
	       fr_env_long(get, arg, "SLURM_JOB_NUM_NODES", 1, 1 << 24, &n,
			   err, sizeof(err)) == 1 && n == 1;
}


int fr_env_all_local(fr_getenv_fn get, void *arg, long nranks)
{
	for (size_t i = 0; i < FR_ARRAY_SIZE(launchers); i++)
		if (fr_env_get(get, arg, launchers[i].rank_var))
			return launcher_local(get, arg, &launchers[i], nranks);
	return 0;
}

/*
 * PMIx when built (configure --with-pmix), but not in the fuzzing build:
 * PMIx_Init reads the real environment, not the harness's, and starts a
 * thread; the fuzzer exercises the choice below, not libpmix.
 */
#if defined(FR_HAVE_PMIX) && !defined(FR_FUZZING)
#define PMIX_BUILT 1
#else
#define PMIX_BUILT 0
#endif

/* Did a PMIx launcher start this process? */
static bool pmix_server(fr_getenv_fn get, void *arg)
{
	return fr_env_get(get, arg, "PMIX_NAMESPACE") ||
	       fr_env_get(get, arg, "PMIX_RANK");
}

/*
 * Should rank 0's address come from PMIx?  FR_PMIX=0: never; FR_PMIX=1:
 * whenever a PMIx launcher started the job, even on one host; unset: when
 * its ranks are on several hosts.  1 or 0, or FR_EINVAL with a message.
 */
static int want_pmix(fr_getenv_fn get, void *arg, bool local, char *err,
		     size_t errlen)
{
	long force = -1;
	int rc = fr_env_long(get, arg, "FR_PMIX", 0, 1, &force, err, errlen);

	if (rc < 0)
		return rc;
	if (force == 0)
		return 0;
	if (force == 1 && !PMIX_BUILT) {
		snprintf(err, errlen,
			 "FR_PMIX=1, but libfastreduce was built without PMIx (install libpmix-dev and rebuild)");
		return FR_EINVAL;
	}
	if (force == 1 && !pmix_server(get, arg)) {
		snprintf(err, errlen,
			 "FR_PMIX=1, but PMIX_NAMESPACE is not set: the launcher offers no PMIx");
		return FR_EINVAL;
	}
	return PMIX_BUILT && pmix_server(get, arg) && (force == 1 || !local);
}

/*
 * The first host of a Slurm host list: "n[07-09,12],gpu1" -> "n07",
 * "a1,a2" -> "a1", "rack[2-3]-n[1-4]" -> "rack2-n1".  0, or -1 if the text
 * is not a host list.
 */
static int first_host(const char *list, char *out, size_t len)
{
	size_t o = 0;

	for (const char *p = list; *p && *p != ','; p++) {
		if (*p == '[') {
			/* the first number of the range list: up to - , or ] */
			for (p++; *p && *p != '-' && *p != ',' && *p != ']';
			     p++) {
				if (o + 1 >= len || *p < '0' || *p > '9')
					return -1;
				out[o++] = *p;
			}
			while (*p && *p != ']')
				p++;
			if (!*p)
				return -1;
			continue;
		}
		if (o + 1 >= len || *p == ']' || *p == ' ')
			return -1;
		out[o++] = *p;
	}
	out[o] = '\0';
	return o ? 0 : -1;
}

static int find_rendezvous(fr_getenv_fn get, void *arg,
			   const struct launcher *l, long nranks,
			   struct fr_launch *out, char *err, size_t errlen)
{
	const char *v, *maddr;
	char host[256];
	uint16_t port;
	long mport;
	uint32_t h = 2166136261u;
	bool have_id = false, local = false;
	int rc;

	v = fr_env_get(get, arg, "FR_RENDEZVOUS");
	if (v) {
		if (fr_parse_hostport(v, host, sizeof(host), &port)) {
			snprintf(err, errlen,
				 "FR_RENDEZVOUS=\"%s\" is not host:port", v);
			return FR_EINVAL;
		}
		snprintf(out->rendezvous, sizeof(out->rendezvous), "%s", v);
		return 0;
	}
	maddr = fr_env_get(get, arg, "MASTER_ADDR");
	if (maddr) {
		if (fr_env_long(get, arg, "MASTER_PORT", 1, 65534, &mport, err,
				errlen) != 1) {
			if (!err[0])
				snprintf(err, errlen,
					 "MASTER_ADDR is set but MASTER_PORT is not");
			return FR_EINVAL;
		}
		snprintf(out->rendezvous, sizeof(out->rendezvous),
			 strchr(maddr, ':') ? "[%s]:%ld" : "%s:%ld", maddr,
			 mport + 1);
		return 0;
	}
	if (nranks == 1) {
		snprintf(out->rendezvous, sizeof(out->rendezvous),
			 "127.0.0.1:1");
		return 0;
	}
	local = launcher_local(get, arg, l, nranks);
	/* MPICH's Hydra sets no job id or address, but offers PMI-1 */
	if (fr_env_get(get, arg, "PMI_FD") && !strcmp(l->name, "MPICH/Hydra")) {
		long rank = 0;

		fr_env_long(get, arg, l->rank_var, 0, nranks - 1, &rank, err,
			    errlen);
		return fr_pmi_rendezvous(get, arg, (int)rank, local,
					 out->rendezvous,
					 sizeof(out->rendezvous), err, errlen);
	}
	/* Open MPI, srun --mpi=pmix: rank 0 publishes it through PMIx */
	rc = want_pmix(get, arg, local, err, errlen);
	if (rc < 0)
		return rc;
#if PMIX_BUILT
	if (rc)
		return fr_pmix_rendezvous(get, arg, out->rank, (int)nranks,
					  local, out->rendezvous,
					  sizeof(out->rendezvous), err, errlen);
#endif
	for (int i = 0; i < 3 && l->jobid_vars[i]; i++) {
		v = fr_env_get(get, arg, l->jobid_vars[i]);
		if (v) {
			h = fr_env_hash(h, v);
			h = fr_env_hash(h, "/");
			have_id = true;
		}
	}
	/* srun over several nodes: task 0 runs on the step's first node */
	if (!local && have_id && !strcmp(l->name, "Slurm")) {
		const char *list = fr_env_get(get, arg, "SLURM_STEP_NODELIST");

		if (!list)
			list = fr_env_get(get, arg, "SLURM_JOB_NODELIST");
		if (list && !first_host(list, host, sizeof(host))) {
			snprintf(out->rendezvous, sizeof(out->rendezvous),
				 "%s:%u", host, 20000u + h % 40000u);
			return 0;
		}
	}
	if (!local || !have_id) {
		snprintf(err, errlen,
			 "%s: cannot tell where rank 0 serves the rendezvous%s; set FR_RENDEZVOUS=host:port (host of rank 0) on every rank%s",
			 l->name,
			 local ? " (no job id found)" :
				 " (ranks are on several hosts)",
			 !PMIX_BUILT && !local && pmix_server(get, arg) ?
				 ", or rebuild libfastreduce with PMIx (install libpmix-dev) to find it through the launcher" :
				 "");
		return FR_EINVAL;
	}
	snprintf(out->rendezvous, sizeof(out->rendezvous), "127.0.0.1:%u",
		 20000u + h % 40000u);
	return 0;
}

int fr_env_detect(fr_getenv_fn get, void *arg, struct fr_launch *out,
		  char *err, size_t errlen)
{
	long rank, size;
	int rc;

	err[0] = '\0';
	memset(out, 0, sizeof(*out));
	for (size_t i = 0; i < FR_ARRAY_SIZE(launchers); i++) {
		const struct launcher *l = &launchers[i];

		if (!fr_env_get(get, arg, l->rank_var) &&
		    !fr_env_get(get, arg, l->size_var))
			continue;
		rc = fr_env_long(get, arg, l->size_var, 1, 1 << 24, &size, err,
				 errlen);
		if (rc == 0) {
			snprintf(err, errlen, "%s is set but %s is not",
				 l->rank_var, l->size_var);
			return FR_EINVAL;
		}
		if (rc < 0)
			return rc;
		rc = fr_env_long(get, arg, l->rank_var, 0, size - 1, &rank,
				 err, errlen);
		if (rc == 0) {
			snprintf(err, errlen, "%s is set but %s is not",
				 l->size_var, l->rank_var);
			return FR_EINVAL;
		}
		if (rc < 0)
			return rc;
		out->rank = (int)rank;
		out->nranks = (int)size;
		out->launcher = l->name;
		return find_rendezvous(get, arg, l, size, out, err, errlen);
	}
	snprintf(err, errlen,
		 "no launcher environment found: run under frrun, mpirun, srun or torchrun, or set FR_RANK, FR_NRANKS and FR_RENDEZVOUS");
	return FR_EINVAL;
}
