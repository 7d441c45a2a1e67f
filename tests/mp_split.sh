#!/bin/bash
# Sub-communicators (fr_comm_split, fr_comm_dup; tests/mp_split.c): every
# shape (rows and columns of 2 x c grids, odd colors, FR_UNDEFINED, one rank
# each, a split of a split, dup, 300 dups one after another (once), the parent
# destroyed first) on 1..8 ranks, each checked with All-Reduce, all-gather,
# broadcast and point-to-point against the reference; rows and columns
# reducing at once from two threads; a rank killed while they live (the
# communicators that contain it fail naming it, the others work on); a
# mismatch on one row (that row fails, the other and the parent work on).
# Over FR_TEST_TRANSPORT (tcp by default); shm and shm+tcp too unless it is
# set (the verbs suite sets it).
. "$(dirname "$0")/lib.sh"
X="$B/tests/mp_split"
export FR_TIMEOUT_MS=20000
transports=$TRANSPORT
[ -z "${FR_TEST_TRANSPORT:-}" ] && transports="tcp shm shm+tcp"
for t in $transports; do
	ranks=${FR_TEST_RANKS:-1 2 3 4 5 6 7 8}
	[ "$t" != tcp ] && ranks=${FR_TEST_RANKS:-3 6 8}
	for n in $ranks; do
		run "split n=$n ($t)" \
			frrun -n "$n" --transport "$t" --timeout 600 "$X" check
	done
	for n in ${FR_TEST_SPLIT_THREADS:-4 8}; do
		run "split threads n=$n ($t)" \
			frrun -n "$n" --transport "$t" --timeout 600 "$X" threads
	done
done
# ids come back (the shared endpoint's logic, the same on every transport:
# not repeated in the slow verbs VM)
[ -z "${FR_TEST_TRANSPORT:-}" ] &&
	run "split n=4: 300 dups one after another, ids reused ($TRANSPORT)" \
		frrun -n 4 -e FR_SPLIT_DUPS=300 --transport "$TRANSPORT" --timeout 600 "$X" check
run "split threads n=6 progress thread ($TRANSPORT)" \
	frrun -n 6 -e FR_PROGRESS=thread --transport "$TRANSPORT" --timeout 600 "$X" threads
for v in 0 3 5; do
	run "split kill victim=$v n=6 ($TRANSPORT)" \
		frrun -n 6 -e FR_TIMEOUT_MS=5000 --transport "$TRANSPORT" --timeout 120 "$X" kill --victim $v
done
run "split mismatch n=6 ($TRANSPORT)" \
	frrun -n 6 --transport "$TRANSPORT" --timeout 120 "$X" mismatch
finish
