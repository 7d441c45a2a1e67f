#!/bin/bash
# The verbs transport, tested for real on Soft-RoCE (rdma_rxe) inside qemu
# (tests/rdma-vm/run).  One VM boot runs the whole single-host suite
# (tests/verbs_guest.sh); a second boot runs a 3-node job whose RoCE packets
# cross a virtual wire (tests/verbs_nodes.sh).
#
# Skipped (exit 77, with the reason) where the VM cannot run: not root, the
# verbs transport not built, qemu or the kernel not to be had, or
# FR_VM_TESTS=0.  CI sets FR_VM_TESTS=1, which
# turns a skip into a failure.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
B=${FR_BUILDDIR:-$src}
skip() {
	echo "SKIP verbs-in-VM tests: $*"
	[ "${FR_VM_TESTS:-auto}" = 1 ] && { echo "FR_VM_TESTS=1: a skip is a failure"; exit 1; }
	exit 77
}
[ "${FR_VM_TESTS:-auto}" = 0 ] && skip "FR_VM_TESTS=0"
[ "$(id -u)" = 0 ] || skip "needs root (qemu, 9p, network namespaces)"
grep -q '^#define FR_HAVE_VERBS 1' "$B/config.h" 2>/dev/null ||
	skip "the verbs transport is not built (configure found no rdma-core)"
case "$src$B" in *[\ ,]*) skip "paths with blanks or commas cannot be shared over 9p" ;; esac

run=$src/tests/rdma-vm/run
out=$B/verbs-vm
mkdir -p "$out"
# qemu, the kernel and the image: installed / downloaded / built once.
bash "$run" --prepare >"$out/prepare.log" 2>&1 ||
	{ tail -5 "$out/prepare.log"; skip "cannot prepare the VM (see $out/prepare.log)"; }
rc=0
t0=$SECONDS
echo "== single VM: conformance, matrix, registration, failures, perf =="
bash "$run" --share "$src" --share "$B" --timeout "${FR_VM_TIMEOUT:-2400}" \
	--log "$out/console.log" -- \
	env FR_BUILDDIR="$B" FR_VM_OUT="$out" FR_TEST_FULL="${FR_TEST_FULL:-0}" bash "$src/tests/verbs_guest.sh" || rc=1
echo "== the single VM took $((SECONDS - t0)) s =="
t0=$SECONDS
echo "== 3 VMs on a wire: one rank each =="
bash "$run" --nodes 3 --smp 1 --mem 1G --share "$src" --share "$B" \
	--timeout "${FR_VM_TIMEOUT:-1200}" --log "$out/nodes.log" -- \
	env FR_BUILDDIR="$B" FR_VM_OUT="$out" FR_TEST_FULL="${FR_TEST_FULL:-0}" bash "$src/tests/verbs_nodes.sh" || rc=1
echo "== the 3 VMs took $((SECONDS - t0)) s =="
exit $rc
