"""Data-parallel training that survives failed ranks (``fastreduce.torch.Survivor``).

A rank that dies (``kill -9``, a lost node) makes the survivors' collectives
fail with FR_EPEER (or FR_ETIMEDOUT) instead of ending the job.  The
:class:`Survivor` wrapper catches that in its :meth:`Survivor.step` and::

    1. agrees with the survivors (fr_comm_agree) on how many steps each has
       applied: one whose last All-Reduce of step K completed before the
       failure reached it has applied K and failed in K + 1, so the counts
       differ by one at most (each passes bits K and K + 1 of its count;
       their AND says which);
    2. shrinks the process group to the survivors (fr_comm_shrink) and,
       with ``grow=True``, re-admits as many newcomers as ranks failed
       (fr_comm_grow; ``frrun --respawn N`` starts them with FR_JOIN=1);
    3. rolls back the step some applied and others not (a copy of the model
       and optimizer state from before the last update), wraps the model in
       a new DistributedDataParallel over the new group (which sends rank
       0's parameters to a newcomer; the optimizer state and the step go by
       broadcast), and redoes the step.

Use::

    import fastreduce.torch as frt
    if not frt.joining():                      # a newcomer has no world to join
        dist.init_process_group("fastreduce")
    sv = frt.Survivor(model, optimizer, grow=True)
    step = sv.start_step                       # 0, or where a newcomer starts
    while step < steps:
        step = sv.step(step, closure)          # closure(ddp, rank, size, step)

``closure`` runs the forward and backward pass of step ``step`` on this
rank's shard (``rank`` of ``size``) through ``ddp`` (the current
DistributedDataParallel) and returns the loss; ``step`` then applies the
optimizer and returns ``step + 1``, or, after a recovery, the step to redo.
Every call must be on every rank.  Costs: a copy of the model's and the
optimizer's state per step (for the roll back).

The process group must be "fastreduce"'s (the C++ one or the pure-Python
one).  After the first recovery the default group is gone (destroyed):
use :attr:`Survivor.pg`.  Newcomers meet the survivors' rank 0 at
FR_GROW_RENDEZVOUS, which this module sets, where unset, to the launcher's
rendezvous address (FR_RENDEZVOUS under frrun, else MASTER_ADDR and
MASTER_PORT + 1) on every process, so that both sides look in one place,
and must present the group's job token: the backend takes FR_JOB_TOKEN for
it where set (frrun sets it; elsewhere set it on every process, newcomers
too).
"""

import copy
import io
import os
import sys
from typing import Callable, List, Optional

import torch
import torch.distributed as dist

from . import backend as _backend

__all__ = ["Survivor", "joining", "is_failure"]

# the library's codes that mean "a rank failed", in their text
_FAILURES = ("FR_EPEER", "FR_ETIMEDOUT", "FR_EREVOKED")
_MAX_ROUNDS = 8


def joining() -> bool:
    """Whether this process is a newcomer (FR_JOIN=1: frrun --respawn)."""
    return os.environ.get("FR_JOIN", "") not in ("", "0")


def is_failure(e: BaseException) -> bool:
    """Whether e says a rank failed (a collective of fastreduce's)."""
    s = str(e)
    return "fastreduce" in s and any(c in s for c in _FAILURES) or \
        getattr(e, "name", None) in _FAILURES


def _grow_address() -> Optional[str]:
    if os.environ.get("FR_GROW_RENDEZVOUS"):
        return os.environ["FR_GROW_RENDEZVOUS"]
    if os.environ.get("FR_RENDEZVOUS"):
        return os.environ["FR_RENDEZVOUS"]
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        a = os.environ["MASTER_ADDR"]
        return ("[%s]:%d" if ":" in a else "%s:%d") % (a, int(os.environ["MASTER_PORT"]) + 1)
    return None


class Survivor:
    """See the module's docstring.

    model, optimizer: this rank's; pg: the process group (None: the default
    group, or, in a newcomer, one it joins); grow: re-admit newcomers after
    a shrink; ddp_kwargs: for DistributedDataParallel; log: where to say
    what happened (rank 0 of the new group says it; None: silent)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 pg=None, grow: bool = False, ddp_kwargs: Optional[dict] = None,
                 log=sys.stdout):
        self.model = model
        self.optimizer = optimizer
        self.grow = grow
        self.ddp_kwargs = dict(ddp_kwargs or {})
        self.log = log
        self.recoveries = 0
        self.start_step = 0
        self._prev = None  # (model state, optimizer state) before the last update
        addr = _grow_address()
        if addr:
            os.environ["FR_GROW_RENDEZVOUS"] = addr
        if joining():
            impl = _backend._implementation()
            if impl is None:
                from .pg_python import ProcessGroupFastReducePy as impl_cls
            else:
                impl_cls = impl.ProcessGroupFastReduce
            timeout = int(os.environ.get("FR_TIMEOUT_MS", "0") or 0)
            pg = impl_cls.join(timeout, os.environ.get("FR_TRANSPORT", ""))
            self.size0 = pg.size()
            self._adopt(pg)
            self.start_step = self._share_state(0)
            self.recoveries = self._recoveries_shared
            self._say("joined as rank %d of %d at step %d" %
                      (pg.rank(), pg.size(), self.start_step), everyone=True)
        else:
            if pg is None:
                pg = dist.distributed_c10d._get_default_group()
            if not hasattr(pg, "agree"):
                raise TypeError("fastreduce.torch.Survivor: the process group must be "
                                "fastreduce's (init_process_group(\"fastreduce\"))")
            self.size0 = pg.size()
            self._adopt(pg)

    # ---- the group and the model over it --------------------------------
    @property
    def rank(self) -> int:
        return self.pg.rank()

    @property
    def size(self) -> int:
        return self.pg.size()

    def _adopt(self, pg) -> None:
        self.pg = pg
        self.ddp = torch.nn.parallel.DistributedDataParallel(
            self.model, process_group=pg, **self.ddp_kwargs)

    def _say(self, msg: str, everyone: bool = False) -> None:
        if self.log is not None and (everyone or self.rank == 0):
            print("fastreduce.survive: " + msg, file=self.log, flush=True)

    # ---- one step ------------------------------------------------------------
    def step(self, step: int, closure: Callable) -> int:
        """Run step ``step`` (closure: forward and backward through
        self.ddp), apply the optimizer; return the next step to run: step +
        1, or the one to redo after a recovery."""
        try:
            self.optimizer.zero_grad()
            closure(self.ddp, self.rank, self.size, step)
        except RuntimeError as e:
            if not is_failure(e):
                raise
            return self._recover(step, e)
        self._prev = (copy.deepcopy(self.model.state_dict()),
                      copy.deepcopy(self.optimizer.state_dict()))
        self.optimizer.step()
        return step + 1

    # ---- recovery ------------------------------------------------------------
    def _recover(self, step: int, why: BaseException) -> int:
        """Step ``step`` failed here (so this rank has applied step - 1)."""
        self.recoveries += 1
        if self.recoveries > _MAX_ROUNDS:
            raise RuntimeError("fastreduce.survive: too many failures") from why
        lo, hi = 1 << (step % 32), 1 << ((step + 1) % 32)
        _, f, failed = self.pg.agree(lo | hi)
        if f not in (lo | hi, lo, hi):
            raise RuntimeError("fastreduce.survive: ranks more than a step apart "
                               "(0x%x)" % f) from why
        redo = step
        if f == lo:  # the others failed in step - 1, which this rank applied
            if self._prev is None:
                raise RuntimeError("fastreduce.survive: no state to roll back to") from why
            self.model.load_state_dict(self._prev[0])
            self.optimizer.load_state_dict(self._prev[1])
            redo = step - 1
        was = self.size
        new = self.pg.shrink()
        old, self.pg, self.ddp = self.pg, None, None
        # the default group (the job's first) cannot be used any more
        if dist.is_initialized() and dist.distributed_c10d._get_default_group() is old:
            dist.destroy_process_group()
        del old
        try:
            self._adopt(new)
            self._say("step %d failed: rank%s %s failed; going on with %d of %d ranks%s" %
                      (redo, "" if len(failed) == 1 else "s",
                       " ".join(str(r) for r in failed), self.size, was,
                       ", a step rolled back" if redo != step else ""))
            if self.grow and self.size < self.size0:
                redo = self._grow_back(redo)
        except RuntimeError as e:
            # a rank (a newcomer, say) failed during the recovery: all
            # here are at step redo now; recover again on the new group
            if not is_failure(e):
                raise
            return self._recover(redo, e)
        return redo

    def _grow_back(self, redo: int) -> int:
        """Re-admit size0 - size newcomers, all of them or none (the
        survivors agree on it), then send them the state."""
        nnew = self.size0 - self.size
        grown, ok = None, 1
        try:
            grown = self.pg.grow(nnew)
        except RuntimeError as e:
            ok = 0
            self._say("no newcomer joined (%s)" % str(e).splitlines()[0])
        _, f, _ = self.pg.agree(ok)
        if not f:
            del grown
            self._say("going on with %d ranks" % self.size)
            return redo
        old, self.pg, self.ddp = self.pg, None, None
        del old
        self._adopt(grown)
        self._say("%d newcomer%s joined; going on with %d ranks" %
                  (nnew, "" if nnew == 1 else "s", self.size))
        return self._share_state(redo)

    def _share_state(self, step: int) -> int:
        """From rank 0 to all: the step to run, the recoveries so far, the
        optimizer's state (the model's came with DistributedDataParallel)."""
        if self.rank == 0:
            buf = io.BytesIO()
            torch.save({"step": step, "recoveries": self.recoveries,
                        "optimizer": self.optimizer.state_dict()}, buf)
            data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
            n = torch.tensor([data.numel()], dtype=torch.int64)
        else:
            n = torch.zeros(1, dtype=torch.int64)
        self.pg.broadcast([n]).wait()
        if self.rank != 0:
            data = torch.empty(int(n.item()), dtype=torch.uint8)
        self.pg.broadcast([data]).wait()
        state = torch.load(io.BytesIO(data.numpy().tobytes()))
        self.optimizer.load_state_dict(state["optimizer"])
        self._recoveries_shared = state["recoveries"]
        return int(state["step"])
