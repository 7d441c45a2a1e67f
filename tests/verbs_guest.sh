#!/bin/bash
# Inside the Soft-RoCE VM (started by tests/verbs_vm.sh): the verbs suite on
# one host - the transport conformance suite, the multi-process suite over
# verbs (same checks as over TCP: bit-exact reference, bitwise equal ranks),
# registration once, failures - then the perf comparisons, written to
# $FR_VM_OUT/perf-verbs.txt.
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
B=${FR_BUILDDIR:?}
OUT=${FR_VM_OUT:-$B}
export FR_BUILDDIR=$B FR_TEST_TRANSPORT=verbs FR_TEST_HOST=${RDMAVM_IP:?}
# the shared suites leave out what sits above the transport (tests/lib.sh),
# unless FR_TEST_FULL=1
export FR_TEST_SHORT=1
ulimit -l unlimited
rc=0 nsuites=0 nbad=0 failed=""
# Each suite's output is kept, so that the summary at the very end (what a
# CI log shows of a long run) can repeat what failed.
slog=$(mktemp)
trap 'rm -f "$slog"' EXIT
# Each suite says when it started and how long it took (seconds since the
# script began), so that a CI log shows where the VM's time went.
suite() {
	local name=$1 t0=$SECONDS
	echo "--- $name (at $t0 s)"
	shift
	nsuites=$((nsuites + 1))
	if "$@" 2>&1 | tee "$slog"; [ "${PIPESTATUS[0]}" -eq 0 ]; then
		echo "--- $name: $((SECONDS - t0)) s"
	else
		nbad=$((nbad + 1))
		rc=1
		failed+="--- failed: $name"$'\n'
		# cmocka's ERROR and LINE lines say which check failed; the
		# first failures matter most.
		failed+="$(grep -E -B2 -A2 '^FAIL |\[  FAILED  \]|\[  ERROR   \]|\[   LINE   \]|error: ' "$slog" | head -n 40)"$'\n'
	fi
}

# Rank counts: the emulator runs everything on the host's two CPUs, so CI
# (and the README's test command) runs the automatic choice on 2, 3 and 5
# ranks and forces each algorithm on 5 (a non-power of two: every
# algorithm folds); FR_TEST_FULL=1 (the long campaign, README) on 1 to 5,
# and the forced collectives on 3 and 8 too.
if [ "${FR_TEST_FULL:-0}" = 1 ]; then
	m_ranks="1 2 3 4 5" m_algo_ranks="1 2 3 4 5"
	c_ranks="1 2 3 5" c_algo_ranks="3 5 8"
else
	m_ranks="2 3 5" m_algo_ranks="5"
	c_ranks="2 3 5" c_algo_ranks="5"
fi
suite "transport conformance over verbs" "$B/tests/test_transport"
# Emulated RDMA moves ~25 MB/s under TCG: the full dtype x op sweep uses a
# large odd count of 65537; 1Mi+1 runs for f32/bf16 sum below.
suite "matrix over verbs (auto and every algorithm)" env FR_TEST_RANKS="$m_ranks" \
	FR_TEST_ALGO_RANKS="$m_algo_ranks" \
	FR_TEST_COUNTS="0,1,2,3,4,7919,65537" FR_TEST_ALGO_COUNTS="0,1,3,7919" \
	bash "$src/tests/mp_matrix.sh"
suite "reduce-scatter, all-gather, broadcast, barrier over verbs" \
	env FR_TEST_RANKS="$c_ranks" FR_TEST_COLL_ALGO_RANKS="$c_algo_ranks" \
	FR_TEST_COLL_COUNTS="0,1,3,7919" bash "$src/tests/mp_colls.sh"
suite "reduce, all-to-all(v), all-gatherv, reduce-scatterv over verbs" \
	env FR_TEST_RANKS="$c_ranks" FR_TEST_XALGO_RANKS="$c_algo_ranks" \
	FR_TEST_XCOUNTS="0,1,2,13,7919" bash "$src/tests/mp_xcolls.sh"
suite "sub-communicators over verbs" \
	env FR_TEST_RANKS="$c_ranks" FR_TEST_SPLIT_THREADS="4" \
	bash "$src/tests/mp_split.sh"
suite "revoke, agree, shrink over verbs" env FR_TEST_RANKS=3 \
	bash "$src/tests/mp_recover.sh"
# random kills in training (FR_SURVIVE_RUNS=10 for the campaign's ten)
suite "training survives kill -9 over verbs" \
	env FR_SURVIVE_RUNS="${FR_SURVIVE_RUNS:-1}" bash "$src/tests/mp_survive.sh"
suite "matrix 1Mi+1 over verbs" bash -c '. "$0/tests/lib.sh"
	run "matrix n=3 count 1048577" frrun -n 3 --transport verbs --timeout 900 \
		"$MP" matrix --counts 1048577 --dtypes f32,bf16 --ops sum
	finish' "$src"
# small messages inline (FR_LL=1, every run above) and the ordinary way
# (FR_LL=0), and a job whose ranks differ
suite "small messages over verbs, FR_LL=0 and mixed" bash -c '. "$0/tests/lib.sh"
	run "matrix n=3 FR_LL=0" frrun -n 3 -e FR_LL=0 --transport verbs \
		--timeout 600 "$MP" matrix --counts 0,1,2,5,17 --dtypes f32,u8 --ops sum,max
	run "colls n=3, FR_LL=0 on rank 1 only" frrun -n 3 --transport verbs \
		--timeout 600 bash -c "[ \$FR_RANK = 1 ] && export FR_LL=0; exec \"\$0\" \"\$@\"" \
		"$MP" colls --counts 0,1,2,5
	finish' "$src"
# small messages as polled lines (FR_IB_LL=1; off by default on Soft-RoCE):
# the conformance suite (its small writes as lines, through each side of
# shm+verbs too), and ranks that poll, sleep, differ, and resume
suite "transport conformance over verbs, FR_IB_LL=1" \
	env FR_IB_LL=1 "$B/tests/test_transport"
suite "transport conformance over shm+verbs (verbs side), FR_IB_LL=1" \
	env FR_IB_LL=1 FR_TEST_TRANSPORT=shm+verbs FR_TEST_MUX_NODES=1 \
	"$B/tests/test_transport"
suite "polled lines over verbs" bash "$src/tests/mp_lines.sh"
suite "register once over verbs" bash "$src/tests/mp_regonce.sh"
suite "dead and stalled peers over verbs" bash "$src/tests/mp_kill.sh"
suite "mismatched arguments over verbs" bash "$src/tests/mp_mismatch.sh"
# the perf tools' own checks (their options, statistics, tune files) are
# the transport's only in what the perf section below runs over verbs:
# the whole suite with FR_TEST_FULL=1, as stage 1 runs it over tcp and shm
[ "${FR_TEST_FULL:-0}" = 1 ] &&
	suite "perf tools over verbs" bash "$src/tests/mp_perf_smoke.sh"
# shm+verbs: shm to the ranks of a node, verbs to the others (what auto
# takes on several hosts): the conformance suite through each side, and
# jobs on emulated nodes (FR_NODE) that mix them
suite "transport conformance over shm+verbs (shm side)" \
	env FR_TEST_TRANSPORT=shm+verbs "$B/tests/test_transport"
suite "transport conformance over shm+verbs (verbs side)" \
	env FR_TEST_TRANSPORT=shm+verbs FR_TEST_MUX_NODES=1 "$B/tests/test_transport"
suite "emulated nodes over shm+verbs" bash -c '. "$0/tests/lib.sh"
	run "matrix n=4, 2 per node, shm+verbs" frrun -n 4 --transport shm+verbs \
		--timeout 900 "$MP" matrix --ranks-per-node 2 --counts 0,1,7919,65537 \
		--dtypes f32,bf16,i64 --ops sum,avg,max
	run "colls n=6, 3 per node, shm+verbs" frrun -n 6 --transport shm+verbs \
		--timeout 900 "$MP" colls --ranks-per-node 3 --counts 0,1,7919
	# auto on several (emulated) nodes with an RDMA port: shm+verbs
	auto_mixed() {
		FR_LOG=info frrun -n 4 --timeout 300 "$MP" matrix --ranks-per-node 2 \
			--counts 7919 --dtypes f32 --ops sum >"$B/auto-mixed.out" 2>&1 &&
			grep -q "transport: shm+verbs" "$B/auto-mixed.out"
	}
	run "auto on emulated nodes is shm+verbs" auto_mixed
	finish' "$src"
# Several QPs per connection (FR_IB_QPS): the conformance suite with a
# stripe size so small that most of its writes are striped (and later ones
# queue behind them), and the matrix over an odd number of QPs.
suite "conformance over verbs, FR_IB_QPS=4, 1 KiB stripes" \
	env FR_IB_QPS=4 FR_IB_STRIPE_BYTES=1K "$B/tests/test_transport"
suite "matrix over verbs, FR_IB_QPS=3, 4 KiB stripes" bash -c '. "$0/tests/lib.sh"
	export FR_IB_QPS=3 FR_IB_STRIPE_BYTES=4K
	run "matrix n=3 count 262147, 3 QPs" frrun -n 3 --transport verbs --timeout 600 \
		"$MP" matrix --counts 0,1,7919,262147 --dtypes f32,bf16,i64,u8 --ops sum,max
	run "matrix n=2 rabenseifner, 3 QPs" frrun -n 2 -e FR_ALGO=rabenseifner \
		--transport verbs --timeout 600 "$MP" matrix --counts 3,65537 --dtypes f32,f64 --ops sum
	finish' "$src"
# Connections that fail and are re-established (FR_IB_FAULT), their writes
# sent again: the same digest as without faults.
suite "link failures over verbs: resume" bash "$src/tests/mp_resume.sh"

# --- perf: the same rxe device, side by side (emulated: ratios only) -------
{
	dev=${RDMAVM_DEV:-rxe0} gid=${RDMAVM_GID_INDEX:-1}
	# perftest TOOL PORT HEADER ARGS...: server in the background, then
	# the client, printing its header line and result
	perftest() {
		local tool=$1 port=$2 hdr=$3
		shift 3
		"$tool" -d "$dev" -x "$gid" -p "$port" "$@" >/dev/null 2>&1 &
		sleep 1
		"$tool" -d "$dev" -x "$gid" -p "$port" "$@" "$RDMAVM_IP" 2>&1 | grep -A1 "$hdr"
		wait
	}
	echo "# ib_write_bw vs fr_transport_perf -x verbs, 64 KiB, 2000 writes"
	perftest ib_write_bw 18515 'BW peak' -s 65536 -n 2000
	"$B/fr_transport_perf" -x verbs --ip "$RDMAVM_IP" --bw -s 65536 -n 2000 2>&1 | tail -2
	# Emulated, one host: more QPs need not be faster here (the
	# requirement is only "not slower"); printed, not judged.
	for q in 1 4; do
		echo "# fr_transport_perf -x verbs --bw, 1 MiB, FR_IB_QPS=$q"
		FR_IB_QPS=$q "$B/fr_transport_perf" -x verbs --ip "$RDMAVM_IP" --bw \
			-s 1048576 -n 200 2>&1 | tail -2
	done
	echo "# ib_write_lat vs fr_transport_perf -x verbs --lat, 8 B"
	perftest ib_write_lat 18516 't_min' -s 8 -n 1000
	"$B/fr_transport_perf" -x verbs --ip "$RDMAVM_IP" --lat -s 8 -n 1000 2>&1 | tail -2
	# small messages as polled lines (FR_IB_LL=1, ranks that poll,
	# FR_POLL=spin), as inline writes with immediate (FR_IB_LL=0, the
	# default on Soft-RoCE), or as ordinary writes from the outbox
	# (FR_LL=0), alternating; printed, not judged
	for r in 1 2; do
		for v in "FR_IB_LL=1" "FR_IB_LL=0" "FR_LL=0"; do
			echo "# fr_allreduce_perf, 2 ranks, verbs, 8 B, FR_POLL=spin $v (round $r)"
			"$B/frrun" -n 2 --host "$RDMAVM_IP" -x verbs -e "$v" \
				-e FR_POLL=spin --timeout 300 "$B/fr_allreduce_perf" \
				-b 8 -e 8 -n 2000 -w 100 -I 1 -c 0 2>&1 | grep -v '#' | tail -1
		done
	done
	for t in verbs tcp; do
		echo "# fr_allreduce_perf, 4 ranks, $t"
		"$B/frrun" -n 4 --host "$RDMAVM_IP" -x "$t" --timeout 600 \
			"$B/fr_allreduce_perf" -b 8 -e 4M -f 8 -n 5 -w 2 2>&1 | grep -v '^\[0\] #  \|^\[0\] #$'
	done
} >"$OUT/perf-verbs.txt" 2>&1 || true
cat "$OUT/perf-verbs.txt"
echo "--- perf comparisons: done (at $SECONDS s)"

printf '%s' "$failed"
echo "verbs suites: $((nsuites - nbad)) passed, $nbad failed"
exit $rc
