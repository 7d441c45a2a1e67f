#!/bin/bash
# Recovery (tests/mp_recover.c): fr_comm_revoke ends a collective, a
# receive and a nonblocking wait on another thread, at once on every rank,
# and only on the communicator revoked; fr_comm_agree gives every survivor
# the same value and the same failed ranks, with ranks killed before it,
# two at once, or the coordinator dying inside it; fr_comm_shrink then
# gives the survivors a working communicator, also when a rank dies
# inside the shrink.  Over FR_TEST_TRANSPORT
# (tcp by default); shm and shm+tcp too unless it is set (the verbs suite
# sets it).
. "$(dirname "$0")/lib.sh"
X="$B/tests/mp_recover"
# a revoke or an agreement must not wait for the timeout: the tests allow
# 10 or 20 s of 60
export FR_TIMEOUT_MS=60000

# survivors N VICTIMS [FAULT]: run "kill" under --keep-going; every rank not
# among VICTIMS must print the same AGREE1 and AGREE2 lines, and no FAIL
survivors() {
	n=$1 v=$2
	out=$(frrun -n "$n" --transport "$t" --keep-going --timeout 120 \
		"$X" kill "$v" ${3:+"$3"} 2>&1)
	echo "$out"
	if echo "$out" | grep -q 'FAIL\|a victim survived\|failures'; then
		return 1
	fi
	nsurv=0
	for r in $(seq 0 $((n - 1))); do
		case ",$v," in *",$r,"*) continue ;; esac
		nsurv=$((nsurv + 1))
	done
	tags="AGREE1 AGREE2 SHRINK"
	case "${3:-}" in card:*) tags=SHRINK ;; esac
	for i in $tags; do
		lines=$(echo "$out" | sed -n "s/^\[[0-9]*\] \($i .*\)/\1/p")
		[ "$(echo "$lines" | grep -c .)" = "$nsurv" ] || return 1
		[ "$(echo "$lines" | sort -u | wc -l)" = 1 ] || return 1
	done
}

transports=$TRANSPORT
[ -z "${FR_TEST_TRANSPORT:-}" ] && transports="tcp shm shm+tcp"
for t in $transports; do
	ranks=${FR_TEST_RANKS:-2 3 5 8}
	[ "$t" != tcp ] && ranks=${FR_TEST_RANKS:-3 8}
	for n in $ranks; do
		run "revoke n=$n ($t)" \
			frrun -n "$n" --transport "$t" --timeout 300 "$X" revoke
		run "agree n=$n ($t)" \
			frrun -n "$n" --transport "$t" --timeout 300 "$X" agree
		[ "$n" -lt 3 ] && continue
		run "agree: rank $((n - 1)) of $n killed ($t)" \
			survivors "$n" $((n - 1))
		run "agree: coordinator of $n dies proposing ($t)" \
			survivors "$n" 0 propose:1
		run "agree: coordinator of $n dies deciding ($t)" \
			survivors "$n" 0 commit:1
		run "shrink: rank 1 of $n dies inside it ($t)" \
			survivors "$n" 1 card:1
		[ "$n" -lt 4 ] && continue
		run "agree: ranks 0 and 2 of $n killed at once ($t)" \
			survivors "$n" 0,2
	done
done
t=$TRANSPORT
run "revoke n=4 progress thread ($t)" \
	frrun -n 4 -e FR_PROGRESS=thread --transport "$t" --timeout 300 "$X" revoke
run "agree n=4 progress thread ($t)" \
	frrun -n 4 -e FR_PROGRESS=thread --transport "$t" --timeout 300 "$X" agree
export FR_PROGRESS=thread
run "agree: coordinator of 4 dies before proposing, progress thread ($t)" \
	survivors 4 0 propose:0
unset FR_PROGRESS
# alive but silent for longer than the timeout: counted out, uniformly, and
# told so when it wakes (the others answer from their progress threads)
late() {
	out=$(frrun -n 4 --transport "$t" --keep-going --timeout 120 \
		-e FR_TIMEOUT_MS=1000 "$X" late "$1" 2500 2>&1)
	echo "$out"
	! echo "$out" | grep -q 'FAIL\|failures' || return 1
	lines=$(echo "$out" | sed -n "s/^\[[0-9]*\] \(\(AGREE1\|SHRINK\) .*\)/\1/p")
	[ "$(echo "$lines" | grep -c AGREE1)" = 3 ] &&
		[ "$(echo "$lines" | grep -c SHRINK)" = 3 ] &&
		[ "$(echo "$lines" | sort -u | wc -l)" = 2 ]
}
# (FR_TEST_SHORT, lib.sh: the coordinator only; who counts whom out is the
# same logic over every transport)
[ "$SHORT" = 1 ] ||
	run "agree: rank 3 of 4 silent past the timeout, counted out ($t)" late 3
run "agree: rank 0 of 4 (the coordinator) silent past the timeout ($t)" late 0
finish
