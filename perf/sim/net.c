/* SPDX-License-Identifier: MIT */
/*
 * net.c - the simulator's network: a star of nodes (sim.h says the model).
 *
 * Times are integer nanoseconds, every duration rounded up, so that a run
 * is the same on every machine.  A link is a FIFO: a write takes it from
 * the later of its arrival and the end of the write before, which is the
 * store's order, not a fair share of the link between flows (the
 * bandwidth each flow gets over a collective's step comes out the same
 * when the flows are alike, which the schedules here are).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"

static uint64_t max64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

/* Nanoseconds to move len bytes at gbps gigabits per second. */
static uint64_t serialize_ns(size_t len, double gbps)
{
	return (uint64_t)ceil((double)len * 8.0 / gbps);
}

int sim_net_init(struct sim_net *net, const struct sim_net_params *p, char *err,
		 size_t errlen)
{
	memset(net, 0, sizeof(*net));
	if (p->nranks < 1 || p->ranks_per_node < 1 ||
	    p->nranks % p->ranks_per_node) {
		snprintf(err, errlen,
			 "%d ranks do not make nodes of %d ranks each",
			 p->nranks, p->ranks_per_node);
		return FR_EINVAL;
	}
	if (!(p->link_gbps > 0) || !(p->shm_gbps > 0) ||
	    !(p->link_lat_ns >= 0) || !(p->shm_lat_ns >= 0) ||
	    !isfinite(p->link_gbps + p->shm_gbps + p->link_lat_ns +
		      p->shm_lat_ns)) {
		snprintf(
			err, errlen,
			"bandwidths must be > 0 and latencies >= 0 (link %g Gbit/s %g ns, shm %g Gbit/s %g ns)",
			p->link_gbps, p->link_lat_ns, p->shm_gbps,
			p->shm_lat_ns);
		return FR_EINVAL;
	}
	net->p = *p;
	net->nnodes = p->nranks / p->ranks_per_node;
	net->tx_free = calloc((size_t)net->nnodes, sizeof(uint64_t));
	net->rx_free = calloc((size_t)net->nnodes, sizeof(uint64_t));
	net->copy_free = calloc((size_t)p->nranks, sizeof(uint64_t));
	if (!net->tx_free || !net->rx_free || !net->copy_free) {
		sim_net_fini(net);
		snprintf(err, errlen, "out of memory for %d ranks", p->nranks);
		return FR_ENOMEM;
	}
	return 0;
}

void sim_net_fini(struct sim_net *net)
{
	free(net->tx_free);
	free(net->rx_free);
	free(net->copy_free);
	net->tx_free = net->rx_free = net->copy_free = NULL;
}

void sim_net_reset(struct sim_net *net)
{
	memset(net->tx_free, 0, (size_t)net->nnodes * sizeof(uint64_t));
	memset(net->rx_free, 0, (size_t)net->nnodes * sizeof(uint64_t));
	memset(net->copy_free, 0, (size_t)net->p.nranks * sizeof(uint64_t));
}

uint64_t sim_net_due(struct sim_net *net, uint64_t now, int from, int to,
		     size_t len)
{
	const struct sim_net_params *p = &net->p;
	int a = from / p->ranks_per_node, b = to / p->ranks_per_node;
	size_t wire = len + p->overhead_bytes;
	uint64_t ser, start, arrive;

	net->writes++;
	if (a == b) {
		/* a copy by the sender, one after the other */
		start = max64(now, net->copy_free[from]);
		net->copy_free[from] = start + serialize_ns(wire, p->shm_gbps);
		net->bytes_within += len;
		return net->copy_free[from] + (uint64_t)ceil(p->shm_lat_ns);
	}
	ser = serialize_ns(wire, p->link_gbps);
	start = max64(now, net->tx_free[a]);
	net->tx_free[a] = start + ser;
	/* the first bit reaches the far link a latency later; that link
	 * may still be busy with earlier writes */
	arrive = max64(start + (uint64_t)ceil(p->link_lat_ns), net->rx_free[b]);
	net->rx_free[b] = arrive + ser;
	net->bytes_between += len;
	return net->rx_free[b];
}
