"""Sharded data parallelism (ZeRO stage 2) over torch.distributed.

:class:`ShardedDataParallel` wraps a module and an optimizer class.  Every
rank holds the whole model (parameters are needed for forward and
backward), but each rank owns one shard of every gradient bucket: the
gradients are reduce-scattered into the shards while backward runs, the
optimizer keeps its state and steps for its shard only, and the updated
shards are all-gathered back into the parameters, overlapped with the next
forward.  Per rank this keeps 1/n of the optimizer state (Adam: two
tensors the size of the parameters) and 1/n of the gradients, where DDP
keeps all of both.

The schedule of one step, per bucket (a run of parameters of one dtype, in
the reverse of the module's order, about the order backward produces their
gradients)::

    backward:  AccumulateGrad of each parameter -> copy p.grad into the
               bucket's staging buffer, p.grad = None (freed at once)
               last parameter of the bucket -> reduce_scatter_tensor(AVG)
               of the staging buffer into this rank's shard gradient
               (asynchronous; the staging buffer returns to a pool when
               it completes); at the end of backward: unused parameters
               count as zero, every bucket is waited for
    step():    optimizer.step() on the shards (a view into the bucket's
               flat parameter buffer, so the module sees it)
               all_gather_into_tensor of each shard into its bucket, in
               place, asynchronously, in forward order
    forward:   each submodule waits, in a pre-hook, for the buckets that
               hold its own parameters; the rest of the gather goes on
               behind the computation

It needs a process group whose backend has reduce_scatter_tensor and
all_gather_into_tensor on CPU tensors, as "fastreduce" does (torch 1.13's
Gloo has neither).

Against ``torch.distributed.optim.ZeroRedundancyOptimizer`` (stage 1): that
keeps DDP's full gradients and all-reduces them, then broadcasts every
parameter from its owner after the step; this reduces only each rank's
shard (the same bytes on the wire as an All-Reduce, in two halves: the
reduce-scatter inside backward, the all-gather inside the next forward) and
frees the gradients as soon as they are staged.
"""

import math
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

__all__ = ["ShardedDataParallel"]


class _Bucket:
    """A run of parameters of one dtype: their values live in one flat
    buffer of ``padded`` elements (a multiple of the group size) so that
    the gather writes them in place; rank r owns ``[r*shard, (r+1)*shard)``."""

    def __init__(self, index, params, rank, size):
        self.index = index
        self.params = params  # [(param, offset, numel)]
        self.dtype = params[0][0].dtype
        total = sum(n for _, _, n in params)
        self.shard = max(1, math.ceil(total / size))
        self.padded = self.shard * size
        self.flat = torch.zeros(self.padded, dtype=self.dtype)
        for p, off, n in params:
            self.flat[off:off + n].copy_(p.detach().reshape(-1))
            # the module's parameter becomes a view of the flat buffer
            p.data = self.flat[off:off + n].view_as(p)
        lo = rank * self.shard
        # the optimizer's parameter: this rank's shard, sharing storage
        self.owned = torch.nn.Parameter(self.flat[lo:lo + self.shard])
        self.owned.grad = torch.zeros(self.shard, dtype=self.dtype)
        self.fresh = True  # owned.grad is zero: reduce straight into it
        self.staging: Optional[torch.Tensor] = None
        self.ready = set()
        self.work = None  # the reduce-scatter in flight
        self.out: Optional[torch.Tensor] = None
        self.gather = None  # the all-gather in flight


class ShardedDataParallel(torch.nn.Module):
    """ZeRO stage 2 data parallelism: see the module's docstring.

    module: the model, the same on every rank up to its initial values
      (rank 0's parameters and buffers are broadcast at construction).
    optimizer_class, **optimizer_args: the optimizer to run on the shards,
      e.g. ``torch.optim.Adam, lr=1e-3``.  It sees one flat parameter per
      bucket, so per-parameter options (param groups) do not apply; an
      element-wise optimizer (SGD, Adam, AdamW, RMSprop, Adagrad...) steps
      exactly as it would on the whole parameters.
    process_group: the group to shard over (default: the world); its
      backend must do reduce_scatter_tensor and all_gather_into_tensor.
    bucket_mb: target bucket size in MiB.
    broadcast_buffers: broadcast rank 0's buffers (BatchNorm statistics)
      before every forward, as DDP does.

    Use::

        model = ShardedDataParallel(net, torch.optim.Adam, lr=1e-3)
        for x, y in loader:
            model.zero_grad()
            loss_fn(model(x), y).backward()   # gradients reduced into shards
            model.step()                      # shards stepped and gathered

    Calling backward several times before step() accumulates the reduced
    gradients in the shards (each backward communicates; there is no
    no_sync).  ``model.module.state_dict()`` is the full model on every
    rank; :meth:`optimizer_state_dict` gathers the full optimizer state in
    the format of a plain optimizer over the trainable parameters, which
    :meth:`load_optimizer_state_dict` takes back.
    """

    # staging buffers (each the largest bucket's size) kept for reuse; more
    # only while none of the pool's has the dtype needed and none is in flight
    STAGING = 3

    def __init__(self, module: torch.nn.Module, optimizer_class: Any,
                 process_group: Optional[dist.ProcessGroup] = None,
                 bucket_mb: float = 4.0, broadcast_buffers: bool = True,
                 **optimizer_args):
        super().__init__()
        self.module = module
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.size = dist.get_world_size(process_group)
        self.root = dist.get_global_rank(process_group, 0) if process_group else 0
        self.broadcast_buffers = broadcast_buffers
        self.trainable = [p for p in module.parameters() if p.requires_grad]
        if not self.trainable:
            raise ValueError("ShardedDataParallel: the module has no trainable parameters")
        for p in self.trainable:
            if p.device.type != "cpu":
                raise ValueError("ShardedDataParallel: parameters must be CPU tensors")
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, self.root, group=process_group)
        self.buckets = self._make_buckets(bucket_mb)
        self._owner = {}
        for b in self.buckets:
            for i, (p, _, _) in enumerate(b.params):
                self._owner[p] = (b, i)
        self._pool: List[torch.Tensor] = []
        self._staged = 0  # staging buffers allocated
        self._max_padded = max(b.padded for b in self.buckets)
        self._in_flight: List[_Bucket] = []
        self._next = 0  # buckets reduce in index order on every rank
        self._queued = False
        self._hooks = []
        self._accs = []
        for p in self.trainable:
            # the AccumulateGrad node's hook runs once p.grad holds this
            # backward's sum for p (DDP's reducer hooks the same node)
            acc = p.expand_as(p).grad_fn.next_functions[0][0]
            self._hooks.append(acc.register_hook(self._make_hook(p)))
            self._accs.append(acc)
        # which buckets each submodule reads in its own forward
        for m in module.modules():
            mine = {self._owner[p][0].index for p in m.parameters(recurse=False)
                    if p in self._owner}
            if mine:
                self._hooks.append(m.register_forward_pre_hook(
                    self._make_pre_hook(sorted(mine))))
        self.optimizer = optimizer_class([b.owned for b in self.buckets], **optimizer_args)

    def _make_buckets(self, bucket_mb):
        buckets, run, run_bytes = [], [], 0
        cap = max(1, int(bucket_mb * 1024 * 1024))
        for p in reversed(self.trainable):
            if run and (p.dtype != run[0].dtype or run_bytes >= cap):
                buckets.append(run)
                run, run_bytes = [], 0
            run.append(p)
            run_bytes += p.numel() * p.element_size()
        if run:
            buckets.append(run)
        out = []
        for i, ps in enumerate(buckets):
            off, spec = 0, []
            for p in ps:
                spec.append((p, off, p.numel()))
                off += p.numel()
            out.append(_Bucket(i, spec, self.rank, self.size))
        return out

    # -- backward: stage, reduce-scatter, free ------------------------------

    def _make_hook(self, p):
        def hook(*_):
            self._grad_ready(p)
        return hook

    def _grad_ready(self, p):
        b, i = self._owner[p]
        if not self._queued:
            # once per backward: finish what the hooks leave undone
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self._queued = True
        if b.staging is None:
            b.staging = self._staging(b)
        _, off, n = b.params[i]
        b.staging[off:off + n].copy_(p.grad.reshape(-1))
        p.grad = None  # staged: the full gradient is not kept
        b.ready.add(i)
        self._launch_ready()

    def _staging(self, b):
        """A staging buffer for bucket b: from the pool, else a new one
        while fewer than STAGING exist, else the oldest reduction's once it
        completes (so at most STAGING buckets of gradients exist at once,
        and a reduction has the computation of the next buckets to hide
        behind)."""
        while True:
            for k, t in enumerate(self._pool):
                if t.dtype == b.dtype and t.numel() >= b.padded:
                    return self._pool.pop(k)[:b.padded]
            if self._staged < self.STAGING or not self._in_flight:
                self._staged += 1
                return torch.empty(self._max_padded, dtype=b.dtype)[:b.padded]
            self._finish(self._in_flight[0])

    def _launch_ready(self, force=False):
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if len(b.ready) < len(b.params) and not force:
                return
            if b.staging is None:
                b.staging = self._staging(b)
            for i, (_, off, n) in enumerate(b.params):
                if i not in b.ready:  # unused in this backward: zero
                    b.staging[off:off + n].zero_()
            end = b.params[-1][1] + b.params[-1][2]
            b.staging[end:].zero_()
            b.out = b.owned.grad if b.fresh else torch.empty_like(b.owned.grad)
            b.work = dist.reduce_scatter_tensor(b.out, b.staging, op=dist.ReduceOp.AVG,
                                                group=self.group, async_op=True)
            self._in_flight.append(b)
            self._next += 1

    def _finish(self, b):
        b.work.wait()
        if not b.fresh:
            b.owned.grad.add_(b.out)
        b.fresh = False
        b.work, b.out = None, None
        self._in_flight.remove(b)
        self._pool.append(b.staging._base)
        b.staging = None
        b.ready = set()

    def _backward_done(self):
        self._launch_ready(force=True)
        while self._in_flight:
            self._finish(self._in_flight[0])
        self._next = 0
        self._queued = False

    # -- step: optimizer on the shards, gather -----------------------------

    def _wait_gathers(self, indices=None):
        for b in self.buckets if indices is None else (self.buckets[i] for i in indices):
            if b.gather is not None:
                b.gather.wait()
                b.gather = None

    def _make_pre_hook(self, indices):
        def pre_hook(module, inputs):
            self._wait_gathers(indices)
        return pre_hook

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the shards' gradients (set_to_none is accepted for
        compatibility; the shards' gradients stay allocated)."""
        for b in self.buckets:
            b.owned.grad.zero_()
            b.fresh = True
        for p in self.trainable:
            p.grad = None

    @torch.no_grad()
    def step(self, closure=None):
        """Step the optimizer on this rank's shards, then start gathering
        the updated shards into every rank's parameters (waited for by the
        next forward, or by anything here that reads the parameters)."""
        self._wait_gathers()
        loss = self.optimizer.step(closure) if closure else self.optimizer.step()
        # the first layers' buckets first: the next forward needs them first
        for b in reversed(self.buckets):
            lo = self.rank * b.shard
            b.gather = dist.all_gather_into_tensor(b.flat, b.flat[lo:lo + b.shard],
                                                   group=self.group, async_op=True)
        return loss

    def forward(self, *args, **kwargs):
        if self.broadcast_buffers and self.size > 1:
            self._broadcast_buffers()
        out = self.module(*args, **kwargs)
        self._wait_gathers()  # parameters no submodule read
        return out

    @torch.no_grad()
    def _broadcast_buffers(self):
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for t in self.module.buffers():
            by_dtype.setdefault(t.dtype, []).append(t)
        for ts in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in ts])
            dist.broadcast(flat, self.root, group=self.group)
            off = 0
            for t in ts:
                t.copy_(flat[off:off + t.numel()].view_as(t))
                off += t.numel()

    def state_dict(self, *args, **kwargs):
        """The module's full state dict (every rank has all parameters)."""
        self._wait_gathers()
        return self.module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict: bool = True):
        self._wait_gathers()
        return self.module.load_state_dict(state_dict, strict)

    # -- the optimizer's state: sharded here, whole in checkpoints ----------

    def optimizer_state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (tensors only)."""
        n = 0
        for st in self.optimizer.state.values():
            for v in st.values():
                if torch.is_tensor(v):
                    n += v.numel() * v.element_size()
        return n

    @torch.no_grad()
    def optimizer_state_dict(self) -> Dict[str, Any]:
        """The whole optimizer state, gathered from every rank's shards, as
        a plain optimizer over the trainable parameters (in the module's
        order) would save it.  Collective: every rank calls it, and every
        rank gets the whole state."""
        self._wait_gathers()
        index = {p: k for k, p in enumerate(self.trainable)}
        state: Dict[int, Dict[str, Any]] = {}
        for b in self.buckets:
            st = self.optimizer.state.get(b.owned, {})
            for key in sorted(st):
                v = st[key]
                if torch.is_tensor(v) and v.numel() == b.shard and v.dim() == 1:
                    whole = torch.empty(b.padded, dtype=v.dtype)
                    dist.all_gather_into_tensor(whole, v.contiguous(), group=self.group)
                    for p, off, n in b.params:
                        state.setdefault(index[p], {})[key] = \
                            whole[off:off + n].view_as(p).clone()
                else:  # a scalar (Adam's step): the same on every rank
                    for p, _, _ in b.params:
                        state.setdefault(index[p], {})[key] = \
                            v.clone() if torch.is_tensor(v) else v
        groups = []
        for g in self.optimizer.state_dict()["param_groups"]:
            g = dict(g)
            g["params"] = list(range(len(self.trainable)))
            groups.append(g)
        return {"state": state, "param_groups": groups}

    @torch.no_grad()
    def load_optimizer_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Take back a whole state (from :meth:`optimizer_state_dict` or a
        plain optimizer over the trainable parameters): each rank keeps
        its shards.  Not collective."""
        if len(state_dict["param_groups"]) != 1:
            raise ValueError("ShardedDataParallel: one param group expected, got %d"
                             % len(state_dict["param_groups"]))
        full = state_dict["state"]
        index = {p: k for k, p in enumerate(self.trainable)}
        shards: Dict[int, Dict[str, Any]] = {}
        for bi, b in enumerate(self.buckets):
            keys = set()
            for p, _, _ in b.params:
                keys |= set(full.get(index[p], {}))
            for key in sorted(keys):
                sample = next(full[index[p]][key] for p, _, _ in b.params
                              if key in full.get(index[p], {}))
                if torch.is_tensor(sample) and sample.dim() > 0:
                    whole = torch.zeros(b.padded, dtype=sample.dtype)
                    for p, off, n in b.params:
                        v = full.get(index[p], {}).get(key)
                        if v is not None:
                            whole[off:off + n].copy_(v.reshape(-1))
                    lo = self.rank * b.shard
                    shards.setdefault(bi, {})[key] = whole[lo:lo + b.shard].clone()
                else:
                    shards.setdefault(bi, {})[key] = sample
        group = dict(state_dict["param_groups"][0])
        group["params"] = list(range(len(self.buckets)))
        self.optimizer.load_state_dict({"state": shards, "param_groups": [group]})
