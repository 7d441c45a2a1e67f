"""Training that survives (fastreduce.torch.Survivor; survive_worker.py):
a rank is killed (SIGKILL) at a random moment of a DDP training run; the
survivors agree, shrink, redo the step and must end with parameters
bit-identical to a clean run with the same sequence of ranks (the victim
leaving cleanly at the step they redid).  With a newcomer (frrun --respawn,
grow=True) they re-admit it and redo the step with all ranks: the clean run
is then the one nothing happened to."""

import random
import re

import pytest

from conftest import launch

torch = pytest.importorskip("torch")

from test_backend import extension  # noqa: E402,F401  the C++ extension, built once

N, STEPS = 4, 40


def finals(out):
    return re.findall(r"FINAL rank=(\d+) size=(\d+) recoveries=(\d+) hash=(\w+)", out)


@pytest.mark.parametrize("grow", [False, True], ids=["shrink", "grow"])
def test_kill_and_go_on(extension, grow):  # noqa: F811
    v, ks, us = random.randrange(N), random.randrange(3, STEPS - 5), random.randrange(3000)
    args = [STEPS, "--kill", v, ks, us] + (["--grow"] if grow else [])
    p = launch(N, "survive_worker.py", *args, env={"FR_TIMEOUT_MS": "10000"},
               frrun_args=["--respawn", "1"] if grow else ["--keep-going"])
    what = "rank %d killed %d us into step %d:\n%s" % (v, us, ks, p.stdout)
    f = finals(p.stdout)
    want = N if grow else N - 1
    assert len(f) == want, what
    assert {x[1] for x in f} == {str(want)}, what
    assert {x[2] for x in f} == {"1"}, what
    hashes = {x[3] for x in f}
    assert len(hashes) == 1, what
    redo = re.findall(r"step (\d+) failed", p.stdout)
    assert redo, what
    if grow:
        assert "1 newcomer joined" in p.stdout, what
        clean = launch(N, "survive_worker.py", STEPS)
    else:
        clean = launch(N, "survive_worker.py", STEPS, "--drop", v, redo[0])
    cf = finals(clean.stdout)
    assert clean.returncode == 0 and len(cf) == want, clean.stdout
    assert {x[3] for x in cf} == hashes, what + "\nclean run:\n" + clean.stdout
