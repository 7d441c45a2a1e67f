#!/bin/bash
# The Python package (python/fastreduce) and its PyTorch DDP hook: pytest
# over tests/python with the library of this build (api_worker.py on 1-4
# ranks, DDP training on 2 and 4).  Without numpy or pytest it skips (77),
# unless FR_PY_TESTS=1 (CI), where a skip is a failure; without torch the
# DDP tests skip inside pytest (the same rule applies).
. "$(dirname "$0")/lib.sh"
top=$(cd "$(dirname "$0")/.." && pwd)
# A sanitizer runtime must be loaded first, which a python3 process cannot
# arrange for a library it opens later: those builds run the C suite only.
if ldd "$B/.libs/libfastreduce.so" 2>/dev/null | grep -q 'lib[at]san'; then
	echo "SKIP: sanitizer build (the Python tests run in the plain build)"
	exit 77
fi
PY=${PYTHON:-/usr/bin/python3}
[ -x "$PY" ] || PY=$(command -v python3)
need="numpy pytest"
[ "${FR_PY_TESTS:-0}" = 1 ] && need="$need torch"
for m in $need; do
	if ! "$PY" -c "import $m" 2>/dev/null; then
		echo "SKIP: $PY cannot import $m (apt-get install python3-$m)"
		[ "${FR_PY_TESTS:-0}" = 1 ] && exit 1
		exit 77
	fi
done
export FASTREDUCE_LIB="$B/.libs/libfastreduce.so"
export FR_BUILDDIR="$B"
# Bytecode caches stay out of the (possibly read-only) source tree.
export PYTHONDONTWRITEBYTECODE=1
cd "$top/tests/python" || exit 1
# FR_PY_TEST_FILES: which test files or tests (pytest's FILE::TEST; default:
# all); distcheck runs the package's API and the backend built from the
# tarball running the collectives, not the training runs, which the plain
# build has run already
# shellcheck disable=SC2086
exec "$PY" -m pytest -q -p no:cacheprovider -rs --durations=10 "$@" ${FR_PY_TEST_FILES:-.}
