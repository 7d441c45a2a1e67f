"""The fastreduce package against numpy references, 1-4 processes, with
and without the progress thread (api_worker.py does the checking), plus
single-process checks of argument handling."""

import os

import numpy as np
import pytest

from conftest import launch, ranks_to_test

import fastreduce as fr


@pytest.mark.parametrize("n", ranks_to_test([1, 2, 3, 4]))
@pytest.mark.parametrize("progress", ["caller", "thread"])
def test_collectives_match_numpy(n, progress):
    p = launch(n, "api_worker.py", progress)
    assert p.returncode == 0, p.stdout
    assert "api_worker: %d ranks" % n in p.stdout


def test_version_and_errors():
    assert fr.version() == fr.__version__
    assert fr.version().count(".") == 2
    assert fr.errname(fr.ETIMEDOUT) == "FR_ETIMEDOUT"
    assert "timed out" in fr.strerror(fr.ETIMEDOUT)
    e = fr.FastReduceError(fr.EPEER, "rank 1: peer rank 2 closed the connection")
    assert e.code == fr.EPEER and e.name == "FR_EPEER" and "rank 2" in str(e)


def test_bad_creation_arguments():
    with pytest.raises(ValueError, match="together"):
        fr.Comm(rank=0, size=2)
    with pytest.raises(fr.FastReduceError) as ei:
        fr.Comm(rank=0, size=2, rendezvous="no-port-here")
    assert ei.value.code == fr.EINVAL and "host:port" in ei.value.message
    with pytest.raises(fr.FastReduceError) as ei:
        fr.Comm(rank=3, size=2, rendezvous="127.0.0.1:1")
    assert ei.value.code == fr.EINVAL
    with pytest.raises(ValueError, match="algorithm"):
        fr.Comm(rank=0, size=1, rendezvous="127.0.0.1:1", algo="bogus")


def test_no_launcher_environment(monkeypatch):
    for v in list(os.environ):
        if v.startswith(("FR_", "OMPI_", "PMI_", "SLURM_")) or v in ("RANK", "WORLD_SIZE"):
            monkeypatch.delenv(v, raising=False)
    with pytest.raises(fr.FastReduceError) as ei:
        fr.Comm()
    assert ei.value.message  # says which variables it looked for


def test_single_rank_and_closed_comm():
    c = fr.Comm(rank=0, size=1, rendezvous="127.0.0.1:1")
    assert (c.rank, c.size) == (0, 1)
    x = np.arange(5, dtype=np.float32)
    assert c.allreduce(x, "max") is x
    assert list(x) == [0, 1, 2, 3, 4]
    req = c.iallreduce(x)
    c.close()
    with pytest.raises(fr.FastReduceError):
        req.wait()
    with pytest.raises(ValueError, match="closed"):
        c.allreduce(x)
    c.close()  # twice is fine


def test_dtype_mapping():
    from fastreduce._buffers import view, dtype_of

    assert dtype_of("torch.bfloat16") == fr.DType.BFLOAT16
    assert dtype_of(np.dtype("float16")) == fr.DType.FLOAT16
    assert dtype_of("bf16") == fr.DType.BFLOAT16
    with pytest.raises(ValueError, match="unsupported dtype"):
        dtype_of("complex64")
    v = view(np.zeros((3, 4), np.uint16), dtype="bfloat16")
    assert (v.count, v.dtype) == (12, fr.DType.BFLOAT16)
    v = view(bytearray(16), dtype="float32")
    assert (v.count, v.dtype) == (4, fr.DType.FLOAT32)
    with pytest.raises(ValueError, match="uint16|dtype"):
        view(np.zeros(3, np.uint16))
    with pytest.raises(ValueError, match="read-only"):
        view(memoryview(b"abcd"), dtype="uint8")


ENV_WORKER = r"""
import numpy as np, fastreduce as fr
c = fr.Comm()
x = np.full(4, c.rank + 1, np.float32)
c.allreduce(x)
assert (x == c.size * (c.size + 1) / 2).all(), x
try:
    import torch, torch.distributed as dist
    import fastreduce.torch as frt
except ImportError:
    torch = None
if torch is not None:
    frt.init_process_group()
    t = torch.ones(3)
    dist.all_reduce(t)
    assert t.tolist() == [c.size] * 3
    dist.destroy_process_group()
print("env-ok", c.rank, c.size)
c.close()
"""


def _free_port_pair():
    """A port p with p + 1 free too: the rendezvous and torch's store take
    MASTER_PORT and MASTER_PORT + 1 (torchrun), or the other way round.
    Both are bound at once, so neither is a listener's at this moment; one
    may still be taken before the workers bind it (another test running in
    parallel), which the caller sees and retries."""
    import socket

    for _ in range(100):
        a, b = socket.socket(), socket.socket()
        try:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
            if p >= 65535:
                continue
            b.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
        finally:
            a.close()
            b.close()
    raise RuntimeError("no two adjacent free ports on 127.0.0.1")


def _run_workers(launcher, n, port):
    """Start the n workers by hand; (returncodes, outputs).  A worker still
    running after 120 s is killed (its output says where it stood)."""
    import subprocess
    import sys

    procs = []
    for r in range(n):
        env = {k: v for k, v in os.environ.items() if not k.startswith("FR_")}
        if launcher == "torchrun":
            env.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                       LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port))
        else:
            env.update(OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(n),
                       OMPI_COMM_WORLD_LOCAL_RANK=str(r), FR_RENDEZVOUS="127.0.0.1:%d" % port,
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port + 1))
        env["FR_TIMEOUT_MS"] = "30000"
        env["PYTHONPATH"] = os.path.join(os.path.dirname(os.path.dirname(
            os.path.dirname(os.path.abspath(__file__)))), "python")
        procs.append(subprocess.Popen([sys.executable, "-c", ENV_WORKER], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=120)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            outs.append(p.communicate()[0] + "\n[killed after 120 s]")
    return [p.wait() for p in procs], outs


@pytest.mark.parametrize("launcher", ["torchrun", "openmpi"])
def test_launcher_environment(launcher):
    """Comm() and init_process_group() from the variables torchrun or Open
    MPI set (Debian's torchrun itself cannot start processes, see README),
    without frrun: every process started here by hand."""
    n = 3
    # A port taken between our check and the workers' bind (by a test
    # running alongside) fails the run with "in use": try again on others.
    for attempt in range(3):
        codes, outs = _run_workers(launcher, n, _free_port_pair())
        if all(c == 0 for c in codes) or not any("in use" in o for o in outs):
            break
    for r, (c, o) in enumerate(zip(codes, outs)):
        assert c == 0, "rank %d:\n%s" % (r, "\n".join(outs))
        assert "env-ok %d %d" % (r, n) in o, o
