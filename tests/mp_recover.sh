#!/bin/bash
# Recovery (tests/mp_recover.c): fr_comm_revoke ends a collective, a
# receive and a nonblocking wait on another thread, at once on every rank,
# and only on the communicator revoked.  Over FR_TEST_TRANSPORT (tcp by
# default); shm and shm+tcp too unless it is set (the verbs suite sets it).
. "$(dirname "$0")/lib.sh"
X="$B/tests/mp_recover"
# a revoke must not wait for the timeout: the test allows 10 s of 60
export FR_TIMEOUT_MS=60000
transports=$TRANSPORT
[ -z "${FR_TEST_TRANSPORT:-}" ] && transports="tcp shm shm+tcp"
for t in $transports; do
	ranks=${FR_TEST_RANKS:-2 3 5 8}
	[ "$t" != tcp ] && ranks=${FR_TEST_RANKS:-3 8}
	for n in $ranks; do
		run "revoke n=$n ($t)" \
			frrun -n "$n" --transport "$t" --timeout 300 "$X" revoke
	done
done
run "revoke n=4 progress thread ($TRANSPORT)" \
	frrun -n 4 -e FR_PROGRESS=thread --transport "$TRANSPORT" --timeout 300 "$X" revoke
finish
