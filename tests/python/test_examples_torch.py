"""The model-parallel examples over the torch.distributed backend
(examples/torch/): tensor parallel x data parallel on 4 ranks (2 x 2) and
the two-stage GPipe pipeline on 2 ranks and, data-parallel, on 4.  Each
rank checks its weights against the model trained in one process and prints
"OK <example> rank R"; every rank must.

As in test_backend.py, the C++ extension is compiled once per session into
FASTREDUCE_TORCH_BUILD before the workers start."""

import glob
import os
import subprocess
import sys
import tempfile

import pytest

from conftest import TOP, launch, ranks_to_test

torch = pytest.importorskip("torch")

EXAMPLES = os.path.join(TOP, "examples", "torch")


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
    # the examples' file stores, fr_example_store_<frrun's pid>_<port>, that
    # a failed rank left behind: those of frruns that are gone (another
    # session's may be in use)
    for f in glob.glob(os.path.join(tempfile.gettempdir(), "fr_example_store_*_*")):
        try:
            os.kill(int(os.path.basename(f).split("_")[3]), 0)
        except ProcessLookupError:
            try:
                os.remove(f)
            except OSError:
                pass
        except (ValueError, OSError):
            pass


def run_example(n, name):
    # launch() joins its script to tests/python/; an absolute path replaces it
    p = launch(n, os.path.join(EXAMPLES, name + ".py"), timeout=300)
    assert p.returncode == 0, p.stdout
    for r in range(n):
        assert ("OK %s rank %d" % (name, r)) in p.stdout, p.stdout


@pytest.mark.parametrize("n", ranks_to_test([4]))
def test_tensor_parallel_x_data_parallel(n):
    run_example(n, "tp_dp")


@pytest.mark.parametrize("n", ranks_to_test([2, 4]))
def test_pipeline(n):
    run_example(n, "pipeline")
