/* SPDX-License-Identifier: MIT */
/*
 * affinity.c - where the progress thread runs (FR_PROGRESS_CPU).
 *
 * FR_PROGRESS_CPU takes a CPU list ("3", "0,2", "2-3": exactly these
 * CPUs), "none" (the thread inherits the affinity of the thread that
 * creates the communicator, as every thread does) or "auto", the default.
 * "auto" needs hwloc at build time (configure --with-hwloc); without it,
 * auto is none, and FR_LOG=info says so.
 *
 * The automatic policy (fr_affinity_policy), given
 *   P  the CPUs the creating thread may run on (sched_getaffinity: the
 *      binding that the launcher, taskset or the application gave the
 *      process, since threads inherit it),
 *   D  the CPUs local to the transport's device (verbs: the HCA's
 *      local_cpus), when the transport has one and it tells something
 *      (not the whole machine),
 *   h  the CPU the creating thread runs on now,
 * decides, in this order:
 *
 *   1. P within one core (mpirun --bind-to core, srun --cpu-bind=cores,
 *      taskset -c 3): inherit P.  The launcher gave this rank one core;
 *      moving the thread elsewhere would take a core that is another
 *      rank's, and the thread sleeps when there is nothing to do anyway.
 *   2. The locality domain: the NUMA nodes whose CPUs meet D, or, without
 *      D, the NUMA node of h; packages instead of NUMA nodes where the
 *      machine has one NUMA node (no NUMA information), and the whole
 *      machine where it has one package too.  C = P within the domain; if
 *      that is empty (the process is bound away from the device), C = P.
 *      The thread then runs next to the device it drives and to the
 *      memory it reduces (first touched by the creating thread).
 *   3. P is all the machine's CPUs (the process is not bound: the launcher
 *      did not divide the node, and other ranks may run on it): all of C.
 *      Picking one core there would put the progress threads of every
 *      rank of the node on the same core; the scheduler spreads them over
 *      the domain instead.
 *   4. Otherwise P is a binding of several cores, this rank's own: the
 *      last core of C, with its hardware threads that are in C.  The main
 *      thread and the compute threads (OpenMP places, a launcher's thread
 *      binding) fill a binding from its first core, so the last core is
 *      the one they reach last; the progress thread stays inside the
 *      rank's binding, does not share the main thread's core and moves
 *      nobody.  (When C has one core, that core.)
 *
 * The same inputs give the same set: h counts only where there is no D
 * and P spans several domains.  Cores are hwloc's (PUs where the topology
 * has none), "last" in hwloc's logical order.  The choice is made once,
 * when the thread starts; an explicit list or "none" overrides it, e.g.
 * where several ranks share one multi-core binding (they would all pick
 * the same last core).
 */
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "affinity.h"
#include "fastreduce.h"

#ifdef FR_HAVE_HWLOC
#include <hwloc/glibc-sched.h>
#endif

/* ---- FR_PROGRESS_CPU ----------------------------------------------------- */

/* A decimal CPU number below CPU_SETSIZE: digits only, no sign or blank. */
static int parse_cpu(const char **s, long *v)
{
	const char *p = *s;
	long n = 0;

	if (!isdigit((unsigned char)*p))
		return FR_EINVAL;
	while (isdigit((unsigned char)*p)) {
		n = n * 10 + (*p++ - '0');
		if (n >= CPU_SETSIZE)
			return FR_EINVAL;
	}
	*s = p;
	*v = n;
	return 0;
}

/* "3", "0,2", "2-3", "0,4-5": no empty item, ranges low to high. */
static int parse_list(const char *s, cpu_set_t *set)
{
	CPU_ZERO(set);
	for (;;) {
		long a, b;

		if (parse_cpu(&s, &a))
			return FR_EINVAL;
		b = a;
		if (*s == '-') {
			s++;
			if (parse_cpu(&s, &b) || b < a)
				return FR_EINVAL;
		}
		for (long i = a; i <= b; i++)
			CPU_SET((int)i, set);
		if (!*s)
			return 0;
		if (*s++ != ',')
			return FR_EINVAL;
	}
}

int fr_affinity_parse(const char *s, int *mode, cpu_set_t *list, char *err,
		      size_t errlen)
{
	CPU_ZERO(list);
	*mode = FR_CPU_AUTO;
	if (!s || !*s || !strcmp(s, "auto"))
		return 0;
	if (!strcmp(s, "none")) {
		*mode = FR_CPU_NONE;
		return 0;
	}
	if (parse_list(s, list)) {
		snprintf(
			err, errlen,
			"FR_PROGRESS_CPU=\"%s\" is not auto, none or a CPU list such as 3, 0,2 or 2-3 (CPUs 0 to %d)",
			s, CPU_SETSIZE - 1);
		return FR_EINVAL;
	}
	*mode = FR_CPU_LIST;
	return 0;
}

void fr_cpulist_format(const cpu_set_t *set, char *buf, size_t len)
{
	size_t n = 0;

	if (!len)
		return;
	buf[0] = '\0';
	for (int a = 0; a < CPU_SETSIZE; a++) {
		int b = a, w;

		if (!CPU_ISSET(a, set))
			continue;
		while (b + 1 < CPU_SETSIZE && CPU_ISSET(b + 1, set))
			b++;
		w = b > a ? snprintf(buf + n, len - n, "%s%d-%d", n ? "," : "",
				     a, b)
			  : snprintf(buf + n, len - n, "%s%d", n ? "," : "", a);
		if (w < 0 || (size_t)w >= len - n) {
			buf[n] = '\0'; /* whole items only */
			return;
		}
		n += (size_t)w;
		a = b;
	}
}

/* ---- the automatic policy ------------------------------------------------ */

#ifdef FR_HAVE_HWLOC
/* The cores (PUs where the topology has no cores) that set meets: how
 * many, and the last of them. */
static int units_meeting(hwloc_topology_t topo, hwloc_const_cpuset_t set,
			 hwloc_obj_t *last)
{
	hwloc_obj_type_t t = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE) > 0
				     ? HWLOC_OBJ_CORE
				     : HWLOC_OBJ_PU;
	hwloc_obj_t o = NULL;
	int n = 0;

	*last = NULL;
	while ((o = hwloc_get_next_obj_by_type(topo, t, o)))
		if (o->cpuset && hwloc_bitmap_intersects(o->cpuset, set)) {
			n++;
			*last = o;
		}
	return n;
}

/* The NUMA nodes (else packages, else the machine) that anchor meets. */
static const char *domain_of(hwloc_topology_t topo, hwloc_const_cpuset_t anchor,
			     hwloc_bitmap_t dom)
{
	hwloc_obj_type_t t;
	hwloc_obj_t o = NULL;
	const char *kind;

	if (hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE) > 1) {
		t = HWLOC_OBJ_NUMANODE;
		kind = "NUMA node";
	} else if (hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PACKAGE) > 1) {
		t = HWLOC_OBJ_PACKAGE;
		kind = "package";
	} else {
		hwloc_bitmap_copy(dom,
				  hwloc_topology_get_topology_cpuset(topo));
		return NULL;
	}
	hwloc_bitmap_zero(dom);
	while ((o = hwloc_get_next_obj_by_type(topo, t, o)))
		if (o->cpuset && hwloc_bitmap_intersects(o->cpuset, anchor))
			hwloc_bitmap_or(dom, dom, o->cpuset);
	return kind;
}

int fr_affinity_policy(hwloc_topology_t topo, hwloc_const_cpuset_t allowed,
		       hwloc_const_cpuset_t device, int here,
		       hwloc_cpuset_t out, char *why, size_t whylen)
{
	hwloc_const_cpuset_t machine = hwloc_topology_get_topology_cpuset(topo);
	hwloc_const_cpuset_t avail = hwloc_topology_get_allowed_cpuset(topo);
	hwloc_bitmap_t anchor = hwloc_bitmap_alloc();
	hwloc_bitmap_t dom = hwloc_bitmap_alloc();
	hwloc_bitmap_t cand = hwloc_bitmap_alloc();
	char nearest[96], where[160];
	const char *kind;
	hwloc_obj_t last;
	int n, rule;

	if (!anchor || !dom || !cand) {
		hwloc_bitmap_copy(out, allowed);
		snprintf(why, whylen, "out of memory: inherited");
		rule = FR_AFF_ONE_CORE;
		goto done;
	}
	/* 1. one core: stay */
	n = units_meeting(topo, allowed, &last);
	if (n <= 1) {
		hwloc_bitmap_copy(out, allowed);
		snprintf(why, whylen,
			 "the process is bound to one core: inherited");
		rule = FR_AFF_ONE_CORE;
		goto done;
	}
	/* 2. the domain nearest the device, else the creating thread */
	if (device && hwloc_bitmap_intersects(device, machine) &&
	    !hwloc_bitmap_isincluded(machine, device)) {
		hwloc_bitmap_copy(anchor, device);
		snprintf(nearest, sizeof(nearest), "the network device");
	} else if (here >= 0 && hwloc_bitmap_isset(machine, (unsigned)here)) {
		hwloc_bitmap_only(anchor, (unsigned)here);
		snprintf(nearest, sizeof(nearest),
			 "CPU %d (the creating thread's)", here);
	} else {
		hwloc_bitmap_copy(anchor, allowed);
		snprintf(nearest, sizeof(nearest), "the process's CPUs");
	}
	kind = domain_of(topo, anchor, dom);
	hwloc_bitmap_and(cand, allowed, dom);
	if (!kind) {
		snprintf(where, sizeof(where),
			 "the machine (one NUMA node, one package)");
	} else if (hwloc_bitmap_iszero(cand)) {
		hwloc_bitmap_copy(cand, allowed);
		snprintf(where, sizeof(where),
			 "the process's CPUs (none is in the %s nearest %s)",
			 kind, nearest);
	} else {
		snprintf(where, sizeof(where), "the %s nearest %s", kind,
			 nearest);
	}
	if (hwloc_bitmap_isincluded(avail, allowed)) {
		/* 3. not bound: the domain, shared with the node's ranks */
		hwloc_bitmap_copy(out, cand);
		snprintf(why, whylen, "the process is not bound: all of %s",
			 where);
		rule = FR_AFF_UNBOUND;
	} else {
		/* 4. a binding of several cores: its last core */
		units_meeting(topo, cand, &last);
		if (last)
			hwloc_bitmap_and(out, last->cpuset, cand);
		else
			hwloc_bitmap_copy(out, cand);
		snprintf(
			why, whylen,
			"the process is bound to %d cores: the last core of %s",
			n, where);
		rule = FR_AFF_LAST_CORE;
	}
done:
	hwloc_bitmap_free(cand);
	hwloc_bitmap_free(dom);
	hwloc_bitmap_free(anchor);
	return rule;
}
#endif /* FR_HAVE_HWLOC */

/* ---- this process -------------------------------------------------------- */

void fr_affinity_choose(int mode, const cpu_set_t *list,
			const cpu_set_t *device, bool *bind, cpu_set_t *out,
			char *why, size_t whylen)
{
	cpu_set_t mine;

	*bind = false;
	if (mode == FR_CPU_LIST) {
		*bind = true;
		*out = *list;
		snprintf(why, whylen, "FR_PROGRESS_CPU");
		return;
	}
	CPU_ZERO(out);
	if (sched_getaffinity(0, sizeof(mine), &mine)) {
		snprintf(why, whylen,
			 "inherited (this thread's affinity is unknown: %s)",
			 strerror(errno));
		return;
	}
	*out = mine;
	if (mode == FR_CPU_NONE) {
		snprintf(
			why, whylen,
			"FR_PROGRESS_CPU=none: inherited from the creating thread");
		return;
	}
#ifndef FR_HAVE_HWLOC
	(void)device;
	snprintf(
		why, whylen,
		"FR_PROGRESS_CPU=auto, but built without hwloc: inherited from the creating thread");
#else
	{
		hwloc_topology_t topo;
		hwloc_bitmap_t allowed = NULL, dev = NULL, res = NULL;
		char reason[384];
		cpu_set_t chosen;

		if (hwloc_topology_init(&topo)) {
			snprintf(
				why, whylen,
				"FR_PROGRESS_CPU=auto: hwloc failed: inherited");
			return;
		}
		if (hwloc_topology_load(topo)) {
			snprintf(
				why, whylen,
				"FR_PROGRESS_CPU=auto: hwloc cannot read the topology: inherited");
			goto done;
		}
		allowed = hwloc_bitmap_alloc();
		dev = device ? hwloc_bitmap_alloc() : NULL;
		res = hwloc_bitmap_alloc();
		if (!allowed || (device && !dev) || !res) {
			snprintf(
				why, whylen,
				"FR_PROGRESS_CPU=auto: out of memory: inherited");
			goto done;
		}
		hwloc_cpuset_from_glibc_sched_affinity(topo, allowed, &mine,
						       sizeof(mine));
		if (dev)
			hwloc_cpuset_from_glibc_sched_affinity(
				topo, dev, device, sizeof(*device));
		fr_affinity_policy(topo, allowed, dev, sched_getcpu(), res,
				   reason, sizeof(reason));
		hwloc_cpuset_to_glibc_sched_affinity(topo, res, &chosen,
						     sizeof(chosen));
		if (CPU_COUNT(&chosen) && !CPU_EQUAL(&chosen, &mine)) {
			*bind = true;
			*out = chosen;
		}
		snprintf(why, whylen, "FR_PROGRESS_CPU=auto: %s", reason);
	done:
		hwloc_bitmap_free(res);
		hwloc_bitmap_free(dev);
		hwloc_bitmap_free(allowed);
		hwloc_topology_destroy(topo);
	}
#endif
}

/*
 * Move the calling thread to another CPU of its own affinity mask, and
 * leave the mask as it was: setting a mask of one CPU migrates the thread
 * there at once, and the kernel has no reason to move it back when the
 * whole mask is restored.  rnd picks which of the other CPUs.  0, or
 * FR_ESYS (nothing changed) where the mask has one CPU or cannot be read.
 */
int fr_cpu_nudge(uint64_t rnd)
{
	cpu_set_t mine, one;
	int cur = sched_getcpu(), n, pick;

	if (cur < 0 || sched_getaffinity(0, sizeof(mine), &mine))
		return FR_ESYS;
	n = CPU_COUNT(&mine) - (CPU_ISSET(cur, &mine) ? 1 : 0);
	if (n < 1)
		return FR_ESYS;
	pick = (int)(rnd % (uint64_t)n);
	CPU_ZERO(&one);
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, &mine) || c == cur || pick-- > 0)
			continue;
		CPU_SET(c, &one);
		break;
	}
	if (sched_setaffinity(0, sizeof(one), &one))
		return FR_ESYS;
	/* the thread's own mask again: only the move remains */
	(void)sched_setaffinity(0, sizeof(mine), &mine);
	return 0;
}
