#!/bin/bash
# 1000 iterations on registered buffers: registration and key exchange once.
. "$(dirname "$0")/lib.sh"
for n in 2 4; do
	run "regonce n=$n 1000 iterations" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 300 "$MP" regonce --iters 1000 --count 4099
done
# a large collective and an immediate destroy: the first rank to leave
# must not fail the others (n = 3: the ring; 16 Mi floats = 64 MiB)
run "64 MiB allreduce then destroy n=3" \
	frrun -n 3 --transport "$TRANSPORT" --timeout 300 "$MP" bigexit --count ${FR_TEST_BIGEXIT_COUNT:-16777216}
finish
