#!/bin/bash
# SPDX-License-Identifier: MIT
# Train the digits MLP (train_mlp.c) data-parallel in every gradient mode,
# check that each mode kept bit-identical weights on all ranks and that
# bf16 and int8 with error feedback end within 1 % of the uncompressed loss,
# print a Markdown table of the results and draw the loss curves (gnuplot).
#
#   examples/train.sh [-n RANKS] [-s STEPS] [-o OUTDIR] [-m "MODE..."]
#                     [-- TRAIN_MLP_OPTIONS...]
#
# Run it from the build directory (or set FR_BUILDDIR): it uses ./frrun and
# ./examples/train_mlp there and the data set of the source tree.  A MODE is
# a compression, "+ef" for error feedback and "+buckets" for the bucket API:
# none bf16+ef int8+ef bf16 int8 (the default) fp16+ef none+buckets ...
# Writes OUTDIR (default examples/ of the build directory): loss-MODE.csv,
# MODE.out, results.md and loss.png.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
B=${FR_BUILDDIR:-$PWD}
ranks=4
steps=2000
out=
modes="none bf16+ef int8+ef bf16 int8"
tol=0.01 # relative, on the final training loss
while getopts n:s:o:m:h opt; do
	case $opt in
	n) ranks=$OPTARG ;;
	s) steps=$OPTARG ;;
	o) out=$OPTARG ;;
	m) modes=$OPTARG ;;
	*)
		sed -n '3,16s/^# \{0,1\}//p' "$0"
		[ "$opt" = h ] && exit 0
		exit 2
		;;
	esac
done
shift $((OPTIND - 1))
out=${out:-$B/examples}
prog=$B/examples/train_mlp
data=$src/examples/data/digits.csv
for f in "$B/frrun" "$prog"; do
	if [ ! -x "$f" ]; then
		echo "train.sh: no $f: run me from the build directory (or set FR_BUILDDIR) after make" >&2
		exit 2
	fi
done
mkdir -p "$out" || exit 2

fail=0
# field NAME FILE: the value of NAME=... on rank 0's final line.
field() {
	sed -n "s/^\[0\] final .*\<$1=\([^ ]*\).*/\1/p" "$2"
}

for m in $modes; do
	args=(--compress "${m%%+*}")
	case "+$m+" in *+ef+*) args+=(--ef) ;; esac
	case "+$m+" in *+buckets+*) args+=(--buckets) ;; esac
	echo "== $m: $ranks ranks, $steps steps"
	if ! "$B/frrun" -n "$ranks" --timeout 600 "$prog" --data "$data" \
		--steps "$steps" --csv "$out/loss-$m.csv" "${args[@]}" "$@" \
		>"$out/$m.out" 2>&1; then
		tail -n 20 "$out/$m.out"
		echo "FAIL $m: train_mlp failed"
		fail=1
		continue
	fi
	grep '^\[0\] final' "$out/$m.out"
	# Every rank printed its own hash: exactly one distinct value, from
	# all of them (rank 0 has compared them too: identical=yes).
	nfinal=$(grep -c '^\[[0-9]*\] final .*identical=yes' "$out/$m.out")
	nhash=$(sed -n 's/^\[[0-9]*\] final .*hash=\([0-9a-f]*\).*/\1/p' \
		"$out/$m.out" | sort -u | wc -l)
	if [ "$nfinal" -ne "$ranks" ] || [ "$nhash" -ne 1 ]; then
		echo "FAIL $m: weights differ between ranks ($nfinal of $ranks ranks agree, $nhash distinct hashes)"
		fail=1
	fi
done

# The table, and the loss check against the uncompressed run.
base=$(field train_loss "$out/none.out" 2>/dev/null)
{
	echo "| mode | final train loss | vs none | test loss | test accuracy | bytes sent per step (rank 0) | time (s) | weights (FNV-1a, all ranks) |"
	echo "|---|---|---|---|---|---|---|---|"
	for m in $modes; do
		[ -s "$out/$m.out" ] || continue
		l=$(field train_loss "$out/$m.out")
		[ -n "$l" ] || continue
		rel=$(awk -v a="$l" -v b="${base:-0}" \
			'BEGIN { if (b > 0) printf "%+.3f %%", (a / b - 1) * 100; else print "-" }')
		echo "| $m | $l | $rel | $(field test_loss "$out/$m.out") |" \
			"$(field test_acc "$out/$m.out") |" \
			"$(($(field sent_bytes "$out/$m.out") / (steps > 0 ? steps : 1))) |" \
			"$(field time_s "$out/$m.out") | $(field hash "$out/$m.out") |"
	done
} >"$out/results.md"
echo
cat "$out/results.md"
echo
if [ -z "$base" ]; then
	echo "no uncompressed run (mode none): the loss tolerance is not checked"
else
	for m in $modes; do
		case "+$m+" in *+ef+*) ;; *) continue ;; esac
		l=$(field train_loss "$out/$m.out")
		if [ -n "$l" ] && awk -v a="$l" -v b="$base" -v t="$tol" \
			'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * b) }'; then
			echo "ok   $m: final loss $l within $(awk -v t=$tol 'BEGIN { print t * 100 }') % of none ($base)"
		else
			echo "FAIL $m: final loss ${l:-?} not within $(awk -v t=$tol 'BEGIN { print t * 100 }') % of none ($base)"
			fail=1
		fi
	done
fi

# The curves: a moving average of the per-step minibatch loss (the raw
# values jump by an order of magnitude from batch to batch), and each
# mode's deviation from the uncompressed curve.
if command -v gnuplot >/dev/null; then
	win=$((steps / 50 > 1 ? steps / 50 : 1))
	plots=
	diffs=
	lt=0
	for m in $modes; do
		[ -s "$out/loss-$m.csv" ] || continue
		lt=$((lt + 1)) # the same colour for a mode in both panels
		awk -F, -v w="$win" 'NR > 1 {
			i = (NR - 2) % w; if (NR - 2 >= w) s -= v[i];
			v[i] = $2; s += $2; print $1, s / (NR - 1 < w ? NR - 1 : w) }' \
			"$out/loss-$m.csv" >"$out/loss-$m.ma"
		plots="$plots${plots:+, }'$out/loss-$m.ma' using 1:2 with lines lt $lt lw 1.5 title '$m'"
		if [ "$m" != none ] && [ -s "$out/loss-none.ma" ]; then
			paste -d' ' "$out/loss-none.ma" "$out/loss-$m.ma" |
				awk '{ print $1, ($4 / $2 - 1) * 100 }' >"$out/loss-$m.rel"
			diffs="$diffs${diffs:+, }'$out/loss-$m.rel' using 1:2 with lines lt $lt lw 1.5 title '$m'"
		fi
	done
	gnuplot <<EOF
set terminal pngcairo size 1000,800 font ",10" noenhanced
set output '$out/loss.png'
set multiplot layout 2,1
# fixed margins: both panels share one x axis despite the keys
set lmargin at screen 0.08
set rmargin at screen 0.84
set title "digits MLP 64-64-10, $ranks ranks, libfastreduce FR_AVG: minibatch loss ($win-step moving average)"
set logscale y
set xlabel 'step'
set ylabel 'cross-entropy'
set grid
set key outside right top
plot $plots
unset logscale y
set title 'deviation from the uncompressed run (same moving average)'
set ylabel '%'
${diffs:+plot $diffs}
unset multiplot
EOF
	[ -s "$out/loss.png" ] && echo "wrote $out/loss.png"
else
	echo "gnuplot not installed: no loss.png (apt-get install gnuplot-nox)"
fi
exit $fail
