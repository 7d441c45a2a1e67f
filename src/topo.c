/* SPDX-License-Identifier: MIT */
/*
 * topo.c - nodes and the ring's order (see topo.h).
 *
 * Why reorder the ring: with k ranks on each of m nodes, a ring in rank
 * order crosses each node's network link twice when the launcher places
 * ranks in blocks (mpirun --map-by slot, srun's default), but 2k times when
 * it deals them round robin (--map-by node, srun -m cyclic): every byte of
 * every ring hop then queues on the NIC.  Laying the ring out node by node
 * makes the placement irrelevant; it is the identity for block placement,
 * so the common case keeps its rank-order schedule.
 */
#include <stdbool.h>
#include <stdlib.h>

#include "fastreduce.h"
#include "topo.h"

/* The node of each rank by a hash of the ids: linear in n, for jobs of
 * thousands of ranks (the simulator's); false without memory. */
static bool nodes_hashed(const uint64_t *ids, int n, int *node, int *nnodes)
{
	size_t cap = 16, mask;
	int *slot; /* a rank of that id + 1, or 0: empty */

	while (cap < 2 * (size_t)n)
		cap *= 2;
	mask = cap - 1;
	slot = calloc(cap, sizeof(*slot));
	if (!slot)
		return false;
	*nnodes = 0;
	for (int r = 0; r < n; r++) {
		/* Fibonacci hashing: ids are often small and consecutive */
		size_t h =
			(size_t)((ids[r] * 0x9e3779b97f4a7c15ull) >> 20) & mask;

		while (slot[h] && ids[slot[h] - 1] != ids[r])
			h = (h + 1) & mask;
		if (!slot[h]) {
			slot[h] = r + 1;
			node[r] = (*nnodes)++;
		} else {
			node[r] = node[slot[h] - 1];
		}
	}
	free(slot);
	return true;
}

int fr_topo_nodes(const uint64_t *ids, int n, int *node, int *count)
{
	int nnodes = 0;

	if (!nodes_hashed(ids, n, node, &nnodes)) {
		/* without memory: quadratic in the worst case (a node per
		 * rank), but only integer compares */
		for (int r = 0; r < n; r++) {
			int k;

			for (k = 0; k < r && ids[k] != ids[r]; k++)
				;
			node[r] = k < r ? node[k] : nnodes++;
		}
	}
	for (int r = 0; r < n; r++)
		count[r] = 0;
	for (int r = 0; r < n; r++)
		count[node[r]]++;
	return nnodes;
}

int fr_topo_ring_order(const int *node, const int *count, int nnodes, int n,
		       bool by_rank, int *order)
{
	int *start;

	if (by_rank || nnodes <= 1 || nnodes >= n) {
		for (int r = 0; r < n; r++)
			order[r] = r;
		return 0;
	}
	/* a stable counting sort by node */
	start = malloc((size_t)nnodes * sizeof(*start));
	if (!start)
		return FR_ENOMEM;
	start[0] = 0;
	for (int k = 1; k < nnodes; k++)
		start[k] = start[k - 1] + count[k - 1];
	for (int r = 0; r < n; r++)
		order[start[node[r]]++] = r;
	free(start);
	return 0;
}

int fr_topo_ring_crossings(const int *order, const int *node, int n, int k)
{
	int c = 0;

	for (int i = 0; i < n; i++)
		c += node[order[i]] == k && node[order[(i + 1) % n]] != k;
	return c;
}

int fr_topo_grid_parse(const char *s, int *dims)
{
	int n = 0;

	if (!s || !*s)
		return -1;
	for (;;) {
		char *end;
		long v = strtol(s, &end, 10);

		/* digits only: strtol would also take a sign or spaces */
		if (*s < '0' || *s > '9' || v < 1 || v > 65536 ||
		    n == FR_TOPO_MAX_DIMS)
			return -1;
		dims[n++] = (int)v;
		if (!*end)
			return n;
		if (*end != 'x')
			return -1;
		s = end + 1;
	}
}

int fr_topo_levels(const int *node, int n, int nnodes, int me, const int *dims,
		   int ndims, int *ranks, int *nlevel, int *index)
{
	long prod = 1;
	int k, lidx = 0, nl = 0, stride = 1, *at, *seen, nd = node[me];

	for (int d = 0; d < ndims && prod <= nnodes; d++)
		prod *= dims[d]; /* (past nnodes: no overflow, no fit) */
	if (nnodes < 1 || prod != nnodes || n % nnodes)
		return 0;
	k = n / nnodes;
	/* at[j k + i]: the rank with local index i on node j */
	at = malloc((size_t)n * sizeof(int));
	seen = calloc((size_t)nnodes, sizeof(int));
	if (!at || !seen) {
		free(at);
		free(seen);
		return FR_ENOMEM;
	}
	for (int r = 0; r < n; r++) {
		if (seen[node[r]] == k) { /* irregular */
			free(at);
			free(seen);
			return 0;
		}
		if (r == me)
			lidx = seen[node[r]];
		at[node[r] * k + seen[node[r]]++] = r;
	}
	for (int d = 0; d < ndims; d++) {
		int x = nd / stride % dims[d];

		if (dims[d] > 1) {
			for (int v = 0; v < dims[d]; v++)
				ranks[v] =
					at[(nd + (v - x) * stride) * k + lidx];
			nlevel[nl] = dims[d];
			index[nl++] = x;
			ranks += dims[d];
		}
		stride *= dims[d];
	}
	free(at);
	free(seen);
	return nl;
}

bool fr_topo_same_nodes(const uint64_t *node, int n, int nnodes)
{
	uint64_t next = 0;

	for (int i = 0; i < n; i++) {
		if (node[i] == next)
			next++;
		else if (node[i] > next)
			return false; /* met before a lower one */
	}
	return next == (uint64_t)nnodes;
}
