"""The model-parallel examples over the torch.distributed backend
(examples/torch/): tensor parallel x data parallel on 4 ranks (2 x 2) and
the two-stage GPipe pipeline on 2 ranks and, data-parallel, on 4.  Each
rank checks its weights against the model trained in one process and prints
"OK <example> rank R"; every rank must.

The C++ extension is compiled once per session into FASTREDUCE_TORCH_BUILD
before the workers start, by test_backend.py's fixture."""

import glob
import os
import tempfile

import pytest

from conftest import TOP, launch, ranks_to_test

torch = pytest.importorskip("torch")

from test_backend import extension  # noqa: E402,F401  the C++ extension, built once

EXAMPLES = os.path.join(TOP, "examples", "torch")


@pytest.fixture(scope="module", autouse=True)
def example_stores(extension):  # noqa: F811  (after the extension's setup)
    yield
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
