#!/bin/bash
# What training uses beyond plain All-Reduce: compression on the wire
# (bf16, fp16, int8; error feedback; identical bits on every rank) and
# gradient buckets (ranges marked in a different order on every rank), on
# 1..6 ranks, with the caller driving progress and with the progress
# thread; plus the All-Reduce matrix with the progress thread on; and
# where the progress thread runs (FR_PROGRESS_CPU).
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

# Where the progress thread runs (FR_PROGRESS_CPU, src/affinity.c).
# affinity N EXPECT [frrun options]: N ranks with the progress thread; on
# every rank it runs on the CPUs that the library says (FR_LOG=info) it
# chose, and on EXPECT when given (a CPU list, or main: the main thread's).
# AFF_TASKSET: a CPU list to start frrun on.
affinity() {
	local n=$1 expect=$2 out rc r said has
	shift 2
	out=$(${AFF_TASKSET:+taskset -c "$AFF_TASKSET"} "$B/frrun" \
		${FR_TEST_HOST:+--host "$FR_TEST_HOST"} -n "$n" \
		-e FR_PROGRESS=thread -e FR_LOG=info --transport "$TRANSPORT" \
		--timeout 120 "$@" "$MP" affinity ${expect:+--expect "$expect"} 2>&1)
	rc=$?
	printf '%s\n' "$out"
	[ "$rc" -eq 0 ] || return 1
	for ((r = 0; r < n; r++)); do
		said=$(sed -n "s/.*INFO: rank $r: progress thread on CPUs \([^ ]*\) .*/\1/p" <<<"$out")
		has=$(sed -n "s/.*rank $r: progress thread runs on CPUs \([^ ]*\) .*/\1/p" <<<"$out")
		if [ -z "$said" ] || [ "$said" != "$has" ]; then
			echo "rank $r: the library says CPUs '$said', the thread has '$has'"
			return 1
		fi
	done
}
# refused VALUE WORDS: FR_PROGRESS_CPU=VALUE fails the ranks with
# FR_EINVAL, saying WORDS (frrun stops the others after the first)
refused() {
	local out
	if out=$(frrun -n 2 -e FR_PROGRESS=thread -e FR_PROGRESS_CPU="$1" \
		--transport "$TRANSPORT" --timeout 120 "$MP" affinity 2>&1); then
		printf '%s\nFR_PROGRESS_CPU=%s was accepted\n' "$out" "$1"
		return 1
	fi
	printf '%s\n' "$out"
	grep -q "invalid argument: FR_PROGRESS_CPU.*$2" <<<"$out"
}
allowed=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)
cpus=()
IFS=, read -ra items <<<"$allowed"
for x in "${items[@]}"; do
	if [[ $x == *-* ]]; then cpus+=($(seq "${x%-*}" "${x#*-}")); else cpus+=("$x"); fi
done
first=${cpus[0]} last=${cpus[${#cpus[@]} - 1]}
# frrun binds each rank to a CPU where there are enough: one core, stay
run "progress cpu=auto, ranks bound to a CPU ($TRANSPORT)" affinity 2 main
run "progress cpu=none, ranks not bound ($TRANSPORT)" \
	affinity 2 main -e FR_PROGRESS_CPU=none --bind none
run "progress cpu=$last ($TRANSPORT)" affinity 2 "$last" -e FR_PROGRESS_CPU="$last"
run "progress cpu=$first, ranks not bound ($TRANSPORT)" \
	affinity 2 "$first" -e FR_PROGRESS_CPU="$first" --bind none
# not bound: the NUMA node (package) near the device or the main thread;
# all of the process's CPUs where the machine has one of each
nodes=$(ls -d /sys/devices/system/node/node[0-9]* 2>/dev/null | wc -l)
packs=$(cat /sys/devices/system/cpu/cpu[0-9]*/topology/physical_package_id 2>/dev/null | sort -u | wc -l)
[ "$nodes" -le 1 ] && [ "$packs" -le 1 ] && whole=$allowed || whole=
run "progress cpu=auto, ranks not bound ($TRANSPORT)" \
	affinity 2 "$whole" --bind none
# bound to several cores (half the CPUs): the last core of the binding
if [ "${#cpus[@]}" -ge 4 ] && command -v taskset >/dev/null; then
	half=$(IFS=,; echo "${cpus[*]:0:${#cpus[@]} / 2}")
	AFF_TASKSET=$half run "progress cpu=auto, ranks bound to CPUs $half ($TRANSPORT)" \
		affinity 2 "" --bind none
else
	echo "SKIP progress cpu=auto on several cores (${#cpus[@]} CPUs, taskset: $(command -v taskset || echo none))"
fi
# the same with a binding of several cores that any machine can have: a
# synthetic topology (hwloc's HWLOC_SYNTHETIC) with more CPUs than this
# process may use: one package, one NUMA node, the last of its cores
if grep -q '^#define FR_HAVE_HWLOC 1' "$B/config.h" && [ "${#cpus[@]}" -ge 2 ] &&
	[ "$TRANSPORT" != verbs ]; then
	run "progress cpu=auto, bound to several of $((last + 2)) cores ($TRANSPORT)" \
		affinity 2 "$last" --bind none \
		-e "HWLOC_SYNTHETIC=numa:1 pack:1 core:$((last + 2)) pu:1"
fi
run "progress cpu=bogus refused" refused bogus "is not auto, none or a CPU list"
if [ "$last" -lt 1023 ]; then
	run "progress cpu=1023 refused" refused 1023 "no CPU of these is available"
fi
finish
