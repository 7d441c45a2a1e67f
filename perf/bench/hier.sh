#!/bin/bash
# SPDX-License-Identifier: MIT
#
# hier.sh - the two-level collectives against the flat ring on an emulated
# cluster: NODES network namespaces (perf/bench/netns.sh) with K ranks in
# each, every node's link shaped to RATE each way.  Ranks of one node share
# its namespace, hence its link, as ranks of a real node share its NIC; they
# talk to each other as the library chooses (FR_TRANSPORT, default auto:
# shm+tcp, shared memory inside the namespace; FR_TRANSPORT=tcp for loopback
# TCP).  Runs fr_allreduce_perf
# with FR_ALGO=ring, =hier and =auto, ROUNDS times, and prints rank 0's
# tables side by side.  --coll picks the collective (fr_allreduce_perf -C:
# allreduce, the default, reduce_scatter or allgather; sizes are then all
# n blocks).  --round-robin deals the ranks over the nodes round
# robin (rank r on node r % M, as mpirun --map-by node) instead of in
# blocks, and adds "ring-rank", the ring in plain rank order
# (FR_RING_ORDER=rank), to show what the node-by-node ring order saves.
# --racks R puts the nodes in R racks of consecutive ones, joined at
# --rack-rate (netns.sh's racks), and adds "hier-grid": the hierarchical
# All-Reduce told the grid (FR_TOPO=<nodes per rack>xR), three levels
# against the two of plain hier, and "auto-grid": the library's choice
# told the grid and the rack link's rate (a tune file with
# <transport>.grid_beta_ns.1 = 8 / RACK_RATE in Gbit/s, fastreduce(7)).
# With --fr-tune, fr_tune(1) measures that file instead, on the emulated
# cluster told the grid: every parameter, and the rack link's
# grid_beta_ns.1 from every rank exchanging 8 MiB with its partner in the
# other rack (printed beside the rate set), and its model check up to the
# largest size (measured against predicted times, ring, rd, Rabenseifner
# and hier on the grid).
# Times: per call the slowest rank, median over the calls (--stat
# median).
#
# usage: perf/bench/hier.sh [--nodes M] [--per-node K] [--rate R]
#                           [--sizes "1M 64M"] [--iters N] [--rounds R]
#                           [--round-robin] [--coll C]
#                           [--racks R --rack-rate RATE [--fr-tune]] [BUILD]
# (default 2 nodes x 2 ranks, 1gbit, sizes from 1M to 64M by factors of
# 64, i.e. 1M and 64M, 5 iterations, 2 rounds,
# BUILD = build/).  Root needed; namespaces frh_* on 198.21.0.0/24.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
NODES=2 K=2 RATE=1gbit SIZES="1M 64M" ITERS=5 ROUNDS=2 B=$HERE/../../build RR=0 COLL=allreduce
RACKS=1 RACK_RATE=1gbit TUNE=0
while (($#)); do
	case "$1" in
	--nodes) NODES=$2; shift 2 ;;
	--per-node) K=$2; shift 2 ;;
	--rate) RATE=$2; shift 2 ;;
	--sizes) SIZES=$2; shift 2 ;;
	--iters) ITERS=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--round-robin) RR=1; shift ;;
	--coll) COLL=$2; shift 2 ;;
	--racks) RACKS=$2; shift 2 ;;
	--rack-rate) RACK_RATE=$2; shift 2 ;;
	--fr-tune) TUNE=1; shift ;;
	-h|--help) sed -n '3,39p' "$0"; exit 0 ;;
	*) B=$1; shift ;;
	esac
done
B=$(cd "$B" && pwd)
[ "$TUNE" = 1 ] && [ "$RACKS" -lt 2 ] &&
	{ echo "hier.sh: --fr-tune measures the racks' link: it needs --racks 2 or more" >&2; exit 2; }
export BENCH_NS_PREFIX=frh_ BENCH_SUBNET=198.21.0
bash "$HERE/netns.sh" setup "$NODES" --rate "$RATE" --racks "$RACKS" --rack-rate "$RACK_RATE" \
	>/dev/null || exit 1
trap 'bash "$HERE/netns.sh" teardown "$NODES" >/dev/null 2>&1' EXIT
N=$((NODES * K))
# fr_tune links the library's internals: a program of its own, or libtool's
TUNER=$B/.libs/fr_tune
[ -x "$TUNER" ] || TUNER=$B/fr_tune
out=$(mktemp -d /tmp/frhier.XXXXXX)
run() { # ALGO ROUND
	local port=$((30000 + RANDOM % 20000)) pids=() r node algo=$1 order=node grid="" tune=""
	local cmd=("$B/.libs/fr_allreduce_perf" -C "$COLL" -b "${SIZES%% *}" -e "${SIZES##* }"
		-f 64 -n "$ITERS" -w 2 --stat median)
	[ "$algo" = ring-rank ] && algo=ring order=rank
	[ "$algo" = hier-grid ] && algo=hier grid=$((NODES / RACKS))x$RACKS
	[ "$algo" = auto-grid ] && algo=auto grid=$((NODES / RACKS))x$RACKS tune=$out/grid.tune
	# fr_tune on the grid, writing the file auto-grid reads
	[ "$algo" = fr_tune ] && algo=auto grid=$((NODES / RACKS))x$RACKS \
		cmd=("$TUNER" -n 20 -e "${SIZES##* }" -o "$out/grid.tune.new")
	for r in $(seq 0 $((N - 1))); do
		node=$((r / K))
		[ "$RR" = 1 ] && node=$((r % NODES))
		ip netns exec "frh_h$node" env LD_LIBRARY_PATH="$B/.libs" \
			FR_RANK=$r FR_NRANKS=$N FR_RENDEZVOUS=198.21.0.1:$port \
			FR_TRANSPORT="${FR_TRANSPORT:-auto}" FR_ALGO="$algo" FR_JOB_TOKEN="hier$port" \
			FR_RING_ORDER=$order FR_TOPO="$grid" FR_TUNE_FILE="$tune" \
			timeout 600 "${cmd[@]}" >"$out/$1.$2.$r" 2>&1 &
		pids+=($!)
	done
	local fail=0
	for p in "${pids[@]}"; do wait "$p" || fail=1; done
	return $fail
}
ALGOS="ring hier auto"
[ "$RR" = 1 ] && ALGOS="ring ring-rank hier auto"
[ "$RACKS" -gt 1 ] && ALGOS="$ALGOS hier-grid auto-grid"
# the rack link's beta for auto-grid, under every transport's name
rack_gbit=$(awk -v r="${RACK_RATE,,}" 'BEGIN {
	if (r ~ /gbit$/) print r + 0; else if (r ~ /mbit$/) print (r + 0) / 1000;
	else if (r ~ /kbit$/) print (r + 0) / 1e6 }')
for tp in tcp shm+tcp verbs shm; do
	echo "$tp.grid_beta_ns.1 = $(awk -v g="${rack_gbit:-1}" 'BEGIN { printf "%.6g", 8 / g }')"
done >"$out/grid.tune"
if [ "$TUNE" = 1 ]; then  # (with racks: checked above)
	# (the file auto-grid reads only once every rank has succeeded)
	run fr_tune 0 && mv "$out/grid.tune.new" "$out/grid.tune" ||
		{ cat "$out"/fr_tune.0.*; rm -rf "$out"; exit 1; }
	echo "# fr_tune on the grid (auto-grid reads it; the racks' link is set to $RACK_RATE, $(awk -v g="${rack_gbit:-1}" 'BEGIN { printf "%.6g", 8 / g }') ns/B):"
	sed 's/^/#   /' "$out/grid.tune"
	# its model check on this network, up to the largest size
	sed -n '/^# model check/,$p' "$out/fr_tune.0.0" | sed 's/^/#   /'
fi
echo "# $COLL, $NODES nodes x $K ranks$([ "$RR" = 1 ] && echo ", dealt round robin"), $RATE per node link$([ "$RACKS" -gt 1 ] && echo ", $RACKS racks joined at $RACK_RATE"), fr_allreduce_perf -n $ITERS --stat median"
printf '%-6s %-9s %12s %14s %10s\n' round algo bytes time_us busbw
for round in $(seq 1 "$ROUNDS"); do
	for algo in $ALGOS; do
		run "$algo" "$round"
		awk -v r="$round" -v a="$algo" '/^ +[0-9]/ && $1 != "" {
			printf "%-6s %-9s %12s %14s %10s %s\n", r, a, $1, $5, $7, $NF }' \
			"$out/$algo.$round.0"
	done
done
rm -rf "$out"
