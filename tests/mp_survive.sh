#!/bin/bash
# Training that survives (examples/train_mlp.c --recover): a rank is killed
# (SIGKILL) at a random moment of the training loop (a random rank, step
# and point in the step), the survivors agree, shrink and redo the
# interrupted step, and must end with weights bit-identical to a clean run
# with the same sequence of ranks (the victim leaving cleanly, --drop-rank,
# at the step the survivors redid), so the same loss curve too.  Prints, per
# run, the time from the kill to the first step completed on the shrunk
# communicator, and the median and worst at the end.  With a newcomer
# (frrun --respawn, train_mlp --grow) the survivors re-admit it after the
# shrink and redo the step with all n ranks: the weights must then be a
# clean n-rank run's, bit for bit.
#
#   FR_SURVIVE_RUNS=50 tests/mp_survive.sh     (the campaign; CI runs 3)
#
# FR_SURVIVE_RUNS kills per transport (tcp and shm, or FR_TEST_TRANSPORT),
# FR_SURVIVE_RANKS ranks (4); FR_SURVIVE_LOG: a file that gets a line a
# run (transport, victim, step, redone step, milliseconds, rollback).
. "$(dirname "$0")/lib.sh"
EX="$B/examples/train_mlp"
DATA="$(cd "$(dirname "$0")/.." && pwd)/examples/data/digits.csv"
runs=${FR_SURVIVE_RUNS:-3}
# under the sanitizers (CI's second stage) one a transport, and not the
# variants (bf16 + error feedback, buckets): the logic is stage 1's, what
# the sanitizers add is the memory checks
variants=yes
# (and FR_TEST_SHORT, lib.sh: the Soft-RoCE VM, where the variants' logic is
# what tcp and shm ran)
[ "$SHORT" = 1 ] && variants=no
if ldd "$B/.libs/libfastreduce.so" 2>/dev/null | grep -q 'lib[at]san'; then
	runs=${FR_SURVIVE_RUNS:-1}
	variants=no
fi
n=${FR_SURVIVE_RANKS:-4}
steps=300
export FR_TIMEOUT_MS=${FR_TIMEOUT_MS:-10000}
times=$(mktemp)
trap 'rm -f "$times"' EXIT

# survive T ARGS...: one random kill over transport T; ARGS go to train_mlp
survive() {
	t=$1
	shift
	v=$((RANDOM % n))
	ks=$((5 + RANDOM % (steps / 2)))
	us=$((RANDOM % 3000))
	echo "transport $t: rank $v killed $us us into step $ks ($*)"
	out=$(frrun -n "$n" --transport "$t" --keep-going --timeout 120 "$EX" \
		--data "$DATA" --steps "$steps" --recover --kill-rank "$v" \
		--kill-step "$ks" --kill-us "$us" "$@" 2>&1)
	echo "$out" | grep -v 'ERROR\|INFO'
	finals=$(echo "$out" | grep -c '^\[[0-9]*\] final .*identical=yes.*recoveries=1')
	[ "$finals" = $((n - 1)) ] ||
		{ echo "FAIL: $finals of $((n - 1)) survivors finished"; return 1; }
	h=$(echo "$out" | sed -n 's/^\[[0-9]*\] final .*hash=\([0-9a-f]*\).*/\1/p' | sort -u)
	[ "$(echo "$h" | wc -l)" = 1 ] || { echo "FAIL: hashes differ"; return 1; }
	k=$(echo "$out" | sed -n 's/^\[[0-9]*\] RECOVERED step=\([0-9]*\).*/\1/p' | sort -u)
	[ "$(echo "$k" | wc -l)" = 1 ] || { echo "FAIL: redone steps differ: $k"; return 1; }
	kat=$(echo "$out" | sed -n 's/^\[[0-9]*\] KILL at=\([0-9.]*\).*/\1/p')
	rat=$(echo "$out" | sed -n 's/^\[[0-9]*\] RECOVERED .* at=\([0-9.]*\).*/\1/p' | sort -n | tail -1)
	ms=$(awk -v a="$kat" -v b="$rat" 'BEGIN { printf "%.1f", (b - a) * 1000 }')
	echo "$ms" >>"$times"
	# the clean run with the same sequence of ranks
	clean=$(frrun -n "$n" --transport "$t" --timeout 120 "$EX" \
		--data "$DATA" --steps "$steps" --drop-rank "$v" \
		--drop-step "$k" "$@" 2>&1)
	ch=$(echo "$clean" | sed -n 's/^\[[0-9]*\] final .*hash=\([0-9a-f]*\).*/\1/p' | sort -u)
	l1=$(echo "$out" | sed -n 's/^\[[0-9]*\] final .*train_loss=\([0-9.e+-]*\).*/\1/p' | head -1)
	l2=$(echo "$clean" | sed -n 's/^\[[0-9]*\] final .*train_loss=\([0-9.e+-]*\).*/\1/p' | head -1)
	rb=no
	echo "$out" | grep -q 'rolled back' && rb=yes
	echo "redone step $k, kill to first step on $((n - 1)) ranks: $ms ms; loss $l1, clean $l2; weights $h, clean $ch; a rank rolled back: $rb"
	# FR_SURVIVE_LOG: one line a run, for the campaign's figures
	[ -n "${FR_SURVIVE_LOG:-}" ] && echo "$t victim=$v step=$ks us=$us redone=$k ms=$ms rollback=$rb loss=$l1 clean_loss=$l2 same=$([ "$h" = "$ch" ] && echo yes || echo no) $*" >>"$FR_SURVIVE_LOG"
	[ -n "$ch" ] && [ "$h" = "$ch" ] ||
		{ echo "FAIL: not the clean run's weights"; echo "$clean"; return 1; }
}

# regrow T: one random kill over transport T, a newcomer takes its place
regrow() {
	t=$1
	v=$((RANDOM % n))
	ks=$((5 + RANDOM % (steps / 2)))
	us=$((RANDOM % 3000))
	echo "transport $t: rank $v killed $us us into step $ks, a newcomer takes its place"
	out=$(frrun -n "$n" --transport "$t" --respawn 1 --timeout 120 "$EX" \
		--data "$DATA" --steps "$steps" --recover --grow \
		--kill-rank "$v" --kill-step "$ks" --kill-us "$us" 2>&1)
	echo "$out" | grep -v 'ERROR\|INFO'
	echo "$out" | grep -q 'newcomer joined; going on with '"$n"' ranks' ||
		{ echo "FAIL: no newcomer joined"; return 1; }
	finals=$(echo "$out" | grep -c '^\[[0-9]*\] final .*ranks='"$n"' .*identical=yes.*recoveries=1')
	[ "$finals" = "$n" ] ||
		{ echo "FAIL: $finals of $n ranks finished"; return 1; }
	h=$(echo "$out" | sed -n 's/^\[[0-9]*\] final .*hash=\([0-9a-f]*\).*/\1/p' | sort -u)
	kat=$(echo "$out" | sed -n 's/^\[[0-9]*\] KILL at=\([0-9.]*\).*/\1/p')
	rat=$(echo "$out" | sed -n 's/^\[[0-9]*\] RECOVERED .* at=\([0-9.]*\).*/\1/p' | sort -n | tail -1)
	ms=$(awk -v a="$kat" -v b="$rat" 'BEGIN { printf "%.1f", (b - a) * 1000 }')
	clean=$(frrun -n "$n" --transport "$t" --timeout 120 "$EX" \
		--data "$DATA" --steps "$steps" 2>&1)
	ch=$(echo "$clean" | sed -n 's/^\[[0-9]*\] final .*hash=\([0-9a-f]*\).*/\1/p' | sort -u)
	echo "kill to first step on $n ranks again: $ms ms; weights $h, clean $ch"
	[ -n "${FR_SURVIVE_LOG:-}" ] && echo "$t regrow victim=$v step=$ks us=$us ms=$ms same=$([ "$h" = "$ch" ] && echo yes || echo no)" >>"$FR_SURVIVE_LOG"
	[ -n "$ch" ] && [ "$h" = "$ch" ] ||
		{ echo "FAIL: not the clean run's weights"; return 1; }
}

transports=$TRANSPORT
[ -z "${FR_TEST_TRANSPORT:-}" ] && transports="tcp shm"
for t in $transports; do
	for i in $(seq 1 "$runs"); do
		run "kill -9 at random, training goes on ($t, $i)" survive "$t"
	done
	if [ "$variants" = yes ]; then
		run "kill -9 at random, bf16 + error feedback ($t)" \
			survive "$t" --compress bf16 --ef
		run "kill -9 at random, buckets ($t)" survive "$t" --buckets
	fi
	for i in $(seq 1 "${FR_REGROW_RUNS:-1}"); do
		run "kill -9 at random, a newcomer takes its place ($t, $i)" regrow "$t"
	done
done
sort -n "$times" | awk '{ v[NR] = $1 } END {
	if (NR) printf "kill to first step on the survivors: median %.1f ms, worst %.1f ms (%d runs, FR_TIMEOUT_MS=%s)\n",
		v[int((NR + 1) / 2)], v[NR], NR, ENVIRON["FR_TIMEOUT_MS"] }'
finish
