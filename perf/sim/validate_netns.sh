#!/bin/bash
# SPDX-License-Identifier: MIT
#
# validate_netns.sh - the simulator (fr_sim) against the library measured on
# an emulated cluster of network namespaces (perf/bench/netns.sh): the same
# algorithms, sizes and rank counts, one rank per emulated host, over TCP;
# a table of measured and simulated times and their ratio (issue 22's
# validation: within 15 %).  Root needed (namespaces).
#
# usage: perf/sim/validate_netns.sh [options]
#   --ranks "N..."      rank counts (default "4 8 16")
#   --rate R            every host's link, a tc rate (default 1gbit)
#   --delay-ms D        one-way delay between hosts (default 0)
#   --algos "A..."      (default "ring rd rabenseifner oneshot auto")
#   --sizes "S..."      bytes (default "8 65536 1048576 16777216")
#   --iters N           timed calls per size (default 10; 3 from 16 MiB)
#   --jobs K            separate jobs per algorithm and size (default 1),
#                       taken in turns (every algorithm's first job, then
#                       every second...); the measured time is the median
#                       of the jobs' medians, and the table shows their
#                       spread (slowest job / fastest): on a host this
#                       small one job's median moves by 20 % or more
#                       between runs (perf/sim/README.md)
#   --build DIR         where fr_allreduce_perf, fr_transport_perf,
#                       fr_reduce_perf and fr_sim are (default build/)
#   --cpu "OPTS"        fr_sim's CPU options, instead of calibrating them
#   --out DIR           keep every output there (default a temporary one)
#   --measured DIR      no measuring: simulate again against the measured
#                       times and calibration an earlier run kept in DIR
#                       (its --out), with this fr_sim (a change to the
#                       model checked in seconds); --rate, --delay-ms and
#                       --barrier are taken from DIR (a --barrier that
#                       DIR does not say is refused), --cpu still
#                       overrides
#   --sim-opts "OPTS"   more fr_sim options, after the calibrated ones
#   --barrier           a barrier before every timed call, outside its time
#                       (fr_allreduce_perf --barrier), and the simulator
#                       does the same: 5 calls each after a barrier, after
#                       the warm-up and the line-up, rank 0 starting a
#                       one-way latency ahead of the others, as the
#                       rendezvous leaves them (fr_sim --barrier --calls 5
#                       --lead-us: the calibration's 8-byte one-way
#                       latency, or with --cpu half of ping's round
#                       trip).  Without it the measured calls run back
#                       to back and the simulator times one call from a
#                       common start (perf/sim/README.md says why)
#   --spin-us U         the measured ranks poll U us before they block
#                       (FR_SPIN_US; default the library's 50), and the
#                       simulated ones the same (fr_sim --cpu-spin-us U):
#                       with 0 no rank holds a core it waits on, which
#                       the delay lines and the other ranks of a host
#                       this small then get; kept in calibration.txt
#                       for --measured
#
# Calibration (before the runs, from measurements that are not the
# collectives compared):
#   - a message's CPU work: the time per message of fr_transport_perf's
#     stream of 8-byte writes between two hosts (the busier side's), as
#     the sender's and as the receiver's (--cpu-send-us, --cpu-recv-us),
#     at most half the one-way latency each;
#   - the wire: its 8-byte one-way latency less those two (and less the
#     delay line's work, below), as --lat-us; the tc rate as --gbps;
#   - a byte's: fr_transport_perf's bandwidth between two hosts whose
#     links are not shaped, each side's work taken as the whole of it
#     (they overlap in a stream), as --cpu-send-GBps and --cpu-recv-GBps;
#   - a reduction's: fr_reduce_perf, f32 sum at 1 MiB (bytes made per ns);
#   - waking up: the one-way latency with no polling (--spin-us 0) less the
#     latency with the library's 50 us of it, after 50 us idle;
#   - the delay line's (with --delay-ms where it is netns-lab's nfq_delay,
#     a user-space process per host): its CPU time during that 8-byte
#     ping-pong, per message (--cpu-dl-us: each write into a host costs
#     its line that much of a core), and during streams of 1 MiB writes
#     through it both ways at once, per byte (--cpu-dl-GBps);
#   - the cores: this host's, shared by every rank of the job, each rank
#     holding its core for the library's 50 us of polling after its work,
#     even with a stream on its way (--cpu-spin-holds: over the shaped
#     links its chunks come with gaps that the spin burns); the ranks
#     take the netns hosts for nodes of their own, so none knows that it
#     shares the CPUs.
# With a delay line the run also records the lines' CPU time during each
# job, and prints it a call beside the simulator's (a second table).
# Each size and algorithm is simulated in a job of its own, as measured.
# The simulated job is told the same network, so that auto chooses on
# both sides from the same parameters (the measured job's cost model
# uses its built-in ones unless FR_TUNE_FILE is set: the auto rows may
# then choose differently, which the table shows).
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
RANKS_LIST="4 8 16" RATE=1gbit DELAY_MS=0 ALGOS="ring rd rabenseifner oneshot auto"
SIZES="8 65536 1048576 16777216" ITERS=10 JOBS=1 BUILD=$top/build CPU_OPTS="" OUT=""
MEASURED="" SIM_OPTS="" BARRIER=0 SPIN_US=""

usage() { awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; exit 2; }
while (($#)); do
	case "$1" in
	--ranks) RANKS_LIST=$2; shift 2 ;;
	--rate) RATE=$2; shift 2 ;;
	--delay-ms) DELAY_MS=$2; shift 2 ;;
	--algos) ALGOS=$2; shift 2 ;;
	--sizes) SIZES=$2; shift 2 ;;
	--iters) ITERS=$2; shift 2 ;;
	--jobs) JOBS=$2; shift 2 ;;
	--build) BUILD=$(cd "$2" && pwd); shift 2 ;;
	--cpu) CPU_OPTS=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--measured) MEASURED=$(cd "$2" && pwd) || exit 2; shift 2 ;;
	--sim-opts) SIM_OPTS=$2; shift 2 ;;
	--barrier) BARRIER=1; shift ;;
	--spin-us) SPIN_US=$2; shift 2 ;;
	-h | --help) usage ;;
	*) echo "validate_netns.sh: unknown option $1" >&2; usage ;;
	esac
done
[[ $JOBS =~ ^[1-9][0-9]*$ ]] || { echo "validate_netns.sh: bad --jobs $JOBS" >&2; exit 2; }
[[ -z $SPIN_US || $SPIN_US =~ ^[0-9]+$ ]] || { echo "validate_netns.sh: bad --spin-us $SPIN_US" >&2; exit 2; }
for t in fr_allreduce_perf fr_transport_perf fr_reduce_perf fr_sim; do
	[[ -x "$BUILD/$t" ]] || { echo "validate_netns.sh: no $BUILD/$t (make first)" >&2; exit 2; }
done
if [[ -n $MEASURED ]]; then
	[[ -f $MEASURED/calibration.txt ]] ||
		{ echo "validate_netns.sh: no $MEASURED/calibration.txt (not an --out of this script)" >&2; exit 2; }
	RATE=$(awk '$1 == "rate" { print $2 }' "$MEASURED/calibration.txt")
	DELAY_MS=$(awk '$1 == "delay_ms" { print $2 }' "$MEASURED/calibration.txt")
	kept=$(awk '$1 == "barrier" { b = $2 } END { print b + 0 }' "$MEASURED/calibration.txt")
	((BARRIER <= kept)) ||
		{ echo "validate_netns.sh: --barrier: $MEASURED was measured back to back (its calibration.txt says no barrier)" >&2; exit 2; }
	BARRIER=$kept
	kept=$(awk '$1 == "spin_us" { s = $2 } END { print s }' "$MEASURED/calibration.txt")
	[[ -z $SPIN_US || $SPIN_US == "${kept:-50}" ]] ||
		{ echo "validate_netns.sh: --spin-us $SPIN_US: $MEASURED was measured with ${kept:-50}" >&2; exit 2; }
	SPIN_US=$kept
	[[ -n $RATE && -n $DELAY_MS ]] ||
		{ echo "validate_netns.sh: $MEASURED/calibration.txt names no rate or delay" >&2; exit 2; }
	# the sizes measured there (a size not measured has no row to compare)
	SIZES=$(cat "$MEASURED"/m.* 2>/dev/null | cut -d, -f1 | grep -E '^[0-9]+$' | sort -un | tr '\n' ' ')
	[[ -n $SIZES ]] || { echo "validate_netns.sh: no measured times in $MEASURED" >&2; exit 2; }
fi
[[ -n $MEASURED || $(id -u) == 0 ]] || { echo "validate_netns.sh: needs root (network namespaces)" >&2; exit 2; }
. "$top/perf/bench/netns.sh"
BENCH_NS_PREFIX=frval_
OUT=${OUT:-$(mktemp -d /tmp/frval.XXXXXX)}
mkdir -p "$OUT"
DELAY_US=$(awk -v d="$DELAY_MS" 'BEGIN { printf "%d", d * 1000 + 0.5 }')
# (not with --measured: it must not take down a run measuring meanwhile)
[[ -n $MEASURED ]] || trap 'ns_teardown' EXIT
log() { echo "validate: $*" >&2; }

# gbit/s of a tc rate
GBPS=$(awk -v b="$(ns_rate_bytes "$RATE")" 'BEGIN { printf "%g", b * 8 / 1e9 }') ||
	{ echo "validate_netns.sh: bad rate $RATE" >&2; exit 2; }

# fr_transport_perf from host C (the client) to host S (the server, on
# side-channel port P): tp_from C S P MODE [ARGS]; its CSV, also kept in
# calibration.log
tp_from() {
	local c=$1 sv=$2 port=$3 out
	shift 3
	ip netns exec "$(ns_host "$sv")" "$BUILD/fr_transport_perf" --server -x tcp \
		--ip "$(ns_addr "$sv")" -p "$port" >/dev/null 2>&1 &
	sleep 0.5
	out=$(ip netns exec "$(ns_host "$c")" "$BUILD/fr_transport_perf" --client "$(ns_addr "$sv")" \
		-x tcp --ip "$(ns_addr "$c")" -p "$port" --csv "$@" 2>&1)
	wait
	echo "$out" >>"$OUT/calibration.log"
	echo "$out"
}

# one-way 8-byte latency (us) and bandwidth (GB/s) of fr_transport_perf
# between hosts 0 and 1: tp MODE [ARGS]
tp() { tp_from 1 0 18611 "$@"; }

# tp MODE [ARGS] from host 1 to host 0 and from 0 to 1, at once
tp_both() {
	local p0 p1
	tp_from 1 0 18611 "$@" >"$OUT/tp_both.0" &
	p0=$!
	tp_from 0 1 18612 "$@" >"$OUT/tp_both.1" &
	p1=$!
	wait "$p0" "$p1"
	cat "$OUT/tp_both.0" "$OUT/tp_both.1"
	rm -f "$OUT/tp_both.0" "$OUT/tp_both.1"
}

# the CPU time (ns) the delay lines (nfq_delay) have used so far
dl_cpu_ns() {
	local pid sum=0
	while read -r pid; do
		[[ -r /proc/$pid/schedstat ]] && sum=$((sum + $(cut -d' ' -f1 "/proc/$pid/schedstat")))
	done <"$OUT/nfq.pids"
	echo "$sum"
}

calibrate() {
	local lat lat0 bw red rate out dl=0 dlg=0 c0 c1
	ns_setup 2 "$RATE" "$DELAY_US" both "$OUT" >/dev/null 2>&1 || { log "netns setup failed"; exit 1; }
	# CSV: test,bytes,iterations,bw_peak,bw_avg_GBps,bw_avg_Gbps,
	# msg_rate_Mpps,lat_min,lat_median
	# With a user-space delay line (no netem), its CPU time per message
	# of the 8-byte ping-pong (2 an iteration; its ACKs' share included)
	[[ ${NS_DELAY_METHOD:-none} == nfqueue && -f $OUT/nfq.pids ]] && c0=$(dl_cpu_ns)
	out=$(tp --lat -s 8)
	lat=$(echo "$out" | awk -F, '$1 == "lat" && $2 == 8 { print $9 }' | tail -1)
	if [[ -n ${c0:-} ]]; then
		c1=$(dl_cpu_ns)
		# (the timed iterations and fr_transport_perf's warm-up ones,
		# min(n / 10 + 1, 1000))
		dl=$(echo "$out" | awk -F, -v d=$((c1 - c0)) '$1 == "lat" && $2 == 8 && $3 > 0 {
			w = int($3 / 10) + 1; if (w > 1000) w = 1000
			printf "%.2f", d / 1e3 / (2 * ($3 + w)) }' | tail -1)
	fi
	lat0=$(tp --lat -s 8 --spin-us 0 | awk -F, '$1 == "lat" && $2 == 8 { print $9 }' | tail -1)
	rate=$(tp --bw -s 8 | awk -F, '$1 == "bw" { print $7 }' | tail -1)
	if [[ -n ${c0:-} ]]; then
		# the delay line's work per byte: its CPU time during streams of
		# 1 MiB writes both ways at once (the timed ones and
		# fr_transport_perf's warm-up, min(n, 100)), the ACKs' share
		# included.  Both ways, as in a collective, where every host sends
		# and receives: a line then takes its packets in batches, and a
		# byte costs it about half what one stream's does (measured)
		c0=$(dl_cpu_ns)
		out=$(tp_both --bw -s 1M -n 200)
		c1=$(dl_cpu_ns)
		dlg=$(echo "$out" | awk -F, -v d=$((c1 - c0)) '$1 == "bw" && $2 > 0 && $3 > 0 {
			w = $3 < 100 ? $3 : 100; b += $2 * ($3 + w); k++ }
			END { if (k == 2 && d > 0) printf "%.4f", b / d }')
	fi
	ns_teardown
	ns_setup 2 unshaped 0 both "$OUT" >/dev/null 2>&1 || { log "netns setup failed"; exit 1; }
	bw=$(tp --bw -s 1M | awk -F, '$1 == "bw" { print $5 }' | tail -1)
	ns_teardown
	red=$("$BUILD/fr_reduce_perf" -d f32 -o sum -b 1M -e 1M --csv |
		awk -F, '$1 == 1048576 { printf "%.3f", $5 / 3 }')
	# (no more than half the one-way latency each: that is all there is)
	log "calibration: 8 B one-way $lat us (no polling $lat0), $rate M messages/s; unshaped $bw GB/s; reduce $red GB/s; delay line ${dl:-0} us a message, ${dlg:-0} GB/s"
	{
		echo "rate $RATE"
		echo "delay_ms $DELAY_MS"
		echo "cores $(nproc)"
		echo "msg_rate_Mpps $rate"
		echo "lat_us $lat"
		echo "lat_nospin_us $lat0"
		echo "bw_unshaped_GBps $bw"
		echo "reduce_GBps $red"
		echo "dl_us ${dl:-0}"
		echo "dl_GBps ${dlg:-0}"
	} >"$OUT/calibration.txt"
}

# fr_sim's options from a calibration.txt: CPU_OPTS (unless given), LAT_US
# and LEAD_US
sim_params() {
	local f=$1 lat lat0 rate bw red cores dl dlg msg wire wake
	if grep -q '^wire_us ' "$f"; then # a run given --cpu: no calibration
		LAT_US=$(awk '$1 == "wire_us" { print $2 }' "$f")
		LEAD_US=$LAT_US
		[[ -n $CPU_OPTS ]] || CPU_OPTS=$(sed -n 's/^cpu_opts //p' "$f")
		return
	fi
	IFS=, read -r lat lat0 rate bw red cores dl dlg < <(awk '{ v[$1] = $2 } END {
		print v["lat_us"] "," v["lat_nospin_us"] "," v["msg_rate_Mpps"] "," \
			v["bw_unshaped_GBps"] "," v["reduce_GBps"] "," v["cores"] "," v["dl_us"] + 0 "," \
			v["dl_GBps"] + 0 }' "$f")
	# CPU options given (--cpu): the delay line is theirs to give, and the
	# wire keeps the whole latency
	[[ -z $CPU_OPTS ]] || dl=0
	# (no more than half the one-way latency each: that is all there is)
	msg=$(awk -v r="$rate" -v l="$lat" 'BEGIN { m = r > 0 ? 1 / r : 0; if (m > l / 2) m = l / 2; printf "%.2f", m }')
	# the delay line's work is in the latency measured on the idle hosts
	wire=$(awk -v l="$lat" -v m="$msg" -v d="$dl" 'BEGIN { w = l - 2 * m - d; if (w < 0) w = 0; printf "%.2f", w }')
	wake=$(awk -v a="$lat0" -v b="$lat" 'BEGIN { w = a - b; if (w < 0) w = 0; printf "%.2f", w }')
	[[ -n $CPU_OPTS ]] ||
		CPU_OPTS="--cpu-reduce-GBps $red --cpu-send-us $msg --cpu-recv-us $msg --cpu-send-GBps $bw --cpu-recv-GBps $bw --cpu-wake-us $wake --cpu-spin-us ${SPIN_US:-50} --cpu-spin-holds --cores ${cores:-$(nproc)} --cores-job$(awk -v d="$dl" -v g="$dlg" 'BEGIN { if (d > 0) printf " --cpu-dl-us %s", d; if (g > 0) printf " --cpu-dl-GBps %s", g }')"
	LAT_US=$wire
	# the rendezvous's lead: rank 0's answer takes a one-way latency
	LEAD_US=$lat
}

# measured: rank 0's CSV of one job of n ranks per size, one algorithm,
# appended to the file OUT (a line per size and job)
measure() {
	local n=$1 algo=$2 out=$3 r pids=() tok port=$((29700 + RANDOM % 200)) algo_env=() bar=()
	((BARRIER)) && bar=(--barrier)
	tok=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	[[ $algo == auto ]] || algo_env=(FR_ALGO="$algo")
	[[ -z $SPIN_US ]] || algo_env+=(FR_SPIN_US="$SPIN_US")
	for s in $SIZES; do
		local it=$ITERS c0=""
		((s >= 16777216 && it > 3)) && it=3
		[[ -f $OUT/nfq.pids ]] && c0=$(dl_cpu_ns)
		for ((r = 0; r < n; r++)); do
			ip netns exec "$(ns_host "$r")" env FR_RANK=$r FR_NRANKS="$n" FR_LOCAL_RANK=0 \
				FR_LOCAL_SIZE=1 FR_RENDEZVOUS="$(ns_addr 0):$port" FR_JOB_TOKEN="$tok" \
				FR_TRANSPORT=tcp "${algo_env[@]}" timeout -k 5 600 "$BUILD/fr_allreduce_perf" \
				-b "$s" -e "$s" -n "$it" -w 2 -c 0 --stat median --csv "${bar[@]}" \
				>"$out.r$r" 2>"$out.err.r$r" </dev/null &
			pids+=($!)
		done
		local failed=0
		for p in "${pids[@]}"; do wait "$p" || { failed=1; log "n=$n $algo $s: a rank failed (see $out.err.r*)"; }; done
		pids=()
		# the delay lines' CPU time a call (the job's start with it; not
		# for a job that failed)
		[[ -z $c0 || $failed == 1 ]] || echo "$s,$((it + 2)),$(($(dl_cpu_ns) - c0))" >>"$out.dl"
		grep -v '^size' "$out.r0" | grep -v '^#' >>"$out"
		port=$((port + 1))
	done
}

# a job of its own for each size and algorithm, as measured: what one
# collective leaves (connections, the mailboxes' state, the cores' last
# owners) does not carry into the next
simulate() {
	local n=$1 out=$2 s a
	# shellcheck disable=SC2086
	for s in $SIZES; do
		for a in $ALGOS; do
			"$BUILD/fr_sim" -n "$n" --gbps "$GBPS" --lat-us "$LAT_US" $CPU_OPTS $TIMING $SIM_OPTS \
				-b "$s" -e "$s" -a "$a"
		done
	done >"$out" 2>&1
}

rm -f "$OUT/lines.md"
if [[ -n $MEASURED ]]; then
	sim_params "$MEASURED/calibration.txt"
	cp "$MEASURED/calibration.txt" "$OUT/" 2>/dev/null
elif [[ -z "$CPU_OPTS" ]]; then
	calibrate
	sim_params "$OUT/calibration.txt"
else
	ns_setup 2 "$RATE" "$DELAY_US" both "$OUT" >/dev/null 2>&1 || exit 1
	rtt=$(ip netns exec "$(ns_host 0)" ping -c 20 -i 0.05 -q "$(ns_addr 1)" 2>/dev/null |
		awk -F'[/ ]+' '/^rtt/ { print $7 }')
	LAT_US=$(awk -v r="$rtt" 'BEGIN { printf "%.2f", r * 1000 / 2 }')
	LEAD_US=$LAT_US
	ns_teardown
	# for --measured later: the wire, and the CPU options given
	printf 'rate %s\ndelay_ms %s\ncores %s\nwire_us %s\ncpu_opts %s\n' "$RATE" \
		"$DELAY_MS" "$(nproc)" "$LAT_US" "$CPU_OPTS" >"$OUT/calibration.txt"
fi
# for --measured later: how the calls were timed
[[ -n $MEASURED ]] || echo "barrier $BARRIER" >>"$OUT/calibration.txt"
[[ -n $MEASURED || -z $SPIN_US ]] || echo "spin_us $SPIN_US" >>"$OUT/calibration.txt"
# how the simulator times the calls: as they were measured
TIMING=""
((BARRIER)) && TIMING="--barrier --calls 5 --lead-us ${LEAD_US:-0}"
log "fr_sim: --gbps $GBPS --lat-us $LAT_US $CPU_OPTS $TIMING $SIM_OPTS"
if [[ -n $MEASURED ]]; then
	echo "# validate_netns.sh: rate $RATE, one-way delay $DELAY_MS ms, ranks $RANKS_LIST, TCP, $(awk '$1 == "cores" { print $2 }' "$MEASURED/calibration.txt") cores, measured times from $MEASURED"
else
	echo "# validate_netns.sh: rate $RATE, one-way delay $DELAY_MS ms, ranks $RANKS_LIST, TCP, $(nproc) cores"
fi
echo "# fr_sim --gbps $GBPS --lat-us $LAT_US $CPU_OPTS $TIMING $SIM_OPTS"
calls="$ITERS calls (3 from 16 MiB), $JOBS job(s) each"
[[ -z $MEASURED ]] || calls="the kept run's calls and jobs"
started="back to back"
((BARRIER)) && started="each after a barrier (--barrier)"
echo "# measured: fr_allreduce_perf, per call the slowest rank, calls $started, median over $calls, then the median over the jobs${SPIN_US:+, FR_SPIN_US=$SPIN_US}"
echo
echo "| ranks | bytes | algo (measured) | measured us | jobs, spread | algo (simulated) | simulated us | sim / measured |"
echo "| ---: | ---: | --- | ---: | ---: | --- | ---: | ---: |"
within=0 total=0 steady=0

# awk functions: sort_n sorts x[1..m] in place (insertion sort: a few
# jobs), median gives the sorted x[1..m]'s median
AWK_MEDIAN='
function sort_n(x, m,    a, b, t) {
	for (a = 2; a <= m; a++)
		for (b = a; b > 1 && x[b - 1] > x[b]; b--) {
			t = x[b]; x[b] = x[b - 1]; x[b - 1] = t
		}
}
function median(x, m) { return m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2 }
'

# a measured file's jobs per size (first seen first): size, the median of
# the jobs' medians (column 10), the jobs, slowest / fastest, the algorithm
# (column 14)
jobs_median() {
	# (a failed job's line has no time: not counted; a size whose jobs all
	# failed shows 0 jobs, and compares as no time; an algorithm that
	# differs between jobs, auto's, shows each)
	awk -F, "$AWK_MEDIAN"'!/^(size|#)/ && NF >= 14 {
		if (!($1 in k)) { order[++no] = $1; k[$1] = 0 }
		if ($10 + 0 > 0) v[$1, ++k[$1]] = $10 + 0
		if ($14 != "" && index("/" alg[$1] "/", "/" $14 "/") == 0)
			alg[$1] = alg[$1] == "" ? $14 : alg[$1] "/" $14
	} END {
		for (i = 1; i <= no; i++) {
			s = order[i]
			m = k[s]
			if (!m) { printf "%s,0,0,-,%s\n", s, alg[s]; continue }
			for (a = 1; a <= m; a++) x[a] = v[s, a]
			sort_n(x, m)
			printf "%s,%.3f,%d,%.2f,%s\n", s, median(x, m), m, x[m] / x[1], alg[s]
		}
	}' "$1"
}
for n in $RANKS_LIST; do
	if [[ -n $MEASURED ]]; then
		for a in $ALGOS; do
			[[ -f $MEASURED/m.$n.$a ]] ||
				{ log "no $MEASURED/m.$n.$a: not measured there"; exit 2; }
			if ! [[ $MEASURED -ef $OUT ]]; then
				cp "$MEASURED/m.$n.$a" "$OUT/"
				rm -f "$OUT/m.$n.$a.dl"
				[[ ! -f $MEASURED/m.$n.$a.dl ]] || cp "$MEASURED/m.$n.$a.dl" "$OUT/"
			fi
		done
	else
		ns_setup "$n" "$RATE" "$DELAY_US" both "$OUT" >/dev/null 2>&1 || { log "netns setup of $n failed"; exit 1; }
		for a in $ALGOS; do : >"$OUT/m.$n.$a" && rm -f "$OUT/m.$n.$a.dl"; done
		for ((j = 1; j <= JOBS; j++)); do
			for a in $ALGOS; do
				log "n=$n $a: measuring (job $j of $JOBS)"
				measure "$n" "$a" "$OUT/m.$n.$a"
			done
		done
		ns_teardown
	fi
	log "n=$n: simulating"
	simulate "$n" "$OUT/s.$n"
	for a in $ALGOS; do
		# measured: size, the jobs' median, jobs, spread, algo
		# simulated: bytes, algo, time_us, with auto as auto:<choice>
		while IFS=, read -r size med jobs spread malgo; do
			read -r salgo sus < <(awk -v s="$size" -v a="$a" '
				$1 == s && ($2 == a || (a == "auto" && $2 ~ /^auto:/) ||
					(a == "tree" && $2 == "rd")) { print $2, $3; exit }' "$OUT/s.$n")
			ratio=$(awk -v m="$med" -v s="${sus:-0}" 'BEGIN { if (m > 0 && s > 0) printf "%.2f", s / m; else print "-" }')
			ok=$(awk -v r="$ratio" 'BEGIN { print (r != "-" && r >= 0.85 && r <= 1.15) ? 1 : 0 }')
			within=$((within + ok))
			total=$((total + 1))
			steady=$((steady + $(awk -v x="$spread" 'BEGIN { print x != "-" && x + 0 <= 1.3 }')))
			printf '| %d | %d | %s | %.1f | %d, %s | %s | %.1f | %s%s |\n' "$n" "$size" "$malgo" "$med" \
				"$jobs" "$spread" "${salgo:-?}" "${sus:-0}" "$ratio" "$([[ $ok == 1 ]] && echo "" || echo " (off)")"
		done < <(jobs_median "$OUT/m.$n.$a")
		# the delay lines' CPU time a call, measured (the median over
		# the jobs) and simulated
		[[ -s $OUT/m.$n.$a.dl ]] || continue
		awk -F, -v n="$n" -v a="$a" -v sim="$OUT/s.$n" "$AWK_MEDIAN"'
			{ if (!($1 in k)) { order[++no] = $1; k[$1] = 0 }
			  v[$1, ++k[$1]] = $3 / $2 / 1e6 }
			END {
				while ((getline l < sim) > 0) {
					split(l, f, " ")
					lab = f[4]; sub(/:$/, "", lab)
					if (f[1] == "#" && f[3] == "bytes," && !(f[2] in w) &&
					    (lab == a || (a == "auto" && lab ~ /^auto:/) ||
					     (a == "tree" && lab == "rd")))
						w[f[2]] = f[9] / 1e3
				}
				for (i = 1; i <= no; i++) {
					s = order[i]; m = k[s]
					for (j = 1; j <= m; j++) x[j] = v[s, j]
					sort_n(x, m)
					med = median(x, m)
					r = (s in w) && med > 0 ? sprintf("%.2f", w[s] / med) : "-"
					printf "| %d | %d | %s | %.2f | %s | %s |\n", n, s, a, med,
						(s in w) ? sprintf("%.2f", w[s]) : "-", r
				}
			}' "$OUT/m.$n.$a.dl" >>"$OUT/lines.md"
	done
done
echo
echo "# within 15 %: $within of $total (outputs in $OUT)"
echo "# measured jobs within 1.3 of each other (slowest / fastest): $steady of $total"
if [[ -s $OUT/lines.md ]]; then
	echo
	echo "# the delay lines' CPU time, all hosts', ms a call: measured (/proc/PID/schedstat"
	echo "# over each job, its start included, over its calls; the jobs' median) and simulated"
	echo
	echo "| ranks | bytes | algo | measured ms | simulated ms | sim / measured |"
	echo "| ---: | ---: | --- | ---: | ---: | ---: |"
	cat "$OUT/lines.md"
fi
