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
               hold its parameters (its children's included: gathers
               complete in the order they started, so one wait, for the
               last-started of them, covers them all); the rest of the
               gather goes on behind the computation

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
import weakref
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
        self.gather = None  # the all-gather in flight
        self.clear()

    def clear(self):
        """Forget this backward's state (the staging buffer is the
        caller's to return)."""
        self.staging: Optional[torch.Tensor] = None
        self.ready = set()  # gradients arrived (in p.grad or staged)
        self.staged = set()  # of those, copied into staging
        self.work = None  # the reduce-scatter in flight
        self.out: Optional[torch.Tensor] = None


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
    overlap: let the gather of the parameters run behind the next forward
      (each submodule waits for its own); False waits for all of it before
      the forward.  Needs False where the top-level module's own forward
      reads its submodules' parameters directly (e.g. ``F.linear(h,
      self.emb.weight)`` in the top-level forward; inside a submodule that
      is fine).

    Use::

        model = ShardedDataParallel(net, torch.optim.Adam, lr=1e-3)
        for x, y in loader:
            model.zero_grad()
            loss_fn(model(x), y).backward()   # gradients reduced into shards
            model.clip_grad_norm_(1.0)        # optional
            model.step()                      # shards stepped and gathered

    Calling backward several times before step() accumulates the reduced
    gradients in the shards (each backward communicates; there is no
    no_sync).  ``model.state_dict()`` is the full model on every rank (it
    waits for the gather; read ``model.module``'s parameters directly only
    after :meth:`wait`); :meth:`optimizer_state_dict` gathers the full
    optimizer state in the format of a plain optimizer over the trainable
    parameters, which :meth:`load_optimizer_state_dict` takes back.
    """

    # staging buffers (each the largest bucket's size) kept for reuse; a
    # gradient that finds none free waits in p.grad until its bucket's turn
    STAGING = 3

    def __init__(self, module: torch.nn.Module, optimizer_class: Any,
                 process_group: Optional[dist.ProcessGroup] = None,
                 bucket_mb: float = 4.0, broadcast_buffers: bool = True,
                 overlap: bool = True, **optimizer_args):
        super().__init__()
        if getattr(module, "_fastreduce_sharded", False):
            raise ValueError("ShardedDataParallel: this module is already wrapped")
        self.module = module
        self.group = process_group
        self.rank = dist.get_rank(process_group)
        self.size = dist.get_world_size(process_group)
        self.root = dist.get_global_rank(process_group, 0) if process_group else 0
        self.broadcast_buffers = broadcast_buffers
        self.overlap = overlap
        self.trainable = [p for p in module.parameters() if p.requires_grad]
        if not self.trainable:
            raise ValueError("ShardedDataParallel: the module has no trainable parameters")
        for p in self.trainable:
            if p.device.type != "cpu" or p.is_sparse:
                raise ValueError("ShardedDataParallel: parameters must be dense CPU tensors")
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
        self.staging_peak = 0  # the most that existed at once (memory)
        self._max_padded = max(b.padded for b in self.buckets)
        self._in_flight: List[_Bucket] = []
        self._next = 0  # buckets reduce in index order on every rank
        self._queued = False
        self._buffer_work = None  # buffers broadcast at step(), for forward
        # The hooks hold the wrapper weakly: the module keeps them, and
        # must not keep the wrapper's buffers and optimizer state alive.
        me = weakref.ref(self)
        self._hooks = []
        self._accs = []
        with torch.enable_grad():
            for p in self.trainable:
                # the AccumulateGrad node's hook runs once p.grad holds
                # this backward's sum for p (DDP's reducer hooks the same)
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                self._hooks.append(acc.register_hook(_grad_hook(me, p)))
                self._accs.append(acc)
        # what each submodule must wait for: the last-started gather of
        # the buckets its subtree reads (gathers complete in order)
        for m in module.modules():
            if m is module:
                idx = [self._owner[p][0].index for p in m.parameters(recurse=False)
                       if p in self._owner]
            else:
                idx = [self._owner[p][0].index for p in m.parameters() if p in self._owner]
            if idx:
                self._hooks.append(m.register_forward_pre_hook(_pre_hook(me, min(idx))))
        module._fastreduce_sharded = True
        self.optimizer = optimizer_class([b.owned for b in self.buckets], **optimizer_args)

    def remove_hooks(self) -> None:
        """Take the wrapper's hooks off the module (after the last step),
        so that it can be used, or wrapped again, on its own."""
        self.wait()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.module._fastreduce_sharded = False

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

    def _grad_ready(self, p):
        b, i = self._owner[p]
        if not self._queued:
            # once per backward: finish what the hooks leave undone
            torch.autograd.Variable._execution_engine.queue_callback(self._backward_done)
            self._queued = True
        if p.grad is None:  # an undefined gradient: p counts as unused
            return
        if p.grad.is_sparse:
            raise RuntimeError("ShardedDataParallel: %s has a sparse gradient; only dense "
                               "gradients can be sharded" % tuple(p.shape))
        if b.index < self._next:
            # reentrant checkpointing runs a parameter's accumulator once
            # per segment; its bucket already went
            raise RuntimeError("ShardedDataParallel: a gradient arrived after its bucket "
                               "was reduced (use checkpoint(..., use_reentrant=False))")
        _, off, n = b.params[i]
        if i in b.staged:  # a second contribution in this backward
            b.staging[off:off + n].add_(p.grad.reshape(-1))
            p.grad = None
            return
        b.ready.add(i)
        if b.staging is None:
            b.staging = self._staging(b, may_defer=True)
        if b.staging is not None:
            b.staging[off:off + n].copy_(p.grad.reshape(-1))
            b.staged.add(i)
            p.grad = None  # staged: the full gradient is not kept
        # else it waits in p.grad (where a second contribution accumulates)
        self._launch_ready()

    def _staging(self, b, may_defer=False):
        """A staging buffer for bucket b: from the pool, else a new one
        while fewer than STAGING exist, else the oldest reduction's once it
        completes; None (may_defer) when every buffer belongs to a bucket
        still filling.  A bucket's launch takes one regardless (the extra
        is dropped when it comes back)."""
        while True:
            for k, t in enumerate(self._pool):
                if t.dtype == b.dtype and t.numel() >= b.padded:
                    return self._pool.pop(k)[:b.padded]
            if self._staged < self.STAGING or not (self._in_flight or may_defer):
                self._staged += 1
                self.staging_peak = max(self.staging_peak, self._staged)
                return torch.empty(self._max_padded, dtype=b.dtype)[:b.padded]
            if not self._in_flight:
                return None
            self._finish(self._in_flight[0])

    def _launch_ready(self, force=False):
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if len(b.ready) < len(b.params) and not force:
                return
            if b.staging is None:
                b.staging = self._staging(b)
            for i, (p, off, n) in enumerate(b.params):
                if i in b.staged:
                    continue
                if i in b.ready:  # waited in p.grad for a buffer
                    b.staging[off:off + n].copy_(p.grad.reshape(-1))
                    p.grad = None
                else:  # unused in this backward: zero
                    b.staging[off:off + n].zero_()
            end = b.params[-1][1] + b.params[-1][2]
            b.staging[end:].zero_()
            g = b.owned.grad
            b.out = g if (g is not None and b.fresh) else torch.empty(b.shard, dtype=b.dtype)
            b.work = dist.reduce_scatter_tensor(b.out, b.staging, op=dist.ReduceOp.AVG,
                                                group=self.group, async_op=True)
            self._in_flight.append(b)
            self._next += 1

    def _finish(self, b):
        b.work.wait()
        if b.owned.grad is None:
            b.owned.grad = b.out
        elif b.out is not b.owned.grad:
            b.owned.grad.add_(b.out)
        b.fresh = False
        self._in_flight.remove(b)
        self._give_back(b.staging)
        b.clear()

    def _give_back(self, staging):
        if staging is None:
            return
        if self._staged > self.STAGING:
            self._staged -= 1  # an extra, taken by a launch: let it go
        else:
            self._pool.append(staging._base)

    def _backward_done(self):
        self._launch_ready(force=True)
        while self._in_flight:
            self._finish(self._in_flight[0])
        self._next = 0
        self._queued = False

    def _reset_backward(self):
        """After a backward that raised (its callback never ran): wait for
        what it started, forget what it staged."""
        if not (self._queued or self._in_flight or self._next):
            return
        while self._in_flight:
            self._finish(self._in_flight[0])
        for b in self.buckets:
            self._give_back(b.staging)
            b.clear()
        self._next = 0
        self._queued = False

    # -- step: optimizer on the shards, gather -----------------------------

    def wait(self) -> None:
        """Wait for the gather of the parameters that step() started (the
        next forward, state_dict() and the checkpoint calls do it
        themselves)."""
        self._wait_gathers()

    def _wait_gathers(self, upto=None):
        # gathers complete in the order they started (last bucket first)
        for b in reversed(self.buckets):
            if upto is not None and b.index < upto:
                break
            if b.gather is not None:
                b.gather.wait()
                b.gather = None

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero the shards' gradients (set_to_none: drop them; a step
        before the next backward then leaves the parameters alone, as a
        plain optimizer would).  Also recovers from a backward that
        raised."""
        self._reset_backward()
        for b in self.buckets:
            if set_to_none:
                b.owned.grad = None
            elif b.owned.grad is not None:
                b.owned.grad.zero_()
            b.fresh = True
        for p in self.trainable:
            p.grad = None

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip the gradient of the whole model, as
        torch.nn.utils.clip_grad_norm_ would on a plain one, through the
        shards (one all_reduce of the norm); returns the total norm.
        (The module's own parameters hold no gradient after backward.)"""
        grads = [b.owned.grad for b in self.buckets if b.owned.grad is not None]
        inf = norm_type == float("inf")
        local = torch.zeros(1, dtype=torch.float64)
        for g in grads:
            if inf:
                local = torch.maximum(local, g.abs().max().double().reshape(1))
            else:
                local += g.double().norm(norm_type) ** norm_type
        dist.all_reduce(local, op=dist.ReduceOp.MAX if inf else dist.ReduceOp.SUM,
                        group=self.group)
        total = local[0] if inf else local[0] ** (1.0 / norm_type)
        coef = float(max_norm) / (float(total) + 1e-6)
        if coef < 1:
            for g in grads:
                g.mul_(coef)
        return total.float()

    @torch.no_grad()
    def step(self, closure=None):
        """Step the optimizer on this rank's shards, then start gathering
        the updated shards into every rank's parameters (waited for by the
        next forward, or by anything here that reads the parameters)."""
        self._reset_backward()
        self._wait_gathers()
        loss = self.optimizer.step(closure) if closure else self.optimizer.step()
        # the buffers go first, so the next forward need not wait for the
        # whole gather behind them (one queue per group, in order)
        if self.broadcast_buffers and self.size > 1 and self._buffer_work is None:
            self._buffer_work = self._broadcast_buffers(async_op=True)
        # the first layers' buckets first: the next forward needs them first
        for b in reversed(self.buckets):
            lo = self.rank * b.shard
            b.gather = dist.all_gather_into_tensor(b.flat, b.flat[lo:lo + b.shard],
                                                   group=self.group, async_op=True)
        return loss

    def forward(self, *args, **kwargs):
        self._reset_backward()
        if self.broadcast_buffers and self.size > 1:
            if self._buffer_work is None:  # no step since the last forward
                self._buffer_work = self._broadcast_buffers(async_op=False)
            self._unpack_buffers(self._buffer_work)
            self._buffer_work = None
        if not self.overlap:
            self._wait_gathers()
        out = self.module(*args, **kwargs)
        self._wait_gathers()  # parameters no submodule read
        return out

    @torch.no_grad()
    def _broadcast_buffers(self, async_op):
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for t in self.module.buffers():
            by_dtype.setdefault(t.dtype, []).append(t)
        sent = []
        for ts in by_dtype.values():
            flat = torch.cat([t.reshape(-1) for t in ts])
            work = dist.broadcast(flat, self.root, group=self.group, async_op=async_op)
            sent.append((work, flat, ts))
        return sent

    @torch.no_grad()
    def _unpack_buffers(self, sent):
        for work, flat, ts in sent:
            if work is not None:
                work.wait()
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
        its shards.  Not collective.  A bucket's parameters must agree on
        which keys they have and on their scalars (Adam's step): a bucket
        has one of each."""
        if len(state_dict["param_groups"]) != 1:
            raise ValueError("ShardedDataParallel: one param group expected, got %d"
                             % len(state_dict["param_groups"]))
        full = state_dict["state"]
        index = {p: k for k, p in enumerate(self.trainable)}
        shards: Dict[int, Dict[str, Any]] = {}
        for bi, b in enumerate(self.buckets):
            have = [set(full.get(index[p], {})) for p, _, _ in b.params]
            if any(h != have[0] for h in have):
                raise ValueError("ShardedDataParallel: parameters %s of one bucket have "
                                 "different optimizer state keys"
                                 % [index[p] for p, _, _ in b.params])
            for key in sorted(have[0]):
                vals = [full[index[p]][key] for p, _, _ in b.params]
                if all(torch.is_tensor(v) and v.dim() > 0 and v.numel() == p.numel()
                       for v, (p, _, _) in zip(vals, b.params)):
                    whole = torch.zeros(b.padded, dtype=vals[0].dtype)
                    for v, (p, off, n) in zip(vals, b.params):
                        whole[off:off + n].copy_(v.reshape(-1))
                    lo = self.rank * b.shard
                    shards.setdefault(bi, {})[key] = whole[lo:lo + b.shard].clone()
                    continue
                if any(not _same(v, vals[0]) for v in vals):
                    raise ValueError("ShardedDataParallel: optimizer state %r differs "
                                     "between parameters %s of one bucket (e.g. Adam's step "
                                     "of a parameter that started later)"
                                     % (key, [index[p] for p, _, _ in b.params]))
                shards.setdefault(bi, {})[key] = vals[0]
        group = dict(state_dict["param_groups"][0])
        group["params"] = list(range(len(self.buckets)))
        self.optimizer.load_state_dict({"state": shards, "param_groups": [group]})


def _same(a, b) -> bool:
    if torch.is_tensor(a) and torch.is_tensor(b):
        return a.shape == b.shape and bool(torch.equal(a, b))
    return a == b


def _grad_hook(me, p):
    def hook(*_):
        w = me()
        if w is not None:
            w._grad_ready(p)
    return hook


def _pre_hook(me, upto):
    def pre_hook(module, inputs):
        w = me()
        if w is not None:
            w._wait_gathers(upto)
    return pre_hook
