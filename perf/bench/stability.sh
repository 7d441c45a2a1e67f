#!/bin/bash
# SPDX-License-Identifier: MIT
#
# stability.sh - run-to-run spread of libfastreduce on one host: for every
# transport, rank count and algorithm asked for, start every size as K
# separate jobs (fresh processes, fresh address layout) through compare.sh
# and print one Markdown table of the spread of the per-job statistic,
# with a verdict against a limit (issue 18 asks for the slowest job within
# 1.3x of the fastest at 8 B, 64 KiB and 1 MiB, for every transport and
# algorithm).  A campaign (minutes to an hour), never part of the tests.
#
# usage: perf/bench/stability.sh [options]
#   --transports "T..."  FR_TRANSPORT values (default "shm tcp")
#   --ranks "N..."       rank counts (default "2 4")
#   --algos "A..."       FR_ALGO values (default "auto ring rd rabenseifner
#                        oneshot"); an algorithm that does not run at a rank
#                        count (FR_ALGO falls back to the model's choice
#                        there) is still measured, and says so in the table
#                        through the algo column of its jobs
#   --sizes "S..."       bytes, K/M allowed (default "8 65536 1048576")
#   --jobs K             separate jobs per (configuration, size) (default 20)
#   --iters N            timed calls per job (default 500)
#   --stat S             median (default), p99, min or mean
#   --limit X            the verdict's max/min (default 1.3)
#   --fr-args "ARGS"     extra fr_allreduce_perf arguments (default "-I 1")
#   --out DIR            keep every compare.sh log here (default a temp dir)
#   --fr-build DIR       the build to measure (compare.sh --fr-build; default
#                        this tree's build/): an A/B of two builds is two runs
# Exit status: 0 when every job ran (whatever the verdicts), 1 otherwise.
#
# Example (about 25 minutes on the 2-CPU development machine):
#   perf/bench/stability.sh --transports "shm tcp" --ranks 2 --jobs 20
set -u
here=$(cd "$(dirname "$0")" && pwd)
transports="shm tcp" ranks="2 4" algos="auto ring rd rabenseifner oneshot"
sizes="8 65536 1048576" jobs=20 iters=500 stat=median limit=1.3
fr_args="-I 1" out="" fr_build=()

usage() { sed -n '4,31p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
	case $1 in
	--transports) transports=$2 ;;
	--ranks) ranks=$2 ;;
	--algos) algos=$2 ;;
	--sizes) sizes=$2 ;;
	--jobs) jobs=$2 ;;
	--iters) iters=$2 ;;
	--stat) stat=$2 ;;
	--limit) limit=$2 ;;
	--fr-args) fr_args=$2 ;;
	--out) out=$2 ;;
	--fr-build) fr_build=(--fr-build "$2") ;;
	-h | --help)
		usage
		exit 0
		;;
	*)
		echo "stability.sh: unknown option '$1' (--help)" >&2
		exit 2
		;;
	esac
	shift 2 || {
		echo "stability.sh: $1 needs a value" >&2
		exit 2
	}
done
[[ $jobs =~ ^[1-9][0-9]*$ && $iters =~ ^[1-9][0-9]*$ ]] || {
	echo "stability.sh: --jobs and --iters take positive integers" >&2
	exit 2
}
[[ $limit =~ ^[0-9]+(\.[0-9]+)?$ ]] || {
	echo "stability.sh: --limit takes a number such as 1.3" >&2
	exit 2
}
[[ -n $out ]] || out=$(mktemp -d /tmp/frstab.XXXXXX)
mkdir -p "$out" || exit 1

rows=() rc=0
echo "stability.sh: $jobs jobs per size, $iters calls each, statistic $stat; logs in $out" >&2
for t in $transports; do
	for n in $ranks; do
		for a in $algos; do
			log="$out/${t//+/_}_n${n}_$a.txt"
			env_algo=()
			[[ $a == auto ]] || env_algo=(--env "FR_ALGO=$a")
			echo "stability.sh: $t, $n ranks, $a ..." >&2
			if ! "$here/compare.sh" --ranks "$n" --rate none --sizes "$sizes" \
				--jobs "$jobs" --iters "$iters" --stat "$stat" \
				--env "FR_TRANSPORT=$t" "${env_algo[@]}" --mpi-variants "" \
				--mpich-variants "" --fr-args "$fr_args" "${fr_build[@]}" >"$log" 2>&1; then
				echo "stability.sh: $t, $n ranks, $a: compare.sh failed (see $log)" >&2
				rc=1
			fi
			grep -q " 0 failed" "$log" || rc=1
			# the algorithm the jobs ran (FR_ALGO may not apply)
			raw=$(grep -o '/tmp/frbench[^ ]*' "$log" | head -1)
			while IFS= read -r line; do
				# the algorithms that ran this size (FR_ALGO may not
				# apply): the CSV's algo column, every job
				sz=$(awk -F'|' '{gsub(/ /, "", $2); print $2}' <<<"$line")
				ran=$(for f in "$raw"/*_fr.out; do
					awk -F, 'NR > 1 && /^[0-9]/ { print $1 "|" $14 }' "$f"
				done 2>/dev/null | awk -F'|' -v s="$sz" '
					function b(x) { return x >= 1048576 && x % 1048576 == 0 ? x / 1048576 "MiB" : x >= 1024 && x % 1024 == 0 ? x / 1024 "KiB" : x "B" }
					b($1) == s { print $2 }' | sort -u | paste -sd/)
				rows+=("| $t | $n | $a | ${ran:-?} $line")
			done < <(sed -n '/^Spread over/,$p' "$log" | grep '^| [0-9].* | libfastreduce |')
		done
	done
done

echo
echo "Run-to-run spread: $jobs separate jobs per row, per job the $stat over $iters calls of the slowest rank's time; max/min over the jobs, limit $limit"
echo
echo "The last three columns: only the jobs whose core-to-core round trip before them was at most twice the median of the row's (compare.sh's spread table): a VM whose host moved the vCPUs apart makes every library's shared-memory copies several times slower for as long as it lasts."
echo
echo "| transport | ranks | FR_ALGO | ran | size | library | jobs | min (us) | median (us) | max (us) | max/min | within $limit | jobs, usual c2c | max/min there | within $limit there |"
echo "|:--|---:|:--|:--|---:|:--|---:|---:|---:|---:|---:|:--|---:|---:|:--|"
verdict() { awk -v x="$1" -v l="$limit" 'BEGIN { print (x == "n/a" ? "n/a" : (x + 0 <= l + 0 ? "yes" : "NO")) }'; }
for r in "${rows[@]}"; do
	# ... | max/min | jobs, usual c2c | max/min there |
	ratio=$(awk -F'|' '{gsub(/ /, "", $(NF-3)); print $(NF-3)}' <<<"$r")
	usual=$(awk -F'|' '{gsub(/ /, "", $(NF-1)); print $(NF-1)}' <<<"$r")
	head=$(awk -F'|' -v OFS='|' '{ NF -= 3; print }' <<<"$r")
	tail=$(awk -F'|' '{ print "|" $(NF-2) "|" $(NF-1) "|" }' <<<"$r")
	echo "$head| $(verdict "$ratio") $tail $(verdict "$usual") |"
done
exit $rc
