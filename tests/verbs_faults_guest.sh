#!/bin/bash
# On each of 3 Soft-RoCE VMs (tests/verbs_faults.sh): one rank per "host",
# under whatever netem the VMs were booted with.  A fixed, seeded sequence of
# collectives (mp_allreduce faults: every collective, sizes from 1 element
# to 1 MiB) over verbs with the default ACK timeout, over verbs with
# rdma_cm's own (FR_IB_TIMEOUT=0), and over TCP; each run's digest of all
# results must equal the clean reference digest the host passed in
# (FR_FAULT_REF), i.e. bit-identical.  Prints one line per run:
#   FAULTS <transport> <setting> <seconds> <rc> <digest>
set -u
B=${FR_BUILDDIR:?}
ulimit -l unlimited
export FR_RANK=${RDMAVM_NODE:?} FR_NRANKS=${RDMAVM_NODES:?}
export FR_JOB_TOKEN=verbs-faults FR_TIMEOUT_MS=${FR_FAULT_TIMEOUT_MS:-120000}
port=29600
one() {
	local tp=$1 name=$2 t0 t1 rc out
	shift 2
	t0=$EPOCHREALTIME
	out=$(env FR_TRANSPORT="$tp" FR_RENDEZVOUS=10.99.0.1:$port "$@" \
		"$B/tests/mp_allreduce" faults --iters "${FR_FAULT_ITERS:-120}" 2>&1)
	rc=$?
	t1=$EPOCHREALTIME
	port=$((port + 1))
	echo "$out" | grep -v '^digest' | tail -3 >&2
	# rank 0 has the digest; the others only run
	[ "$FR_RANK" = 0 ] || return 0
	printf 'FAULTS %s %s %.1f %d %s\n' "$tp" "$name" \
		"$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$rc" \
		"$(echo "$out" | sed -n 's/^digest //p' | tail -1)"
}
for what in ${FR_FAULT_RUNS:-verbs tcp verbs-cmdefault}; do
	case $what in
	verbs) one verbs "ack=default" ;;
	verbs-cmdefault) one verbs "ack=rdma_cm" FR_IB_TIMEOUT=0 ;;
	tcp) one tcp "-" ;;
	esac
done
exit 0
