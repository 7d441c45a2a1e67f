#!/bin/bash
# Reduce-scatter, all-gather, broadcast (every root) and barrier on 1..8
# ranks, every dtype (x op for reduce-scatter), in and out of place, against
# the reference; broadcast with each of its algorithms.
. "$(dirname "$0")/lib.sh"
for n in ${FR_TEST_RANKS:-1 2 3 4 5 6 7 8}; do
	run "colls n=$n auto ($TRANSPORT)" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 1800 "$MP" colls \
		${FR_TEST_COLL_COUNTS:+--counts "$FR_TEST_COLL_COUNTS"}
done
# FR_TEST_COLL_ALGO_RANKS: the rank counts of the forced runs
for algo in ring tree; do
	for n in ${FR_TEST_COLL_ALGO_RANKS:-3 5 8}; do
		run "colls n=$n $algo ($TRANSPORT)" \
			frrun -n "$n" -e FR_ALGO=$algo --transport "$TRANSPORT" \
			--timeout 1800 "$MP" colls --counts 0,1,$((n - 1)),7919
	done
done
run "colls n=4 eager=128B (many fragments)" \
	frrun -n 4 -e FR_EAGER_BYTES=128 -e FR_ALGO=tree --transport "$TRANSPORT" \
	--timeout 600 "$MP" colls --counts 0,1,3,1001
finish
