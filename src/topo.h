/* SPDX-License-Identifier: MIT */
/*
 * topo.h - where the ranks are: nodes from the host identities exchanged at
 * the rendezvous, and the ring's order over them (pure, unit tested).
 */
#ifndef FR_TOPO_H
#define FR_TOPO_H

#include <stdbool.h>
#include <stdint.h>

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

#endif
