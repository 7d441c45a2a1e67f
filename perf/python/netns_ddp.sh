#!/bin/bash
# SPDX-License-Identifier: MIT
#
# netns_ddp.sh - run perf/python/ddp_bench.py (or --script dist_bench.py) with N ranks, each in its own
# network namespace, on links shaped to RATE (perf/bench/netns.sh's emulated
# cluster: one bridge, a tbf at RATE each way on every host's link).
#
#   perf/python/netns_ddp.sh [OPTIONS] BUILD_DIR N RATE [BENCH ARGS...]
#
#   BUILD_DIR  the libfastreduce build tree (BUILD_DIR/.libs/libfastreduce.so)
#   N          ranks = emulated hosts
#   RATE       tc rate of every link ("1gbit", "100mbit") or "unshaped"
#   BENCH ARGS go to ddp_bench.py unchanged (--modes, --steps, --batch,
#              --rounds, --csv FILE, ...)
#
# Options:
#   -e NAME=VALUE   set a variable for every rank (repeatable; FR_LOG=info,
#                   FR_SEGMENT_BYTES=..., ...)
#   -t SEC          kill the ranks after SEC seconds (default 900)
#   --delay-ms D    one-way delay between hosts (netns.sh --delay-ms)
#   --port P        rendezvous port (default random in 20000..29999;
#                   libfastreduce uses P, torch's Gloo store P+2)
#   --script FILE   the benchmark in perf/python/ to run (default
#                   ddp_bench.py; dist_bench.py: the torch.distributed
#                   backend's collectives against Gloo's)
#
# Namespaces are ${BENCH_NS_PREFIX}h0..h<N-1> (default prefix frp_, subnet
# ${BENCH_SUBNET}.0/24, default 198.20.0), so this does not collide with
# perf/bench/compare.sh (frbench_, 198.18.0).  Rank r runs as
#
#   ip netns exec frp_h<r> env FR_RANK=r FR_NRANKS=N FR_RENDEZVOUS=198.20.0.1:P \
#       GLOO_SOCKET_IFNAME=eth0 PYTHONPATH=<repo>/python \
#       FASTREDUCE_LIB=BUILD_DIR/.libs/libfastreduce.so \
#       /usr/bin/python3 perf/python/ddp_bench.py BENCH ARGS...
#
# Rank 0's output goes to stdout; every rank's output is kept in the work
# directory (printed at the end).  The namespaces are removed on exit (trap),
# also after Ctrl-C or a failure.  Root needed.  Exit status: the first
# failing rank's, 124 on timeout.

set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOP=$(cd "$HERE/../.." && pwd)
export BENCH_NS_PREFIX=${BENCH_NS_PREFIX:-frp_}
export BENCH_SUBNET=${BENCH_SUBNET:-198.20.0}
PYTHON=${PYTHON:-/usr/bin/python3}

usage() {
	awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"
	exit 2
}

EXTRA_ENV=()
TIMEOUT=900
DELAY_MS=0
PORT=$((20000 + RANDOM % 10000))
SCRIPT=ddp_bench.py
while (($#)); do
	case "$1" in
	-e) EXTRA_ENV+=("$2"); shift 2 ;;
	-t) TIMEOUT=$2; shift 2 ;;
	--delay-ms) DELAY_MS=$2; shift 2 ;;
	--port) PORT=$2; shift 2 ;;
	--script) SCRIPT=$2; shift 2 ;;
	-h | --help) usage ;;
	--) shift; break ;;
	-*) echo "netns_ddp.sh: unknown option $1" >&2; usage ;;
	*) break ;;
	esac
done
(($# >= 3)) || usage
BUILD=$(cd "$1" && pwd) || exit 2
N=$2
RATE=$3
shift 3
LIB=$BUILD/.libs/libfastreduce.so
[[ -f "$LIB" ]] || { echo "netns_ddp.sh: no $LIB (build first)" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "netns_ddp.sh: needs root (network namespaces)" >&2; exit 2; }

# shellcheck source=../bench/netns.sh
source "$TOP/perf/bench/netns.sh"

WORKDIR=$(mktemp -d /tmp/frp_ddp.XXXXXX)
PIDS=()
cleanup() {
	local p
	for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
	NS_WORKDIR=$WORKDIR ns_teardown
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ns_setup "$N" "$RATE" "$(awk -v d="$DELAY_MS" 'BEGIN{printf "%d", d*1000+0.5}')" both "$WORKDIR" || exit 1
echo "netns_ddp: $N ranks, rate $RATE, rendezvous $(ns_addr 0):$PORT, workdir $WORKDIR" >&2

TOKEN=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
# the outputs exist before tail follows rank 0's (the background jobs open
# them a moment later: tail found none, and the summary table was lost)
for ((r = 0; r < N; r++)); do
	: >"$WORKDIR/rank$r.out"
done
for ((r = 0; r < N; r++)); do
	ip netns exec "$(ns_host "$r")" env FR_RANK=$r FR_NRANKS="$N" FR_LOCAL_RANK=0 FR_LOCAL_SIZE=1 \
		FR_RENDEZVOUS="$(ns_addr 0):$PORT" FR_JOB_TOKEN="$TOKEN" GLOO_SOCKET_IFNAME=eth0 \
		PYTHONPATH="$TOP/python" FASTREDUCE_LIB="$LIB" "${EXTRA_ENV[@]}" \
		timeout -k 5 "$TIMEOUT" "$PYTHON" "$HERE/$SCRIPT" "$@" \
		>"$WORKDIR/rank$r.out" 2>&1 </dev/null &
	PIDS+=($!)
done
# follow rank 0 while it runs
tail -n +1 -f "$WORKDIR/rank0.out" --pid="${PIDS[0]}" &
TAILPID=$!
rc=0
for r in "${!PIDS[@]}"; do
	wait "${PIDS[$r]}"
	st=$?
	((st && !rc)) && rc=$st
	((st)) && echo "netns_ddp: rank $r exited with $st (output: $WORKDIR/rank$r.out)" >&2
done
wait "$TAILPID" 2>/dev/null
PIDS=()
if ((rc)); then
	for ((r = 1; r < N; r++)); do
		echo "---- rank $r (tail)" >&2
		tail -n 20 "$WORKDIR/rank$r.out" >&2
	done
fi
exit $rc
