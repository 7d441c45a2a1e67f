#!/bin/bash
# 1000 iterations on registered buffers: registration and key exchange once.
. "$(dirname "$0")/lib.sh"
for n in 2 4; do
	run "regonce n=$n 1000 iterations" \
		frrun -n "$n" --transport "$TRANSPORT" --timeout 300 "$MP" regonce --iters 1000 --count 4099
done
finish
