/* SPDX-License-Identifier: MIT */
/*
 * topo.h - where the ranks are: nodes from the host identities exchanged at
 * the rendezvous, and the ring's order over them (pure, unit tested).
 *
 * Layer: base (topo.c calls nothing of the library's); comm.c fills
 * struct fr_topo at the rendezvous, the algorithms and the model read it.
 */
#ifndef FR_TOPO_H
#define FR_TOPO_H

#include <stdbool.h>
#include <stdint.h>

#define FR_TOPO_MAX_DIMS 4 /* of a grid of nodes (FR_TOPO) */

/*
 * Where the ranks are (comm->topo), from every rank's fr_node_id() at the
 * rendezvous.  The layout is regular when every node has the same number
 * of ranks: local[] are the ranks on our node and cross[] those with our
 * local index on every node, both in rank order (the two-level algorithms
 * run rings over them).  With a grid of nodes (FR_TOPO, grid[]) that holds
 * them, level[] are the rings of each of its dimensions
 * (fr_topo_levels), which the hierarchical All-Reduce runs over in place
 * of cross[]; nlevels 0: no grid, cross[] the one level above the node.
 */
struct fr_topo {
	uint64_t node_id;
	int nnodes;
	double oversub; /* ranks per online CPU on the busiest node */
	uint32_t rtt_us; /* the network's round trip (the rendezvous, comm.c) */
	bool nodes_regular;
	int *local, nlocal, local_index;
	int *cross, ncross, cross_index;
	int *node_of; /* every rank's node (numbered by lowest rank) */
	int grid[FR_TOPO_MAX_DIMS], ngrid; /* FR_TOPO; ngrid 0: none */
	int nlevels;
	int *level[FR_TOPO_MAX_DIMS]; /* one allocation, at level[0] */
	int nlevel[FR_TOPO_MAX_DIMS], level_index[FR_TOPO_MAX_DIMS];
	/*
	 * The ring's order (ring.c, cring.c): ring_order[i] is the rank at
	 * position i, ring_pos ours.  The ranks of a node are adjacent, nodes
	 * in order of their lowest rank, so a ring crosses each node's link
	 * twice whatever the launcher's placement (round robin puts every
	 * rank's neighbours on other nodes); rank order where
	 * FR_RING_ORDER=rank.
	 */
	int *ring_order, ring_pos;
	int ring_crossings; /* our node's ranks whose next is elsewhere */
	bool ring_by_rank;
};

/*
 * Group n ranks by their node ids: node[r] is rank r's node, nodes numbered
 * in order of their lowest rank; count[k] the ranks of node k.  Returns the
 * number of nodes.  node and count hold n entries.
 */
int fr_topo_nodes(const uint64_t *ids, int n, int *node, int *count);

/*
 * The ring's order: order[i] is the rank at position i.  Node by node (in
 * node order), each node's ranks in rank order, so that a node's ranks are
 * adjacent and the ring crosses each node's link twice however the launcher
 * placed them; by_rank: plain rank order.  0 or FR_ENOMEM.
 */
int fr_topo_ring_order(const int *node, const int *count, int nnodes, int n,
		       bool by_rank, int *order);

/* The ranks of node k whose next rank in the ring is on another node. */
int fr_topo_ring_crossings(const int *order, const int *node, int n, int k);

/*
 * A grid of nodes (FR_TOPO, e.g. "2x4": racks of 2 nodes, 4 racks; "4x4x2":
 * a torus): its sizes, innermost first.  Node j (nodes numbered as
 * fr_topo_nodes numbers them) sits at j's digits in that mixed radix:
 * j = x0 + d0 (x1 + d1 x2).  The number of sizes (1 to FR_TOPO_MAX_DIMS),
 * or -1 if s is not such a list of sizes from 1 to 65536.
 */
int fr_topo_grid_parse(const char *s, int *dims);

/*
 * The levels of the grid for rank `me` of a regular layout (node[r]: rank
 * r's node; every node has n / nnodes ranks): level l is the ranks with
 * me's local index on the nodes whose coordinates are me's but the l-th,
 * in order of that coordinate, one per value.  Sizes of 1 make no level.
 * ranks[] gets the levels one after the other (the product of dims
 * entries at most), nlevel[l] their sizes and index[l] me's place in each.
 * Returns the number of levels, 0 where the grid does not hold the nodes
 * (its product is not nnodes) or the layout is not regular, or FR_ENOMEM
 * (every rank must choose alike: no quiet fallback).
 */
int fr_topo_levels(const int *node, int n, int nnodes, int me, const int *dims,
		   int ndims, int *ranks, int *nlevel, int *index);

/*
 * Whether a group of n ranks of a job, node[i] its i-th rank's node in the
 * job's numbering, numbers the nodes as the job does (fr_topo_nodes: in
 * the order of their lowest rank): it holds ranks on all nnodes of them,
 * first met in the order 0, 1, 2, ...
 */
bool fr_topo_same_nodes(const uint64_t *node, int n, int nnodes);

#endif
