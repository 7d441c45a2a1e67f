#!/bin/bash
# Reduce-scatter, all-gather, broadcast (every root) and barrier on 1..8
# ranks, every dtype (x op for reduce-scatter), in and out of place, against
# the reference; broadcast with each of its algorithms, reduce-scatter and
# all-gather with Bruck's (forced: it must run, its order of reduction
# checked with f32 sums of mixed exponents, --scales).
. "$(dirname "$0")/lib.sh"
for n in ${FR_TEST_RANKS:-1 2 3 4 5 6 7 8}; do
	run "colls n=$n auto ($TRANSPORT)" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 1800 "$MP" colls \
		${FR_TEST_COLL_COUNTS:+--counts "$FR_TEST_COLL_COUNTS"}
done
# FR_TEST_COLL_ALGO_RANKS: the rank counts of the forced runs
for algo in ring tree bruck; do
	for n in ${FR_TEST_COLL_ALGO_RANKS:-3 5 8}; do
		run "colls n=$n $algo ($TRANSPORT)" \
			frrun -n "$n" -e FR_ALGO=$algo --transport "$TRANSPORT" \
			--timeout 1800 "$MP" colls --counts 0,1,$((n - 1)),7919 --scales
	done
done
run "colls n=4 eager=128B (many fragments)" \
	frrun -n 4 -e FR_EAGER_BYTES=128 -e FR_ALGO=tree --transport "$TRANSPORT" \
	--timeout 600 "$MP" colls --counts 0,1,3,1001
# Bruck with 128-byte payloads: blocks of 1 to 32 elements packed several
# to a message, 1001 in fragments of one
run "colls n=6 bruck eager=128B (packed and fragmented blocks)" \
	frrun -n 6 -e FR_EAGER_BYTES=128 -e FR_ALGO=bruck --transport "$TRANSPORT" \
	--timeout 600 "$MP" colls --counts 0,1,5,32,1001 --scales
finish
