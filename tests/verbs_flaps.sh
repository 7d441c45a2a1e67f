#!/bin/bash
# The link-flap campaign over 3 Soft-RoCE VMs (not part of make check; a
# few minutes): tests/verbs_netem_guest.sh with its verbs flap run
# FR_FLAP_RUNS times (default 5).  Node 1 takes its link down for 3 s in
# the middle of a sequence of collectives; every run must end on every
# rank with the digest of the clean run (the connections re-established,
# fr_verbs.c "Link flaps").  Prints each node's runs (seconds, connections
# re-established) and a summary.
#
#   tests/verbs_flaps.sh BUILDDIR
#
# FR_FLAP_NORESUME=1 runs them with FR_IB_RESUME=0 instead (every rank
# fails cleanly).
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
B=$(cd "${1:?build directory}" && pwd)
out=$B/verbs-vm/flaps
mkdir -p "$out"
bash "$src/tests/rdma-vm/run" --nodes 3 --smp 1 --mem 1G --share "$src" \
	--share "$B" --timeout "${FR_VM_TIMEOUT:-2400}" --log "$out/nodes.log" \
	-- env FR_BUILDDIR="$B" FR_FLAP_RUNS="${FR_FLAP_RUNS:-5}" \
	FR_FLAP_NORESUME="${FR_FLAP_NORESUME:-0}" \
	bash "$src/tests/verbs_netem_guest.sh"
rc=$?
grep -h 'link flap' "$out"/nodes.node*.log | sed 's/^.*\[node/[node/' | sort -s -k2,2
echo "verbs flaps: $(grep -h 'ok link flap, verbs' "$out"/nodes.node*.log | wc -l) node-runs ok, $(grep -h 'FAIL link flap, verbs' "$out"/nodes.node*.log | wc -l) failed (3 nodes x ${FR_FLAP_RUNS:-5} runs)"
exit $rc
