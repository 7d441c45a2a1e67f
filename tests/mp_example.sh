#!/bin/bash
# The data-parallel training example (examples/train_mlp.c), short: a few
# hundred steps of the digits MLP on 3 ranks, uncompressed and compressed
# (bf16, fp16, int8; error feedback), one call and buckets.  Every mode
# must keep the weights bit-identical on all ranks, and the modes with
# error feedback must end within 1 % of the uncompressed training loss.
# Tensor parallel x data parallel (--tp) must match the single-process
# reference within float tolerance.  (examples/train.sh is the
# full version, with the plot.)
. "$(dirname "$0")/lib.sh"
EX="$B/examples/train_mlp"
DATA="$(cd "$(dirname "$0")/.." && pwd)/examples/data/digits.csv"
n=${FR_TEST_EXAMPLE_RANKS:-3}
steps=${FR_TEST_EXAMPLE_STEPS:-300}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# train MODE ARGS...: one run; every rank's final line must say identical
# and carry the same hash; rank 0's training loss goes to $tmp/MODE.
train() {
	m=$1
	shift
	frrun -n "$n" --transport "$TRANSPORT" --timeout 120 "$EX" \
		--data "$DATA" --steps "$steps" "$@" >"$tmp/$m.out" 2>&1
	rc=$?
	cat "$tmp/$m.out"
	[ "$rc" -eq 0 ] || return "$rc"
	[ "$(grep -c '^\[[0-9]*\] final .*identical=yes' "$tmp/$m.out")" -eq "$n" ] ||
		{ echo "not every rank reports identical weights"; return 1; }
	[ "$(sed -n 's/^\[[0-9]*\] final .*hash=\([0-9a-f]*\).*/\1/p' \
		"$tmp/$m.out" | sort -u | wc -l)" -eq 1 ] ||
		{ echo "the ranks' weight hashes differ"; return 1; }
	sed -n 's/^\[0\] final .*train_loss=\([^ ]*\).*/\1/p' "$tmp/$m.out" \
		>"$tmp/$m"
	[ -s "$tmp/$m" ]
}

# within MODE: MODE's final loss is within 1 % of the uncompressed one.
within() {
	[ -s "$tmp/none" ] && [ -s "$tmp/$1" ] || return 1
	echo "none $(cat "$tmp/none"), $1 $(cat "$tmp/$1")"
	awk -v a="$(cat "$tmp/$1")" -v b="$(cat "$tmp/none")" \
		'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 0.01 * b) }'
}

run "example n=$n none" train none --compress none
run "example n=$n bf16+ef" train bf16+ef --compress bf16 --ef
run "example n=$n int8+ef" train int8+ef --compress int8 --ef
run "example n=$n fp16+ef" train fp16+ef --compress fp16 --ef
run "example n=$n int8, no error feedback" train int8 --compress int8
run "example n=$n none, buckets" train none+buckets --buckets
run "example n=$n bf16+ef, buckets" train bf16+ef+buckets --buckets \
	--compress bf16 --ef
run "example n=$n int8+ef, buckets" train int8+ef+buckets --buckets \
	--compress int8 --ef
for m in bf16+ef int8+ef fp16+ef bf16+ef+buckets int8+ef+buckets; do
	run "example $m loss within 1 % of none" within "$m"
done
# tensor parallel x data parallel (--tp): sub-communicators; the weights
# match the single-process reference within float tolerance
tp() {
	n=$1
	shift
	frrun -n "$n" --transport "$TRANSPORT" --timeout 120 "$EX" \
		--data "$DATA" --steps "$steps" "$@" >"$tmp/tp.out" 2>&1 ||
		{ cat "$tmp/tp.out"; return 1; }
	cat "$tmp/tp.out"
	[ "$(grep -c '^\[[0-9]*\] final .*identical=yes .*reference=match' \
		"$tmp/tp.out")" -eq "$n" ]
}
run "example n=4 tp=2 x dp=2" tp 4 --tp 2
run "example n=6 tp=2 x dp=3" tp 6 --tp 2
run "example n=4 tp=4 (no data parallel)" tp 4 --tp 4 --hidden 64
finish
