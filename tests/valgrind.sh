#!/bin/bash
# valgrind (memcheck, leaks) over the unit tests and a small multi-process
# matrix of a build tree ($1, default ./build).  Prints N passed, N failed.
set -u
B=$(cd "${1:-build}" && pwd)
VG="valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite --quiet"
# The checks run as many at a time as there are CPUs (FR_VALGRIND_JOBS):
# each is one process under valgrind, or a job of a few, and memcheck runs
# a process's threads one at a time.  A check's output is kept and printed
# in order once all have run; a failed one's last lines with it.
par=${FR_VALGRIND_JOBS:-$(nproc 2>/dev/null || echo 1)}
[[ "$par" =~ ^[1-9][0-9]*$ ]] || { echo "FR_VALGRIND_JOBS=$par is not a count >= 1" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
names=()
check() {
	local id=${#names[@]}
	names+=("$1")
	shift
	while [ "$(jobs -rp | wc -l)" -ge "$par" ]; do
		wait -n || true
	done
	{
		timeout 900 "$@" >"$tmp/$id.out" 2>&1
		echo $? >"$tmp/$id.rc"
	} &
}
# alone, after the others: its peers' patience is timed (FR_TIMEOUT_MS)
check_alone() {
	wait
	par=1 check "$@"
	wait
}
for t in "$B"/tests/test_*; do
	case "$t" in *.o | *.log | *.trs) continue ;; esac
	[ -x "$t" ] || continue
	check "$(basename "$t")" "$B/libtool" --mode=execute $VG "$t"
done
check "mp_allreduce matrix n=3" "$B/frrun" -n 3 --timeout 900 \
	"$B/libtool" --mode=execute $VG "$B/tests/mp_allreduce" matrix \
	--counts 0,1,2,1001 --dtypes f32,f16,bf16,i64,u8 --ops sum,min,avg
for algo in rd rabenseifner tree; do
	check "mp_allreduce matrix n=5 $algo" "$B/frrun" -n 5 -e FR_ALGO=$algo --timeout 900 \
		"$B/libtool" --mode=execute $VG "$B/tests/mp_allreduce" matrix \
		--counts 0,1,3,1001 --dtypes f32,bf16,u8 --ops sum,avg
done
check "mp_allreduce colls n=3" "$B/frrun" -n 3 --timeout 900 \
	"$B/libtool" --mode=execute $VG "$B/tests/mp_allreduce" colls --counts 0,1,1001
check "mp_allreduce colls n=4 on 2 nodes (hier)" "$B/frrun" -n 4 -e FR_ALGO=hier --timeout 900 \
	"$B/libtool" --mode=execute $VG "$B/tests/mp_allreduce" colls --ranks-per-node 2 \
	--counts 0,1,1001
check "mp_allreduce compress n=3" "$B/frrun" -n 3 --timeout 900 \
	"$B/libtool" --mode=execute $VG "$B/tests/mp_allreduce" compress --counts 0,1,257,4099
check "mp_allreduce buckets n=3 progress=thread" "$B/frrun" -n 3 -e FR_PROGRESS=thread \
	--timeout 900 "$B/libtool" --mode=execute $VG "$B/tests/mp_allreduce" buckets \
	--count 20011 --iters 3
check "mp_allreduce threads n=2" "$B/frrun" -n 2 -e FR_PROGRESS=thread --timeout 900 \
	"$B/libtool" --mode=execute $VG "$B/tests/mp_allreduce" threads --count 101 --iters 20
check_alone "mp_allreduce mismatch n=3" env FR_TIMEOUT_MS=20000 "$B/frrun" -n 3 --timeout 300 \
	"$B/libtool" --mode=execute $VG "$B/tests/mp_allreduce" mismatch --victim 2 --what count
wait
pass=0 fail=0
for id in "${!names[@]}"; do
	if [ "$(cat "$tmp/$id.rc" 2>/dev/null)" = 0 ]; then
		pass=$((pass + 1))
		echo "PASS valgrind ${names[$id]}"
	else
		fail=$((fail + 1))
		echo "FAIL valgrind ${names[$id]} (exit $(cat "$tmp/$id.rc" 2>/dev/null))"
		# CMocka's failures and valgrind's reports, wherever they are,
		# then the end
		grep -n -B2 -A4 -E '^\[  (ERROR|FAILED) +\]|^ERROR: |^==[0-9]+==' "$tmp/$id.out" | head -n 80
		echo "--- the last lines:"
		tail -n 40 "$tmp/$id.out"
	fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
