#!/bin/bash
# Verbs' polled lines (fr_verbs.c, "Small writes"; run by the Soft-RoCE VM
# suite, tests/verbs_guest.sh): a small write goes as a plain RDMA WRITE
# into a ring the peer polls, while the peer says it polls, and the peer
# is woken when it went to sleep meanwhile.  A seeded sequence of
# collectives of every kind must end with the digest of the same sequence
# run without lines (FR_IB_LL=0), with ranks that poll, that sleep between
# calls, that differ, and with connections that fail and resume; and the
# runs that should use lines must have used them (the close log's counts).
# Lines are off by default on a software device such as Soft-RoCE
# (FR_IB_LL unset): every run here sets FR_IB_LL.
. "$(dirname "$0")/lib.sh"
[ "$TRANSPORT" = verbs ] || { echo "SKIP mp_lines: verbs only"; exit 0; }
ITERS=${FR_LINES_ITERS:-200}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# seq_run NAME N [FRRUN-OPTIONS...] [-- PROGRAM ARGS...]: the sequence on N
# ranks (or what PROGRAM runs); its output in $tmp/NAME
seq_run() {
	local name=$1 n=$2
	shift 2
	case " $* " in
	*" -- "*) ;;
	*) set -- "$@" -- "$MP" faults --iters "$ITERS" ;;
	esac
	frrun -n "$n" --transport verbs --timeout 300 -e FR_LOG=debug \
		-e FR_IB_LL=1 "$@" \
		>"$tmp/$name" 2>&1
}
digest() { sed -n 's/^\[0\] digest //p' "$tmp/$1" | tail -1; }
# count NAME 1|2: the lines sent (1) or the wake-ups (2), over all ranks
count() {
	sed -n "s/.*polled lines: \([0-9]*\) sent, [0-9]* taken, \([0-9]*\) wake-ups.*/\\$2/p" \
		"$tmp/$1" | awk '{ s += $1 } END { print s + 0 }'
}
# same NAME REF [MIN_LINES]: its digest is REF's, with at least MIN_LINES
# lines sent
same() {
	local d s w
	d=$(digest "$1")
	s=$(count "$1" 1)
	w=$(count "$1" 2)
	echo "$1: digest ${d:-none} (reference $(digest "$2")), $s lines sent, $w wake-ups"
	[ -n "$d" ] && [ "$d" = "$(digest "$2")" ] && [ "$s" -ge "${3:-0}" ] || {
		grep -v 'DEBUG' "$tmp/$1" | tail -n 30
		return 1
	}
}
check() {
	local name=$1 n=$2 min=$3
	shift 3
	seq_run "$name" "$n" "$@" || {
		grep -v 'DEBUG' "$tmp/$name" | tail -n 30
		return 1
	}
	same "$name" "off$n" "$min"
}

run "2 ranks, no lines (the reference)" seq_run off2 2 -e FR_IB_LL=0
run "3 ranks, no lines (the reference)" seq_run off3 3 -e FR_IB_LL=0
# ranks that never sleep: every small write after the first goes as a line
run "2 ranks polling: small writes as lines" check spin2 2 50 -e FR_POLL=spin
run "3 ranks polling: small writes as lines" check spin3 3 50 -e FR_POLL=spin
# ranks that poll a while, then sleep, and sleep between calls: lines and
# wake-ups, and small writes the other way while a peer sleeps
run "3 ranks, 300 us polls, calls up to 3 ms apart" check jit3 3 0 \
	-e FR_SPIN_US=300 -- "$MP" faults --iters "$ITERS" --jitter-us 3000
run "2 ranks, rank 1 without lines" check mixed2 2 0 -e FR_POLL=spin -- \
	bash -c '[ $FR_RANK = 1 ] && export FR_IB_LL=0; exec "$0" "$@"' \
	"$MP" faults --iters "$ITERS"
# a connection that resumes sends the rest of its small writes as writes
run "3 ranks polling, rank 1's QPs fail at every 40th write" check fault3 3 0 \
	-e FR_POLL=spin -e FR_IB_FAULT=1:40
finish
