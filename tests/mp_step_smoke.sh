#!/bin/bash
# fr_step(1): the presets have their papers' parameter counts, a tiny job
# over 3 ranks prints measured and predicted rows for every mode with
# positive figures, its CSV and tune file are complete, and the tune file
# drives --predict-only.  (How close the predictions are is reported by
# the tool and recorded in doc/step/README.md, not judged here: a shared
# CI host is no place to hold timings to a bound.)
. "$(dirname "$0")/lib.sh"

S="$B/fr_step"
MODES="after overlap overlap_bf16 overlap_int8_ef"

presets() {
	for p in resnet50:25557032 bert-base:109482240 vgg16:138357544 gpt2-small:124439808; do
		out=$("$S" --list -m "${p%%:*}") || { echo "$out"; return 1; }
		echo "$out" | grep -q "^# total ${p#*:} parameters" ||
			{ echo "$out" | tail -n 3; return 1; }
	done
}

# the rows of one mode: measured and predicted, compute, comm, step and
# efficiency > 0, a step error on the predicted row
rows_ok() {
	echo "$1" | awk -v m="$2" '
		$1 == m && $2 == "measured" && $3 > 0 && $4 > 0 && $7 > 0 && $8 > 0 { me++ }
		$1 == m && $2 == "predicted" && $3 > 0 && $4 > 0 && $7 > 0 && $8 > 0 &&
			$9 ~ /^[-+][0-9.]+%$/ { pr++ }
		END { exit !(me == 1 && pr == 1) }'
}

job() {
	d=$(mktemp -d)
	out=$(frrun -n 3 --no-prefix --transport "$TRANSPORT" --timeout 300 "$S" \
		-m resnet50 -s 0.002 -c 4 -n 3 -w 1 --ranks 2,4,64 --rates 10,100 \
		--csv "$d/r.csv" --save-tune "$d/r.tune" 2>&1) || { echo "$out"; rm -rf "$d"; return 1; }
	rc=0
	echo "$out" | grep -q '^# job: 3 ranks over ' &&
		echo "$out" | grep -Eq '^# mode +source +compute_ms +comm_ms +exposed_ms +overlap +step_ms +efficiency +step_err +comm_err$' &&
		echo "$out" | grep -Eq '^# predicted vs measured step time: largest error [0-9.]+ %$' &&
		echo "$out" | grep -q '^# projection: step_ms' || rc=1
	for m in $MODES; do
		rows_ok "$out" "$m" || { echo "rows of $m"; rc=1; }
	done
	# CSV: 4 modes x (measured + predicted + 3 links x 3 sizes)
	[ "$(grep -c ',measured,here,3,' "$d/r.csv")" -eq 4 ] &&
		[ "$(grep -c ',predicted,here,3,' "$d/r.csv")" -eq 4 ] &&
		[ "$(grep -c ',projected,' "$d/r.csv")" -eq 36 ] || { echo "CSV"; rc=1; }
	grep -q "^$TRANSPORT.beta_ns = " "$d/r.tune" && grep -q '^step.encode_ns.int8 = ' "$d/r.tune" ||
		{ echo "tune file"; rc=1; }
	# the tune file drives a prediction without a job (and the library
	# accepts it as FR_TUNE_FILE: the step.* keys are skipped)
	p=$(FR_TRANSPORT=$TRANSPORT FR_TUNE_FILE="$d/r.tune" "$S" --predict-only -m bert-base \
		--ranks 8 --rates 100 2>&1) || { echo "$p"; rc=1; }
	echo "$p" | grep -q "^# link model ($d/r.tune)" && echo "$p" | grep -Eq '^  100G +[0-9.]+ \( *[0-9]+%\)$' ||
		{ echo "$p"; rc=1; }
	[ $rc -eq 0 ] || { echo "$out"; cat "$d/r.csv" "$d/r.tune"; }
	rm -rf "$d"
	return $rc
}

# a --model file: layers with their own times
model_file() {
	f=$(mktemp)
	printf '# name params compute_ms\nembed 1000 0\nblock1 30000 1.5\nblock2 30000 1.5\nhead 5000 0.5\n' >"$f"
	out=$(frrun -n 2 --no-prefix --transport "$TRANSPORT" --timeout 120 "$S" -m "$f" \
		-M after,overlap -b 64K --first-bucket-bytes 16K -n 2 -w 1 -v 2>&1)
	rc=$?
	[ $rc -eq 0 ] && echo "$out" | grep -q 'in 4 layers' && echo "$out" | grep -q 'backward 3.5 ms' &&
		rows_ok "$out" overlap && echo "$out" | grep -q '^# timing overlap: step' || rc=1
	[ $rc -eq 0 ] || echo "$out"
	rm -f "$f"
	return $rc
}

# --sim: the projections' All-Reduce times are fr_sim's own for the same
# job and link (the after mode's comm is one All-Reduce of the arena), the
# output says so, and an fr_sim that cannot run is an error, not the
# closed form in disguise
from_sim() {
	d=$(mktemp -d)
	printf 'tcp.alpha_us = 5\ntcp.beta_ns = 0.08\ntcp.copy_ns = 0.15\ngamma_ns.f32 = 0.05\nstep.goodput = 1\n' >"$d/t.tune"
	printf '# name params compute_ms\nembed 1000 0\nblock1 300000 1.5\nblock2 300000 1.5\nhead 5000 0.5\n' >"$d/m"
	out=$(FR_TRANSPORT=tcp FR_TUNE_FILE="$d/t.tune" "$S" --predict-only -m "$d/m" -M after,overlap \
		--ranks 4,6 --rates 100 --sim "$B/fr_sim" --csv "$d/r.csv" 2>&1) || { echo "$out"; rm -rf "$d"; return 1; }
	rc=0
	echo "$out" | grep -q '^# f32 All-Reduce times simulated: ' || rc=1
	for n in 4 6; do
		us=$("$B/fr_sim" -n $n --gbps 100 --lat-us 5 --cpu-reduce-GBps 20 -a auto --sizes-only \
			--sizes 2424000 | awk '!/^#/ && $1 == 2424000 { print $3 }')
		ms=$(awk -F, -v n=$n '$2 == "after" && $3 == "projected" && $4 == "100" && $5 == n { print $7 }' "$d/r.csv")
		echo "n=$n: fr_sim $us us, fr_step comm $ms ms"
		awk -v us="$us" -v ms="$ms" 'BEGIN { exit !(us > 0 && ms > 0 && (ms * 1000 - us)^2 < 0.0121) }' || rc=1
	done
	FR_TRANSPORT=tcp FR_TUNE_FILE="$d/t.tune" "$S" --predict-only -m "$d/m" --ranks 4 --rates 100 \
		--sim "$d/no-such-fr_sim" >"$d/out" 2>&1
	[ $? -eq 1 ] && grep -q '^fr_step: --sim: ' "$d/out" && ! grep -q '^# projection' "$d/out" ||
		{ cat "$d/out"; rc=1; }
	[ $rc -eq 0 ] || { echo "$out"; cat "$d/r.csv"; }
	rm -rf "$d"
	return $rc
}

usage_errors() {
	"$S" --scale 2 >/dev/null 2>&1
	[ $? -eq 2 ] || return 1
	"$S" -M nosuchmode >/dev/null 2>&1
	[ $? -eq 2 ] || return 1
	"$S" -m nosuchmodel --list >/dev/null 2>&1
	[ $? -eq 1 ]
}

run "fr_step presets: the papers' parameter counts" presets
run "fr_step 3 ranks: every mode measured and predicted" job
run "fr_step --model FILE" model_file
run "fr_step --sim: projections from fr_sim" from_sim
run "fr_step usage errors" usage_errors
finish
