#!/bin/bash
# Fuzzing with libFuzzer (clang): every decoder that reads bytes from outside
# the process.  Harnesses and seed corpora are in tests/fuzz/ (README there).
#
#   scripts/fuzz.sh build [BUILDDIR]        build the harnesses into
#                                           BUILDDIR/fuzz (default: build)
#   scripts/fuzz.sh smoke [BUILDDIR]        build, then each harness for
#                                           FR_FUZZ_SMOKE_S seconds (default
#                                           10) from its seeds, one harness
#                                           per core at a time: CI runs this
#   scripts/fuzz.sh run SECONDS [BUILDDIR] [HARNESS...]
#                                           the long campaign: each harness
#                                           for SECONDS on FR_FUZZ_JOBS
#                                           processes (default: all cores),
#                                           new inputs kept in
#                                           BUILDDIR/fuzz/work
#
# Every run prints one line per harness: executions, corpus size, crashes.
# A crash leaves its input as BUILDDIR/fuzz/crash-<harness>-*, and the
# script exits non-zero.  BUILDDIR must be configured (its config.h).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
HARNESSES="msg boot rkey tcp tune env"
CC_FUZZ=${CC_FUZZ:-clang}

usage() { sed -n '2,20p' "$0" >&2; exit 2; }

build() {
	local b=$1 out="$1/fuzz" obj srcs flags libs=""
	[ -f "$b/config.h" ] || { echo "fuzz.sh: $b is not configured (no config.h)" >&2; exit 2; }
	command -v "$CC_FUZZ" >/dev/null || { echo "fuzz.sh: $CC_FUZZ not found (apt-get install clang)" >&2; exit 2; }
	mkdir -p "$out/obj"
	flags="-std=c11 -Wall -Wextra -Werror -Wno-unused-parameter -g -O1 -fno-omit-frame-pointer -fsanitize=address,undefined
		-fno-sanitize-recover=undefined -include $b/config.h -I$top/include
		-I$top/src -I$top/src/algo -DFR_BUILDING_LIBRARY -DFR_FUZZING"
	# not src/pmix.c: env.c never calls PMIx when fuzzing (FR_FUZZING), so
	# the harnesses need neither libpmix nor its headers
	srcs=$(ls "$top"/src/*.c "$top"/src/algo/*.c "$top"/transports/tcp/*.c \
		"$top"/transports/shm/*.c "$top"/transports/mux/*.c \
		"$top"/transports/share/*.c \
		"$top"/transports/common/*.c)
	srcs=${srcs/"$top/src/pmix.c"/}
	if grep -q '^#define FR_HAVE_VERBS 1' "$b/config.h"; then
		srcs="$srcs $(ls "$top"/transports/verbs/*.c)"
		libs=$(pkg-config --libs libibverbs librdmacm hwloc)
	fi
	# src/affinity.c (configure --with-hwloc)
	if grep -q '^#define FR_HAVE_HWLOC 1' "$b/config.h"; then
		flags="$flags $(pkg-config --cflags hwloc)"
		libs="$libs $(pkg-config --libs hwloc)"
	fi
	# the library once, instrumented for coverage; then one link per harness
	for s in $srcs; do
		obj="$out/obj/$(basename "$s" .c).o"
		if [ ! -f "$obj" ] || [ "$s" -nt "$obj" ] || [ "$b/config.h" -nt "$obj" ]; then
			echo "  CC $(basename "$s")"
			# shellcheck disable=SC2086
			$CC_FUZZ $flags -fsanitize=fuzzer-no-link -c "$s" -o "$obj" &
			while [ "$(jobs -r | wc -l)" -ge "$(nproc)" ]; do wait -n; done
		fi
	done
	wait
	for h in $HARNESSES; do
		echo "  LD fuzz_$h"
		# shellcheck disable=SC2086
		$CC_FUZZ $flags -fsanitize=fuzzer "$top/tests/fuzz/fuzz_$h.c" \
			"$out"/obj/*.o $libs -lm -lpthread -o "$out/fuzz_$h"
	done
}

# run_one HARNESS SECONDS JOBS: prints "HARNESS: N executions, corpus C, crashes K"
run_one() {
	local h=$1 secs=$2 jobs=$3 out="$B/fuzz" log execs
	mkdir -p "$out/work/$h"
	log="$out/$h.log"
	rm -f "$out"/fuzz-"$h"-*.log
	set +e
	# -fork keeps going after a crash and counts them; the work corpus
	# gets new inputs, the seeds stay as committed
	(cd "$out" && ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
		"./fuzz_$h" -max_total_time="$secs" -fork="$jobs" \
		-ignore_crashes=1 -ignore_timeouts=0 -timeout=10 -rss_limit_mb=2048 \
		-artifact_prefix="crash-$h-" -print_final_stats=1 \
		"work/$h" "$top/tests/fuzz/corpus/$h") >"$log" 2>&1
	set -e
	# fork mode reports totals as "INFO: fuzzed for ... " and per-job stats
	execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" |
		awk '{ s += $2 } END { print s + 0 }')
	if [ "$execs" = 0 ]; then
		execs=$(grep -o '#[0-9]*' "$log" | tail -1 | tr -d '#')
	fi
	crashes=$(ls "$out"/crash-"$h"-* 2>/dev/null | wc -l)
	printf '%-5s %12s executions  corpus %5d  crashes %d\n' "$h" "${execs:-0}" \
		"$(ls "$out/work/$h" | wc -l)" "$crashes"
	[ "$crashes" -eq 0 ]
}

cmd=${1:-}
shift || true
case "$cmd" in
build)
	B=$(cd "${1:-$top/build}" && pwd)
	build "$B"
	;;
smoke)
	B=$(cd "${1:-$top/build}" && pwd)
	build "$B"
	# one process per harness, as many harnesses at once as there are
	# cores: each gets its seconds of fuzzing, the stage a share of them
	fail=0 pids=()
	par=$(nproc 2>/dev/null || echo 1)
	for h in $HARNESSES; do
		# (in a || list, as run alone: its greps may find nothing)
		{ run_one "$h" "${FR_FUZZ_SMOKE_S:-10}" 1 || exit 1; } &
		pids+=($!)
		if [ "${#pids[@]}" -ge "$par" ]; then
			wait "${pids[0]}" || fail=1
			pids=("${pids[@]:1}")
		fi
	done
	for p in "${pids[@]}"; do
		wait "$p" || fail=1
	done
	exit $fail
	;;
run)
	secs=${1:?seconds}
	shift
	B=$(cd "${1:-$top/build}" && pwd)
	shift || true
	build "$B"
	fail=0
	for h in ${*:-$HARNESSES}; do
		run_one "$h" "$secs" "${FR_FUZZ_JOBS:-$(nproc)}" || fail=1
	done
	exit $fail
	;;
*) usage ;;
esac
