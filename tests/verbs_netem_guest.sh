#!/bin/bash
# On each of 3 Soft-RoCE VMs, after tests/verbs_nodes.sh's clean runs: the
# short fault matrix that CI runs (the long one is tests/verbs_faults.sh).
#   1. a seeded sequence of FR_NETEM_ITERS (20) collectives of every kind,
#      clean and then under `netem loss 1%` on every node, over verbs and
#      over TCP: every run succeeds and rank 0's digest of all results
#      equals the clean one, bit for bit;
#   2. a link flap: node 1 takes its eth0 down for 3 s in the middle of a
#      longer sequence.  Over TCP the job rides it out (retransmission),
#      over verbs the failed connections are re-established and the writes
#      the peers did not get are sent again (fr_verbs.c, "Link flaps"):
#      either way every rank succeeds and the digest is the clean one.
#      FR_IB_RESUME=0 on the verbs run (FR_FLAP_NORESUME=1) shows the old
#      way: every rank fails cleanly, with an FR_E* code, in the timeout.
#      FR_FLAP_RUNS=n flaps the verbs run n times (the campaign:
#      tests/verbs_flaps.sh).
# Each node checks its own rank and exits non-zero on a failure.
set -u
B=${FR_BUILDDIR:?}
ulimit -l unlimited
export FR_RANK=${RDMAVM_NODE:?} FR_NRANKS=${RDMAVM_NODES:?}
export FR_JOB_TOKEN=verbs-netem
ITERS=${FR_NETEM_ITERS:-20} FLAP_ITERS=${FR_FLAP_ITERS:-200}
port=29700 rc=0
say() { echo "[node $FR_RANK] $*"; }

# one TRANSPORT ITERS TIMEOUT_MS: run the sequence; sets out, status, secs
# (FR_LOG from the caller: the flap runs keep the debug log for a failure)
one() {
	local t0=$EPOCHREALTIME
	out=$(FR_TRANSPORT=$1 FR_TIMEOUT_MS=$3 FR_RENDEZVOUS=10.99.0.1:$port \
		timeout 300 "$B/tests/mp_allreduce" faults --iters "$2" 2>&1)
	status=$?
	secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
	port=$((port + 1))
}
digest() { echo "$out" | sed -n 's/^digest //p' | tail -1; }
# must_pass WHAT REF: succeeded, and on rank 0 with the reference digest
must_pass() {
	if [ "$status" != 0 ]; then
		say "FAIL $1: exit $status after ${secs}s"
		echo "$out" | tail -5
		rc=1
	elif [ "$FR_RANK" = 0 ] && [ -n "$2" ] && [ "$(digest)" != "$2" ]; then
		say "FAIL $1: digest $(digest), clean $2"
		rc=1
	else
		say "ok $1 (${secs}s)"
	fi
}

one tcp "$ITERS" 60000
must_pass "clean, tcp, $ITERS collectives" ""
ref=$(digest)
[ "$FR_RANK" != 0 ] || [ -n "$ref" ] || { say "FAIL: no clean digest"; rc=1; }
one verbs "$ITERS" 60000
must_pass "clean, verbs" "$ref"

tc qdisc add dev eth0 root netem loss 1% || { say "FAIL: cannot add netem"; exit 1; }
for tp in verbs tcp; do
	one $tp "$ITERS" 60000
	must_pass "loss 1%, $tp" "$ref"
done
tc qdisc del dev eth0 root

# the flap: a clean reference for the longer sequence first
one tcp "$FLAP_ITERS" 60000
must_pass "clean, tcp, $FLAP_ITERS collectives" ""
fref=$(digest)
for tp in tcp $(for _ in $(seq "${FR_FLAP_RUNS:-1}"); do echo verbs; done); do
	flap_at=""
	if [ "$FR_RANK" = 1 ]; then
		(sleep 3; ip link set eth0 down; sleep 3; ip link set eth0 up) &
		flapper=$!
		flap_at=$(awk -v a="$EPOCHREALTIME" 'BEGIN { printf "%.1f", a + 3 }')
	fi
	if [ "$tp" = verbs ] && [ "${FR_FLAP_NORESUME:-0}" = 1 ]; then
		export FR_IB_RESUME=0
	fi
	FR_LOG=debug one $tp "$FLAP_ITERS" 20000
	unset FR_IB_RESUME
	if [ -n "$flap_at" ]; then
		wait "$flapper"
		# the link must come back before the next run
		for _ in $(seq 50); do ping -c1 -W1 10.99.0.1 >/dev/null 2>&1 && break; done
		if awk -v e="$EPOCHREALTIME" -v f="$flap_at" \
			'BEGIN { exit !(e < f) }'; then
			say "note: the run ended before the flap; it tested nothing"
		fi
	fi
	if [ "$tp" = verbs ]; then
		say "link flap, verbs: $(echo "$out" | grep -c 'is re-established') connection(s) re-established on this node"
	fi
	if [ "$status" = 0 ] || [ "${FR_FLAP_NORESUME:-0}" != 1 ]; then
		must_pass "link flap, $tp: recovered" "$fref"
		[ "$status" = 0 ] || echo "$out" | grep -v '^digest\|^rank [0-9]*: [a-z]* ok' | tail -25
	elif [ "$status" = 124 ] || [ "$status" = 137 ]; then
		say "FAIL link flap, $tp: still running after 300 s (a hang); its log ends:"
		echo "$out" | grep -v '^digest\|^rank [0-9]*: [a-z]* ok' | tail -25
		rc=1
	elif echo "$out" | grep -q "^FAIL rank $FR_RANK: collective [0-9]*: rank"; then
		say "ok link flap, $tp: failed cleanly after ${secs}s: $(echo "$out" | grep -m1 '^FAIL rank' | cut -c1-300)"
		[ "$tp" = tcp ] && { say "FAIL: TCP should ride out a 3 s flap"; rc=1; }
	else
		say "FAIL link flap, $tp: exit $status without an error message"
		echo "$out" | tail -5
		rc=1
	fi
done
exit $rc
