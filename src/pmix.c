/* SPDX-License-Identifier: MIT */
/*
 * pmix.c - the rendezvous address through PMIx (Open MPI's mpirun,
 * srun --mpi=pmix, prterun: any launcher that gives its ranks a PMIx
 * server, PMIX_NAMESPACE).  Built only with configure --with-pmix.
 *
 * On several hosts these launchers tell a rank neither where rank 0 runs
 * nor a port every rank agrees on, but they all offer PMIx's key-value
 * store.  So rank 0 puts "host:port" under the key fastreduce.rendezvous
 * (PMIX_GLOBAL), every rank commits and meets at a fence over the whole
 * namespace that collects the data (PMIX_COLLECT_DATA), and the others get
 * the value of (namespace, rank 0).  The port is one the kernel says is
 * free (fr_free_port), else derived from the namespace as pmi.c does;
 * the host is 127.0.0.1 when all ranks are on this
 * host, else FR_PMIX_HOST, else gethostname().  The fence and the get are
 * bounded by the rendezvous's timeout, FR_BOOT_TIMEOUT_MS (by default
 * FR_TIMEOUT_MS but at least 30 s: launchers start ranks seconds apart),
 * as PMIX_TIMEOUT in whole seconds.
 *
 * Sharing PMIx with an MPI library in the same process: PMIx_Init and
 * PMIx_Finalize are reference counted (pmix.h; PMIx_Finalize only tears
 * the client down when the count drops to zero), so when MPI_Init came
 * first, our pair only adds and drops a reference.  When we come first,
 * PMIx_Finalize would tear the client down and a later MPI_Init could not
 * bring it back (Open MPI 4.1 on PMIx 4.2: "orte_ess_init failed ... Not
 * found"; openpmix issue #1558).  So that first reference is kept until
 * the process exits and dropped by an atexit handler: a launcher takes a
 * process that initialized PMIx and exits without finalizing it for a
 * failed one (Open MPI: "exiting improperly").
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>
#include <unistd.h>

/* pmix_common.h's inline helpers use strdup, setenv and strncasecmp:
 * the libc headers above (with config.h's _GNU_SOURCE) come first */
#include <pmix.h>

#include "env.h"
#include "fastreduce.h"
#include "internal.h"
#include "log.h"
#include "util.h"

#define RDV_KEY "fastreduce.rendezvous"

/*
 * Documented global state (fastreduce(7)): the process that holds the
 * PMIx reference kept until exit.  Written once per process, by the first
 * fr_comm_create_from_env() that initializes PMIx; read at exit.
 */
static pid_t pmix_holder;

static void pmix_at_exit(void)
{
	/* not in a forked child: the connection is the parent's */
	if (pmix_holder == getpid())
		PMIx_Finalize(NULL, 0);
}

/* Drop our reference: now if another user holds PMIx, else at exit. */
static void pmix_release(bool shared)
{
	if (shared || atexit(pmix_at_exit)) {
		PMIx_Finalize(NULL, 0);
		return;
	}
	pmix_holder = getpid();
}

int fr_pmix_rendezvous(fr_getenv_fn get, void *arg, int rank, int nranks,
		       bool local, char *rdv, size_t rdvlen, char *err,
		       size_t errlen)
{
	pmix_proc_t me, proc;
	pmix_value_t v, *val = NULL;
	pmix_info_t info[2], opt;
	pmix_status_t prc;
	char host[256], addr[300];
	const char *name;
	uint16_t port;
	long tmo_ms = FR_DEFAULT_TIMEOUT_MS;
	int tmo_s, rc = 0;
	bool yes = true, shared;

	if (fr_env_long(get, arg, "FR_TIMEOUT_MS", 1, 86400000L, &tmo_ms, err,
			errlen) < 0 ||
	    fr_env_boot_timeout(get, arg, tmo_ms, &tmo_ms, err, errlen) < 0)
		return FR_EINVAL;
	tmo_s = (int)((tmo_ms + 999) / 1000);

	shared = PMIx_Initialized();
	prc = PMIx_Init(&me, NULL, 0);
	if (prc != PMIX_SUCCESS) {
		/* no PMIx_Finalize: after some failures (a namespace but no
		 * server) libpmix 4.2 crashes in it */
		name = get("PMIX_NAMESPACE", arg);
		snprintf(err, errlen,
			 "PMIx: PMIx_Init: %s (PMIX_NAMESPACE=\"%s\"; FR_PMIX=0 turns PMIx off)",
			 PMIx_Error_string(prc), name ? name : "");
		return FR_EBOOTSTRAP;
	}
	PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
	PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &tmo_s, PMIX_INT);
	PMIX_INFO_LOAD(&opt, PMIX_OPTIONAL, &yes, PMIX_BOOL);

#define PMIX_FAIL(code, ...)                                                 \
	do {                                                                 \
		snprintf(err, errlen, "PMIx: " __VA_ARGS__);                 \
		rc = (code);                                                 \
		goto out;                                                    \
	} while (0)

	/* the fence below waits for every rank of the namespace: make sure
	 * that they are the ranks of this job, or it would wait for ranks
	 * that never come */
	if (me.rank != (pmix_rank_t)rank)
		PMIX_FAIL(FR_EINVAL,
			  "this process is rank %u of namespace %.100s, but the launcher's variables say rank %d; set FR_RENDEZVOUS=host:port of rank 0",
			  (unsigned)me.rank, me.nspace, rank);
	PMIX_PROC_LOAD(&proc, me.nspace, PMIX_RANK_WILDCARD);
	prc = PMIx_Get(&proc, PMIX_JOB_SIZE, &opt, 1, &val);
	if (prc == PMIX_SUCCESS && val && val->type == PMIX_UINT32 &&
	    val->data.uint32 != (uint32_t)nranks)
		PMIX_FAIL(FR_EINVAL,
			  "namespace %.100s has %u processes, but the launcher's variables say %d ranks; set FR_RENDEZVOUS=host:port of rank 0",
			  me.nspace, (unsigned)val->data.uint32, nranks);

	if (rank == 0) {
		name = get("FR_PMIX_HOST", arg);
		fr_env_rank0_addr(me.nspace, local, name, addr, sizeof(addr));
		if (fr_parse_hostport(addr, host, sizeof(host), &port))
			PMIX_FAIL(FR_EINVAL,
				  "\"%.200s\" is not host:port (FR_PMIX_HOST=\"%.40s\")",
				  addr, name ? name : "");
		PMIX_VALUE_LOAD(&v, addr, PMIX_STRING);
		prc = PMIx_Put(PMIX_GLOBAL, RDV_KEY, &v);
		PMIX_VALUE_DESTRUCT(&v);
		if (prc != PMIX_SUCCESS)
			PMIX_FAIL(FR_EBOOTSTRAP, "PMIx_Put: %s",
				  PMIx_Error_string(prc));
	}
	prc = PMIx_Commit();
	if (prc != PMIX_SUCCESS)
		PMIX_FAIL(FR_EBOOTSTRAP, "PMIx_Commit: %s",
			  PMIx_Error_string(prc));
	prc = PMIx_Fence(&proc, 1, info, 2);
	if (prc == PMIX_ERR_TIMEOUT)
		PMIX_FAIL(FR_ETIMEDOUT,
			  "PMIx_Fence: %s after %d s (FR_BOOT_TIMEOUT_MS): the ranks of namespace %.100s did not all arrive",
			  PMIx_Error_string(prc), tmo_s, me.nspace);
	if (prc != PMIX_SUCCESS)
		PMIX_FAIL(FR_EBOOTSTRAP, "PMIx_Fence: %s",
			  PMIx_Error_string(prc));
	if (rank != 0) {
		if (val)
			PMIX_VALUE_RELEASE(val);
		val = NULL;
		PMIX_PROC_LOAD(&proc, me.nspace, 0);
		prc = PMIx_Get(&proc, RDV_KEY, &info[1], 1, &val);
		if (prc != PMIX_SUCCESS)
			PMIX_FAIL(prc == PMIX_ERR_TIMEOUT ? FR_ETIMEDOUT
							  : FR_EBOOTSTRAP,
				  "PMIx_Get(%s of rank 0): %s", RDV_KEY,
				  PMIx_Error_string(prc));
		if (!val || val->type != PMIX_STRING || !val->data.string ||
		    strlen(val->data.string) >= sizeof(addr) ||
		    fr_parse_hostport(val->data.string, host, sizeof(host),
				      &port))
			PMIX_FAIL(FR_EPROTO,
				  "rank 0's %s is not host:port", RDV_KEY);
		snprintf(addr, sizeof(addr), "%s", val->data.string);
	}
	snprintf(rdv, rdvlen, "%s", addr);
	fr_info("rendezvous %s through PMIx (namespace %s, rank %d of %d)",
		addr, me.nspace, rank, nranks);
#undef PMIX_FAIL
out:
	if (val)
		PMIX_VALUE_RELEASE(val);
	PMIX_INFO_DESTRUCT(&info[0]);
	PMIX_INFO_DESTRUCT(&info[1]);
	PMIX_INFO_DESTRUCT(&opt);
	pmix_release(shared);
	return rc;
}
