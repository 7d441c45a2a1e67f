#!/bin/bash
# Ranks that call with different arguments all get FR_EMISMATCH, no hang;
# a rank whose arguments are refused gets FR_EINVAL, the others FR_EPEER.
. "$(dirname "$0")/lib.sh"
export FR_TIMEOUT_MS=20000
# FR_TEST_SHORT (lib.sh): 3 ranks for the plain cases, and the count only on
# each forced algorithm; the detection is the engine's, the same on every
# transport, and the fast ones run it all
ranks="2 3 5" algo_whats="count dtype op"
[ "$SHORT" = 1 ] && ranks=3 algo_whats=count
for n in $ranks; do
	for what in count dtype op; do
		run "mismatch $what n=$n" \
			frrun -n "$n" --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim $((n - 1)) --what $what
	done
done
# a rank calling another collective (broadcast vs All-Reduce), and the same
# mismatches when the algorithms talk to non-neighbours
for n in 2 3 4; do
	run "mismatch coll n=$n" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim $((n - 1)) --what coll
done
for algo in ring rd rabenseifner oneshot tree; do
	for what in $algo_whats; do
		run "mismatch $what n=5 $algo" \
			frrun -n 5 -e FR_ALGO=$algo --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim 2 --what $what
	done
done
# a large Rabenseifner, whose steps go zero copy (xfer.c): caught by the
# READY's header as by a fragment's
run "mismatch count n=5 rabenseifner zero-copy" \
	frrun -n 5 -e FR_ALGO=rabenseifner --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim 2 --what count --counts 1000000
# small calls (3 elements: over shared memory the one-shot over lines,
# ll.c, whose header names the call), where the transport has lines or
# the suite runs in full (elsewhere they are the mailboxes' cases above)
small_ranks="2 3"
case $TRANSPORT in
shm*) ;;
*) [ "$SHORT" = 1 ] && small_ranks="" ;;
esac
for n in $small_ranks; do
	for what in count dtype op; do
		run "mismatch $what n=$n 3 elements" \
			frrun -n "$n" --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim $((n - 1)) --what $what --counts 3
	done
	# a barrier against a small All-Reduce (over shared memory both
	# by lines)
	run "mismatch barrier n=$n 3 elements" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim $((n - 1)) --what barrier --counts 3
	# a count past the line (28 doubles fit, the victim's 29 do not):
	# the victim's mailbox messages meet its peers' wait for lines
	run "mismatch count n=$n across the line's size" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim $((n - 1)) --what count --counts 28
done
# another collective than the peers' small one: where they use lines and
# the victim's broadcast goes by lines too (over shm, a CPU a rank), every
# rank reads the other call's header; where its broadcast goes by the tree
# (3 ranks on 2 CPUs) it finds their lines naming its collective while it
# waits; never the timeout (30 s, which would fail the case)
for n in $small_ranks; do
	run "mismatch coll n=$n 3 elements" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim $((n - 1)) --what coll --counts 3
done
# a small broadcast whose root one rank takes to be itself: over lines
# (forced where CPUs are short) the header names the root
case $TRANSPORT in
shm*)
	for n in 2 3; do
		run "mismatch broadcast root n=$n 3 elements, by lines" \
			frrun -n "$n" -e FR_ALGO=oneshot --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim $((n - 1)) --what bcastroot --counts 3
	done
	;;
esac
# FR_LL=0 on one rank alone, over a transport with lines (shm, and the
# mixed ones): refused at the rendezvous, which names it (elsewhere the
# ranks may differ: tests/verbs_guest.sh)
ll_refused() {
	local out
	if out=$(frrun -n 2 --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim 1 --what ll 2>&1); then
		echo "$out"
		return 1
	fi
	grep -q 'll=0' <<<"$out" || { echo "$out"; return 1; }
}
case $TRANSPORT in
shm*) run "FR_LL differs: refused at the rendezvous" ll_refused ;;
esac
# a rank whose arguments are refused: the others fail at once, naming it
for n in $ranks; do
	for what in refuse-null refuse-dtype refuse-first; do
		run "$what n=$n" \
			frrun -n "$n" --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim $((n - 1)) --what $what
	done
done
for algo in rd rabenseifner; do
	run "refuse-first n=5 $algo" \
		frrun -n 5 -e FR_ALGO=$algo --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim 2 --what refuse-first
done
run "rank skips a collective n=4" \
	frrun -n 4 --transport "$TRANSPORT" --timeout 60 "$MP" mismatch --victim 2 --what skip
finish
