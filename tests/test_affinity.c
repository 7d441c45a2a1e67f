/* SPDX-License-Identifier: MIT */
/*
 * test_affinity.c - where the progress thread runs (src/affinity.c):
 * FR_PROGRESS_CPU's parsing and its refusal through fr_comm_create, the
 * automatic policy on hwloc synthetic topologies with given allowed sets,
 * device localities and current CPUs, and the decision for this process;
 * moving a thread to another CPU of its mask (fr_cpu_nudge).
 * The policy cases skip where the library is built without hwloc.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fastreduce.h"
#include "affinity.h"

/* A CPU list as a cpu_set_t (the parser under test, checked first). */
static cpu_set_t set_of(const char *list)
{
	cpu_set_t s;
	int mode;
	char err[256];

	if (fr_affinity_parse(list, &mode, &s, err, sizeof(err)) ||
	    mode != FR_CPU_LIST)
		fail_msg("\"%s\" does not parse: %s", list, err);
	return s;
}

static void expect_list(const cpu_set_t *s, const char *want)
{
	char got[256];

	fr_cpulist_format(s, got, sizeof(got));
	if (strcmp(got, want))
		fail_msg("CPUs %s, want %s", got, want);
}

/* ---- FR_PROGRESS_CPU ----------------------------------------------------- */

static void test_parse(void **state)
{
	static const char *const good[][2] = {
		{ "3", "3" },         { "0,2", "0,2" },
		{ "2-3", "2-3" },     { "0,4-5", "0,4-5" },
		{ "5,1,3-4", "1,3-5" }, { "7-7", "7" },
		{ "0,0,1", "0-1" },   { "1023", "1023" },
	};
	static const char *const bad[] = {
		"x",   "3-",  "-1",  "3-2",     "1,,2", "1,",   ",1",
		" 3",  "3 ",  "+3",  "0x3",     "1024", "99999999999999999999",
		"AUTO", "auto,1", "none ", "2-3-4", "1;2", "3-x",
	};
	cpu_set_t s;
	char err[256];
	int mode;

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		s = set_of(good[i][0]);
		expect_list(&s, good[i][1]);
	}
	assert_int_equal(fr_affinity_parse(NULL, &mode, &s, err, sizeof(err)),
			 0);
	assert_int_equal(mode, FR_CPU_AUTO);
	assert_int_equal(fr_affinity_parse("", &mode, &s, err, sizeof(err)), 0);
	assert_int_equal(mode, FR_CPU_AUTO);
	assert_int_equal(fr_affinity_parse("auto", &mode, &s, err, sizeof(err)),
			 0);
	assert_int_equal(mode, FR_CPU_AUTO);
	assert_int_equal(fr_affinity_parse("none", &mode, &s, err, sizeof(err)),
			 0);
	assert_int_equal(mode, FR_CPU_NONE);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		if (fr_affinity_parse(bad[i], &mode, &s, err, sizeof(err)) !=
		    FR_EINVAL)
			fail_msg("\"%s\" accepted", bad[i]);
		if (!strstr(err, "FR_PROGRESS_CPU") || !strstr(err, bad[i]) ||
		    !strstr(err, "auto, none or a CPU list"))
			fail_msg("\"%s\": message \"%s\"", bad[i], err);
	}
}

static void test_format(void **state)
{
	cpu_set_t s;
	char buf[8];

	(void)state;
	CPU_ZERO(&s);
	expect_list(&s, "");
	CPU_SET(0, &s);
	CPU_SET(CPU_SETSIZE - 1, &s);
	expect_list(&s, "0,1023");
	/* truncated, terminated, no overrun */
	s = set_of("0-3,10,12,14,16");
	memset(buf, 'x', sizeof(buf));
	fr_cpulist_format(&s, buf, sizeof(buf));
	assert_true(strlen(buf) < sizeof(buf));
	assert_string_equal(buf, "0-3,10");
}

/* A bad value refuses the communicator (one rank: no rendezvous), whether
 * or not a progress thread is asked for; good ones do not. */
static void test_create(void **state)
{
	static const char *const bad[] = { "bogus", "2-1", "1,", "0x1" };
	static const char *const good[] = { "auto", "none", "0", "" };
	fr_config_t cfg;
	fr_comm_t *c;
	const char *e;
	int rc;

	(void)state;
	fr_config_init(&cfg);
	cfg.rank = 0;
	cfg.nranks = 1;
	cfg.transport = "tcp";
	cfg.progress = FR_PROGRESS_THREAD;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("FR_PROGRESS_CPU", bad[i], 1);
		c = NULL;
		rc = fr_comm_create(&cfg, &c);
		if (!rc)
			fr_comm_destroy(c);
		assert_int_equal(rc, FR_EINVAL);
		e = fr_comm_last_error(NULL);
		if (!e || !strstr(e, "FR_PROGRESS_CPU"))
			fail_msg("FR_PROGRESS_CPU=%s: message \"%s\"", bad[i],
				 e ? e : "(null)");
	}
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		setenv("FR_PROGRESS_CPU", good[i], 1);
		c = NULL;
		rc = fr_comm_create(&cfg, &c);
		if (rc)
			fail_msg("FR_PROGRESS_CPU=%s: %s: %s", good[i],
				 fr_errname(rc), fr_comm_last_error(NULL));
		assert_int_equal(fr_comm_destroy(c), 0);
	}
	unsetenv("FR_PROGRESS_CPU");
}

/* ---- this process -------------------------------------------------------- */

static void test_choose(void **state)
{
	cpu_set_t mine, one, out, list;
	char why[512];
	bool bind;
	int first = -1;

	(void)state;
	assert_int_equal(sched_getaffinity(0, sizeof(mine), &mine), 0);
	for (int i = 0; i < CPU_SETSIZE && first < 0; i++)
		if (CPU_ISSET(i, &mine))
			first = i;
	assert_true(first >= 0);

	/* a list is taken as it is */
	list = set_of("1,5");
	fr_affinity_choose(FR_CPU_LIST, &list, NULL, &bind, &out, why,
			   sizeof(why));
	assert_true(bind);
	expect_list(&out, "1,5");

	/* none: inherit */
	fr_affinity_choose(FR_CPU_NONE, &list, NULL, &bind, &out, why,
			   sizeof(why));
	assert_false(bind);
	assert_true(CPU_EQUAL(&out, &mine));
	assert_non_null(strstr(why, "none"));

	/* auto: within the process's CPUs, never empty */
	fr_affinity_choose(FR_CPU_AUTO, &list, NULL, &bind, &out, why,
			   sizeof(why));
	assert_true(CPU_COUNT(&out) > 0);
	CPU_AND(&one, &out, &mine);
	assert_true(CPU_EQUAL(&one, &out));
	assert_non_null(strstr(why, "auto"));
#ifndef FR_HAVE_HWLOC
	assert_false(bind);
	assert_non_null(strstr(why, "without hwloc"));
#endif
	print_message("auto here: %s\n", why);

	/* auto, bound to one CPU (one core): inherit, even with a device
	 * elsewhere */
	CPU_ZERO(&one);
	CPU_SET(first, &one);
	assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
	list = set_of(first ? "0" : "1");
	fr_affinity_choose(FR_CPU_AUTO, NULL, &list, &bind, &out, why,
			   sizeof(why));
	assert_int_equal(sched_setaffinity(0, sizeof(mine), &mine), 0);
	assert_false(bind);
	assert_true(CPU_EQUAL(&out, &one));
}

/* ---- the policy on synthetic topologies ---------------------------------- */

#ifdef FR_HAVE_HWLOC
static hwloc_topology_t synthetic(const char *desc)
{
	hwloc_topology_t t;

	assert_int_equal(hwloc_topology_init(&t), 0);
	if (hwloc_topology_set_synthetic(t, desc))
		fail_msg("hwloc does not take the synthetic topology \"%s\"",
			 desc);
	assert_int_equal(hwloc_topology_load(t), 0);
	return t;
}

/* The policy with allowed, device (NULL: none) and here; the chosen CPUs
 * must be want and the rule rule; the reason must mention word. */
static void expect_policy(hwloc_topology_t t, const char *allowed,
			  const char *device, int here, const char *want,
			  int rule, const char *word)
{
	hwloc_bitmap_t a = hwloc_bitmap_alloc(), d = NULL,
		       out = hwloc_bitmap_alloc();
	char why[512], got[256];
	int r;

	assert_int_equal(hwloc_bitmap_list_sscanf(a, allowed), 0);
	if (device) {
		d = hwloc_bitmap_alloc();
		assert_int_equal(hwloc_bitmap_list_sscanf(d, device), 0);
	}
	r = fr_affinity_policy(t, a, d, here, out, why, sizeof(why));
	hwloc_bitmap_list_snprintf(got, sizeof(got), out);
	if (strcmp(got, want) || r != rule || (word && !strstr(why, word)))
		fail_msg("allowed %s device %s here %d: got %s (rule %d, \"%s\"), want %s (rule %d, \"%s\")",
			 allowed, device ? device : "-", here, got, r, why,
			 want, rule, word ? word : "");
	hwloc_bitmap_free(out);
	hwloc_bitmap_free(d);
	hwloc_bitmap_free(a);
}
#endif

/* Two packages of one NUMA node each, 4 cores of 2 PUs: node 0 is PUs
 * 0-7, node 1 PUs 8-15, core k PUs 2k and 2k+1. */
static void test_policy_numa(void **state)
{
#ifndef FR_HAVE_HWLOC
	(void)state;
	skip();
#else
	hwloc_topology_t t = synthetic("pack:2 numa:1 core:4 pu:2");

	(void)state;
	assert_int_equal(hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE), 2);
	/* not bound: the node of the device, else of the creating thread */
	expect_policy(t, "0-15", NULL, 3, "0-7", FR_AFF_UNBOUND,
		      "NUMA node nearest CPU 3");
	expect_policy(t, "0-15", NULL, 12, "8-15", FR_AFF_UNBOUND,
		      "not bound");
	expect_policy(t, "0-15", "8-15", 3, "8-15", FR_AFF_UNBOUND,
		      "NUMA node nearest the network device");
	expect_policy(t, "0-15", "9", 3, "8-15", FR_AFF_UNBOUND, "device");
	/* a device local to every CPU tells nothing: the creating thread */
	expect_policy(t, "0-15", "0-15", 12, "8-15", FR_AFF_UNBOUND,
		      "CPU 12");
	expect_policy(t, "0-15", "0-31", 1, "0-7", FR_AFF_UNBOUND, "CPU 1");
	/* nothing known about where we are: the whole process */
	expect_policy(t, "0-15", NULL, -1, "0-15", FR_AFF_UNBOUND, NULL);
	/* bound to a package (4 cores): its last core, both PUs */
	expect_policy(t, "0-7", NULL, 0, "6-7", FR_AFF_LAST_CORE,
		      "bound to 4 cores");
	expect_policy(t, "8-15", "8-15", 9, "14-15", FR_AFF_LAST_CORE,
		      "network device");
	/* bound across both nodes: the last core of the device's node, or
	 * of the creating thread's without a device */
	expect_policy(t, "4-11", "8-15", 4, "10-11", FR_AFF_LAST_CORE,
		      "device");
	expect_policy(t, "4-11", "0-7", 11, "6-7", FR_AFF_LAST_CORE, "device");
	expect_policy(t, "4-11", NULL, 5, "6-7", FR_AFF_LAST_CORE, "CPU 5");
	expect_policy(t, "4-11", NULL, 9, "10-11", FR_AFF_LAST_CORE, "CPU 9");
	/* bound away from the device: the process's own last core */
	expect_policy(t, "0-5", "8-15", 0, "4-5", FR_AFF_LAST_CORE,
		      "none is in the NUMA node");
	/* only one of the process's cores is near the device: that one */
	expect_policy(t, "0-8", "8-15", 0, "8", FR_AFF_LAST_CORE, "device");
	/* one PU of each of two cores: the last core's PU */
	expect_policy(t, "1-2", NULL, 1, "2", FR_AFF_LAST_CORE,
		      "bound to 2 cores");
	/* bound to one core, or one PU of it: stay, wherever the device */
	expect_policy(t, "2-3", "8-15", 2, "2-3", FR_AFF_ONE_CORE, "one core");
	expect_policy(t, "5", "8-15", 5, "5", FR_AFF_ONE_CORE, "one core");
	expect_policy(t, "5", NULL, -1, "5", FR_AFF_ONE_CORE, NULL);
	hwloc_topology_destroy(t);
#endif
}

/* Four NUMA nodes over two packages (node k: PUs 4k..4k+3): a device
 * between nodes 1 and 2 brings both. */
static void test_policy_four_nodes(void **state)
{
#ifndef FR_HAVE_HWLOC
	(void)state;
	skip();
#else
	hwloc_topology_t t = synthetic("pack:2 numa:2 core:2 pu:2");

	(void)state;
	assert_int_equal(hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE), 4);
	expect_policy(t, "0-15", "6-9", 0, "4-11", FR_AFF_UNBOUND, "NUMA node");
	expect_policy(t, "0-15", NULL, 13, "12-15", FR_AFF_UNBOUND, "CPU 13");
	expect_policy(t, "0-11", "6-9", 0, "10-11", FR_AFF_LAST_CORE,
		      "bound to 6 cores");
	hwloc_topology_destroy(t);
#endif
}

/* No NUMA information (one node for all) but two packages: packages are
 * the domains; one package and one node: the machine. */
static void test_policy_packages(void **state)
{
#ifndef FR_HAVE_HWLOC
	(void)state;
	skip();
#else
	hwloc_topology_t t = synthetic("numa:1 pack:2 core:4 pu:2");

	(void)state;
	assert_int_equal(hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE), 1);
	expect_policy(t, "0-15", "8-15", 0, "8-15", FR_AFF_UNBOUND,
		      "package nearest the network device");
	expect_policy(t, "0-15", NULL, 2, "0-7", FR_AFF_UNBOUND,
		      "package nearest CPU 2");
	expect_policy(t, "0-15", "0-15", 9, "8-15", FR_AFF_UNBOUND, "CPU 9");
	expect_policy(t, "2-9", "8-15", 2, "8-9", FR_AFF_LAST_CORE, "package");
	hwloc_topology_destroy(t);

	t = synthetic("numa:1 pack:1 core:4 pu:1");
	expect_policy(t, "0-3", "2", 0, "0-3", FR_AFF_UNBOUND, "the machine");
	expect_policy(t, "0-2", NULL, 0, "2", FR_AFF_LAST_CORE, "the machine");
	expect_policy(t, "1", NULL, 1, "1", FR_AFF_ONE_CORE, NULL);
	hwloc_topology_destroy(t);
#endif
}

/* A topology without cores: PUs stand for them. */
static void test_policy_no_cores(void **state)
{
#ifndef FR_HAVE_HWLOC
	(void)state;
	skip();
#else
	hwloc_topology_t t = synthetic("numa:1 pack:1 pu:4");

	(void)state;
	assert_int_equal(hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE), 0);
	expect_policy(t, "0-1", NULL, 0, "1", FR_AFF_LAST_CORE,
		      "bound to 2 cores");
	expect_policy(t, "3", NULL, 0, "3", FR_AFF_ONE_CORE, NULL);
	expect_policy(t, "0-3", NULL, 0, "0-3", FR_AFF_UNBOUND, NULL);
	hwloc_topology_destroy(t);
#endif
}

/*
 * fr_cpu_nudge: the thread lands on another CPU of its mask and keeps its
 * mask; a mask of one CPU is refused and left alone.
 */
static void test_nudge(void **state)
{
	cpu_set_t mine, after, one;
	int moved = 0;

	(void)state;
	assert_int_equal(sched_getaffinity(0, sizeof(mine), &mine), 0);
	if (CPU_COUNT(&mine) < 2)
		skip();
	for (int i = 0; i < 8; i++) {
		int before = sched_getcpu();

		assert_int_equal(fr_cpu_nudge((uint64_t)i * 7919u), 0);
		moved += sched_getcpu() != before;
		assert_int_equal(sched_getaffinity(0, sizeof(after), &after),
				 0);
		assert_true(CPU_EQUAL(&mine, &after));
	}
	/* a preemption may put it back now and then, never every time */
	assert_true(moved > 0);

	CPU_ZERO(&one);
	CPU_SET(sched_getcpu(), &one);
	assert_int_equal(sched_setaffinity(0, sizeof(one), &one), 0);
	assert_int_equal(fr_cpu_nudge(1), FR_ESYS);
	assert_int_equal(sched_getaffinity(0, sizeof(after), &after), 0);
	assert_true(CPU_EQUAL(&one, &after));
	assert_int_equal(sched_setaffinity(0, sizeof(mine), &mine), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse),
		cmocka_unit_test(test_format),
		cmocka_unit_test(test_create),
		cmocka_unit_test(test_choose),
		cmocka_unit_test(test_policy_numa),
		cmocka_unit_test(test_policy_four_nodes),
		cmocka_unit_test(test_policy_packages),
		cmocka_unit_test(test_policy_no_cores),
		cmocka_unit_test(test_nudge),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
