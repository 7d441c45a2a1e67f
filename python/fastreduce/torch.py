"""PyTorch DistributedDataParallel with libfastreduce for the gradients.

DDP still needs a torch process group for its own setup (it broadcasts the
initial parameters and checks that every rank has the same model); Gloo
does that once.  Every gradient bucket then goes through libfastreduce::

    import torch, torch.distributed as dist
    import fastreduce.torch as frt

    frt.init_process_group()                      # Gloo, from the launcher's env
    model = torch.nn.parallel.DistributedDataParallel(net)
    state = frt.FastReduceState(compress="bf16")  # or None, "int8"
    model.register_comm_hook(state, frt.allreduce_hook)
    for x, y in loader:                           # train as usual
        opt.zero_grad(); loss_fn(model(x), y).backward(); opt.step()
    state.close()

The hook starts a non-blocking All-Reduce of the bucket (averaged, as DDP
expects) and returns a ``torch.futures.Future`` at once; the
communicator's progress thread moves the bucket while backward computes
the next one, and a completion thread fulfils the future.  Each bucket's
buffer is registered once (zero copy).  With compression, the residual of
each bucket is kept in the state (error feedback), so what the narrowing
drops is added back the next step.
"""

import os
import queue
import threading
from typing import Dict, Optional, Tuple, Union

import torch
import torch.distributed as dist

from . import Comm, FastReduceError, Mem
from . import backend as _backend
from .survive import Survivor, is_failure, joining
from .zero import ShardedDataParallel

_backend.register()  # torch.distributed's backend "fastreduce"

__all__ = ["FastReduceState", "ShardedDataParallel", "Survivor", "allreduce_hook",
           "init_process_group", "is_failure", "joining"]


def _launcher_rank_size() -> Tuple[int, int]:
    for r, n in (("FR_RANK", "FR_NRANKS"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                 ("PMI_RANK", "PMI_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"),
                 ("RANK", "WORLD_SIZE")):
        if r in os.environ and n in os.environ:
            return int(os.environ[r]), int(os.environ[n])
    raise RuntimeError("fastreduce.torch: no launcher environment (frrun, mpirun, "
                       "srun or RANK/WORLD_SIZE); pass rank= and world_size=")


def init_process_group(backend: str = "gloo", rank: Optional[int] = None,
                       world_size: Optional[int] = None,
                       init_method: Optional[str] = None, **kwargs) -> None:
    """Initialise torch.distributed (Gloo by default) for DDP's setup, from
    the same launcher environment as :class:`fastreduce.Comm`.

    The address is MASTER_ADDR:MASTER_PORT when set (torchrun, or by
    hand); otherwise, under frrun, FR_RENDEZVOUS's host and its port + 2
    (libfastreduce uses the port itself, torchrun's convention is +1).
    Under mpirun or srun without MASTER_ADDR, set MASTER_ADDR and
    MASTER_PORT (or pass init_method)."""
    if rank is None or world_size is None:
        r, n = _launcher_rank_size()
        rank = r if rank is None else rank
        world_size = n if world_size is None else world_size
    if init_method is None:
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if not (addr and port):
            rdv = os.environ.get("FR_RENDEZVOUS")
            if not rdv or ":" not in rdv:
                raise RuntimeError("fastreduce.torch: set MASTER_ADDR and MASTER_PORT "
                                   "(or FR_RENDEZVOUS) for torch's process group")
            addr, p = rdv.rsplit(":", 1)
            port = str(int(p) + 2)
        init_method = "tcp://%s:%s" % (addr, port)
    dist.init_process_group(backend, init_method=init_method, rank=rank,
                            world_size=world_size, **kwargs)


class FastReduceState:
    """State of :func:`allreduce_hook`: the communicator, the compression
    format and, per bucket, its registration and error-feedback residual.

    comm: a :class:`fastreduce.Comm`; None creates one from the launcher's
      environment with the progress thread on (the state then owns it).
    compress: None, "bf16", "fp16" or "int8" for float32 buckets (buckets
      of other dtypes go uncompressed).  Every rank must use the same.
    error_feedback: keep each bucket's residual (only with compress).
    """

    def __init__(self, comm: Optional[Comm] = None,
                 compress: Union[str, None] = None, error_feedback: bool = True):
        self._own = comm is None
        self.comm = comm if comm is not None else Comm(progress="thread")
        self.compress = None if compress in (None, "none") else compress
        self.error_feedback = bool(error_feedback)
        self._mems: Dict[int, Tuple[int, int, Mem]] = {}
        self._residuals: Dict[int, torch.Tensor] = {}
        self._queue: "queue.Queue" = queue.Queue()
        self._thread = threading.Thread(target=self._complete, name="fastreduce-hook",
                                        daemon=True)
        self._thread.start()
        self.buckets = 0  # buckets reduced so far, for tests and logs

    # The completion thread: waits for each bucket's All-Reduce in the order
    # they started (the library completes them in that order) and fulfils
    # its future.  fr_wait releases the GIL, so backward keeps running.
    def _complete(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            req, fut, tensor = item
            try:
                req.wait()
            except Exception as e:  # noqa: BLE001 - handed to DDP
                fut.set_exception(e)
            else:
                fut.set_result(tensor)

    def _register(self, index: int, tensor: torch.Tensor) -> None:
        # DDP keeps each bucket's flat buffer for the whole run (it
        # rebuilds the buckets once, after the first iteration): register
        # it once, and again only if the buffer changes.
        ptr, nbytes = tensor.data_ptr(), tensor.numel() * tensor.element_size()
        old = self._mems.get(index)
        if old is not None and old[0] == ptr and old[1] == nbytes:
            return
        if old is not None:
            old[2].deregister()
        self._mems[index] = (ptr, nbytes, self.comm.register(tensor))
        # A new buffer means DDP rebuilt its buckets: this index may now
        # hold other parameters, so its old residual does not apply.
        self._residuals.pop(index, None)

    def _residual(self, index: int, tensor: torch.Tensor) -> Optional[torch.Tensor]:
        if not (self.compress and self.error_feedback):
            return None
        r = self._residuals.get(index)
        if r is None or r.numel() != tensor.numel():
            r = torch.zeros(tensor.numel(), dtype=torch.float32)
            self._residuals[index] = r
        return r

    def close(self) -> None:
        """Stop the completion thread, release registrations and, if the
        state created it, the communicator."""
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join()
        self._thread = None
        for _, _, m in self._mems.values():
            m.deregister()
        self._mems.clear()
        if self._own:
            self.comm.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass


def allreduce_hook(state: FastReduceState,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket's gradients over all
    ranks with libfastreduce (compressed if the state says so).  Register
    with ``ddp_model.register_comm_hook(state, allreduce_hook)``."""
    tensor = bucket.buffer()
    if not tensor.is_contiguous():
        # DDP's flat bucket buffers are contiguous; a copy here would be
        # reduced and never written back.
        raise ValueError("fastreduce.torch: bucket %d is not contiguous" % bucket.index())
    index = bucket.index()
    state._register(index, tensor)
    compress = state.compress if tensor.dtype == torch.float32 else None
    residual = state._residual(index, tensor) if compress else None
    fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    try:
        req = state.comm.iallreduce(tensor, "avg", compress=compress, residual=residual)
    except FastReduceError as e:
        fut.set_exception(e)
        return fut
    state.buckets += 1
    state._queue.put((req, fut, tensor))
    return fut
