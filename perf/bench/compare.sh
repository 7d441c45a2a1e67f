#!/bin/bash
# SPDX-License-Identifier: MIT
#
# compare.sh - libfastreduce (fr_allreduce_perf) against Open MPI's and
# MPICH's collectives (mpi_coll_bench.c), side by side, one rank per emulated
# host, in one invocation, and one Markdown table at the end.  Every library
# is measured the same way: per call the slowest rank's time, then median,
# p99 and min over the calls of a job; the peers run as they ship (only
# their transport is pinned to TCP over the emulated links), and a tuned
# variant says so in its name.  See README.md.
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
#   --iters N|auto        timed calls per job (default auto: 64 MiB worth of
#                         data, 5..100); --warmup N|auto likewise (auto:
#                         iters/5, 1..5)
#   --rounds K            repeat everything K times (default 1); every job
#                         is a separate launch of fresh processes
#   --jobs K              in each round, start every (size, library) as K
#                         separate jobs, back to back per size, the order of
#                         the libraries alternating (A B B A ...); the spread
#                         table then shows, per library, min / median / max
#                         over the jobs of the per-job statistic and max/min
#                         (default 1; rounds x jobs jobs in all)
#   --stat median|p99|min|mean
#                         the statistic of the busbw and ratio columns and
#                         of the spread table (default median); the table
#                         shows median, p99, min and mean of every library
#                         anyway, each the same for all: per call the
#                         slowest rank's time, over the calls of a job (mean:
#                         the slowest rank's average), median over the jobs
#   --coll C              allreduce (default), reduce_scatter, allgather,
#                         broadcast, reduce, alltoall, sendrecv, pingpong
#                         (rank 0 to 1 and back: the time is the round trip,
#                         busbw 2 size / time): passed to every
#                         benchmark (to
#                         fr_allreduce_perf with the option its --help names
#                         for it, e.g. --collective C)
#   --fr-args "ARGS"      extra arguments for fr_allreduce_perf (word-split)
#   --env NAME=VALUE      extra environment for the libfastreduce ranks
#                         (repeatable); FR_* variables already in the
#                         environment are passed on as well; unless
#                         FR_TRANSPORT is given one of these ways, it is the
#                         library's default (auto: one rank per emulated
#                         host, so shm+tcp, the peers over TCP too) in
#                         namespaces, and tcp with --rate none (on loopback
#                         auto would be shared memory against the peers'
#                         TCP)
#   --mpi-variants "V..." Open MPI variants (default "default": Open MPI as
#                         it ships, coll/tuned's own decision, busy polling),
#                         each ALG[+yield][,param=value...]: ALG default =
#                         coll/tuned's own decision; ring = the ring algorithm
#                         forced with coll_tuned_use_dynamic_rules; any other
#                         word (e.g. recursive_doubling, rabenseifner,
#                         segmented_ring, or a number) is forced as
#                         coll_tuned_<coll>_algorithm; +yield adds
#                         mpi_yield_when_idle 1 (+noyield: 0); each
#                         param=value adds "--mca param value" to that
#                         variant only (e.g. ring,btl_tcp_links=2; '+' in a
#                         value stands for ',': default,btl=vader+self is
#                         Open MPI over shared memory, else btl=tcp,self);
#                         "" = no Open MPI
#   --mpi-args "ARGS"     extra mpirun arguments for every Open MPI variant
#   --mpi-yield default|auto|0|1
#                         default (the default): Open MPI decides, nothing is
#                         passed; 1 / 0: every Open MPI variant without its
#                         own +yield/+noyield gets +yield / +noyield (and is
#                         labelled so); auto: +yield when ranks > CPUs
#   --mpich-variants "V..."
#                         MPICH variants (default "default" where MPICH can
#                         be built and run: mpiexec.hydra or mpirun.mpich,
#                         and mpicc.mpich from libmpich-dev; else none, with
#                         a note), each ALG[,NAME=VALUE...]: ALG default =
#                         MPICH's own decision; ring or any MPICH algorithm
#                         name (e.g. recursive_doubling; mpivars lists them;
#                         MPICH 4.0.2 has no ring All-Reduce) is forced with
#                         MPIR_CVAR_<COLL>_INTRA_ALGORITHM;
#                         each NAME=VALUE is an environment variable of that
#                         variant's ranks ('+' in a value stands for ',');
#                         "" = no MPICH
#   --mpich-args "ARGS"   extra mpiexec arguments for every MPICH variant
#   --no-fr               skip libfastreduce (peers only)
#   --no-check            fr_allreduce_perf --check 0
#   --fr-build DIR        where fr_allreduce_perf and frrun are (default the
#                         checkout's build/)
#   --workdir DIR         logs, binaries, results (default a new /tmp/frbench.*)
#   --timeout S           limit of one benchmark job in seconds (default 300)
#   --wait-idle S         before each job, wait up to S seconds for the CPUs
#                         to be idle (< 15% busy over 0.5 s) (default 0: do
#                         not wait; the busy share and the load average are
#                         recorded either way and jobs that started on a
#                         busy box are flagged)
#   -h, --help
set -uo pipefail

HERE=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BENCH_HERE=$HERE
# shellcheck source=netns.sh
. "$HERE/netns.sh"

RANKS=2 RATE=1gbit DELAY_MS=0 SHAPE=both QUEUE_MS=50
SIZES="8 65536 1048576 67108864"
ITERS=auto WARMUP=auto ROUNDS=1 JOBS=1 COLL=allreduce STAT=median
FR_ARGS="" MPI_VARIANTS="default" MPI_ARGS="" MPI_YIELD=default RUN_FR=1 CHECK=1
MPICH_VARIANTS=default MPICH_ASKED=0 MPICH_ARGS=""
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
	--jobs) JOBS=$2; shift 2 ;;
	--coll) COLL=$2; shift 2 ;;
	--stat) STAT=$2; shift 2 ;;
	--fr-args) FR_ARGS=$2; shift 2 ;;
	--env) [[ "$2" == *=* ]] || die "--env wants NAME=VALUE"; EXTRA_ENV+=("$2"); shift 2 ;;
	--mpi-variants) MPI_VARIANTS=$2; shift 2 ;;
	--mpi-args) MPI_ARGS=$2; shift 2 ;;
	--mpi-yield) MPI_YIELD=$2; shift 2 ;;
	--mpich-variants) MPICH_VARIANTS=$2; MPICH_ASKED=1; shift 2 ;;
	--mpich-args) MPICH_ARGS=$2; shift 2 ;;
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
# shellcheck disable=SC2015
[[ "$JOBS" =~ ^[0-9]+$ ]] && ((JOBS >= 1)) || die "--jobs must be >= 1"
[[ "$ITERS" == auto || "$ITERS" =~ ^[0-9]+$ ]] || die "--iters: a number or auto"
[[ "$WARMUP" == auto || "$WARMUP" =~ ^[0-9]+$ ]] || die "--warmup: a number or auto"
[[ "$TIMEOUT" =~ ^[0-9]+$ ]] || die "--timeout: seconds"
[[ "$WAIT_IDLE" =~ ^[0-9]+$ ]] || die "--wait-idle: seconds"
case "$STAT" in median | p99 | min | mean) ;; *) die "--stat: median, p99, min or mean" ;; esac
case "$MPI_YIELD" in
auto) if ((RANKS > $(nproc))); then MPI_YIELD=1; else MPI_YIELD=default; fi ;;
default | 0 | 1) ;;
*) die "--mpi-yield: default, auto, 0 or 1" ;;
esac
[[ "$SHAPE" == both || "$SHAPE" == egress ]] || die "--shape: both or egress"
[[ "$QUEUE_MS" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--queue-ms: milliseconds"
case "$COLL" in allreduce | reduce_scatter | allgather | broadcast | reduce | alltoall | sendrecv | pingpong) ;; *) die "--coll: allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, sendrecv or pingpong" ;; esac
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

# Open MPI variants; --mpi-yield 0/1 puts +noyield/+yield into the names of
# those without one, so the table says what ran.
read -r -a VARIANTS <<<"$MPI_VARIANTS"
for k in "${!VARIANTS[@]}"; do
	v=${VARIANTS[$k]} name=${VARIANTS[$k]%%,*}
	rest=""
	[[ "$v" == *,* ]] && rest=,${v#*,}
	[[ "$name" == +* || -z "$name" ]] && die "--mpi-variants: '$v' has no algorithm name (default, ring, ...)"
	if [[ "$name" != *+yield && "$name" != *+noyield && "$MPI_YIELD" != default ]]; then
		if ((MPI_YIELD)); then name+=+yield; else name+=+noyield; fi
	fi
	VARIANTS[k]=$name$rest
done
read -r -a MPICH_VARS <<<"$MPICH_VARIANTS"
((RUN_FR || ${#VARIANTS[@]} || ${#MPICH_VARS[@]})) || die "nothing to run (--no-fr and no peer variants)"
(($(id -u) == 0)) || [[ $USE_NS == 0 ]] || die "namespaces need root"

need() { command -v "$1" >/dev/null || die "$1 not found ($2)"; }
need timeout coreutils
need awk gawk/mawk
if ((USE_NS)); then need ip iproute2; need tc iproute2; need ping "apt-get install iputils-ping"; fi
# Open MPI's own wrapper and launcher (mpicc/mpirun are whichever MPI the
# alternatives point to)
OMPI_CC=mpicc OMPI_RUN=mpirun
command -v mpicc.openmpi >/dev/null && OMPI_CC=mpicc.openmpi
command -v mpirun.openmpi >/dev/null && OMPI_RUN=mpirun.openmpi
if ((${#VARIANTS[@]})); then
	need "$OMPI_CC" "apt-get install libopenmpi-dev"
	need "$OMPI_RUN" "apt-get install openmpi-bin"
fi
MPICH_RUN="" MPICH_CC=mpicc.mpich MPICH_NOTE=""
for c in mpiexec.hydra mpirun.mpich; do
	command -v "$c" >/dev/null && { MPICH_RUN=$c; break; }
done
if ((${#MPICH_VARS[@]})); then
	if [[ -z "$MPICH_RUN" ]] || ! command -v "$MPICH_CC" >/dev/null; then
		((MPICH_ASKED)) && die "MPICH: mpiexec.hydra/mpirun.mpich or mpicc.mpich missing (apt-get install mpich libmpich-dev)"
		MPICH_NOTE="MPICH not run: mpiexec.hydra/mpirun.mpich or mpicc.mpich missing (apt-get install mpich libmpich-dev)."
		MPICH_VARS=()
	fi
fi
case "$COLL" in
allreduce) MPICH_COLL=ALLREDUCE MPICH_RING=ring ;;
reduce_scatter) MPICH_COLL=REDUCE_SCATTER_BLOCK MPICH_RING="" ;;
allgather) MPICH_COLL=ALLGATHER MPICH_RING=ring ;;
broadcast) MPICH_COLL=BCAST MPICH_RING=scatter_ring_allgather ;;
reduce) MPICH_COLL=REDUCE MPICH_RING="" ;;
alltoall) MPICH_COLL=ALLTOALL MPICH_RING="" ;;
sendrecv | pingpong) MPICH_COLL=SENDRECV MPICH_RING="" ;;
esac
for v in "${MPICH_VARS[@]}"; do
	[[ "${v%%,*}" == ring && -z "$MPICH_RING" ]] &&
		die "--mpich-variants: MPICH has no ring for $COLL (MPI_Reduce_scatter_block); name one of its algorithms"
done
FR_BIN=$FR_BUILD/fr_allreduce_perf
FRRUN=$FR_BUILD/frrun
if ((RUN_FR)); then
	[[ -x "$FR_BIN" ]] || die "$FR_BIN missing: build first (cd build && make)"
	((USE_NS)) || [[ -x "$FRRUN" ]] || die "$FRRUN missing: build first"
fi
# libfastreduce's default transport between emulated hosts (what a user
# gets), TCP on loopback as the peers, unless told otherwise
FR_ENV=()
FR_TRANSPORT_SHOWN=${FR_TRANSPORT:-}
for e in "${EXTRA_ENV[@]}"; do [[ "$e" == FR_TRANSPORT=* ]] && FR_TRANSPORT_SHOWN=${e#FR_TRANSPORT=}; done
if [[ -z "$FR_TRANSPORT_SHOWN" && "$RATE" == none ]]; then
	FR_TRANSPORT_SHOWN=tcp
	FR_ENV=(FR_TRANSPORT=tcp)
elif [[ -z "$FR_TRANSPORT_SHOWN" ]]; then
	FR_TRANSPORT_SHOWN="auto (the default)"
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

# ---- the machine's own drift ------------------------------------------------
# c2c_rtt.c: the core-to-core round trip in ns, measured before every job
# (about 60 ms): under a hypervisor it moves between runs seconds apart,
# and with it every shared-memory collective.  "-" where it cannot run.
C2C_BIN=$WORKDIR/c2c_rtt
if ! ${CC:-cc} -std=c11 -O2 -pthread -o "$C2C_BIN" "$HERE/c2c_rtt.c" >"$WORKDIR/c2c_rtt.build.log" 2>&1; then
	log "no core-to-core round trips: ${CC:-cc} cannot build c2c_rtt.c (see $WORKDIR/c2c_rtt.build.log)"
	C2C_BIN=""
fi
c2c() { if [[ -n "$C2C_BIN" ]]; then "$C2C_BIN" 2>/dev/null || echo -; else echo -; fi; }

# ---- the MPI benchmarks -----------------------------------------------------
# One mpi_coll_bench per MPI, each built with that MPI's own wrapper.
MPI_BIN=$WORKDIR/mpi_coll_bench.openmpi
MPICH_BIN=$WORKDIR/mpi_coll_bench.mpich
if ((${#VARIANTS[@]})); then
	"$OMPI_CC" -O2 -Wall -o "$MPI_BIN" "$HERE/mpi_coll_bench.c" -lm >"$WORKDIR/mpi_coll_bench.openmpi.build.log" 2>&1 ||
		{ cat "$WORKDIR/mpi_coll_bench.openmpi.build.log" >&2; die "$OMPI_CC failed"; }
	export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
if ((${#MPICH_VARS[@]})) &&
	! "$MPICH_CC" -O2 -Wall -o "$MPICH_BIN" "$HERE/mpi_coll_bench.c" -lm >"$WORKDIR/mpi_coll_bench.mpich.build.log" 2>&1; then
	cat "$WORKDIR/mpi_coll_bench.mpich.build.log" >&2
	((MPICH_ASKED)) && die "$MPICH_CC failed (apt-get install libmpich-dev)"
	log "MPICH skipped: $MPICH_CC cannot build mpi_coll_bench (apt-get install libmpich-dev)"
	MPICH_NOTE="MPICH not run: $MPICH_CC could not build mpi_coll_bench (apt-get install libmpich-dev)."
	MPICH_VARS=()
fi
((RUN_FR || ${#VARIANTS[@]} || ${#MPICH_VARS[@]})) || die "nothing left to run"
if ((${#VARIANTS[@]} || ${#MPICH_VARS[@]})) && ((USE_NS)); then
	# mpirun / mpiexec runs in host 0's namespace and starts a daemon
	# (Open MPI's orted, MPICH's hydra_pmi_proxy) in each other host's
	# namespace through this "rsh" (as over ssh on a real cluster), so
	# every rank talks to a daemon on its own host and MPI traffic crosses
	# the emulated links.  Hosts are named by address.  Every host gets its
	# own TMPDIR, as real nodes have their own /tmp: with a shared one, all
	# orteds of a job (same hostname) write the same session directory's
	# hwloc.sm topology file at once and some crash (SIGSEGV in
	# hwloc_shmem_topology_write), and mpirun then waits forever for the
	# missing daemon.
	NODE_TMP=$(mktemp -d /tmp/frbt.XXXXXX)
	for ((r = 0; r < RANKS; r++)); do mkdir -p "$NODE_TMP/h$r"; done
	cat >"$WORKDIR/nsrsh" <<EOF
#!/bin/sh
# rsh agent for compare.sh: nsrsh ${BENCH_SUBNET}.<i+1> CMD... runs CMD in ${BENCH_NS_PREFIX}h<i>
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
reduce | alltoall | sendrecv | pingpong) RING_ALG="" ;; # no ring: the ring variant is refused
esac
OMPI_VERSION=$("$OMPI_RUN" --version 2>/dev/null | awk 'NR==1 {print $NF}')
MPICH_VERSION=$(mpichversion 2>/dev/null | awk -F'\t' '/^MPICH Version:/ {print $NF}')

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

# parse FILE KIND -> "size mean median p99 min wrong algo" of the first row,
# columns found by name (so an extra column does not matter); "-" for what
# the tool does not report (an fr_allreduce_perf without per-call timing).
parse_out() {
	awk -v kind="$2" '
	function setcols(n, a,   i, k) {
		for (i = 1; i <= n; i++) {
			k = a[i]; sub(/^#/, "", k)
			if (k == "size") cs = i
			else if (k == "time_mean_us" || k == "mean") cm = i
			else if ((k == "time_us" || k == "time") && !ct) ct = i
			else if (k == "time_median_us" || k == "median") cmed = i
			else if (k == "time_p99_us" || k == "p99") cp = i
			else if (k == "time_min_us" || k == "min") cmin = i
			else if (k == "wrong" || k == "#wrong") cw = i
			else if (k == "algo" || k == "algorithm") ca = i
		}
		if (!cm) cm = ct # older tools: time is the mean
	}
	function get(c) { return c && f[c] != "" ? f[c] : "-" }
	kind == "csv" && !hdr && /^size,/ { n = split($0, a, ","); setcols(n, a); hdr = 1; FS = ","; next }
	kind == "table" && !hdr && /^#/ && / size / && / time / {
		line = $0; sub(/^#/, "", line); n = split(line, a, " "); setcols(n, a); hdr = 1; next }
	hdr && !/^#/ && NF > 2 {
		if (kind == "csv") n = split($0, f, ","); else n = split($0, f, " ")
		if (f[cs] !~ /^[0-9]+$/) next
		w = get(cw); if (w == "N/A") w = "-"
		print f[cs], get(cm), get(cmed), get(cp), get(cmin), w, get(ca); found = 1; exit
	}
	END { if (!found) print "- - - - - - -" }' "$1"
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
# wait_idle -> busy percent at the start of the job
wait_idle() {
	local busy end=$((SECONDS + WAIT_IDLE))
	busy=$(cpu_busy)
	while ((busy >= BUSY_LIMIT && SECONDS < end)); do
		sleep 1
		busy=$(cpu_busy)
	done
	echo "$busy"
}
load1() { cut -d' ' -f1 /proc/loadavg; }

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
		echo "+ ${FR_ENV[*]} ${EXTRA_ENV[*]} frrun -n $RANKS --no-prefix $FR_BIN ${args[*]}" >"$base.cmd"
		run_bg "$base.out" "$base.err" env "${FR_ENV[@]}" "${EXTRA_ENV[@]}" "$FRRUN" -n "$RANKS" -t "$TIMEOUT" \
			--no-prefix -- "$FR_BIN" "${args[@]}"
		return $?
	fi
	port=$((29500 + RUN_NO % 1000))
	echo "+ per rank r: ip netns exec $(ns_host r) env FR_RANK=r FR_NRANKS=$RANKS FR_RENDEZVOUS=$(ns_addr 0):$port ${FR_ENV[*]} ${EXTRA_ENV[*]} $FR_BIN ${args[*]}" >"$base.cmd"
	for ((r = 0; r < RANKS; r++)); do
		ip netns exec "$(ns_host "$r")" env FR_RANK=$r FR_NRANKS="$RANKS" FR_LOCAL_RANK=0 FR_LOCAL_SIZE=1 \
			FR_RENDEZVOUS="$(ns_addr 0):$port" FR_JOB_TOKEN="$tok" "${FR_ENV[@]}" "${EXTRA_ENV[@]}" \
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

# run_mpi VARIANT SIZE ITERS WARMUP OUTBASE -> rc (Open MPI)
run_mpi() {
	local v=$1 size=$2 it=$3 wu=$4 base=$5 mca=() pre=() alg="" hosts r p
	# TCP over the emulated links (ob1 + btl tcp; no UCX, no shared
	# memory, which would bypass them); everything else as shipped
	mca=(--mca pml ob1)
	# TCP between ranks unless the variant names its own btl
	# (e.g. "default,btl=vader+self": Open MPI's shared memory)
	# shellcheck disable=SC2054
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
	# VARIANT = ALG[+yield|+noyield][,mca_param=value...]
	local algname=${v%%,*} kv
	case "$algname" in
	*+yield) mca+=(--mca mpi_yield_when_idle 1); algname=${algname%+yield} ;;
	*+noyield) mca+=(--mca mpi_yield_when_idle 0); algname=${algname%+noyield} ;;
	esac
	case "$algname" in
	default) ;;
	ring)
		[[ -n "$RING_ALG" ]] || die "--mpi-variants: Open MPI has no ring for $COLL; name one of its algorithms"
		alg=$RING_ALG
		;;
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
	local cmd=("${pre[@]}" "$OMPI_RUN" -np "$RANKS" --bind-to none "${mca[@]}" $MPI_ARGS
		"$MPI_BIN" -c "$COLL" -n "$it" -w "$wu" --csv "$size")
	echo "+ ${cmd[*]}" >"$base.cmd"
	run_bg "$base.out" "$base.err" timeout -k 10 "$TIMEOUT" "${cmd[@]}" || return $?
	# Open MPI only warns about a bad MCA value and goes on with the default
	if grep -qiE 'invalid value was supplied|not a valid value' "$base.err"; then
		log "mpirun rejected an MCA value (variant '$v'): see $base.err"
		return 3
	fi
}

# run_mpich VARIANT SIZE ITERS WARMUP OUTBASE -> rc (MPICH, hydra)
run_mpich() {
	local v=$1 size=$2 it=$3 wu=$4 base=$5 pre=() opts=() hosts r p kv k
	local -A envs=()
	local names=()
	# TCP over the emulated links, as Open MPI's btl tcp: all namespaces
	# share one kernel and /dev/shm, so UCX would otherwise carry the data
	# through shared memory (and MPICH's own shm on one "node" in
	# loopback); everything else as shipped
	envs[MPIR_CVAR_NOLOCAL]=1
	envs[UCX_TLS]=tcp,self
	if ((USE_NS)); then envs[UCX_NET_DEVICES]=eth0; else envs[UCX_NET_DEVICES]=lo; fi
	names=(MPIR_CVAR_NOLOCAL UCX_TLS UCX_NET_DEVICES)
	# VARIANT = ALG[,NAME=VALUE...]
	local algname=${v%%,*}
	case "$algname" in
	default) ;;
	*)
		[[ "$algname" == ring ]] && algname=$MPICH_RING
		envs[MPIR_CVAR_${MPICH_COLL}_INTRA_ALGORITHM]=$algname
		envs[MPIR_CVAR_${MPICH_COLL}_DEVICE_COLLECTIVE]=0
		names+=("MPIR_CVAR_${MPICH_COLL}_INTRA_ALGORITHM" "MPIR_CVAR_${MPICH_COLL}_DEVICE_COLLECTIVE")
		;;
	esac
	if [[ "$v" == *,* ]]; then
		IFS=, read -r -a kv <<<"${v#*,}"
		for p in "${kv[@]}"; do
			[[ "$p" == *=* ]] || { log "variant '$v': '$p' is not NAME=VALUE"; return 2; }
			k=${p%%=*}
			[[ -v "envs[$k]" ]] || names+=("$k")
			envs[$k]=${p#*=}
			envs[$k]=${envs[$k]//+/,}
		done
	fi
	for k in "${names[@]}"; do opts+=(-genv "$k" "${envs[$k]}"); done
	if ((USE_NS)); then
		hosts=$(ns_addr 0)
		for ((r = 1; r < RANKS; r++)); do hosts+=",$(ns_addr "$r")"; done
		pre=(ip netns exec "$(ns_host 0)" env TMPDIR="$NODE_TMP/h0")
		opts+=(-launcher rsh -launcher-exec "$WORKDIR/nsrsh" -hosts "$hosts" -ppn 1 -iface eth0)
	fi
	# shellcheck disable=SC2206
	local cmd=("${pre[@]}" "$MPICH_RUN" -n "$RANKS" "${opts[@]}" $MPICH_ARGS
		"$MPICH_BIN" -c "$COLL" -n "$it" -w "$wu" --csv "$size")
	echo "+ ${cmd[*]}" >"$base.cmd"
	run_bg "$base.out" "$base.err" timeout -k 10 "$TIMEOUT" "${cmd[@]}"
}

# ---- the runs ---------------------------------------------------------------
LABELS=()
((RUN_FR)) && LABELS+=(fr)
for v in "${VARIANTS[@]}"; do LABELS+=("ompi:$v"); done
for v in "${MPICH_VARS[@]}"; do LABELS+=("mpich:$v"); done
RES=$WORKDIR/results.tsv
printf 'round\tjob\tsize\tlabel\tsize_reported\tmean_us\tmedian_us\tp99_us\tmin_us\twrong\talgo\trc\tbusy_pct\tload_start\tload_end\tc2c_ns\n' >"$RES"
GIT_REV=$(git -C "$REPO" rev-parse --short HEAD 2>/dev/null || echo unknown)
git -C "$REPO" diff --quiet HEAD -- src include transports perf 2>/dev/null || GIT_REV="$GIT_REV+dirty"
START=$(date +%s)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average at the start: $LOAD0 ($(nproc) CPUs)"
FAILS=0
for ((round = 1; round <= ROUNDS; round++)); do
	for size in "${SIZE_LIST[@]}"; do
		it=$(iters_for "$size")
		wu=$(warmup_for "$it")
		for ((job = 1; job <= JOBS; job++)); do
			order=("${LABELS[@]}")
			# A B, B A, A B, ...: every other pass over the libraries
			# (jobs within a round, then rounds) runs in reverse
			if ((((round - 1) * JOBS + job) % 2 == 0)); then
				order=()
				for ((k = ${#LABELS[@]} - 1; k >= 0; k--)); do order+=("${LABELS[$k]}"); done
			fi
			for lab in "${order[@]}"; do
				RUN_NO=$((RUN_NO + 1))
				base=$WORKDIR/r${round}j${job}_${size}_${lab//[^A-Za-z0-9_.-]/_}
				busy=$(wait_idle)
				rtt=$(c2c)
				l0=$(load1)
				case $lab in
				fr)
					run_fr "$size" "$it" "$wu" "$base"
					rc=$?
					kind=$FR_FMT
					;;
				ompi:*)
					run_mpi "${lab#ompi:}" "$size" "$it" "$wu" "$base"
					rc=$?
					kind=csv
					;;
				*)
					run_mpich "${lab#mpich:}" "$size" "$it" "$wu" "$base"
					rc=$?
					kind=csv
					;;
				esac
				l1=$(load1)
				read -r rsize tmean tmed tp99 tmin w al <<<"$(parse_out "$base.out" "$kind")"
				if ((rc == 0)) && [[ "$tmean" == - ]]; then
					log "$lab size $size: no row (the tool skips sizes of fewer elements than it needs)"
				elif ((rc)); then
					FAILS=$((FAILS + 1))
					log "$lab size $size failed (rc $rc): see $base.err* ; last lines:"
					tail -n 5 "$base".err* >&2 2>/dev/null
				fi
				printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$job" "$size" "$lab" \
					"$rsize" "$tmean" "$tmed" "$tp99" "$tmin" "$w" "$al" "$rc" "$busy" "$l0" "$l1" "$rtt" >>"$RES"
				log "round $round job $job size $size $lab: median ${tmed} us, p99 ${tp99} us, min ${tmin} us, mean ${tmean} us (iters $it, rc $rc, CPUs ${busy}% busy, load $l0 -> $l1, core-to-core round trip $rtt ns)"
			done
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
	libs=()
	((RUN_FR)) && libs+=(libfastreduce)
	((${#VARIANTS[@]})) && libs+=("Open MPI $OMPI_VERSION")
	((${#MPICH_VARS[@]})) && libs+=("MPICH $MPICH_VERSION")
	title=${libs[0]}
	for l in "${libs[@]:1}"; do title+=" vs $l"; done
	echo "### $COLL: $title"
	echo
	echo "Load average at the start: $LOAD0 ($(nproc) CPUs; anything else running on the box skews the numbers)."
	echo
	if ((USE_NS)); then
		echo "$RANKS ranks, one per network namespace; link $RATE${LINE:+ ($LINE GB/s)} shaped $SHAPE with a ${QUEUE_MS} ms tbf queue, one-way delay ${DELAY_MS} ms ($NS_DELAY_METHOD), measured RTT ${RTT_MS:-n/a} ms;"
	else
		echo "$RANKS ranks on loopback (no namespaces);"
	fi
	echo "$(nproc) CPUs, $(uname -r); libfastreduce $GIT_REV (FR_TRANSPORT=$FR_TRANSPORT_SHOWN); iters ${ITERS}, warmup ${WARMUP}; $ROUNDS round(s) x $JOBS job(s) per size and library, each job a fresh launch, the order alternating."
	echo "Every library the same statistic: per call the slowest rank's time; per job its median, p99 and min over the calls, and the mean (the slowest rank's average); the table shows the median of each over the jobs; busbw and the ratio use the $STAT."
	extra=""
	((${#EXTRA_ENV[@]})) && extra+=" env: ${EXTRA_ENV[*]}"
	frenv=$(env | grep -E '^FR_' | tr '\n' ' ')
	[[ -n "$frenv" ]] && extra+=" inherited: $frenv"
	[[ -n "$FR_ARGS" ]] && extra+=" fr args: $FR_ARGS"
	[[ -n "$MPI_ARGS" ]] && extra+=" mpirun args: $MPI_ARGS"
	[[ -n "$MPICH_ARGS" ]] && extra+=" mpiexec args: $MPICH_ARGS"
	((${#VARIANTS[@]})) && extra+=" Open MPI: as shipped but pml ob1, btl tcp,self (TCP over the links); mpi_yield_when_idle only where a variant says +yield/+noyield."
	((${#MPICH_VARS[@]})) && extra+=" MPICH ($MPICH_RUN): as shipped but MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self UCX_NET_DEVICES=$( ((USE_NS)) && echo eth0 || echo lo) (TCP over the links)."
	[[ -n "$MPICH_NOTE" ]] && extra+=" $MPICH_NOTE"
	[[ -n "$extra" ]] && echo "Settings:$extra"
	echo
} >"$WORKDIR/results.md"

awk -F'\t' -v labels="${LABELS[*]}" -v sizes="${SIZE_LIST[*]}" -v coll="$COLL" -v busylimit="$BUSY_LIMIT" \
	-v stat="$STAT" -v nranks="$RANKS" '
function sortn(a, n,   i, j, x) { for (i = 2; i <= n; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] + 0 > x + 0; j--) a[j + 1] = a[j]; a[j + 1] = x } }
# median over the jobs of statistic s of key k ("" when none)
function medof(k, s,   n, i, a) {
	n = 0
	for (i = 1; i <= cnt[k]; i++) if (v[k, s, i] != "-") a[++n] = v[k, s, i]
	if (!n) return ""
	sortn(a, n)
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function fmt_t(t) { return t == "" ? "n/a" : (t >= 1000 ? sprintf("%.0f", t) : (t >= 10 ? sprintf("%.1f", t) : sprintf("%.2f", t))) }
function hs(b) { if (b >= 1048576 && b % 1048576 == 0) return sprintf("%d MiB", b / 1048576)
	if (b >= 1024 && b % 1024 == 0) return sprintf("%d KiB", b / 1024); return b " B" }
function name(l) { if (l == "fr") return "libfastreduce"; if (l ~ /^ompi:/) return "Open MPI " substr(l, 6); return "MPICH " substr(l, 7) }
BEGIN {
	n = nranks
	factor = coll == "allreduce" ? 2 * (n - 1) / n : coll == "pingpong" ? 2 : coll == "broadcast" || coll == "reduce" || coll == "sendrecv" ? 1 : (n - 1) / n
	SI["mean"] = 6; SI["median"] = 7; SI["p99"] = 8; SI["min"] = 9
}
NR > 1 {
	key = $3 SUBSEP $4
	if ($13 + 0 >= busylimit) { nbusy[key]++
		if (bmin[key] == "" || $13 + 0 < bmin[key]) bmin[key] = $13 + 0
		if ($13 + 0 > bmax[key] + 0) bmax[key] = $13 + 0 }
	njobs[key]++
	if ($12 != 0) { bad[key]++; next }
	if ($6 == "-") { skipped[key] = 1; next }
	c = ++cnt[key]
	for (s in SI) v[key, s, c] = $(SI[s])
	v[key, "c2c", c] = $16
	rs[key] = $5
	if ($10 != "-" && $10 + 0 != 0) wrong[key] += $10
	if ($11 != "-" && $11 != "" && index("/" algos[key] "/", "/" $11 "/") == 0) algos[key] = (algos[key] == "" ? "" : algos[key] "/") $11
	if ($16 != "" && $16 != "-") rt[++nrt] = $16
	for (j = 14; j <= 15; j++) if ($j != "") {
		if (lmin == "" || $j + 0 < lmin + 0) lmin = $j
		if (lmax == "" || $j + 0 > lmax + 0) lmax = $j
	}
}
END {
	nl = split(labels, L, " "); ns = split(sizes, S, " ")
	hasfr = (L[1] == "fr")
	print "| size | library | jobs | median (us) | p99 (us) | min (us) | mean (us) | busbw (GB/s, " stat ") |" (hasfr ? " " stat " / fr |" : "") " algo |"
	print "|---:|:--|---:|---:|---:|---:|---:|---:|" (hasfr ? "---:|" : "") ":--|"
	maxjobs = 0
	for (s = 1; s <= ns; s++) {
		sz = S[s]; note = ""
		tfr = hasfr ? medof(sz SUBSEP "fr", stat) : ""
		for (i = 1; i <= nl; i++) {
			key = sz SUBSEP L[i]
			if (cnt[key] > maxjobs) maxjobs = cnt[key]
			t = medof(key, stat)
			bw = (t != "" && t > 0) ? sprintf("%.4f", rs[key] * factor / (t * 1e3)) : "n/a"
			ratio = (hasfr && t != "" && tfr != "" && tfr > 0) ? sprintf("%.2f", t / tfr) : "n/a"
			row = "| " hs(sz) " | " name(L[i]) " | " (cnt[key] + 0) " | " fmt_t(medof(key, "median")) " | " fmt_t(medof(key, "p99")) " | " \
				fmt_t(medof(key, "min")) " | " fmt_t(medof(key, "mean")) " | " bw " |"
			if (hasfr) row = row " " (L[i] == "fr" && ratio != "n/a" ? "1.00" : ratio) " |"
			row = row " " (algos[key] == "" ? "-" : algos[key]) " |"
			print row
			if (wrong[key]) note = note " " name(L[i]) ": " wrong[key] " WRONG elements;"
			if (cnt[key] && rs[key] != sz) note = note " " name(L[i]) " used " rs[key] " B;"
			if (bad[key]) note = note " " name(L[i]) ": " bad[key] " job(s) failed;"
			if (skipped[key] && !cnt[key]) note = note " " name(L[i]) ": size skipped by the tool (too few elements for the ranks);"
			if (cnt[key] && medof(key, "median") == "") note = note " " name(L[i]) ": no per-call times (an fr_allreduce_perf without them? rebuild);"
			if (nbusy[key]) note = note " " name(L[i]) ": " nbusy[key] " of " njobs[key] " job(s) started with the CPUs " \
				(bmin[key] == bmax[key] ? bmax[key] : bmin[key] "-" bmax[key]) "% busy;"
		}
		if (note != "") notes = notes "\n- " hs(sz) ":" note
	}
	if (hasfr && nl > 1) print "\n" stat " / fr = the library'"'"'s " stat " / libfastreduce'"'"'s " stat ": above 1 libfastreduce is faster."
	if (nrt) sortn(rt, nrt)
	if (maxjobs > 1) {
		# the usual state of the machine: a core-to-core round trip at most
		# twice the median of all the jobs (vCPUs that the host moved apart make
		# the shared-memory copies of every library several times slower)
		if (nrt) usual = 2 * rt[int((nrt + 1) / 2)]
		print "\nSpread over the jobs (fresh processes each) of the per-job " stat "; the last two columns count only the jobs whose core-to-core round trip before them was at most twice the median (" (nrt ? usual " ns" : "not measured") "):\n"
		print "| size | library | jobs | min (us) | median (us) | max (us) | max/min | jobs, usual c2c | max/min there |"
		print "|---:|:--|---:|---:|---:|---:|---:|---:|---:|"
		for (s = 1; s <= ns; s++) for (i = 1; i <= nl; i++) {
			key = S[s] SUBSEP L[i]; m = 0; u = 0
			for (j = 1; j <= cnt[key]; j++) if (v[key, stat, j] != "-") {
				a[++m] = v[key, stat, j]
				cj = v[key, "c2c", j]
				if (!nrt || cj == "" || cj == "-" || cj + 0 <= usual) b[++u] = v[key, stat, j]
			}
			if (!m) { print "| " hs(S[s]) " | " name(L[i]) " | 0 | n/a | n/a | n/a | n/a | 0 | n/a |"; continue }
			sortn(a, m); sortn(b, u)
			md = m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
			print "| " hs(S[s]) " | " name(L[i]) " | " m " | " fmt_t(a[1]) " | " fmt_t(md) " | " fmt_t(a[m]) " | " (a[1] > 0 ? sprintf("%.2f", a[m] / a[1]) : "n/a") " | " \
				u " | " (u && b[1] > 0 ? sprintf("%.2f", b[u] / b[1]) : "n/a") " |"
		}
	}
	if (notes != "") print "\nNotes:" notes
	if (lmin != "") printf "\nLoad average (1 min) at the start and end of the jobs: between %s and %s.\n", lmin, lmax
	if (nrt) {
		printf "\nThe machine: core-to-core round trip before each job (c2c_rtt.c) min %d, median %d, max %d ns (max/min %.2f): read a library'"'"'s spread over the jobs against it.\n", \
			rt[1], rt[int((nrt + 1) / 2)], rt[nrt], rt[nrt] / rt[1] }
}' "$RES" >>"$WORKDIR/results.md"
{
	echo
	echo "Load average at the end: $LOAD1 (at the start: $LOAD0)."
	echo "Jobs: $RUN_NO in ${ELAPSED}s, $FAILS failed. Logs and raw results: $WORKDIR (results.tsv: every job; r<round>j<job>_<size>_<label>.{cmd,out,err})."
} >>"$WORKDIR/results.md"
cat "$WORKDIR/results.md"
((FAILS == 0))
