#!/bin/bash
# The netem fault matrix over 3 Soft-RoCE VMs (not part of make check: each
# boot of 3 VMs under TCG takes minutes; FR_FAULT_ITERS=N, default 120).  For each netem setting, every
# transport runs the same seeded sequence of collectives
# (tests/verbs_faults_guest.sh); the digests must match the clean run's.
#
#   tests/verbs_faults.sh BUILDDIR ["netem args" ...]
#
# default settings: none (a clean wire, for the times), "loss 1%", "loss 5%",
# "delay 2ms", "delay 200us 100us" (jitter, hence reordering).
# Prints a table: netem, transport, setting, seconds, rc, identical or not.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${1:?build directory}" && pwd)
shift
[ $# -gt 0 ] || set -- none "loss 1%" "loss 5%" "delay 2ms" "delay 200us 100us"
run=$src/tests/rdma-vm/run
out=$B/verbs-vm/faults
mkdir -p "$out"
bash "$run" --prepare >"$out/prepare.log" 2>&1 || { echo "cannot prepare the VM"; exit 1; }
boot() { # boot NAME [--netem ARGS] -- guest command
	local name=$1
	shift
	bash "$run" --nodes 3 --smp 1 --mem 1G --share "$src" --share "$B" \
		--timeout "${FR_VM_TIMEOUT:-2400}" --log "$out/$name.log" "$@"
}
guest=(env FR_BUILDDIR="$B" FR_FAULT_ITERS="${FR_FAULT_ITERS:-120}" \
	FR_FAULT_TIMEOUT_MS="${FR_FAULT_TIMEOUT_MS:-120000}" \
	FR_FAULT_RUNS="${FR_FAULT_RUNS:-verbs tcp verbs-cmdefault}" bash "$src/tests/verbs_faults_guest.sh")
# The inputs are exact, so the digest is the same over any transport and
# algorithm: the clean reference comes from 3 local ranks over TCP.
ref=$("$B/frrun" -n 3 --transport tcp "$B/tests/mp_allreduce" faults \
	--iters "${FR_FAULT_ITERS:-120}" | sed -n 's/^\[0\] digest //p')
[ -n "$ref" ] || { echo "no clean reference digest"; exit 1; }
echo "clean reference digest $ref"
rm -f "$out/table"
for n in "$@"; do
	tag=$(echo "$n" | tr -c 'a-z0-9' '_')
	echo "== netem $n"
	if [ "$n" = none ]; then
		boot "$tag" -- "${guest[@]}" >"$out/$tag.out" 2>&1
	else
		boot "$tag" --netem "$n" -- "${guest[@]}" >"$out/$tag.out" 2>&1
	fi
	grep -ho 'FAULTS .*' "$out/$tag.out" 2>/dev/null | sort -u |
		while read -r _ tp set secs rc dig; do
			same=identical
			[ "$dig" = "$ref" ] || same=DIFFERENT
			[ "$rc" = 0 ] || same="failed (rc $rc)"
			printf '%-20s %-6s %-12s %8ss  %s\n' "$n" "$tp" "$set" "$secs" "$same"
		done | tee -a "$out/table"
done
! grep -q 'DIFFERENT' "$out/table" 2>/dev/null
