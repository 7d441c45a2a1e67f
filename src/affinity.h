/* SPDX-License-Identifier: MIT */
/*
 * affinity.h - where the progress thread runs (FR_PROGRESS_CPU): parsing,
 * the automatic placement policy (pure, unit tested over hwloc synthetic
 * topologies) and the decision for this process; moving a spinning rank
 * off a shared core (fr_cpu_nudge).  See affinity.c.
 */
#ifndef FR_AFFINITY_H
#define FR_AFFINITY_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef FR_HAVE_HWLOC
#include <hwloc.h>
#endif

/* What FR_PROGRESS_CPU asks for. */
enum fr_cpu_mode {
	FR_CPU_AUTO = 0, /* "auto" or unset: the policy below     */
	FR_CPU_NONE,     /* "none": inherit the creating thread's */
	FR_CPU_LIST,     /* "3", "0,2", "2-3": exactly these      */
};

/*
 * Parse an FR_PROGRESS_CPU value: NULL or "" is auto.  0, or FR_EINVAL
 * with a message naming the variable and saying what it takes.
 */
int fr_affinity_parse(const char *s, int *mode, cpu_set_t *list, char *err,
		      size_t errlen);

/* A set as a CPU list, "0-3,8" ("" when empty); truncated to len. */
void fr_cpulist_format(const cpu_set_t *set, char *buf, size_t len);

/*
 * Where the progress thread of a communicator goes, decided in the thread
 * that creates it.  device: the CPUs local to the transport's device
 * (transport op locality), or NULL.  On return *bind says whether to bind
 * the thread to *out (false: it inherits this thread's affinity), and why
 * says what was chosen and why, for FR_LOG=info.
 */
void fr_affinity_choose(int mode, const cpu_set_t *list,
			const cpu_set_t *device, bool *bind, cpu_set_t *out,
			char *why, size_t whylen);

/*
 * Move the calling thread to another CPU of its affinity mask (rnd picks
 * which), leaving the mask as it was; for ranks that find themselves
 * sharing a core with an idle one beside it (request.c, wait_done).  0 or
 * FR_ESYS.
 */
int fr_cpu_nudge(uint64_t rnd);

#ifdef FR_HAVE_HWLOC
/* Which rule of the policy decided (affinity.c). */
enum fr_affinity_rule {
	FR_AFF_ONE_CORE = 1, /* bound to one core: inherit              */
	FR_AFF_UNBOUND,      /* not bound: the device's/our domain      */
	FR_AFF_LAST_CORE,    /* bound to several cores: the last one    */
};

/*
 * The automatic policy, pure: topo the machine; allowed the CPUs the
 * creating thread may use; device the CPUs local to the transport's device
 * or NULL; here the CPU the creating thread runs on, or -1.  Writes the
 * chosen CPUs to out (never empty when allowed is not) and a reason to
 * why; returns the enum fr_affinity_rule that decided.
 */
int fr_affinity_policy(hwloc_topology_t topo, hwloc_const_cpuset_t allowed,
		       hwloc_const_cpuset_t device, int here,
		       hwloc_cpuset_t out, char *why, size_t whylen);
#endif

#endif
