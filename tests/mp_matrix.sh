#!/bin/bash
# Every dtype x op x count {0, 1, ranks-1, prime, large odd} x in/out of
# place, checked bit for bit against the reference of the algorithm that
# ran, on 1..8 ranks (incl. non powers of two): the automatic choice over
# the full counts, then every All-Reduce algorithm forced by FR_ALGO.
. "$(dirname "$0")/lib.sh"
# FR_TEST_COUNTS overrides the default counts (0, 1, ranks-1, 7919, 1Mi+1).
for n in ${FR_TEST_RANKS:-1 2 3 4 5 6 7 8}; do
	run "matrix n=$n auto ($TRANSPORT)" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 1800 "$MP" matrix \
		${FR_TEST_COUNTS:+--counts "$FR_TEST_COUNTS"}
done
# FR_TEST_ALGO_RANKS: the rank counts of the forced runs (default: those of
# the automatic choice)
for algo in ${FR_TEST_ALGOS:-ring rd rabenseifner oneshot tree}; do
	for n in ${FR_TEST_ALGO_RANKS:-${FR_TEST_RANKS:-1 2 3 4 5 6 7 8}}; do
		run "matrix n=$n $algo ($TRANSPORT)" \
			frrun -n "$n" -e FR_ALGO="$algo" --transport "$TRANSPORT" \
			--timeout 1800 "$MP" matrix \
			--counts "${FR_TEST_ALGO_COUNTS:-0,1,$((n > 1 ? n - 1 : 2)),7919,65537}"
	done
done
# small segments and few slots: many segments per chunk, credits run out;
# small mailbox slots: many fragments per step, mailbox credits run out
run "matrix n=3 segment=256B slots=2" \
	frrun -n 3 -e FR_SEGMENT_BYTES=256 -e FR_SLOTS=2 --transport "$TRANSPORT" \
	--timeout 600 "$MP" matrix \
	--counts 0,1,2,1000,7919 --dtypes f32,f16,i64,u8 --ops sum,max,avg
# bursts of nonblocking ring All-Reduces of alternating sizes, one rank
# late each round; on 40 ranks with 2 slots of 4 KiB, the staging's layout
# changes between them (ring.c: the window in bytes grows where a rank has
# 8 (FR_SLOTS + 1) segments or more; its logic sits above the transport,
# so not in the Soft-RoCE VM's short run)
windows_args="--iters 20"
[ "$SHORT" = 1 ] && windows_args="--iters 3 --counts 65537,1,7919,0,3,2"
# shellcheck disable=SC2086
run "ring bursts n=3, one rank late" \
	frrun -n 3 -e FR_ALGO=ring --transport "$TRANSPORT" --timeout 600 \
	"$MP" windows $windows_args
[ "$SHORT" = 1 ] ||
	run "ring windows n=40 slots=2 segment=4K (layouts change)" \
		frrun -n 40 -e FR_ALGO=ring -e FR_SLOTS=2 -e FR_SEGMENT_BYTES=4096 \
		--transport "$TRANSPORT" --timeout 600 "$MP" windows \
		--counts 1,40960,3,20000,0,81920,7,2 --iters 4
# (FR_TEST_SHORT, lib.sh: not oneshot, whose fragments are rd's; the
# tree's, with a second child's fragments put aside, are its own)
eager_algos="rd rabenseifner oneshot tree"
[ "$SHORT" = 1 ] && eager_algos="rd rabenseifner tree"
for algo in $eager_algos; do
	run "matrix n=5 $algo eager=128B" \
		frrun -n 5 -e FR_ALGO=$algo -e FR_EAGER_BYTES=128 --transport "$TRANSPORT" \
		--timeout 600 "$MP" matrix \
		--counts 0,1,4,1000,7919 --dtypes f32,bf16,u8 --ops sum,min,avg
done
finish
