/* SPDX-License-Identifier: MIT */
/*
 * fr_tune - measure the cost model's parameters on a real job and write the
 * tune file that communicators read through FR_TUNE_FILE.
 *
 * Run it like any job (frrun, mpirun, srun; every rank runs it):
 *   frrun -n 8 fr_tune -o fastreduce.tune
 * It measures, on the communicator's own transport:
 *   gamma per dtype  the local reduction kernels, 256 KiB in cache (ns/B);
 *   alpha            recursive doubling on 8 bytes: T / its step count;
 *   beta             the ring on a large vector, minus its alpha and gamma
 *                    terms, per byte on the wire;
 *   copy             Rabenseifner on a medium vector, minus everything the
 *                    model already explains, per byte through a mailbox;
 *   step_ramp        Rabenseifner on the ring's large vector, minus what
 *                    the model gives it with no ramp, per byte of its
 *                    wire time (select.c, "a step's fresh stream");
 *   line             on one node over a transport with lines, the
 *                    one-shot over lines on 8 bytes, minus its copies
 *                    and fold (select.c, "lines");
 *   grid_beta        with a grid of nodes (FR_TOPO), each dimension's
 *                    uplink: every rank exchanging a large vector with
 *                    its partner a step along it (time_grid);
 *   local_alpha,     on two nodes or more of two ranks or more each, the
 *   local_beta       node's own steps: alpha and beta again, measured
 *                    inside every node at once (time_node);
 * then checks the model: for a range of sizes it runs every All-Reduce
 * algorithm, prints measured against predicted times and whether the
 * automatic choice picked the fastest.  Every time is the slowest rank's
 * median, so all ranks agree on every number; rank 0 writes the file.
 *
 * It links the library's internals (like fr_reduce_perf) to force an
 * algorithm per call and to time the kernels directly.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algo/algo.h"
#include "fastreduce.h"
#include "internal.h"
#include "perf_common.h"
#include "perf_kernel.h"
#include "reduce.h"

struct tool {
	fr_comm_t *comm;
	int rank, n, iters;
	float *buf;
	size_t maxbytes;
};

/* The model check times the one-shot up to this size (above it, p - 1
 * whole vectors a rank through the mailboxes only lose, and slowly). */
#define ONESHOT_CHECK_MAX (64u << 10)

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* The slowest rank's value (all ranks agree on it). */
static double agree_max(struct tool *t, double v)
{
	if (fr_allreduce(t->comm, FR_IN_PLACE, &v, 1, FR_F64, FR_MAX)) {
		fprintf(stderr, "fr_tune: rank %d: %s\n", t->rank,
			fr_comm_last_error(t->comm));
		exit(1);
	}
	return v;
}

/* Median time (us) of an All-Reduce of bytes with algorithm algo on comm
 * (t's or a sub-communicator of it), the slowest rank's of t's. */
static double time_allreduce_on(struct tool *t, fr_comm_t *comm, int algo,
				size_t bytes)
{
	int iters = bytes >= (4u << 20) ? (t->iters / 8 > 3 ? t->iters / 8 : 3)
		    : bytes >= (256u << 10)
			    ? (t->iters / 2 > 5 ? t->iters / 2 : 5)
			    : t->iters;
	double *v = malloc(sizeof(double) * (size_t)iters), med;
	int saved;

	if (!v)
		exit(1);
	saved = fr_algo_force(comm, algo);
	for (int i = -2; i < iters; i++) {
		uint64_t t0 = pc_now_ns();
		int rc = fr_allreduce(comm, FR_IN_PLACE, t->buf, bytes / 4,
				      FR_F32, FR_SUM);

		if (rc) {
			fprintf(stderr, "fr_tune: rank %d: %s\n", t->rank,
				fr_comm_last_error(comm));
			exit(1);
		}
		if (i >= 0)
			v[i] = (double)(pc_now_ns() - t0) / 1e3;
	}
	fr_algo_force(comm, saved);
	qsort(v, (size_t)iters, sizeof(double), cmp_double);
	med = v[iters / 2];
	free(v);
	return agree_max(t, med);
}

static double time_allreduce(struct tool *t, int algo, size_t bytes)
{
	return time_allreduce_on(t, t->comm, algo, bytes);
}

/*
 * On a grid (FR_TOPO) whose racks - the groups of its first dimension's
 * nodes - hold two nodes or more and are more than one, alpha, beta, copy
 * and msg are measured inside each rack at once, on a sub-communicator:
 * the model's beta is the nodes' own links, the racks' uplinks are
 * grid_beta_ns (time_grid), and a ring over the whole job would measure
 * the uplink as beta.  NULL where that does not apply.
 */
static fr_comm_t *rack_comm(struct tool *t, int *nodes)
{
	const struct fr_topo *tp = &t->comm->topo;
	fr_comm_t *rc = NULL;

	/* (nlevels: the grid holds the nodes, grid[0] of them a rack) */
	if (!tp->nlevels || tp->grid[0] < 2 || tp->nnodes / tp->grid[0] < 2)
		return NULL;
	if (fr_comm_split(t->comm, tp->node_of[t->rank] / tp->grid[0], t->rank,
			  &rc)) {
		fprintf(stderr, "fr_tune: rank %d: %s\n", t->rank,
			fr_comm_last_error(t->comm));
		exit(1);
	}
	*nodes = tp->grid[0];
	return rc;
}

/* ns per byte of one input of the sum kernel, in cache, the slowest
 * rank's. */
static double time_kernel(struct tool *t, fr_dtype_t dt)
{
	double ns = pc_kernel_ns(dt);

	if (ns < 0)
		exit(1);
	return agree_max(t, ns);
}

/*
 * The grid's uplinks (FR_TOPO, topo.h): for each dimension d >= 1 of two
 * or more, every rank sends bytes to its partner one step along d (the rank
 * with its local index on the node whose d-th coordinate is one more, mod
 * grid[d]) and receives as much from the one a step back, all ranks at
 * once.  Every byte then leaves its group of dimension d - the g = grid[0]
 * x ... x grid[d-1] nodes whose coordinates from d on are alike - through
 * the uplink they share, g k bytes for one rank's (k ranks a node), so
 *   grid_beta_ns[d] = T / (g k bytes)
 * with T the slowest rank's median.  Where the uplink does not limit the
 * exchange, T is the nodes' own links' time and this a bound from above
 * on the uplink's cost, below which the model's floor on it (select.c)
 * does not bind.  Returns the number of dimensions measured (0: no grid
 * holds the nodes, or the layout is not regular).
 */
static int time_grid(struct tool *t, const void *sbuf, size_t bytes,
		     double *beta_ns)
{
	const struct fr_topo *tp = &t->comm->topo;
	int k = tp->nlocal, measured = 0;
	int iters = t->iters / 8 > 3 ? t->iters / 8 : 3;
	void *rbuf;

	if (!tp->nlevels) /* no grid holds the nodes alike */
		return 0;
	rbuf = malloc(bytes);
	if (!rbuf) {
		fprintf(stderr, "fr_tune: rank %d: out of memory\n", t->rank);
		exit(1);
	}
	iters = iters > 64 ? 64 : iters;
	/* dimension d's partners are on its level (fr_topo_levels: the
	 * dimensions of size 2 or more in turn, each a ring in the order of
	 * d's coordinate); level 0 of dimension 0 is the nodes' own links */
	for (int d = 0, l = 0, w = 1; d < tp->ngrid; w *= tp->grid[d++]) {
		int n = tp->grid[d], x, to, from;
		double v[64], med;

		if (n < 2)
			continue;
		x = tp->level_index[l];
		to = tp->level[l][(x + 1) % n];
		from = tp->level[l][(x + n - 1) % n];
		l++;
		if (d == 0)
			continue;
		for (int i = -1; i < iters; i++) {
			fr_request_t *rq[2] = {NULL, NULL};
			uint64_t t0;
			int rc;

			if (fr_barrier(t->comm))
				goto fail;
			t0 = pc_now_ns();
			rc = fr_irecv(t->comm, rbuf, bytes, FR_U8, from, 7,
				      &rq[0]);
			if (!rc)
				rc = fr_isend(t->comm, sbuf, bytes, FR_U8, to,
					      7, &rq[1]);
			if (rc) /* not waiting for what may never come */
				goto fail;
			for (int q = 0; q < 2; q++)
				if (rq[q]) {
					int wrc = fr_wait(&rq[q]);

					rc = rc ? rc : wrc;
				}
			if (rc)
				goto fail;
			if (i >= 0)
				v[i] = (double)(pc_now_ns() - t0) / 1e3;
		}
		qsort(v, (size_t)iters, sizeof(double), cmp_double);
		med = agree_max(t, v[iters / 2]);
		beta_ns[d] = med * 1e3 / ((double)w * k * (double)bytes);
		if (t->rank == 0)
			printf("# grid dimension %d: %d groups of %d node(s), %d rank(s) each: %zu bytes a rank across in %.1f us, the uplink %.4f ns/B\n",
			       d, tp->nnodes / w, w, k, bytes, med, beta_ns[d]);
		measured++;
	}
	free(rbuf);
	return measured;
fail:
	fprintf(stderr, "fr_tune: rank %d: %s\n", t->rank,
		fr_comm_last_error(t->comm));
	exit(1);
}

static int lg(int n)
{
	int l = 0;

	while ((2 << l) <= n)
		l++;
	return l;
}

/*
 * The node's own steps (select.c, "the node's own steps"): where the job
 * has two nodes or more, each of the same k >= 2 ranks, the ranks of each
 * node form a sub-communicator (over what they share: shared memory under
 * the auto transport) and measure, every node at once as the collectives
 * run them, what alpha and beta are measured from on the whole job:
 *   local_alpha_us = T(rd, 8 B) / (lg k + 2 f)
 *   local_beta_ns  = (T(ring, N) - (2 (k-1) + 1) local_alpha
 *                     - (k-1)/k N gamma) / (2 (k-1)/k N)
 * Returns 0, measuring nothing, where that does not apply (every rank
 * decides alike: the layout is the job's).
 */
static int time_node(struct tool *t, double g32, size_t big, double *la,
		     double *lb)
{
	const struct fr_topo *tp = &t->comm->topo;
	int k = tp->nlocal, L = lg(tp->nlocal), f;
	fr_comm_t *nc = NULL;
	double T, a, b;

	if (tp->nnodes < 2 || !tp->nodes_regular || k < 2)
		return 0;
	if (fr_comm_split(t->comm, tp->node_of[t->rank], t->rank, &nc)) {
		fprintf(stderr, "fr_tune: rank %d: %s\n", t->rank,
			fr_comm_last_error(t->comm));
		exit(1);
	}
	f = (1 << L) != k;
	T = time_allreduce_on(t, nc, FR_ALGO_RD, 8);
	a = T / (L + 2 * f);
	T = time_allreduce_on(t, nc, FR_ALGO_RING, big);
	b = (T - (2 * (k - 1) + 1) * a -
	     (double)(k - 1) / k * (double)big * g32) /
	    (2.0 * (k - 1) / k * (double)big);
	*la = a;
	*lb = fmax(b, 1e-5) * 1e3;
	if (t->rank == 0)
		printf("# the node's own steps: %d nodes of %d ranks, inside each over %s: %.3f us a step, %.4f ns/B\n",
		       tp->nnodes, k, fr_comm_transport(nc), *la, *lb);
	fr_comm_destroy(nc);
	return 1;
}

/*
 * The tune file's lines, to stdout (rank 0 shows what it measured) and to
 * the file fo unless NULL.
 */
static void write_tune(FILE *o, const struct tool *t, const struct fr_tune *tn,
		       int rack_nodes, const char *when)
{
	const char *tp = fr_comm_transport(t->comm);

	fprintf(o, "# fastreduce tune file (fr_tune(1)), %s\n", when);
	fprintf(o,
		"# %d ranks over %s; read it with FR_TUNE_FILE=<this file>\n",
		t->n, tp);
	if (rack_nodes)
		fprintf(o,
			"# alpha, beta, copy, msg: inside the racks of %d nodes, all at once (FR_TOPO)\n",
			rack_nodes);
	fprintf(o, "%s.alpha_us = %.3f\n", tp, tn->alpha_us);
	fprintf(o, "%s.beta_ns = %.4f\n", tp, tn->beta_ns);
	fprintf(o, "%s.copy_ns = %.4f\n", tp, tn->copy_ns);
	fprintf(o, "%s.msg_us = %.3f\n", tp, tn->msg_us);
	fprintf(o, "%s.step_ramp = %.4f\n", tp, tn->step_ramp);
	fprintf(o, "%s.line_us = %.3f\n", tp, tn->line_us);
	for (int d = 0; d < FR_DTYPE_COUNT; d++)
		fprintf(o, "gamma_ns.%s = %.4f\n", fr_dtype_name((fr_dtype_t)d),
			tn->gamma_ns[d]);
	/* measured on FR_TOPO's grid (time_grid), the others kept from
	 * FR_TUNE_FILE, so that a new file does not lose the racks' rates */
	for (int d = 1; d < FR_TOPO_MAX_DIMS; d++)
		if (tn->grid_beta_ns[d] > 0)
			fprintf(o, "%s.grid_beta_ns.%d = %.4f\n", tp, d,
				tn->grid_beta_ns[d]);
	/* measured inside the nodes (time_node), or kept from FR_TUNE_FILE */
	if (tn->local_alpha_us > 0)
		fprintf(o, "%s.local_alpha_us = %.3f\n", tp,
			tn->local_alpha_us);
	if (tn->local_beta_ns > 0)
		fprintf(o, "%s.local_beta_ns = %.4f\n", tp, tn->local_beta_ns);
}

/* fo's end: 0, or 1 with a message where its writing failed */
static int close_tune(FILE *fo, const char *out)
{
	if (fo && (ferror(fo) | fclose(fo))) {
		fprintf(stderr, "fr_tune: writing %s failed\n", out);
		return 1;
	}
	return 0;
}

static void usage(void)
{
	fprintf(stdout,
		"usage: fr_tune [-o FILE] [-n ITERS] [-e MAXBYTES] [-q]\n"
		"  -o FILE     write the tune file (rank 0), default: stdout only\n"
		"  -n ITERS    timed iterations per point (default 50)\n"
		"  -e BYTES    largest size of the model check (default 16M)\n"
		"  -q          skip the model check\n");
}

int main(int argc, char **argv)
{
	struct tool t = {.iters = 50, .maxbytes = 16u << 20};
	const char *out = NULL;
	bool check = true;
	struct fr_tune tn, kept;
	bool local;
	FILE *fo = NULL;
	int opt, L, pof2, f, rc, rack_nodes = 0;
	fr_comm_t *rack, *mc;
	double a, b, c, g32, T, p;
	size_t big, mid;
	char when[64];
	time_t now = time(NULL);

	while ((opt = getopt(argc, argv, "o:n:e:qh")) != -1) {
		long v;

		switch (opt) {
		case 'o':
			out = optarg;
			break;
		case 'n':
			if (pc_parse_long(optarg, 3, 100000, &v))
				goto bad;
			t.iters = (int)v;
			break;
		case 'e':
			if (pc_parse_size(optarg, &t.maxbytes) ||
			    t.maxbytes < 4096 || t.maxbytes > (1u << 30))
				goto bad;
			break;
		case 'q':
			check = false;
			break;
		case 'h':
			usage();
			return 0;
		default:
			goto bad;
		}
	}
	if (optind != argc)
		goto bad;
	rc = fr_comm_create_from_env(NULL, &t.comm);
	if (rc) {
		fprintf(stderr, "fr_tune: %s: %s\n", fr_strerror(rc),
			fr_comm_last_error(NULL));
		return 1;
	}
	rc = 0;
	t.rank = fr_comm_rank(t.comm);
	t.n = fr_comm_size(t.comm);
	if (t.n < 2) {
		fprintf(stderr,
			"fr_tune: needs at least 2 ranks to measure a network\n");
		fr_comm_destroy(t.comm);
		return 1;
	}
	/* Rank 0 opens the file before measuring; all ranks learn whether it
	 * could, so that none measures for nothing. */
	{
		int32_t ok = 1;

		if (t.rank == 0 && out && !(fo = fopen(out, "w"))) {
			perror(out);
			ok = 0;
		}
		if (fr_broadcast(t.comm, &ok, 1, FR_I32, 0) || !ok) {
			fr_comm_destroy(t.comm);
			return 1;
		}
	}
	big = t.maxbytes > (8u << 20) ? t.maxbytes : (8u << 20);
	t.buf = calloc(1, big);
	if (!t.buf)
		return 1;
	fr_tune_get(t.comm, &tn);
	rack = rack_comm(&t, &rack_nodes);
	mc = rack ? rack : t.comm;
	L = lg(fr_comm_size(mc));
	pof2 = 1 << L;
	f = pof2 != fr_comm_size(mc);
	p = fr_comm_size(mc);

	for (int d = 0; d < FR_DTYPE_COUNT; d++)
		tn.gamma_ns[d] = time_kernel(&t, (fr_dtype_t)d);
	g32 = tn.gamma_ns[FR_F32] * 1e-3;
	T = time_allreduce_on(&t, mc, FR_ALGO_RD, 8);
	a = T / (L + 2 * f);
	T = time_allreduce_on(&t, mc, FR_ALGO_RING, 8u << 20);
	b = (T - (2 * (p - 1) + 1) * a - (p - 1) / p * (8 << 20) * g32) /
	    (2 * (p - 1) / p * (8 << 20));
	b = fmax(b, 1e-5);
	mid = 1u << 20;
	T = time_allreduce_on(&t, mc, FR_ALGO_RABENSEIFNER, mid);
	c = (T - (2 * L + 2 * f) * a -
	     ((double)(pof2 - 1) / pof2 + f) * (double)mid * g32) /
		    ((2.0 * (pof2 - 1) / pof2 + 2 * f) * (double)mid) -
	    b;
	c = fmax(c, 0);
	tn.alpha_us = a;
	tn.beta_ns = b * 1e3;
	tn.copy_ns = c * 1e3;
	/* each extra message of the one-shot All-Reduce through the
	 * mailboxes: from its 8-byte time, what the model gives it with none
	 * (one latency), over p - 2 of them (2 ranks: none to see).  Where
	 * lines would carry 8 bytes (one node: ll.c, which this parameter
	 * does not price), at twice a line instead, past what a line
	 * carries. */
	tn.msg_us = FR_MSG_PER_ALPHA * a; /* as built in */
	if (p > 2) {
		size_t n1 = fr_ll_fits(mc, FR_COLL_ALLREDUCE, 8)
				    ? 2 * FR_TP_LINE_MAX
				    : 8;
		struct fr_tune t0 = tn;

		t0.msg_us = 0;
		tn.msg_us =
			fmax((time_allreduce_on(&t, mc, FR_ALGO_ONESHOT, n1) -
			      fr_model_predict_us(
				      &t0, (int)p, fr_msg_payload_max(mc),
				      FR_ALGO_ONESHOT, FR_COLL_ALLREDUCE, n1,
				      FR_F32)) /
				     (p - 2),
			     0);
	}
	/* a line's trip (select.c, "lines"): the one-shot over lines on
	 * 8 bytes, less its copies and fold, where the job's communicator
	 * has lines (one node: no racks); elsewhere the file keeps the
	 * built-in value, which nothing there prices */
	if (fr_ll_fits(t.comm, FR_COLL_ALLREDUCE, 8)) {
		struct fr_tune t0 = tn;
		double rd8;

		t0.line_us = 0;
		T = time_allreduce_on(&t, t.comm, FR_ALGO_ONESHOT, 8);
		rd8 = time_allreduce_on(&t, t.comm, FR_ALGO_RD, 8);
		tn.line_us =
			fmax(T - fr_model_ll_us(&t0, t.n, FR_COLL_ALLREDUCE, 8,
						FR_F32),
			     0);
		if (t.rank == 0)
			printf("# lines: 8 bytes in %.3f us, recursive doubling through the mailboxes %.3f\n",
			       T, rd8);
	} else if (!strncmp(tn.source, "built-in", 8)) {
		/* not what more ranks than CPUs made of it (select.c) */
		tn.line_us = FR_LINE_US;
	}
	/* a step's fresh stream: Rabenseifner on the ring's 8 MiB, beyond
	 * what the model gives it with none, per byte of its wire time (the
	 * ring fixed beta there, so this is how much Rabenseifner loses to
	 * it that the latencies do not explain) */
	{
		struct fr_tune t0 = tn;
		double n8 = 8u << 20, wire, pred;

		t0.step_ramp = 0;
		pred = fr_model_predict_us(&t0, (int)p, fr_msg_payload_max(mc),
					   FR_ALGO_RABENSEIFNER,
					   FR_COLL_ALLREDUCE, 8u << 20, FR_F32);
		wire = (2.0 * (pof2 - 1) / pof2 + 2 * f) * n8 * b;
		T = time_allreduce_on(&t, mc, FR_ALGO_RABENSEIFNER, 8u << 20);
		tn.step_ramp = fmax(T - pred, 0) / wire;
	}
	if (rack)
		fr_comm_destroy(rack);
	{
		double gb[FR_TOPO_MAX_DIMS] = {0};

		/* the dimensions measured replace the file's; the others
		 * (of size 1: no uplink) keep what it gave */
		time_grid(&t, t.buf, 8u << 20, gb);
		for (int d = 1; d < FR_TOPO_MAX_DIMS; d++)
			if (gb[d] > 0)
				tn.grid_beta_ns[d] = gb[d];
	}
	/* measured where the job has nodes of several ranks, else kept from
	 * FR_TUNE_FILE (as the grid's); the check below may put back what
	 * the file gave */
	kept = tn;
	local = time_node(&t, g32, 8u << 20, &tn.local_alpha_us,
			  &tn.local_beta_ns);
	fr_tune_set(t.comm, &tn);

	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&now));
	if (t.rank == 0) {
		write_tune(stdout, &t, &tn, rack_nodes, when);
		if (fo)
			write_tune(fo, &t, &tn, rack_nodes, when);
		rc = close_tune(fo, out);
		fo = NULL;
	}
	if (check) {
		/* and hier where it runs: several nodes, alike; the one-shot
		 * (over lines where they carry the call) up to
		 * ONESHOT_CHECK_MAX: past that it only loses, slowly */
		static const int algos[] = {FR_ALGO_RD, FR_ALGO_RABENSEIFNER,
					    FR_ALGO_RING, FR_ALGO_ONESHOT,
					    FR_ALGO_HIER};
		int na = fr_algo_predict_us(t.comm, FR_ALGO_HIER,
					    FR_COLL_ALLREDUCE, 8, FR_F32) >= 0
				 ? 5
				 : 4;
		/* with the node's own steps measured, also what the model
		 * picks without them (the file's): the better keeps */
		int right = 0, points = 0, right_kept = 0;

		if (t.rank == 0) {
			printf("#\n# model check, f32 sum: measured / predicted us\n"
			       "# %10s %21s %21s %21s %21s",
			       "bytes", "rd", "rabenseifner", "ring",
			       "oneshot");
			if (na == 5)
				printf(" %21s", "hier");
			printf(" %14s\n", "auto picks");
		}
		for (size_t bytes = 8; bytes <= t.maxbytes; bytes *= 8) {
			double meas[5], pred[5], pk[5];
			int fastest = 0, pick = 0, pick_kept = 0;

			for (int i = 0; i < na; i++) {
				if (algos[i] == FR_ALGO_ONESHOT &&
				    bytes > ONESHOT_CHECK_MAX) {
					meas[i] = pred[i] = -1;
					continue;
				}
				meas[i] = time_allreduce(&t, algos[i], bytes);
				pred[i] = fr_algo_predict_us(t.comm, algos[i],
							     FR_COLL_ALLREDUCE,
							     bytes, FR_F32);
				if (meas[i] < meas[fastest])
					fastest = i;
				if (pred[i] < pred[pick])
					pick = i;
			}
			if (local) {
				fr_tune_set(t.comm, &kept);
				for (int i = 0; i < na; i++) {
					pk[i] = pred[i] < 0
							? -1
							: fr_algo_predict_us(
								  t.comm,
								  algos[i],
								  FR_COLL_ALLREDUCE,
								  bytes,
								  FR_F32);
					if (pk[i] >= 0 && pk[i] < pk[pick_kept])
						pick_kept = i;
				}
				fr_tune_set(t.comm, &tn);
				right_kept +=
					meas[pick_kept] <= 1.1 * meas[fastest];
			}
			points++;
			/* within 10 % of the fastest counts as a right pick */
			right += meas[pick] <= 1.1 * meas[fastest];
			if (t.rank != 0)
				continue;
			printf("  %10zu", bytes);
			for (int i = 0; i < na; i++)
				if (meas[i] < 0)
					printf(" %21s", "-");
				else
					printf(" %10.1f/%10.1f", meas[i],
					       pred[i]);
			printf(" %14s%s\n", fr_algo_name(algos[pick]),
			       meas[pick] <= 1.1 * meas[fastest] ? ""
								 : " (slower)");
		}
		if (t.rank == 0)
			printf("# auto picked the fastest (within 10%%) at %d of %d sizes\n",
			       right, points);
		/* the node's own steps measured, but the model chose better
		 * without them: a job whose nodes' ranks share few cores
		 * with the network's own work (emulated nodes on one host)
		 * gains nothing by them */
		if (local && right_kept > right) {
			tn.local_alpha_us = kept.local_alpha_us;
			tn.local_beta_ns = kept.local_beta_ns;
			fr_tune_set(t.comm, &tn);
			if (t.rank == 0) {
				printf("# without the node's own steps measured it picked the fastest at %d of %d: the file keeps %s\n",
				       right_kept, points,
				       kept.local_alpha_us > 0 ||
						       kept.local_beta_ns > 0
					       ? "FR_TUNE_FILE's"
					       : "none");
				/* the file again, with them */
				if (out && !rc) {
					fo = fopen(out, "w");
					if (!fo) {
						perror(out);
						rc = 1;
					} else {
						write_tune(fo, &t, &tn,
							   rack_nodes, when);
						rc = close_tune(fo, out);
					}
				}
			}
		}
	}
	free(t.buf);
	fr_comm_destroy(t.comm);
	return rc;
bad:
	usage();
	return 2;
}
