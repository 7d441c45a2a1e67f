"""Sharded data parallelism (fastreduce.torch.ShardedDataParallel, ZeRO
stage 2; zero_worker.py) against DDP with the whole optimizer over the same
backend: the same parameters and optimizer state within float tolerance,
1/n of the optimizer state per rank, no full gradients kept, checkpoints
that restore exactly; Adam and SGD with momentum, on 1-4 ranks."""

import pytest

from conftest import launch, ranks_to_test

torch = pytest.importorskip("torch")

from test_backend import extension  # noqa: E402,F401  the C++ extension, built once


@pytest.mark.parametrize("kind", ["adam", "sgd"])
@pytest.mark.parametrize("n", ranks_to_test([1, 2, 3, 4]))
def test_sharded_matches_ddp(n, kind):
    p = launch(n, "zero_worker.py", kind)
    assert p.returncode == 0, p.stdout
    for r in range(n):
        assert ("OK zero %s rank %d" % (kind, r)) in p.stdout, p.stdout
