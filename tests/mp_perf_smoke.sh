#!/bin/bash
# The perf tools run, check their results and print what they promise
# (numbers are not judged here: speed goals are reported, not unit-tested).
. "$(dirname "$0")/lib.sh"

allreduce_table() {
	out=$(frrun -n 3 --transport "$TRANSPORT" --timeout 120 "$B/fr_allreduce_perf" \
		-b 8 -e 256K -f 32 -n 3 -w 1 -d all -o sum 2>&1) || { echo "$out"; return 1; }
	echo "$out" | grep -q "Avg bus bandwidth" &&
		echo "$out" | grep -q "Out of bounds values : 0" &&
		echo "$out" | grep -Eq '^\[0\] +262144 +32768 +(f64|i64|u64) +sum'
}
allreduce_csv_json() {
	csv=$(frrun -n 2 --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 1K -e 64K -f 4 -n 2 -w 1 -I 1 --csv 2>&1) || return 1
	echo "$csv" | grep -q 'busbw' || return 1
	json=$(frrun -n 2 --no-prefix --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 1K -e 64K -f 4 -n 2 -w 1 -R 0 --json 2>/dev/null) || return 1
	# python3 where there is one (not in the VM), else the key at least
	if command -v python3 >/dev/null; then
		echo "$json" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d'
	else
		echo "$json" | grep -q '"busbw_GBps"'
	fi
}
# -C: every collective, out of place and in place, checked, with the algo
# column; 8 B is less than one f32 per rank for reduce_scatter and allgather
# (skipped), so their first row is 3 x 5 f32 = 60 B.
allreduce_collectives() {
	for coll in reduce_scatter allgather broadcast; do
		for ip in 0 1; do
			out=$(frrun -n 3 --transport "$TRANSPORT" --timeout 120 "$B/fr_allreduce_perf" \
				-b 8 -e 64K -f 8 -n 2 -w 1 -C $coll -I $ip -r 2 -d all 2>&1) ||
				{ echo "$out"; return 1; }
			echo "$out" | grep -q "collective: $coll" &&
				echo "$out" | grep -q "Out of bounds values : 0 OK" &&
				echo "$out" | grep -Eq '^\[0\] #.* #wrong +algo$' ||
				{ echo "$out"; return 1; }
			case $coll in
			broadcast) re='^\[0\] +4096 +1024 +f32 +none .* 0 +[a-z]+$' ;;
			allgather) re='^\[0\] +60 +5 +f32 +none .* 0 +[a-z]+$' ;;
			*) re='^\[0\] +60 +5 +f32 +sum .* 0 +[a-z]+$' ;;
			esac
			echo "$out" | grep -Eq "$re" || { echo "$out"; return 1; }
		done
	done
	# a forced algorithm shows in the algo column; CSV and JSON carry it
	csv=$(FR_ALGO=ring frrun -n 2 --no-prefix --transport "$TRANSPORT" --timeout 60 \
		"$B/fr_allreduce_perf" -b 1K -e 4K -f 4 -n 2 -w 1 -C reduce_scatter -o max --csv 2>&1) ||
		{ echo "$csv"; return 1; }
	echo "$csv" | grep -q '^size,.*,wrong,algo,collective,root$' &&
		echo "$csv" | grep -q '^1024,128,f32,max,0,.*,0,ring,reduce_scatter,$' ||
		{ echo "$csv"; return 1; }
	json=$(frrun -n 2 --no-prefix --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 1K -e 4K -f 4 -n 2 -w 1 -C broadcast -r 1 --json 2>/dev/null) || return 1
	echo "$json" | grep -q '"collective":"broadcast","root":1,' &&
		echo "$json" | grep -q '"algo":"'
}
# per-call timing: median, p99 and min of the per-call slowest rank, in the
# table, CSV and JSON; --stat picks what time (and busbw) is
percall_stats() {
	out=$(frrun -n 2 --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 8 -e 64K -f 64 -n 21 -w 1 2>&1) || { echo "$out"; return 1; }
	echo "$out" | grep -Eq '^\[0\] #.* busbw +median +p99 +min +#wrong +algo$' &&
		echo "$out" | grep -q 'time (--stat): mean, .*over the 21 calls' &&
		echo "$out" | grep -q '^\[0\] #  calls: back to back$' ||
		{ echo "$out"; return 1; }
	csv=$(frrun -n 2 --no-prefix --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 8 -e 64K -f 64 -n 21 -w 1 --stat median --csv 2>&1) || { echo "$csv"; return 1; }
	# time_us is the median; min <= median <= p99, all > 0
	echo "$csv" | awk -F, '
		NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; ok = ("time_median_us" in col) && ("time_p99_us" in col) && ("time_min_us" in col) && ("time_mean_us" in col); next }
		{ rows++; t = $col["time_us"]; m = $col["time_median_us"]; p = $col["time_p99_us"]; n = $col["time_min_us"]
		  if (t != m || !(n > 0) || n + 0 > m + 0 || m + 0 > p + 0 || !($col["time_mean_us"] > 0)) ok = 0 }
		END { exit !(ok && rows == 3) }' || { echo "$csv"; return 1; }
	json=$(frrun -n 2 --no-prefix --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 1K -e 1K -n 3 -w 1 --stat p99 --json 2>/dev/null) || return 1
	echo "$json" | grep -q '"stat":"p99","barrier":false,' &&
		echo "$json" | grep -Eq '"time_us":([0-9.]+),.*"time_p99_us":\1,"time_min_us":' ||
		{ echo "$json"; return 1; }
	"$B/fr_allreduce_perf" --stat mode >/dev/null 2>&1
	[ $? -eq 2 ] || return 1
	# --calls: every timed call in order, whose min and median are the row's
	f=$(mktemp)
	csv=$(frrun -n 2 --no-prefix --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 8 -e 64K -f 64 -n 21 -w 1 --csv --calls "$f" 2>&1) || { echo "$csv"; rm -f "$f"; return 1; }
	echo "$csv" | awk -F, -v f="$f" '
		NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
		{ min[$1] = $col["time_min_us"]; med[$1] = $col["time_median_us"] }
		END {
			ok = 1
			while ((getline l < f) > 0) {
				if (l ~ /^#/) continue
				split(l, x, "\t"); n++
				if (x[4] != (n - 1) % 21 || x[2] != "f32" || x[3] != "sum") ok = 0
				t[x[1], x[4]] = x[5]; sizes[x[1]] = 1
			}
			if (n != 63) ok = 0
			for (s in sizes) {
				lo = -1; k = 0
				for (i = 0; i < 21; i++) { v[i] = t[s, i] + 0; if (lo < 0 || v[i] < lo) lo = v[i] }
				# the median of 21: the value with 10 below and 10 above
				m = -1
				for (i = 0; i < 21; i++) { b = 0; a = 0
					for (j = 0; j < 21; j++) { if (v[j] < v[i]) b++; if (v[j] > v[i]) a++ }
					if (b <= 10 && a <= 10) m = v[i] }
				if (!(s in min) || lo - min[s] > 0.01 || min[s] - lo > 0.01 ||
				    m - med[s] > 0.01 || med[s] - m > 0.01) ok = 0
			}
			exit !ok
		}' || { echo "$csv"; cat "$f"; rm -f "$f"; return 1; }
	rm -f "$f"
	# --barrier: each call starts after a barrier whose time is no call's,
	# so the slowest rank's average (mean) is at most the calls' average
	# of per call the slowest rank; the results still checked
	csv=$(frrun -n 3 --no-prefix --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 8 -e 64K -f 64 -n 21 -w 1 --csv --barrier --calls "$f" 2>&1) || { echo "$csv"; rm -f "$f"; return 1; }
	echo "$csv" | awk -F, -v f="$f" '
		NR == 1 { for (i = 1; i <= NF; i++) col[$i] = i; next }
		{ mean[$1] = $col["time_mean_us"]; if ($col["wrong"] != 0) bad = 1 }
		END {
			while ((getline l < f) > 0) {
				if (l ~ /^#/) continue
				split(l, x, "\t"); n++; sum[x[1]] += x[5]; k[x[1]]++
			}
			ok = n == 63 && !bad
			for (s in mean) if (!(k[s] == 21 && mean[s] > 0 && mean[s] <= sum[s] / 21 + 0.01)) ok = 0
			exit !ok
		}' || { echo "$csv"; cat "$f"; rm -f "$f"; return 1; }
	rm -f "$f"
	# and it says so; the barriers' bytes are no call's (the same
	# compressed ring's wire bytes with and without it)
	json=$(frrun -n 3 --no-prefix --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 1K -e 1K -n 3 -w 1 --barrier --json 2>/dev/null) || return 1
	echo "$json" | grep -q '"stat":"mean","barrier":true,' || { echo "$json"; return 1; }
	out=$(frrun -n 3 --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 8 -e 8 -n 2 -w 1 --barrier 2>&1) || { echo "$out"; return 1; }
	echo "$out" | grep -q "^\[0\] #  calls: each after a barrier, whose time is no call's (--barrier)\$" ||
		{ echo "$out"; return 1; }
	# (the wire_bytes column of a compressed ring of 4 KiB, with "$@")
	ring_wire() {
		FR_ALGO=ring frrun -n 3 --no-prefix --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
			-Z bf16 -b 4K -e 4K -n 3 -w 1 --csv "$@" 2>&1 |
			awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next } { print $c["wire_bytes"] }'
	}
	w0=$(ring_wire)
	w1=$(ring_wire --barrier)
	[[ -n $w0 && $w0 == "$w1" ]] || { echo "wire bytes: $w0 without --barrier, $w1 with"; return 1; }
	# a file it cannot write stops every rank, with an error
	! frrun -n 2 --transport "$TRANSPORT" --timeout 60 "$B/fr_allreduce_perf" \
		-b 8 -e 8 -n 2 -w 1 --calls /nonexistent/dir/calls.tsv >/dev/null 2>&1
}
transport_perf() {
	out=$("$B/fr_transport_perf" -x "$TRANSPORT" -b 8 -e 64K -n 200 2>&1) || { echo "$out"; return 1; }
	echo "$out" | grep -q 'BW average' && echo "$out" | grep -qi 'median\|t_typical\|lat'
}
reduce_perf() {
	"$B/fr_reduce_perf" -d f32 -o sum -b 4K -e 64K -n 3 -w 1 | grep -qi 'memcpy'
}
# fr_tune measures and writes a tune file that communicators then accept
tune() {
	f=$(mktemp)
	out=$(frrun -n 3 --transport "$TRANSPORT" --timeout 300 "$B/fr_tune" -n 5 -e 64K -o "$f" 2>&1) ||
		{ echo "$out"; rm -f "$f"; return 1; }
	echo "$out" | grep -q 'auto picked the fastest' &&
		grep -q "^$TRANSPORT.alpha_us = " "$f" && grep -q '^gamma_ns.bf16 = ' "$f" &&
		grep -q "^$TRANSPORT.step_ramp = [0-9]" "$f" &&
		grep -q "^$TRANSPORT.line_us = [0-9]" "$f" &&
		FR_TUNE_FILE=$f FR_LOG=info frrun -n 3 --transport "$TRANSPORT" --timeout 300 \
			"$B/fr_allreduce_perf" -b 8 -e 64K -f 64 -n 2 -w 1 >"$f.out" 2>&1 &&
		grep -q "(model, $f" "$f.out"
	rc=$?
	[ $rc -eq 0 ] || cat "$f" "$f.out"
	rm -f "$f" "$f.out"
	return $rc
}
# fr_tune's line: measured where the job's ranks (one node) have lines,
# which shared memory gives (also under FR_TUNE_FILE's other value); with
# FR_LL=0 there are none and the file gets the built-in 0.3
tune_lines() {
	local f g out rc
	f=$(mktemp) g=$(mktemp)
	echo "shm.line_us = 9" >"$g"
	out=$(FR_TUNE_FILE=$g frrun -n 2 --transport shm --timeout 300 "$B/fr_tune" -q -n 200 -e 64K -o "$f" 2>&1) &&
		echo "$out" | grep -q '^\[0\] # lines: 8 bytes in [0-9.]* us, recursive doubling through the mailboxes [0-9.]*$' &&
		awk '$1 == "shm.line_us" && $3 >= 0 && $3 != 9 { ok = 1 } END { exit !ok }' "$f" &&
		out=$(FR_LL=0 frrun -n 2 --transport shm --timeout 300 "$B/fr_tune" -q -n 20 -e 64K -o "$f" 2>&1) &&
		! echo "$out" | grep -q '# lines:' && grep -qx 'shm.line_us = 0.300' "$f"
	rc=$?
	[ $rc -eq 0 ] || { echo "$out"; cat "$f"; }
	rm -f "$f" "$g"
	return $rc
}
# fr_tune on 4 emulated nodes of one rank, told the grid $1
tune_nodes() {
	frrun -n 4 -e FR_TOPO="$1" --transport "$TRANSPORT" --timeout 300 \
		bash -c 'export FR_NODE=node$FR_RANK; exec "$0" "$@"' "$B/fr_tune" -q -n 8 "${@:2}"
}
# On FR_TOPO's grid fr_tune measures the racks' uplink (grid_beta_ns.1),
# and the other parameters inside the racks: 4 emulated nodes, 2 racks of
# 2; on a grid that does not hold the nodes it measures none, and keeps the
# value FR_TUNE_FILE gave, as it keeps the node's own local_* (nodes of
# one rank: nothing of theirs to measure; tune_local below)
tune_grid() {
	local f g out rc
	f=$(mktemp) g=$(mktemp)
	out=$(tune_nodes 2x2 -o "$f" 2>&1) &&
		echo "$out" | grep -q '# grid dimension 1: 2 groups of 2 node(s), 1 rank(s) each: 8388608 bytes' &&
		grep -q '^# alpha, beta, copy, msg: inside the racks of 2 nodes' "$f" &&
		awk -v k="$TRANSPORT.grid_beta_ns.1" '$1 == k && $3 > 0 { ok = 1 } END { exit !ok }' "$f" &&
		! grep -q 'grid_beta_ns.2' "$f" && ! grep -q 'local_' "$f" &&
		printf '%s.grid_beta_ns.1 = 12.5\n%s.local_alpha_us = 0.5\n%s.local_beta_ns = 0.04\n' \
			"$TRANSPORT" "$TRANSPORT" "$TRANSPORT" >"$g" &&
		out=$(FR_TUNE_FILE=$g tune_nodes 3x2 -o "$f" 2>&1) &&
		! echo "$out" | grep -q '# grid dimension\|inside the racks' &&
		grep -qx "$TRANSPORT.grid_beta_ns.1 = 12.5000" "$f" &&
		grep -qx "$TRANSPORT.local_alpha_us = 0.500" "$f" &&
		grep -qx "$TRANSPORT.local_beta_ns = 0.0400" "$f"
	rc=$?
	[ $rc -eq 0 ] || { echo "$out"; cat "$f"; }
	rm -f "$f" "$g"
	return $rc
}
# On 2 emulated nodes of 2 ranks fr_tune measures the node's own steps
# (local_alpha_us, local_beta_ns) inside each node, and writes them in a
# file that communicators accept
tune_local() {
	local f out rc
	f=$(mktemp)
	out=$(frrun -n 4 --transport "$TRANSPORT" --timeout 300 \
		bash -c 'export FR_NODE=node$((FR_RANK / 2)); exec "$0" "$@"' "$B/fr_tune" -q -n 8 \
		-o "$f" 2>&1) &&
		echo "$out" | grep -q "# the node's own steps: 2 nodes of 2 ranks, inside each over $TRANSPORT: " &&
		awk -v a="$TRANSPORT.local_alpha_us" -v b="$TRANSPORT.local_beta_ns" \
			'($1 == a || $1 == b) && $3 > 0 { n++ } END { exit n != 2 }' "$f" &&
		FR_TUNE_FILE=$f FR_LOG=info frrun -n 4 --transport "$TRANSPORT" --timeout 300 \
			bash -c 'export FR_NODE=node$((FR_RANK / 2)); exec "$0" "$@"' \
			"$B/fr_allreduce_perf" -b 8 -e 64K -f 64 -n 2 -w 1 >"$f.out" 2>&1 &&
		grep -q "(model, $f" "$f.out" &&
		# with the model check: the file keeps the keys measured, or
		# (its picks better without them) says so and has none
		out=$(frrun -n 4 --transport "$TRANSPORT" --timeout 300 \
			bash -c 'export FR_NODE=node$((FR_RANK / 2)); exec "$0" "$@"' "$B/fr_tune" -n 5 \
			-e 64K -o "$f" 2>&1) &&
		echo "$out" | grep -q 'auto picked the fastest' &&
		if echo "$out" | grep -q "without the node's own steps measured it picked the fastest at .*: the file keeps none"; then
			! grep -q 'local_' "$f"
		else
			grep -q "^$TRANSPORT.local_alpha_us = " "$f"
		fi
	rc=$?
	[ $rc -eq 0 ] || { echo "$out"; cat "$f" "$f.out" 2>/dev/null; }
	rm -f "$f" "$f.out"
	return $rc
}
# -Z / --ef / --overlap-ms: compressed rows are checked (identical bits,
# relerr within the format's reach), wire bytes shrink, overlap columns
compress_overlap() {
	for z in none bf16 int8; do
		out=$(frrun -n 3 --transport "$TRANSPORT" --timeout 120 "$B/fr_allreduce_perf" \
			-b 64K -e 256K -f 4 -n 2 -w 1 -Z $z 2>&1) || { echo "$out"; return 1; }
		echo "$out" | grep -q "Out of bounds values : 0 OK" &&
			echo "$out" | grep -Eq "^\[0\] +262144 +65536 +f32 +sum .* ring +$z +[0-9.e+-]+ +[0-9]+ +[-0-9.]+$" ||
			{ echo "$out"; return 1; }
	done
	csv=$(frrun -n 2 --no-prefix --transport "$TRANSPORT" --timeout 120 "$B/fr_allreduce_perf" \
		-b 64K -e 64K -n 2 -w 1 -Z int8 --ef --overlap-ms 1 --progress thread --csv 2>&1) ||
		{ echo "$csv"; return 1; }
	echo "$csv" | grep -q '^size,.*,root,compute_us,wall_us,overlap,compress,ef,relerr,wire_bytes,zratio$' &&
		echo "$csv" | grep -Eq '^65536,16384,f32,sum,0,.*,0,ring,allreduce,,[0-9.]+,[0-9.]+,[0-9.]+,int8,1,[0-9.e+-]+,[0-9.]+,3\.938[0-9]$' ||
		{ echo "$csv"; return 1; }
}
# perf/bench/c2c_rtt.c (compare.sh's probe of the machine): a positive
# round trip in ns on two CPUs, "-" when pinned to one (no hang); built
# with the system's compiler, so not where there is none (the Soft-RoCE VM)
c2c_probe() {
	local d rc=0 one two
	d=$(mktemp -d)
	${CC:-cc} -std=c11 -O2 -pthread -o "$d/c2c" "$(dirname "$0")/../perf/bench/c2c_rtt.c" || rc=1
	if [ $rc -eq 0 ]; then
		two=$(timeout 60 "$d/c2c" 20000)
		# the first CPU we may use, from "...: 0-1" or "...: 2,5"
		one=$(timeout 60 taskset -c "$(taskset -pc $$ | sed 's/.*: //; s/[-,].*//')" "$d/c2c" 20000)
		echo "two CPUs: $two ns; one CPU: $one"
		[[ "$two" =~ ^[1-9][0-9]*$ ]] && [ "$one" = - ] || rc=1
		timeout 10 "$d/c2c" 5 >/dev/null 2>&1
		[ $? -eq 2 ] || { echo "c2c_rtt 5: not refused"; rc=1; }
	fi
	rm -rf "$d"
	return $rc
}
# ceiling.sh's TCP ring (perf/bench/tcp_ring.c) on loopback: every rank
# reports a rate; bad arguments refused.  Its ports are fixed (PORT + rank):
# below Linux's ephemeral range, where no other test's connection takes
# them, and chosen again while one is taken (exit 3).
tcp_ring() {
	local d rc=0 out try port ran=0
	d=$(mktemp -d)
	${CC:-cc} -std=c11 -O2 -Wall -Wextra -o "$d/tcp_ring" \
		"$(dirname "$0")/../perf/bench/tcp_ring.c" || rc=1
	for try in 1 2 3 4 5; do
		[ $rc -eq 0 ] || break
		port=$((20000 + RANDOM % 10000))
		out=$(for r in 0 1 2; do
			{ timeout 60 "$d/tcp_ring" $r 3 $port 1.5 127.0.0.1 2>&1 ||
				echo "exit $?"; } &
		done; wait)
		echo "$out"
		echo "$out" | grep -q '^exit 3$' && continue
		ran=1
		[ "$(echo "$out" | grep -Ec '^rank [0-2]: [0-9]+\.[0-9]+ MB/s received$')" = 3 ] || rc=1
		break
	done
	[ $ran = 1 ] || { echo "tcp_ring: every port tried was taken"; rc=1; }
	if [ $rc -eq 0 ]; then
		timeout 10 "$d/tcp_ring" 0 1 20000 2 127.0.0.1 >/dev/null 2>&1
		[ $? -eq 2 ] || { echo "tcp_ring on 1 rank: not refused"; rc=1; }
	fi
	rm -rf "$d"
	return $rc
}
# the simulator (perf/sim): its table for every algorithm, each result
# checked by the tool; the times the same on a second run (all but the
# real seconds); a network it cannot model and a bad option refused
sim_table() {
	out=$("$B/fr_sim" -n 6 -k 2 -b 8 -e 512K -f 16 -a all 2>&1) || { echo "$out"; return 1; }
	echo "$out" | grep -Eq '^ +8  ring +[0-9.]+ ' &&
		echo "$out" | grep -Eq '^ +524288  hier +[0-9.]+ ' &&
		echo "$out" | grep -Eq '^ +8  auto:[a-z]+ +[0-9.]+ ' &&
		echo "$out" | grep -q '^# fr_sim: 6 ranks, 2 per node' || { echo "$out"; return 1; }
	again=$("$B/fr_sim" -n 6 -k 2 -b 8 -e 512K -f 16 -a all 2>&1) || return 1
	[ "$(echo "$out" | awk '{NF--; print}')" = "$(echo "$again" | awk '{NF--; print}')" ] ||
		{ echo "two runs differ:"; echo "$out"; echo "$again"; return 1; }
	out=$("$B/fr_sim" -n 5 -k 2 -e 1K 2>&1)
	[ $? -eq 1 ] && echo "$out" | grep -q "nodes of 2" || { echo "$out"; return 1; }
	"$B/fr_sim" -n 4x >/dev/null 2>&1
	[ $? -eq 2 ] || { echo "fr_sim -n 4x: not refused"; return 1; }
	# ranks launched apart need calls back to back and the ranks' clocks
	out=$("$B/fr_sim" -n 4 -e 8 --stagger-us 100 --cpu-send-us 1 2>&1)
	[ $? -eq 2 ] && echo "$out" | grep -q 'needs --calls 2' || { echo "$out"; return 1; }
	out=$("$B/fr_sim" -n 4 -e 8 --stagger-us 100 --calls 3 2>&1)
	[ $? -eq 2 ] && echo "$out" | grep -q 'needs a CPU model' || { echo "$out"; return 1; }
	out=$("$B/fr_sim" -n 4 -b 8 -e 8 -a rd --lat-us 1000 --cpu-send-us 1 --stagger-us 1500 --calls 5 2>&1) || { echo "$out"; return 1; }
	echo "$out" | grep -q 'rank r starting r x 1500 us late' || { echo "$out"; return 1; }
	# so does the rendezvous's lead; a barrier needs calls to go between
	out=$("$B/fr_sim" -n 4 -e 8 --lead-us 100 --cpu-send-us 1 2>&1)
	[ $? -eq 2 ] && echo "$out" | grep -q -- '--lead-us needs --calls 2' || { echo "$out"; return 1; }
	out=$("$B/fr_sim" -n 4 -e 8 --lead-us 100 --calls 3 2>&1)
	[ $? -eq 2 ] && echo "$out" | grep -q -- '--lead-us needs a CPU model' || { echo "$out"; return 1; }
	out=$("$B/fr_sim" -n 4 -e 8 --barrier 2>&1)
	[ $? -eq 2 ] && echo "$out" | grep -q -- '--barrier needs --calls 2' || { echo "$out"; return 1; }
	out=$("$B/fr_sim" -n 4 -b 8 -e 8 -a rd --lat-us 1000 --cpu-send-us 1 --lead-us 1000 --barrier --calls 5 2>&1) || { echo "$out"; return 1; }
	echo "$out" | grep -q '5 calls each after a barrier after a warm-up and 3 more, rank 0 starting 1000 us ahead,' || { echo "$out"; return 1; }
}
# validate_netns.sh --measured: no namespaces, no root; the table from a
# kept run's measured times and calibration: a row at the simulated time
# is 1.00 and within, one at half of it 2.00 and off; what is missing is
# refused
validate_measured() {
	local d v sim out bout
	v="$(dirname "$0")/../perf/sim/validate_netns.sh"
	d=$(mktemp -d) || return 1
	printf 'rate 10gbit\ndelay_ms 0\ncores 2\nmsg_rate_Mpps 0.17\nlat_us 11.2\nlat_nospin_us 18.6\nbw_unshaped_GBps 3\nreduce_GBps 32\n' >"$d/calibration.txt"
	m() { printf '%s,0,f32,sum,0,0,0,0,0,%s,0,0,,%s,allreduce,\n' "$@"; }
	{ m 8 1000 ring; m 65536 1000 ring; } >"$d/m.3.ring"
	out=$("$v" --measured "$d" --ranks 3 --algos ring --sizes "8 65536" --build "$B" --out "$d/o1" 2>&1) ||
		{ echo "$out"; rm -rf "$d"; return 1; }
	sim=$(echo "$out" | awk -F' *[|] *' '$2 == 3 && $3 == 8 { print $8 }')
	[[ -n $sim && $sim != 0.0 ]] &&
		echo "$out" | grep -q '^# measured: .*, calls back to back,' ||
		{ echo "$out"; rm -rf "$d"; return 1; }
	# measured with --barrier: the kept run says so, and the simulator
	# times its calls the same way (rank 0 ahead by the one-way latency)
	mkdir "$d/b" && cp "$d/m.3.ring" "$d/b/" && { cat "$d/calibration.txt"; echo "barrier 1"; } >"$d/b/calibration.txt" ||
		{ rm -rf "$d"; return 1; }
	bout=$("$v" --measured "$d/b" --ranks 3 --algos ring --sizes "8 65536" --build "$B" --out "$d/o6" 2>&1) &&
		echo "$bout" | grep -q '^# measured: .*, calls each after a barrier (--barrier),' &&
		echo "$bout" | grep -q -- '^# fr_sim .* --barrier --calls 5 --lead-us 11.2 *$' &&
		[[ $(echo "$bout" | awk -F' *[|] *' '$2 == 3 && $3 == 8 && $8 > 0 { print "simulated" }') == simulated ]] ||
		{ echo "$bout"; rm -rf "$d"; return 1; }
	# measured with --spin-us 0: the simulated ranks block at once too,
	# and another spin on that run is refused
	mkdir "$d/s" && cp "$d/m.3.ring" "$d/s/" && { cat "$d/calibration.txt"; echo "barrier 0"; echo "spin_us 0"; } >"$d/s/calibration.txt" ||
		{ rm -rf "$d"; return 1; }
	bout=$("$v" --measured "$d/s" --ranks 3 --algos ring --sizes "8 65536" --build "$B" --out "$d/o8" 2>&1) &&
		echo "$bout" | grep -q '^# measured: .*, FR_SPIN_US=0$' &&
		echo "$bout" | grep -q -- '^# fr_sim .* --cpu-spin-us 0 ' ||
		{ echo "$bout"; rm -rf "$d"; return 1; }
	"$v" --measured "$d/s" --spin-us 50 --ranks 3 --algos ring --build "$B" --out "$d/o9" >/dev/null 2>&1
	[ $? -eq 2 ] || { echo "--spin-us 50 on a run measured with 0: not refused"; rm -rf "$d"; return 1; }
	# 8 B measured in three jobs (--jobs): their median is compared, and
	# their spread (slowest / fastest) shown; 64 KiB in one, and one that
	# failed (no time: not counted)
	{ m 8 "$(awk -v s="$sim" 'BEGIN { print s / 2 }')" ring
	  m 65536 "$(echo "$out" | awk -F' *[|] *' '$2 == 3 && $3 == 65536 { print $8 / 2 }')" ring
	  m 65536 "" ring
	  m 8 "$(awk -v s="$sim" 'BEGIN { print s * 4 }')" ring
	  m 8 "$sim" ring; } >"$d/m.3.ring"
	out=$("$v" --measured "$d" --ranks 3 --algos ring --sizes "8 65536" --build "$B" --out "$d/o2" 2>&1) ||
		{ echo "$out"; rm -rf "$d"; return 1; }
	echo "$out" | grep -Eq '^[|] 3 [|] 8 [|] ring [|] [0-9.]+ [|] 3, 8[.]00 [|] .* [|] 1[.]00 [|]$' &&
		echo "$out" | grep -Eq '^[|] 3 [|] 65536 [|] ring [|] [0-9.]+ [|] 1, 1[.]00 [|] .* [|] 2[.]00 [(]off[)] [|]$' &&
		echo "$out" | grep -q '^# within 15 %: 1 of 2' &&
		echo "$out" | grep -q '^# measured jobs within 1.3 of each other (slowest / fastest): 1 of 2' ||
		{ echo "$out"; rm -rf "$d"; return 1; }
	# under a delay line: its CPU time a call, measured in three jobs
	# of 12 calls (1, 3 and 2 ms a call: the median 2), beside the
	# simulator's
	printf 'rate 10gbit\ndelay_ms 1\ncores 2\nmsg_rate_Mpps 0.17\nlat_us 1100\nlat_nospin_us 1110\nbw_unshaped_GBps 3\nreduce_GBps 32\ndl_us 50\ndl_GBps 1.6\n' >"$d/d.txt"
	mkdir "$d/dl" && cp "$d/d.txt" "$d/dl/calibration.txt" && cp "$d/m.3.ring" "$d/dl/" &&
		printf '65536,12,12000000\n65536,12,36000000\n65536,12,24000000\n' >"$d/dl/m.3.ring.dl" ||
		{ rm -rf "$d"; return 1; }
	out=$("$v" --measured "$d/dl" --ranks 3 --algos ring --sizes "8 65536" --build "$B" --out "$d/o5" 2>&1) ||
		{ echo "$out"; rm -rf "$d"; return 1; }
	# shellcheck disable=SC2046
	sim=$("$B/fr_sim" -n 3 $(echo "$out" | sed -n 's/^# fr_sim //p') -b 65536 -e 65536 -a ring |
		awk '/delay lines. work/ { if ($9 > 0) printf "%.2f | %.2f", $9 / 1e3, $9 / 1e3 / 2 }')
	echo "$out" | grep -q -- '--cpu-dl-us 50 --cpu-dl-GBps 1.6' && [[ -n $sim ]] &&
		echo "$out" | grep -q "^| 3 | 65536 | ring | 2.00 | $sim |\$" ||
		{ echo "$out"; echo "fr_sim's line: $sim"; rm -rf "$d"; return 1; }
	"$v" --measured "$d" --ranks 4 --algos ring --build "$B" --out "$d/o3" >/dev/null 2>&1
	[ $? -eq 2 ] || { echo "no m.4.ring: not refused"; rm -rf "$d"; return 1; }
	"$v" --measured "$d" --barrier --ranks 3 --algos ring --build "$B" --out "$d/o7" >/dev/null 2>&1
	[ $? -eq 2 ] || { echo "--barrier on a run measured back to back: not refused"; rm -rf "$d"; return 1; }
	rm "$d/calibration.txt"
	"$v" --measured "$d" --ranks 3 --algos ring --build "$B" --out "$d/o4" >/dev/null 2>&1
	[ $? -eq 2 ] || { echo "no calibration.txt: not refused"; rm -rf "$d"; return 1; }
	rm -rf "$d"
}
run "fr_tune writes a tune file that FR_TUNE_FILE reads" tune
run "fr_tune measures a line over shm (FR_LL=0: none)" tune_lines
run "fr_tune measures the grid's uplink (FR_TOPO=2x2)" tune_grid
run "fr_tune measures the node's own steps (2 nodes of 2 ranks)" tune_local
run "fr_allreduce_perf every dtype, 3 ranks" allreduce_table
run "fr_allreduce_perf --csv / --json" allreduce_csv_json
run "fr_allreduce_perf -C reduce_scatter/allgather/broadcast" allreduce_collectives
run "fr_allreduce_perf per-call median / p99 / min, --stat, --calls, --barrier" percall_stats
run "fr_transport_perf bw + lat" transport_perf
run "fr_reduce_perf" reduce_perf
run "fr_allreduce_perf -Z / --ef / --overlap-ms" compress_overlap
run "fr_sim: every algorithm, repeatable, errors" sim_table
run "validate_netns.sh --measured: the table again, no namespaces" validate_measured
if command -v "${CC:-cc}" >/dev/null && command -v taskset >/dev/null &&
	[ "$(nproc)" -ge 2 ]; then
	run "compare.sh's core-to-core probe (perf/bench/c2c_rtt.c)" c2c_probe
fi
command -v "${CC:-cc}" >/dev/null &&
	run "ceiling.sh's TCP ring (perf/bench/tcp_ring.c) on loopback" tcp_ring
finish
