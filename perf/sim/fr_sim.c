/* SPDX-License-Identifier: MIT */
/*
 * fr_sim - All-Reduce (or, with --coll, reduce-scatter or all-gather) of
 * the library's own schedules, every rank in this process, timed on a
 * simulated network (sim.h, perf/sim/README.md).
 *
 *   fr_sim -n 16 -k 4 --gbps 100 --lat-us 2 -b 8 -e 64M -f 8 -a all
 *
 * For each size and algorithm: one warm-up call (connections come up),
 * then one timed call; the time is virtual and the same on every run, so
 * one call says all (--calls K: K back to back, as a benchmark loop runs
 * them, sim.h; --stagger-us and --lead-us: the ranks launched apart,
 * through 3 untimed calls first; --barrier: a barrier before each timed
 * call, as fr_allreduce_perf --barrier).  Every result is checked against
 * a reference (small integers in f32, exact in any order): a schedule that
 * computes a wrong sum fails the run, as one that stalls does.  With
 * --sizes-only there is no data (sim.h, SIM_SIZES_ONLY): every rank's
 * buffer is the same untouched mapping and nothing is checked but that the
 * schedules end, which is what lets thousands of ranks run sizes up to
 * hundreds of MiB.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "internal.h"
#include "perf_common.h"
#include "sim.h"

static void usage(FILE *f)
{
	fprintf(f,
		"usage: fr_sim [options]\n"
		"  -n, --ranks N          ranks (default 8)\n"
		"  -k, --per-node K       ranks per node, consecutive (default 1)\n"
		"      --gbps G           each node's link, each way (default 100)\n"
		"      --lat-us U         one way across the switch (default 2)\n"
		"      --shm-gbps G       a copy within a node (default 200)\n"
		"      --shm-lat-us U     (default 0.5)\n"
		"      --overhead B       bytes on the wire per write besides its\n"
		"                         payload (default 0)\n"
		"      --topo T           star (default); fat-tree:F:O[,F:O...]:\n"
		"                         leaf switches of F nodes whose uplinks\n"
		"                         are oversubscribed O:1, and switches of\n"
		"                         F of those above, ...; torus:XxY[xZ]:\n"
		"                         the nodes on a wrapped grid\n"
		"      --hop-lat-us U     per switch level or torus hop beyond\n"
		"                         the first (default 0)\n"
		"      --cpu-reduce-GBps R  a reduction's bytes made per ns\n"
		"      --cpu-send-us U, --cpu-send-GBps R\n"
		"      --cpu-recv-us U, --cpu-recv-GBps R\n"
		"                         a write between nodes: the sender's and\n"
		"                         the receiver's work (default: no CPU\n"
		"                         model, computing is free)\n"
		"      --cpu-wake-us U    a rank's wake-up, once idle longer than\n"
		"      --cpu-spin-us U    (default 0, 0)\n"
		"      --cpu-spin-holds   a spinning rank holds its core through\n"
		"                         its spin even with a stream on its way\n"
		"                         (as under a shaped link)\n"
		"      --cores C          the ranks of a node share C cores\n"
		"                         (default 0: a CPU per rank)\n"
		"      --cores-job        the C cores are the whole job's (one\n"
		"                         host emulating the nodes)\n"
		"      --cpu-dl-us U      an emulated network's delay line: a\n"
		"                         core's work per write into a node, one\n"
		"                         at a time per node (default 0)\n"
		"      --cpu-dl-GBps G    and the bytes it lets through a ns of\n"
		"                         that work (default 0: no cost per byte)\n"
		"      --cpu-dl-busy-us U a write that comes while its line is\n"
		"                         still at work on those before: its work\n"
		"                         (the line takes the queue in a batch;\n"
		"                         default 0: --cpu-dl-us)\n"
		"  -b, --min-bytes S      smallest size (default 8)\n"
		"  -e, --max-bytes S      largest size (default 64M)\n"
		"  -f, --factor F         size step (default 4)\n"
		"      --sizes LIST       comma-separated sizes, in that order,\n"
		"                         instead of -b, -e and -f\n"
		"  -a, --algos LIST       comma-separated: auto, ring, rd,\n"
		"                         rabenseifner, tree, hier, oneshot; all\n"
		"                         (default auto)\n"
		"  -C, --coll C           allreduce (default), reduce_scatter or\n"
		"                         allgather; sizes are then all n blocks\n"
		"      --max-mem-mib M    refuse sizes whose buffers need more\n"
		"                         (default 4096)\n"
		"      --sizes-only       no data: times only, for many ranks and\n"
		"                         large sizes (results not checked)\n"
		"      --calls K          time K calls back to back, as a\n"
		"                         benchmark loop does: per call the\n"
		"                         slowest rank's time, the median\n"
		"                         (default 1: one call, all ranks at once)\n"
		"      --stagger-us U     with --calls 2+ and a CPU model: rank r\n"
		"                         starts r x U late, as a job's ranks are\n"
		"                         launched, and 3 untimed calls (the 2\n"
		"                         warm-up calls of fr_allreduce_perf -w 2\n"
		"                         and its line-up) carry that into the\n"
		"                         timed ones (default 0)\n"
		"      --lead-us U        the same, but rank 0 starts U early\n"
		"                         and the others together, as a job's\n"
		"                         rendezvous leaves them (rank 0\n"
		"                         answers all at once; its answers take\n"
		"                         a latency to arrive) (default 0)\n"
		"      --barrier          a barrier before every timed call\n"
		"                         (but a first from the common start),\n"
		"                         outside the calls' times, as\n"
		"                         fr_allreduce_perf --barrier\n"
		"  -h, --help\n"
		"Sizes take K/M/G suffixes (powers of 1024).\n");
}

/* "1M,25M,97.5..." into a malloc'ed array: the count, or -1 if a size is
 * malformed or zero */
static int parse_sizes(const char *list, size_t **out)
{
	char *buf = strdup(list), *save = NULL, *tok;
	size_t *v = NULL;
	int n = 0;

	if (!buf)
		return -1;
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		size_t *w = realloc(v, (size_t)(n + 1) * sizeof(*v));

		if (!w || pc_parse_size(tok, &w[n]) || !w[n]) {
			free(w ? w : v);
			free(buf);
			return -1;
		}
		v = w;
		n++;
	}
	free(buf);
	if (!n)
		return -1;
	*out = v;
	return n;
}

/* minb, minb x factor, ... up to maxb, as -b, -e and -f give them */
static int geometric_sizes(size_t minb, size_t maxb, size_t factor,
			   size_t **out)
{
	size_t *v;
	int n = 0;

	v = calloc(64, sizeof(*v));
	if (!v)
		return -1;
	for (size_t b = minb; b <= maxb && n < 64; b *= factor) {
		v[n++] = b;
		if (b > maxb / factor)
			break;
	}
	*out = v;
	return n;
}

/* "fat-tree:16:1,8:2" or "torus:8x8x4" into p; -1 if malformed */
static int parse_topo(const char *s, struct sim_net_params *p)
{
	const char *q;
	char *end;
	int n = 0;

	if (!strcmp(s, "star")) {
		p->topo = SIM_STAR;
		return 0;
	}
	if (!strncmp(s, "fat-tree:", 9)) {
		p->topo = SIM_FAT_TREE;
		for (q = s + 9; n < SIM_MAX_LEVELS; q = end + 1) {
			long f = strtol(q, &end, 10);

			if (end == q || *end != ':' || f < 1 || f > 1 << 20)
				return -1;
			p->fanout[n] = (int)f;
			q = end + 1;
			p->oversub[n++] = strtod(q, &end);
			if (end == q || (*end && *end != ','))
				return -1;
			if (!*end)
				break;
		}
		p->levels = n;
		return *end ? -1 : 0;
	}
	if (!strncmp(s, "torus:", 6)) {
		p->topo = SIM_TORUS;
		for (q = s + 6; n < SIM_MAX_DIMS; q = end + 1) {
			long d = strtol(q, &end, 10);

			if (end == q || d < 1 || d > 1 << 20 ||
			    (*end && *end != 'x'))
				return -1;
			p->dims[n++] = (int)d;
			if (!*end)
				break;
		}
		p->ndims = n;
		return *end ? -1 : 0;
	}
	return -1;
}

/* the All-Reduce algorithms "all" means */
static const char *const all_algos[] = {
	"auto", "ring", "rd", "rabenseifner", "tree", "hier", "oneshot"};

static int parse_double(const char *s, double *out)
{
	char *end;

	*out = strtod(s, &end);
	return end == s || *end ? -1 : 0;
}

static int parse_algos(const char *list, int *ids, const char **names, int max)
{
	char buf[256], *save = NULL, *tok;
	int n = 0;

	if (!strcmp(list, "all")) {
		for (size_t i = 0; i < PC_ARRAY_SIZE(all_algos); i++) {
			fr_algo_t a;

			fr_algo_from_name(all_algos[i], &a);
			ids[n] = (int)a;
			names[n++] = all_algos[i];
		}
		return n;
	}
	snprintf(buf, sizeof(buf), "%s", list);
	for (tok = strtok_r(buf, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		fr_algo_t a;

		if (n == max || fr_algo_from_name(tok, &a)) {
			fprintf(stderr, "fr_sim: unknown algorithm \"%s\"\n",
				tok);
			return -1;
		}
		ids[n] = (int)a;
		names[n++] = fr_algo_name((int)a);
	}
	return n;
}

/* small integers, exact in f32 whatever the order of the sum */
static float val(int r, size_t i)
{
	return (float)((r % 5 + 1) * (int)(i % 7));
}

/* The reduce-scatter's blocks (count elements each): rank r's own is the
 * sum of block r over all ranks; the all-gather's: block q is rank q's. */
static int check_rsag(struct sim *s, enum fr_coll coll, void **bufs,
		      size_t count, char *msg, size_t len)
{
	for (int r = 0; r < s->n; r++)
		for (int q = 0; q < s->n; q++) {
			if (coll == FR_COLL_REDUCE_SCATTER && q != r)
				continue;
			for (size_t j = 0; j < count; j++) {
				size_t i = (size_t)q * count + j;
				float want = val(q, i),
				      got = ((float *)bufs[r])[i];

				if (coll == FR_COLL_REDUCE_SCATTER) {
					want = 0;
					for (int u = 0; u < s->n; u++)
						want += val(u, i);
				}
				if (got != want) {
					snprintf(
						msg, len,
						"rank %d block %d element %zu: %g, want %g",
						r, q, j, (double)got,
						(double)want);
					return -1;
				}
			}
		}
	return 0;
}

static int check(struct sim *s, enum fr_coll coll, void **bufs, size_t count,
		 char *msg, size_t len)
{
	if (coll != FR_COLL_ALLREDUCE)
		return check_rsag(s, coll, bufs, count, msg, len);
	for (size_t i = 0; i < count; i++) {
		float want = 0;

		for (int r = 0; r < s->n; r++)
			want += val(r, i);
		for (int r = 0; r < s->n; r++)
			if (((float *)bufs[r])[i] != want) {
				snprintf(msg, len,
					 "rank %d element %zu: %g, want %g", r,
					 i, (double)((float *)bufs[r])[i],
					 (double)want);
				return -1;
			}
	}
	return 0;
}

/* rank r's data, also between back-to-back calls (arg: the count) */
static void refill(void *arg, int r, void *buf)
{
	for (size_t i = 0; i < *(size_t *)arg; i++)
		((float *)buf)[i] = val(r, i);
}

static void fill(struct sim *s, void **bufs, size_t count)
{
	for (int r = 0; r < s->n; r++)
		refill(&count, r, bufs[r]);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"ranks", required_argument, NULL, 'n'},
		{"per-node", required_argument, NULL, 'k'},
		{"gbps", required_argument, NULL, 'G'},
		{"lat-us", required_argument, NULL, 'L'},
		{"shm-gbps", required_argument, NULL, 'S'},
		{"shm-lat-us", required_argument, NULL, 'T'},
		{"overhead", required_argument, NULL, 'O'},
		{"topo", required_argument, NULL, 'P'},
		{"hop-lat-us", required_argument, NULL, 'H'},
		{"cpu-reduce-GBps", required_argument, NULL, 1000},
		{"cpu-send-us", required_argument, NULL, 1001},
		{"cpu-send-GBps", required_argument, NULL, 1002},
		{"cpu-recv-us", required_argument, NULL, 1003},
		{"cpu-recv-GBps", required_argument, NULL, 1004},
		{"cpu-wake-us", required_argument, NULL, 1005},
		{"cpu-spin-us", required_argument, NULL, 1006},
		{"cores", required_argument, NULL, 1007},
		{"cores-job", no_argument, NULL, 1008},
		{"cpu-dl-us", required_argument, NULL, 1020},
		{"cpu-dl-GBps", required_argument, NULL, 1022},
		{"cpu-dl-busy-us", required_argument, NULL, 1027},
		{"cpu-spin-holds", no_argument, NULL, 1023},
		{"min-bytes", required_argument, NULL, 'b'},
		{"max-bytes", required_argument, NULL, 'e'},
		{"factor", required_argument, NULL, 'f'},
		{"algos", required_argument, NULL, 'a'},
		{"max-mem-mib", required_argument, NULL, 'M'},
		{"sizes-only", no_argument, NULL, 'Z'},
		{"calls", required_argument, NULL, 1021},
		{"stagger-us", required_argument, NULL, 1024},
		{"lead-us", required_argument, NULL, 1025},
		{"barrier", no_argument, NULL, 1026},
		{"sizes", required_argument, NULL, 1009},
		{"coll", required_argument, NULL, 'C'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct sim_net_params p = {
		.nranks = 8,
		.ranks_per_node = 1,
		.link_gbps = 100,
		.link_lat_ns = 2000,
		.shm_gbps = 200,
		.shm_lat_ns = 500,
	};
	struct sim_cpu_params cpu = {0};
	size_t minb = 8, maxb = 64u << 20, *sizes = NULL;
	long factor = 4, maxmem = 4096, v;
	int nsizes = 0;
	int ids[16], nalgo;
	const char *names[16], *algos = "auto";
	double d;
	char topo[128], how[256] = "one call after a warm-up";
	struct sim s;
	void **bufs, *shared = NULL;
	bool sizes_only = false;
	enum fr_coll coll = FR_COLL_ALLREDUCE;
	int opt, rc = 0, calls = 1;
	double stagger_ns = 0, lead_ns = 0;
	bool barrier = false;

	while ((opt = getopt_long(argc, argv, "n:k:b:e:f:a:C:h", longopts,
				  NULL)) != -1) {
		switch (opt) {
		case 'n':
		case 'k':
			if (pc_parse_long(optarg, 1, 1 << 20, &v))
				goto bad;
			*(opt == 'n' ? &p.nranks : &p.ranks_per_node) = (int)v;
			break;
		case 'G':
		case 'S':
			if (parse_double(optarg, &d) || !(d > 0))
				goto bad;
			*(opt == 'G' ? &p.link_gbps : &p.shm_gbps) = d;
			break;
		case 'L':
		case 'T':
		case 'H':
			if (parse_double(optarg, &d) || !(d >= 0))
				goto bad;
			*(opt == 'L'   ? &p.link_lat_ns
			  : opt == 'T' ? &p.shm_lat_ns
				       : &p.hop_lat_ns) = d * 1e3;
			break;
		case 'P':
			if (parse_topo(optarg, &p))
				goto bad;
			break;
		case 1000:
		case 1001:
		case 1002:
		case 1003:
		case 1004:
		case 1005:
		case 1006: {
			/* in the order of struct sim_cpu_params; the
			 * times given in us, kept in ns */
			double *f[] = {&cpu.reduce_GBps, &cpu.send_ns,
				       &cpu.send_GBps,	 &cpu.recv_ns,
				       &cpu.recv_GBps,	 &cpu.wake_ns,
				       &cpu.spin_ns};

			if (parse_double(optarg, &d) || !(d >= 0))
				goto bad;
			*f[opt - 1000] =
				opt == 1000 || opt == 1002 || opt == 1004
					? d
					: d * 1e3;
			break;
		}
		case 1007:
			if (pc_parse_long(optarg, 0, 1 << 20, &v))
				goto bad;
			cpu.cores = (int)v;
			break;
		case 1008:
			cpu.cores_job = true;
			break;
		case 1023:
			cpu.spin_holds = true;
			break;
		case 1020:
			if (parse_double(optarg, &d) || !(d >= 0))
				goto bad;
			cpu.dl_ns = d * 1e3;
			break;
		case 1022:
			if (parse_double(optarg, &d) || !(d >= 0))
				goto bad;
			cpu.dl_GBps = d;
			break;
		case 1027:
			if (parse_double(optarg, &d) || !(d >= 0))
				goto bad;
			cpu.dl_busy_ns = d * 1e3;
			break;
		case 'O':
			if (pc_parse_long(optarg, 0, 1 << 16, &v))
				goto bad;
			p.overhead_bytes = (unsigned int)v;
			break;
		case 'b':
		case 'e':
			if (pc_parse_size(optarg, opt == 'b' ? &minb : &maxb))
				goto bad;
			break;
		case 'f':
			if (pc_parse_long(optarg, 2, 1 << 20, &factor))
				goto bad;
			break;
		case 'a':
			algos = optarg;
			break;
		case 'M':
			if (pc_parse_long(optarg, 1, 1L << 30, &maxmem))
				goto bad;
			break;
		case 'Z':
			sizes_only = true;
			break;
		case 1021:
			if (pc_parse_long(optarg, 1, 1000, &v))
				goto bad;
			calls = (int)v;
			break;
		case 1024:
		case 1025:
			/* (whole ns: less than one is none) */
			if (parse_double(optarg, &d) || !(d >= 0) || d > 1e7 ||
			    (d > 0 && d < 0.001))
				goto bad;
			*(opt == 1024 ? &stagger_ns : &lead_ns) =
				round(d * 1e3);
			break;
		case 1026:
			barrier = true;
			break;
		case 'C':
			if (!strcmp(optarg, "allreduce"))
				coll = FR_COLL_ALLREDUCE;
			else if (!strcmp(optarg, "reduce_scatter"))
				coll = FR_COLL_REDUCE_SCATTER;
			else if (!strcmp(optarg, "allgather"))
				coll = FR_COLL_ALLGATHER;
			else
				goto bad;
			break;
		case 1009:
			free(sizes);
			nsizes = parse_sizes(optarg, &sizes);
			if (nsizes < 0)
				goto bad;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc || !minb || minb > maxb) {
		usage(stderr);
		free(sizes);
		return 2;
	}
	if ((stagger_ns > 0 || lead_ns > 0 || barrier) && calls < 2) {
		fprintf(stderr, "fr_sim: %s needs --calls 2 or more\n",
			barrier		 ? "--barrier"
			: stagger_ns > 0 ? "--stagger-us"
					 : "--lead-us");
		free(sizes);
		return 2;
	}
	if (!nsizes) {
		/* -b, -e and -f as the list they give */
		nsizes = geometric_sizes(minb, maxb, (size_t)factor, &sizes);
		if (nsizes < 0)
			return 1;
	}
	maxb = 0;
	for (int i = 0; i < nsizes; i++)
		maxb = sizes[i] > maxb ? sizes[i] : maxb;
	nalgo = parse_algos(algos, ids, names, (int)PC_ARRAY_SIZE(ids));
	if (nalgo < 0) {
		free(sizes);
		return 2;
	}
	if (!sizes_only &&
	    (double)p.nranks * (double)(maxb / sizeof(float) * sizeof(float)) >
		    (double)maxmem * (1 << 20)) {
		fprintf(stderr,
			"fr_sim: %d ranks x %zu bytes exceed --max-mem-mib %ld (--sizes-only needs none)\n",
			p.nranks, maxb, maxmem);
		free(sizes);
		return 2;
	}
	bufs = calloc((size_t)p.nranks, sizeof(*bufs));
	if (!bufs) {
		free(sizes);
		return 1;
	}
	if (sizes_only) {
		/* one mapping for all, its pages made only where a write's
		 * first bytes land */
		shared = mmap(
			NULL, maxb < 4096 ? 4096 : maxb, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		if (shared == MAP_FAILED) {
			fprintf(stderr, "fr_sim: cannot map %zu bytes\n", maxb);
			shared = NULL;
			rc = 1;
			goto out;
		}
	}
	for (int r = 0; r < p.nranks; r++) {
		bufs[r] = shared ? shared
				 : malloc(maxb < sizeof(float) ? sizeof(float)
							       : maxb);
		if (!bufs[r]) {
			fprintf(stderr, "fr_sim: out of memory\n");
			rc = 1;
			goto out;
		}
	}
	rc = sim_open(&s, &p, &cpu, NULL, sizes_only ? SIM_SIZES_ONLY : 0);
	if (rc) {
		fprintf(stderr, "fr_sim: %s\n", s.err);
		rc = 1;
		goto out;
	}
	if ((stagger_ns > 0 || lead_ns > 0) && !s.cpu_on) {
		fprintf(stderr,
			"fr_sim: %s needs a CPU model (the ranks' own clocks)\n",
			stagger_ns > 0 ? "--stagger-us" : "--lead-us");
		sim_close(&s);
		rc = 2; /* a usage error */
		goto out;
	}
	sim_net_describe(&p, topo, sizeof(topo));
	printf("# fr_sim: %d ranks, %d per node; %s of %g Gbit/s links, %g us (+%g per hop); shm %g Gbit/s, %g us; %u bytes of overhead per write\n",
	       p.nranks, p.ranks_per_node, topo, p.link_gbps,
	       p.link_lat_ns / 1e3, p.hop_lat_ns / 1e3, p.shm_gbps,
	       p.shm_lat_ns / 1e3, p.overhead_bytes);
	if (s.cpu_on) {
		printf("# CPU: reduce %g GB/s; send %g us + %g GB/s, receive %g us + %g GB/s; wake-up %g us after %g idle\n",
		       cpu.reduce_GBps, cpu.send_ns / 1e3, cpu.send_GBps,
		       cpu.recv_ns / 1e3, cpu.recv_GBps, cpu.wake_ns / 1e3,
		       cpu.spin_ns / 1e3);
		if (cpu.cores)
			printf("# cores: %d, shared by %s\n", cpu.cores,
			       cpu.cores_job ? "all the job's ranks"
					     : "each node's ranks");
		if (cpu.cores && cpu.spin_holds)
			printf("# a spinner holds its core through its spin\n");
		if (cpu.dl_ns > 0)
			printf("# delay line: %g us of a core per write into a node\n",
			       cpu.dl_ns / 1e3);
		if (cpu.dl_GBps > 0)
			printf("# delay line: %g GB/s of a core's work\n",
			       cpu.dl_GBps);
		if (cpu.dl_busy_ns > 0)
			printf("# delay line: %g us a write that finds it busy\n",
			       cpu.dl_busy_ns / 1e3);
	} else {
		printf("# CPU: free (no CPU model)\n");
	}
	if (calls > 1)
		snprintf(
			how, sizeof(how),
			"%d calls back to back after a warm-up, per call the slowest rank, the median",
			calls);
	if (stagger_ns > 0 || lead_ns > 0 || barrier) {
		char late[96] = "";

		if (stagger_ns > 0)
			snprintf(late, sizeof(late),
				 ", rank r starting r x %g us late",
				 stagger_ns / 1e3);
		if (lead_ns > 0)
			snprintf(late + strlen(late),
				 sizeof(late) - strlen(late),
				 ", rank 0 starting %g us ahead",
				 lead_ns / 1e3);
		snprintf(
			how, sizeof(how),
			"%d calls %s after a warm-up%s%s, per call the slowest rank, the median",
			calls,
			!barrier ? "back to back"
			: stagger_ns > 0 || lead_ns > 0
				? "each after a barrier"
				: "each but the first after a barrier",
			stagger_ns > 0 || lead_ns > 0 ? " and 3 more" : "",
			late);
	}

	printf("# %s; time: simulated, %s; busbw = bytes / time x %s%s\n",
	       fr_coll_name(coll), how,
	       coll == FR_COLL_ALLREDUCE ? "2(n-1)/n" : "(n-1)/n",
	       sizes_only ? "; sizes only: no data, results not checked" : "");
	printf("%12s  %-17s %12s %11s %11s %10s %8s\n", "bytes", "algo",
	       "time_us", "algbw_GB/s", "busbw_GB/s", "events", "real_s");
	for (int si = 0; si < nsizes && !rc; si++) {
		size_t bytes = sizes[si], count = bytes / sizeof(float);
		/* reduce-scatter, all-gather: a block each of the n */
		size_t blk = coll == FR_COLL_ALLREDUCE
				     ? count
				     : count / (size_t)p.nranks;
		size_t moved =
			(coll == FR_COLL_ALLREDUCE ? count
						   : blk * (size_t)p.nranks) *
			sizeof(float);
		double bus = coll == FR_COLL_ALLREDUCE ? 2.0 : 1.0;

		for (int a = 0; a < nalgo && !rc; a++) {
			uint64_t ns = 0, ev0, dl0;
			double t0 = (double)pc_now_ns(), real, sec;
			char msg[200], label[40];

			for (int r = 0; r < p.nranks; r++)
				fr_algo_force(s.comms[r], ids[a]);
			for (int it = 0; it < 2 && !rc; it++) {
				if (!sizes_only)
					fill(&s, bufs, count);
				ev0 = s.events;
				dl0 = s.dl_work;
				/* the timed calls: the ranks launched
				 * apart, through 3 untimed calls */
				s.stagger_ns = it ? (uint64_t)stagger_ns : 0;
				s.lead_ns = it ? (uint64_t)lead_ns : 0;
				s.untimed =
					it && (stagger_ns > 0 || lead_ns > 0)
						? 3
						: 0;
				s.barrier = it && barrier;
				/* the warm-up one call, the timed ones
				 * back to back, each from fresh data */
				rc = sim_collective_calls(
					&s, coll, bufs, blk, FR_F32, FR_SUM,
					it ? calls : 1,
					sizes_only ? NULL : refill, &count,
					&ns);
				if (rc) {
					fprintf(stderr,
						"fr_sim: %zu bytes, %s: %s: %s\n",
						bytes, names[a], fr_errname(rc),
						s.err);
				} else if (!sizes_only &&
					   check(&s, coll, bufs, blk, msg,
						 sizeof(msg))) {
					fprintf(stderr,
						"fr_sim: %zu bytes, %s: wrong result: %s\n",
						bytes, names[a], msg);
					rc = FR_EPROTO;
				}
			}
			if (rc)
				break;
			real = ((double)pc_now_ns() - t0) / 1e9;
			sec = (double)ns / 1e9;
			/* what ran: a forced algorithm that cannot run
			 * here gives way to another, and auto names its
			 * choice */
			snprintf(label, sizeof(label), "%s%s",
				 ids[a] ? "" : "auto:",
				 fr_algo_name(fr_comm_last_algo(s.comms[0])));
			printf("%12zu  %-17s %12.2f %11.3f %11.3f %10llu %8.2f\n",
			       moved, label, (double)ns / 1e3,
			       sec > 0 ? (double)moved / sec / 1e9 : 0.0,
			       sec > 0 ? (double)moved / sec / 1e9 * bus *
						 (p.nranks - 1) / p.nranks
				       : 0.0,
			       (unsigned long long)(s.events - ev0), real);
			/* (validate_netns.sh compares it with the lines'
			 * CPU time measured) */
			if (s.dl_free)
				printf("# %zu bytes, %s: the delay lines' work %.1f us a call\n",
				       moved, label,
				       (double)(s.dl_work - dl0) /
					       (calls + s.untimed) / 1e3);
			fflush(stdout);
		}
	}
	sim_close(&s);
out:
	if (shared)
		munmap(shared, maxb < 4096 ? 4096 : maxb);
	else
		for (int r = 0; r < p.nranks; r++)
			free(bufs[r]); /* calloc'd: NULL where none was made */
	free(bufs);
	free(sizes);
	return rc == 2 ? 2 : rc ? 1 : 0;
bad:
	free(sizes);
	fprintf(stderr, "fr_sim: bad value \"%s\"\n", optarg);
	usage(stderr);
	return 2;
}
