/* SPDX-License-Identifier: MIT */
/*
 * verbs_dev.c - which RDMA device, port and GID an endpoint uses, and
 * what the device allows: FR_IB_DEV / FR_IB_GID_INDEX, the GID table scan,
 * the hwloc ranking of several devices (the rules are at the top of
 * fr_verbs.c), probe(), the limits open() sizes its queues by, and
 * locality().  Everything here reads the device; nothing holds a
 * connection, so it sits below the rest of the transport.
 */

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hwloc.h>
#include <hwloc/linux.h>
#include <hwloc/openfabrics-verbs.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "fastreduce.h"
#include "log.h"
#include "util.h"
#include "verbs.h"

/* ---- small helpers ------------------------------------------------------- */

void __attribute__((format(printf, 3, 4)))
verbs_msg(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!buf || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

static bool verbs_v4mapped(const uint8_t *raw)
{
	static const uint8_t prefix[12] = {0, 0, 0, 0, 0,    0,
					   0, 0, 0, 0, 0xff, 0xff};

	return !memcmp(raw, prefix, sizeof(prefix));
}

/* "PORT_ACTIVE" -> "ACTIVE" */
static const char *verbs_port_state(enum ibv_port_state s)
{
	const char *t = ibv_port_state_str(s);

	return strncmp(t, "PORT_", 5) ? t : t + 5;
}

/* The devices there are; NULL, with a message in err, when none can be
 * listed (no RDMA in the kernel: ENOSYS). */
static struct ibv_device **verbs_devices(int *ndev, char *err, size_t errlen)
{
	struct ibv_device **list = ibv_get_device_list(ndev);

	if (!list)
		verbs_msg(err, errlen,
			  "no RDMA device: ibv_get_device_list: %s",
			  fr_syserr(errno));
	return list;
}

/* ---- device choice ------------------------------------------------------- */

struct verbs_cand {
	int dev; /* index in the device list */
	uint8_t port;
	bool ib;   /* InfiniBand link layer: addressed by IPoIB */
	int match; /* GID index holding local_ip, or -1 */
	int v4;	   /* first RoCE v2 IPv4-mapped GID, or -1 */
	int v6;	   /* first RoCE v2 global IPv6 GID, or -1 */
	bool ovr;  /* FR_IB_GID_INDEX exists on this port */
	struct ibv_gid_entry match_e, v4_e, v6_e, ovr_e;
	int score; /* hwloc: 0 near this thread, 1 unknown, 2 far */
};

/* FR_IB_DEV=name[:port]; port 0 = any. */
static int verbs_parse_dev(const char *s, char *name, size_t len, int *port)
{
	const char *colon = strchr(s, ':');
	size_t n = colon ? (size_t)(colon - s) : strlen(s);
	long p = 0;

	if (!n || n >= len)
		return FR_EINVAL;
	if (colon && fr_parse_long(colon + 1, 1, 255, &p))
		return FR_EINVAL;
	memcpy(name, s, n);
	name[n] = '\0';
	*port = (int)p;
	return 0;
}

/* local_ip as a GID-comparable address; false if it is no usable hint. */
static bool verbs_hint(const char *ip, uint8_t *raw, int *family)
{
	struct in6_addr a6;
	struct in_addr a4;

	if (!ip)
		return false;
	if (inet_pton(AF_INET, ip, &a4) == 1) {
		/* rdma_cm cannot run over loopback; 0.0.0.0 names nothing. */
		if ((ntohl(a4.s_addr) >> 24) == 127 || a4.s_addr == INADDR_ANY)
			return false;
		memset(raw, 0, 10);
		raw[10] = raw[11] = 0xff;
		memcpy(raw + 12, &a4, 4);
		*family = AF_INET;
		return true;
	}
	if (inet_pton(AF_INET6, ip, &a6) == 1) {
		if (IN6_IS_ADDR_LOOPBACK(&a6) || IN6_IS_ADDR_UNSPECIFIED(&a6))
			return false;
		memcpy(raw, &a6, 16);
		*family = AF_INET6;
		return true;
	}
	return false;
}

static void verbs_gid_sockaddr(const struct ibv_gid_entry *e,
			       struct sockaddr_storage *sa)
{
	memset(sa, 0, sizeof(*sa));
	if (verbs_v4mapped(e->gid.raw)) {
		struct sockaddr_in *in = (struct sockaddr_in *)sa;

		in->sin_family = AF_INET;
		memcpy(&in->sin_addr, e->gid.raw + 12, 4);
	} else {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;

		in6->sin6_family = AF_INET6;
		memcpy(&in6->sin6_addr, e->gid.raw, 16);
		if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr))
			in6->sin6_scope_id = e->ndev_ifindex;
	}
}

/* Scan a port's GID table for the RoCE v2 entries we can use. */
static void verbs_scan_gids(struct ibv_context *ctx, struct verbs_cand *k,
			    int tbl_len, const uint8_t *hint, bool hint_ok,
			    long ovr)
{
	struct ibv_gid_entry e;
	int g;

	for (g = 0; g < tbl_len; g++) {
		if (ibv_query_gid_ex(ctx, k->port, (uint32_t)g, &e, 0))
			continue; /* an empty slot */
		if (g == ovr) {
			k->ovr = true;
			k->ovr_e = e;
		}
		if (e.gid_type != IBV_GID_TYPE_ROCE_V2)
			continue;
		if (hint_ok && k->match < 0 && !memcmp(e.gid.raw, hint, 16)) {
			k->match = g;
			k->match_e = e;
		}
		if (verbs_v4mapped(e.gid.raw)) {
			if (k->v4 < 0) {
				k->v4 = g;
				k->v4_e = e;
			}
		} else if (k->v6 < 0 && !IN6_IS_ADDR_LINKLOCAL(
						(struct in6_addr *)e.gid.raw)) {
			k->v6 = g;
			k->v6_e = e;
		}
	}
}

/*
 * The ACTIVE ports worth considering (FR_IB_DEV filters), with what their
 * GID tables offer.  why: a message for when there is none.
 */
static int verbs_scan(struct ibv_device **list, int ndev, const char *want,
		      int want_port, const uint8_t *hint, bool hint_ok,
		      long ovr, struct verbs_cand *cands, char *why,
		      size_t whylen)
{
	int i, p, n = 0;
	bool named = false;

	verbs_msg(why, whylen, "no RDMA device has an ACTIVE port");
	for (i = 0; i < ndev && n < VERBS_MAX_CANDS; i++) {
		const char *name = ibv_get_device_name(list[i]);
		struct ibv_device_attr da;
		struct ibv_context *ctx;

		if (want && strcmp(name, want))
			continue;
		named = true;
		ctx = ibv_open_device(list[i]);
		if (!ctx) {
			verbs_msg(why, whylen, "device %s: ibv_open_device: %s",
				  name, fr_syserr(errno));
			continue;
		}
		if (ibv_query_device(ctx, &da)) {
			verbs_msg(why, whylen,
				  "device %s: ibv_query_device: %s", name,
				  fr_syserr(errno));
			ibv_close_device(ctx);
			continue;
		}
		if (want_port > da.phys_port_cnt)
			verbs_msg(why, whylen, "device %s has no port %d", name,
				  want_port);
		for (p = 1; p <= da.phys_port_cnt && n < VERBS_MAX_CANDS; p++) {
			struct verbs_cand *k = &cands[n];
			struct ibv_port_attr pa;

			if (want_port && p != want_port)
				continue;
			if (ibv_query_port(ctx, (uint8_t)p, &pa)) {
				verbs_msg(
					why, whylen,
					"device %s port %d: ibv_query_port: %s",
					name, p, fr_syserr(errno));
				continue;
			}
			if (pa.state != IBV_PORT_ACTIVE) {
				verbs_msg(why, whylen,
					  "device %s port %d is %s", name, p,
					  verbs_port_state(pa.state));
				continue;
			}
			memset(k, 0, sizeof(*k));
			k->dev = i;
			k->port = (uint8_t)p;
			k->ib = pa.link_layer != IBV_LINK_LAYER_ETHERNET;
			k->match = k->v4 = k->v6 = -1;
			k->score = 1;
			verbs_scan_gids(ctx, k, pa.gid_tbl_len, hint,
					hint_ok && !k->ib, ovr);
			n++;
		}
		ibv_close_device(ctx);
	}
	if (want && !named)
		verbs_msg(why, whylen,
			  "FR_IB_DEV=%s: no RDMA device of that name", want);
	return n;
}

/*
 * Rank candidates by locality to the calling thread: 0 when the device
 * hangs off this thread's NUMA node, 2 when it is elsewhere, 1 unknown
 * (a software device has no PCI locality).  Best effort: without hwloc's
 * answer every device stays at 1 and the first one wins.
 */
static void verbs_hwloc_rank(struct ibv_device **list, struct verbs_cand *cands,
			     int n)
{
	hwloc_topology_t topo;
	hwloc_bitmap_t here, nodes, set;
	hwloc_const_cpuset_t all;
	int i;

	if (hwloc_topology_init(&topo))
		return;
	/* I/O objects are needed to find the OS device of an HCA. */
	hwloc_topology_set_io_types_filter(topo,
					   HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
	if (hwloc_topology_load(topo))
		goto out_load;
	here = hwloc_bitmap_alloc();
	if (!here)
		goto out_here;
	nodes = hwloc_bitmap_alloc();
	if (!nodes)
		goto out_nodes;
	set = hwloc_bitmap_alloc();
	if (!set)
		goto out_set;
	/* A pinned thread stays where it is bound; an unbound one is best
	 * described by where it runs now. */
	all = hwloc_topology_get_allowed_cpuset(topo);
	if (hwloc_get_cpubind(topo, here, HWLOC_CPUBIND_THREAD) ||
	    hwloc_bitmap_isincluded(all, here)) {
		if (hwloc_get_last_cpu_location(topo, here,
						HWLOC_CPUBIND_THREAD))
			goto out_where;
	}
	hwloc_cpuset_to_nodeset(topo, here, nodes);
	for (i = 0; i < n; i++) {
		struct ibv_device *dev = list[cands[i].dev];
		hwloc_obj_t os = hwloc_ibv_get_device_osdev(topo, dev);
		hwloc_obj_t anc =
			os ? hwloc_get_non_io_ancestor_obj(topo, os) : NULL;

		if (anc && anc->nodeset && !hwloc_bitmap_iszero(anc->nodeset) &&
		    !hwloc_bitmap_iszero(nodes)) {
			cands[i].score =
				hwloc_bitmap_intersects(anc->nodeset, nodes)
					? 0
					: 2;
		} else if (!hwloc_ibv_get_device_cpuset(topo, dev, set) &&
			   !hwloc_bitmap_iszero(set) &&
			   !hwloc_bitmap_isincluded(all, set)) {
			cands[i].score =
				hwloc_bitmap_intersects(set, here) ? 0 : 2;
		}
		fr_dbg("verbs: %s port %u: locality score %d",
		       ibv_get_device_name(dev), cands[i].port, cands[i].score);
	}
out_where:
	hwloc_bitmap_free(set);
out_set:
	hwloc_bitmap_free(nodes);
out_nodes:
	hwloc_bitmap_free(here);
out_here:
out_load:
	hwloc_topology_destroy(topo);
}

/* Can we bind an address on this port without a hint? */
static bool verbs_cand_usable(const struct verbs_cand *k, bool have_ip,
			      long ovr)
{
	if (k->ib)
		return have_ip;
	if (ovr >= 0)
		return k->ovr;
	return k->v4 >= 0 || k->v6 >= 0;
}

/* Choose device, port, GID and the address to bind (see fr_verbs.c). */
int verbs_choose(const struct fr_tp_params *p, struct verbs_choice *ch,
		 char *err, size_t errlen)
{
	struct verbs_cand cands[VERBS_MAX_CANDS], *k = NULL;
	char want[IBV_SYSFS_NAME_MAX], why[160];
	const char *env;
	struct ibv_device **list;
	uint8_t hint[16];
	int ndev, n, i, want_port = 0, family = 0, ndevs_usable = 0;
	bool hint_ok, have_ip;
	long ovr = -1;

	env = getenv("FR_IB_DEV");
	if (env && *env &&
	    verbs_parse_dev(env, want, sizeof(want), &want_port)) {
		verbs_msg(err, errlen, "FR_IB_DEV=\"%s\" is not name[:port]",
			  env);
		return FR_EINVAL;
	}
	env = env && *env ? want : NULL;
	{
		const char *g = getenv("FR_IB_GID_INDEX");

		if (g && *g && fr_parse_long(g, 0, 65535, &ovr)) {
			verbs_msg(err, errlen,
				  "FR_IB_GID_INDEX=\"%s\" is not a GID index",
				  g);
			return FR_EINVAL;
		}
	}
	hint_ok = verbs_hint(p->local_ip, hint, &family);
	have_ip = hint_ok;

	list = verbs_devices(&ndev, err, errlen);
	if (!list)
		return FR_ENODEV;
	n = verbs_scan(list, ndev, env, want_port, hint, hint_ok, ovr, cands,
		       why, sizeof(why));
	if (!n) {
		verbs_msg(err, errlen, "%s",
			  ndev ? why : "no RDMA device found");
		ibv_free_device_list(list);
		return FR_ENODEV;
	}
	memset(ch, 0, sizeof(*ch));
	ch->gid_index = -1;

	/* 1. The port that owns the address we bootstrapped over. */
	for (i = 0; i < n && !k; i++)
		if (cands[i].match >= 0) {
			k = &cands[i];
			ch->why = "its GID holds local_ip";
		}
	/* 2. local_ip on InfiniBand is an IPoIB address: bind it and let
	 *    rdma_cm find its port (checked after binding). */
	for (i = 0; i < n && !k && hint_ok; i++)
		if (cands[i].ib) {
			k = &cands[i];
			ch->why = "InfiniBand, local_ip as its IPoIB address";
		}
	/* 3. The first usable port, on the device nearest to us. */
	if (!k) {
		int last = -1;

		/* Ports come grouped by device: count distinct devices. */
		for (i = 0; i < n; i++)
			if (verbs_cand_usable(&cands[i], have_ip, ovr) &&
			    cands[i].dev != last) {
				last = cands[i].dev;
				ndevs_usable++;
			}
		if (ndevs_usable > 1)
			verbs_hwloc_rank(list, cands, n);
		for (i = 0; i < n; i++)
			if (verbs_cand_usable(&cands[i], have_ip, ovr) &&
			    (!k || cands[i].score < k->score))
				k = &cands[i];
		ch->why = ndevs_usable > 1 ? "nearest to this thread (hwloc)"
					   : "first ACTIVE port";
	}
	if (!k) {
		k = &cands[0];
		if (ovr >= 0)
			verbs_msg(
				err, errlen,
				"FR_IB_GID_INDEX=%ld: no such GID on %s port %u",
				ovr, ibv_get_device_name(list[k->dev]),
				k->port);
		else if (k->ib)
			verbs_msg(
				err, errlen,
				"device %s port %u is InfiniBand, and rdma_cm needs its IPoIB address, but no local address was given",
				ibv_get_device_name(list[k->dev]), k->port);
		else
			verbs_msg(
				err, errlen,
				"device %s port %u has no RoCE v2 GID with an IP address",
				ibv_get_device_name(list[k->dev]), k->port);
		ibv_free_device_list(list);
		return FR_ENODEV;
	}
	snprintf(ch->dev, sizeof(ch->dev), "%s",
		 ibv_get_device_name(list[k->dev]));
	ibv_free_device_list(list);
	ch->port = k->port;
	ch->ib = k->ib;

	if (k->ib) {
		if (ovr >= 0)
			fr_info("verbs: FR_IB_GID_INDEX has no effect on InfiniBand port %s:%u (rdma_cm addresses it by IPoIB)",
				ch->dev, ch->port);
		if (inet_pton(AF_INET, p->local_ip,
			      &((struct sockaddr_in *)&ch->sa)->sin_addr) ==
		    1) {
			ch->sa.ss_family = AF_INET;
		} else {
			inet_pton(AF_INET6, p->local_ip,
				  &((struct sockaddr_in6 *)&ch->sa)->sin6_addr);
			ch->sa.ss_family = AF_INET6;
		}
		return 0;
	}
	if (ovr >= 0) {
		if (!k->ovr) {
			verbs_msg(
				err, errlen,
				"FR_IB_GID_INDEX=%ld: no such GID on %s port %u",
				ovr, ch->dev, ch->port);
			return FR_ENODEV;
		}
		ch->gid_index = (int)ovr;
		verbs_gid_sockaddr(&k->ovr_e, &ch->sa);
		ch->why = "FR_IB_GID_INDEX";
		return 0;
	}
	if (k->match >= 0) {
		ch->gid_index = k->match;
		verbs_gid_sockaddr(&k->match_e, &ch->sa);
	} else if (k->v4 >= 0) {
		ch->gid_index = k->v4;
		verbs_gid_sockaddr(&k->v4_e, &ch->sa);
	} else {
		ch->gid_index = k->v6;
		verbs_gid_sockaddr(&k->v6_e, &ch->sa);
	}
	return 0;
}

/* ---- probe, limits, locality --------------------------------------------- */

int verbs_probe(char *errbuf, size_t errlen)
{
	struct verbs_cand cands[VERBS_MAX_CANDS];
	char want[IBV_SYSFS_NAME_MAX], why[160];
	struct rdma_event_channel *ec;
	struct ibv_device **list;
	const char *env = getenv("FR_IB_DEV");
	int ndev, n, port = 0;

	if (env && *env && verbs_parse_dev(env, want, sizeof(want), &port)) {
		verbs_msg(errbuf, errlen, "FR_IB_DEV=\"%s\" is not name[:port]",
			  env);
		return FR_ENODEV;
	}
	list = verbs_devices(&ndev, errbuf, errlen);
	if (!list)
		return FR_ENODEV;
	/* Any ACTIVE port will do: which one is open()'s business. */
	n = verbs_scan(list, ndev, env && *env ? want : NULL, port, NULL, false,
		       -1, cands, why, sizeof(why));
	ibv_free_device_list(list);
	if (!n) {
		verbs_msg(errbuf, errlen, "%s",
			  ndev ? why : "no RDMA device found");
		return FR_ENODEV;
	}
	/* Verbs alone are not enough: connections need rdma_cm. */
	ec = rdma_create_event_channel();
	if (!ec) {
		verbs_msg(errbuf, errlen,
			  "rdma_cm unavailable: rdma_create_event_channel: %s",
			  fr_syserr(errno));
		return FR_ENODEV;
	}
	rdma_destroy_event_channel(ec);
	return 0;
}

/* Limits of the device we ended up on, and the sizes derived from them. */
int verbs_limits(struct fr_tp *tp, char *err, size_t errlen)
{
	struct ibv_context *ctx = tp->lid->verbs;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	unsigned int depth;

	if (ibv_query_device(ctx, &da) ||
	    ibv_query_port(ctx, tp->lid->port_num, &pa)) {
		verbs_msg(err, errlen, "verbs: querying %s: %s",
			  ibv_get_device_name(ctx->device), fr_syserr(errno));
		return FR_ENODEV;
	}
	if (pa.state != IBV_PORT_ACTIVE) {
		verbs_msg(err, errlen, "verbs: device %s port %u is %s",
			  ibv_get_device_name(ctx->device), tp->lid->port_num,
			  verbs_port_state(pa.state));
		return FR_ENODEV;
	}
	depth = tp->b.sq_depth; /* the caller's, or the base's default */
	if (da.max_qp_wr > VERBS_FENCE_SLOTS &&
	    depth > (unsigned int)da.max_qp_wr - VERBS_FENCE_SLOTS) {
		fr_dbg("verbs: send queue depth %u capped to the device's %d",
		       depth, da.max_qp_wr - VERBS_FENCE_SLOTS);
		depth = (unsigned int)da.max_qp_wr - VERBS_FENCE_SLOTS;
	}
	tp->b.sq_depth = depth;
	tp->sq_cap = depth + VERBS_FENCE_SLOTS;
	/* Enough receives for the peer's writes in flight and the credits
	 * and control messages beside them. */
	tp->rq_depth = FR_MIN(2 * depth, (unsigned int)da.max_qp_wr);
	tp->max_cqe = da.max_cqe;
	/* On a software device a receive's completion is a write to memory
	 * like a line, and a line's bytes cost more than the immediate. */
	if (tp->opt.ll_auto && (da.vendor_id == VERBS_VENDOR_RXE ||
				da.vendor_id == VERBS_VENDOR_SIW))
		tp->opt.ll = false;
	fr_dbg("verbs: device %s (vendor 0x%x): polled lines %s%s",
	       ibv_get_device_name(ctx->device), da.vendor_id,
	       tp->opt.ll ? "on" : "off",
	       tp->opt.ll_auto ? " (FR_IB_LL unset)" : "");
	tp->cq_size = (int)FR_MIN(4ul * (tp->sq_cap + tp->rq_depth),
				  (unsigned long)da.max_cqe);
	tp->max_msg = pa.max_msg_sz;
	return 0;
}

/* The HCA's local CPUs (sysfs local_cpus), where the progress thread goes
 * by default (src/affinity.c).  A software device (rxe, siw) has none. */
int verbs_locality(struct fr_tp *tp, cpu_set_t *cpus)
{
	char path[IBV_SYSFS_PATH_MAX + 32];
	hwloc_bitmap_t set;
	int rc = FR_ENODEV;
	unsigned int i;

	if (!tp || !tp->pd)
		return FR_ENODEV;
	snprintf(path, sizeof(path), "%s/device/local_cpus",
		 tp->pd->context->device->ibdev_path);
	set = hwloc_bitmap_alloc();
	if (!set)
		return FR_ENOMEM;
	if (!hwloc_linux_read_path_as_cpumask(path, set) &&
	    !hwloc_bitmap_iszero(set)) {
		CPU_ZERO(cpus);
		hwloc_bitmap_foreach_begin(i, set)
		{
			if (i < CPU_SETSIZE)
				CPU_SET(i, cpus);
		}
		hwloc_bitmap_foreach_end();
		rc = 0;
	}
	hwloc_bitmap_free(set);
	return rc;
}
