/* SPDX-License-Identifier: MIT */
/*
 * mp_allreduce.c - multi-process All-Reduce checks, one process per rank,
 * launched by frrun (or any launcher fr_comm_create_from_env knows).
 *
 *   mp_allreduce matrix [--counts a,b,..] [--dtypes all|f32,..] [--ops ..]
 *       every dtype x op x count x {out of place, in place}: the result must
 *       equal, bit for bit, a scalar reference that accumulates each chunk
 *       in the ring's order (tests/reference.h), must be bit-identical on
 *       all ranks, and must come out the same when run again (counts of
 *       64 Ki elements or more: sum and avg only, unless --ops names the
 *       ops or FR_TEST_FULL=1; see op_at_count());
 *   mp_allreduce colls [--counts a,b,..]
 *       reduce-scatter, all-gather, broadcast (every root) and barrier,
 *       checked against the reference (reduce-scatter bit for bit in the
 *       order of the ring or of the hierarchical one, whichever ran; its
 *       ops at large counts as for matrix);
 *   mp_allreduce bigexit [--count C]
 *       one large All-Reduce, then destroy at once: no rank may fail;
 *   mp_allreduce regonce [--iters N] [--count C]
 *       N iterations on buffers registered once: registrations and remote
 *       keys exchanged must not grow after the first iteration;
 *   mp_allreduce die --victim R --at I [--how kill|exit|stall|freeze]
 *       rank R dies (or stalls: stays alive but silent) at iteration I;
 *       every other rank must get an error (not a hang) within
 *       FR_TIMEOUT_MS plus a margin.  freeze: rank R stops (SIGSTOP) in
 *       the middle of a collective, with our keys in hand, and resumes
 *       after the others have failed and unmapped their buffers; its late
 *       writes must not land in them (no crash in the survivors);
 *   mp_allreduce late|toolate --victim R --at I [--late-ms T]
 *       rank R enters collective I T ms late (alive, progress thread on):
 *       late: within FR_SLOW_TIMEOUT_MS every collective must succeed;
 *       toolate: beyond it every other rank must fail, saying so;
 *   mp_allreduce faults [--iters N] [--jitter-us U]
 *       a seeded sequence of N collectives of every kind on exact inputs;
 *       prints the digest of all results (the fault matrix compares it);
 *       with U, each rank first sleeps a seeded 0..U-1 us before each
 *       collective, so ranks alternate between polling and sleeping
 *       (verbs' polled lines: their sleep and wake-up protocol);
 *   mp_allreduce fdhog --victim R [--what fds|mem]
 *       rank R runs out of file descriptors before an All-Reduce that needs
 *       new connections (run it with FR_ALGO=rd), or (mem: run R under a
 *       small ulimit -v with a large FR_SEGMENT_BYTES) cannot allocate its
 *       staging: every rank fails within seconds and R's message says how
 *       to raise the limit;
 *   mp_allreduce mismatch --victim R [--what count|dtype|op|skip|refuse-*]
 *       [--counts C]
 *       rank R calls with a different argument; every rank must get
 *       FR_EMISMATCH (skip: rank R skips a collective; every rank must fail;
 *       refuse-null, refuse-dtype, refuse-first: rank R passes an argument
 *       the library refuses, NULL or an unknown dtype, after one good
 *       collective or as the very first; it gets FR_EINVAL, every other
 *       rank FR_EPEER naming it, within seconds, not at the timeout);
 *   mp_allreduce affinity [--expect LIST|main]
 *       with FR_PROGRESS=thread: there is one progress thread (named
 *       fr_progress) and it runs on LIST (/proc/self/task/TID/status,
 *       Cpus_allowed_list), or main: on the main thread's CPUs (it
 *       inherited them); the main thread's CPUs are those it had before
 *       fr_comm_create; prints "rank R: progress thread runs on CPUs X"
 *       for tests/mp_training.sh to compare with what FR_LOG=info says.
 *
 * Emulated nodes (FR_NODE, for any mode): --ranks-per-node K puts rank r on
 * node r / K; --round-robin-nodes M on node r % M (a launcher's round-robin
 * placement), where the ring runs node by node and the reference follows;
 * --node-map a,b,.. on node map[r], any placement (colls: the two-level
 * reduce-scatter's groups of equal local index then meet the nodes in
 * different orders).
 *
 * --scales (any mode): f32 sums and averages take inputs of exponents
 * from -15 to 12, so that their sums round and the order of the reduction
 * shows in the bits (the references' orders are then checked, not only
 * where the blocks went).
 *
 * Prints "N passed, N failed" and exits non-zero on any failure.
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <dirent.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fastreduce.h"
#include "reference.h"

static int rank, nranks;
static int passed, failed;

#define FR_MAXV(a, b) ((a) > (b) ? (a) : (b))

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (cond) {                                                    \
			passed++;                                              \
		} else {                                                       \
			failed++;                                              \
			fprintf(stderr, "FAIL rank %d: ", rank);               \
			fprintf(stderr, __VA_ARGS__);                          \
			fputc('\n', stderr);                                   \
		}                                                              \
	} while (0)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

/* binary16 bits of d, which must be exactly representable (our inputs). */
static uint16_t f16_exact(double d)
{
	uint16_t sign = signbit(d) ? 0x8000 : 0;
	int e;
	double m;

	if (isnan(d))
		return 0x7e00;
	if (isinf(d))
		return sign | 0x7c00;
	if (d == 0)
		return sign;
	m = frexp(fabs(d), &e); /* d = m * 2^e, m in [0.5, 1) */
	return sign | (uint16_t)((e - 1 + 15) << 10) |
	       (uint16_t)((m * 2 - 1) * 1024);
}

/*
 * Input element i of rank r, addressable so that every rank can compute
 * any rank's input without holding it: small multiples of 1/8 (sums of a
 * few are exact, products stay finite), and for float types the special
 * values -0, +-Inf and NaN at sparse positions.
 */
/* --scales: f32 sums of mixed exponents, whose bits show the order */
static bool mixed_scales;

static void input_elem(fr_dtype_t dt, fr_op_t op, int r, size_t i,
		       uint32_t seed, void *out)
{
	uint64_t h = mix(((uint64_t)seed << 40) ^ ((uint64_t)r << 32) ^ i);
	int v = (int)(h % 17) - 8; /* -8..8 */
	double d = v / 8.0;
	bool special = dt <= FR_BF16 && i % 211 == 17;

	if (op == FR_PROD)
		d = (h & 1 ? 1.0 : -1.0) * (h & 2 ? 2.0 : h & 4 ? 0.5 : 1.0);
	if (mixed_scales && dt == FR_F32 && (op == FR_SUM || op == FR_AVG))
		d = ldexp(d, (int)((h >> 24) % 28) - 12);
	if (special) {
		static const double sp[] = { -0.0, 1.0 / 0.0, -1.0 / 0.0, 0.0 };
		int k = (int)((h >> 8) % 5);

		d = k < 4 ? sp[k] : __builtin_nan("");
		/* only one rank contributes the special value */
		if ((int)(i % (size_t)nranks) != r)
			d = op == FR_PROD ? 1.0 : -0.0;
	}
	switch (dt) {
	case FR_F32: { float f = (float)d; memcpy(out, &f, 4); break; }
	case FR_F64: memcpy(out, &d, 8); break;
	case FR_F16: { uint16_t b = f16_exact(d); memcpy(out, &b, 2); break; }
	case FR_BF16: {
		/* every value used is exact in bf16: truncation is exact */
		float f = (float)d;
		uint32_t u;

		memcpy(&u, &f, 4);
		uint16_t b = (uint16_t)(u >> 16);

		memcpy(out, &b, 2);
		break;
	}
	case FR_I8: case FR_U8: { uint8_t x = (uint8_t)(h >> 16); if (op == FR_PROD) x = (uint8_t)(1 + (h >> 20) % 3); memcpy(out, &x, 1); break; }
	case FR_I32: case FR_U32: { uint32_t x = (uint32_t)(h >> 16); memcpy(out, &x, 4); break; }
	case FR_I64: case FR_U64: memcpy(out, &h, 8); break;
	default: break;
	}
}

static void fill(fr_dtype_t dt, fr_op_t op, void *buf, size_t count, int r,
		 uint32_t seed)
{
	size_t es = fr_dtype_size(dt);

	for (size_t i = 0; i < count; i++)
		input_elem(dt, op, r, i, seed, (char *)buf + i * es);
}

/* Emulated nodes dealt round robin (--round-robin-nodes M: rank r on node
 * r % M), 0: not.  The ring then runs node by node, each node's ranks in
 * rank order (written here independently of comm.c): position p holds
 * rank ring_at(p). */
static int rr_nodes;
/* --node-map a,b,..: rank r on node map[r], any placement (colls only) */
static int node_map[64], node_map_n;

static int ring_at(int p)
{
	int m = rr_nodes, q, rem, per;

	if (node_map_n) {
		/* nodes in order of their lowest rank, each node's ranks in
		 * rank order */
		for (int r = 0; r < nranks; r++) {
			bool first = true;

			for (int x = 0; x < r && first; x++)
				first = node_map[x] != node_map[r];
			for (int x = r; first && x < nranks; x++)
				if (node_map[x] == node_map[r] && p-- == 0)
					return x;
		}
		return -1;
	}
	if (m < 2 || m >= nranks)
		return p; /* one node, or one rank per node: rank order */
	/* node k holds ranks k, k + m, ...: nranks / m of them, one more for
	 * the first nranks % m nodes */
	per = nranks / m;
	rem = nranks % m;
	for (int k = 0; k < m; k++) {
		q = per + (k < rem);
		if (p < q)
			return k + p * m;
		p -= q;
	}
	return -1;
}

/* Expected element i: chunk c is accumulated in ring order c, c+1, ... (by
 * position in the ring) */
static void expect_elem(fr_dtype_t dt, fr_op_t op, size_t count, size_t i,
			uint32_t seed, void *out)
{
	size_t base = count / (size_t)nranks, rem = count % (size_t)nranks;
	size_t big = rem * (base + 1);
	int c = (int)(i < big ? i / (base + 1) : rem + (i - big) / (base ? base : 1));
	uint8_t acc[8], in[8];

	input_elem(dt, op, ring_at(c), i, seed, acc);
	for (int t = 1; t < nranks; t++) {
		input_elem(dt, op, ring_at((c + t) % nranks), i, seed, in);
		ref_combine(dt, op, acc, acc, in, 1);
	}
	if (op == FR_AVG)
		ref_scale_avg(dt, acc, 1, nranks);
	memcpy(out, acc, fr_dtype_size(dt));
}

/*
 * Expected element i for recursive doubling and Rabenseifner: pairs
 * (2v, 2v+1), v < rem, are folded first, then virtual ranks are combined
 * over the hypercube dimensions 0, 1, ... (written here independently of
 * the library's schedule code).
 */
static void expect_hcube(fr_dtype_t dt, fr_op_t op, size_t i, uint32_t seed,
			 void *out)
{
	int pof2 = 1, rem;
	uint8_t v[64][8], in[8];

	while (pof2 * 2 <= nranks)
		pof2 *= 2;
	rem = nranks - pof2;
	for (int vr = 0; vr < pof2; vr++) {
		if (vr < rem) {
			input_elem(dt, op, 2 * vr, i, seed, v[vr]);
			input_elem(dt, op, 2 * vr + 1, i, seed, in);
			ref_combine(dt, op, v[vr], v[vr], in, 1);
		} else {
			input_elem(dt, op, vr + rem, i, seed, v[vr]);
		}
	}
	for (int k = 1; k < pof2; k <<= 1)
		for (int vr = 0; vr < pof2; vr++)
			if (!(vr & k)) {
				ref_combine(dt, op, v[vr], v[vr], v[vr | k], 1);
				memcpy(v[vr | k], v[vr], 8);
			}
	if (op == FR_AVG)
		ref_scale_avg(dt, v[0], 1, nranks);
	memcpy(out, v[0], fr_dtype_size(dt));
}

/*
 * Expected element i for the one-shot All-Reduce: the left fold over ranks
 * 0, 1, ..., n-1.
 */
static void expect_linear(fr_dtype_t dt, fr_op_t op, size_t i, uint32_t seed,
			  void *out)
{
	uint8_t acc[8], in[8];

	input_elem(dt, op, 0, i, seed, acc);
	for (int r = 1; r < nranks; r++) {
		input_elem(dt, op, r, i, seed, in);
		ref_combine(dt, op, acc, acc, in, 1);
	}
	if (op == FR_AVG)
		ref_scale_avg(dt, acc, 1, nranks);
	memcpy(out, acc, fr_dtype_size(dt));
}

/*
 * The double binary tree (dbtree.c), written here from another description
 * than the library's: the node of an open interval (lo, hi) of labels is
 * the label in it with the most trailing zero bits; a node's children are
 * the nodes of the intervals left and right of it within its own, and
 * label 0 is the root, above the node of (0, n).  Tree 0 gives label r to
 * rank r, tree 1 to rank n - 1 - r (n even) or r + 1 mod n (n odd).  A
 * node's value is its input OP its left subtree's, then OP its right's.
 */
static int dbt_node(int lo, int hi)
{
	int best = -1, bz = -1;

	for (int r = lo + 1; r < hi; r++)
		if (__builtin_ctz((unsigned)r) > bz) {
			bz = __builtin_ctz((unsigned)r);
			best = r;
		}
	return best;
}

static void dbt_value(fr_dtype_t dt, fr_op_t op, int tree, int label, int lo,
		      int hi, size_t i, uint32_t seed, uint8_t *acc)
{
	int rk = tree == 0    ? label
		 : nranks % 2 ? (label + 1) % nranks
			      : nranks - 1 - label;
	uint8_t sub[8];
	int left, right;

	input_elem(dt, op, rk, i, seed, acc);
	if (label == 0) {
		left = dbt_node(0, nranks);
		if (left > 0) {
			dbt_value(dt, op, tree, left, 0, nranks, i, seed, sub);
			ref_combine(dt, op, acc, acc, sub, 1);
		}
		return;
	}
	left = dbt_node(lo, label);
	right = dbt_node(label, hi);
	if (left > 0) {
		dbt_value(dt, op, tree, left, lo, label, i, seed, sub);
		ref_combine(dt, op, acc, acc, sub, 1);
	}
	if (right > 0) {
		dbt_value(dt, op, tree, right, label, hi, i, seed, sub);
		ref_combine(dt, op, acc, acc, sub, 1);
	}
}

static void expect_dbtree(fr_dtype_t dt, fr_op_t op, size_t count, size_t i,
			  uint32_t seed, void *out)
{
	uint8_t acc[8];

	dbt_value(dt, op, i < (count + 1) / 2 ? 0 : 1, 0, 0, nranks, i, seed,
		  acc);
	if (op == FR_AVG)
		ref_scale_avg(dt, acc, 1, nranks);
	memcpy(out, acc, fr_dtype_size(dt));
}

/* Ranks per emulated node (--ranks-per-node), 0: not emulated. */
static int rpn;

/* Part c of n cut in parts as the ring cuts: the first n % parts get one
 * more. */
static void ref_cut(size_t n, int parts, int c, size_t *lo, size_t *len)
{
	size_t base = n / (size_t)parts, rem = n % (size_t)parts;

	*lo = (size_t)c * base + ((size_t)c < rem ? (size_t)c : rem);
	*len = base + ((size_t)c < rem);
}

/* FR_TOPO's sizes into d[] (8 at most), their product into *prod; how
 * many. */
static int topo_dims(int *d, long *prod)
{
	const char *e = getenv("FR_TOPO");
	int nd = 0;

	*prod = 1;
	if (e && *e) {
		char buf[64], *save = NULL;

		snprintf(buf, sizeof(buf), "%s", e);
		for (char *t = strtok_r(buf, "x", &save); t && nd < 8;
		     t = strtok_r(NULL, "x", &save))
			*prod *= d[nd++] = atoi(t);
	}
	return nd;
}

/*
 * The levels of the hierarchical All-Reduce with nodes of rpn ranks (rank
 * r on node r / rpn, local index r % rpn): the node's rpn ranks, then the
 * sizes of FR_TOPO's grid of nodes where it holds the nodes, else all the
 * nodes as one level; sizes of 1 make no level.  G[] gets the sizes, from
 * the node up, and the return is how many.
 */
static int hier_levels(int *G)
{
	int m = nranks / rpn, nl = 0, d[8];
	long prod;
	int nd = topo_dims(d, &prod);

	if (rpn > 1)
		G[nl++] = rpn;
	if (nd && prod == m) {
		for (int i = 0; i < nd; i++)
			if (d[i] > 1)
				G[nl++] = d[i];
	} else if (m > 1) {
		G[nl++] = m;
	}
	return nl;
}

/*
 * The partial sum of level l for element i at grid coordinates x[] (x[l]
 * free): the level's members x[l] = c[l], c[l]+1, ... (mod G[l]), each
 * with the partial of the level below, combined in that order; below
 * level 0, the input of the rank at x[] (x[0] its local index, the rest
 * its node's coordinates, innermost first).  Written from the schedule in
 * fastreduce(7), independently of src/algo/hier.c.
 */
static void hier_partial(fr_dtype_t dt, fr_op_t op, const int *G, int l,
			 const int *c, int *x, size_t i, uint32_t seed,
			 uint8_t *out)
{
	uint8_t in[8];

	if (l < 0) {
		int r = 0;

		for (int j = 7; j >= 0; j--)
			if (G[j])
				r = r * G[j] + x[j];
		input_elem(dt, op, r, i, seed, out);
		return;
	}
	for (int t = 0; t < G[l]; t++) {
		x[l] = (c[l] + t) % G[l];
		hier_partial(dt, op, G, l - 1, c, x, i, seed, t ? in : out);
		if (t)
			ref_combine(dt, op, out, out, in, 1);
	}
}

/*
 * The lanes of the hierarchical All-Reduce (fastreduce(7)): with two
 * levels or more, bytes / (8 FR_SEGMENT_BYTES) of them (default 512 KiB;
 * K and M suffixes), 1 to 4.
 */
static size_t hier_lanes(int nl, size_t bytes)
{
	const char *e = getenv("FR_SEGMENT_BYTES");
	size_t seg = 512u << 10, k;

	if (e && *e) {
		char *end;

		seg = strtoul(e, &end, 10);
		if (*end == 'K' || *end == 'k')
			seg <<= 10;
		else if (*end == 'M' || *end == 'm')
			seg <<= 20;
	}
	if (nl < 2)
		return 1;
	k = bytes / (8 * seg);
	return k < 1 ? 1 : k > 4 ? 4 : k;
}

/*
 * Expected element i for the hierarchical All-Reduce: at level l the
 * range R_l is cut in G[l] parts (R_0 the vector, R_{l+1} the part
 * holding i), and part c[l] is combined over the level in its order
 * c[l], c[l]+1, ... (hier_partial).  With two levels (the node, then all
 * nodes): chunk c of the node's sums in local order c, c+1, ..., then
 * piece j of those in node order j, j+1, ...  With lanes, R_0 is the
 * lane (the vector cut in that many parts) that holds i.
 */
static void expect_hier(fr_dtype_t dt, fr_op_t op, size_t count, size_t i,
			uint32_t seed, void *out)
{
	int G[8] = { 0 }, c[8] = { 0 }, x[8] = { 0 }, nl = hier_levels(G);
	size_t lo = 0, len = count, plo = 0, plen = 0;
	size_t lanes = hier_lanes(nl, count * fr_dtype_size(dt));
	uint8_t acc[8];

	/* the lane holding i is the vector each level then cuts */
	for (size_t k = 0; k < lanes; k++) {
		ref_cut(count, (int)lanes, (int)k, &plo, &plen);
		if (i < plo + plen)
			break;
	}
	lo = plo;
	len = plen;
	for (int l = 0; l < nl; l++) {
		for (c[l] = 0; c[l] < G[l]; c[l]++) {
			ref_cut(len, G[l], c[l], &plo, &plen);
			if (i < lo + plo + plen)
				break;
		}
		lo += plo;
		len = plen;
	}
	hier_partial(dt, op, G, nl - 1, c, x, i, seed, acc);
	if (op == FR_AVG)
		ref_scale_avg(dt, acc, 1, nranks);
	memcpy(out, acc, fr_dtype_size(dt));
}

/* The emulated node of rank r (--ranks-per-node, --round-robin-nodes),
 * and its local index: its place among its node's ranks in rank order. */
static int emu_node(int r)
{
	return node_map_n ? node_map[r] : rpn > 0 ? r / rpn : rr_nodes > 0 ? r % rr_nodes : 0;
}

static int emu_lidx(int r)
{
	int l = 0;

	for (int q = 0; q < r; q++)
		l += emu_node(q) == emu_node(r);
	return l;
}

/* k ranks on each of m nodes, both > 1: where the two-level
 * reduce-scatter and all-gather run (0 otherwise). */
static int emu_hier_layout(int *k, int *m)
{
	int cnt[64] = { 0 }, nn = 0;

	if ((!rpn && !rr_nodes && !node_map_n) || nranks > 64)
		return 0;
	for (int r = 0; r < nranks; r++) {
		nn = emu_node(r) + 1 > nn ? emu_node(r) + 1 : nn;
		cnt[emu_node(r)]++;
	}
	for (int j = 1; j < nn; j++)
		if (cnt[j] != cnt[0])
			return 0;
	*k = cnt[0];
	*m = nn;
	return *k > 1 && *m > 1;
}

/*
 * The levels of the hierarchical reduce-scatter and all-gather on the
 * emulated nodes, and every rank's coordinate on each (fastreduce(7)):
 * level 0 the node's k ranks, x_0 the rank's place on its node in rank
 * order; then each dimension of size > 1 of FR_TOPO's grid where its
 * product is the number of nodes, x_l the digit of the rank's node
 * (nodes numbered in the order of their lowest rank), else all the nodes
 * as one level, x_1 the rank's node in that numbering.  Fills HG[] (sizes),
 * HX[r][l], Hat[] (the rank at each combination of coordinates, x_0 slowest)
 * once; returns the levels.
 */
static int HG[8], HX[64][8], Hat[64], Hnl;

static int hrs_levels(void)
{
	int k = 0, m = 0, d[8], nd, id[64], nid = 0;
	long prod;

	if (Hnl || !emu_hier_layout(&k, &m))
		return Hnl;
	nd = topo_dims(d, &prod);
	for (int r = 0; r < 64; r++)
		id[r] = -1;
	for (int r = 0; r < nranks; r++) {
		if (id[emu_node(r)] < 0)
			id[emu_node(r)] = nid++;
		HX[r][0] = emu_lidx(r);
	}
	HG[Hnl++] = k;
	if (nd && prod == m) {
		for (int i = 0, stride = 1; i < nd; stride *= d[i++]) {
			if (d[i] < 2)
				continue;
			for (int r = 0; r < nranks; r++)
				HX[r][Hnl] = id[emu_node(r)] / stride % d[i];
			HG[Hnl++] = d[i];
		}
	} else {
		for (int r = 0; r < nranks; r++)
			HX[r][1] = id[emu_node(r)];
		HG[Hnl++] = m;
	}
	for (int r = 0; r < nranks; r++) {
		int pos = 0;

		for (int l = 0; l < Hnl; l++)
			pos = pos * HG[l] + HX[r][l];
		Hat[pos] = r;
	}
	return Hnl;
}

/* The partial sum of level l for element g at coordinates x[] (x[l]
 * free): the level's members x[l] = c+1, c+2, ..., c (mod HG[l]), c the
 * block owner's coordinate, each with the partial of the level below;
 * below level 0 the input of the rank at x[]. */
static void hrs_partial(fr_dtype_t dt, fr_op_t op, int l, const int *own,
			int *x, size_t g, uint32_t seed, uint8_t *out)
{
	uint8_t in[8];

	if (l < 0) {
		int pos = 0;

		for (int j = 0; j < Hnl; j++)
			pos = pos * HG[j] + x[j];
		input_elem(dt, op, Hat[pos], g, seed, out);
		return;
	}
	for (int t = 0; t < HG[l]; t++) {
		x[l] = (own[l] + 1 + t) % HG[l];
		hrs_partial(dt, op, l - 1, own, x, g, seed, t ? in : out);
		if (t)
			ref_combine(dt, op, out, out, in, 1);
	}
}

/*
 * Expected element g (of the n blocks) of block b for the hierarchical
 * reduce-scatter: level by level from the node up, the members of a level
 * combined in the order of their coordinate from the one after the
 * block owner's, each bringing the partial of the level below (written
 * from the schedule in fastreduce(7), independently of
 * src/algo/hier_rsag.c).  Two levels: each node sums its ranks in local
 * order l+1, l+2, ..., l (l = b's local index), then the node sums in
 * node order from the one after b's.
 */
static void expect_hier_rs(fr_dtype_t dt, fr_op_t op, int b, size_t g,
			   uint32_t seed, void *out)
{
	int x[8] = {0}, nl = hrs_levels();
	uint8_t acc[8];

	hrs_partial(dt, op, nl - 1, HX[b], x, g, seed, acc);
	if (op == FR_AVG)
		ref_scale_avg(dt, acc, 1, nranks);
	memcpy(out, acc, fr_dtype_size(dt));
}

/*
 * Rank r's partial sum of its offset j (block (r + j) mod n) after the
 * Bruck reduce-scatter's step k (k = K: before any, our input), for
 * element g: at step k (distance d = 2^k) offsets j < min(d, n - d) take
 * in rank r - d's partial of its offset d + j (the same block), the rest
 * stay (written from fastreduce(7), independently of
 * src/algo/bruck_rsag.c).
 */
static void bruck_partial(fr_dtype_t dt, fr_op_t op, int r, int j, int k, int K,
			  size_t g, uint32_t seed, uint8_t *out)
{
	int d = 1 << k, c = d < nranks - d ? d : nranks - d;
	uint8_t in[8];

	if (k == K) {
		/* rank r's input of the block (all partials here are of
		 * element g of our block) */
		input_elem(dt, op, r, g, seed, out);
		return;
	}
	bruck_partial(dt, op, r, j, k + 1, K, g, seed, out);
	if (j < c) {
		bruck_partial(dt, op, (r - d + nranks) % nranks, d + j, k + 1,
			      K, g, seed, in);
		ref_combine(dt, op, out, out, in, 1);
	}
}

/* Expected element g (of the n blocks) of our block for the Bruck
 * reduce-scatter: our partial of offset 0 after the last step. */
static void expect_bruck_rs(fr_dtype_t dt, fr_op_t op, size_t g, uint32_t seed,
			    void *out)
{
	int K = 0;
	uint8_t acc[8];

	while ((1 << K) < nranks)
		K++;
	bruck_partial(dt, op, rank, 0, 0, K, g, seed, acc);
	if (op == FR_AVG)
		ref_scale_avg(dt, acc, 1, nranks);
	memcpy(out, acc, fr_dtype_size(dt));
}

/* Expected element g of our block for the ring's reduce-scatter: the block
 * of the rank at ring position P is chunk P+1, accumulated by position
 * P+1, P+2, ..., P. */
static void expect_ring_rs(fr_dtype_t dt, fr_op_t op, size_t g, uint32_t seed,
			   void *out)
{
	int P = 0;
	uint8_t acc[8], in[8];

	while (ring_at(P) != rank)
		P++;
	input_elem(dt, op, ring_at((P + 1) % nranks), g, seed, acc);
	for (int t = 1; t < nranks; t++) {
		input_elem(dt, op, ring_at((P + 1 + t) % nranks), g, seed, in);
		ref_combine(dt, op, acc, acc, in, 1);
	}
	if (op == FR_AVG)
		ref_scale_avg(dt, acc, 1, nranks);
	memcpy(out, acc, fr_dtype_size(dt));
}

/* FR_ALGO=bruck: reduce-scatter and all-gather must run it, on any layout. */
static bool bruck_forced(void)
{
	const char *a = getenv("FR_ALGO");

	return a && !strcmp(a, "bruck");
}

/* FR_ALGO=hier where the layout lets it run: the hierarchical one must. */
static bool hier_forced(void)
{
	const char *a = getenv("FR_ALGO");
	int k, m;

	return a && !strcmp(a, "hier") && emu_hier_layout(&k, &m);
}

static uint64_t hash_bytes(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < n; i++) {
		h ^= b[i];
		h *= 1099511628211ull;
	}
	return h;
}

/* 1 on every rank iff flag is 0 on every rank (uses the library). */
static int all_ok(fr_comm_t *comm, int bad)
{
	int32_t v = bad ? 1 : 0;
	int rc = fr_allreduce(comm, FR_IN_PLACE, &v, 1, FR_I32, FR_SUM);

	return rc == 0 && v == 0;
}

/* Same 64-bit value on every rank? */
static int all_same(fr_comm_t *comm, uint64_t h)
{
	uint64_t v[2] = { h, ~h };

	if (fr_allreduce(comm, FR_IN_PLACE, v, 2, FR_U64, FR_MAX))
		return 0;
	return all_ok(comm, v[0] != h || v[1] != ~h);
}

static int parse_list(const char *s, long *out, int max)
{
	int n = 0;
	char *dup = strdup(s), *save = NULL;

	for (char *t = strtok_r(dup, ",", &save); t && n < max;
	     t = strtok_r(NULL, ",", &save))
		out[n++] = strtol(t, NULL, 0);
	free(dup);
	return n;
}

/*
 * Large counts (FR_TEST_BIG_COUNT elements or more) exercise what depends on
 * size - segments, pipelining, chunk and fragment boundaries, staging - and
 * that path is the same for every op: only the kernel differs, and
 * test_reduce checks every kernel at every length.  So, unless the caller
 * named the ops (--ops) or asked for the long campaign (FR_TEST_FULL=1),
 * a large count runs sum and avg (avg also divides at the end), the other
 * ops run at the smaller counts.  This keeps the large count in every run
 * at about a quarter of the time (3.8 s against 15.3 s at n = 4 over TCP).
 */
#define FR_TEST_BIG_COUNT 65536

static bool op_at_count(int op, size_t count, bool ops_named)
{
	const char *full = getenv("FR_TEST_FULL");

	if (ops_named || count < FR_TEST_BIG_COUNT ||
	    (full && !strcmp(full, "1")))
		return true;
	return op == FR_SUM || op == FR_AVG;
}

static int run_matrix(fr_comm_t *comm, const char *counts_s,
		      const char *dtypes_s, const char *ops_s)
{
	long counts[16];
	int ncounts, refuse_dt = -1;
	size_t maxcount = 0;

	if (counts_s) {
		ncounts = parse_list(counts_s, counts, 16);
	} else {
		/* 0, 1, fewer than ranks, a prime, a large odd count */
		long def[] = { 0, 1, nranks - 1, 7919, 1048577 };

		ncounts = 5;
		memcpy(counts, def, sizeof(def));
	}
	for (int i = 0; i < ncounts; i++)
		if ((size_t)counts[i] > maxcount)
			maxcount = (size_t)counts[i];
	uint8_t *send = malloc(maxcount * 8 + 8), *recv = malloc(maxcount * 8 + 8);
	uint8_t *again = malloc(maxcount * 8 + 8);

	for (int dt = 0; dt < FR_DTYPE_COUNT; dt++) {
		if (dtypes_s && strcmp(dtypes_s, "all") &&
		    !strstr(dtypes_s, fr_dtype_name((fr_dtype_t)dt)))
			continue;
		for (int op = 0; op < FR_OP_COUNT; op++) {
			size_t es = fr_dtype_size((fr_dtype_t)dt);

			if (ops_s && strcmp(ops_s, "all") &&
			    !strstr(ops_s, fr_op_name((fr_op_t)op)))
				continue;
			if (op == FR_AVG && dt > FR_BF16) {
				/* avg on integers is refused (last, below:
				 * a refusal fails the communicator) */
				refuse_dt = dt;
				continue;
			}
			for (int ci = 0; ci < ncounts; ci++) {
				size_t count = (size_t)counts[ci];

				if (!op_at_count(op, count,
						 ops_s && strcmp(ops_s, "all")))
					continue;
				for (int inplace = 0; inplace < 2; inplace++) {
					uint32_t seed = (uint32_t)(dt * 131 + op * 17 + ci);
					int rc, bad = 0;
					size_t lo, hi;
					char msg[256];
					uint8_t want[8];

					fill((fr_dtype_t)dt, (fr_op_t)op,
					     inplace ? recv : send, count, rank,
					     seed);
					if (!inplace)
						memset(recv, 0xa5, count * es + 8);
					rc = fr_allreduce(comm,
							  inplace ? FR_IN_PLACE : send,
							  recv, count,
							  (fr_dtype_t)dt,
							  (fr_op_t)op);
					if (rc) {
						CHECK(0, "%s %s count %zu inplace %d: %s: %s",
						      fr_dtype_name(dt), fr_op_name(op), count,
						      inplace, fr_strerror(rc),
						      fr_comm_last_error(comm));
						goto out;
					}
					/* each rank checks a slice against the reference */
					lo = count * (size_t)rank / (size_t)nranks;
					hi = count * (size_t)(rank + 1) / (size_t)nranks;
					int algo = fr_comm_last_algo(comm);

					for (size_t i = lo; i < hi && !bad; i++) {
						if (algo == FR_ALGO_RING)
							expect_elem((fr_dtype_t)dt, (fr_op_t)op,
								    count, i, seed, want);
						else if (algo == FR_ALGO_HIER)
							expect_hier((fr_dtype_t)dt, (fr_op_t)op,
								    count, i, seed, want);
						else if (algo == FR_ALGO_TREE)
							expect_dbtree(
								(fr_dtype_t)dt,
								(fr_op_t)op,
								count, i, seed,
								want);
						else if (algo ==
							 FR_ALGO_ONESHOT)
							expect_linear(
								(fr_dtype_t)dt,
								(fr_op_t)op, i,
								seed, want);
						else
							expect_hcube((fr_dtype_t)dt, (fr_op_t)op,
								     i, seed, want);
						if (memcmp(want, recv + i * es, es)) {
							bad = 1;
							ref_first_diff((fr_dtype_t)dt,
								       recv + i * es,
								       want, 1, msg,
								       sizeof(msg));
							CHECK(0, "%s %s count %zu inplace %d algo %s: element %zu: %s",
							      fr_dtype_name(dt), fr_op_name(op),
							      count, inplace, fr_algo_name(algo), i, msg);
						}
					}
					if (!inplace && recv[count * es] != 0xa5) {
						bad = 1;
						CHECK(0, "wrote past count %zu", count);
					}
					CHECK(all_ok(comm, bad),
					      "%s %s count %zu inplace %d: reference mismatch on some rank",
					      fr_dtype_name(dt), fr_op_name(op), count, inplace);
					CHECK(all_same(comm, hash_bytes(recv, count * es)),
					      "%s %s count %zu inplace %d: ranks differ",
					      fr_dtype_name(dt), fr_op_name(op), count, inplace);
					/* the same inputs give the same bits again */
					if (count > 1 && ci == ncounts - 1) {
						memcpy(again, recv, count * es);
						fill((fr_dtype_t)dt, (fr_op_t)op,
						     inplace ? recv : send, count,
						     rank, seed);
						rc = fr_allreduce(comm,
								  inplace ? FR_IN_PLACE : send,
								  recv, count,
								  (fr_dtype_t)dt,
								  (fr_op_t)op);
						CHECK(!rc && !memcmp(again, recv, count * es),
						      "%s %s count %zu: second run differs",
						      fr_dtype_name(dt), fr_op_name(op), count);
					}
				}
			}
		}
	}
	if (refuse_dt >= 0) {
		int rc = fr_allreduce(comm, send, recv, 1, (fr_dtype_t)refuse_dt,
				      FR_AVG);

		CHECK(rc == FR_EINVAL, "avg on %s returned %d",
		      fr_dtype_name((fr_dtype_t)refuse_dt), rc);
	}
out:
	free(send);
	free(recv);
	free(again);
	return failed;
}

/*
 * Reduce-scatter (against the order of the algorithm that ran: the ring's,
 * or the hierarchical one's on emulated nodes), all-gather and broadcast
 * (exact copies) and barrier, over counts x dtypes (x ops for
 * reduce-scatter) x in/out of place.  With FR_ALGO=hier on a layout where
 * it applies, reduce-scatter and all-gather must have run it.
 */
static int run_colls(fr_comm_t *comm, const char *counts_s)
{
	long counts[16], def[] = { 0, 1, nranks - 1, 7919, 65537 };
	int ncounts = counts_s ? parse_list(counts_s, counts, 16) : 5;
	size_t maxcount = 0;
	char msg[256];

	if (!counts_s)
		memcpy(counts, def, sizeof(def));
	for (int i = 0; i < ncounts; i++)
		maxcount = FR_MAXV(maxcount, (size_t)counts[i]);
	uint8_t *send = malloc(maxcount * 8 * (size_t)nranks + 8);
	uint8_t *recv = malloc(maxcount * 8 * (size_t)nranks + 8);
	uint8_t *want = malloc(maxcount * 8 * (size_t)nranks + 8);

	for (int ci = 0; ci < ncounts; ci++) {
		size_t count = (size_t)counts[ci];

		for (int dt = 0; dt < FR_DTYPE_COUNT; dt++) {
			size_t es = fr_dtype_size((fr_dtype_t)dt);

			for (int op = 0; op < FR_OP_COUNT; op++) {
				if ((op == FR_AVG && dt > FR_BF16) ||
				    !op_at_count(op, count, false))
					continue;
				for (int inplace = 0; inplace < 2; inplace++) {
					uint32_t seed = (uint32_t)(dt * 31 + op * 7 + ci);
					uint8_t *rb = inplace ? send + (size_t)rank * count * es : recv;
					int rc, bad = 0, algo;

					fill((fr_dtype_t)dt, (fr_op_t)op, send, count * (size_t)nranks, rank, seed);
					if (!inplace)
						memset(recv, 0xa5, count * es + 8);
					rc = fr_reduce_scatter(comm, send, rb, count, (fr_dtype_t)dt, (fr_op_t)op);
					CHECK(!rc, "reduce_scatter %s %s count %zu: %s", fr_dtype_name(dt),
					      fr_op_name(op), count, fr_comm_last_error(comm));
					if (rc)
						goto out;
					algo = fr_comm_last_algo(comm);
					if (bruck_forced())
						CHECK(algo == FR_ALGO_BRUCK,
						      "reduce_scatter ran %s, not bruck",
						      fr_algo_name(algo));
					if (hier_forced())
						CHECK(algo == FR_ALGO_HIER, "reduce_scatter ran %s, not hier",
						      fr_algo_name(algo));
					for (size_t j = 0; j < count && !bad; j++) {
						size_t g = (size_t)rank * count + j;
						uint8_t acc[8];

						if (algo == FR_ALGO_HIER)
							expect_hier_rs(dt, op, rank, g, seed, acc);
						else if (algo == FR_ALGO_BRUCK)
							expect_bruck_rs(dt, op,
									g, seed,
									acc);
						else
							expect_ring_rs(dt, op, g, seed, acc);
						if (memcmp(acc, rb + j * es, es)) {
							bad = 1;
							ref_first_diff(dt, rb + j * es, acc, 1, msg, sizeof(msg));
							CHECK(0, "reduce_scatter %s %s count %zu inplace %d algo %s: element %zu: %s",
							      fr_dtype_name(dt), fr_op_name(op), count, inplace,
							      fr_algo_name(algo), j, msg);
						}
					}
					if (!inplace && recv[count * es] != 0xa5)
						CHECK(0, "reduce_scatter wrote past count %zu", count);
				}
			}
			/* all-gather and broadcast: copies, any op */
			for (int inplace = 0; inplace < 2; inplace++) {
				uint32_t seed = (uint32_t)(dt * 31 + ci + 1000);
				size_t blk = count * es;
				int rc, bad = 0;

				for (int r = 0; r < nranks; r++)
					fill((fr_dtype_t)dt, FR_SUM, want + (size_t)r * blk, count, r, seed);
				memset(recv, 0xa5, blk * (size_t)nranks + 8);
				if (inplace)
					memcpy(recv + (size_t)rank * blk, want + (size_t)rank * blk, blk);
				else
					memcpy(send, want + (size_t)rank * blk, blk);
				rc = fr_allgather(comm, inplace ? recv + (size_t)rank * blk : send,
						  recv, count, (fr_dtype_t)dt);
				CHECK(!rc, "allgather %s count %zu: %s", fr_dtype_name(dt), count,
				      fr_comm_last_error(comm));
				if (rc)
					goto out;
				bad = memcmp(recv, want, blk * (size_t)nranks) != 0 ||
				      recv[blk * (size_t)nranks] != 0xa5;
				CHECK(!bad, "allgather %s count %zu inplace %d (%s): wrong data",
				      fr_dtype_name(dt), count, inplace,
				      fr_algo_name(fr_comm_last_algo(comm)));
				if (bruck_forced())
					CHECK(fr_comm_last_algo(comm) ==
						      FR_ALGO_BRUCK,
					      "allgather ran %s, not bruck",
					      fr_algo_name(
						      fr_comm_last_algo(comm)));
				if (hier_forced())
					CHECK(fr_comm_last_algo(comm) == FR_ALGO_HIER,
					      "allgather ran %s, not hier",
					      fr_algo_name(fr_comm_last_algo(comm)));
				for (int root = 0; root < nranks; root += inplace ? 2 : 1) {
					memset(recv, 0xa5, blk + 8);
					if (rank == root)
						memcpy(recv, want + (size_t)root * blk, blk);
					rc = fr_broadcast(comm, recv, count, (fr_dtype_t)dt, root);
					CHECK(!rc, "broadcast %s count %zu root %d: %s", fr_dtype_name(dt),
					      count, root, fr_comm_last_error(comm));
					if (rc)
						goto out;
					CHECK(!memcmp(recv, want + (size_t)root * blk, blk) &&
						      recv[blk] == 0xa5,
					      "broadcast %s count %zu root %d (%s): wrong data",
					      fr_dtype_name(dt), count, root,
					      fr_algo_name(fr_comm_last_algo(comm)));
				}
			}
		}
	}
	/* barrier: nobody leaves before the last rank arrives.  The ranks
	 * leave the first barrier at different times (under ASan, 8 ranks
	 * on 2 CPUs, 100 ms apart was seen), so the late rank sleeps well
	 * past the bound: a barrier that does not wait takes milliseconds */
	for (int late = 0; late < nranks; late += nranks > 2 ? nranks - 1 : 1) {
		double t0;
		int rc;

		rc = fr_barrier(comm);
		CHECK(!rc, "barrier: %s", fr_comm_last_error(comm));
		t0 = now_s();
		if (rank == late)
			usleep(300000);
		rc = fr_barrier(comm);
		CHECK(!rc && now_s() - t0 > 0.1,
		      "barrier with rank %d late: left after %.3f s (%s)", late,
		      now_s() - t0, fr_errname(rc));
	}
out:
	free(send);
	free(recv);
	free(want);
	return failed;
}

/* One large collective, then destroy at once: a rank that finished first
 * and said goodbye must not fail the others, still draining their sends. */
static int run_bigexit(fr_comm_t *comm, size_t count)
{
	float *b = calloc(count, sizeof(float));
	int rc;

	CHECK(b != NULL, "calloc");
	for (size_t i = 0; b && i < count; i += 4096)
		b[i] = (float)rank;
	rc = b ? fr_allreduce(comm, FR_IN_PLACE, b, count, FR_F32, FR_SUM) : 0;
	CHECK(!rc, "allreduce of %zu then exit: %s", count,
	      fr_comm_last_error(comm));
	CHECK(!b || b[0] == (float)(nranks * (nranks - 1) / 2),
	      "wrong sum %g", b ? (double)b[0] : 0.0);
	free(b);
	return failed;
}

static int run_regonce(fr_comm_t *comm, int iters, size_t count)
{
	float *a = malloc(count * sizeof(float)), *b = malloc(count * sizeof(float));
	fr_mem_t *ma = NULL, *mb = NULL;
	fr_stats_t s1 = { .size = sizeof(s1) }, s2 = { .size = sizeof(s2) };
	int rc = 0, wrong = 0;

	CHECK(!fr_mem_register(comm, a, count * sizeof(float), &ma), "register a");
	CHECK(!fr_mem_register(comm, b, count * sizeof(float), &mb), "register b");
	for (int it = 0; it < iters && !rc; it++) {
		for (size_t i = 0; i < count; i++)
			a[i] = (float)((rank + i + (size_t)it) % 5);
		rc = fr_allreduce(comm, a, b, count, FR_F32, FR_SUM);
		for (size_t i = 0; i < count && !rc; i++) {
			float want = 0;

			for (int r = 0; r < nranks; r++)
				want += (float)((r + i + (size_t)it) % 5);
			wrong += b[i] != want;
		}
		if (it == 0)
			fr_comm_stats(comm, &s1);
	}
	CHECK(!rc, "allreduce: %s", fr_comm_last_error(comm));
	CHECK(!wrong, "%d wrong elements", wrong);
	fr_comm_stats(comm, &s2);
	CHECK(s2.collectives >= (uint64_t)iters, "collectives %" PRIu64, s2.collectives);
	CHECK(s1.mem_registrations == s2.mem_registrations,
	      "registrations grew from %" PRIu64 " to %" PRIu64,
	      s1.mem_registrations, s2.mem_registrations);
	CHECK(s1.rkeys_sent == s2.rkeys_sent,
	      "remote keys sent grew from %" PRIu64 " to %" PRIu64, s1.rkeys_sent,
	      s2.rkeys_sent);
	CHECK(s2.regcache_misses == 0, "cache misses %" PRIu64, s2.regcache_misses);
	if (rank == 0)
		printf("regonce: %d iterations, registrations %" PRIu64
		       ", remote keys sent %" PRIu64 ", bytes sent %" PRIu64 "\n",
		       iters, s2.mem_registrations, s2.rkeys_sent, s2.bytes_sent);
	CHECK(!fr_mem_deregister(ma), "deregister a");
	CHECK(!fr_mem_deregister(mb), "deregister b");
	free(a);
	free(b);
	return failed;
}

/*
 * freeze: stop in the middle of a collective and resume after every other
 * rank has given up (a child process sends SIGCONT).  The others have then
 * unmapped the buffer this rank still holds keys for.
 */
static int freeze_midway(fr_comm_t *comm, float *buf, size_t count,
			 long timeout_ms)
{
	fr_request_t *req = NULL;
	pid_t self = getpid();
	int rc, done = 0;

	rc = fr_iallreduce(comm, FR_IN_PLACE, buf, count, FR_F32, FR_SUM, &req);
	if (rc)
		return rc;
	/* Data is moving after the first test, and this rank still has to
	 * pass on what it receives.  Not later: a one-sided transport keeps
	 * delivering into a stopped process, so one stopped after the last
	 * piece of its own result had landed (20 tests in, on a slow
	 * Soft-RoCE VM) could resume and complete its collective before
	 * reading the ABORTs, which is fine, but not what this case tests. */
	fr_test(&req, &done);
	if (done) /* finished already: nothing left to write late */
		return FR_EAGAIN;
	fprintf(stderr, "rank %d: freezing now\n", rank);
	if (fork() == 0) {
		usleep((useconds_t)(timeout_ms + 1500) * 1000);
		kill(self, SIGCONT);
		_exit(0);
	}
	raise(SIGSTOP);
	fprintf(stderr, "rank %d: resumed\n", rank);
	return fr_wait(&req);
}

static int run_die(fr_comm_t *comm, int victim, int at, const char *how)
{
	/* FR_TEST_DIE_COUNT: another count (a small one goes by lines over
	 * shared memory, algo/ll.c) */
	size_t count = getenv("FR_TEST_DIE_COUNT")
			       ? (size_t)atol(getenv("FR_TEST_DIE_COUNT"))
			       : 1 << 18;
	/* mmap, not malloc: the survivors' munmap must really unmap it */
	float *buf = mmap(NULL, count * sizeof(float), PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	int rc = 0, it;
	double t0 = 0;
	long timeout_ms = getenv("FR_TIMEOUT_MS") ? atol(getenv("FR_TIMEOUT_MS")) : 30000;

	if (buf == MAP_FAILED)
		return ++failed;

	for (it = 0; it < at + 1000 && !rc; it++) {
		/* survivors may still be finishing the previous collective */
		if (it == at - 1)
			t0 = now_s();
		if (it == at) {
			if (rank == victim) {
				fprintf(stderr, "rank %d: dying now (%s)\n", rank, how);
				if (!strcmp(how, "exit"))
					_exit(0);
				if (!strcmp(how, "freeze")) {
					rc = freeze_midway(comm, buf, count,
							   timeout_ms);
					/* it fails as a rule; it may also
					 * finish, if all it still had to do
					 * was write (into the survivors'
					 * mailboxes and staging, which they
					 * keep registered) and it did that
					 * before reading their ABORTs (seen
					 * once under ASan): what this case
					 * checks is the survivors' reused
					 * memory, below */
					printf("rank %d: resumed: %s\n", rank,
					       fr_errname(rc));
					munmap(buf, count * sizeof(float));
					return failed;
				}
				if (!strcmp(how, "stall")) {
					/* alive but silent: the others time out */
					sleep((unsigned)(timeout_ms / 1000 * 3 + 1));
					t0 = now_s();
					goto stalled;
				}
				raise(SIGKILL);
			}
		}
stalled:
		rc = fr_allreduce(comm, FR_IN_PLACE, buf, count, FR_F32, FR_SUM);
	}
	double dt = now_s() - t0;
	fr_stats_t st;

	CHECK(rc == FR_EPEER || rc == FR_ETIMEDOUT,
	      "survivor got %d (%s) at iteration %d", rc, fr_errname(rc), it);
	/* the failed collective's cached registration of buf is gone, so
	 * that a peer's late write cannot land in it after the munmap below */
	st.size = sizeof(st);
	CHECK(!fr_comm_stats(comm, &st), "stats");
	CHECK(st.regcache_hits + st.regcache_misses == 0 ||
		      st.regcache_evictions >= 1,
	      "the failed collective's cached registration was kept");
	CHECK(dt < timeout_ms / 1000.0 + 5, "error after %.1f s", dt);
	printf("rank %d: %s after %.3f s: %s\n", rank, fr_errname(rc), dt,
	       fr_comm_last_error(comm));
	/* the communicator stays failed */
	rc = fr_allreduce(comm, FR_IN_PLACE, buf, 1, FR_F32, FR_SUM);
	CHECK(rc == FR_EPEER || rc == FR_ETIMEDOUT, "failed communicator returned %d", rc);
	munmap(buf, count * sizeof(float));
	if (strcmp(how, "freeze"))
		return failed;
	/*
	 * New memory at the same address, as the application's next
	 * allocation could be, filled with a pattern; stay until the frozen
	 * rank has resumed and sent what it still had for the old buffer.
	 * None of it may land here.
	 */
	unsigned char *again = mmap(buf, count * sizeof(float),
				    PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE,
				    -1, 0);
	size_t bad = 0;

	if (again != (unsigned char *)buf) {
		printf("rank %d: could not map the same address again: skipped the reuse check\n",
		       rank);
		usleep(2500 * 1000);
		return failed;
	}
	memset(again, 0x5a, count * sizeof(float));
	usleep(2500 * 1000);
	for (size_t i = 0; i < count * sizeof(float); i++)
		bad += again[i] != 0x5a;
	CHECK(!bad, "%zu bytes of memory reused after the failure were overwritten",
	      bad);
	munmap(again, count * sizeof(float));
	return failed;
}

/*
 * A rank that is alive but late (a checkpoint, a slow data loader): it
 * enters collective #at late_ms late.  With its progress thread on it
 * answers the others' PINGs meanwhile, so they wait for it up to
 * FR_SLOW_TIMEOUT_MS instead of FR_TIMEOUT_MS: within that patience every
 * collective succeeds with the right sums; beyond it (toolate) every
 * other rank fails with FR_ETIMEDOUT saying that a rank is alive but late.
 */
static int run_late(fr_comm_t *comm, int victim, int at, long late_ms,
		    bool toolate)
{
	float buf[1024];
	int rc = 0, it, wrong = 0;
	double t0 = now_s(), dt;

	for (it = 0; it < at + 3 && !rc; it++) {
		for (int i = 0; i < 1024; i++)
			buf[i] = (float)(rank + it);
		if (rank == victim && it == at) {
			fprintf(stderr, "rank %d: late by %ld ms\n", rank, late_ms);
			usleep((useconds_t)late_ms * 1000);
		}
		rc = fr_allreduce(comm, FR_IN_PLACE, buf, 1024, FR_F32, FR_SUM);
		for (int i = 0; !rc && i < 1024; i++)
			wrong += buf[i] != (float)(nranks * (nranks - 1) / 2 +
						   nranks * it);
	}
	dt = now_s() - t0;
	printf("rank %d: %s after %.1f s: %s\n", rank, fr_errname(rc), dt,
	       rc ? fr_comm_last_error(comm) : "all collectives done");
	CHECK(!wrong, "%d wrong sums", wrong);
	if (!toolate) {
		CHECK(!rc, "a late rank within the patience failed the job: %s",
		      fr_comm_last_error(comm));
	} else if (rank != victim) {
		CHECK(rc == FR_ETIMEDOUT, "got %s", fr_errname(rc));
		CHECK(strstr(fr_comm_last_error(comm), "is alive but"),
		      "the error does not say the rank is alive but late");
		CHECK(dt < late_ms / 1000.0, "failed only after %.1f s", dt);
	}
	return failed;
}

/*
 * Out of file descriptors after creation: rank R opens /dev/null until it
 * cannot, then every rank runs an All-Reduce whose algorithm (FR_ALGO=rd)
 * needs new connections.  Every rank must fail quickly (not at the
 * timeout), and R's message must name the limit.
 */
static int run_fdhog(fr_comm_t *comm, int victim, const char *what)
{
	static float buf[100000];
	static int fds[65536];
	int nfd = 0, rc;
	size_t count = 256;
	double t0;

	/* mem: the victim runs under a small `ulimit -v` (the caller's) and
	 * a large FR_SEGMENT_BYTES, so the ring's staging cannot be had */
	if (!strcmp(what, "mem"))
		count = 100000;
	else if (rank == victim) {
		int fd;

		while (nfd < 65536 && (fd = open("/dev/null", O_RDONLY)) >= 0)
			fds[nfd++] = fd;
		fprintf(stderr, "rank %d: holding %d more descriptors\n", rank,
			nfd);
	}
	t0 = now_s();
	rc = fr_allreduce(comm, FR_IN_PLACE, buf, count, FR_F32, FR_SUM);
	printf("rank %d: %s after %.1f s: %s\n", rank, fr_errname(rc),
	       now_s() - t0, fr_comm_last_error(comm));
	/* verbs connections take no descriptor (rdma_cm shares one event
	 * channel), so there it may well succeed; an error must be quick.  A
	 * rank with no descriptor left cannot tell anyone: a peer that hears
	 * nothing fails at its timeout (3 s in mp_kill), naming it */
	CHECK(rc == 0 || rc == FR_ESYS || rc == FR_EPEER || rc == FR_ENOMEM ||
		      rc == FR_ETIMEDOUT,
	      "got %s", fr_errname(rc));
	CHECK(now_s() - t0 < 5, "the collective took %.1f s", now_s() - t0);
	if (rank == victim && rc)
		CHECK(strstr(fr_comm_last_error(comm),
			     strcmp(what, "mem") ? "ulimit -n" : "ulimit -v"),
		      "the message does not say how to raise the limit");
	while (nfd)
		close(fds[--nfd]);
	return failed;
}

/*
 * A seeded sequence of every collective at sizes from 1 element to 1 MiB,
 * for the fault matrix (tests/verbs_faults.sh): the inputs are small
 * integers, so sums are exact in every dtype whatever the algorithm or
 * transport, and the digest of all results must be the same with or
 * without loss, delay and reordering.  Prints "digest HEX" (rank 0).
 */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < n; i++)
		h = (h ^ b[i]) * 0x100000001b3ull;
	return h;
}

static int run_faults(fr_comm_t *comm, int iters, long jitter_us)
{
	static const size_t counts[] = { 1, 7, 1000, 65537, 262144 };
	size_t maxc = 262144 + 64;
	int32_t *a = calloc(maxc * (size_t)nranks, sizeof(double));
	int32_t *b = calloc(maxc * (size_t)nranks, sizeof(double));
	uint64_t h = 0xcbf29ce484222325ull, rnd = 12345;
	int rc = 0, it;

	for (it = 0; it < iters && !rc && a && b; it++) {
		size_t count = counts[(rnd = mix(rnd)) % 5];
		int kind = (int)((rnd >> 8) % 5), which = (int)((rnd >> 16) % 3);
		fr_dtype_t dt = which == 0 ? FR_F32 : which == 1 ? FR_F64 : FR_I32;
		fr_op_t op = (rnd >> 24) % 2 ? FR_SUM : FR_MAX;
		size_t es = fr_dtype_size(dt), blk;

		/* not from rnd: every rank's calls stay the same */
		if (jitter_us > 0)
			usleep((useconds_t)(mix((uint64_t)it * 977 +
						(uint64_t)rank) %
					    (uint64_t)jitter_us));

		for (size_t i = 0; i < count * (size_t)nranks; i++) {
			int v = (int)((rank * 31 + (int)i * 7 + it) % 97);

			if (dt == FR_F32)
				((float *)a)[i] = (float)v;
			else if (dt == FR_F64)
				((double *)a)[i] = v;
			else
				a[i] = v;
		}
		switch (kind) {
		case 0:
		case 1:
			rc = fr_allreduce(comm, a, b, count, dt, op);
			h = fnv(h, b, count * es);
			break;
		case 2:
			blk = count / (size_t)nranks + 1;
			rc = fr_reduce_scatter(comm, a, b, blk, dt, op);
			h = fnv(h, b, blk * es);
			break;
		case 3:
			rc = fr_allgather(comm, a, b, count, dt);
			h = fnv(h, b, count * (size_t)nranks * es);
			break;
		default:
			rc = fr_broadcast(comm, a, count, dt, it % nranks);
			h = fnv(h, a, count * es);
			if (!rc)
				rc = fr_barrier(comm);
			break;
		}
	}
	CHECK(a && b, "out of memory");
	CHECK(!rc, "collective %d: %s", it - 1, fr_comm_last_error(comm));
	if (rank == 0 && !rc)
		printf("digest %016llx\n", (unsigned long long)h);
	free(a);
	free(b);
	return failed;
}

static int run_mismatch_n(fr_comm_t *comm, int victim, const char *what,
			  size_t count, double *buf);

static int run_mismatch(fr_comm_t *comm, int victim, const char *what,
			const char *counts)
{
	/* --counts C: C elements (the zero-copy steps of large ones) */
	size_t count = counts ? (size_t)atol(counts) : 33;
	double *buf = calloc(count + 1, sizeof(double));

	CHECK(buf, "no memory for %zu elements", count + 1);
	if (buf)
		run_mismatch_n(comm, victim, what, count, buf);
	free(buf);
	return failed;
}

static int run_mismatch_n(fr_comm_t *comm, int victim, const char *what,
			  size_t count, double *buf)
{
	fr_dtype_t dt = FR_F64;
	fr_op_t op = FR_SUM;
	int rc;

	/* one good collective first (refuse-first: none, no connections) */
	if (strcmp(what, "refuse-first")) {
		rc = fr_allreduce(comm, FR_IN_PLACE, buf, count, dt, op);
		CHECK(!rc, "first allreduce: %s", fr_comm_last_error(comm));
	}
	if (!strncmp(what, "refuse", 6)) {
		/* the victim's arguments are refused: it gets FR_EINVAL, the
		 * others FR_EPEER naming it, at once rather than at the
		 * timeout */
		double t0 = now_s(), dt_s;
		char want[64];

		if (rank == victim && !strcmp(what, "refuse-dtype"))
			rc = fr_allreduce(comm, FR_IN_PLACE, buf, count,
					  (fr_dtype_t)99, op);
		else if (rank == victim)
			rc = fr_allreduce(comm, FR_IN_PLACE, NULL, count, dt, op);
		else
			rc = fr_allreduce(comm, FR_IN_PLACE, buf, count, dt, op);
		dt_s = now_s() - t0;
		printf("rank %d: %s after %.3f s: %s\n", rank, fr_errname(rc),
		       dt_s, fr_comm_last_error(comm));
		snprintf(want, sizeof(want), "rank %d failed first", victim);
		if (rank == victim)
			CHECK(rc == FR_EINVAL, "victim got %s", fr_errname(rc));
		else if (strstr(fr_comm_last_error(comm),
				"closed the connection") ||
			 strstr(fr_comm_last_error(comm),
				"closed its connection"))
			/* a rank that had relayed the notice left before its
			 * copy reached us (verbs tears QPs down fast), or
			 * while we were still connecting to it: still
			 * FR_EPEER at once, naming the rank that left */
			CHECK(rc == FR_EPEER, "got %s: %s", fr_errname(rc),
			      fr_comm_last_error(comm));
		else
			CHECK(rc == FR_EPEER && strstr(fr_comm_last_error(comm), want) &&
				      strstr(fr_comm_last_error(comm),
					     strcmp(what, "refuse-dtype") ? "NULL buffer"
									  : "invalid datatype"),
			      "got %s: %s", fr_errname(rc), fr_comm_last_error(comm));
		CHECK(dt_s < 5.0, "the error took %.1f s", dt_s);
		/* and the communicator stays failed */
		rc = fr_allreduce(comm, FR_IN_PLACE, buf, count, FR_F64, FR_SUM);
		CHECK(rc < 0, "a failed communicator ran a collective");
		return failed;
	}
	if (rank == victim) {
		if (!strcmp(what, "count"))
			count++;
		else if (!strcmp(what, "dtype"))
			dt = FR_I64;
		else if (!strcmp(what, "op"))
			op = FR_MAX;
	}
	if (!strcmp(what, "coll")) {
		/* the victim calls another collective than its peers (a
		 * broadcast from rank 0): over the mailboxes it meets their
		 * messages; where its peers All-Reduce by lines (--counts up
		 * to a line, one node) it reads their header, by lines too,
		 * or, its broadcast by the tree (more ranks than CPUs), finds
		 * their lines naming this collective while it waits (ll.c,
		 * ll_progress): never the timeout */
		if (rank == victim)
			rc = fr_broadcast(comm, buf, count, dt, 0);
		else
			rc = fr_allreduce(comm, FR_IN_PLACE, buf, count, dt, op);
		CHECK(rc == FR_EMISMATCH || rc == FR_EPEER, "got %s: %s",
		      fr_errname(rc), fr_comm_last_error(comm));
		CHECK(rc == FR_EMISMATCH || rank != victim, "victim got %s: %s",
		      fr_errname(rc), fr_comm_last_error(comm));
		printf("rank %d: %s: %s\n", rank, fr_errname(rc), fr_comm_last_error(comm));
		return failed;
	}
	if (!strcmp(what, "bcastroot")) {
		/* a small broadcast whose root the victim takes to be itself:
		 * over lines (ll.c) every rank reads the others' headers,
		 * which name the root */
		rc = fr_broadcast(comm, buf, count, dt,
				  rank == victim ? victim : 0);
		CHECK(rc == FR_EMISMATCH || (rank != victim && rc == FR_EPEER),
		      "got %s: %s", fr_errname(rc), fr_comm_last_error(comm));
		printf("rank %d: %s: %s\n", rank, fr_errname(rc),
		       fr_comm_last_error(comm));
		return failed;
	}
	if (!strcmp(what, "barrier")) {
		/* the victim calls a barrier where its peers All-Reduce:
		 * over lines (both ll.c's) every rank reads the other call's
		 * header; over the mailboxes the victim meets a message of
		 * the All-Reduce */
		if (rank == victim)
			rc = fr_barrier(comm);
		else
			rc = fr_allreduce(comm, FR_IN_PLACE, buf, count, dt,
					  op);
		CHECK(rc == FR_EMISMATCH || (rank != victim && rc == FR_EPEER),
		      "got %s: %s", fr_errname(rc), fr_comm_last_error(comm));
		printf("rank %d: %s: %s\n", rank, fr_errname(rc),
		       fr_comm_last_error(comm));
		return failed;
	}
	if (rank == victim && !strcmp(what, "skip")) {
		/* This rank is one collective behind: it destroys early,
		 * so the others must not hang. */
		return failed;
	}
	rc = fr_allreduce(comm, FR_IN_PLACE, buf, count, dt, op);
	if (!strcmp(what, "skip"))
		CHECK(rc == FR_EPEER || rc == FR_ETIMEDOUT || rc == FR_EMISMATCH,
		      "got %s", fr_errname(rc));
	else
		CHECK(rc == FR_EMISMATCH, "got %s: %s", fr_errname(rc),
		      fr_comm_last_error(comm));
	printf("rank %d: %s: %s\n", rank, fr_errname(rc), fr_comm_last_error(comm));
	return failed;
}

/*
 * Compressed All-Reduce: every format x op x count, in and out of place,
 * with and without error feedback.  All ranks must end with identical bits;
 * the error against the exact f64 result must stay within the format's
 * bound; with error feedback, the mean of many steps must converge to the
 * exact value far better than one step's error (nothing is lost).
 */
static double comp_input(int r, size_t i, int step)
{
	uint64_t m = mix((uint64_t)r << 40 ^ i << 8 ^ (uint64_t)step);

	return ((double)(m % 2000001) - 1000000.0) / 1000000.0 *
	       (1.0 + (double)(i % 7));
}

static int run_compress(fr_comm_t *comm, const char *counts_s)
{
	static const long dflt[] = { 0, 1, 3, 255, 256, 257, 1000, 7919,
				     65537, 300007 };
	static const fr_compress_t fmts[] = { FR_COMPRESS_BF16,
					       FR_COMPRESS_FP16,
					       FR_COMPRESS_INT8 };
	static const fr_op_t ops[] = { FR_SUM, FR_AVG, FR_MAX };
	/* relative L2 bound per format for one call (n ranks' requantized
	 * partial sums): bf16 8 bits, fp16 11 bits, int8 7 bits per block */
	static const double bound[] = { 0, 1.6e-2, 2e-3, 4e-2 };
	long counts[32];
	int nc = counts_s ? parse_list(counts_s, counts, 32) : 10;

	if (!counts_s)
		memcpy(counts, dflt, sizeof(dflt));
	for (int ci = 0; ci < nc; ci++) {
		size_t n = (size_t)counts[ci];
		float *in = malloc((n + 1) * sizeof(float));
		float *out = malloc((n + 1) * sizeof(float));
		float *res = calloc(n + 1, sizeof(float));

		for (int fi = 0; fi < 3; fi++)
		for (int oi = 0; oi < 3; oi++)
		for (int variant = 0; variant < 3; variant++) {
			/* 0: out of place, 1: in place, 2: in place + EF */
			fr_coll_opts_t o;
			double num = 0, den = 0;
			int rc;

			fr_coll_opts_init(&o);
			o.compress = fmts[fi];
			memset(res, 0, (n + 1) * sizeof(float));
			o.residual = variant == 2 ? res : NULL;
			for (size_t i = 0; i < n; i++)
				in[i] = (float)comp_input(rank, i, 0);
			if (variant)
				memcpy(out, in, n * sizeof(float));
			rc = fr_allreduce_ex(comm, variant ? FR_IN_PLACE : in,
					     out, n, FR_F32, ops[oi], &o);
			CHECK(rc == 0, "compress %s %s n=%zu: %s: %s",
			      fr_compress_name(fmts[fi]), fr_op_name(ops[oi]),
			      n, fr_strerror(rc), fr_comm_last_error(comm));
			if (rc)
				continue;
			CHECK(fr_comm_last_algo(comm) == FR_ALGO_RING,
			      "compressed runs the ring");
			for (size_t i = 0; i < n; i++) {
				double e = ops[oi] == FR_MAX ? -1e300 : 0;

				for (int r = 0; r < nranks; r++) {
					double x = (float)comp_input(r, i, 0);

					e = ops[oi] == FR_MAX ? (x > e ? x : e)
							      : e + x;
				}
				if (ops[oi] == FR_AVG)
					e /= nranks;
				num += (out[i] - e) * (out[i] - e);
				den += e * e;
			}
			CHECK(n == 0 || sqrt(num / den) < bound[fmts[fi]],
			      "compress %s %s n=%zu variant %d: relative error %.3g >= %.3g",
			      fr_compress_name(fmts[fi]), fr_op_name(ops[oi]), n,
			      variant, sqrt(num / (den ? den : 1)),
			      bound[fmts[fi]]);
			CHECK(all_same(comm, hash_bytes(out, n * sizeof(float))),
			      "compress %s %s n=%zu: ranks differ",
			      fr_compress_name(fmts[fi]), fr_op_name(ops[oi]),
			      n);
		}
		/* error feedback: 40 steps of the same input; the mean result
		 * converges to the exact sum, without it int8 stays off */
		if (n >= 1000) {
			double num[2] = { 0, 0 }, den = 0;

			for (int ef = 0; ef < 2; ef++) {
				double *acc = calloc(n, sizeof(double));
				fr_coll_opts_t o;

				fr_coll_opts_init(&o);
				o.compress = FR_COMPRESS_INT8;
				o.residual = ef ? res : NULL;
				memset(res, 0, n * sizeof(float));
				for (int it = 0; it < 40; it++) {
					for (size_t i = 0; i < n; i++)
						out[i] = (float)comp_input(rank, i, 0);
					CHECK(!fr_allreduce_ex(comm, FR_IN_PLACE,
							       out, n, FR_F32,
							       FR_SUM, &o),
					      "ef step");
					for (size_t i = 0; i < n; i++)
						acc[i] += out[i];
				}
				for (size_t i = 0; i < n; i++) {
					double e = 0;

					for (int r = 0; r < nranks; r++)
						e += (float)comp_input(r, i, 0);
					num[ef] += (acc[i] / 40 - e) *
						   (acc[i] / 40 - e);
					if (!ef)
						den += e * e;
				}
				free(acc);
			}
			CHECK(nranks == 1 || sqrt(num[1] / den) < 0.25 * sqrt(num[0] / den),
			      "error feedback n=%zu: mean error %.3g with vs %.3g without",
			      n, sqrt(num[1] / den), sqrt(num[0] / den));
		}
		free(res);
		free(out);
		free(in);
	}
	/* bad arguments are refused, not run */
	{
		fr_coll_opts_t o;
		double d = 1;
		float f = 1, r = 0;

		fr_coll_opts_init(&o);
		o.compress = FR_COMPRESS_BF16;
		CHECK(fr_allreduce_ex(comm, FR_IN_PLACE, &d, 1, FR_F64, FR_SUM,
				      &o) == FR_EINVAL, "compress f64 refused");
		o.compress = 99;
		CHECK(fr_allreduce_ex(comm, FR_IN_PLACE, &f, 1, FR_F32, FR_SUM,
				      &o) == FR_EINVAL, "bad format refused");
		o.compress = FR_COMPRESS_NONE;
		o.residual = &r;
		CHECK(fr_allreduce_ex(comm, FR_IN_PLACE, &f, 1, FR_F32, FR_SUM,
				      &o) == FR_EINVAL, "residual without compression");
		o.size = 0;
		CHECK(fr_allreduce_ex(comm, FR_IN_PLACE, &f, 1, FR_F32, FR_SUM,
				      &o) == FR_EINVAL, "unset opts size");
	}
	return failed;
}

/*
 * A burst of nonblocking All-Reduces of alternating sizes, all outstanding
 * at once, one rank starting each round late (so that its predecessor
 * writes the next collective's segments before it starts), every result
 * against the ring's reference and the same on all ranks.  With many
 * ranks and small segments the sizes take different layouts of the ring's
 * staging (ring.c: the window in bytes), which then change mid-burst.
 * Run with FR_ALGO=ring; --iters rounds.
 */
static int run_windows(fr_comm_t *comm, const char *counts_s, int iters)
{
	long def[] = {65537, 1, 7919, 0, 65537, 3, 1048577, 2}, counts[16];
	int ncounts = counts_s ? parse_list(counts_s, counts, 16) : 8;
	fr_request_t *req[16];
	float *buf[16];
	int bad = 0;

	if (!counts_s)
		memcpy(counts, def, sizeof(def));
	for (int i = 0; i < ncounts; i++)
		buf[i] = malloc(((size_t)counts[i] + 1) * sizeof(float));
	for (int it = 0; it < iters; it++) {
		int late = it % nranks;

		if (rank == late)
			usleep(20000);
		for (int i = 0; i < ncounts; i++) {
			uint32_t seed = (uint32_t)(it * 31 + i);
			int rc;

			fill(FR_F32, FR_SUM, buf[i], (size_t)counts[i], rank,
			     seed);
			rc = fr_iallreduce(comm, FR_IN_PLACE, buf[i],
					   (size_t)counts[i], FR_F32, FR_SUM,
					   &req[i]);
			CHECK(rc == 0, "round %d: fr_iallreduce of %ld: %s: %s",
			      it, counts[i], fr_strerror(rc),
			      fr_comm_last_error(comm));
			if (rc)
				goto out;
		}
		for (int i = 0; i < ncounts; i++) {
			int rc = fr_wait(&req[i]);

			CHECK(rc == 0, "round %d: fr_wait of %ld: %s: %s", it,
			      counts[i], fr_strerror(rc),
			      fr_comm_last_error(comm));
			if (rc)
				goto out;
		}
		for (int i = 0; i < ncounts; i++) {
			uint32_t seed = (uint32_t)(it * 31 + i);
			size_t count = (size_t)counts[i];

			for (size_t e = 0; e < count && !bad; e++) {
				float want;

				expect_elem(FR_F32, FR_SUM, count, e, seed,
					    &want);
				if (memcmp(&want, &buf[i][e], sizeof(want))) {
					bad = 1;
					CHECK(0,
					      "round %d count %zu: element %zu is %g, the ring gives %g",
					      it, count, e, (double)buf[i][e],
					      (double)want);
				}
			}
			CHECK(all_same(comm, hash_bytes(buf[i], count * 4)),
			      "round %d count %zu: ranks differ", it, count);
		}
		CHECK(all_ok(comm, bad),
		      "round %d: a wrong element on some rank", it);
		if (bad)
			break;
	}
out:
	for (int i = 0; i < ncounts; i++)
		free(buf[i]);
	return failed;
}

/*
 * Gradient buckets: ranks mark layer ranges in different orders (each
 * rank its own shuffle), some never marked; after fr_buckets_wait every
 * element is the sum over ranks and all ranks agree, step after step.
 */
static int run_buckets(fr_comm_t *comm, size_t count, int iters)
{
	fr_buckets_config_t cfg;
	fr_buckets_t *b;
	int32_t *g = malloc(count * sizeof(*g));
	size_t layers = 37, per = count / layers + 1;
	size_t order[64];
	int rc;

	fr_buckets_config_init(&cfg);
	cfg.bucket_bytes = count; /* about 4 buckets */
	cfg.first_bucket_bytes = count / 8 + 4;
	rc = fr_buckets_create(comm, g, count, FR_I32, FR_SUM, &cfg, &b);
	CHECK(rc == 0, "fr_buckets_create: %s", fr_strerror(rc));
	if (rc)
		return failed;
	CHECK(fr_buckets_count(b) >= 2, "several buckets (%d)",
	      fr_buckets_count(b));
	for (int it = 0; it < iters; it++) {
		int bad = 0;

		for (size_t i = 0; i < count; i++)
			g[i] = (int32_t)(mix((uint64_t)rank << 32 ^ i ^ (uint64_t)it << 50) & 0xffff);
		for (size_t l = 0; l < layers; l++)
			order[l] = l;
		for (size_t l = layers - 1; l > 0; l--) {
			size_t j = mix((uint64_t)rank * 131 + l + (uint64_t)it * 7) % (l + 1), t = order[l];

			order[l] = order[j];
			order[j] = t;
		}
		for (size_t k = 0; k < layers; k++) {
			size_t lo = order[k] * per, n;

			if (lo >= count || order[k] == 5) /* layer 5: unmarked */
				continue;
			n = lo + per > count ? count - lo : per;
			rc = fr_buckets_ready(b, lo, n);
			CHECK(rc == 0, "fr_buckets_ready(%zu, %zu): %s", lo, n,
			      fr_strerror(rc));
			if (k == 3)
				CHECK(fr_buckets_ready(b, lo, 1) == FR_EINVAL,
				      "marking twice is refused");
		}
		rc = fr_buckets_wait(b);
		CHECK(rc == 0, "fr_buckets_wait: %s: %s", fr_strerror(rc),
		      fr_comm_last_error(comm));
		for (size_t i = 0; i < count; i++) {
			int32_t e = 0;

			for (int r = 0; r < nranks; r++)
				e += (int32_t)(mix((uint64_t)r << 32 ^ i ^ (uint64_t)it << 50) & 0xffff);
			bad += g[i] != e;
		}
		CHECK(bad == 0, "buckets step %d: %d wrong elements", it, bad);
	}
	CHECK(fr_buckets_ready(b, count, 1) == FR_EINVAL, "out of range refused");
	fr_buckets_wait(b);
	CHECK(fr_buckets_destroy(b) == 0, "fr_buckets_destroy");
	free(g);
	return failed;
}

/*
 * The thread-safety contract: while this thread runs collectives, another
 * one shares the communicator (statistics, registrations, progress).
 * Under ThreadSanitizer this is the test of the lock.
 */
struct side {
	fr_comm_t *comm;
	atomic_int stop;
	int errors;
};

static void *side_main(void *arg)
{
	struct side *sd = arg;
	static char buf[4096];

	while (!atomic_load(&sd->stop)) {
		fr_stats_t st = { .size = sizeof(st) };
		fr_mem_t *m;

		sd->errors += fr_comm_stats(sd->comm, &st) != 0;
		if (fr_mem_register(sd->comm, buf, sizeof(buf), &m) == 0)
			sd->errors += fr_mem_deregister(m) != 0;
		else
			sd->errors++;
		fr_progress(sd->comm);
	}
	return NULL;
}

static int run_threads(fr_comm_t *comm, int iters, size_t count)
{
	struct side sd = { .comm = comm };
	int32_t *v = malloc(count * sizeof(*v));
	pthread_t t;
	int bad = 0;

	atomic_init(&sd.stop, 0);
	CHECK(pthread_create(&t, NULL, side_main, &sd) == 0, "pthread_create");
	for (int it = 0; it < iters; it++) {
		fr_request_t *req;
		int done = 0, rc;

		for (size_t i = 0; i < count; i++)
			v[i] = rank + (int32_t)i + it;
		rc = fr_iallreduce(comm, FR_IN_PLACE, v, count, FR_I32, FR_SUM,
				   &req);
		while (!rc && !done)
			rc = fr_test(&req, &done);
		CHECK(rc == 0, "threads iteration %d: %s", it, fr_strerror(rc));
		for (size_t i = 0; i < count; i++)
			bad += v[i] != nranks * ((int32_t)i + it) +
					       nranks * (nranks - 1) / 2;
	}
	atomic_store(&sd.stop, 1);
	pthread_join(t, NULL);
	CHECK(bad == 0, "threads: %d wrong elements", bad);
	CHECK(sd.errors == 0, "threads: %d errors in the side thread",
	      sd.errors);
	free(v);
	return failed;
}

/* ---- affinity: where the progress thread runs -------------------------------- */

static cpu_set_t cpus_before; /* the main thread's, before fr_comm_create */

/* A task's Cpus_allowed_list ("" if unreadable). */
static void task_cpus(const char *task, char *buf, size_t len)
{
	char path[300], line[512];
	FILE *f;

	buf[0] = '\0';
	snprintf(path, sizeof(path), "/proc/self/task/%s/status", task);
	f = fopen(path, "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Cpus_allowed_list: %511s", line) == 1) {
			snprintf(buf, len, "%s", line);
			break;
		}
	fclose(f);
}

/* "0-3,8" as /proc writes it */
static void cpus_format(const cpu_set_t *set, char *buf, size_t len)
{
	size_t n = 0;

	buf[0] = '\0';
	for (int a = 0; a < CPU_SETSIZE && n < len; a++) {
		int b = a;

		if (!CPU_ISSET(a, set))
			continue;
		while (b + 1 < CPU_SETSIZE && CPU_ISSET(b + 1, set))
			b++;
		n += (size_t)snprintf(buf + n, len - n, b > a ? "%s%d-%d" : "%s%d",
				      n ? "," : "", a, b);
		a = b;
	}
}

static void run_affinity(fr_comm_t *comm, const char *expect)
{
	char pt[512] = "", main_now[512], main_before[512], name[64],
	     path[300];
	struct dirent *e;
	int nthreads = 0;
	DIR *d = opendir("/proc/self/task");
	int32_t v = rank + 1;

	CHECK(d != NULL, "opendir /proc/self/task");
	while (d && (e = readdir(d))) {
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm",
			 e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(name, sizeof(name), f) &&
		    !strcmp(name, "fr_progress\n")) {
			nthreads++;
			task_cpus(e->d_name, pt, sizeof(pt));
		}
		fclose(f);
	}
	if (d)
		closedir(d);
	/* one rank has no progress thread */
	CHECK(nthreads == (nranks > 1 ? 1 : 0),
	      "%d threads named fr_progress (FR_PROGRESS=thread?)", nthreads);
	snprintf(path, sizeof(path), "%d", (int)getpid());
	task_cpus(path, main_now, sizeof(main_now));
	cpus_format(&cpus_before, main_before, sizeof(main_before));
	CHECK(!strcmp(main_now, main_before),
	      "the main thread moved from CPUs %s to %s", main_before,
	      main_now);
	if (nthreads == 1) {
		printf("rank %d: progress thread runs on CPUs %s (main thread %s)\n",
		       rank, pt, main_now);
		if (expect && !strcmp(expect, "main"))
			expect = main_now;
		CHECK(!expect || !strcmp(pt, expect),
		      "progress thread on CPUs %s, want %s", pt, expect);
	}
	/* and it progresses */
	CHECK(fr_allreduce(comm, FR_IN_PLACE, &v, 1, FR_I32, FR_SUM) == 0 &&
		      v == nranks * (nranks + 1) / 2,
	      "All-Reduce with the progress thread: %d", (int)v);
}

/* Put this rank (FR_RANK) on an emulated node of k (FR_NODE, read at the
 * rendezvous): node r / k, or r % k dealt round robin.  -1 if impossible. */
static int emulate_node(int k, bool round_robin)
{
	const char *r = getenv("FR_RANK");
	char node[32];

	if (!r || k < 1)
		return -1;
	snprintf(node, sizeof(node), "node%d",
		 round_robin ? atoi(r) % k : atoi(r) / k);
	return setenv("FR_NODE", node, 1);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"counts", required_argument, 0, 'c'},
		{"dtypes", required_argument, 0, 'd'},
		{"ops", required_argument, 0, 'o'},
		{"iters", required_argument, 0, 'n'},
		{"count", required_argument, 0, 'C'},
		{"victim", required_argument, 0, 'v'},
		{"at", required_argument, 0, 'a'},
		{"how", required_argument, 0, 'h'},
		{"what", required_argument, 0, 'w'},
		{"ranks-per-node", required_argument, 0, 'N'},
		{"round-robin-nodes", required_argument, 0, 'R'},
		{"node-map", required_argument, 0, 'M'},
		{"late-ms", required_argument, 0, 'L'},
		{"jitter-us", required_argument, 0, 'J'},
		{"expect", required_argument, 0, 'E'},
		{"scales", no_argument, 0, 'S'},
		{0, 0, 0, 0}};
	const char *counts = NULL, *dtypes = NULL, *ops = NULL, *how = "kill",
		   *what = "count", *expect = NULL;
	int iters = 1000, victim = 1, at = 3, c;
	long late_ms = 5000, jitter_us = 0;

	size_t count = 4099;
	fr_comm_t *comm;
	int rc;

	/* line by line: a rank that frrun stops after another's failure
	 * still leaves what it printed */
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc < 2) {
		fprintf(stderr, "usage: %s matrix|colls|bigexit|regonce|die|late|toolate|faults|fdhog|mismatch|threads|compress|buckets|affinity [options]\n",
			argv[0]);
		return 2;
	}
	optind = 2;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'c': counts = optarg; break;
		case 'd': dtypes = optarg; break;
		case 'o': ops = optarg; break;
		case 'n': iters = atoi(optarg); break;
		case 'C': count = (size_t)atol(optarg); break;
		case 'v': victim = atoi(optarg); break;
		case 'a': at = atoi(optarg); break;
		case 'h': how = optarg; break;
		case 'w': what = optarg; break;
		case 'L': late_ms = atol(optarg); break;
		case 'J': jitter_us = atol(optarg); break;
		case 'E': expect = optarg; break;
		case 'S':
			mixed_scales = true;
			break;
		case 'N':
			/* nodes of K ranks: rank r is on node r / K */
			rpn = atoi(optarg);
			if (emulate_node(rpn, false))
				return 2;
			break;
		case 'R':
			/* M nodes dealt round robin: rank r on node r % M */
			rr_nodes = atoi(optarg);
			if (emulate_node(rr_nodes, true))
				return 2;
			break;
		case 'M': {
			/* rank r on node map[r] */
			long v[64];
			const char *r = getenv("FR_RANK");
			char node[32];

			node_map_n = parse_list(optarg, v, 64);
			for (int i = 0; i < node_map_n; i++)
				node_map[i] = (int)v[i];
			if (!r || atoi(r) < 0 || atoi(r) >= node_map_n)
				return 2;
			snprintf(node, sizeof(node), "node%d", node_map[atoi(r)]);
			if (setenv("FR_NODE", node, 1))
				return 2;
			break;
		}
		default: return 2;
		}
	}
	if (sched_getaffinity(0, sizeof(cpus_before), &cpus_before))
		CPU_ZERO(&cpus_before);
	/* mismatch --what ll: the victim alone turns the small messages'
	 * paths off (FR_LL=0), which decide the small All-Reduce's schedule
	 * over shared memory: the rendezvous refuses it */
	if (!strcmp(argv[1], "mismatch") && what && !strcmp(what, "ll") &&
	    getenv("FR_RANK") && atoi(getenv("FR_RANK")) == victim &&
	    setenv("FR_LL", "0", 1))
		return 2;
	rc = fr_comm_create_from_env(NULL, &comm);
	if (rc) {
		fprintf(stderr, "fr_comm_create_from_env: %s: %s\n",
			fr_strerror(rc), fr_comm_last_error(NULL));
		return 1;
	}
	rank = fr_comm_rank(comm);
	nranks = fr_comm_size(comm);
	if (!strcmp(argv[1], "matrix"))
		run_matrix(comm, counts, dtypes, ops);
	else if (!strcmp(argv[1], "regonce"))
		run_regonce(comm, iters, count);
	else if (!strcmp(argv[1], "die"))
		run_die(comm, victim, at, how);
	else if (!strcmp(argv[1], "bigexit"))
		run_bigexit(comm, count);
	else if (!strcmp(argv[1], "colls"))
		run_colls(comm, counts);
	else if (!strcmp(argv[1], "late") || !strcmp(argv[1], "toolate"))
		run_late(comm, victim, at, late_ms, !strcmp(argv[1], "toolate"));
	else if (!strcmp(argv[1], "faults"))
		run_faults(comm, iters, jitter_us);
	else if (!strcmp(argv[1], "fdhog"))
		run_fdhog(comm, victim, what);
	else if (!strcmp(argv[1], "mismatch"))
		run_mismatch(comm, victim, what, counts);
	else if (!strcmp(argv[1], "threads"))
		run_threads(comm, iters > 300 ? 300 : iters, count);
	else if (!strcmp(argv[1], "compress"))
		run_compress(comm, counts);
	else if (!strcmp(argv[1], "windows"))
		run_windows(comm, counts, iters > 50 ? 20 : iters);
	else if (!strcmp(argv[1], "buckets"))
		run_buckets(comm, count, iters > 50 ? 10 : iters);
	else if (!strcmp(argv[1], "affinity"))
		run_affinity(comm, expect);
	else
		CHECK(0, "unknown mode %s", argv[1]);
	fr_comm_destroy(comm);
	if (rank == 0 || failed)
		printf("rank %d: %s over %d ranks: %d passed, %d failed\n", rank,
		       argv[1], nranks, passed, failed);
	return failed ? 1 : 0;
}
