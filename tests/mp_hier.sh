#!/bin/bash
# The hierarchical All-Reduce (two levels, and more on a grid of nodes,
# FR_TOPO), the hierarchical reduce-scatter and all-gather (the same
# levels) on emulated nodes
# (mp_allreduce --ranks-per-node K sets FR_NODE=node<rank/K>): the matrix
# and colls bit for bit against their own references, chosen by the model
# and forced, on regular layouts (2x2, 3x2, 2x3, 2x4, 4x2, round robin and
# arbitrary placements) and irregular ones (where they must not run and the
# others still give the right bits); a rank killed mid-run is reported by
# every survivor.  The mixed transport's conformance suite is
# tests/conform_shm_tcp.sh.
. "$(dirname "$0")/lib.sh"
export FR_TIMEOUT_MS=${FR_TIMEOUT_MS:-5000}
# FR_HIER_AUTO=0 (the sanitizer stage, scripts/test-all.sh): leave out the
# runs where the model chooses, whose schedules the forced runs cover
auto() { [ "${FR_HIER_AUTO:-1}" != 0 ]; }
for cfg in "4 2" "6 2" "6 3" "8 4" "8 2"; do
	set -- $cfg
	auto && run "matrix n=$1, $2 ranks per node (auto)" \
		frrun -n "$1" --transport tcp --timeout 900 "$MP" matrix --ranks-per-node "$2" \
		--counts "0,1,$(($1 - 1)),7919,300007"
	run "matrix n=$1, $2 ranks per node (hier forced)" \
		frrun -n "$1" -e FR_ALGO=hier --transport tcp --timeout 900 "$MP" matrix \
		--ranks-per-node "$2" --counts "0,1,3,$(($1 + 1)),65537"
done
# a grid of nodes (FR_TOPO): one level per dimension above the node, so
# three levels on 2x2 and 3x2 grids, four on 2x2x2; auto over a grid; a
# grid that does not hold the nodes (one level above the node, as above)
# (FR_HIER_GRID_MAX_RANKS: the sanitizer stage runs the 8-rank grid only)
for cfg in "8 2 2x2" "12 2 3x2"; do
	set -- $cfg
	[ "$1" -le "${FR_HIER_GRID_MAX_RANKS:-16}" ] || continue
	run "matrix n=$1, $2 ranks per node, FR_TOPO=$3 (hier forced)" \
		frrun -n "$1" -e FR_ALGO=hier -e FR_TOPO="$3" --transport tcp --timeout 900 "$MP" matrix \
		--ranks-per-node "$2" --counts "0,1,$(($1 + 1)),7919,65537"
done
[ 16 -le "${FR_HIER_GRID_MAX_RANKS:-16}" ] &&
	run "matrix n=16, 2 ranks per node, FR_TOPO=2x2x2 (hier forced)" \
		frrun -n 16 -e FR_ALGO=hier -e FR_TOPO=2x2x2 --transport tcp --timeout 900 "$MP" matrix \
		--ranks-per-node 2 --counts 0,1,17,7919 --dtypes f32,bf16,i32 --ops sum,avg,max
auto && run "matrix n=8, 2 ranks per node, FR_TOPO=2x2 (auto)" \
	frrun -n 8 -e FR_TOPO=2x2 --transport tcp --timeout 900 "$MP" matrix --ranks-per-node 2 \
	--counts 0,1,7,7919,300007
run "matrix n=8, 2 ranks per node, FR_TOPO=3x3 (not the 4 nodes: two levels)" \
	frrun -n 8 -e FR_ALGO=hier -e FR_TOPO=3x3 --transport tcp --timeout 900 "$MP" matrix \
	--ranks-per-node 2 --counts 0,1,9,65537
# lanes: segments of 256 bytes make a vector of 2 KiB and more run as up
# to 4 lanes pipelined through the levels (counts 9 to 65537: 1 to 4
# lanes), on the grid, on two levels, and over shm+tcp
run "matrix n=8, 2 ranks per node, FR_TOPO=2x2, lanes (hier forced)" \
	frrun -n 8 -e FR_ALGO=hier -e FR_TOPO=2x2 -e FR_SEGMENT_BYTES=256 --transport tcp \
	--timeout 900 "$MP" matrix --ranks-per-node 2 --counts 0,1,9,700,7919,65537
run "matrix n=6, 3 ranks per node, lanes (hier forced)" \
	frrun -n 6 -e FR_ALGO=hier -e FR_SEGMENT_BYTES=256 --transport tcp --timeout 900 "$MP" \
	matrix --ranks-per-node 3 --counts 0,1,700,7919,65537
run "matrix n=4, 2 ranks per node over shm+tcp, lanes (hier forced)" \
	frrun -n 4 -e FR_ALGO=hier -e FR_SEGMENT_BYTES=256 --transport shm+tcp --timeout 900 "$MP" \
	matrix --ranks-per-node 2 --counts 1,7919,300007 --dtypes f32,bf16,i32 --ops sum,avg,max
run "matrix n=5, nodes of 2, 2, 1 (irregular: no hier)" \
	frrun -n 5 -e FR_ALGO=hier --transport tcp --timeout 600 "$MP" matrix --ranks-per-node 2 \
	--counts 0,1,7919,65537
run "matrix n=4, eager=128B (many fragments per piece)" \
	frrun -n 4 -e FR_ALGO=hier -e FR_EAGER_BYTES=128 --transport tcp --timeout 600 "$MP" matrix \
	--ranks-per-node 2 --counts 0,1,1000,7919 --dtypes f32,bf16,u8 --ops sum,min,avg
# the hierarchical reduce-scatter and all-gather (colls: every dtype x op,
# in and out of place; reduce-scatter bit for bit against the hier order,
# f32 sums of mixed exponents (--scales) so that the order shows in the
# bits, and forced hier must have run where the layout allows it), 2x2,
# 2x3, 3x2
for cfg in "4 2" "6 3" "6 2"; do
	set -- $cfg
	auto && run "colls n=$1, $2 ranks per node (auto)" \
		frrun -n "$1" --transport tcp --timeout 900 "$MP" colls --ranks-per-node "$2" \
		--counts "0,1,$(($1 - 1)),7919,65537" --scales
	run "colls n=$1, $2 ranks per node (hier forced)" \
		frrun -n "$1" -e FR_ALGO=hier --transport tcp --timeout 900 "$MP" colls \
		--ranks-per-node "$2" --counts "0,1,$(($1 - 1)),7919,65537" --scales
done
# ... on a grid of nodes: three levels on 2x2 (65537 elements: segments
# pipelined through the levels) and 2x3, four on 2x2x2; a grid with a
# dimension of 1 over nodes placed anyhow
[ 8 -le "${FR_HIER_GRID_MAX_RANKS:-16}" ] &&
	run "colls n=8, 2 ranks per node, FR_TOPO=2x2 (hier forced)" \
		frrun -n 8 -e FR_ALGO=hier -e FR_TOPO=2x2 --transport tcp --timeout 900 "$MP" colls \
		--ranks-per-node 2 --counts 0,1,7,7919,65537 --scales
[ 12 -le "${FR_HIER_GRID_MAX_RANKS:-16}" ] &&
	run "colls n=12, 2 ranks per node, FR_TOPO=2x3, eager=128B (hier forced)" \
		frrun -n 12 -e FR_ALGO=hier -e FR_TOPO=2x3 -e FR_EAGER_BYTES=128 --transport tcp \
		--timeout 900 "$MP" colls --ranks-per-node 2 --counts 0,1,13,1000 --scales
[ 16 -le "${FR_HIER_GRID_MAX_RANKS:-16}" ] &&
	run "colls n=16, 2 ranks per node, FR_TOPO=2x2x2 (hier forced)" \
		frrun -n 16 -e FR_ALGO=hier -e FR_TOPO=2x2x2 --transport tcp --timeout 900 "$MP" colls \
		--ranks-per-node 2 --counts 0,1,17,7919 --scales
[ 8 -le "${FR_HIER_GRID_MAX_RANKS:-16}" ] &&
	run "colls n=8 on nodes 2,0,1,3,3,0,2,1, FR_TOPO=2x1x2 (hier forced)" \
		frrun -n 8 -e FR_ALGO=hier -e FR_TOPO=2x1x2 --transport tcp --timeout 900 "$MP" colls \
		--node-map 2,0,1,3,3,0,2,1 --counts 0,1,7,7919 --scales
run "colls n=8, 4 ranks per node (hier forced)" \
	frrun -n 8 -e FR_ALGO=hier --transport tcp --timeout 900 "$MP" colls --ranks-per-node 4 \
	--counts "0,1,7,7919"
run "colls n=5, nodes of 2, 2, 1 (irregular: no hier)" \
	frrun -n 5 -e FR_ALGO=hier --transport tcp --timeout 600 "$MP" colls --ranks-per-node 2 \
	--counts 0,1,7919
run "colls n=4, eager=128B (many fragments per block)" \
	frrun -n 4 -e FR_ALGO=hier -e FR_EAGER_BYTES=128 --transport tcp --timeout 600 "$MP" colls \
	--ranks-per-node 2 --counts 0,1,3,1000,7919
# any placement: node A holds ranks 0 and 3, node B 1 and 2, so the ranks
# of local index 0 meet the nodes in the order A B, those of index 1 B A
for map in 0,1,1,0 0,1,2,2,1,0 1,0,0,1,1,0; do
	n=$(($(echo "$map" | tr -cd , | wc -c) + 1))
	run "colls n=$n on nodes $map (hier forced)" \
		frrun -n "$n" -e FR_ALGO=hier --transport tcp --timeout 900 "$MP" colls \
		--node-map "$map" --counts "0,1,$((n - 1)),7919,65537"
done
# ranks dealt round robin over the nodes (--round-robin-nodes M: rank r on
# node r % M): the ring runs node by node (the reference follows), and
# rank 0's ring neighbours are on its own node: 0 2 4 | 1 3 5 puts 2 after
# it and 5 (node 1's last) before it, not 1
for cfg in "6 2" "7 3"; do
	set -- $cfg
	run "matrix n=$1 round robin over $2 nodes (ring)" \
		frrun -n "$1" -e FR_ALGO=ring --transport tcp --timeout 900 "$MP" matrix \
		--round-robin-nodes "$2" --counts "0,1,$(($1 - 1)),7919,65537"
	run "colls n=$1 round robin over $2 nodes" \
		frrun -n "$1" --transport tcp --timeout 900 "$MP" colls --round-robin-nodes "$2" \
		--counts "0,1,7919"
done
for cfg in "6 2" "6 3"; do
	set -- $cfg
	run "colls n=$1 round robin over $2 nodes (hier forced)" \
		frrun -n "$1" -e FR_ALGO=hier --transport tcp --timeout 900 "$MP" colls \
		--round-robin-nodes "$2" --counts "0,1,$(($1 - 1)),7919,65537"
done
ring_neighbours() {
	frrun -n 6 -e FR_ALGO=ring -e FR_LOG=debug -e FR_RING_ORDER="$1" --transport tcp \
		--timeout 120 "$MP" matrix --round-robin-nodes 2 --counts 7919 --dtypes f32 \
		--ops sum 2>&1 | sed -n 's/^\[0\] .*DEBUG: rank 0: connected to rank \([0-9]*\)$/\1/p' |
		sort -n | tr '\n' ' '
}
run "round robin: rank 0's ring neighbours are 2 and 5" \
	test "$(ring_neighbours node)" = "2 5 "
run "FR_RING_ORDER=rank: rank 0's ring neighbours are 1 and 5" \
	test "$(ring_neighbours rank)" = "1 5 "
# dies VICTIM FRRUN-ARGS...: kill -9 the victim mid-collective on a 2x2
# layout; every survivor must report an error
dies() {
	v=$1
	shift
	out=$(frrun -n 4 "$@" --keep-going --timeout 60 \
		"$MP" die --victim "$v" --at 3 --how kill --ranks-per-node 2 2>&1)
	echo "$out"
	for r in 0 1 2 3; do
		[ "$r" = "$v" ] && continue
		echo "$out" | grep -q "^\[$r\] rank $r: FR_E[A-Z]* after" || return 1
	done
}
run "kill -9 rank 1 of 2x2 mid hier" dies 1 -e FR_ALGO=hier --transport tcp
run "kill -9 rank 2 of 2x2 mid hier" dies 2 -e FR_ALGO=hier --transport tcp
run "kill -9 rank 1 of 2x2 mid hier, lanes" dies 1 -e FR_ALGO=hier -e FR_SEGMENT_BYTES=256 \
	--transport tcp
# the mixed transport: shm within an emulated node, tcp across
for cfg in "4 2" "6 3" "5 2"; do
	set -- $cfg
	run "matrix n=$1, $2 per node over shm+tcp" \
		frrun -n "$1" --transport shm+tcp --timeout 900 "$MP" matrix --ranks-per-node "$2" \
		--counts "0,1,7919,300007"
done
run "colls n=6, 3 per node over shm+tcp" \
	frrun -n 6 --transport shm+tcp --timeout 900 "$MP" colls --ranks-per-node 3
run "kill -9 rank 1 of 2x2 over shm+tcp" dies 1 --transport shm+tcp
# auto on emulated nodes is shm+tcp, and its algorithm choice is right
run "matrix n=6, 2 per node, auto transport" \
	frrun -n 6 --timeout 900 "$MP" matrix --ranks-per-node 2 --counts "0,1,5,7919,300007" \
	--dtypes f32,bf16,i32 --ops sum,avg,max
finish
