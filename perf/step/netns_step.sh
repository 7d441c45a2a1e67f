#!/bin/bash
# SPDX-License-Identifier: MIT
#
# netns_step.sh - run fr_step(1) with one rank per emulated host: N network
# namespaces joined by a bridge, each link shaped to RATE (perf/bench/
# netns.sh: a tbf on both ends of every host's link, i.e. full duplex), so
# the gradients cross a real bottleneck.  Root needed.
#
#   perf/step/netns_step.sh [--rate 1gbit] [--shape both|egress] \
#           [--build DIR] N [FR_STEP OPTIONS...]
#
# Rank 0's output goes to stdout; every rank's stderr, and the other ranks'
# stdout, to $WORKDIR/rank<i>.log (WORKDIR: a temporary directory, kept
# when a rank fails).  The namespaces are torn down on exit.  Relative
# paths in the options (--csv, --plot, --save-tune) are relative to the
# current directory.  Example (doc/step/README.md):
#
#   perf/step/netns_step.sh --rate 1gbit 4 -m resnet50 -s 0.1 -c 150 \
#           --line-gbit 1 --csv resnet50-n4.csv
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
BENCH_NS_PREFIX=${BENCH_NS_PREFIX:-frstep_}
BENCH_HERE="$TOP/perf/bench"
# shellcheck source=../bench/netns.sh
. "$TOP/perf/bench/netns.sh"

rate=1gbit
shape=both
build=${FR_BUILDDIR:-$TOP/build}
while [[ $# -gt 0 ]]; do
	case "$1" in
	--rate) rate=$2; shift 2 ;;
	--shape) shape=$2; shift 2 ;;
	--build) build=$2; shift 2 ;;
	-h | --help) sed -n 3,18p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) break ;;
	esac
done
n=${1:-}
[[ "$n" =~ ^[0-9]+$ ]] && ((n >= 2)) || { echo "usage: $0 [--rate R] [--shape S] [--build DIR] N [fr_step options]" >&2; exit 2; }
shift
step=$(cd "$build" && pwd)/fr_step
[[ -x "$step" ]] || { echo "netns_step: $step not built" >&2; exit 2; }

work=$(mktemp -d /tmp/netns_step.XXXXXX)
cleanup() { ns_teardown; }
trap cleanup EXIT
trap 'exit 130' INT TERM
ns_setup "$n" "$rate" 0 "$shape" "$work" || exit 1

pids=()
for ((r = n - 1; r >= 0; r--)); do
	if ((r == 0)); then
		ip netns exec "$(ns_host 0)" env FR_RANK=0 FR_NRANKS="$n" \
			FR_RENDEZVOUS="$(ns_addr 0):29500" FR_TRANSPORT=tcp \
			"$step" "$@" 2>"$work/rank0.log" &
	else
		ip netns exec "$(ns_host "$r")" env FR_RANK="$r" FR_NRANKS="$n" \
			FR_RENDEZVOUS="$(ns_addr 0):29500" FR_TRANSPORT=tcp \
			"$step" "$@" >"$work/rank$r.log" 2>&1 &
	fi
	pids+=($!)
done
rc=0
for p in "${pids[@]}"; do
	wait "$p" || { s=$?; ((rc == 0)) && rc=$s; }
done
if ((rc)); then
	echo "netns_step: a rank failed (exit $rc); logs in $work" >&2
	tail -n 5 "$work"/rank*.log >&2
else
	rm -rf "$work"
fi
exit "$rc"
