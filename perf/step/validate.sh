#!/bin/bash
# SPDX-License-Identifier: MIT
#
# validate.sh - fr_step's predictions against its measurements on an
# emulated cluster: for every preset, n = 2, 4, 8 ranks, one per network
# namespace, links shaped to RATE (perf/step/netns_step.sh).  Root needed.
#
#   perf/step/validate.sh [--rate 1gbit] [--build DIR] [--steps N] OUTDIR \
#           [PRESET:SCALE:COMPUTE_MS ...]
#
# Default presets: resnet50:0.1:100 bert-base:0.05:150 vgg16:0.05:200
# gpt2-small:0.05:200 (parameters scaled so that a step takes a fraction of
# a second at 1 Gbit/s; backward times of the order of the communication,
# so that overlap matters).  Writes OUTDIR/<preset>-n<N>.{txt,csv,tune},
# the projection plots of the n = 8 runs (OUTDIR/<preset>_<mode>.png) and
# OUTDIR/summary.md: predicted against measured step time per preset, mode
# and n, and the same as OUTDIR/validation.dat and validation.png
# (doc/step/plot_validation.gp).  The exit status is 1 when a run failed, 3 when a prediction was
# more than 15 % off.
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rate=1gbit
build=${FR_BUILDDIR:-$HERE/../../build}
steps=10
while [[ $# -gt 0 ]]; do
	case "$1" in
	--rate) rate=$2; shift 2 ;;
	--build) build=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	-h | --help) sed -n 3,20p "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) break ;;
	esac
done
out=${1:-}
[[ -n "$out" ]] || { echo "usage: $0 [--rate R] [--build DIR] [--steps N] OUTDIR [PRESET:SCALE:MS ...]" >&2; exit 2; }
shift
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
runs=("$@")
((${#runs[@]})) || runs=(resnet50:0.1:100 bert-base:0.05:150 vgg16:0.05:200 gpt2-small:0.05:200)
gbit=$(awk -v r="${rate,,}" 'BEGIN { m = r + 0; if (r ~ /mbit$/) m /= 1000; print m }')

status=0
for run in "${runs[@]}"; do
	IFS=: read -r preset scale ms <<<"$run"
	for n in 2 4 8; do
		base="$out/$preset-n$n"
		plot=()
		((n == 8)) && plot=(--plot "$out")
		echo "== $preset, scale $scale, backward $ms ms, $n ranks at $rate" >&2
		"$HERE/netns_step.sh" --rate "$rate" --build "$build" "$n" \
			-m "$preset" -s "$scale" -c "$ms" -n "$steps" -v \
			--line-gbit "$gbit" --max-error 15 --csv "$base.csv" \
			--save-tune "$base.tune" "${plot[@]}" >"$base.txt"
		rc=$?
		grep -E '^# predicted vs measured' "$base.txt" >&2
		((rc == 0)) && continue
		((rc == 3)) && { ((status == 0)) && status=3; continue; }
		status=1
	done
done

# predicted against measured step time, from the CSVs
{
	echo "| model | mode | n | measured step ms | predicted step ms | error |"
	echo "|---|---|---:|---:|---:|---:|"
	for f in "$out"/*-n[0-9]*.csv; do
		awk -F, '$3 == "measured" { m[$2] = $10 }
			$3 == "predicted" { printf "| %s | %s | %d | %.1f | %.1f | %+.1f %% |\n",
				$1, $2, $5, m[$2], $10, $12 }' "$f"
	done | sort -t'|' -k2,2 -k3,3 -k4,4n
} >"$out/summary.md"
cat "$out/summary.md"
# the same as data for doc/step/plot_validation.gp
for f in "$out"/*-n[0-9]*.csv; do
	awk -F, '$3 == "measured" { m[$2] = $10 }
		$3 == "predicted" { printf "%s %s %d %.3f %.3f %.2f\n", $1, $2, $5, m[$2], $10, $12 }' "$f"
done >"$out/validation.dat"
if command -v gnuplot >/dev/null; then
	gnuplot -e "dir='$out'" "$HERE/../../doc/step/plot_validation.gp" || status=1
else
	echo "validate: gnuplot not found (apt-get install -y gnuplot-nox): no $out/validation.png" >&2
fi
exit "$status"
