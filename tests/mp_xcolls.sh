#!/bin/bash
# Point-to-point, and reduce, all-to-all, all-to-allv, all-gatherv and
# reduce-scatterv on 1..8
# ranks (FR_TEST_RANKS), every dtype x op, counts 0, 1, fewer than the
# ranks, primes and a large odd one, in and out of place, against the
# reference (tests/mp_xcolls.c); each algorithm forced; ranks whose counts
# or roots disagree get FR_EMISMATCH, a refused argument FR_EINVAL there and
# FR_EPEER elsewhere.  Over FR_TEST_TRANSPORT (tcp by default); shm and
# shm+tcp too unless FR_TEST_TRANSPORT is set (the verbs suite sets it).
. "$(dirname "$0")/lib.sh"
X="$B/tests/mp_xcolls"
export FR_TIMEOUT_MS=20000
transports=$TRANSPORT
[ -z "${FR_TEST_TRANSPORT:-}" ] && transports="tcp shm shm+tcp"
for t in $transports; do
	ranks=${FR_TEST_RANKS:-1 2 3 4 5 7 8}
	[ "$t" != tcp ] && ranks=${FR_TEST_RANKS:-2 3 6}
	for n in $ranks; do
		run "xcolls n=$n auto ($t)" \
			frrun -n "$n" --transport "$t" --timeout 900 "$X" check \
			${FR_TEST_XCOUNTS:+--counts "$FR_TEST_XCOUNTS"}
	done
done
# point-to-point: every size, tags, crossing a collective, to itself,
# registered buffers (tests/mp_xcolls.c, p2p)
for t in $transports; do
	ranks=${FR_TEST_RANKS:-1 2 3 4 5 8}
	[ "$t" != tcp ] && ranks=${FR_TEST_RANKS:-2 3 5}
	for n in $ranks; do
		run "p2p n=$n ($t)" \
			frrun -n "$n" --transport "$t" --timeout 900 "$X" p2p
	done
done
run "p2p n=3 eager=128B (rendezvous for nearly all)" \
	frrun -n 3 -e FR_EAGER_BYTES=128 --transport "$TRANSPORT" --timeout 900 "$X" p2p
run "p2p n=3 progress thread" \
	frrun -n 3 -e FR_PROGRESS=thread --transport "$TRANSPORT" --timeout 900 "$X" p2p
# each algorithm forced, small and large counts
for algo in tree ring pairwise bruck; do
	for n in ${FR_TEST_XALGO_RANKS:-3 6 8}; do
		run "xcolls n=$n $algo ($TRANSPORT)" \
			frrun -n "$n" -e FR_ALGO=$algo --transport "$TRANSPORT" \
			--timeout 900 "$X" check --counts 0,1,$((n - 1)),13,7919
	done
done
run "xcolls n=5 eager=128B (many fragments)" \
	frrun -n 5 -e FR_EAGER_BYTES=128 --transport "$TRANSPORT" \
	--timeout 900 "$X" check --counts 0,3,1001
# (FR_TEST_SHORT, lib.sh: on 3 ranks only; what a mismatch is and how it
# is told sits above the transport)
mm_ranks="2 3 5"
[ "$SHORT" = 1 ] && mm_ranks=3
for n in $mm_ranks; do
	for what in a2av a2av1 agv root refuse p2pcount p2pdie; do
		# ranks that wait for each other in a circle (two that each
		# take themselves for the root, a chain) send nothing: only
		# the timeout ends that (fr_reduce(3)); the binomial tree's
		# leaves always send
		[ "$what" = root ] && [ "$n" = 2 ] && continue
		run "xcolls mismatch $what n=$n" \
			frrun -n "$n" -e FR_ALGO=tree --transport "$TRANSPORT" --timeout 60 "$X" mismatch --victim $((n - 1)) --what $what
	done
done
# a peer that answers PINGs (progress thread) but sends after longer than
# the timeout: the receive waits for it
run "p2p: late but alive peer n=2" \
	frrun -n 2 -e FR_TIMEOUT_MS=3000 -e FR_PROGRESS=thread --transport "$TRANSPORT" \
	--timeout 60 "$X" mismatch --victim 1 --what p2plate
# a peer that stays alive but never calls the library: FR_ETIMEDOUT
run "p2p: stalled peer n=2" \
	frrun -n 2 -e FR_TIMEOUT_MS=5000 --transport "$TRANSPORT" --timeout 60 \
	"$X" mismatch --victim 1 --what p2pstall
finish
