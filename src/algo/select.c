/* SPDX-License-Identifier: MIT */
/*
 * select.c - which algorithm runs: FR_ALGO, else an alpha-beta-gamma model.
 *
 * Every rank must run the same algorithm for the same call, so the choice
 * depends only on what all ranks agree on: the collective, its byte count,
 * the dtype, the number of ranks and the model parameters, which come from
 * the same tune file or the same built-in defaults (the rendezvous compares
 * a hash of them, so ranks that disagree fail at fr_comm_create).
 *
 * Model (p ranks, n bytes, pof2 / L = largest power of two <= p and its
 * log, f = 1 if p is not a power of two; alpha per message step, beta per
 * byte on the wire, c per byte copied through a mailbox, gamma per byte
 * reduced):
 *   ring All-Reduce       (2(p-1) + 1) alpha + 2(p-1)/p n beta + (p-1)/p n
 * gamma recursive doubling    (L + 2f) alpha + (L + 2f) n (beta + c) + (L + f)
 * n gamma Rabenseifner          (2L + 2f) alpha + (2(pof2-1)/pof2 + 2f) n (beta
 * + c)
 *                         + ((pof2-1)/pof2 + f) n gamma
 *   ring RS / AG          p alpha + (p-1)/p N beta (+ (p-1)/p N gamma for RS)
 *                         (N: all n blocks; over several nodes, see
 *                         hier_rsag_us below for the link's share and the
 *                         hierarchical RS / AG)
 *   broadcast tree        ceil(lg p) (alpha + n (beta + c))
 *   broadcast chain       (p - 2 + k)(alpha + s (beta + c)), k = n / s >= 1
 *                         fragments of s bytes (a mailbox slot)
 *   one-shot over lines   line + (p-1)((n + 16) c + n gamma) (All-Reduce,
 *                         reduce), line + (p-1)(n + 16) c (broadcast),
 *                         line (barrier); one node, a line's worth
 *                         (fr_model_ll_us)
 * The ring's extra alpha is its READY exchange; the mailbox algorithms pay
 * c for the copies that the zero-copy ring does not make.  Their bytes to
 * one peer also move no faster than the mailbox's window (mbx_stream_us):
 * where the text says m (beta + c) for m bytes to one peer, read
 * max(m (beta + c), (m / W - 1) 2 alpha).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algo.h"
#include "internal.h"
#include "log.h"
#include "peer.h"
#include "util.h"

/* ---- parameters ------------------------------------------------------------
 */

static void tune_defaults(struct fr_tune *t, const char *transport)
{
	/* the mixed transports go by their network side */
	bool verbs = strstr(transport, "verbs") != NULL;
	bool shm = !strcmp(transport, "shm");

	/* TCP: a round trip through the kernel and epoll, and 2 ns/B: between
	 * 1 and 10 GbE once the CPU's copies count; verbs: a 100 Gbit/s HCA;
	 * shm: a cache line through a shared ring, one memcpy per byte.
	 * fr_tune(1) measures the real ones. */
	t->alpha_us = verbs ? 5.0 : shm ? 2.0 : 25.0;
	t->beta_ns = verbs ? 0.08 : shm ? 0.15 : 2.0;
	t->copy_ns = 0.15;
	t->local_alpha_us = t->local_beta_ns = 0;
	t->msg_us = FR_MSG_PER_ALPHA * t->alpha_us;
	/* lines are shared memory's whatever the transport's name (the
	 * mixed ones forward them to their shm side): 8 bytes at n = 2
	 * took 0.28 us here (perf/bench/README.md) */
	t->line_us = FR_LINE_US;
	for (int d = 0; d < FR_DTYPE_COUNT; d++)
		t->gamma_ns[d] = 0.15;
	t->gamma_ns[FR_F16] = t->gamma_ns[FR_BF16] = 0.3;
	t->step_ramp = verbs || shm ? 0 : FR_TCP_STEP_RAMP;
	memset(t->grid_beta_ns, 0, sizeof(t->grid_beta_ns));
	snprintf(t->source, sizeof(t->source), "built-in defaults for %s",
		 transport);
}

static int parse_double(const char *s, double *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < 0)
		return FR_EINVAL;
	*out = v;
	return 0;
}

/*
 * The tune file (fr_tune(1) writes it; fastreduce(7) documents it): lines
 * "key = value", '#' comments.  Keys: <transport>.alpha_us,
 * <transport>.beta_ns, <transport>.copy_ns, <transport>.msg_us,
 * <transport>.local_alpha_us, <transport>.local_beta_ns (0: unset),
 * <transport>.step_ramp, <transport>.line_us,
 * <transport>.grid_beta_ns.<d> (1 to FR_TOPO_MAX_DIMS - 1),
 * gamma_ns.<dtype>.  Keys for
 * other transports are skipped; unknown keys are warned about.
 */
int fr_tune_load(struct fr_tune *t, const char *transport, char *err,
		 size_t errlen)
{
	const char *path = getenv("FR_TUNE_FILE");
	char line[256];
	int lineno = 0;
	bool msg_set = false;
	FILE *f;

	tune_defaults(t, transport);
	if (!path || !*path)
		return 0;
	f = fopen(path, "r");
	if (!f) {
		snprintf(err, errlen, "FR_TUNE_FILE %s: %s", path,
			 strerror(errno));
		return FR_EINVAL;
	}
	while (fgets(line, sizeof(line), f)) {
		char key[128], val[64], *hash = strchr(line, '#');
		size_t tl = strlen(transport);
		double v;
		fr_dtype_t dt;
		int end = -1;

		lineno++;
		if (hash)
			*hash = '\0';
		if (sscanf(line, " %127[^= \t] = %63s %n", key, val, &end) !=
			    2 ||
		    end < 0 || line[end]) {
			if (strspn(line, " \t\r\n") != strlen(line))
				goto bad;
			continue;
		}
		if (parse_double(val, &v))
			goto bad;
		if (!strncmp(key, "gamma_ns.", 9)) {
			if (fr_dtype_from_name(key + 9, &dt))
				goto bad;
			t->gamma_ns[dt] = v;
		} else if (!strncmp(key, transport, tl) && key[tl] == '.') {
			if (!strcmp(key + tl + 1, "alpha_us"))
				t->alpha_us = v;
			else if (!strcmp(key + tl + 1, "beta_ns"))
				t->beta_ns = v;
			else if (!strcmp(key + tl + 1, "copy_ns"))
				t->copy_ns = v;
			else if (!strcmp(key + tl + 1, "local_alpha_us"))
				t->local_alpha_us = v;
			else if (!strcmp(key + tl + 1, "local_beta_ns"))
				t->local_beta_ns = v;
			else if (!strcmp(key + tl + 1, "msg_us"))
				t->msg_us = v, msg_set = true;
			else if (!strcmp(key + tl + 1, "step_ramp"))
				t->step_ramp = v;
			else if (!strcmp(key + tl + 1, "line_us"))
				t->line_us = v;
			else if (!strncmp(key + tl + 1, "grid_beta_ns.", 13) &&
				 key[tl + 14] >= '1' &&
				 key[tl + 14] < '0' + FR_TOPO_MAX_DIMS &&
				 !key[tl + 15])
				t->grid_beta_ns[key[tl + 14] - '0'] = v;
			else
				fr_warn("%s:%d: unknown key %s", path, lineno,
					key);
		} else if (!strchr(key, '.')) {
			fr_warn("%s:%d: unknown key %s", path, lineno, key);
		}
	}
	fclose(f);
	/* an older file has no msg_us: as the built-in one, from its alpha */
	if (!msg_set)
		t->msg_us = FR_MSG_PER_ALPHA * t->alpha_us;
	snprintf(t->source, sizeof(t->source), "%s", path);
	return 0;
bad:
	fclose(f);
	snprintf(
		err, errlen,
		"FR_TUNE_FILE %s:%d: expected \"key = value\" with a number >= 0",
		path, lineno);
	return FR_EINVAL;
}

/*
 * More ranks than CPUs on a node: a message step then also waits until
 * the peer it needs gets a CPU, a share of a scheduler slice on top of the
 * wire.  Measured here over shm, 4 ranks on 2 CPUs: about 20 us per ring
 * step, against 2 us with a CPU each, so recursive doubling's 2 steps beat
 * the ring's 6 at 64 KiB (74 against 120 us) where the plain model picks
 * the ring.  alpha grows by FR_OVERSUB_ALPHA_US per extra rank per CPU on
 * the busiest node (comm->oversub, the same on every rank: it comes from
 * the cards).  Built-in defaults only: fr_tune(1) measures alpha on the
 * running job, oversubscription included.  Called after the rendezvous,
 * so the hash compared there is of the defaults, equal on all ranks.
 */
#define FR_OVERSUB_ALPHA_US 20.0

/* The parameters changed: fr_algo_select chooses afresh. */
static void memo_forget(struct fr_comm *comm)
{
	memset(comm->algo.memo, 0, sizeof(comm->algo.memo));
}

void fr_tune_oversub(struct fr_comm *comm)
{
	struct fr_tune *t = &comm->algo.tune;
	double add;

	if (comm->topo.oversub <= 1.0 || strncmp(t->source, "built-in", 8))
		return;
	add = FR_OVERSUB_ALPHA_US * (comm->topo.oversub - 1.0);
	memo_forget(comm);
	t->alpha_us += add;
	t->msg_us += FR_MSG_PER_ALPHA * add;
	/* a line waits for its peers to get a CPU as a step does */
	t->line_us += add;
	fr_info("model: %.2f ranks per CPU on the busiest node: alpha %.1f us (+%.1f)",
		comm->topo.oversub, t->alpha_us, add);
}

/*
 * A long link: the built-in alpha is the software's part of a message
 * step, which on a LAN is nearly all of it.  Where the network's own
 * latency is long (a WAN, an emulated delay), every step also waits that
 * out, and the choice must know: at 1 ms one way and 4 ranks the one-shot
 * All-Reduce takes 1.26 ms where recursive doubling takes 4.4.  Each rank
 * timed its TCP handshake with rank 0 at the rendezvous (one round trip)
 * and put it in its card; half the shortest of those from another node
 * than rank 0's (comm->topo.rtt_us, the same on every rank), less
 * FR_LONG_LINK_US that a LAN's handshake may take, is added to alpha, not
 * to msg (a rank's own work per message).  Built-in
 * parameters only, and not for shared memory, whose steps never cross
 * the network.
 */
#define FR_LONG_LINK_US 100.0

void fr_tune_link(struct fr_comm *comm)
{
	struct fr_tune *t = &comm->algo.tune;
	double add = comm->topo.rtt_us / 2.0 - FR_LONG_LINK_US;

	if (add <= 0 || strncmp(t->source, "built-in", 8) ||
	    !strcmp(comm->tp_ops->name, "shm"))
		return;
	memo_forget(comm);
	t->alpha_us += add;
	fr_info("model: rendezvous round trip %u us: a long link: alpha %.1f us (+%.1f)",
		comm->topo.rtt_us, t->alpha_us, add);
}

uint32_t fr_tune_hash(const struct fr_tune *t)
{
	/* the exact doubles the model uses: a file differing in the 10th
	 * digit may tip a choice at a crossover */
	double v[8 + FR_DTYPE_COUNT + FR_TOPO_MAX_DIMS] = {
		t->alpha_us,	   t->beta_ns,	     t->copy_ns,   t->msg_us,
		t->local_alpha_us, t->local_beta_ns, t->step_ramp, t->line_us};
	const unsigned char *p = (const unsigned char *)v;
	uint32_t h = 2166136261u;

	memcpy(v + 8, t->gamma_ns, sizeof(t->gamma_ns));
	memcpy(v + 8 + FR_DTYPE_COUNT, t->grid_beta_ns,
	       sizeof(t->grid_beta_ns));
	for (size_t i = 0; i < sizeof(v); i++) {
		h ^= p[i];
		h *= 16777619u;
	}
	return h;
}

/* ---- the model
 * --------------------------------------------------------------- */

/*
 * m bytes streamed to one peer through its mailbox (us): the wire and the
 * copies, bc a byte, or the window's time, whichever is longer.  A sender
 * has FR_MBX_SLOTS slots of payload_max bytes at a peer, and a slot is its
 * again only when the receiver's credit comes back, a round trip (2
 * alpha) after the message left (peer.h: the credits); so the first W =
 * slots x payload bytes go at once and each W after them a round trip
 * later.  Where latency times bandwidth is larger than W (a fast link that
 * is also long, or a big job's small slots: 32 MiB of mailbox over 1,024
 * ranks leaves slots of 3 KiB), the window is the limit.  fr_sim, running
 * the schedules over such links, found it: 25 MiB on 64 ranks at 384
 * Gbit/s and 73 us took Rabenseifner 29.6 ms, at the window's rate, where
 * the model without it said 2.5 ms and chose it over the ring's 10.9 ms
 * (perf/sim/README.md).  payload_max 0: unknown, no window.
 */
static double mbx_stream_us(double a, double bc, size_t payload_max, double m)
{
	double w = (double)FR_MBX_SLOTS * (double)payload_max, t = m * bc;

	if (w > 0 && m > w)
		t = fmax(t, (m / w - 1) * 2 * a);
	return t;
}

/*
 * A hypercube step of m bytes to one peer (one of Rabenseifner's, or the
 * fold and unfold that make p a power of two) over a link of b a byte:
 * the mailbox's stream, or from fr_zx_min() bytes up zero copy (xfer.c),
 * the READY's latency and the wire, no copy and no window.
 */
static double zx_step_us(double a, double b, double c, size_t payload_max,
			 double m)
{
	if (payload_max && m >= (double)fr_zx_min(payload_max))
		return a + m * b;
	return mbx_stream_us(a, b + c, payload_max, m);
}

/*
 * A step's fresh stream.  Each of Rabenseifner's steps writes to a new
 * partner over a connection that has been idle since the last call; the
 * ring's two connections stream from its first step to its last, the
 * slots taking up any rank's moment of lateness.  Over TCP a step's
 * stream starts cold (the congestion window after idle) and, behind a
 * deep buffer, its acknowledgements queue behind the partner's own
 * stream, and its partner must also have finished the step before: the
 * bytes being equal, Rabenseifner lost to the ring at every size from
 * 256 KiB to 64 MiB.  Measured between network namespaces at 1 Gbit/s
 * with a tbf queue of 50 ms (perf/bench/compare.sh, FR_ALGO forced, two
 * jobs each, median ms), 8 ranks: 4 MiB ring 64.4 and 65.1, Rabenseifner
 * 72.6 and 66.1; 16 MiB 252.2 and 251.2 against 271.1 and 262.9; 64 MiB
 * 990.9 and 995.3 against 1,016.9 and 1,034.8; 4 ranks, 64 MiB 847.3
 * and 849.5 against 856.7 and 859.3.  That is 1 to 8 per cent of the
 * wire's time; with a queue of 2 ms, 0 to 3.  The model charged both the
 * same bytes and chose Rabenseifner on 8 ranks for its 3 fewer latencies
 * (75 us).  Each step crossing the network now costs FR_TCP_STEP_RAMP of
 * its wire time more over TCP (the built-in parameters; fr_tune measures
 * it, Rabenseifner against the ring on 8 MiB, and its file's
 * transport.step_ramp sets it); shared memory and verbs keep 0, where no
 * such loss was measured.  A step of Rabenseifner's (or its fold) of m
 * bytes over a link of b a byte: zx_step_us and the ramp on its wire.
 */
static double rab_step_us(const struct fr_tune *t, double a, double b, double c,
			  size_t payload_max, double m)
{
	return zx_step_us(a, b, c, payload_max, m) + t->step_ramp * m * b;
}

/* Can the hierarchical All-Reduce, reduce-scatter and all-gather run here
 * (hier.c, hier_rsag.c)? */
static bool hier_ok(const struct fr_comm *comm)
{
	return comm->topo.nodes_regular && comm->topo.nnodes > 1 &&
	       comm->topo.nlocal > 1 && comm->topo.nnodes <= 1024 &&
	       comm->topo.nlocal <= 1024;
}

/*
 * The hierarchical All-Reduce's ring steps above the node: m - 1 over all
 * the nodes, or with a grid of them (FR_TOPO) d - 1 for each dimension d
 * (hier.c).  Either way the node's link carries 2 (m-1)/m of the vector:
 * each level above sends 2 (d-1)/d of the part it works on, and those
 * parts shrink by d as they go up, which sums to the same.
 */
static double hier_net_steps(const struct fr_comm *comm)
{
	double steps = 0;

	if (!comm->topo.nlevels)
		return comm->topo.nnodes - 1;
	for (int l = 0; l < comm->topo.nlevels; l++)
		steps += comm->topo.nlevel[l] - 1;
	return steps;
}

/*
 * The hypercube steps (recursive doubling, Rabenseifner; hcube.c) whose
 * pairs are all on one node: bit j when virtual ranks v and v ^ 2^j are
 * on the same node for every v.  Nodes of consecutive ranks, k of them a
 * power of two, keep the first lg k steps at home.
 */
static unsigned hc_local_dims(const struct fr_comm *comm)
{
	const int *node = comm->topo.node_of;
	struct fr_hcube h;
	unsigned mask;

	if (comm->algo.hc_local_known)
		return comm->algo.hc_local;
	fr_hcube_init(&h, 0, comm->nranks);
	mask = h.steps ? (1u << h.steps) - 1 : 0;
	if (!node)
		return 0;
	for (int v = 0; v < h.pof2 && mask; v++)
		for (int j = 0; j < h.steps; j++)
			if ((mask >> j & 1) &&
			    node[fr_hcube_real(&h, v)] !=
				    node[fr_hcube_real(&h, v ^ (1 << j))])
				mask &= ~(1u << j);
	return mask;
}

/*
 * The grid's links.  With FR_TOPO's grid holding the nodes (topo.nlevels
 * > 0: node = x0 + g0 x1 + g0 g1 x2 ..., fr_topo_levels) and the tune
 * file's <transport>.grid_beta_ns.<d>, dimension d >= 1 of the grid joins
 * groups of the first d dimensions' nodes (node / (g0 ... g(d-1))), each
 * through one uplink that its nodes share, at grid_beta_ns[d] a byte each
 * way.  Where such a link is slower than the node links below it, what an
 * algorithm sends across it decides: on 2 racks of 2 nodes of 2 ranks,
 * nodes at 10 Gbit/s and racks at 1 (perf/sim/README.md), the ring sends
 * 2 (p-1)/p of the vector through a rack's uplink, hier's grid 1, and the
 * model that knew one beta chose the ring, the slowest.  So each
 * algorithm's bytes through one uplink (the busiest) at its rate are a
 * floor under its link term:
 *   ring       2 (p-1)/p n: the ring takes the nodes in order, in and out
 *              of each group once;
 *   rd         g n at a step whose pairs are in different groups (g the
 *              group's ranks, all sending at once);
 *   rabenseifner  g n / 2^(j+1) at such a step j, twice;
 *   oneshot    g (p - g) n: each of the group's ranks to every other;
 *   hier       (g0 ... g(d-1)) sum over d' >= d of 2 (g(d')-1)/g(d')
 *              n / (g0 ... g(d'-1)): each node's share of every level at
 *              or above d.
 */

/* grid_beta_ns[d] in us a byte, or 0 where it does not apply */
static double grid_b(const struct fr_comm *comm, int d)
{
	const struct fr_tune *t = &comm->algo.tune;

	if (!comm->topo.nlevels || d < 1 || d >= comm->topo.ngrid ||
	    comm->topo.grid[d] < 2)
		return 0;
	return t->grid_beta_ns[d] * 1e-3;
}

/* nodes in a group of the first d dimensions */
static double grid_group_nodes(const struct fr_comm *comm, int d)
{
	double g = 1;

	for (int i = 0; i < d; i++)
		g *= comm->topo.grid[i];
	return g;
}

/* Do hypercube step j's pairs leave their group of dimension d? */
static bool hc_step_leaves(const struct fr_comm *comm, const struct fr_hcube *h,
			   int j, int d)
{
	const int *node = comm->topo.node_of;
	int g = (int)grid_group_nodes(comm, d);

	for (int v = 0; v < h->pof2; v++)
		if (node[fr_hcube_real(h, v)] / g !=
		    node[fr_hcube_real(h, v ^ (1 << j))] / g)
			return true;
	return false;
}

/* The slowest uplink's time (us) for hypercube step j, each of the
 * group's ranks sending m bytes across it; 0 if none is crossed. */
static double hc_grid_us(const struct fr_comm *comm, const struct fr_hcube *h,
			 int j, double m)
{
	double worst = 0;

	if (!comm->topo.node_of)
		return 0;
	for (int d = 1; d < comm->topo.ngrid; d++) {
		double b = grid_b(comm, d);

		if (b > 0 && hc_step_leaves(comm, h, j, d))
			worst = fmax(worst, comm->topo.nlocal *
						    grid_group_nodes(comm, d) *
						    m * b);
	}
	return worst;
}

/* The ring's: 2 (p-1)/p n through each uplink, as often as the ring's
 * order crosses between groups, per group (once, in the nodes' order;
 * more with FR_RING_ORDER=rank over ranks dealt round robin) */
static double ring_grid_us(const struct fr_comm *comm, double n)
{
	const int *node = comm->topo.node_of, *order = comm->topo.ring_order;
	double worst = 0, p = comm->nranks;

	for (int d = 1; d < comm->topo.ngrid; d++) {
		double b = grid_b(comm, d), g = grid_group_nodes(comm, d);
		double groups = comm->topo.nnodes / g, cross = groups;

		if (b <= 0)
			continue;
		if (node && order) {
			cross = 0;
			for (int i = 0; i < comm->nranks; i++)
				cross += node[order[i]] / (int)g !=
					 node[order[(i + 1) % comm->nranks]] /
						 (int)g;
		}
		worst = fmax(worst, cross / groups * 2 * (p - 1) / p * n * b);
	}
	return worst;
}

/* The one-shot's: each of a group's g ranks sends n to the p - g ranks
 * outside it */
static double oneshot_grid_us(const struct fr_comm *comm, double n)
{
	double worst = 0, p = comm->nranks;

	for (int d = 1; d < comm->topo.ngrid; d++) {
		double g = comm->topo.nlocal * grid_group_nodes(comm, d);

		worst = fmax(worst, g * (p - g) * n * grid_b(comm, d));
	}
	return worst;
}

/*
 * The double binary tree's busiest link (us): every edge of either tree
 * carries n/2 each way, so a node's link (d = 0, beta_ns) or a group's
 * uplink (grid_beta_ns[d]) carries n/2 for each edge that leaves it.
 * Counted on the trees themselves: consecutive ranks on a node keep the
 * lower edges at home, the higher ones cross.  0 on one node.
 */
static double tree_wire_us(const struct fr_comm *comm, double n)
{
	const int *node = comm->topo.node_of;
	int p = comm->nranks, nn = comm->topo.nnodes;
	double worst = 0;
	int *cross;

	if (!node || nn < 2)
		return 0;
	cross = malloc((size_t)nn * sizeof(*cross));
	if (!cross)
		return 0;
	for (int d = 0; d < FR_MAX(comm->topo.ngrid, 1); d++) {
		double b = d ? grid_b(comm, d) : comm->algo.tune.beta_ns * 1e-3;
		int g = d ? (int)grid_group_nodes(comm, d) : 1, most = 0;

		if (b <= 0)
			continue;
		memset(cross, 0, (size_t)nn * sizeof(*cross));
		for (int t = 0; t < 2; t++)
			for (int r = 0; r < p; r++) {
				int par, ch[2], nc;

				fr_dbtree_shape(p, r, t, &par, ch, &nc);
				if (par < 0 || node[r] / g == node[par] / g)
					continue;
				cross[node[r] / g]++;
				cross[node[par] / g]++;
			}
		for (int i = 0; i < nn; i++)
			most = FR_MAX(most, cross[i]);
		worst = fmax(worst, most * n / 2 * b);
	}
	free(cross);
	return worst;
}

/*
 * The grid's floors for the flat algorithms where they run without the
 * node-aware terms below (one rank per node): what each step's slowest
 * uplink takes beyond the wire time the flat model gave it (rd's and
 * Rabenseifner's steps, bc a byte), or the ring's.
 */
static double flat_grid_us(const struct fr_comm *comm, int id, double us,
			   double n)
{
	const struct fr_tune *t = &comm->algo.tune;
	double bc = (t->beta_ns + t->copy_ns) * 1e-3;
	struct fr_hcube h;

	if (us < 0 || !comm->topo.nlevels || !comm->topo.node_of)
		return us;
	if (id == FR_ALGO_RING) {
		double one = 2 * (comm->nranks - 1.0) / comm->nranks * n *
			     t->beta_ns * 1e-3;

		return us - one + fmax(one, ring_grid_us(comm, n));
	}
	if (id == FR_ALGO_ONESHOT)
		return us + fmax(0, oneshot_grid_us(comm, n) -
					    (comm->nranks - 1) * n * bc);
	/* the model's link term, 3 n beta, is 1.5 times the 2 n a rank
	 * sends (fr_sim): the busiest link's bytes count the same way */
	if (id == FR_ALGO_TREE)
		return us + fmax(0, 1.5 * tree_wire_us(comm, n) -
					    3 * n * t->beta_ns * 1e-3);
	if (id != FR_ALGO_RD && id != FR_ALGO_RABENSEIFNER)
		return us;
	fr_hcube_init(&h, 0, comm->nranks);
	for (int j = 0; j < h.steps; j++) {
		double m = id == FR_ALGO_RD ? n : n / (double)(2 << j);
		/* Rabenseifner's zero-copy steps copy nothing */
		double flat =
			id == FR_ALGO_RABENSEIFNER && fr_zx_use(comm, (size_t)m)
				? m * t->beta_ns * 1e-3
				: m * bc;

		us += (id == FR_ALGO_RD ? 1 : 2) *
		      fmax(0, hc_grid_us(comm, &h, j, m) - flat);
	}
	return us;
}

/* hier's on the grid: every level's share at or above d */
static double hier_grid_us(const struct fr_comm *comm, double n)
{
	double worst = 0;

	for (int d = 1; d < comm->topo.ngrid; d++) {
		double b = grid_b(comm, d), bytes = 0;

		if (b <= 0)
			continue;
		for (int e = d; e < comm->topo.ngrid; e++) {
			double ge = comm->topo.grid[e];

			bytes += 2 * (ge - 1) / ge * n /
				 grid_group_nodes(comm, e);
		}
		worst = fmax(worst, grid_group_nodes(comm, d) * bytes * b);
	}
	return worst;
}

/*
 * Bruck's reduce-scatter and all-gather on the grid (bruck_rsag.c): at the
 * step of distance D every rank r sends min(D, p - D) blocks to r + D
 * (the all-gather to r - D: the same count of pairs); the bytes that leave
 * the busiest group of dimension d's nodes, at its uplink's rate, summed
 * over the steps.
 */
static double bruck_grid_us(const struct fr_comm *comm, double n)
{
	const int *node = comm->topo.node_of;
	int p = comm->nranks;
	double worst = 0, blk = n / p;

	for (int d = 1; node && d < comm->topo.ngrid; d++) {
		double b = grid_b(comm, d), t = 0;
		int g = (int)grid_group_nodes(comm, d);
		int groups = comm->topo.nnodes / g;

		if (b <= 0 || groups < 2 || groups > 64)
			continue;
		for (int D = 1; D < p; D *= 2) {
			int out[64] = {0}, most = 0;

			for (int r = 0; r < p; r++)
				if (node[r] / g != node[(r + D) % p] / g)
					most = FR_MAX(most, ++out[node[r] / g]);
			t += most * FR_MIN(D, p - D) * blk * b;
		}
		worst = fmax(worst, t);
	}
	return worst;
}

/*
 * The node's own steps.  Where a message between two ranks of one node
 * costs less than one across the network, the tune file says so
 * (<transport>.local_alpha_us and local_beta_ns: the mixed transports'
 * shared memory; fr_sim sets them to its node's latency and copy), and the
 * steps that stay on the node cost that: Rabenseifner's and recursive
 * doubling's whose pairs share a node (hc_local_dims), hier's 2 (k-1)
 * within the node, and the ring's hops from a rank to the next on its node
 * (ring_path_us).  Unset (0, so a node's latency of exactly 0 cannot be
 * said), a step within the node costs alpha, and a byte of it the
 * mailbox's copy, as before.  rd and hier take the node's latency only
 * (their bytes stay as they were).
 */
/* the ring's hops differ: the node's cost is known, and some hops stay on
 * a node (ring_path_us) */
static bool ring_hops_differ(const struct fr_comm *comm)
{
	const struct fr_tune *t = &comm->algo.tune;

	return (t->local_alpha_us > 0 || t->local_beta_ns > 0) &&
	       (double)comm->topo.nnodes * comm->topo.ring_crossings <
		       comm->nranks;
}

static double local_a(const struct fr_tune *t)
{
	return t->local_alpha_us > 0 ? t->local_alpha_us : t->alpha_us;
}

/* a byte written within the node, us: unset, the mailbox's copy in (the
 * shared memory's write) that the steps within the node were charged */
static double local_b(const struct fr_tune *t)
{
	return (t->local_beta_ns > 0 ? t->local_beta_ns : t->copy_ns) * 1e-3;
}

/*
 * The ring's steps where its hops differ (ring_hops_differ): step s at a rank
 * waits for step s - 1 at the rank before it, so the steps (2 (p-1) for
 * All-Reduce, p - 1 for reduce-scatter and all-gather, of n/p bytes each)
 * walk back round the ring, and what they take adds up along it.  A fraction x
 * of its hops leave the node (nnodes ring_crossings / p), at alpha + sg
 * beta for a segment of sg bytes; the rest stay, at local_alpha + sg
 * local_beta.  A step's own bytes (n/p) also pass through its link one
 * after another, the ring_crossings of a node's ranks that leave it at
 * once: a step takes the longer of the two.  fr_sim on 1,024 ranks (128
 * nodes of 8, 2 us and 100 Gbit/s, 0.5 us and 200 within a node) ran it
 * in 1,407.6 us at 8 B, where 2 (p-1) alpha said 4,094, and 2,917.7 at 16
 * MiB, which this says to 0.1 %.  With one kind of hop the plain model
 * stands, latency and bytes added: fr_sim is nearer that than the longer
 * of the two there (25 MiB on 8 ranks, one a node, 384 Gbit/s and 73 us:
 * the ring 1,877.9 us, the sum 2,053, the longer 1,098).
 */
static double ring_path_us(const struct fr_comm *comm, double n, double steps)
{
	const struct fr_tune *t = &comm->algo.tune;
	double p = comm->nranks, s = n / p;
	double sg = fmin(s, (double)comm->algo.segment_bytes);
	/* below 1: ring_hops_differ */
	double x = comm->topo.nnodes * comm->topo.ring_crossings / p;
	double hop = x * (t->alpha_us + sg * t->beta_ns * 1e-3) +
		     (1 - x) * (local_a(t) + sg * local_b(t));
	double link = comm->topo.ring_crossings * s * t->beta_ns * 1e-3;

	return steps * fmax(hop, link);
}

/*
 * Reduce-scatter and all-gather of N bytes (all n blocks): the flat ring
 * sends (p-1)/p N over the link per ring crossing of our node; the
 * hierarchical ones (hier_rsag.c) send (m-1)/m N over it in m-1 steps (or
 * the sum of the grid's dimensions less one, hier_net_steps), spread over
 * the node's k ranks, after (before) (k-1)/k N within the node in k-1
 * steps, every byte copied in and out of the mailboxes and the node's own
 * traffic costing a copy too (as for the All-Reduce, below):
 *   hier RS/AG  (k-1 + m-1 + 1) alpha + (m-1)/m N beta
 *               + ((k-1)/k + (m-1)/(m k)) N (2c (+ gamma for RS))
 *               + (k-1)/k N c
 * On a grid the uplinks' bytes are a floor under the link term, half the
 * All-Reduce's (one way, not there and back): hier's each level's share
 * of what it holds, the ring's its crossings of the groups.
 */
static double hier_rsag_us(const struct fr_comm *comm, int id,
			   enum fr_coll coll, double flat_us, double n,
			   fr_dtype_t dtype)
{
	const struct fr_tune *t = &comm->algo.tune;
	double b = t->beta_ns * 1e-3, c = t->copy_ns * 1e-3;
	double g =
		coll == FR_COLL_REDUCE_SCATTER
			? t->gamma_ns[dtype < FR_DTYPE_COUNT ? dtype : 0] * 1e-3
			: 0;
	double k = comm->topo.nlocal, m = comm->topo.nnodes, p = comm->nranks;
	double moved = (k - 1) / k + (m - 1) / (m * k);

	if (id == FR_ALGO_HIER)
		return (k - 1 + hier_net_steps(comm) + 1) * t->alpha_us +
		       (k - 1) * (local_a(t) - t->alpha_us) +
		       fmax((m - 1) / m * n * b, hier_grid_us(comm, n) / 2) +
		       moved * n * (2 * c + g) + (k - 1) / k * n * c;
	/* Bruck's steps pair ranks 2^k apart, on other nodes but for the
	 * first lg k where a node's ranks are consecutive: counted as all
	 * of the node's k ranks sending through its link at once */
	if (id == FR_ALGO_BRUCK && flat_us >= 0)
		return flat_us +
		       fmax((k - 1) * (p - 1) / p * n * b,
			    bruck_grid_us(comm, n) - (p - 1) / p * n * b);
	if (flat_us < 0 || id != FR_ALGO_RING)
		return flat_us;
	if (ring_hops_differ(comm))
		return flat_us - (p - 1) * t->alpha_us - (p - 1) / p * n * b +
		       fmax(ring_path_us(comm, n, p - 1),
			    ring_grid_us(comm, n) / 2);
	return flat_us +
	       fmax((comm->topo.ring_crossings - 1) * (p - 1) / p * n * b,
		    ring_grid_us(comm, n) / 2 - (p - 1) / p * n * b);
}

/*
 * Rabenseifner on nodes of k ranks.  Step j pairs virtual ranks 2^j apart
 * and sends n / 2^(j+1) each way (reduce-scatter, then all-gather).
 * Where all its pairs share a node (hc_local_dims), those bytes are copies
 * within the node, 2 c a byte (into the mailbox and out); else they cross
 * the link, which the node's k ranks share, all sending at once: k b + c
 * a byte.  The fold and unfold (n not a power of two) cross the link.  On
 * 128 nodes of 8 consecutive ranks the first 3 of its 10 steps carry 7/8
 * of its bytes at home; counting them all at the link's shared rate, the
 * model chose hier at 2 MiB, at 1.4 times Rabenseifner's simulated time
 * (perf/sim/README.md).  Recursive doubling keeps the flat
 * term: it sends all n at every step, and the simulator shows its small
 * messages (where it is chosen) not queueing behind each other on the
 * link as a byte count would say.
 */
static double rab_us(const struct fr_comm *comm, double n, fr_dtype_t dtype)
{
	const struct fr_tune *t = &comm->algo.tune;
	double a = t->alpha_us, b = t->beta_ns * 1e-3, c = t->copy_ns * 1e-3;
	size_t pm = fr_msg_payload_max(comm);
	double g = t->gamma_ns[dtype < FR_DTYPE_COUNT ? dtype : 0] * 1e-3;
	double k = comm->topo.nlocal, wire = 0;
	unsigned local = hc_local_dims(comm);
	struct fr_hcube h;
	int f;

	fr_hcube_init(&h, 0, comm->nranks);
	f = h.rem > 0;
	for (int j = 0; j < h.steps; j++) {
		double m = n / (double)(2 << j);

		if (local >> j & 1) {
			wire += 2 * (local_a(t) - a + m * (local_b(t) + c));
			continue;
		}
		wire += 2 * fmax(rab_step_us(t, a, k * b, c, pm, m),
				 hc_grid_us(comm, &h, j, m));
	}
	return (2 * h.steps + 2 * f) * a + wire +
	       2 * f * rab_step_us(t, a, b, c, pm, n) +
	       ((double)(h.pof2 - 1) / h.pof2 + f) * n * g;
}

/*
 * Over several nodes the ranks of a node share its network link.  The
 * flat algorithms' bytes then queue on it: the ring's at each node's ring
 * neighbours on other nodes (comm->ring_crossings: our node's ranks whose
 * next in the ring is elsewhere, counted in comm.c as the ring is laid
 * out; regular layouts are alike), recursive doubling's at nearly every
 * rank of the node, Rabenseifner's at the steps whose pairs are on
 * different nodes (rab_us).  The two-level All-Reduce
 * sends 2 (m-1)/m of the vector over the link, spread over its k ranks, and
 * copies 2 (k-1)/k within the node.
 */

double fr_algo_predict_us(const struct fr_comm *comm, int id, enum fr_coll coll,
			  size_t bytes, fr_dtype_t dtype)
{
	const struct fr_tune *t = &comm->algo.tune;
	double us, n = (double)bytes, b = t->beta_ns * 1e-3;
	double k = comm->topo.nlocal, m = comm->topo.nnodes;

	/* the one-shot is the one over lines where they carry the call
	 * (impl): one node, so none of the terms below.  A broadcast or
	 * reduce over lines waits for every rank, where the trees let a
	 * rank go once its part is sent: with more ranks than CPUs that
	 * wait is for the scheduler (3 ranks on 2 CPUs, 8-byte broadcast:
	 * 9.3 us a call by lines, 2.5 by the tree), so there they are not
	 * offered. */
	if (id == FR_ALGO_ONESHOT && fr_ll_fits(comm, coll, bytes))
		return (coll == FR_COLL_BROADCAST || coll == FR_COLL_REDUCE) &&
				       comm->topo.oversub > 1.0
			       ? -1
			       : fr_model_ll_us(t, comm->nranks, coll, bytes,
						dtype);
	us = fr_model_predict_us(t, comm->nranks, fr_msg_payload_max(comm), id,
				 coll, bytes, dtype);
	if (!hier_ok(comm) && coll == FR_COLL_ALLREDUCE && id != FR_ALGO_HIER)
		return flat_grid_us(comm, id, us, n);
	if (!hier_ok(comm) ||
	    (coll != FR_COLL_ALLREDUCE && coll != FR_COLL_REDUCE_SCATTER &&
	     coll != FR_COLL_ALLGATHER))
		return id == FR_ALGO_HIER ? -1 : us;
	if (coll != FR_COLL_ALLREDUCE)
		return hier_rsag_us(comm, id, coll, us, n, dtype);
	if (id == FR_ALGO_HIER) {
		double g =
			t->gamma_ns[dtype < FR_DTYPE_COUNT ? dtype : 0] * 1e-3;

		double c = t->copy_ns * 1e-3;
		int levels = 1 + (comm->topo.nlevels ? comm->topo.nlevels : 1);
		double lanes = fr_hier_lanes(comm, bytes, levels);
		/* the steps above the node, each a chunk from every one of
		 * the node's k ranks to a peer, the link's 2 (m-1)/m n in
		 * all */
		double net_steps = 2 * hier_net_steps(comm) * lanes;
		double chunk = 2 * (m - 1) / m * n / (net_steps * k);
		/* the node's level: its copies and reductions, which run
		 * under the levels above in all lanes but one (hier.c) */
		double node = (2 * (k - 1) / k * 2 * c + 2 * (k - 1) / k * c +
			       (k - 1) / k * g) *
			      n;

		/* the node's 2 (k - 1) steps a lane, n / (k lanes) each,
		 * through the mailbox too: where a step is longer than its
		 * window (a big job's small slots: 1 KiB at 4,096 ranks),
		 * the window's round trips on the node's latency, one lane
		 * after another.  fr_sim, 4,096 ranks on a fat tree told
		 * the grid (FR_TOPO=16x32): 2 MiB took hier 954.6 us, 13.8
		 * million events of 1 KiB fragments, where Rabenseifner took
		 * 569.1; without this term the model chose hier.  Only with
		 * the node's latency known (local_alpha_us): the link's
		 * alpha for a round trip within the node would charge a
		 * window that shared memory turns round in a microsecond. */
		double win = t->local_alpha_us > 0
				     ? 2 * (k - 1) * lanes *
					       mbx_stream_us(
						       t->local_alpha_us, 0,
						       fr_msg_payload_max(comm),
						       n / (k * lanes))
				     : 0;

		/* every byte it moves goes through the mailboxes (xfer.c):
		 * a copy in and a copy out on top of the wire; each level
		 * takes the lanes one after another, so the steps above
		 * the node (the longer rings) count once a lane */
		return (2 * (k - 1) + net_steps + 1) * t->alpha_us + win +
		       2 * (k - 1) * (local_a(t) - t->alpha_us) +
		       fmax(net_steps * mbx_stream_us(t->alpha_us, k * b,
						      fr_msg_payload_max(comm),
						      chunk),
			    hier_grid_us(comm, n)) +
		       2 * (m - 1) / (m * k) * n * 2 * c +
		       (m - 1) / (m * k) * n * g + node / lanes;
	}
	if (us < 0)
		return us;
	/* the tree's busiest link, counted on its edges */
	if (id == FR_ALGO_TREE)
		return us + fmax(0, 1.5 * tree_wire_us(comm, n) - 3 * n * b);
	/* the flat algorithms' link time, times the ranks sharing it; the
	 * grid's slowest uplink is a floor under it */
	if (id == FR_ALGO_RING) {
		double one = 2 * (comm->nranks - 1.0) / comm->nranks * n * b;

		if (ring_hops_differ(comm))
			return us - one - 2 * (comm->nranks - 1) * t->alpha_us +
			       fmax(ring_path_us(comm, n,
						 2 * (comm->nranks - 1.0)),
				    ring_grid_us(comm, n));
		return us - one +
		       fmax(comm->topo.ring_crossings * one,
			    ring_grid_us(comm, n));
	}
	if (id == FR_ALGO_RABENSEIFNER)
		return rab_us(comm, n, dtype);
	if (id == FR_ALGO_RD)
		/* its steps within the node (they send n through the
		 * mailbox as the others do: the bytes stay as they are) */
		us -= __builtin_popcount(hc_local_dims(comm)) *
		      (t->alpha_us - local_a(t));
	if (id == FR_ALGO_RD && comm->topo.nlevels) {
		/* a step's k ranks share the node link: k n b, or the
		 * slowest uplink's time if longer */
		struct fr_hcube h;

		fr_hcube_init(&h, 0, comm->nranks);
		for (int j = 0; j < h.steps; j++)
			us += fmax(0, hc_grid_us(comm, &h, j, n) - k * n * b);
	}
	if (id == FR_ALGO_ONESHOT && comm->topo.nlevels)
		us += fmax(0, oneshot_grid_us(comm, n) -
				      k * (comm->nranks - 1) * n * b);
	return us + (k - 1) * 2 * n * b;
}

double fr_model_predict_us(const struct fr_tune *t, int nranks,
			   size_t payload_max, int id, enum fr_coll coll,
			   size_t bytes, fr_dtype_t dtype)
{
	double p = nranks, n = (double)bytes, a = t->alpha_us;
	double b = t->beta_ns * 1e-3, c = t->copy_ns * 1e-3;
	double g = t->gamma_ns[dtype < FR_DTYPE_COUNT ? dtype : 0] * 1e-3;
	int L = 0, pof2 = 1, f;

	while (pof2 * 2 <= nranks) {
		pof2 *= 2;
		L++;
	}
	f = pof2 != nranks;
	if (nranks <= 1)
		return 0;
	switch (coll) {
	case FR_COLL_ALLREDUCE:
		if (id == FR_ALGO_RING)
			return (2 * (p - 1) + 1) * a + 2 * (p - 1) / p * n * b +
			       (p - 1) / p * n * g;
		if (id == FR_ALGO_RD)
			return (L + 2 * f) * a +
			       L * mbx_stream_us(a, b + c, payload_max, n) +
			       2 * f * zx_step_us(a, b, c, payload_max, n) +
			       (L + f) * n * g;
		/* the one-shot's p - 1 streams share the link, and it
		 * folds them in rank order (oneshot.c): a later sender's
		 * stream waits in its window until its turn, so past the
		 * first W of each the windows' round trips add up */
		if (id == FR_ALGO_ONESHOT)
			return a + (p - 2) * t->msg_us +
			       fmax((p - 1) * n * (b + c),
				    (p - 1) * mbx_stream_us(a, 0, payload_max,
							    n)) +
			       (p - 1) * n * g;
		if (id == FR_ALGO_TREE) {
			/*
			 * The double binary tree (dbtree.c): a fragment's
			 * 2 H hops up and down, H = ceil(lg p), then about 2n
			 * a rank each way over both trees at once.  fr_sim
			 * finds the link's part about 1.5 times that where
			 * the link is the limit (16 MiB: 41 ms for 27 on 4
			 * ranks at 10 Gbit/s, 43 for 27 on 16, 4.3 for 2.7 on
			 * 64 at 100): a rank's four streams share its link, and
			 * their credits come back behind the other streams'
			 * data. Its four streams (n/2 each) go through their
			 * windows side by side, all through the outbox
			 * (2 FR_MBX_SLOTS slots a rank, peer.h), whose slots
			 * come back a round trip after they left: on 64
			 * ranks at 384 Gbit/s and 73 us, 25 MiB took it 17.8
			 * ms in fr_sim, the outbox's 100 round trips.  An
			 * inner rank folds n.
			 */
			double s = fmin(n / 2, payload_max ? (double)payload_max
							   : n / 2);

			return 2 * ceil(log2(p)) * (a + s * (b + c)) +
			       fmax(fmax(3 * n * b + 2 * n * c,
					 mbx_stream_us(a, b + c, payload_max,
						       n / 2)),
				    mbx_stream_us(a, 0, 2 * payload_max,
						  2 * n)) +
			       n * g;
		}
		if (id == FR_ALGO_RABENSEIFNER) {
			/* step j sends n / 2^(j+1) each way, twice */
			double wire =
				2 * f * rab_step_us(t, a, b, c, payload_max, n);

			for (int j = 0; j < L; j++)
				wire += 2 * rab_step_us(t, a, b, c, payload_max,
							n / (double)(2 << j));
			return (2 * L + 2 * f) * a + wire +
			       ((double)(pof2 - 1) / pof2 + f) * n * g;
		}
		return -1;
	case FR_COLL_REDUCE_SCATTER:
	case FR_COLL_ALLGATHER: {
		/* Bruck's ceil(lg p) steps move c_k = min(2^k, p - 2^k) of
		 * the p blocks each, (p-1)/p n in all, through the
		 * mailboxes (each step's stream in its window: a copy in,
		 * and out again for the all-gather, where the
		 * reduce-scatter reduces out of the slot), where the ring's
		 * p steps write in place */
		double rsg = coll == FR_COLL_REDUCE_SCATTER ? g : 0, wire = 0;
		int steps = 0;

		if (id == FR_ALGO_RING)
			return p * a + (p - 1) / p * n * (b + rsg);
		if (id != FR_ALGO_BRUCK)
			return -1;
		for (int d = 1; d < nranks; d *= 2, steps++)
			wire += mbx_stream_us(a, b + c, payload_max,
					      fmin(d, p - d) / p * n);
		return steps * a + wire + (p - 1) / p * n * (rsg ? rsg : c);
	}
	case FR_COLL_BROADCAST: {
		/* the chain streams k = n / s fragments of s bytes through
		 * p - 1 hops; the tree sends all of it down lg p levels */
		double s = FR_MIN(n, (double)payload_max);
		double k = s > 0 ? fmax(n / s, 1) : 1;

		if (id == FR_ALGO_TREE)
			return ceil(log2(p)) * (a + n * (b + c));
		if (id == FR_ALGO_RING)
			return (p - 2 + k) * (a + s * (b + c));
		return -1;
	}
	case FR_COLL_BARRIER:
		return id == FR_ALGO_DISSEMINATION ? ceil(log2(p)) * a : -1;
	case FR_COLL_REDUCE: {
		/* broadcast's trees run upwards, reducing on the way */
		double s = FR_MIN(n, (double)payload_max);
		double k = s > 0 ? fmax(n / s, 1) : 1;

		if (id == FR_ALGO_TREE)
			return ceil(log2(p)) * (a + n * (b + c + g));
		if (id == FR_ALGO_RING)
			return (p - 2 + k) * (a + s * (b + c + g));
		return -1;
	}
	case FR_COLL_ALLTOALL: {
		/* bytes: the whole send buffer, p blocks; pairwise sends p - 1
		 * blocks at once (a message each), Bruck lg p rounds of about
		 * p / 2 blocks, copied in and out of its packs, plus two
		 * rotations of all p */
		double blk = n / p, lg = ceil(log2(p));

		if (id == FR_ALGO_PAIRWISE)
			return a + (p - 2) * t->msg_us +
			       (p - 1) * blk * (b + c);
		if (id == FR_ALGO_BRUCK)
			return lg * (a + ceil(p / 2) * blk * (b + 3 * c)) +
			       2 * p * blk * c;
		return -1;
	}
	case FR_COLL_ALLTOALLV:
		return id == FR_ALGO_PAIRWISE ? a + (p - 2) * t->msg_us : -1;
	case FR_COLL_ALLGATHERV:
		return id == FR_ALGO_RING
			       ? (p - 1) * a + (p - 1) / p * n * (b + c)
			       : -1;
	case FR_COLL_REDUCE_SCATTERV:
		return id == FR_ALGO_RING
			       ? (p - 1) * a + (p - 1) / p * n * (b + c + g)
			       : -1;
	}
	return -1;
}

/*
 * Lines (ll.c): every rank puts a header of H = FR_LL_HDR bytes and its
 * vector into a line of each of its p - 1 peers, then folds theirs as they
 * come.  No mailbox, no message, no step: one line's trip, line_us, which
 * fr_tune(1) measures on the job itself (8 bytes, its rank count, so the
 * wait for the slowest peer is in it), then the puts' copies and the fold:
 *   All-Reduce   line_us + (p - 1) ((n + H) c + n gamma)   (reduce too:
 *                the root folds, the others put and take alike)
 *   broadcast    line_us + (p - 1) (n + H) c     (the root's puts; the
 *                others put the header alone, and copy the root's n)
 *   barrier      line_us                  (the header alone)
 * against recursive doubling's lg p message steps (or dissemination's):
 * 0.28 against 0.83 us for 8 bytes at n = 2 over shm (perf/bench/README.md).
 * Only where lines carry the call (fr_ll_fits: one node, 2 to
 * FR_LL_RANKS_MAX ranks, up to a line); beyond that the one-shot is the
 * mailboxes' (fr_model_predict_us).
 */
double fr_model_ll_us(const struct fr_tune *t, int nranks, enum fr_coll coll,
		      size_t bytes, fr_dtype_t dtype)
{
	double p = nranks, n = (double)bytes;
	double c = t->copy_ns * 1e-3;
	double g = t->gamma_ns[dtype < FR_DTYPE_COUNT ? dtype : 0] * 1e-3;

	if (nranks <= 1)
		return 0;
	if (coll == FR_COLL_BARRIER)
		return t->line_us;
	/* the root's puts; the others' headers cost next to nothing */
	if (coll == FR_COLL_BROADCAST)
		return t->line_us + (p - 1) * (n + FR_LL_HDR) * c;
	return t->line_us + (p - 1) * ((n + FR_LL_HDR) * c + n * g);
}

/* ---- the table: every algorithm, and what they share with the engine --- */

static const struct fr_algo *const algos[] = {
	&fr_algo_ring,	       &fr_algo_rd,	     &fr_algo_rabenseifner,
	&fr_algo_bcast_tree,   &fr_algo_bcast_chain, &fr_algo_dissemination,
	&fr_algo_cring,	       &fr_algo_hier,	     &fr_algo_hier_rsag,
	&fr_algo_bruck_rsag,   &fr_algo_oneshot,     &fr_algo_reduce_tree,
	&fr_algo_reduce_chain, &fr_algo_pairwise,    &fr_algo_bruck,
	&fr_algo_vring,	       &fr_algo_dbtree,	     &fr_algo_ll,
};

int fr_algos_on_cqe(struct fr_comm *comm, struct fr_request *active, int peer,
		    const struct fr_tp_cqe *cqe)
{
	uint32_t bit = 1u << FR_IMM_TYPE(cqe->imm);

	for (size_t i = 0; i < FR_ARRAY_SIZE(algos); i++)
		if (algos[i]->on_cqe && (algos[i]->imm_types & bit))
			return algos[i]->on_cqe(comm, active, peer, cqe);
	return fr_comm_fail(
		comm, FR_EPROTO,
		"rank %d: unexpected message (immediate 0x%08x) from rank %d",
		comm->rank, cqe->imm, peer);
}

int fr_algos_progress(struct fr_comm *comm, struct fr_request *active,
		      bool *did_work)
{
	for (size_t i = 0; i < FR_ARRAY_SIZE(algos); i++) {
		int rc = algos[i]->progress
				 ? algos[i]->progress(comm, active, did_work)
				 : 0;

		if (rc)
			return rc;
	}
	return 0;
}

void fr_algos_comm_free(struct fr_comm *comm)
{
	fr_zx_comm_free(comm);
	for (size_t i = 0; i < FR_ARRAY_SIZE(algos); i++)
		if (algos[i]->comm_free)
			algos[i]->comm_free(comm);
}

static const struct fr_algo *impl(const struct fr_comm *comm, enum fr_coll coll,
				  int id, size_t bytes)
{
	/* the one-shot is the one over lines wherever they carry the call */
	if (id == FR_ALGO_ONESHOT && fr_ll_fits(comm, coll, bytes))
		return &fr_algo_ll;
	switch (coll) {
	case FR_COLL_ALLREDUCE:
		return id == FR_ALGO_RING	    ? &fr_algo_ring
		       : id == FR_ALGO_RD	    ? &fr_algo_rd
		       : id == FR_ALGO_RABENSEIFNER ? &fr_algo_rabenseifner
		       : id == FR_ALGO_ONESHOT	    ? &fr_algo_oneshot
		       : id == FR_ALGO_TREE	    ? &fr_algo_dbtree
		       : id == FR_ALGO_HIER && hier_ok(comm) ? &fr_algo_hier
							     : NULL;
	case FR_COLL_REDUCE_SCATTER:
	case FR_COLL_ALLGATHER:
		return id == FR_ALGO_RING    ? &fr_algo_ring
		       : id == FR_ALGO_BRUCK ? &fr_algo_bruck_rsag
		       : id == FR_ALGO_HIER && hier_ok(comm)
			       ? &fr_algo_hier_rsag
			       : NULL;
	case FR_COLL_BROADCAST:
		return id == FR_ALGO_RING ? &fr_algo_bcast_chain
		       : id == FR_ALGO_TREE || id == FR_ALGO_RD
			       ? &fr_algo_bcast_tree
			       : NULL;
	case FR_COLL_BARRIER:
		return &fr_algo_dissemination;
	case FR_COLL_REDUCE:
		return id == FR_ALGO_RING   ? &fr_algo_reduce_chain
		       : id == FR_ALGO_TREE ? &fr_algo_reduce_tree
					    : NULL;
	case FR_COLL_ALLTOALL:
		return id == FR_ALGO_PAIRWISE ? &fr_algo_pairwise
		       : id == FR_ALGO_BRUCK  ? &fr_algo_bruck
					      : NULL;
	case FR_COLL_ALLTOALLV:
		return id == FR_ALGO_PAIRWISE ? &fr_algo_pairwise : NULL;
	case FR_COLL_ALLGATHERV:
	case FR_COLL_REDUCE_SCATTERV:
		return id == FR_ALGO_RING ? &fr_algo_vring : NULL;
	}
	return NULL;
}

/* FR_LOG=info: the choice and the predictions, once per (collective, size)
 * since a training loop repeats them. */
static void log_choice(struct fr_comm *comm, const struct fr_request *req,
		       size_t bytes, const struct fr_algo *best,
		       const double *us)
{
	char why[256] = "";
	int n = 0;

	for (unsigned i = 0; i < FR_ALGO_LOGGED; i++)
		if (comm->algo.logged[i].coll == (int)req->coll &&
		    comm->algo.logged[i].bytes == bytes)
			return;
	unsigned slot = comm->algo.logged_next++ % FR_ALGO_LOGGED;

	comm->algo.logged[slot].coll = (int)req->coll;
	comm->algo.logged[slot].bytes = bytes;
	for (int id = 1; id < FR_ALGO_COUNT; id++) {
		const struct fr_algo *a = impl(comm, req->coll, id, bytes);

		if (!a || us[id] < 0 || a->id != id || (size_t)n >= sizeof(why))
			continue;
		n += snprintf(why + n, sizeof(why) - (size_t)n, "%s%s %.1f us",
			      n ? ", " : "", a->name, us[id]);
	}
	fr_info("rank %d: %s of %zu bytes over %d ranks: %s (model, %s: %s%s)",
		comm->rank, fr_coll_name(req->coll), bytes, comm->nranks,
		best ? best->name : "?", comm->algo.tune.source, why,
		req->forced != FR_ALGO_AUTO
			? "; the forced algorithm does not implement it"
			: "");
}

const struct fr_algo *fr_algo_select(struct fr_comm *comm,
				     const struct fr_request *req)
{
	size_t bytes = fr_coll_count_total(req) * fr_dtype_size(req->dtype);
	const struct fr_algo *best = NULL;
	double best_us = 0, us[FR_ALGO_COUNT] = {0};

	/* compression on the wire has one schedule */
	if (req->compress != FR_COMPRESS_NONE)
		return &fr_algo_cring;
	if (req->forced != FR_ALGO_AUTO) {
		best = impl(comm, req->coll, req->forced, bytes);
		if (best)
			return best;
		/* not one this collective has: choose as auto would */
	}
	/*
	 * The choice depends only on the collective, the size, the type and
	 * the parameters, which stand after the communicator is made (those
	 * that change them forget the choices: memo_forget).  A training
	 * loop repeats a few sizes: asking the model for every algorithm
	 * took about 70 ns of an 8-byte call's 690 over shared memory.
	 */
	for (unsigned i = 0; i < FR_ALGO_MEMO; i++) {
		const struct fr_algo_memo *m = &comm->algo.memo[i];

		if (m->algo && m->bytes == bytes && m->coll == (int)req->coll &&
		    m->dtype == (int)req->dtype)
			return m->algo;
	}
	/* the layout's hypercube steps at home, once: the model asks on
	 * every size it has not seen */
	if (!comm->algo.hc_local_known) {
		comm->algo.hc_local = hc_local_dims(comm);
		comm->algo.hc_local_known = true;
	}
	for (int id = 1; id < FR_ALGO_COUNT; id++) {
		const struct fr_algo *a = impl(comm, req->coll, id, bytes);

		us[id] = a ? fr_algo_predict_us(comm, id, req->coll, bytes,
						req->dtype)
			   : -1;
		if (a && us[id] >= 0 && (!best || us[id] < best_us)) {
			best = a;
			best_us = us[id];
		}
	}
	if (fr_log_enabled(FR_LOG_INFO))
		log_choice(comm, req, bytes, best, us);
	if (best) {
		unsigned i = comm->algo.memo_next++ % FR_ALGO_MEMO;

		comm->algo.memo[i].algo = best;
		comm->algo.memo[i].coll = (int)req->coll;
		comm->algo.memo[i].dtype = (int)req->dtype;
		comm->algo.memo[i].bytes = bytes;
	}
	return best;
}

/* ---- for tools that link the internals (fr_tune, fr_step) -------------- */

void fr_tune_get(const struct fr_comm *comm, struct fr_tune *t)
{
	*t = comm->algo.tune;
}

void fr_tune_set(struct fr_comm *comm, const struct fr_tune *t)
{
	comm->algo.tune = *t;
	memo_forget(comm);
}

int fr_algo_force(struct fr_comm *comm, int algo)
{
	int prev = comm->algo.forced;

	comm->algo.forced = algo;
	return prev;
}
