#!/bin/bash
# Every dtype x op x count {0, 1, ranks-1, prime, 1Mi+1} x in/out of place,
# checked bit for bit against the reference, on 1..8 ranks (incl. non
# powers of two).
. "$(dirname "$0")/lib.sh"
# FR_TEST_COUNTS overrides the default counts (0, 1, ranks-1, 7919, 1Mi+1).
for n in ${FR_TEST_RANKS:-1 2 3 4 5 7 8}; do
	run "matrix n=$n ($TRANSPORT)" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 1800 "$MP" matrix \
		${FR_TEST_COUNTS:+--counts "$FR_TEST_COUNTS"}
done
# small segments and few slots: many segments per chunk, credits run out
run "matrix n=3 segment=256B slots=2" \
	frrun -n 3 -e FR_SEGMENT_BYTES=256 -e FR_SLOTS=2 --transport "$TRANSPORT" \
	--timeout 600 "$MP" matrix \
	--counts 0,1,2,1000,7919 --dtypes f32,f16,i64,u8 --ops sum,max,avg
finish
