#!/bin/bash
# SPDX-License-Identifier: MIT
#
# model_check.sh - the cost model's choice against the best algorithm the
# simulator finds (issue 22: within 10 % at 1,024 and 4,096 ranks).  Runs
# fr_sim once per algorithm over the sizes (sizes only, no data), reads
# its times, and prints a Markdown table: every algorithm's time, the
# best, auto's choice and time, and auto / best; with gnuplot, a plot of
# the times against the size.
#
# usage: perf/sim/model_check.sh [options] [BUILD]
#   --ranks N           simulated ranks (default 1024)
#   --per-node K        ranks per node (default 8)
#   --sim "OPTS"        more fr_sim options: the network (--gbps,
#                       --lat-us, --topo, --hop-lat-us, --cpu-*) as
#                       fr_sim --help says (default none: a star of
#                       100 Gbit/s links, 2 us)
#   --min S, --max S, --factor F
#                       sizes from S to S' by factors of F (default 8,
#                       2M, 8); K/M/G suffixes
#   --algos "A[:MAX]..." the algorithms compared, each up to its own
#                       largest size (default "rd:32K rabenseifner hier
#                       ring"): the simulator's cost is events, which a
#                       latency-bound schedule at a large size has by
#                       the million; a cell not run is "-", and the
#                       best is taken over the cells run
#   --out DIR           keep fr_sim's outputs, the table (table.md), the
#                       data (times.dat) and the plot (model_check.png)
#                       there (default a temporary directory, removed)
#   --title T           the plot's title (default: ranks and network)
# BUILD: where fr_sim is (default build/).
#
# Example (the issue's network: a fat tree of 8-rank nodes, 100 Gbit/s,
# 2 us):
#   perf/sim/model_check.sh --ranks 1024 --sim "--topo fat-tree:16:2,8:1 --hop-lat-us 0.1"
set -uo pipefail
top=$(cd "$(dirname "$0")/../.." && pwd)
RANKS=1024 K=8 SIM_OPTS="" MIN=8 MAX=2M FACTOR=8
ALGOS="rd:32K rabenseifner hier ring" OUT="" TITLE="" BUILD=$top/build
usage() { awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; exit 2; }
while (($#)); do
	case "$1" in
	--ranks) RANKS=$2; shift 2 ;;
	--per-node) K=$2; shift 2 ;;
	--sim) SIM_OPTS=$2; shift 2 ;;
	--min) MIN=$2; shift 2 ;;
	--max) MAX=$2; shift 2 ;;
	--factor) FACTOR=$2; shift 2 ;;
	--algos) ALGOS=$2; shift 2 ;;
	--out) OUT=$2; shift 2 ;;
	--title) TITLE=$2; shift 2 ;;
	-h | --help) usage ;;
	-*) echo "model_check.sh: unknown option $1" >&2; usage ;;
	*) BUILD=$1; shift ;;
	esac
done
SIM=$BUILD/fr_sim
[ -x "$SIM" ] || { echo "model_check.sh: no fr_sim in $BUILD (make fr_sim)" >&2; exit 2; }
bytes() { # 4K -> 4096
	local v=$1
	case "$v" in
	*[kK]) echo $((${v%?} << 10)) ;;
	*[mM]) echo $((${v%?} << 20)) ;;
	*[gG]) echo $((${v%?} << 30)) ;;
	*) echo "$v" ;;
	esac
}
if [ -n "$OUT" ]; then
	mkdir -p "$OUT" || exit 1
else
	OUT=$(mktemp -d /tmp/frmodel.XXXXXX) || exit 1
	trap 'rm -rf "$OUT"' EXIT
fi
min=$(bytes "$MIN") max=$(bytes "$MAX")
sizes=""
for ((s = min; s <= max; s *= FACTOR)); do
	sizes+="$s "
	[ "$FACTOR" -gt 1 ] || break
done
# one fr_sim per algorithm (the job is set up once for all its sizes)
run() { # ALGO MAXBYTES
	local a=$1 amax=$2
	[ "$amax" -ge "$min" ] || return 0
	# shellcheck disable=SC2086 # SIM_OPTS is a list of options
	"$SIM" -n "$RANKS" -k "$K" $SIM_OPTS -b "$min" -e "$amax" -f "$FACTOR" \
		-a "$a" --sizes-only >"$OUT/$a.out" 2>"$OUT/$a.err" ||
		{ echo "model_check.sh: fr_sim -a $a failed:" >&2; tail -3 "$OUT/$a.err" >&2; return 1; }
	echo "model_check.sh: $a done ($(awk '!/^#/ && NF >= 7 { e += $6; r += $7 } END { printf "%d events, %.0f s", e, r }' "$OUT/$a.out"))" >&2
}
names=""
for spec in auto:$MAX $ALGOS; do
	a=${spec%%:*}
	m=$max
	[ "$spec" != "$a" ] && m=$(bytes "${spec#*:}")
	[ "$m" -gt "$max" ] && m=$max
	run "$a" "$m" || exit 1
	[ "$a" = auto ] || names+="$a "
done
# times.dat: bytes, then each algorithm's time (- where not run), best,
# auto's time and its choice
awk -v names="$names" -v sizes="$sizes" -v dir="$OUT" '
BEGIN {
	na = split(names, A, " ")
	ns = split(sizes, S, " ")
	for (i = 0; i <= na; i++) {
		f = dir "/" (i ? A[i] : "auto") ".out"
		while ((getline line < f) > 0) {
			if (line ~ /^#/) continue
			split(line, w, " ")
			if (w[1] !~ /^[0-9]+$/) continue
			if (i) t[i, w[1]] = w[3]
			else { at[w[1]] = w[3]; ach[w[1]] = substr(w[2], 6) }
		}
	}
	printf "# bytes"
	for (i = 1; i <= na; i++) printf " %s", A[i]
	printf " best auto choice\n"
	for (j = 1; j <= ns; j++) {
		b = S[j]; best = -1
		printf "%s", b
		for (i = 1; i <= na; i++) {
			if ((i, b) in t) {
				printf " %s", t[i, b]
				if (best < 0 || t[i, b] + 0 < best) best = t[i, b] + 0
			} else printf " -"
		}
		printf " %s %s %s\n", best < 0 ? "-" : best, (b in at) ? at[b] : "-", (b in ach) ? ach[b] : "-"
	}
}' >"$OUT/times.dat"
# the table
{
	printf "| bytes |"
	for a in $names; do printf " %s |" "$a"; done
	printf " auto (its choice) | auto / best |\n| ---: |"
	for a in $names; do printf " ---: |"; done
	printf " --- | ---: |\n"
	awk -v na="$(echo "$names" | wc -w)" '
	function human(b) {
		if (b >= 1048576 && b % 1048576 == 0) return b / 1048576 " MiB"
		if (b >= 1024 && b % 1024 == 0) return b / 1024 " KiB"
		return b " B"
	}
	function us(v) { return v == "-" ? "-" : sprintf("%.1f", v) }
	!/^#/ {
		best = $(na + 2)
		printf "| %s |", human($1)
		for (i = 2; i <= na + 1; i++)
			printf(" %s |", ($i != "-" && $i == best) ? "**" us($i) "**" : us($i))
		r = ($(na + 3) != "-" && best != "-" && best > 0) ? $(na + 3) / best : -1
		printf " %s (%s) | %s |\n", us($(na + 3)), $(na + 4), r < 0 ? "-" : sprintf(r <= 1.10 ? "%.2f" : "**%.2f**", r)
	}' "$OUT/times.dat"
} | tee "$OUT/table.md"
awk '!/^#/ && $NF != "-" { n++; if ($(NF - 1) / $(NF - 2) <= 1.10) ok++ } END { printf "\nauto within 10 %% of the best: %d of %d sizes\n", ok, n }' \
	"$OUT/times.dat" | tee -a "$OUT/table.md"
if command -v gnuplot >/dev/null; then
	[ -n "$TITLE" ] || TITLE="All-Reduce at $RANKS simulated ranks ($K a node), ${SIM_OPTS:-star, 100 Gbit/s, 2 us}"
	{
		echo "set terminal pngcairo size 900,600 noenhanced"
		echo "set output '$OUT/model_check.png'"
		echo "set title '$TITLE'"
		echo "set logscale xy; set xlabel 'bytes'; set ylabel 'time per All-Reduce (us, simulated)'"
		echo "set key top left; set grid; set datafile missing '-'"
		printf "plot "
		i=2
		for a in $names; do
			printf "'%s' using 1:%d with linespoints title '%s', " "$OUT/times.dat" "$i" "$a"
			i=$((i + 1))
		done
		printf "'%s' using 1:%d with points pt 6 ps 2 lc rgb 'black' title \"auto (the model's choice)\"\n" \
			"$OUT/times.dat" "$((i + 1))"
	} >"$OUT/plot.gp"
	gnuplot "$OUT/plot.gp" && echo "plot: $OUT/model_check.png" >&2
fi
