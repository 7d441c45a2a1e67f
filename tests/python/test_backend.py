"""The torch.distributed backend "fastreduce" (backend_worker.py): every
collective against a reference on 1-4 ranks, async work and futures, errors
that carry the code and the rank, DDP with no Gloo against DDP over Gloo
(also with find_unused_parameters, gradient_as_bucket_view, no_sync and
without broadcast_buffers), ZeroRedundancyOptimizer against the same over
Gloo, and a dead rank turned into an error on the others within the timeout.

The C++ extension is compiled once per session into a temporary cache
directory (FASTREDUCE_TORCH_BUILD), before the workers start, so that no
two ranks compile it at once."""

import glob
import os
import subprocess
import sys
import tempfile

import pytest

from conftest import TOP, launch, ranks_to_test

torch = pytest.importorskip("torch")


def _headers():
    inc = os.path.join(os.path.dirname(torch.__file__), "include", "torch", "csrc",
                       "distributed", "c10d", "ProcessGroup.hpp")
    return os.path.exists(inc)  # a dangling link without libtorch-dev


@pytest.fixture(scope="module", autouse=True)
def extension(tmp_path_factory):
    if not _headers():
        if os.environ.get("FR_PY_TESTS") == "1":
            pytest.fail("torch's C++ headers are missing: apt-get install libtorch-dev pybind11-dev")
        pytest.skip("torch's C++ headers are missing (apt-get install libtorch-dev pybind11-dev)")
    build = os.environ.get("FASTREDUCE_TORCH_BUILD") or str(tmp_path_factory.mktemp("torch-ext"))
    os.environ["FASTREDUCE_TORCH_BUILD"] = build
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(TOP, "python") + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c",
                        "import fastreduce.backend as b; b.build_extension(); print('built')"],
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=900)
    assert p.returncode == 0 and "built" in p.stdout, p.stdout
    yield build
    # the workers' file stores (a rank that leaves with os._exit keeps its)
    for f in glob.glob(os.path.join(tempfile.gettempdir(), "fr_backend_store_*")):
        try:
            os.remove(f)
        except OSError:
            pass


def ok(p, case, n):
    assert p.returncode == 0, p.stdout
    for r in range(n):
        assert ("OK %s rank %d" % (case, r)) in p.stdout, p.stdout


@pytest.mark.parametrize("n", ranks_to_test([1, 2, 3, 4]))
def test_collectives(n):
    ok(launch(n, "backend_worker.py", "colls"), "colls", n)


@pytest.mark.parametrize("n", ranks_to_test([2, 3]))
def test_async_and_errors(n):
    ok(launch(n, "backend_worker.py", "async"), "async", n)


@pytest.mark.parametrize("n", ranks_to_test([2, 4]))
def test_ddp_without_gloo(n):
    ok(launch(n, "backend_worker.py", "ddp"), "ddp", n)


@pytest.mark.parametrize("n", ranks_to_test([1, 2, 3, 4]))
def test_new_group_is_a_split(n):
    ok(launch(n, "backend_worker.py", "groups"), "groups", n)


@pytest.mark.parametrize("n", ranks_to_test([1, 2, 3]))
def test_completion_order(n):
    ok(launch(n, "backend_worker.py", "order"), "order", n)


@pytest.mark.parametrize("n", ranks_to_test([1, 3]))
def test_compression(n):
    ok(launch(n, "backend_worker.py", "compress"), "compress", n)


def test_dead_rank_raises():
    n = 3
    p = launch(n, "backend_worker.py", "dead", env={"FR_TIMEOUT_MS": "5000"}, timeout=120)
    for r in range(n - 1):
        assert ("OK dead rank %d" % r) in p.stdout, p.stdout


@pytest.mark.parametrize("n", ranks_to_test([2, 3]))
def test_ddp_options_without_gloo(n):
    ok(launch(n, "backend_worker.py", "ddp_variants"), "ddp_variants", n)


@pytest.mark.parametrize("n", ranks_to_test([2, 3]))
def test_zero_redundancy_optimizer(n):
    ok(launch(n, "backend_worker.py", "zero_optim"), "zero_optim", n)


# The pure-Python process group (fastreduce/pg_python.py): the same cases,
# asked for by FASTREDUCE_TORCH_PG=python (compression is the C++ one's)
PURE = {"FASTREDUCE_TORCH_PG": "python"}


@pytest.mark.parametrize("case,n", [("colls", 1), ("colls", 3), ("async", 2), ("ddp", 2),
                                    ("groups", 3), ("order", 3), ("ddp_variants", 2),
                                    ("zero_optim", 3)])
def test_pure_python_backend(case, n):
    ok(launch(n, "backend_worker.py", case, env=PURE), case, n)


def test_pure_python_dead_rank_raises():
    n = 3
    p = launch(n, "backend_worker.py", "dead", env=dict(PURE, FR_TIMEOUT_MS="5000"),
               timeout=120)
    for r in range(n - 1):
        assert ("OK dead rank %d" % r) in p.stdout, p.stdout


def test_fallback_when_the_extension_cannot_build(tmp_path):
    """Where the extension cannot be built (here: its build directory
    cannot be made), the backend warns and uses the pure-Python group."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = {"FASTREDUCE_TORCH_BUILD": str(blocker / "build")}
    p = launch(2, "backend_worker.py", "colls", env=env)
    ok(p, "colls", 2)
    assert "using the pure-Python one" in p.stdout, p.stdout


@pytest.mark.parametrize("pg", ["cpp", "python"])
def test_dead_rank_in_ddp_raises(pg):
    n = 3
    p = launch(n, "backend_worker.py", "dead_ddp",
               env={"FR_TIMEOUT_MS": "5000", "FASTREDUCE_TORCH_PG": pg}, timeout=120)
    for r in range(n - 1):
        assert ("OK dead_ddp rank %d" % r) in p.stdout, p.stdout
