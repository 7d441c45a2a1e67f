#!/bin/bash
# SPDX-License-Identifier: MIT
#
# grid.sh - rows and columns of a 2-D grid reducing at once, over the
# emulated cluster (netns.sh): one rank per host, each host's link shaped
# to RATE both ways, fr_grid_perf (perf/fr_grid_perf.c) timing the row's and
# the column's All-Reduce one after the other and at once from two threads,
# alternately, JOBS separate jobs.
#
#   grid.sh [--ranks 8] [--rows 2] [--rate 1gbit] [--bytes 16777216]
#           [--iters 10] [--warmup 2] [--jobs 3] [--fr-build DIR]
#
# Prints each job's table; the issue's target: the ratio (at once / one
# after the other, medians) at most 1.05.  Root needed (namespaces).
set -uo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BENCH_HERE=$HERE
BENCH_NS_PREFIX=${BENCH_NS_PREFIX:-frgrid_}
# shellcheck source=netns.sh
. "$HERE/netns.sh"

RANKS=8 ROWS=2 RATE=1gbit BYTES=16777216 ITERS=10 WARMUP=2 JOBS=3
FR_BUILD=$REPO/build
while (($#)); do
	case "$1" in
	--ranks) RANKS=$2; shift 2 ;;
	--rows) ROWS=$2; shift 2 ;;
	--rate) RATE=$2; shift 2 ;;
	--bytes) BYTES=$2; shift 2 ;;
	--iters) ITERS=$2; shift 2 ;;
	--warmup) WARMUP=$2; shift 2 ;;
	--jobs) JOBS=$2; shift 2 ;;
	--fr-build) FR_BUILD=$2; shift 2 ;;
	-h | --help) awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; exit 0 ;;
	*) echo "grid.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
BIN=$FR_BUILD/fr_grid_perf
[[ -x $BIN ]] || { echo "grid.sh: $BIN not built" >&2; exit 2; }
WORKDIR=$(mktemp -d /tmp/frgrid.XXXXXX)
trap 'ns_teardown; rm -rf "$WORKDIR"' EXIT
ns_setup "$RANKS" "$RATE" 0 both "$WORKDIR" || exit 1
rc=0
for ((job = 0; job < JOBS; job++)); do
	port=$((29700 + job))
	pids=()
	echo "== job $job: $RANKS ranks, $ROWS rows, $RATE, $BYTES bytes"
	for ((r = 0; r < RANKS; r++)); do
		ip netns exec "$(ns_host "$r")" env FR_RANK=$r FR_NRANKS="$RANKS" \
			FR_LOCAL_RANK=0 FR_LOCAL_SIZE=1 FR_RENDEZVOUS="$(ns_addr 0):$port" \
			timeout -k 5 600 "$BIN" -r "$ROWS" -b "$BYTES" -n "$ITERS" -w "$WARMUP" \
			>"$WORKDIR/out.$r" 2>"$WORKDIR/err.$r" </dev/null &
		pids+=($!)
	done
	for p in "${pids[@]}"; do wait "$p" || rc=1; done
	cat "$WORKDIR/out.0"
	cat "$WORKDIR"/err.* >&2
done
exit $rc
