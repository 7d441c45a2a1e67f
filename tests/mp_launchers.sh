#!/bin/bash
# The ranks find each other under the launchers users start them with,
# without FR_RENDEZVOUS: MPICH's mpiexec (Hydra: PMI-1 over PMI_FD, the
# address published by rank 0) and Open MPI's mpirun (job id and local
# size from its environment).  A launcher that is not installed is skipped,
# visibly; FR_LAUNCHER_TESTS=1 (CI) makes that a failure.
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
finish
