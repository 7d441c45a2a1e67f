/* SPDX-License-Identifier: MIT */
/*
 * net.c - the simulator's network: a star, a fat tree or a torus of nodes
 * (sim.h says the model).
 *
 * Times are integer nanoseconds, every duration rounded up, so that a run
 * is the same on every machine.  A link is a FIFO: a write takes it from
 * the later of its arrival and the end of the write before, which is the
 * store's order, not a fair share of the link between flows (the
 * bandwidth each flow gets over a collective's step comes out the same
 * when the flows are alike, which the schedules here are).
 *
 * A path is at most 2 + 2 SIM_MAX_LEVELS links on a fat tree; on a torus
 * one per hop, at most the sum of half of each dimension, which
 * SIM_TORUS_MAX_HOPS bounds.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

#define SIM_TORUS_MAX_HOPS 1024

static uint64_t max64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* Nanoseconds to move len bytes at gbps gigabits per second. */
static uint64_t serialize_ns(size_t len, double gbps)
{
	return (uint64_t)ceil((double)len * 8.0 / gbps);
}

static int check_params(const struct sim_net_params *p, char *err,
			size_t errlen)
{
	long nodes, prod = 1, hops = 0;

	if (p->nranks < 1 || p->ranks_per_node < 1 ||
	    p->nranks % p->ranks_per_node) {
		snprintf(err, errlen,
			 "%d ranks do not make nodes of %d ranks each",
			 p->nranks, p->ranks_per_node);
		return FR_EINVAL;
	}
	if (!(p->link_gbps > 0) || !(p->shm_gbps > 0) ||
	    !(p->link_lat_ns >= 0) || !(p->shm_lat_ns >= 0) ||
	    !(p->hop_lat_ns >= 0) ||
	    !isfinite(p->link_gbps + p->shm_gbps + p->link_lat_ns +
		      p->shm_lat_ns + p->hop_lat_ns)) {
		snprintf(
			err, errlen,
			"bandwidths must be > 0 and latencies >= 0 (link %g Gbit/s %g ns, shm %g Gbit/s %g ns, hop %g ns)",
			p->link_gbps, p->link_lat_ns, p->shm_gbps,
			p->shm_lat_ns, p->hop_lat_ns);
		return FR_EINVAL;
	}
	nodes = p->nranks / p->ranks_per_node;
	switch (p->topo) {
	case SIM_STAR:
		return 0;
	case SIM_FAT_TREE:
		if (p->levels < 1 || p->levels > SIM_MAX_LEVELS) {
			snprintf(
				err, errlen,
				"a fat tree has 1 to %d levels of switches, not %d",
				SIM_MAX_LEVELS, p->levels);
			return FR_EINVAL;
		}
		for (int l = 0; l < p->levels; l++) {
			if (p->fanout[l] < 1 || !(p->oversub[l] >= 1) ||
			    !isfinite(p->oversub[l])) {
				snprintf(
					err, errlen,
					"fat tree level %d: %d units below, oversubscribed %g (need >= 1 and >= 1)",
					l, p->fanout[l], p->oversub[l]);
				return FR_EINVAL;
			}
			prod *= p->fanout[l];
			if (prod > nodes || nodes % prod) {
				snprintf(
					err, errlen,
					"%ld nodes do not make groups of %ld at fat tree level %d",
					nodes, prod, l);
				return FR_EINVAL;
			}
		}
		return 0;
	case SIM_TORUS:
		if (p->ndims < 1 || p->ndims > SIM_MAX_DIMS) {
			snprintf(err, errlen,
				 "a torus has 1 to %d dimensions, not %d",
				 SIM_MAX_DIMS, p->ndims);
			return FR_EINVAL;
		}
		for (int d = 0; d < p->ndims; d++) {
			if (p->dims[d] < 1 || p->dims[d] > nodes) {
				snprintf(err, errlen,
					 "torus dimension %d of size %d", d,
					 p->dims[d]);
				return FR_EINVAL;
			}
			prod *= p->dims[d]; /* <= nodes^2 here: no overflow */
			if (prod > nodes)
				break;
			hops += p->dims[d] / 2;
		}
		if (hops > SIM_TORUS_MAX_HOPS) {
			snprintf(
				err, errlen,
				"a torus whose paths take up to %ld hops (at most %d)",
				hops, SIM_TORUS_MAX_HOPS);
			return FR_EINVAL;
		}
		if (prod != nodes) {
			snprintf(err, errlen,
				 "a torus of %ld nodes for %ld nodes", prod,
				 nodes);
			return FR_EINVAL;
		}
		return 0;
	}
	snprintf(err, errlen, "unknown topology %d", (int)p->topo);
	return FR_EINVAL;
}

int sim_net_init(struct sim_net *net, const struct sim_net_params *p, char *err,
		 size_t errlen)
{
	int rc;

	memset(net, 0, sizeof(*net));
	rc = check_params(p, err, errlen);
	if (rc)
		return rc;
	net->p = *p;
	net->nnodes = p->nranks / p->ranks_per_node;
	if (p->topo == SIM_TORUS) {
		net->nlinks = net->nnodes * p->ndims * 2;
	} else {
		int groups = net->nnodes;

		net->nlinks = 2 * net->nnodes;
		for (int l = 0; p->topo == SIM_FAT_TREE && l < p->levels; l++) {
			groups /= p->fanout[l];
			net->group[l] = net->nnodes / groups;
			net->up[l] = net->nlinks;
			net->nlinks += 2 * groups;
		}
	}
	net->links = calloc((size_t)net->nlinks, sizeof(*net->links));
	net->copy_free = calloc((size_t)p->nranks, sizeof(uint64_t));
	if (!net->links || !net->copy_free) {
		sim_net_fini(net);
		snprintf(err, errlen, "out of memory for %d ranks", p->nranks);
		return FR_ENOMEM;
	}
	for (int i = 0; i < net->nlinks; i++)
		net->links[i].gbps = p->link_gbps;
	if (p->topo == SIM_FAT_TREE) {
		double gbps = p->link_gbps;

		for (int l = 0; l < p->levels; l++) {
			int groups = net->nnodes / net->group[l];

			gbps = gbps * p->fanout[l] / p->oversub[l];
			for (int i = 0; i < 2 * groups; i++)
				net->links[net->up[l] + i].gbps = gbps;
		}
	}
	return 0;
}

void sim_net_fini(struct sim_net *net)
{
	free(net->links);
	free(net->copy_free);
	net->links = NULL;
	net->copy_free = NULL;
}

void sim_net_reset(struct sim_net *net)
{
	for (int i = 0; i < net->nlinks; i++)
		net->links[i].free = 0;
	memset(net->copy_free, 0, (size_t)net->p.nranks * sizeof(uint64_t));
}

/* A path: the links a write takes in order, and the latency before each. */
#define PATH_MAX_HOPS (2 + 2 * SIM_MAX_LEVELS + SIM_TORUS_MAX_HOPS)
struct path {
	int n;
	int link[PATH_MAX_HOPS];
	double lat[PATH_MAX_HOPS];
	double tail; /* latency after the last */
};

static void path_add(struct path *pa, int link, double lat)
{
	if (pa->n < PATH_MAX_HOPS) {
		pa->link[pa->n] = link;
		pa->lat[pa->n++] = lat;
	}
}

static void path_tree(const struct sim_net *net, int a, int b, struct path *pa)
{
	const struct sim_net_params *p = &net->p;
	int top = 0; /* levels climbed */

	if (p->topo == SIM_FAT_TREE)
		while (top < p->levels &&
		       a / net->group[top] != b / net->group[top])
			top++;
	path_add(pa, a, 0);
	for (int l = 0; l < top; l++)
		path_add(pa, net->up[l] + 2 * (a / net->group[l]),
			 p->hop_lat_ns);
	for (int l = top - 1; l >= 0; l--)
		path_add(pa, net->up[l] + 2 * (b / net->group[l]) + 1,
			 p->hop_lat_ns);
	path_add(pa, net->nnodes + b, p->link_lat_ns);
}

static void path_torus(const struct sim_net *net, int a, int b, struct path *pa)
{
	const struct sim_net_params *p = &net->p;
	int cur = a, stride = 1;

	for (int d = 0; d < p->ndims; d++) {
		int size = p->dims[d], x = (cur / stride) % size,
		    y = (b / stride) % size;
		int fwd = ((y - x) % size + size) % size, dir, steps;

		dir = fwd <= size - fwd ? 0 : 1;
		steps = dir ? size - fwd : fwd;
		for (int i = 0; i < steps; i++) {
			path_add(pa, (cur * p->ndims + d) * 2 + dir,
				 pa->n ? p->hop_lat_ns : 0);
			x = dir ? (x + size - 1) % size : (x + 1) % size;
			cur = cur - ((cur / stride) % size) * stride +
			      x * stride;
		}
		stride *= size;
	}
	pa->tail = p->link_lat_ns;
}

uint64_t sim_net_copy_ns(const struct sim_net *net, size_t len)
{
	return serialize_ns(len + net->p.overhead_bytes, net->p.shm_gbps);
}

uint64_t sim_net_due(struct sim_net *net, uint64_t now, int from, int to,
		     size_t len)
{
	const struct sim_net_params *p = &net->p;
	int a = from / p->ranks_per_node, b = to / p->ranks_per_node;
	size_t wire = len + p->overhead_bytes;
	uint64_t start = now, end = now, prev_start = now, prev_end = now;
	struct path pa;

	net->writes++;
	if (a == b) {
		/* a copy by the sender, one after the other */
		start = max64(now, net->copy_free[from]);
		net->copy_free[from] = start + sim_net_copy_ns(net, len);
		net->bytes_within += len;
		net->writes_within++;
		return net->copy_free[from] + (uint64_t)ceil(p->shm_lat_ns);
	}
	pa.n = 0;
	pa.tail = 0;
	if (p->topo == SIM_TORUS)
		path_torus(net, a, b, &pa);
	else
		path_tree(net, a, b, &pa);
	for (int i = 0; i < pa.n; i++) {
		struct sim_link *l = &net->links[pa.link[i]];
		uint64_t lat = (uint64_t)ceil(pa.lat[i]);

		/* the first bit comes a latency after it left the link
		 * before; this link may still be busy with earlier writes;
		 * the last bit cannot pass the last bit before it.  The
		 * link is busy for the bytes at its own rate only: fed by
		 * a slower link, it has room for other writes meanwhile,
		 * as the packets of several flows share it (an uplink of
		 * 16 nodes carries 16 nodes' writes at once, not one after
		 * the other at a node's rate) */
		uint64_t ser = serialize_ns(wire, l->gbps);

		start = max64(i ? prev_start + lat : now, l->free);
		end = max64(start + ser, i ? prev_end + lat : 0);
		l->free = start + ser;
		prev_start = start;
		prev_end = end;
	}
	net->link_writes += (uint64_t)pa.n;
	net->bytes_between += len;
	return end + (uint64_t)ceil(pa.tail);
}

void sim_net_describe(const struct sim_net_params *p, char *buf, size_t len)
{
	size_t o;

	switch (p->topo) {
	case SIM_FAT_TREE:
		o = (size_t)snprintf(buf, len, "fat tree ");
		for (int l = 0; l < p->levels && o < len; l++)
			o += (size_t)snprintf(buf + o, len - o, "%s%d:%g",
					      l ? "," : "", p->fanout[l],
					      p->oversub[l]);
		break;
	case SIM_TORUS:
		o = (size_t)snprintf(buf, len, "torus ");
		for (int d = 0; d < p->ndims && o < len; d++)
			o += (size_t)snprintf(buf + o, len - o, "%s%d",
					      d ? "x" : "", p->dims[d]);
		break;
	default:
		snprintf(buf, len, "star");
	}
}
