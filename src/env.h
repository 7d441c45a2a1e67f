/* SPDX-License-Identifier: MIT */
/*
 * env.h - find rank, size and rendezvous address in a launcher's environment.
 */
#ifndef FR_ENV_H
#define FR_ENV_H

#include <stdbool.h>
#include <stddef.h>

#include "envvar.h"


struct fr_launch {
	int rank;
	int nranks;
	char rendezvous[300];  /* host:port */
	const char *launcher;  /* "frrun", "Open MPI", "MPICH/Hydra", ... */
};

/*
 * Detect the launcher: FR_RANK/FR_NRANKS, then Open MPI, MPICH/Hydra,
 * torchrun, Slurm.  0, or FR_EINVAL with a message in err naming the
 * variable at fault.
 */
int fr_env_detect(fr_getenv_fn get, void *arg, struct fr_launch *out,
		  char *err, size_t errlen);


/* 1 if the launcher's variables (FR_LOCAL_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE,
 * MPI_LOCALNRANKS, LOCAL_WORLD_SIZE, SLURM_NNODES) say that all nranks
 * ranks run on this host, else 0. */
int fr_env_all_local(fr_getenv_fn get, void *arg, long nranks);

/*
 * Under a PMI-1 launcher (MPICH's Hydra: PMI_FD): rank 0 publishes
 * "host:port" (127.0.0.1 if local), all meet at a PMI barrier, the others
 * read it into rdv.  0 or FR_EBOOTSTRAP / FR_EINVAL with a message in err.
 */
int fr_pmi_rendezvous(fr_getenv_fn get, void *arg, int rank, bool local,
		      char *rdv, size_t rdvlen, char *err, size_t errlen);

/*
 * Under a PMIx launcher (PMIX_NAMESPACE: Open MPI's mpirun, srun
 * --mpi=pmix), built with configure --with-pmix (FR_HAVE_PMIX): the same
 * through PMIx.  rank 0 puts "host:port" (127.0.0.1 if local, else
 * FR_PMIX_HOST or the host name), all meet at a fence, the others get it.
 * rank and nranks must be PMIx's.  0 or FR_EBOOTSTRAP / FR_ETIMEDOUT /
 * FR_EPROTO / FR_EINVAL with a message in err.
 */
int fr_pmix_rendezvous(fr_getenv_fn get, void *arg, int rank, int nranks,
		       bool local, char *rdv, size_t rdvlen, char *err,
		       size_t errlen);



#endif
