#!/bin/bash
# SPDX-License-Identifier: MIT
#
# compare.sh - libfastreduce (fr_allreduce_perf) against Open MPI's
# collectives (mpi_coll_bench.c), side by side, one rank per emulated host,
# in one invocation, and one Markdown table at the end.  See README.md.
#
# usage: perf/bench/compare.sh [options]
#   --ranks N             ranks = emulated hosts (default 2)
#   --rate R              tc rate of every host's link (default 1gbit);
#                         "unshaped": namespaces but no shaper;
#                         "none": no namespaces at all, plain loopback
#   --delay-ms D          one-way delay between hosts (default 0; needs
#                         namespaces: not with --rate none)
#   --shape both|egress   shape both directions of each link (default) or
#                         only the host's egress
#   --queue-ms Q          tbf queue of each shaper, as its "latency" (default
#                         50, as netns-lab; smaller = shallower switch buffer)
#   --sizes "S..."        message sizes in bytes, K/M/G allowed
#                         (default "8 65536 1048576 67108864")
#   --iters N|auto        timed iterations per size (default auto: 64 MiB
#                         worth of data, 5..100); --warmup N|auto likewise
#                         (auto: iters/5, 1..5)
#   --rounds K            repeat everything K times, alternating the order,
#                         and report the median over rounds (default 1)
#   --coll C              allreduce (default), reduce_scatter, allgather,
#                         broadcast: passed to both benchmarks (to
#                         fr_allreduce_perf with the option its --help names
#                         for it, e.g. --collective C)
#   --stat mean|median    Open MPI statistic in the table (default mean, the
#                         one fr_allreduce_perf reports)
#   --fr-args "ARGS"      extra arguments for fr_allreduce_perf (word-split)
#   --env NAME=VALUE      extra environment for the libfastreduce ranks
#                         (repeatable); FR_* variables already in the
#                         environment are passed on as well
#   --mpi-variants "V..." Open MPI variants (default "default ring"), each
#                         ALG[,param=value...]: ALG default = coll/tuned's own
#                         decision; ring = the ring algorithm forced with
#                         coll_tuned_use_dynamic_rules; any other word (e.g.
#                         recursive_doubling, rabenseifner, segmented_ring, or
#                         a number) is forced as coll_tuned_<coll>_algorithm;
#                         each param=value adds "--mca param value" to that
#                         variant only (e.g. ring,btl_tcp_links=2; '+' in
#                         a value stands for ',': default,btl=vader+self is
#                         Open MPI over shared memory, else btl=tcp,self);
#                         "" = no MPI
#   --mpi-args "ARGS"     extra mpirun arguments for every variant
#   --mpi-yield auto|0|1  mpi_yield_when_idle for Open MPI; auto (default): 1
#                         when there are more ranks than CPUs, as mpirun does
#                         itself on one oversubscribed node (it cannot see it
#                         here: each emulated host gets one rank)
#   --no-fr               skip libfastreduce (Open MPI only)
#   --no-check            fr_allreduce_perf --check 0
#   --fr-build DIR        where fr_allreduce_perf and frrun are (default the
#                         checkout's build/)
#   --workdir DIR         logs, binaries, results (default a new /tmp/frbench.*)
#   --timeout S           limit of one benchmark run in seconds (default 300)
#   --wait-idle S         before each run, wait up to S seconds for the CPUs
#                         to be idle (< 15% busy over 0.5 s) (default 0: do
#                         not wait; the busy share is recorded either way and
#                         runs that started on a busy box are flagged)
#   -h, --help
set -uo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BENCH_HERE=$HERE
# shellcheck source=netns.sh
. "$HERE/netns.sh"

RANKS=2 RATE=1gbit DELAY_MS=0 SHAPE=both QUEUE_MS=50
SIZES="8 65536 1048576 67108864"
ITERS=auto WARMUP=auto ROUNDS=1 COLL=allreduce STAT=mean
FR_ARGS="" MPI_VARIANTS="default ring" MPI_ARGS="" MPI_YIELD=auto RUN_FR=1 CHECK=1
FR_BUILD=$REPO/build WORKDIR="" TIMEOUT=300 WAIT_IDLE=0
EXTRA_ENV=()

die() { echo "compare.sh: $*" >&2; exit 2; }
usage() { awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$HERE/compare.sh"; }

while (($#)); do
	case "$1" in
	--ranks) RANKS=$2; shift 2 ;;
	--rate) RATE=$2; shift 2 ;;
	--delay-ms) DELAY_MS=$2; shift 2 ;;
	--shape) SHAPE=$2; shift 2 ;;
	--queue-ms) QUEUE_MS=$2; shift 2 ;;
	--sizes) SIZES=$2; shift 2 ;;
	--iters) ITERS=$2; shift 2 ;;
	--warmup) WARMUP=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--coll) COLL=$2; shift 2 ;;
	--stat) STAT=$2; shift 2 ;;
	--fr-args) FR_ARGS=$2; shift 2 ;;
	--env) [[ "$2" == *=* ]] || die "--env wants NAME=VALUE"; EXTRA_ENV+=("$2"); shift 2 ;;
	--mpi-variants) MPI_VARIANTS=$2; shift 2 ;;
	--mpi-args) MPI_ARGS=$2; shift 2 ;;
	--mpi-yield) MPI_YIELD=$2; shift 2 ;;
	--no-fr) RUN_FR=0; shift ;;
	--no-check) CHECK=0; shift ;;
	--fr-build) FR_BUILD=$2; shift 2 ;;
	--workdir) WORKDIR=$2; shift 2 ;;
	--timeout) TIMEOUT=$2; shift 2 ;;
	--wait-idle) WAIT_IDLE=$2; shift 2 ;;
	-h | --help) usage; exit 0 ;;
	*) die "unknown option '$1' (--help)" ;;
	esac
done

# ---- checks -----------------------------------------------------------------
# shellcheck disable=SC2015
[[ "$RANKS" =~ ^[0-9]+$ ]] && ((RANKS >= 2 && RANKS <= 64)) || die "--ranks must be 2..64"
# shellcheck disable=SC2015
[[ "$ROUNDS" =~ ^[0-9]+$ ]] && ((ROUNDS >= 1)) || die "--rounds must be >= 1"
[[ "$ITERS" == auto || "$ITERS" =~ ^[0-9]+$ ]] || die "--iters: a number or auto"
[[ "$WARMUP" == auto || "$WARMUP" =~ ^[0-9]+$ ]] || die "--warmup: a number or auto"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout: seconds"
[[ "$WAIT_IDLE" =~ ^[0-9]+$ ]] || die "--wait-idle: seconds"
[[ "$STAT" == mean || "$STAT" == median ]] || die "--stat: mean or median"
case "$MPI_YIELD" in
auto) if ((RANKS > $(nproc))); then MPI_YIELD=1; else MPI_YIELD=0; fi ;;
0 | 1) ;;
*) die "--mpi-yield: auto, 0 or 1" ;;
esac
[[ "$SHAPE" == both || "$SHAPE" == egress ]] || die "--shape: both or egress"
[[ "$QUEUE_MS" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--queue-ms: milliseconds"
case "$COLL" in allreduce | reduce_scatter | allgather | broadcast) ;; *) die "--coll: allreduce, reduce_scatter, allgather or broadcast" ;; esac
DELAY_US=$(awk -v d="$DELAY_MS" 'BEGIN { if (d !~ /^[0-9]*\.?[0-9]+$/) exit 1; printf "%d", d * 1000 + 0.5 }') ||
	die "--delay-ms: a number of milliseconds"
USE_NS=1
if [[ "$RATE" == none ]]; then
	USE_NS=0
	((DELAY_US == 0)) || die "--delay-ms needs namespaces: use --rate unshaped (or a rate) with it"
elif [[ "$RATE" != unshaped ]]; then
	ns_rate_bytes "$RATE" >/dev/null || die "--rate: a tc rate such as 1gbit, 100mbit, or none / unshaped"
fi
SIZE_LIST=()
for s in $SIZES; do
	b=$(awk -v s="$s" 'BEGIN { if (match(s, /^[0-9]+/) == 0) exit 1; v = substr(s, 1, RLENGTH); u = toupper(substr(s, RLENGTH + 1)); sub(/B$/, "", u)
		m = u == "" ? 1 : u == "K" ? 1024 : u == "M" ? 1048576 : u == "G" ? 1073741824 : -1; if (m < 0) exit 1; printf "%.0f", v * m }') ||
		die "--sizes: cannot read '$s'"
	((b > 0)) || die "--sizes: sizes must be > 0"
	SIZE_LIST+=("$b")
done
((${#SIZE_LIST[@]})) || die "--sizes is empty"
read -r -a VARIANTS <<<"$MPI_VARIANTS"
((RUN_FR || ${#VARIANTS[@]})) || die "nothing to run (--no-fr and no --mpi-variants)"
(($(id -u) == 0)) || [[ $USE_NS == 0 ]] || die "namespaces need root"

need() { command -v "$1" >/dev/null || die "$1 not found ($2)"; }
need timeout coreutils
need awk gawk/mawk
if ((USE_NS)); then need ip iproute2; need tc iproute2; need ping "apt-get install iputils-ping"; fi
if ((${#VARIANTS[@]})); then
	need mpicc "apt-get install libopenmpi-dev"
	need mpirun "apt-get install openmpi-bin"
fi
FR_BIN=$FR_BUILD/fr_allreduce_perf
FRRUN=$FR_BUILD/frrun
if ((RUN_FR)); then
	[[ -x "$FR_BIN" ]] || die "$FR_BIN missing: build first (cd build && make)"
	((USE_NS)) || [[ -x "$FRRUN" ]] || die "$FRRUN missing: build first"
fi

# ---- work directory, lock, cleanup ------------------------------------------
if [[ -z "$WORKDIR" ]]; then WORKDIR=$(mktemp -d /tmp/frbench.XXXXXX); else mkdir -p "$WORKDIR"; fi
WORKDIR=$(cd "$WORKDIR" && pwd)
LOCK=/run/lock/frbench.lock
[[ -d /run/lock ]] || LOCK=/tmp/frbench.lock
exec 8>"$LOCK"
flock -n 8 || { echo "compare.sh: waiting for another compare.sh run ($LOCK)" >&2; flock 8; }

BG_PIDS=()
NODE_TMP=""
cleanup() {
	local p
	trap - EXIT INT TERM
	for p in "${BG_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
	for p in "${BG_PIDS[@]}"; do wait "$p" 2>/dev/null; done
	if ((USE_NS)); then ns_teardown; fi
	if [[ -n "$NODE_TMP" && -d "$NODE_TMP" ]]; then rm -rf "$NODE_TMP"; fi
}
trap cleanup EXIT
trap 'echo "compare.sh: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM

log() { echo "compare.sh: $*" >&2; }

# ---- what the fr tool supports ---------------------------------------------
FR_COLL_OPT=() FR_FMT=table FR_CHECK_OPT=()
if ((RUN_FR)); then
	FR_HELP=$("$FR_BIN" --help 2>&1)
	# The option that selects the collective, from --help: a long option
	# named --coll*, else an option whose argument is called COLL, else a
	# -c described with collective names.  Versions without one do
	# allreduce only (there, -c is --check 0|1).
	FR_COLL_FLAG=$(awk '
		match($0, /--coll[a-z_-]*/) && $0 ~ /^[ \t]*-/ { print substr($0, RSTART, RLENGTH); exit }
		$0 ~ /^[ \t]*-/ && match($0, /-[-a-zA-Z_]+[ =]COLL([^A-Za-z]|$)/) { f = substr($0, RSTART, RLENGTH); sub(/[ =].*/, "", f); print f; exit }
		$0 ~ /^[ \t]*-c[ ,]/ && /reduce_scatter/ && /allgather/ { print "-c"; exit }' <<<"$FR_HELP")
	if [[ -n "$FR_COLL_FLAG" ]]; then
		FR_COLL_OPT=("$FR_COLL_FLAG" "$COLL")
	elif [[ "$COLL" != allreduce ]]; then
		die "this fr_allreduce_perf has no option to choose the collective: it only does allreduce"
	fi
	grep -q -- '--csv' <<<"$FR_HELP" && FR_FMT=csv
	if ((!CHECK)); then
		grep -q -- '--check' <<<"$FR_HELP" || die "--no-check: this fr_allreduce_perf has no --check"
		FR_CHECK_OPT=(--check 0)
	fi
fi

# ---- Open MPI benchmark -----------------------------------------------------
MPI_BIN=$WORKDIR/mpi_coll_bench
if ((${#VARIANTS[@]})); then
	mpicc -O2 -Wall -o "$MPI_BIN" "$HERE/mpi_coll_bench.c" >"$WORKDIR/mpi_coll_bench.build.log" 2>&1 ||
		{ cat "$WORKDIR/mpi_coll_bench.build.log" >&2; die "mpicc failed"; }
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
	# mpirun runs in host 0's namespace and starts an orted in each other
	# host's namespace through this "rsh" (as over ssh on a real cluster),
	# so every rank talks PMIx to a daemon on its own loopback and MPI
	# traffic crosses the emulated links.  Hosts are named by address.
	# Every host gets its own TMPDIR, as real nodes have their own /tmp:
	# with a shared one, all orteds of a job (same hostname) write the same
	# session directory's hwloc.sm topology file at once and some crash
	# (SIGSEGV in hwloc_shmem_topology_write), and mpirun then waits
	# forever for the missing daemon.
	NODE_TMP=$(mktemp -d /tmp/frbt.XXXXXX)
	for ((r = 0; r < RANKS; r++)); do mkdir -p "$NODE_TMP/h$r"; done
	cat >"$WORKDIR/nsrsh" <<EOF
#!/bin/sh
# plm_rsh_agent for compare.sh: nsrsh ${BENCH_SUBNET}.<i+1> CMD... runs CMD in ${BENCH_NS_PREFIX}h<i>
h=\$1; shift
case "\$h" in ${BENCH_SUBNET}.*) ;; *) echo "nsrsh: unknown host \$h" >&2; exit 255;; esac
i=\$((\${h##*.} - 1))
TMPDIR=$NODE_TMP/h\$i exec ip netns exec "${BENCH_NS_PREFIX}h\$i" sh -c "\$*"
EOF
	chmod +x "$WORKDIR/nsrsh"
fi
case "$COLL" in
allreduce) RING_ALG=ring ;;
reduce_scatter) RING_ALG=ring ;;
allgather) RING_ALG=ring ;;
broadcast) RING_ALG=scatter_allgather_ring ;;
esac

# ---- namespaces -------------------------------------------------------------
RTT_MS=n/a
if ((USE_NS)); then
	NS_TBF_LATENCY=${QUEUE_MS}ms
	ns_setup "$RANKS" "$RATE" "$DELAY_US" "$SHAPE" "$WORKDIR" || exit 1
	RTT_MS=$(ip netns exec "$(ns_host 0)" ping -U -c 10 -i 0.05 -q "$(ns_addr 1)" 2>/dev/null |
		awk -F'[/ ]+' '/^rtt/ {print $7}')
fi

# ---- running one benchmark --------------------------------------------------
iters_for() { # size -> iterations
	if [[ "$ITERS" != auto ]]; then echo "$ITERS"; return; fi
	awk -v s="$1" 'BEGIN { n = int(67108864 / s); if (n < 5) n = 5; if (n > 100) n = 100; print n }'
}
warmup_for() { # iters -> warmup
	if [[ "$WARMUP" != auto ]]; then echo "$WARMUP"; return; fi
	awk -v n="$1" 'BEGIN { w = int(n / 5); if (w < 1) w = 1; if (w > 5) w = 5; print w }'
}

# parse FILE KIND STAT -> "size time_us busbw wrong algo" of the first row,
# columns found by name (so an extra column, e.g. algo, does not matter).
parse_out() {
	awk -v kind="$2" -v stat="$3" '
	function setcols(n, a,   i, k) {
		for (i = 1; i <= n; i++) {
			k = a[i]; sub(/^#/, "", k)
			if (k == "size") cs = i
			else if (k == "time_us" || k == "time") ct = i
			else if (k == "time_median_us") ctm = i
			else if (k == "busbw_GBps" || (k == "busbw" && !cb)) cb = i
			else if (k == "busbw_median_GBps") cbm = i
			else if (k == "wrong" || k == "#wrong") cw = i
			else if (k == "algo" || k == "algorithm") ca = i
		}
	}
	kind == "csv" && !hdr && /^size,/ { n = split($0, a, ","); setcols(n, a); hdr = 1; FS = ","; next }
	kind == "table" && !hdr && /^#/ && / size / && / time / {
		line = $0; sub(/^#/, "", line); n = split(line, a, " "); setcols(n, a); hdr = 1; next }
	hdr && !/^#/ && NF > 2 {
		if (kind == "csv") n = split($0, f, ","); else n = split($0, f, " ")
		if (f[cs] !~ /^[0-9]+$/) next
		t = f[ct]; b = f[cb]
		if (stat == "median" && ctm) { t = f[ctm]; b = f[cbm] }
		w = cw ? f[cw] : ""; if (w == "" || w == "N/A") w = "-"
		al = ca ? f[ca] : "-"; if (al == "") al = "-"
		print f[cs], t, b, w, al; found = 1; exit
	}
	END { if (!found) print "- - - - -" }' "$1"
}

# busy share of all CPUs over 0.5 s, in percent (from /proc/stat)
cpu_busy() {
	local a b
	a=$(head -1 /proc/stat)
	sleep 0.5
	b=$(head -1 /proc/stat)
	awk -v a="$a" -v b="$b" 'BEGIN { split(a, x); split(b, y); t = 0
		for (i = 2; i <= 9; i++) t += y[i] - x[i]
		idle = (y[5] - x[5]) + (y[6] - x[6]); printf "%d", (t > 0 ? 100 * (t - idle) / t : 0) }'
}
BUSY_LIMIT=15
# wait_idle -> busy percent at the start of the run
wait_idle() {
	local busy end=$((SECONDS + WAIT_IDLE))
	busy=$(cpu_busy)
	while ((busy >= BUSY_LIMIT && SECONDS < end)); do
		sleep 1
		busy=$(cpu_busy)
	done
	echo "$busy"
}

# run_bg OUT ERR CMD...: run CMD in the background and wait for it, so that
# a signal to this script is handled at once (bash runs traps only between
# foreground commands) and cleanup can end it by PID.
run_bg() {
	local out=$1 err=$2 pid rc
	shift 2
	"$@" >"$out" 2>"$err" </dev/null &
	pid=$!
	BG_PIDS+=("$pid")
	wait "$pid"
	rc=$?
	BG_PIDS=()
	return $rc
}

RUN_NO=0
# run_fr SIZE ITERS WARMUP OUTBASE -> rc; rank 0 stdout in OUTBASE.out
run_fr() {
	local size=$1 it=$2 wu=$3 base=$4 r rc=0 st pids=() tok port
	local args=(-b "$size" -e "$size" -n "$it" -w "$wu" "${FR_COLL_OPT[@]}" "${FR_CHECK_OPT[@]}")
	[[ $FR_FMT == csv ]] && args+=(--csv)
	# shellcheck disable=SC2206
	args+=($FR_ARGS)
	tok=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
	if ((!USE_NS)); then
		echo "+ frrun -n $RANKS --no-prefix $FR_BIN ${args[*]}" >"$base.cmd"
		run_bg "$base.out" "$base.err" env "${EXTRA_ENV[@]}" "$FRRUN" -n "$RANKS" -t "$TIMEOUT" \
			--no-prefix -- "$FR_BIN" "${args[@]}"
		return $?
	fi
	port=$((29500 + RUN_NO % 1000))
	echo "+ per rank r: ip netns exec $(ns_host r) env FR_RANK=r FR_NRANKS=$RANKS FR_RENDEZVOUS=$(ns_addr 0):$port $FR_BIN ${args[*]}" >"$base.cmd"
	for ((r = 0; r < RANKS; r++)); do
		ip netns exec "$(ns_host "$r")" env FR_RANK=$r FR_NRANKS="$RANKS" FR_LOCAL_RANK=0 FR_LOCAL_SIZE=1 \
			FR_RENDEZVOUS="$(ns_addr 0):$port" FR_JOB_TOKEN="$tok" "${EXTRA_ENV[@]}" \
			timeout -k 5 "$TIMEOUT" "$FR_BIN" "${args[@]}" \
			>"$base.out$([[ $r == 0 ]] || echo ".r$r")" 2>"$base.err.r$r" </dev/null &
		pids+=($!)
		BG_PIDS+=($!)
	done
	for r in "${!pids[@]}"; do
		wait "${pids[$r]}"
		st=$?
		((st && !rc)) && rc=$st
	done
	BG_PIDS=()
	return $rc
}

# run_mpi VARIANT SIZE ITERS WARMUP OUTBASE -> rc
run_mpi() {
	local v=$1 size=$2 it=$3 wu=$4 base=$5 mca=() pre=() alg="" hosts r p
	# shellcheck disable=SC2054
	mca=(--mca pml ob1 --mca mpi_yield_when_idle "$MPI_YIELD")
	# TCP between ranks unless the variant names its own btl
	# (e.g. "default,btl=vader+self": Open MPI's shared memory)
	[[ "$v" == *,btl=* ]] || mca+=(--mca btl tcp,self)
	if ((USE_NS)); then
		hosts=$(ns_addr 0)
		for ((r = 1; r < RANKS; r++)); do hosts+=",$(ns_addr "$r")"; done
		pre=(ip netns exec "$(ns_host 0)" env TMPDIR="$NODE_TMP/h0")
		mca+=(--host "$hosts" --map-by ppr:1:node --mca plm_rsh_agent "$WORKDIR/nsrsh"
			--mca plm_rsh_no_tree_spawn 1 --mca btl_tcp_if_include "${BENCH_SUBNET}.0/24")
	else
		mca+=(--oversubscribe --mca btl_tcp_if_include lo)
	fi
	# VARIANT = ALG[,mca_param=value...]
	local algname=${v%%,*} kv
	case "$algname" in
	default) ;;
	ring) alg=$RING_ALG ;;
	*) alg=$algname ;;
	esac
	[[ -n "${alg:-}" ]] && mca+=(--mca coll_tuned_use_dynamic_rules 1 --mca "coll_tuned_${COLL}_algorithm" "$alg")
	if [[ "$v" == *,* ]]; then
		IFS=, read -r -a kv <<<"${v#*,}"
		for p in "${kv[@]}"; do
			[[ "$p" == *=* ]] || { log "variant '$v': '$p' is not param=value"; return 2; }
			# '+' in a value stands for ',' (the variant's separator)
			mca+=(--mca "${p%%=*}" "${p#*=}")
			mca[-1]=${mca[-1]//+/,}
		done
	fi
	# shellcheck disable=SC2206
	local cmd=("${pre[@]}" mpirun -np "$RANKS" --bind-to none "${mca[@]}" $MPI_ARGS
		"$MPI_BIN" -c "$COLL" -n "$it" -w "$wu" --csv "$size")
	echo "+ ${cmd[*]}" >"$base.cmd"
	run_bg "$base.out" "$base.err" timeout -k 10 "$TIMEOUT" "${cmd[@]}" || return $?
	# Open MPI only warns about a bad MCA value and goes on with the default
	if grep -qiE 'invalid value was supplied|not a valid value' "$base.err"; then
		log "mpirun rejected an MCA value (variant '$v'): see $base.err"
		return 3
	fi
}

# ---- the runs ---------------------------------------------------------------
LABELS=()
((RUN_FR)) && LABELS+=(fr)
for v in "${VARIANTS[@]}"; do LABELS+=("mpi:$v"); done
RES=$WORKDIR/results.tsv
printf 'round\tsize\tlabel\tsize_reported\ttime_us\tbusbw_GBps\twrong\talgo\trc\tbusy_pct\n' >"$RES"
GIT_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$REPO" diff --quiet HEAD -- src include transports perf 2>/dev/null || GIT_REV="$GIT_REV+dirty"
START=$(date +%s)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
FAILS=0
for ((round = 1; round <= ROUNDS; round++)); do
	for size in "${SIZE_LIST[@]}"; do
		it=$(iters_for "$size")
		wu=$(warmup_for "$it")
		order=("${LABELS[@]}")
		if ((round % 2 == 0)); then # ABBA: reverse every other round
			order=()
			for ((k = ${#LABELS[@]} - 1; k >= 0; k--)); do order+=("${LABELS[$k]}"); done
		fi
		for lab in "${order[@]}"; do
			RUN_NO=$((RUN_NO + 1))
			base=$WORKDIR/r${round}_${size}_${lab//:/_}
			busy=$(wait_idle)
			if [[ $lab == fr ]]; then
				run_fr "$size" "$it" "$wu" "$base"
				rc=$?
				kind=$FR_FMT
			else
				run_mpi "${lab#mpi:}" "$size" "$it" "$wu" "$base"
				rc=$?
				kind=csv
			fi
			read -r rsize t b w al <<<"$(parse_out "$base.out" "$kind" "$STAT")"
			if ((rc == 0)) && [[ "$t" == - ]]; then
				log "$lab size $size: no row (the tool skips sizes of fewer elements than it needs)"
			elif ((rc)); then
				FAILS=$((FAILS + 1))
				log "$lab size $size failed (rc $rc): see $base.err* ; last lines:"
				tail -n 5 "$base".err* >&2 2>/dev/null
			fi
			printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$size" "$lab" "$rsize" "$t" "$b" "$w" "$al" "$rc" "$busy" >>"$RES"
			log "round $round size $size $lab: ${t} us, busbw ${b} GB/s (iters $it, rc $rc, CPUs ${busy}% busy before)"
		done
	done
done
ELAPSED=$(($(date +%s) - START))
LOAD1=$(cut -d' ' -f1-3 /proc/loadavg)

# ---- the table --------------------------------------------------------------
LINE=""
if ((USE_NS)) && [[ $RATE != unshaped ]]; then
	LINE=$(awk -v b="$(ns_rate_bytes "$RATE")" 'BEGIN { printf "%.4f", b / 1e9 }')
fi
{
	echo "### $COLL: libfastreduce vs Open MPI $(mpirun --version 2>/dev/null | awk 'NR==1 {print $NF}')"
	echo
	if ((USE_NS)); then
		echo "$RANKS ranks, one per network namespace; link $RATE${LINE:+ ($LINE GB/s)} shaped $SHAPE with a ${QUEUE_MS} ms tbf queue, one-way delay ${DELAY_MS} ms ($NS_DELAY_METHOD), measured RTT ${RTT_MS:-n/a} ms;"
	else
		echo "$RANKS ranks on loopback (no namespaces);"
	fi
	echo "$(nproc) CPUs, $(uname -r); libfastreduce $GIT_REV; iters ${ITERS}, warmup ${WARMUP}, rounds $ROUNDS (median over rounds); time = $STAT for Open MPI, mean for libfastreduce (slowest rank's average)."
	extra=""
	((${#EXTRA_ENV[@]})) && extra+=" env: ${EXTRA_ENV[*]}"
	frenv=$(env | grep -E '^FR_' | tr '\n' ' ')
	[[ -n "$frenv" ]] && extra+=" inherited: $frenv"
	[[ -n "$FR_ARGS" ]] && extra+=" fr args: $FR_ARGS"
	[[ -n "$MPI_ARGS" ]] && extra+=" mpirun args: $MPI_ARGS"
	((${#VARIANTS[@]})) && extra+=" Open MPI: pml ob1, btl tcp,self, mpi_yield_when_idle $MPI_YIELD."
	[[ -n "$extra" ]] && echo "Extra settings:$extra"
	echo
} >"$WORKDIR/results.md"

awk -F'\t' -v labels="${LABELS[*]}" -v sizes="${SIZE_LIST[*]}" -v coll="$COLL" -v busylimit="$BUSY_LIMIT" '
function med(key,   n, i, j, t, k) { # median over rounds of time; busbw of that round
	n = cnt[key]; if (!n) return ""
	for (i = 1; i <= n; i++) idx[i] = i
	for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
		if (tm[key, idx[j]] + 0 < tm[key, idx[i]] + 0) { k = idx[i]; idx[i] = idx[j]; idx[j] = k }
	k = idx[int((n + 1) / 2)]
	return k
}
function fmt_t(t) { return t == "" || t == "-" ? "n/a" : (t >= 1000 ? sprintf("%.0f", t) : sprintf("%.1f", t)) }
function fmt_b(b) { return b == "" || b == "-" ? "n/a" : sprintf("%.4f", b) }
function hs(b) { if (b >= 1048576 && b % 1048576 == 0) return sprintf("%d MiB", b / 1048576)
	if (b >= 1024 && b % 1024 == 0) return sprintf("%d KiB", b / 1024); return b " B" }
NR > 1 {
	key = $2 SUBSEP $3
	if ($10 + 0 >= busylimit) { busy[key] = (busy[key] == "" ? "" : busy[key] ",") $10 "%" }
	if ($9 != 0) bad[key] = 1
	else if ($5 == "-") skipped[key] = 1
	if ($5 == "-") next
	c = ++cnt[key]; tm[key, c] = $5; bw[key, c] = $6; wr[key, c] = $7; al[key, c] = $8; rs[key, c] = $4
}
END {
	nl = split(labels, L, " "); ns = split(sizes, S, " ")
	hasfr = (L[1] == "fr")
	for (s = 1; s <= ns; s++) { k = med(S[s] SUBSEP "fr"); if (k && al[S[s], "fr", k] != "-") hasalgo = 1 }
	h = "| size |"; sep = "|---:|"
	for (i = 1; i <= nl; i++) {
		name = L[i] == "fr" ? "libfastreduce" : "Open MPI " substr(L[i], 5)
		h = h " " name " time (us) | " name " busbw (GB/s) |"; sep = sep "---:|---:|"
		if (L[i] == "fr" && hasalgo) { h = h " fr algo |"; sep = sep ":--|" }
	}
	if (hasfr) for (i = 2; i <= nl; i++) { h = h " " substr(L[i], 5) "/fr |"; sep = sep "---:|" }
	print h; print sep
	for (s = 1; s <= ns; s++) {
		sz = S[s]; row = "| " hs(sz) " |"; note = ""
		for (i = 1; i <= nl; i++) {
			key = sz SUBSEP L[i]; k = med(key)
			if (k) {
				t[i] = tm[key, k]
				row = row " " fmt_t(t[i]) " | " fmt_b(bw[key, k]) " |"
				if (wr[key, k] != "-" && wr[key, k] + 0 != 0) note = note " " L[i] ": " wr[key, k] " WRONG elements;"
				if (rs[key, k] != sz) note = note " " L[i] " used " rs[key, k] " B;"
			} else { t[i] = ""; row = row " n/a | n/a |" }
			if (bad[key]) note = note " " L[i] ": a run failed;"
			if (skipped[key] && !k) note = note " " L[i] ": size skipped by the tool (too few elements for the ranks);"
			if (busy[key] != "") note = note " " L[i] ": started with the CPUs " busy[key] " busy;"
			if (L[i] == "fr" && hasalgo) row = row " " (k ? al[key, k] : "") " |"
		}
		if (hasfr) for (i = 2; i <= nl; i++)
			row = row " " (t[1] != "" && t[i] != "" && t[1] > 0 ? sprintf("%.2f", t[i] / t[1]) : "n/a") " |"
		print row
		if (note != "") notes = notes "\n- " hs(sz) ":" note
	}
	if (hasfr && nl > 1) print "\nX/fr = Open MPI time / libfastreduce time: above 1 libfastreduce is faster."
	if (notes != "") print "\nNotes:" notes
}' "$RES" >>"$WORKDIR/results.md"
{
	echo
	echo "Load average before/after: $LOAD0 / $LOAD1 (anything else running on the box skews the numbers)."
	echo "Runs: $RUN_NO in ${ELAPSED}s, $FAILS failed. Logs and raw results: $WORKDIR (results.tsv, r<round>_<size>_<label>.{cmd,out,err})."
} >>"$WORKDIR/results.md"
cat "$WORKDIR/results.md"
((FAILS == 0))
