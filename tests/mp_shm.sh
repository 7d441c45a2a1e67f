#!/bin/bash
# The shared-memory transport: the multi-process suites (matrix, other
# collectives, kill/stall/exit, mismatches, register once) over shm; the
# ring-only (FR_SHM_CMA_BYTES=0) and mostly cross-memory-attach paths;
# small messages with and without the low-latency header; the automatic
# choice; and that nothing is left in /dev/shm afterwards
# (segments are memfds, not names).  Its conformance suite is
# tests/conform_shm.sh.
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
shm_before=$(ls /dev/shm 2>/dev/null | sort)
export FR_TEST_TRANSPORT=shm
TRANSPORT=shm

suite() { FR_TEST_RANKS=${FR_SHM_TEST_RANKS:-${FR_TEST_RANKS:-1 2 3 4 5 8}} bash "$here/$1"; }
# FR_SHM_SHORT_FAULTS=1 (the sanitizer stage, scripts/test-all.sh): the
# kill and mismatch suites in their short forms (lib.sh's FR_TEST_SHORT),
# whose detection is the engine's and which run whole over TCP
short_faults() { FR_TEST_SHORT=${FR_SHM_SHORT_FAULTS:-${FR_TEST_SHORT:-0}} bash "$here/$1"; }
run "matrix over shm" suite mp_matrix.sh
run "collectives over shm" suite mp_colls.sh
run "kill, exit, stall over shm" short_faults mp_kill.sh
run "mismatches over shm" short_faults mp_mismatch.sh
run "register once over shm" bash "$here/mp_regonce.sh"
run "ring only (FR_SHM_CMA_BYTES=0) n=3" \
	frrun -n 3 -e FR_SHM_CMA_BYTES=0 --transport shm --timeout 600 "$MP" matrix \
	--counts 0,1,2,7919,300007 --dtypes f32,f64,u8 --ops sum,max
run "cross-memory attach from 4 KiB n=4" \
	frrun -n 4 -e FR_SHM_CMA_BYTES=4096 --transport shm --timeout 600 "$MP" matrix \
	--counts 0,1,3,7919,300007 --dtypes f32,bf16,i64 --ops sum,min
# small messages: the 16-byte header by write_inline and the small
# All-Reduce over lines (FR_LL=1, the default, which every run above
# takes), the 64-byte header by write_imm and the mailboxes (FR_LL=0);
# ranks that differ are refused here (mp_mismatch.sh), and mixed on
# verbs (tests/verbs_guest.sh), which has no lines
run "small messages by write_imm (FR_LL=0) n=3" \
	frrun -n 3 -e FR_LL=0 --transport shm --timeout 600 "$MP" matrix \
	--counts 0,1,2,3,4,5,17 --dtypes f32,f64,u8,bf16 --ops sum,max
# the lines are taken: up to 224 bytes the algorithm column says oneshot
# (the model alone picks rd there at n = 2), past them and with FR_LL=0 it
# does not
# (so do broadcasts and reduces with a CPU a rank: 2 ranks here)
lines_taken() {
	local c
	for c in allreduce broadcast reduce; do
		out=$(frrun -n 2 --transport shm "$@" --timeout 60 "$B/fr_allreduce_perf" \
			-C $c -b 8 -e 256 -f 2 -n 5 -w 1 2>&1)
		rows=$(echo "$out" | awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { print $2, $NF }')
		echo "$rows" | grep -q '^8 oneshot$' &&
			echo "$rows" | grep -q '^128 oneshot$' &&
			! echo "$rows" | grep -q '^256 oneshot$' || { echo "$out"; return 1; }
	done
}
# with more ranks than CPUs a broadcast and a reduce keep their trees,
# which let a rank go once its part is sent (select.c): one rank more than
# the CPUs (3 on 2 here; past 8 ranks lines do not fit at all)
lines_oversub() {
	local c n=$(($(nproc) + 1))
	[ $n -ge 3 ] || n=3
	for c in broadcast reduce; do
		out=$(frrun -n $n --transport shm --timeout 60 "$B/fr_allreduce_perf" \
			-C $c -b 8 -e 8 -n 5 -w 1 2>&1)
		echo "$out" | awk '$1 == "[0]" && $2 == "8" { print $NF }' | grep -qv oneshot ||
			{ echo "$out"; return 1; }
	done
}
lines_not_taken() {
	out=$(frrun -n 2 --transport shm -e FR_LL=0 --timeout 60 \
		"$B/fr_allreduce_perf" -b 8 -e 8 -n 5 -w 1 2>&1)
	echo "$out" | awk '$1 == "[0]" && $2 == "8" { print $NF }' | grep -qv oneshot ||
		{ echo "$out"; return 1; }
}
run "small All-Reduces, broadcasts and reduces go by lines" lines_taken
run "FR_LL=0: by the mailboxes" lines_not_taken
run "broadcast and reduce: not by lines on too few CPUs" lines_oversub
# broadcast (every root) and reduce (every root, in place too) over lines,
# forced where CPUs are short, against the one-shot's rank-order fold, and
# past a line (the trees)
for n in 3 5 8; do
	run "broadcast and reduce over lines n=$n" \
		frrun -n "$n" -e FR_ALGO=oneshot --transport shm --timeout 600 \
		"$B/tests/mp_xcolls" check --counts 1,2,7,28,29,56,57
	run "broadcast over lines n=$n (colls)" \
		frrun -n "$n" -e FR_ALGO=oneshot --transport shm --timeout 600 \
		"$MP" colls --counts 1,2,7,28,29,56,57
done
# the one-shot over lines at every size it takes (up to 224 bytes: 28
# doubles, 112 bf16) and past it, every datatype and operation, on the
# rank counts it serves (2 to 8) and one beyond (9: the mailboxes)
for n in 2 5 8 9; do
	run "small All-Reduces over lines n=$n" \
		frrun -n "$n" --transport shm --timeout 600 "$MP" matrix \
		--counts 1,2,3,7,27,28,29,55,56,57,111,112,113,224,225 \
		--dtypes all --ops all
done
# auto: shm when the launcher puts every rank here; shm+tcp when FR_NODE
# emulates separate nodes (shm to the ranks that share one)
auto_is() {
	want=$1
	shift
	out=$(frrun -n 2 "$@" --timeout 60 "$B/fr_allreduce_perf" -b 8 -e 8 -n 2 -w 1 2>&1)
	echo "$out" | grep -q "transport $want," || { echo "$out"; return 1; }
}
run "auto picks shm for a single-host job" auto_is shm
run "auto picks shm+tcp with FR_NODE set" auto_is shm+tcp -e FR_NODE=nodeA
leaks() {
	after=$(ls /dev/shm 2>/dev/null | sort)
	[ "$shm_before" = "$after" ] || { diff <(echo "$shm_before") <(echo "$after"); return 1; }
}
run "nothing left in /dev/shm" leaks
finish
