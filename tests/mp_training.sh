#!/bin/bash
# What training uses beyond plain All-Reduce: compression on the wire
# (bf16, fp16, int8; error feedback; identical bits on every rank) and
# gradient buckets (ranges marked in a different order on every rank), on
# 1..6 ranks, with the caller driving progress and with the progress
# thread; plus the All-Reduce matrix with the progress thread on.
. "$(dirname "$0")/lib.sh"
for n in ${FR_TEST_RANKS:-1 2 3 4 5 6}; do
	run "compress n=$n ($TRANSPORT)" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 900 "$MP" compress
	run "buckets n=$n ($TRANSPORT)" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 900 "$MP" buckets \
		--count 100003
	run "buckets n=$n progress=thread ($TRANSPORT)" \
		frrun -n "$n" -e FR_PROGRESS=thread --transport "$TRANSPORT" \
		--timeout 900 "$MP" buckets --count 100003
done
for n in 1 3; do
	for pm in caller thread; do
		run "threads n=$n progress=$pm ($TRANSPORT)" \
			frrun -n "$n" -e FR_PROGRESS=$pm --transport "$TRANSPORT" \
			--timeout 900 "$MP" threads --count 1001
	done
done
run "compress n=4 progress=thread eager=128B" \
	frrun -n 4 -e FR_PROGRESS=thread -e FR_EAGER_BYTES=128 --transport "$TRANSPORT" \
	--timeout 900 "$MP" compress --counts 0,1,257,1000,4099
for n in ${FR_TEST_RANKS:-1 2 3 4 5 6 7 8}; do
	run "matrix n=$n progress=thread ($TRANSPORT)" \
		frrun -n "$n" -e FR_PROGRESS=thread --transport "$TRANSPORT" \
		--timeout 1800 "$MP" matrix --counts "0,1,$((n > 1 ? n - 1 : 2)),7919,65537"
done
finish
