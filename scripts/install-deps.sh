#!/bin/sh
# Install what building and testing libfastreduce needs on Debian 12 (root).
# Only missing packages are installed; a second run is quick.  python3-torch
# (Debian's PyTorch 1.13, CPU) is for the DDP hook and its tests; the
# fastreduce package itself needs only python3.  mpich and openmpi-bin:
# the launcher tests (ranks started by mpiexec without FR_RENDEZVOUS);
# libpmix-dev: the rendezvous through PMIx (configure --with-pmix), and
# libopenmpi-dev (mpicc) for its test with MPI in the same process.
# clang and libclang-rt-14-dev: libFuzzer, for `make fuzz` and CI's smoke.
# libtorch-dev and pybind11-dev: the torch.distributed backend's C++
# extension (python/fastreduce/csrc), compiled against python3-torch.
set -e
PKGS="build-essential autoconf automake libtool pkg-config libcmocka-dev
libibverbs-dev librdmacm-dev libhwloc-dev valgrind
python3 python3-numpy python3-pytest python3-torch mpich openmpi-bin
libpmix-dev libopenmpi-dev
clang libclang-rt-14-dev libtorch-dev pybind11-dev"
missing=""
for p in $PKGS; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" ||
		missing="$missing $p"
done
if [ -n "$missing" ]; then
	echo "install-deps: installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# shellcheck disable=SC2086
	apt-get install -y -qq --no-install-recommends $missing
fi
