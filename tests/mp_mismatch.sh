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
