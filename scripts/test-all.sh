#!/bin/bash
# The whole test suite, as CI runs it (README's second command):
#   1. -Werror build, `make check` (CMocka units + multi-process runs), and
#      a libFuzzer smoke of every harness (tests/fuzz);
#   2. the same suite built with AddressSanitizer + UBSan, and the threaded
#      tests built with ThreadSanitizer;
#   3. valgrind over the unit tests and a small multi-process run;
#   4. `make distcheck` (its check: the units and the suites that need the
#      tarball's scripts and data; stage 1 ran everything).
# Build trees go to build/, build-asan/, build-tsan/ (kept for inspection).
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top"
jobs=$(nproc 2>/dev/null || echo 2)
# Each stage says when it starts (seconds since this script began), so that
# a CI log shows where the time went.
step() { printf '\n=== %s === (at %d s)\n' "$*" "$SECONDS"; }
# FR_TEST_FULL=1: the long campaign (about an hour on two CPUs):
# every op at the large counts of the multi-process matrix, the ASan stage
# on 8 ranks too (and with mp_hier's runs where the model chooses and the
# whole kill and mismatch suites over shm), the
# Soft-RoCE VM's matrix on 1 to 5 ranks with every
# algorithm forced on each, and distcheck's matrix on 1 to 8 ranks.  Without
# it, what CI runs: the same suites, with the cuts each script names.
export FR_TEST_FULL=${FR_TEST_FULL:-0}
if [ "$FR_TEST_FULL" = 1 ]; then
	asan_ranks_default="1 2 3 5 8" asan_shm_ranks_default="1 2 3 5 8" asan_grid_ranks=16
	asan_hier_auto=1 asan_shm_short_faults=0
	dist_ranks="1 2 3 4 5 6 7 8"
else
	asan_ranks_default="1 2 3 5" asan_shm_ranks_default=3 asan_grid_ranks=8
	asan_hier_auto=0 asan_shm_short_faults=1
	dist_ranks="2 3"
fi

step "bootstrap"
./autogen.sh >/dev/null 2>&1 || ./autogen.sh

step "build (-Werror) and make check"
mkdir -p build
(cd build && ../configure --enable-werror >/dev/null && make -j"$jobs" >/dev/null &&
	make -j"$jobs" check) || { cat build/test-suite.log 2>/dev/null | tail -100; exit 1; }

# Every decoder that reads bytes from outside, under libFuzzer with ASan and
# UBSan: a short bounded run of each harness from its seeds (the long
# campaign is scripts/fuzz.sh run SECONDS).  Any crash fails the run.
step "fuzz smoke (libFuzzer, ${FR_FUZZ_SMOKE_S:-10} s per harness)"
(cd build && make fuzz-smoke) || { echo "fuzz smoke failed"; exit 1; }

# The Soft-RoCE VM suite runs in the first build only (FR_VM_TESTS=1 in CI
# makes it mandatory there); sanitizer runtimes are not in the VM image.
# The rank counts (FR_ASAN_TEST_RANKS, default "1 2 3 5": one rank, a power
# of two, odd counts that fold) keep this stage within CI's time: n = 8, four
# ranks to a CPU under ASan, is stage 1's (and FR_ASAN_TEST_RANKS="1 2 3 5 8"
# here, where time allows).  mp_shm.sh runs the matrix and the collectives
# over shm once more: under ASan on 3 ranks (FR_ASAN_SHM_TEST_RANKS),
# the code they add to the tcp runs' being the shm transport's; mp_hier.sh
# runs the grid of nodes (FR_TOPO) on 8 ranks only (FR_HIER_GRID_MAX_RANKS),
# stage 1 on 12 and 16 too.
step "ASan + UBSan build and make check"
mkdir -p build-asan
# LeakSanitizer needs ptrace-free /proc access; it works as root here.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
(cd build-asan && ../configure --enable-werror --enable-asan --enable-ubsan \
	--enable-debug >/dev/null && make -j"$jobs" >/dev/null &&
	FR_VM_TESTS=0 FR_TEST_RANKS="${FR_ASAN_TEST_RANKS:-$asan_ranks_default}" \
	FR_SHM_TEST_RANKS="${FR_ASAN_SHM_TEST_RANKS:-$asan_shm_ranks_default}" \
	FR_HIER_GRID_MAX_RANKS="${FR_HIER_GRID_MAX_RANKS:-$asan_grid_ranks}" \
	FR_HIER_AUTO="${FR_HIER_AUTO:-$asan_hier_auto}" \
	FR_SHM_SHORT_FAULTS="${FR_SHM_SHORT_FAULTS:-$asan_shm_short_faults}" make -j"$jobs" check) ||
	{ cat build-asan/test-suite.log 2>/dev/null | tail -100; exit 1; }

# The progress thread and the communicator's lock: the tests that run
# threads (the progress thread, a second application thread, several
# communicators in one process: test_peer, test_engine; sub-communicators
# reducing at once from two threads over one shared endpoint: mp_split)
# under ThreadSanitizer; any report fails the run.
step "ThreadSanitizer build and the threaded tests"
mkdir -p build-tsan
(cd build-tsan && ../configure --enable-werror --enable-tsan --enable-debug \
	--enable-verbs=no >/dev/null && make -j"$jobs" >/dev/null &&
	make -j"$jobs" tests/mp_allreduce tests/mp_split tests/test_peer tests/test_engine >/dev/null &&
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" ./tests/test_peer >/dev/null &&
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" ./tests/test_engine >/dev/null &&
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" ./frrun -n 4 --transport tcp \
		--timeout 600 tests/mp_split threads &&
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" ./frrun -n 4 -e FR_PROGRESS=thread \
		--transport shm --timeout 600 tests/mp_split threads &&
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" ./frrun -n 6 --transport tcp \
		--timeout 600 tests/mp_split check &&
	FR_BUILDDIR="$PWD" FR_TEST_RANKS="1 2 3 4" \
	TSAN_OPTIONS="halt_on_error=1 exitcode=66" bash "$top/tests/mp_training.sh") ||
	{ echo "ThreadSanitizer stage failed"; exit 1; }

# The kernels dispatch at run time (portable, AVX2, AVX-512, AVX-512 BF16)
# and test_reduce runs every level this CPU has; this build checks that the
# portable kernels also build and pass on their own (-DFR_REDUCE_NO_DISPATCH).
step "portable (non-dispatched) reduction kernels"
cc -std=c11 -O2 -D_GNU_SOURCE -DFR_REDUCE_NO_DISPATCH -Wall -Wextra -Werror \
	-Iinclude -Isrc tests/test_reduce.c src/reduce.c \
	$(pkg-config --cflags --libs cmocka) -lm -o build/test_reduce_portable
build/test_reduce_portable

step "valgrind"
bash "$top/tests/valgrind.sh" "$top/build"

# distcheck proves that the tarball is complete and builds, installs and
# tests out of tree; the whole suite already ran on this tree in stage 1,
# so its check runs the units and a few multi-process suites that need the
# scripts, data and Python files of the tarball (of the Python tests, the
# API, and the backend built from the tarball running the collectives: the
# training runs ran in stage 1), the matrix on 2 and 3 ranks
# (a plain `make distcheck` runs everything).
step "make distcheck"
dist_tests="tests/layers.sh tests/test_errors tests/test_env tests/test_bootstrap tests/test_ring \
tests/test_select tests/test_reduce tests/test_transport tests/test_mem tests/test_affinity \
tests/test_peer tests/test_engine tests/test_share \
tests/mp_matrix.sh tests/mp_example.sh tests/mp_perf_smoke.sh tests/mp_python.sh"
(cd build && FR_VM_TESTS=0 FR_TEST_RANKS="$dist_ranks" \
	FR_PY_TEST_FILES="test_api.py test_backend.py::test_collectives" \
	make -j"$jobs" distcheck TESTS="$dist_tests" >/dev/null) || {
	# distcheck keeps its tree when it fails: the failed tests' logs are in
	# its test-suite.log, which a CI log must show.
	for f in build/libfastreduce-*/_build/sub/test-suite.log; do
		[ -f "$f" ] && tail -200 "$f"
	done
	echo "distcheck failed"
	exit 1
}
echo "distcheck: ok"
step "all stages passed"
