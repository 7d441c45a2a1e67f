# Shared helpers for the multi-process test scripts (sourced).
set -u
B=${FR_BUILDDIR:-$(cd "$(dirname "$0")/.." && pwd)}
MP="$B/tests/mp_allreduce"
# frrun ARGS...: the launcher, on FR_TEST_HOST when set (rdma_cm needs a real
# interface address, not 127.0.0.1).
frrun() {
	"$B/frrun" ${FR_TEST_HOST:+--host "$FR_TEST_HOST"} "$@"
}
# The transport under test; the verbs suite sets FR_TEST_TRANSPORT=verbs.
TRANSPORT=${FR_TEST_TRANSPORT:-tcp}
npass=0
nfail=0

# run NAME CMD...: run one case, count it, show its output on failure.
run() {
	name=$1
	shift
	log=$(mktemp)
	start=$EPOCHREALTIME
	if "$@" >"$log" 2>&1; then
		npass=$((npass + 1))
		printf 'PASS %-50s %6.1fs\n' "$name" \
			"$(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { print b - a }')"
	else
		rc=$?
		nfail=$((nfail + 1))
		printf 'FAIL %-50s (exit %d)\n' "$name" "$rc"
		tail -n 40 "$log"
	fi
	rm -f "$log"
}

finish() {
	echo "$npass passed, $nfail failed"
	[ "$nfail" -eq 0 ]
}
