#!/bin/bash
# The ranks find each other under the launchers users start them with,
# without FR_RENDEZVOUS: MPICH's mpiexec (Hydra: PMI-1 over PMI_FD, the
# address published by rank 0) and Open MPI's mpirun (job id and local
# size from its environment; with FR_PMIX=1, the address published by rank
# 0 through PMIx, as on several hosts).  A launcher that is not installed,
# or a build without PMIx (configure --with-pmix), is skipped, visibly;
# FR_LAUNCHER_TESTS=1 (CI) makes that a failure.
. "$(dirname "$0")/lib.sh"
unset FR_RENDEZVOUS MASTER_ADDR MASTER_PORT
need() {
	command -v "$1" >/dev/null && return 0
	echo "SKIP: $1 not installed (apt-get install $2)"
	[ "${FR_LAUNCHER_TESTS:-0}" = 1 ] && nfail=$((nfail + 1))
	return 1
}
if need mpirun.mpich mpich; then
	for n in 1 2 3; do
		run "mpirun.mpich -np $n: matrix" timeout 300 mpirun.mpich -np "$n" \
			"$MP" matrix --counts 0,1,7919 --dtypes f32,i64 --ops sum,max
	done
	run "mpirun.mpich -np 2 over tcp: perf" timeout 120 mpirun.mpich -np 2 \
		-genv FR_TRANSPORT tcp "$B/fr_allreduce_perf" -b 8 -e 1M -f 32 -n 5
fi
if need mpirun.openmpi openmpi-bin; then
	for n in 2 3; do
		run "mpirun.openmpi -np $n: matrix" timeout 300 mpirun.openmpi \
			--allow-run-as-root --oversubscribe --bind-to none -np "$n" \
			"$MP" matrix --counts 0,1,7919 --dtypes f32,i64 --ops sum,max
	done
fi
# PMIx: the run must pass and every rank must say that PMIx gave it the
# address (FR_LOG=info); FR_PMIX=1 forces PMIx on this one host.
pmix_built() {
	grep -q '^#define FR_HAVE_PMIX 1' "$B/config.h" && return 0
	echo "SKIP: PMIx cases: this build has no PMIx (apt-get install libpmix-dev, configure --with-pmix)"
	[ "${FR_LAUNCHER_TESTS:-0}" = 1 ] && nfail=$((nfail + 1))
	return 1
}
# pmix_case MPIRUN-OPTION... -- COMMAND...: 3 ranks under mpirun; the
# run passes, and all 3 took the address from PMIx
pmix_case() {
	local log n rc=0 opts=()
	while [ "$1" != -- ]; do
		opts+=("$1")
		shift
	done
	shift
	log=$(mktemp)
	timeout 300 mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none \
		-np 3 -x FR_LOG=info "${opts[@]}" "$@" >"$log" 2>&1 || rc=$?
	n=$(grep -c 'INFO: rendezvous .* through PMIx (namespace .*, rank [0-9] of 3)' "$log")
	if [ "$rc" -ne 0 ] || [ "$n" -ne 3 ]; then
		echo "mpirun: exit $rc, $n of 3 ranks went through PMIx"
		cat "$log"
		rc=1
	fi
	rm -f "$log"
	return $rc
}
# shellcheck disable=SC2054
MATRIX=("$MP" matrix --counts 0,1,7919 --dtypes f32,i64 --ops sum,max)
if pmix_built && need mpirun.openmpi openmpi-bin; then
	# libpmix 4.2 itself leaks a few bytes per process (pmix_rte_init):
	# not ours to report in the ASan build
	supp=$(mktemp)
	echo 'leak:libpmix.so' >"$supp"
	export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$supp"
	run "mpirun.openmpi -np 3 FR_PMIX=1: address through PMIx" pmix_case \
		-x FR_PMIX=1 -- "${MATRIX[@]}"
	# "several hosts" as the launcher's variables say it (each rank alone
	# on its host; mpirun's own value wins over -x, hence env): PMIx
	# without FR_PMIX, rank 0 publishing FR_PMIX_HOST
	run "mpirun.openmpi -np 3 'several hosts': PMIx by default" pmix_case \
		-x FR_PMIX_HOST=127.0.0.1 -x FR_TRANSPORT=tcp -- \
		env OMPI_COMM_WORLD_LOCAL_SIZE=1 "${MATRIX[@]}"
	# PMIx shared with Open MPI in one process, in both orders: our
	# PMIx_Init/PMIx_Finalize must leave MPI_Init able to start, before or
	# after (sanitizer builds skip it: libmpi is not instrumented)
	if grep -q '^FR_LDFLAGS = .*-fsanitize' "$B/Makefile"; then
		echo "SKIP: fastreduce and MPI in one process: sanitizer build"
	elif need mpicc.openmpi libopenmpi-dev; then
		work=$(mktemp -d)
		cat >"$work/both.c" <<-'EOF'
		#include <stdio.h>
		#include <string.h>
		#include <mpi.h>
		#include <fastreduce.h>
		int main(int argc, char **argv)
		{
			int mpi_first = argc > 1 && !strcmp(argv[1], "mpi-first"), n = 0;
			fr_comm_t *comm;
			float x = 1;

			if (mpi_first)
				MPI_Init(&argc, &argv);
			if (fr_comm_create_from_env(NULL, &comm)) {
				fprintf(stderr, "%s\n", fr_comm_last_error(NULL));
				return 1;
			}
			if (!mpi_first)
				MPI_Init(&argc, &argv);
			MPI_Comm_size(MPI_COMM_WORLD, &n);
			if (fr_allreduce(comm, FR_IN_PLACE, &x, 1, FR_F32, FR_SUM) ||
			    x != n)
				return 1;
			MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_FLOAT, MPI_SUM,
				      MPI_COMM_WORLD);
			fr_comm_destroy(comm);
			MPI_Finalize();
			return x == n * n ? 0 : 1;
		}
		EOF
		if mpicc.openmpi -std=c11 -I"$(dirname "$0")/../include" -o "$work/both" \
			"$work/both.c" -L"$B/.libs" -lfastreduce -Wl,-rpath,"$B/.libs"; then
			for order in fr-first mpi-first; do
				run "mpirun.openmpi -np 3 FR_PMIX=1 + MPI: $order" pmix_case \
					-x FR_PMIX=1 -- "$work/both" "$order"
			done
		else
			echo "FAIL mpicc.openmpi could not build the MPI test program"
			nfail=$((nfail + 1))
		fi
		rm -rf "$work"
	fi
	# no PMIx server behind PMIX_NAMESPACE: a clear failure, at once
	run "FR_PMIX=1 without a PMIx server: clean failure" bash -c '
		out=$(env -u PMIX_SERVER_URI -u PMIX_SERVER_URI2 -u PMIX_SERVER_URI3 \
			-u PMIX_SERVER_URI4 -u PMIX_SERVER_URI21 -u PMIX_SERVER_URI41 \
			OMPI_COMM_WORLD_RANK=1 OMPI_COMM_WORLD_SIZE=2 \
			PMIX_NAMESPACE=fr-test-none PMIX_RANK=1 FR_PMIX=1 \
			timeout 60 "$1" matrix --counts 1 2>&1) && exit 1
		echo "$out"
		echo "$out" | grep -q "PMIx: PMIx_Init: "' _ "$MP"
	rm -f "$supp"
fi
# a rank 0 that starts 2 s late: a short FR_TIMEOUT_MS (noticing dead peers
# quickly) does not fail the start, the rendezvous waits the larger
# FR_BOOT_TIMEOUT_MS; set that short too and the others fail, saying why
late0='[ "$FR_RANK" = 0 ] && sleep 2; exec "$0" "$@"'
[ -z "${FR_TEST_TRANSPORT:-}" ] && {
	run "rank 0 starts 2 s late, FR_TIMEOUT_MS=500: the rendezvous waits" \
		frrun -n 3 -x tcp -e FR_TIMEOUT_MS=500 --timeout 120 \
		bash -c "$late0" "$MP" matrix --counts 1,7919 --dtypes f32 --ops sum
	run "... and FR_BOOT_TIMEOUT_MS=500: the others fail, saying so" bash -c '
		out=$("$3" -n 3 -x tcp -e FR_TIMEOUT_MS=500 \
			-e FR_BOOT_TIMEOUT_MS=500 --timeout 120 bash -c "$1" \
			"$2" matrix --counts 1 2>&1) && exit 1
		echo "$out"
		echo "$out" | grep -q "cannot reach the rendezvous"' _ "$late0" "$MP" "$B/frrun"
}
# frrun's own scale on this host: 128 ranks started at once on 2 CPUs are
# all admitted to the rendezvous (rank 0 once kept 64 unidentified
# connections and dropped genuine ranks: 63 of 128 missing), and their
# All-Reduce is checked.  Not in the verbs VM (no transport logic here).
[ -z "${FR_TEST_TRANSPORT:-}" ] &&
	run "frrun -n 128 at once (tcp): all admitted, results right" \
		frrun -n 128 -x tcp -e FR_TIMEOUT_MS=120000 --timeout 600 \
		"$B/fr_allreduce_perf" -b 8 -e 64K -f 8192 -w 1 -n 2 -c 1
finish
