#!/bin/bash
# A rank killed mid-run (or stalled): every other rank fails with an error
# within the timeout instead of hanging, and reports it.
. "$(dirname "$0")/lib.sh"
export FR_TIMEOUT_MS=3000

# survivors_ok N VICTIM HOW: frrun --keep-going lets the survivors finish;
# each must print its error line, and none may report a failed check.
survivors_ok() {
	n=$1 v=$2 how=$3
	out=$(frrun -n "$n" --transport "$TRANSPORT" --keep-going --timeout 60 \
		"$MP" die --victim "$v" --at 3 --how "$how" 2>&1)
	echo "$out"
	for r in $(seq 0 $((n - 1))); do
		[ "$r" = "$v" ] && continue
		echo "$out" | grep -q "^\[$r\] rank $r: FR_E[A-Z]* after" || return 1
	done
	! echo "$out" | grep -q 'FAIL rank'
}

for n in 2 4 5; do
	run "kill -9 rank $((n - 1)) of $n" survivors_ok "$n" $((n - 1)) kill
	run "rank 1 of $n exits abruptly" survivors_ok "$n" 1 exit
done
# non-neighbour connections: the hypercube algorithms and the double
# binary tree (FR_TEST_SHORT: rd, whose pattern of partners Rabenseifner
# shares)
algos="rd rabenseifner tree"
[ "$SHORT" = 1 ] && algos=rd
for algo in $algos; do
	export FR_ALGO=$algo
	run "kill -9 rank 2 of 8 ($algo)" survivors_ok 8 2 kill
	run "rank 5 of 6 stalls ($algo)" survivors_ok 6 5 stall
	unset FR_ALGO
done
# alive but silent: the timeout turns it into FR_ETIMEDOUT everywhere
run "rank 1 of 4 stalls" survivors_ok 4 1 stall
# small All-Reduces (3 floats): over shared memory by lines (algo/ll.c),
# where nothing but the connection and the timeout tells of a dead or
# silent peer
# (FR_TEST_SHORT: only where the transport has lines)
if [ "$SHORT" = 0 ] || [ "${TRANSPORT#shm}" != "$TRANSPORT" ]; then
	export FR_TEST_DIE_COUNT=3
	run "kill -9 rank 2 of 4, 3 elements" survivors_ok 4 2 kill
	run "rank 1 of 3 stalls, 3 elements" survivors_ok 3 1 stall
	unset FR_TEST_DIE_COUNT
fi
# alive but late, answering PINGs from its progress thread: the others wait
# for it up to FR_SLOW_TIMEOUT_MS (not FR_TIMEOUT_MS) and all succeed, and
# beyond that fail saying that it is alive but late, not dead
# (late N SLOW_MS ALGO late|toolate LATE_MS [AT] [VICTIM])
late() {
	frrun -n "$1" --transport "$TRANSPORT" --keep-going --timeout 60 \
		-e FR_PROGRESS=thread -e FR_TIMEOUT_MS=1500 -e FR_SLOW_TIMEOUT_MS="$2" \
		${3:+-e FR_ALGO=$3} "$MP" "$4" --victim "${7:-2}" --at "${6:-3}" \
		--late-ms "$5"
}
# (FR_TEST_SHORT: only the first and the last; the patience is the
# engine's, the same over every transport)
run "rank 2 of 5 is 4 s late: patience" late 5 20000 "" late 4000
if [ "$SHORT" = 0 ]; then
run "rank 2 of 8 is 4 s late (rd): patience" late 8 20000 rd late 4000
run "rank 2 of 5 is too late: alive but late" late 5 3000 "" toolate 7000
fi
# late for the very first collective of a hypercube algorithm: its partners
# beyond the ring were never connected.  A lower partner connects and the
# late rank's progress thread accepts at once; a higher one (6 = 2 ^ 4)
# does not wait for the late rank to connect: the shared endpoint's link
# opens from its side after a grace period, and its PINGs go over it
if [ "$SHORT" = 0 ]; then
run "rank 2 of 8 is 4 s late for the first collective (rd): patience" \
	late 8 20000 rd late 4000 0
run "rank 1 of 8 is 4 s late for the first (rabenseifner): patience" \
	late 8 20000 rabenseifner late 4000 0 1
fi
run "rank 2 of 8 is too late for the first (rd): alive but late" \
	late 8 3000 rd toolate 7000 0
# out of file descriptors after creation, before an algorithm that needs new
# connections: every rank fails (at once, or at the 3 s timeout where the
# victim, out of descriptors, cannot tell anyone), the victim's message says
# `ulimit -n` (over verbs, connections need no descriptor: it may succeed)
run "rank 1 of 4 runs out of descriptors (rd)" \
	frrun -n 4 -e FR_ALGO=rd --keep-going --transport "$TRANSPORT" --timeout 60 \
	bash -c "ulimit -n 200; exec \"$MP\" fdhog --victim 1 --what fds"
# rank 1 cannot allocate the ring's staging (4 GiB under ulimit -v 400 MB);
# not over verbs, where the other ranks would pin their 4 GiB in a small VM,
# nor in sanitizer builds, whose shadow memory needs no ulimit -v
sanitized() {
	ldd "$B/tests/.libs/mp_allreduce" 2>/dev/null | grep -q 'lib[at]san'
}
[ "$TRANSPORT" = verbs ] || sanitized ||
run "rank 1 of 3 cannot allocate its staging" \
	frrun -n 3 -e FR_ALGO=ring -e FR_SEGMENT_BYTES=256M -e FR_SLOTS=16 --keep-going \
	--transport "$TRANSPORT" --timeout 60 \
	bash -c "[ \"\$FR_RANK\" = 1 ] && ulimit -v 400000; exec \"$MP\" fdhog --victim 1 --what mem"
# stopped in the middle of a collective, resumed after the others failed and
# reused their buffers' addresses: its late writes must not land there
run "rank 1 of 4 freezes mid-collective" survivors_ok 4 1 freeze
finish
