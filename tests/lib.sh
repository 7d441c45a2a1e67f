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
# FR_TEST_SHORT=1 (set by the Soft-RoCE VM suite, where the emulator is
# slow, unless FR_TEST_FULL=1): the suites leave out the cases whose logic
# sits above the transport (patience of late ranks, every mismatch on every
# algorithm and rank count, training's variants), which the fast transports
# run in full; they say which.
SHORT=0
[ "${FR_TEST_SHORT:-0}" = 1 ] && [ "${FR_TEST_FULL:-0}" != 1 ] && SHORT=1
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

# conformance SETTINGS...: the transport conformance suite (tests/test_transport)
# once per argument, each the environment of one run ("FR_TEST_TRANSPORT=shm
# FR_TEST_MUX_NODES=1"), with its output; then exit 0 when every run passed, 77
# (skipped) when the suite is not built (configure found no cmocka) or every run
# was skipped (the transport is not usable here: its probe says why), else 1.
conformance() {
	suite="$B/tests/test_transport"
	if [ ! -x "$suite" ]; then
		echo "SKIP: $suite is not built (configure found no cmocka)"
		exit 77
	fi
	nskip=0
	for setting in "$@"; do
		echo "== $setting tests/test_transport"
		# shellcheck disable=SC2086 # one word per VAR=VALUE
		env $setting "$suite"
		case $? in
		0) npass=$((npass + 1)) ;;
		77) nskip=$((nskip + 1)) ;;
		*) nfail=$((nfail + 1)) ;;
		esac
	done
	echo "$npass passed, $nskip skipped, $nfail failed"
	[ "$nfail" -eq 0 ] || exit 1
	[ "$npass" -gt 0 ] || exit 77
	exit 0
}
