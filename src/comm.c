/* SPDX-License-Identifier: MIT */
/*
 * comm.c - communicator creation, destruction, errors and counters.
 *
 * Creation, in order (and unwound in exactly the reverse order):
 *   1. settings from the config struct, else the environment, else defaults;
 *   2. rendezvous phase 1 (bootstrap.c): learn the interface that reaches
 *      rank 0;
 *   3. open the transport endpoint on it, register the mailbox (where
 *      peers' messages land) once for the communicator's life;
 *   4. rendezvous phase 2: trade "cards" (endpoint address + mailbox key),
 *      and check that every rank has the same settings.
 * Nothing is connected here: peers connect on first use (peer.c), so only
 * pairs that ever talk open a connection.  Steps 1 and 3 are comm_new and
 * comm_open, step 4's end comm_finish; a job whose ranks all live in this
 * process (fr_comm_create_local: the simulator, the unit tests) runs them
 * for every rank in turn, handing the cards over in memory instead of at a
 * rendezvous, and fr_comm_destroy_local takes its goodbyes in turns from
 * one thread.
 *
 * Global state: the message of the last failed fr_comm_create*() is kept
 * per thread (for fr_comm_last_error(NULL)); that and the log level are the
 * library's only globals.
 *
 * Layer: entry points (the top: doc/architecture.md).  Builds every
 * layer's state at creation and tears it down in reverse; may call every
 * layer below.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "affinity.h"
#include "algo/algo.h"
#include "bootstrap.h"
#include "env.h"
#include "internal.h"
#include "log.h"
#include "peer.h"
#include "reduce.h"
#include "topo.h"
#include "util.h"

static _Thread_local char create_err[FR_ERRMSG_MAX];

void fr_config_init(fr_config_t *cfg)
{
	if (!cfg)
		return;
	memset(cfg, 0, sizeof(*cfg));
	cfg->size = sizeof(*cfg);
}

/* Fields of a caller's config that its size says it has. */
#define CFG_HAS(cfg, field) \
	((cfg)->size >= offsetof(fr_config_t, field) + sizeof((cfg)->field))

static int resolve_progress(const fr_config_t *cfg, struct fr_settings *s,
			    char *err, size_t errlen)
{
	const char *e = getenv("FR_PROGRESS");

	s->progress = FR_PROGRESS_CALLER;
	if (cfg && CFG_HAS(cfg, progress) && cfg->progress) {
		if (cfg->progress != FR_PROGRESS_CALLER &&
		    cfg->progress != FR_PROGRESS_THREAD) {
			snprintf(err, errlen,
				 "config progress %d is not an fr_progress_t",
				 cfg->progress);
			return FR_EINVAL;
		}
		s->progress = cfg->progress;
	} else if (e && *e) {
		if (!strcmp(e, "thread")) {
			s->progress = FR_PROGRESS_THREAD;
		} else if (strcmp(e, "caller")) {
			snprintf(err, errlen,
				 "FR_PROGRESS=\"%s\" is not thread or caller",
				 e);
			return FR_EINVAL;
		}
	}
	/* auto (default), none or a CPU list (affinity.c) */
	return fr_affinity_parse(getenv("FR_PROGRESS_CPU"), &s->cpu_mode,
				 &s->cpus, err, errlen);
}

static int resolve_settings(const fr_config_t *cfg, struct fr_settings *s,
			    char *err, size_t errlen)
{
	fr_getenv_fn get = fr_env_getenv;
	int rc;

	const char *tp, *tok;

	tp = cfg && CFG_HAS(cfg, transport) && cfg->transport
		     ? cfg->transport
		     : getenv("FR_TRANSPORT");
	if (!tp || !*tp)
		tp = "auto";
	tok = cfg && CFG_HAS(cfg, job_token) && cfg->job_token
		      ? cfg->job_token
		      : getenv("FR_JOB_TOKEN");
	if (strlen(tp) >= sizeof(s->transport)) {
		snprintf(err, errlen, "transport \"%.40s...\" is not one", tp);
		return FR_EINVAL;
	}
	if (tok && strlen(tok) >= sizeof(s->token)) {
		snprintf(err, errlen, "job token longer than %zu bytes",
			 sizeof(s->token) - 1);
		return FR_EINVAL;
	}
	snprintf(s->transport, sizeof(s->transport), "%s", tp);
	s->has_token = tok != NULL;
	snprintf(s->token, sizeof(s->token), "%s", tok ? tok : "");

	s->timeout_ms = FR_DEFAULT_TIMEOUT_MS;
	if (cfg && CFG_HAS(cfg, timeout_ms) && cfg->timeout_ms) {
		if (cfg->timeout_ms < 0) {
			snprintf(err, errlen, "config timeout_ms %d < 0",
				 cfg->timeout_ms);
			return FR_EINVAL;
		}
		s->timeout_ms = cfg->timeout_ms;
	} else {
		rc = fr_env_long(get, NULL, "FR_TIMEOUT_MS", 1, 86400000L,
				 &s->timeout_ms, err, errlen);
		if (rc < 0)
			return rc;
	}
	/* a peer that answers but has not entered the collective: ten
	 * minutes by default (a checkpoint, a slow data loader), never less
	 * than the timeout */
	s->slow_timeout_ms = FR_MAX(600000L, s->timeout_ms);
	rc = fr_env_long(get, NULL, "FR_SLOW_TIMEOUT_MS", 1, 86400000L,
			 &s->slow_timeout_ms, err, errlen);
	if (rc < 0)
		return rc;
	s->slow_timeout_ms = FR_MAX(s->slow_timeout_ms, s->timeout_ms);
	rc = fr_env_boot_timeout(get, NULL, s->timeout_ms, &s->boot_timeout_ms,
				 err, errlen);
	if (rc < 0)
		return rc;
	s->segment_bytes = FR_DEFAULT_SEGMENT;
	if (cfg && CFG_HAS(cfg, segment_bytes) && cfg->segment_bytes) {
		s->segment_bytes = cfg->segment_bytes;
	} else {
		rc = fr_env_size(get, NULL, "FR_SEGMENT_BYTES", 256, 1u << 30,
				 &s->segment_bytes, err, errlen);
		if (rc < 0)
			return rc;
	}
	if (s->segment_bytes < 256 || s->segment_bytes > (1u << 30) ||
	    s->segment_bytes % 8) {
		snprintf(
			err, errlen,
			"segment size %zu must be a multiple of 8 in [256, 1G]",
			s->segment_bytes);
		return FR_EINVAL;
	}
	s->slots = FR_DEFAULT_SLOTS;
	if (cfg && CFG_HAS(cfg, slots) && cfg->slots) {
		s->slots = cfg->slots;
	} else {
		rc = fr_env_long(get, NULL, "FR_SLOTS", 2, FR_MAX_SLOTS,
				 &s->slots, err, errlen);
		if (rc < 0)
			return rc;
	}
	if (s->slots < 2 || s->slots > FR_MAX_SLOTS) {
		snprintf(err, errlen, "slots %ld must be in [2, %d]", s->slots,
			 FR_MAX_SLOTS);
		return FR_EINVAL;
	}
	s->regcache = FR_DEFAULT_REGCACHE;
	if (cfg && CFG_HAS(cfg, regcache_entries) &&
	    cfg->regcache_entries > 0) {
		s->regcache = cfg->regcache_entries;
	} else {
		rc = fr_env_long(get, NULL, "FR_REGCACHE_MAX", 1, 1 << 20,
				 &s->regcache, err, errlen);
		if (rc < 0)
			return rc;
	}
	s->spin_us = FR_DEFAULT_SPIN_US;
	rc = fr_env_long(get, NULL, "FR_SPIN_US", 0, 10000000L, &s->spin_us,
			 err, errlen);
	if (rc < 0)
		return rc;
	s->algo = FR_ALGO_AUTO;
	if (cfg && CFG_HAS(cfg, algo) && cfg->algo) {
		if (cfg->algo < 0 || cfg->algo >= FR_ALGO_COUNT) {
			snprintf(err, errlen,
				 "config algo %d is not an fr_algo_t",
				 cfg->algo);
			return FR_EINVAL;
		}
		s->algo = cfg->algo;
	} else {
		const char *a = getenv("FR_ALGO");
		fr_algo_t id;

		if (a && *a) {
			if (fr_algo_from_name(a, &id)) {
				snprintf(
					err, errlen,
					"FR_ALGO=\"%s\" is not auto, ring, rd, rabenseifner, tree or dissemination",
					a);
				return FR_EINVAL;
			}
			s->algo = id;
		}
	}
	s->eager_bytes = 0; /* sized by the number of ranks */
	rc = fr_env_size(get, NULL, "FR_EAGER_BYTES", 128, 1u << 20,
			 &s->eager_bytes, err, errlen);
	if (rc < 0)
		return rc;
	if (s->eager_bytes && s->eager_bytes % 8) {
		snprintf(err, errlen,
			 "FR_EAGER_BYTES %zu must be a multiple of 8",
			 s->eager_bytes);
		return FR_EINVAL;
	}
	/* FR_LL=0: every message with the 64-byte header, by write_imm
	 * (the low-latency path off, to compare); ranks may differ */
	s->ll = 1;
	rc = fr_env_long(get, NULL, "FR_LL", 0, 1, &s->ll, err, errlen);
	if (rc < 0)
		return rc;
	rc = resolve_progress(cfg, s, err, errlen);
	if (rc)
		return rc;
	/* FR_RING_ORDER: node (default: a node's ranks adjacent) or rank */
	const char *ro = getenv("FR_RING_ORDER");

	if (ro && *ro && strcmp(ro, "node")) {
		if (strcmp(ro, "rank")) {
			snprintf(err, errlen,
				 "FR_RING_ORDER=\"%s\" is not node or rank",
				 ro);
			return FR_EINVAL;
		}
		s->ring_by_rank = true;
	}
	/* FR_TOPO: the nodes on a grid ("2x4": racks of 2 nodes, 4 racks),
	 * whose dimensions the hierarchical All-Reduce reduces along in
	 * turn; it must be the same on every rank */
	const char *grid = getenv("FR_TOPO");

	s->ngrid = 0;
	if (grid && *grid) {
		s->ngrid = fr_topo_grid_parse(grid, s->grid);
		if (s->ngrid < 0) {
			snprintf(
				err, errlen,
				"FR_TOPO=\"%s\" is not sizes of nodes like 2x4 (1 to %d of them, each 1 to 65536)",
				grid, FR_TOPO_MAX_DIMS);
			return FR_EINVAL;
		}
	}
	/* FR_POLL: spin = never block, event = block at once, hybrid
	 * (default) = spin FR_SPIN_US, then block. */
	const char *poll = getenv("FR_POLL");

	if (poll && *poll && strcmp(poll, "hybrid")) {
		if (!strcmp(poll, "spin")) {
			s->spin_us = -1;
		} else if (!strcmp(poll, "event")) {
			s->spin_us = 0;
		} else {
			snprintf(err, errlen,
				 "FR_POLL=\"%s\" is not spin, event or hybrid",
				 poll);
			return FR_EINVAL;
		}
	}
	return 0;
}

/*
 * auto: shared memory when the launcher says every rank is on this host
 * (and FR_NODE does not emulate several nodes), else shm+verbs where an
 * active RDMA port exists, else shm+tcp: shared memory to the ranks that
 * turn out to share our node, verbs or TCP to the others.  Every rank of a
 * job must choose alike (the rendezvous compares the names), and a rank
 * does not know yet whether another shares its node, so a job over several
 * hosts takes a mixed transport even where a node holds one rank: its shm
 * side then only listens.
 */
static const struct fr_tp_ops *choose_transport(const char *name, int nranks,
						char *err, size_t errlen)
{
	const struct fr_tp_ops *ops, *net;
	const char *node = getenv("FR_NODE");
	char why[256] = "", swhy[256] = "";
	bool shm_ok, rdma;

	if (!strcmp(name, "auto")) {
		/* each child probed once: the mixed transports' own probe is
		 * just the two */
		ops = fr_transport_find("shm");
		shm_ok = nranks > 1 && ops && !ops->probe(swhy, sizeof(swhy));
		if (nranks > 1 && !(node && *node) &&
		    fr_env_all_local(fr_env_getenv, NULL, nranks)) {
			if (shm_ok) {
				fr_info("transport: shm (the launcher puts all %d ranks on this host)",
					nranks);
				return ops;
			}
			fr_info("transport: not shm (%s)", swhy);
		}
		net = fr_transport_find("verbs");
		rdma = net && !net->probe(why, sizeof(why));
		if (rdma)
			snprintf(why, sizeof(why),
				 "an active RDMA port was found");
		else if (!net)
			snprintf(why, sizeof(why),
				 "the verbs transport is not built in");
		if (!rdma)
			net = fr_transport_find("tcp");
		if (shm_ok) {
			ops = fr_transport_find(rdma ? "shm+verbs" : "shm+tcp");
			fr_info("transport: %s (%s; shm to the ranks on this node)",
				ops->name, why);
			return ops;
		}
		fr_info("transport: %s (%s)", net->name, why);
		return net;
	}
	ops = fr_transport_find(name);
	if (!ops) {
		snprintf(
			err, errlen,
			"transport \"%s\" is unknown or not built in (FR_TRANSPORT=auto|tcp|shm|verbs|shm+tcp|shm+verbs)",
			name);
		return NULL;
	}
	if (ops->probe(why, sizeof(why))) {
		snprintf(err, errlen, "transport %s is not usable here: %s",
			 name, why);
		return NULL;
	}
	return ops;
}

/*
 * A card: what a rank tells the others at the rendezvous.
 *   u8 addr_len, addr, u8 mailbox_key_len, key, u32 microseconds of its
 *   TCP handshake with rank 0 (LE), u16 online CPUs of its host (LE), u64
 *   node id (LE)
 */
#define CARD_TAIL (4 + 2 + 8)
static int card_build(struct fr_comm *c, const void *addr, size_t addrlen,
		      uint32_t rtt_us, uint16_t cpus, struct fr_boot_card *card)
{
	uint8_t *p = card->data;
	size_t kl = FR_TP_RKEY_MAX;
	int rc;

	*p++ = (uint8_t)addrlen;
	memcpy(p, addr, addrlen);
	p += addrlen;
	rc = fr_peers_pack_card_key(c, p + 1, &kl);
	if (rc)
		return rc;
	*p = (uint8_t)kl;
	p += 1 + kl;
	fr_put_le32(p, rtt_us);
	p += 4;
	fr_put_le16(p, cpus);
	p += 2;
	fr_put_le64(p, c->topo.node_id);
	p += 8;
	card->len = (uint16_t)(p - card->data);
	return 0;
}

/*
 * Group the ranks by node (nodes numbered in order of their lowest rank)
 * and, when every node has the same number of ranks, list our node's ranks
 * and the ranks that share our local index.  Also how oversubscribed the
 * busiest node is: its ranks per online CPU (the fewest CPUs any of its
 * ranks reported), the same number on every rank since every rank sees
 * the same cards.
 */
int fr_comm_nodes_take(struct fr_comm *c, const uint64_t *ids,
		       const uint16_t *cpus)
{
	int n = c->nranks;
	size_t sz = n > 0 ? (size_t)n : 1;
	int *node = calloc(sz, sizeof(int)), *count = calloc(sz, sizeof(int));
	int *fewest = NULL;
	int rc = FR_ENOMEM;

	if (!node || !count)
		goto out;
	c->topo.nnodes = fr_topo_nodes(ids, n, node, count);
	c->topo.nodes_regular = true;
	for (int k = 1; k < c->topo.nnodes; k++)
		c->topo.nodes_regular &= count[k] == count[0];
	fewest = calloc(sz, sizeof(int));
	if (!fewest)
		goto out;
	for (int r = 0; r < n; r++)
		if (cpus[r] && (!fewest[node[r]] || cpus[r] < fewest[node[r]]))
			fewest[node[r]] = cpus[r];
	c->topo.oversub = 1.0;
	for (int k = 0; k < c->topo.nnodes; k++)
		if (fewest[k] && (double)count[k] / fewest[k] > c->topo.oversub)
			c->topo.oversub = (double)count[k] / fewest[k];
	c->topo.local = calloc(sz, sizeof(int));
	c->topo.cross = calloc(sz, sizeof(int));
	if (!c->topo.local || !c->topo.cross)
		goto out;
	c->topo.nlocal = 0;
	for (int r = 0; r < n; r++)
		if (node[r] == node[c->rank]) {
			if (r == c->rank)
				c->topo.local_index = c->topo.nlocal;
			c->topo.local[c->topo.nlocal++] = r;
		}
	/* the ring: node by node (topo.c) */
	c->topo.ring_order = calloc(sz, sizeof(int));
	if (!c->topo.ring_order ||
	    fr_topo_ring_order(node, count, c->topo.nnodes, n,
			       c->topo.ring_by_rank, c->topo.ring_order))
		goto out;
	for (int i = 0; i < n; i++)
		if (c->topo.ring_order[i] == c->rank)
			c->topo.ring_pos = i;
	c->topo.ring_crossings = fr_topo_ring_crossings(c->topo.ring_order,
							node, n, node[c->rank]);
	c->topo.ncross = 0;
	if (c->topo.nodes_regular) {
		int *seen = count; /* reused: ranks of each node seen so far */

		memset(seen, 0, sz * sizeof(int));
		for (int r = 0; r < n; r++)
			if (seen[node[r]]++ == c->topo.local_index) {
				if (r == c->rank)
					c->topo.cross_index = c->topo.ncross;
				c->topo.cross[c->topo.ncross++] = r;
			}
	}
	/* the grid's levels (FR_TOPO), where it holds the nodes (which
	 * fr_topo_levels checks); they fit in nnodes entries, the sum of
	 * sizes of 2 and more being at most their product */
	c->topo.nlevels = 0;
	if (c->topo.ngrid && c->topo.nodes_regular) {
		int *all = malloc((size_t)c->topo.nnodes * sizeof(int)), nl;

		if (!all)
			goto out;
		nl = fr_topo_levels(node, n, c->topo.nnodes, c->rank,
				    c->topo.grid, c->topo.ngrid, all,
				    c->topo.nlevel, c->topo.level_index);
		if (nl < 0) {
			free(all);
			goto out;
		}
		free(c->topo.level[0]);
		c->topo.level[0] = all;
		for (int l = 1; l < nl; l++)
			c->topo.level[l] =
				c->topo.level[l - 1] + c->topo.nlevel[l - 1];
		c->topo.nlevels = nl;
		if (!nl)
			fr_info("FR_TOPO's grid makes no level above the node (its cells are not the %d nodes, or its sizes are all 1)",
				c->topo.nnodes);
	}
	c->topo.node_of = node; /* the two-level RS / AG place every block */
	node = NULL;
	rc = 0;
out:
	free(fewest);
	free(count);
	free(node);
	return rc;
}

/* Hand every card's address to the shared endpoint, which connects by rank;
 * decode its mailbox key; take the layout. */
static int cards_take(struct fr_comm *c, const struct fr_boot_card *cards)
{
	uint8_t *addrs, *addrlens;
	uint64_t *ids;
	uint16_t *cpus;
	int rc;

	/* the addresses go to the shared endpoint, which keeps them */
	addrs = calloc((size_t)c->nranks, FR_TP_ADDR_MAX);
	addrlens = calloc((size_t)c->nranks, 1);
	ids = calloc((size_t)c->nranks, sizeof(*ids));
	cpus = calloc((size_t)c->nranks, sizeof(*cpus));
	if (!addrs || !addrlens || !ids || !cpus) {
		rc = FR_ENOMEM;
		goto out;
	}
	rc = FR_EPROTO;
	for (int r = 0; r < c->nranks; r++)
		if (cards[r].len < CARD_TAIL)
			goto out;
	for (int r = 0; r < c->nranks; r++) {
		const uint8_t *p = cards[r].data, *end = p + cards[r].len;

		if (r == c->rank)
			continue;
		if (p >= end || *p > FR_TP_ADDR_MAX || end - p < 1 + *p + 1)
			goto out;
		memcpy(addrs + (size_t)r * FR_TP_ADDR_MAX, p + 1, *p);
		addrlens[r] = *p;
		p += 1 + *p;
		if (*p > FR_TP_RKEY_MAX || end - p != 1 + *p + CARD_TAIL ||
		    fr_mem_unpack_key(c, p + 1, *p, &c->peer.mbx_rkeys[r]))
			goto out;
	}
	/* the network's round trip: the shortest that a rank on another
	 * node than rank 0 saw (a handshake within a node says nothing of
	 * the network, and one rank's slow handshake on a busy host is no
	 * long link); ids[0] is known before any other rank's */
	c->topo.rtt_us = 0;
	for (int r = 0; r < c->nranks; r++) {
		const uint8_t *t = cards[r].data + cards[r].len - CARD_TAIL;
		uint32_t rtt = fr_get_le32(t);

		cpus[r] = fr_get_le16(t + 4);
		ids[r] = fr_get_le64(t + 6);
		if (r && ids[r] != ids[0] &&
		    (!c->topo.rtt_us || rtt < c->topo.rtt_us))
			c->topo.rtt_us = rtt;
	}
	rc = fr_comm_nodes_take(c, ids, cpus);
	if (!rc)
		rc = fr_share_set_addrs(fr_share_of(c->tp), addrs, addrlens);
out:
	free(cpus);
	free(ids);
	free(addrlens);
	free(addrs);
	return rc;
}

/* FNV-1a: the transport's job nonce, equal on all ranks of one job. */
static uint64_t job_hash(const struct fr_settings *s)
{
	uint64_t h = 1469598103934665603ull;
	char buf[600];

	snprintf(buf, sizeof(buf), "%s|%s|%d", s->token, s->rendezvous,
		 s->nranks);
	for (const char *p = buf; *p; p++) {
		h ^= (unsigned char)*p;
		h *= 1099511628211ull;
	}
	return h;
}

/*
 * Mailbox geometry: FR_EAGER_BYTES of payload per slot (default 32 KiB, at
 * least 128: the ring's READY message must fit),
 * shrunk so that the mailbox (nranks x (slots + 2) slots and the small
 * CTRL slots of recovery, pinned on RDMA)
 * stays within 32 MiB on large jobs.
 */
size_t fr_mbx_slot_size(int nranks, size_t eager)
{
	size_t ctrl = fr_agree_ctrl_size(nranks);
	size_t row = (32u << 20) / (size_t)(nranks > 0 ? nranks : 1);
	size_t cap =
		(row > FR_CTRL_CHANNELS * ctrl ? row - FR_CTRL_CHANNELS * ctrl
					       : 0) /
		(FR_MBX_SLOTS + 2);

	if (!eager) {
		eager = 32u << 10;
		if (eager + FR_MSG_HDR > cap)
			eager = cap > 1024 + FR_MSG_HDR ? cap - FR_MSG_HDR
							: 1024;
		eager &= ~(size_t)63;
	}
	/* a CTRL message is assembled in an outbox slot */
	if (eager + FR_MSG_HDR < ctrl)
		eager = ctrl - FR_MSG_HDR;
	return eager + FR_MSG_HDR;
}

static void mailbox_size(struct fr_comm *c, size_t eager)
{
	c->peer.ctrl_size = fr_agree_ctrl_size(c->nranks);
	c->peer.mbx_slots = FR_MBX_SLOTS;
	c->peer.out_slots = 2 * FR_MBX_SLOTS;
	c->peer.mbx_slot_size = fr_mbx_slot_size(c->nranks, eager);
}

static void copy_msg(char *dst, size_t len, const char *src)
{
	size_t n = strlen(src);

	if (n >= len)
		n = len - 1;
	memcpy(dst, src, n);
	dst[n] = '\0';
}

/* What cards_take() made of the rendezvous: addresses and the layout. */
void fr_comm_free_cards(struct fr_comm *c)
{
	free(c->topo.local);
	free(c->topo.cross);
	free(c->topo.node_of);
	free(c->topo.level[0]);
	free(c->topo.ring_order);
}

/* Step 1's result in a communicator: its fields, its transport's table
 * and its lock (undone by comm_unnew). */
static int comm_new(const struct fr_settings *s, struct fr_comm **out,
		    char *err, size_t errlen)
{
	struct fr_comm *c;
	int rc;

	c = calloc(1, sizeof(*c));
	if (!c)
		return FR_ENOMEM;
	c->rank = s->rank;
	c->nranks = s->nranks;
	c->recipe = *s;
	c->peer.timeout_ms = (int)s->timeout_ms;
	c->peer.slow_timeout_ms = s->slow_timeout_ms;
	c->algo.segment_bytes = s->segment_bytes;
	c->algo.slots = (int)s->slots;
	c->mem.regcache_max = (int)s->regcache;
	c->eng.spin_us = (int)s->spin_us;
	c->topo.ring_by_rank = s->ring_by_rank;
	c->topo.ngrid = s->ngrid;
	memcpy(c->topo.grid, s->grid, sizeof(c->topo.grid));
	c->algo.forced = s->algo;
	c->fail.fail_origin = -1;
	c->fail.dead_first = -1;
	mailbox_size(c, s->eager_bytes);
	c->stats.size = sizeof(c->stats);
	c->thr.progress_mode = s->progress;
	c->thr.pt_cpu_mode = s->cpu_mode;
	c->thr.pt_cpus = s->cpus;
	c->tp_ops = choose_transport(s->transport, s->nranks, err, errlen);
	if (!c->tp_ops) {
		rc = strstr(s->transport, "verbs") ? FR_ENODEV : FR_EINVAL;
		goto err_transport;
	}
	rc = fr_lock_init(c);
	if (rc) {
		snprintf(err, errlen, "cannot create the communicator's lock");
		goto err_transport;
	}
	*out = c;
	return 0;

err_transport:
	free(c);
	return rc;
}

static void comm_unnew(struct fr_comm *c)
{
	fr_lock_fini(c);
	free(c);
}

/*
 * Step 3: the endpoint (reached over local_ip, NULL: any), its view, the
 * peers' state with the mailbox, and this rank's card for the others
 * (rtt_us: its handshake with rank 0; node_id: its host; cpus: its host's
 * online CPUs, 0: unknown).  Undone by comm_unopen.
 */
static int comm_open(struct fr_comm *c, const struct fr_settings *s,
		     const char *local_ip, uint32_t rtt_us, uint64_t node_id,
		     uint16_t cpus, struct fr_boot_card *card, char *err,
		     size_t errlen)
{
	struct fr_tp_params tp = {.size = sizeof(tp)};
	uint8_t addr[FR_TP_ADDR_MAX];
	size_t addrlen = sizeof(addr);
	int rc;

	tp.rank = s->rank;
	tp.job_nonce = job_hash(s);
	tp.local_ip = local_ip;
	tp.timeout_ms = (int)s->timeout_ms;
	tp.errbuf = err;
	tp.errlen = errlen;
	rc = c->tp_ops->open(&tp, &c->tp, addr, &addrlen);
	if (rc && !strcmp(s->transport, "auto") &&
	    strcmp(c->tp_ops->name, "tcp")) {
		/* auto: an RDMA port that cannot be used means TCP (should
		 * the other ranks differ, the rendezvous says so) */
		const char *fb = !strcmp(c->tp_ops->name, "shm+verbs")
					 ? "shm+tcp"
					 : "tcp";

		fr_warn("rank %d: %s transport unusable (%s); using %s",
			s->rank, c->tp_ops->name, err, fb);
		c->tp_ops = fr_transport_find(fb);
		addrlen = sizeof(addr);
		rc = c->tp_ops->open(&tp, &c->tp, addr, &addrlen);
		if (!rc)
			err[0] = '\0';
	}
	if (rc)
		return rc;
	/* every communicator talks through a view of the endpoint, which
	 * the ones split from this one share (transports/share) */
	rc = fr_share_new(c->tp_ops, c->tp, c->rank, c->nranks, &c->tp_ops,
			  &c->tp);
	if (rc) {
		snprintf(err, errlen, "rank %d: cannot share the endpoint: %s",
			 c->rank, fr_strerror(rc));
		goto err_share;
	}
	c->peer.ll = s->ll && c->tp_ops->write_inline;
	rc = fr_tune_load(&c->algo.tune, c->tp_ops->name, err, errlen);
	if (rc)
		goto err_share;
	rc = fr_peers_init(c);
	if (rc) {
		copy_msg(err, errlen, c->errmsg);
		goto err_share;
	}
	c->topo.node_id = node_id;
	rc = card_build(c, addr, addrlen, rtt_us, cpus, card);
	if (rc)
		goto err_card;
	return 0;

err_card:
	fr_peers_fini(c);
err_share:
	c->tp_ops->close(c->tp);
	return rc;
}

static void comm_unopen(struct fr_comm *c)
{
	fr_peers_fini(c);
	c->tp_ops->close(c->tp);
}

/* Step 4's end: every rank's card taken (the peers' addresses, the
 * layout), the cost model told of the job, the progress thread started. */
static int comm_finish(struct fr_comm *c, const struct fr_boot_card *cards,
		       char *err, size_t errlen)
{
	int rc;

	rc = cards_take(c, cards);
	if (rc == FR_EPROTO)
		snprintf(err, errlen,
			 "rank %d: malformed card at the rendezvous", c->rank);
	else if (rc)
		snprintf(err, errlen, "rank %d: taking the cards: %s", c->rank,
			 fr_strerror(rc));
	if (rc)
		goto err_cards;
	fr_tune_oversub(c);
	fr_tune_link(c);
	c->errmsg[0] = '\0';
	c->peer.last_activity_ms = fr_coarse_ms();
	/* one rank has nothing to progress */
	if (c->thr.progress_mode == FR_PROGRESS_THREAD && c->nranks > 1) {
		rc = fr_progress_thread_start(c, err, errlen);
		if (rc)
			goto err_cards;
	}
	fr_info("rank %d/%d: communicator up over %s (job %016llx)", c->rank,
		c->nranks, c->tp_ops->name, (unsigned long long)c->job_nonce);
	return 0;

err_cards:
	fr_comm_free_cards(c);
	return rc;
}

static int comm_create(const struct fr_settings *s, fr_comm_t **out, char *err,
		       size_t errlen)
{
	struct fr_boot_params bp = {0};
	struct fr_boot *boot = NULL;
	struct fr_boot_card mine, *cards = NULL;
	char config[FR_BOOT_CONFIG_MAX + 1], grid[64] = "-";
	struct fr_comm *c;
	int rc;

	rc = comm_new(s, &c, err, errlen);
	if (rc)
		return rc;

	/* Descriptors: rank 0 holds one per rank during the rendezvous, every
	 * rank one per connected partner and a few of its own.  Raise the soft
	 * limit if that is all it takes; else say so now, not at the n-th
	 * accept. */
	rc = fr_fd_reserve((s->rank == 0 ? (long)s->nranks : 0) + 32, err,
			   errlen);
	if (rc)
		goto err_boot;

	/* 2. rendezvous, phase 1 */
	bp.rank = s->rank;
	bp.nranks = s->nranks;
	bp.rendezvous = s->rendezvous;
	bp.token = s->has_token ? s->token : NULL;
	bp.timeout_ms = (int)s->boot_timeout_ms;
	bp.err = err;
	bp.errlen = errlen;
	rc = fr_boot_begin(&bp, &boot);
	if (rc)
		goto err_boot;

	/* 3. endpoint and the areas peers write into */
	rc = comm_open(c, s, fr_boot_local_ip(boot), fr_boot_rtt_us(boot),
		       fr_node_id(), fr_online_cpus(), &mine, err, errlen);
	if (rc)
		goto err_open;

	/* 4. rendezvous, phase 2: everything here must match on all ranks */
	cards = calloc((size_t)s->nranks, sizeof(*cards));
	if (!cards) {
		rc = FR_ENOMEM;
		goto err_cards;
	}
	for (int d = 0, o = 0; d < s->ngrid; d++)
		o += snprintf(grid + o, sizeof(grid) - (size_t)o, "%s%d",
			      d ? "x" : "", s->grid[d]);
	snprintf(
		config, sizeof(config),
		"transport=%s segment=%zu slots=%ld algo=%s eager=%zu tune=%08x ring=%s topo=%s%s",
		c->tp_ops->name, c->algo.segment_bytes, s->slots,
		fr_algo_name(c->algo.forced), fr_msg_payload_max(c),
		fr_tune_hash(&c->algo.tune),
		c->topo.ring_by_rank ? "rank" : "node", grid,
		/* where the transport has lines, FR_LL decides the small
		 * All-Reduce's schedule (algo/ll.c); elsewhere only the
		 * header's form, which every rank reads */
		!c->tp_ops->line_bytes ? ""
		: s->ll		       ? " ll=1"
				       : " ll=0");
	rc = fr_boot_exchange(boot, config, &mine, cards, &c->job_nonce);
	if (rc)
		goto err_exchange;
	fr_boot_end(boot);
	boot = NULL;

	rc = comm_finish(c, cards, err, errlen);
	if (rc)
		goto err_exchange;
	free(cards);
	*out = c;
	return 0;

err_exchange:
	free(cards);
err_cards:
	comm_unopen(c);
err_open:
	fr_boot_end(boot);
err_boot:
	comm_unnew(c);
	return rc;
}

int fr_comm_create(const fr_config_t *cfg, fr_comm_t **comm)
{
	struct fr_settings s = {0};
	char host[256];
	uint16_t port;
	int rc;

	create_err[0] = '\0';
	if (comm)
		*comm = NULL;
	if (!cfg || !comm || cfg->size < offsetof(fr_config_t, transport)) {
		snprintf(
			create_err, sizeof(create_err), "fr_comm_create: %s",
			!cfg || !comm
				? "NULL argument"
				: "config size too small (use fr_config_init)");
		return FR_EINVAL;
	}
	if (cfg->nranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->nranks) {
		snprintf(create_err, sizeof(create_err),
			 "fr_comm_create: rank %d / nranks %d out of range",
			 cfg->rank, cfg->nranks);
		return FR_EINVAL;
	}
	if (cfg->nranks > 1 &&
	    (!cfg->rendezvous ||
	     fr_parse_hostport(cfg->rendezvous, host, sizeof(host), &port))) {
		snprintf(create_err, sizeof(create_err),
			 "fr_comm_create: rendezvous \"%s\" is not host:port",
			 cfg->rendezvous ? cfg->rendezvous : "(null)");
		return FR_EINVAL;
	}
	rc = resolve_settings(cfg, &s, create_err, sizeof(create_err));
	if (rc)
		return rc;
	s.rank = cfg->rank;
	s.nranks = cfg->nranks;
	snprintf(s.rendezvous, sizeof(s.rendezvous), "%s",
		 cfg->rendezvous ? cfg->rendezvous : "127.0.0.1:1");
	return comm_create(&s, comm, create_err, sizeof(create_err));
}

/* fr_comm_destroy after the goodbye (clean: every peer said it). */
static void comm_destroy_rest(struct fr_comm *comm, bool clean)
{
	/* before the mailbox goes: whether a late write may still need it */
	fr_share_closing(comm->tp, clean);
	fr_algos_comm_free(comm);
	fr_scratch_free(comm);
	fr_mem_cache_flush(comm);
	fr_agree_fini(comm);
	comm_unopen(comm);
	fr_comm_free_cards(comm);
	comm_unnew(comm);
}

/*
 * A job in this process (internal.h): every rank's communicator opened,
 * every card built, then every card taken, which is what the rendezvous
 * does between processes; the job nonce is the settings' hash, the same
 * on every rank, so a run is repeatable.
 */
int fr_comm_create_local(const fr_config_t *cfg, int n,
			 const uint64_t *node_ids, fr_comm_t **comms)
{
	struct fr_settings s = {0};
	struct fr_boot_card *cards = NULL;
	char *err = create_err;
	size_t errlen = sizeof(create_err);
	int r = 0, opened = 0, rc;

	create_err[0] = '\0';
	if (!cfg || !comms || n < 1 ||
	    cfg->size < offsetof(fr_config_t, transport)) {
		snprintf(err, errlen, "fr_comm_create_local: %s",
			 !cfg || !comms ? "NULL argument"
			 : n < 1	? "fewer than one rank"
					: "config size too small");
		return FR_EINVAL;
	}
	for (int i = 0; i < n; i++)
		comms[i] = NULL;
	rc = resolve_settings(cfg, &s, err, errlen);
	if (rc)
		return rc;
	s.nranks = n;
	snprintf(s.rendezvous, sizeof(s.rendezvous), "local:%d", n);
	cards = calloc((size_t)n, sizeof(*cards));
	if (!cards) {
		snprintf(err, errlen,
			 "fr_comm_create_local: no memory for %d cards", n);
		return FR_ENOMEM;
	}
	/* an endpoint may hold a descriptor or two (the fake's eventfd) */
	rc = fr_fd_reserve(2L * n + 32, err, errlen);
	if (rc)
		goto out;
	for (r = 0; r < n; r++) {
		s.rank = r;
		rc = comm_new(&s, &comms[r], err, errlen);
		if (rc)
			goto unwind;
		/* no CPU count: the ranks of a job of this process are not
		 * processes competing for this host's CPUs, and the model
		 * must not take them for it (oversubscription), or what a
		 * simulation chooses would depend on the machine it ran on */
		rc = comm_open(comms[r], &s, NULL, 0,
			       node_ids ? node_ids[r] : fr_node_id(), 0,
			       &cards[r], err, errlen);
		if (rc) {
			comm_unnew(comms[r]);
			comms[r] = NULL;
			goto unwind;
		}
		comms[r]->job_nonce = job_hash(&s);
	}
	opened = n;
	for (r = 0; r < n; r++) {
		rc = comm_finish(comms[r], cards, err, errlen);
		if (rc)
			goto unfinish;
	}
	rc = 0;
	goto out;

unfinish:
	/* the finished ones first: their progress threads may run */
	while (r-- > 0) {
		fr_progress_thread_stop(comms[r]);
		fr_comm_free_cards(comms[r]);
	}
	r = opened;
unwind:
	while (r-- > 0) {
		comm_unopen(comms[r]);
		comm_unnew(comms[r]);
		comms[r] = NULL;
	}
out:
	free(cards);
	return rc;
}

/*
 * Destroy a job of this process: fr_comm_destroy on each, with the
 * goodbyes (each rank's BYE to its peers and theirs to it) taken in turns
 * from this one thread, so that no rank waits for a peer nobody drives.
 */
int fr_comm_destroy_local(int n, fr_comm_t **comms)
{
	uint64_t wait_ms = 0, deadline;
	bool *done, *clean;
	int left = 0;

	done = calloc(n > 0 ? (size_t)n : 1, sizeof(*done));
	clean = calloc(n > 0 ? (size_t)n : 1, sizeof(*clean));
	if (!done || !clean) {
		/* one at a time: slower (each waits out its goodbye), sound */
		for (int r = 0; r < n; r++)
			fr_comm_destroy(comms[r]);
		goto out;
	}
	for (int r = 0; r < n; r++) {
		struct fr_comm *c = comms[r];

		if (!c) {
			done[r] = true;
			continue;
		}
		fr_progress_thread_stop(c);
		fr_requests_abandon(c);
		wait_ms = FR_MAX(wait_ms, fr_peers_goodbye_ms(c));
		clean[r] = c->nranks == 1;
		done[r] = clean[r];
		left += !done[r];
	}
	deadline = fr_now_ms() + wait_ms;
	while (left && fr_now_ms() < deadline) {
		bool busy = false;

		for (int r = 0; r < n; r++) {
			bool idle;
			int rc;

			if (done[r])
				continue;
			rc = fr_peers_goodbye_step(comms[r], &clean[r], &idle);
			if (rc) {
				if (rc < 0)
					clean[r] = false;
				done[r] = true;
				left--;
			}
			busy |= !idle;
		}
		/* nothing moved anywhere: a peer of this process that is
		 * gone, or a transport with a real delay; do not spin */
		if (!busy && left)
			nanosleep(&(struct timespec){0, 1000000}, NULL);
	}
	for (int r = 0; r < n; r++)
		if (comms[r])
			comm_destroy_rest(comms[r], clean[r]);
out:
	for (int r = 0; r < n; r++)
		comms[r] = NULL;
	free(clean);
	free(done);
	return 0;
}

static bool env_join(void)
{
	const char *e = getenv("FR_JOIN");

	return e && *e && strcmp(e, "0");
}

int fr_comm_create_from_env(const fr_config_t *cfg, fr_comm_t **comm)
{
	struct fr_launch l;
	struct fr_settings s = {0};
	int rc;

	/* a replacement the launcher started (frrun --respawn) */
	if (env_join())
		return fr_comm_join(cfg, comm);

	create_err[0] = '\0';
	if (comm)
		*comm = NULL;
	if (!comm || (cfg && cfg->size < offsetof(fr_config_t, transport))) {
		snprintf(create_err, sizeof(create_err),
			 "fr_comm_create_from_env: %s",
			 !comm ? "NULL argument"
			       : "config size too small (use fr_config_init)");
		return FR_EINVAL;
	}
	rc = fr_env_detect(fr_env_getenv, NULL, &l, create_err,
			   sizeof(create_err));
	if (rc)
		return rc;
	rc = resolve_settings(cfg, &s, create_err, sizeof(create_err));
	if (rc)
		return rc;
	s.rank = l.rank;
	s.nranks = l.nranks;
	snprintf(s.rendezvous, sizeof(s.rendezvous), "%s", l.rendezvous);
	fr_dbg("rank %d/%d from %s, rendezvous %s", l.rank, l.nranks,
	       l.launcher, l.rendezvous);
	return comm_create(&s, comm, create_err, sizeof(create_err));
}

/*
 * Grow and join: re-admission (fastreduce(7), "Grow").  The ranks of comm
 * and nnew newcomers make a communicator of n + nnew ranks: comm's ranks
 * first, in their order, then the newcomers in the order they came.  Its
 * rendezvous is the grow address - FR_GROW_RENDEZVOUS, else the job's
 * rendezvous address - where the grow's leader, comm's rank 0, listens:
 *   1. the leader hands each newcomer a ticket (its rank, the size and a
 *      random nonce) there, for up to the timeout (bootstrap.c), making
 *      progress on comm meanwhile so that the others, waiting for it in
 *      step 2, see it alive;
 *   2. it broadcasts the outcome and the nonce over comm: every rank of
 *      comm fails alike, at once, when a newcomer did not come;
 *   3. the n + nnew ranks bootstrap the communicator as at the start, at
 *      the grow address, with the job token prefixed by the nonce (a
 *      process that took no ticket from this grow cannot mix in).
 * Its connections are new (a newcomer has none to reuse); comm is left as
 * it was, for the caller to destroy.  The grown communicator's recipe is
 * the job's, so that it can grow again.
 */
/* as many as a launcher may name (env.c) */
#define GROW_MAX_RANKS (1 << 24)

static void grow_token(struct fr_settings *s, uint64_t nonce)
{
	char tok[sizeof(s->token)];

	snprintf(tok, sizeof(tok), "%016llx#%.239s", (unsigned long long)nonce,
		 s->token);
	memcpy(s->token, tok, sizeof(tok));
	s->has_token = true;
}

static int grow_create(const struct fr_settings *base, const char *addr,
		       int rank, int nranks, uint64_t nonce, fr_comm_t **out)
{
	struct fr_settings s = *base;
	int rc;

	snprintf(s.rendezvous, sizeof(s.rendezvous), "%s", addr);
	s.rank = rank;
	s.nranks = nranks;
	grow_token(&s, nonce);
	rc = comm_create(&s, out, create_err, sizeof(create_err));
	if (!rc) {
		(*out)->recipe = *base;
		(*out)->recipe.rank = rank;
		(*out)->recipe.nranks = nranks;
	}
	return rc;
}

static void grow_idle(void *comm)
{
	(void)fr_progress(comm);
}

int fr_comm_grow(fr_comm_t *comm, int nnew, fr_comm_t **newcomm)
{
	const char *e = getenv("FR_GROW_RENDEZVOUS");
	char addr[sizeof(comm->recipe.rendezvous)], err[FR_ERRMSG_MAX] = "";
	uint64_t msg[2] = {0, 0}; /* outcome, nonce */
	int served = 0, rc;

	if (newcomm)
		*newcomm = NULL;
	if (!comm || !newcomm)
		return FR_EINVAL;
	if (nnew < 1 || nnew > GROW_MAX_RANKS - comm->nranks)
		return fr_comm_seterr(comm, FR_EINVAL,
				      "fr_comm_grow: %d newcomers (1 .. %d)",
				      nnew, GROW_MAX_RANKS - comm->nranks);
	snprintf(addr, sizeof(addr), "%s",
		 e && *e ? e : comm->recipe.rendezvous);
	if (comm->rank == 0) {
		if (getrandom(&msg[1], sizeof(msg[1]), 0) != sizeof(msg[1]))
			msg[1] = fr_now_ns() ^ ((uint64_t)getpid() << 32);
		rc = fr_boot_tickets_serve(
			addr,
			comm->recipe.has_token ? comm->recipe.token : NULL,
			(uint32_t)comm->nranks, nnew,
			(uint32_t)(comm->nranks + nnew), msg[1],
			(int)comm->recipe.timeout_ms, grow_idle, comm, &served,
			err, sizeof(err));
		msg[0] = (uint64_t)(int64_t)rc;
	}
	rc = fr_broadcast(comm, msg, 2, FR_U64, 0);
	if (rc)
		return rc;
	if (msg[0])
		return fr_comm_seterr(
			comm, (int)(int64_t)msg[0], "fr_comm_grow: %s",
			comm->rank == 0
				? err
				: "the grow's leader (rank 0) could not admit every newcomer (see its message)");
	rc = grow_create(&comm->recipe, addr, comm->rank, comm->nranks + nnew,
			 msg[1], newcomm);
	if (rc)
		fr_comm_seterr(comm, rc, "fr_comm_grow: %s", create_err);
	return rc;
}

int fr_comm_join(const fr_config_t *cfg, fr_comm_t **newcomm)
{
	const char *e = getenv("FR_GROW_RENDEZVOUS");
	struct fr_boot_ticket t;
	struct fr_settings s = {0};
	struct fr_launch l;
	char addr[sizeof(s.rendezvous)], host[256];
	uint16_t port;
	int rc;

	create_err[0] = '\0';
	if (newcomm)
		*newcomm = NULL;
	if (!newcomm || (cfg && cfg->size < offsetof(fr_config_t, transport))) {
		snprintf(
			create_err, sizeof(create_err), "fr_comm_join: %s",
			!newcomm
				? "NULL argument"
				: "config size too small (use fr_config_init)");
		return FR_EINVAL;
	}
	rc = resolve_settings(cfg, &s, create_err, sizeof(create_err));
	if (rc)
		return rc;
	if (cfg && cfg->rendezvous && *cfg->rendezvous) {
		snprintf(addr, sizeof(addr), "%s", cfg->rendezvous);
	} else if (e && *e) {
		snprintf(addr, sizeof(addr), "%s", e);
	} else {
		rc = fr_env_detect(fr_env_getenv, NULL, &l, create_err,
				   sizeof(create_err));
		if (rc) {
			snprintf(
				create_err, sizeof(create_err),
				"fr_comm_join: where is the grow's leader? set FR_GROW_RENDEZVOUS=host:port (or the job's FR_RENDEZVOUS)");
			return rc;
		}
		snprintf(addr, sizeof(addr), "%s", l.rendezvous);
	}
	if (fr_parse_hostport(addr, host, sizeof(host), &port)) {
		snprintf(create_err, sizeof(create_err),
			 "fr_comm_join: grow address \"%s\" is not host:port",
			 addr);
		return FR_EINVAL;
	}
	snprintf(s.rendezvous, sizeof(s.rendezvous), "%s", addr);
	/* the survivors come to grow only once they have recovered: patience
	 * as for a rank that has not entered a collective yet */
	rc = fr_boot_ticket_get(addr, s.has_token ? s.token : NULL,
				(int)s.slow_timeout_ms, &t, create_err,
				sizeof(create_err));
	if (rc)
		return rc;
	fr_dbg("joining as rank %u of %u at %s", t.rank, t.nranks, addr);
	return grow_create(&s, addr, (int)t.rank, (int)t.nranks, t.nonce,
			   newcomm);
}

int fr_comm_destroy(fr_comm_t *comm)
{
	bool clean;

	if (!comm)
		return 0;
	/* from here on single-threaded again */
	fr_progress_thread_stop(comm);
	fr_requests_abandon(comm);
	clean = comm->nranks == 1 || fr_peers_goodbye(comm);
	comm_destroy_rest(comm, clean);
	return 0;
}

int fr_comm_rank(const fr_comm_t *comm)
{
	return comm ? comm->rank : FR_EINVAL;
}

int fr_comm_size(const fr_comm_t *comm)
{
	return comm ? comm->nranks : FR_EINVAL;
}

const char *fr_comm_transport(const fr_comm_t *comm)
{
	return comm ? comm->tp_ops->name : "?";
}

int fr_comm_last_algo(const fr_comm_t *comm)
{
	int algo;

	if (!comm)
		return FR_EINVAL;
	fr_lock((struct fr_comm *)comm);
	algo = comm->eng.last_algo;
	fr_unlock((struct fr_comm *)comm);
	return algo;
}

const char *fr_comm_last_error(const fr_comm_t *comm)
{
	return comm ? comm->errmsg : create_err;
}

int fr_comm_stats(const fr_comm_t *comm, fr_stats_t *stats)
{
	size_t n;

	if (!comm || !stats || stats->size < sizeof(size_t))
		return FR_EINVAL;
	n = FR_MIN(stats->size, sizeof(comm->stats));
	/* Copy only what the caller's version of the struct has room for;
	 * the progress thread may be counting: under the lock. */
	fr_lock((struct fr_comm *)comm);
	memcpy((char *)stats + sizeof(size_t),
	       (const char *)&comm->stats + sizeof(size_t), n - sizeof(size_t));
	fr_unlock((struct fr_comm *)comm);
	return 0;
}

int fr_mem_register(fr_comm_t *comm, void *buf, size_t len, fr_mem_t **mem)
{
	int rc;

	if (!comm)
		return FR_EINVAL;
	fr_lock(comm);
	rc = fr_mem_user_register(comm, buf, len, mem);
	fr_unlock(comm);
	return rc;
}

int fr_mem_deregister(fr_mem_t *mem)
{
	struct fr_comm *comm;
	int rc;

	if (!mem)
		return 0;
	comm = mem->comm;
	fr_lock(comm);
	rc = fr_mem_user_deregister(mem);
	fr_unlock(comm);
	return rc;
}
