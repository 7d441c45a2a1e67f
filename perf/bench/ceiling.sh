#!/bin/bash
# SPDX-License-Identifier: MIT
#
# ceiling.sh - what the emulated cluster carries with no collective on it:
# N namespaces (netns.sh), one rank each, every rank streaming to the next
# of a ring over TCP and receiving from the previous one at once
# (tcp_ring.c, 4 MiB writes).  The slowest rank's payload rate is the
# ceiling of a ring All-Reduce's bus bandwidth on that network: TCP/IP's
# headers and the CPUs' share included, the library's work not.  Prints
# each rank's rate and the slowest as a fraction of the line (the tc rate),
# the margin that a target such as "64 MiB at 0.95 x line" leaves.
#
# usage: perf/bench/ceiling.sh [--ranks N] [--rate R] [--seconds S]
#                              [--rounds K] [--racks R --rack-rate RATE]
# (default 8 ranks, 1gbit, 8 s, 1 round; racks: netns.sh's two-level
# network, whose rack links then bound the ring).  Root needed; namespaces
# frc_* on 198.22.0.0/24; cc builds tcp_ring.c into a temporary directory.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
N=8 RATE=1gbit SECS=8 ROUNDS=1 RACKS=1 RACK_RATE=1gbit
while (($#)); do
	case "$1" in
	--ranks) N=$2; shift 2 ;;
	--rate) RATE=$2; shift 2 ;;
	--seconds) SECS=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--racks) RACKS=$2; shift 2 ;;
	--rack-rate) RACK_RATE=$2; shift 2 ;;
	-h|--help) sed -n '3,17p' "$0"; exit 0 ;;
	*) echo "ceiling.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
	esac
done
export BENCH_NS_PREFIX=frc_ BENCH_SUBNET=198.22.0
work=$(mktemp -d /tmp/frceil.XXXXXX)
trap 'rm -rf "$work"' EXIT
"${CC:-cc}" -std=c11 -O2 -Wall -Wextra "$HERE/tcp_ring.c" -o "$work/tcp_ring" || exit 1
# (torn down only once set up here: not another run's namespaces)
bash "$HERE/netns.sh" setup "$N" --rate "$RATE" --racks "$RACKS" --rack-rate "$RACK_RATE" \
	>/dev/null || exit 1
trap 'bash "$HERE/netns.sh" teardown >/dev/null 2>&1; rm -rf "$work"' EXIT
hosts=()
for i in $(seq 0 $((N - 1))); do hosts+=("$BENCH_SUBNET.$((i + 1))"); done
# the line in MB/s (10^6 bytes), from tc's rate
line=$(awk -v r="${RATE,,}" 'BEGIN {
	if (r ~ /gbit$/) print (r + 0) * 125; else if (r ~ /mbit$/) print (r + 0) / 8;
	else if (r ~ /kbit$/) print (r + 0) / 8000 }')
echo "# tcp_ring: $N hosts, $RATE links$([ "$RACKS" -gt 1 ] && echo ", $RACKS racks joined at $RACK_RATE"), ${SECS} s of 4 MiB writes a round (the first second not counted)"
printf '%-6s %-12s %-12s %s\n' round slowest fastest "slowest / line"
for round in $(seq 1 "$ROUNDS"); do
	port=$((30000 + RANDOM % 20000)) pids=()
	for r in $(seq 0 $((N - 1))); do
		ip netns exec "${BENCH_NS_PREFIX}h$r" "$work/tcp_ring" "$r" "$N" "$port" "$SECS" \
			"${hosts[@]}" >"$work/out.$r" 2>&1 &
		pids+=($!)
	done
	fail=0
	for p in "${pids[@]}"; do wait "$p" || fail=1; done
	if [ "$fail" = 1 ]; then
		cat "$work"/out.*
		exit 1
	fi
	cat "$work"/out.* | awk -v r="$round" -v line="$line" '
		{ v = $3 + 0; if (NR == 1 || v < lo) lo = v; if (NR == 1 || v > hi) hi = v }
		END { printf "%-6s %-12s %-12s %s\n", r, sprintf("%.2f MB/s", lo),
			sprintf("%.2f MB/s", hi), line ? sprintf("%.3f", lo / line) : "-" }'
done
