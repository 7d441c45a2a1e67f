#!/bin/bash
# Verbs connections that fail and are re-established (fr_verbs.c, "Link
# flaps"; run by the Soft-RoCE VM suite, tests/verbs_guest.sh): FR_IB_FAULT
# stops one rank's queue pairs at every n-th write, as a link going down
# does.  The connection is drained, dialled again, and the writes the peer
# did not count are sent again: a seeded sequence of collectives of every
# kind must end with the digest of the same sequence run without faults,
# and each faulty run must have resumed.  With FR_IB_RESUME=0 the same
# fault fails the job cleanly (an FR_E* message, no hang).
. "$(dirname "$0")/lib.sh"
[ "$TRANSPORT" = verbs ] || { echo "SKIP mp_resume: verbs only"; exit 0; }
ITERS=${FR_RESUME_ITERS:-150}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# seq NAME ENV...: the sequence on 3 ranks with ENV; its output in $tmp/NAME
seq_run() {
	local name=$1
	shift
	frrun -n 3 --transport verbs --timeout 300 "$@" "$MP" faults \
		--iters "$ITERS" >"$tmp/$name" 2>&1
}
digest() { sed -n 's/^\[0\] digest //p' "$tmp/$1" | tail -1; }
# same NAME: it ran, resumed, and its digest is the clean one
same() {
	local d n
	d=$(digest "$1")
	n=$(grep -c 'is re-established' "$tmp/$1")
	echo "$1: digest ${d:-none}, $n connection(s) re-established"
	[ -n "$d" ] && [ "$d" = "$(digest clean)" ] && [ "$n" -gt 0 ] || {
		tail -n 30 "$tmp/$1"
		return 1
	}
}

faulty() {
	local name=$1
	shift
	seq_run "$name" "$@" && same "$name"
}
# without resume: a clean failure on every rank
noresume() {
	! seq_run off -e FR_IB_FAULT=1:40 -e FR_IB_RESUME=0 &&
		[ "$(grep -c '^\[[0-9]\] FAIL rank [0-9]: collective [0-9]*: rank' "$tmp/off")" -ge 3 ] ||
		{ tail -n 20 "$tmp/off"; return 1; }
}

run "clean sequence (the reference)" seq_run clean
run "a rank's QPs fail at every 40th write" faulty r1 -e FR_IB_FAULT=1:40
run "rank 0's at every 5th, 3 QPs, 4 KiB stripes" faulty r2 \
	-e FR_IB_FAULT=0:5 -e FR_IB_QPS=3 -e FR_IB_STRIPE_BYTES=4K
run "rank 2's at every write (back-to-back resumes)" faulty r3 -e FR_IB_FAULT=2:1
run "FR_IB_RESUME=0: every rank fails cleanly" noresume
finish
