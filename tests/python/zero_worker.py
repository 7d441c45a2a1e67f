"""One rank of the sharded data parallelism tests (test_zero.py).

Launched by frrun; initialises torch.distributed with the "fastreduce"
backend through a file store, one per job, and trains the same model twice
from the same seed on the same data: with
fastreduce.torch.ShardedDataParallel (ZeRO stage 2) and with plain DDP over
the same backend and the whole optimizer.  argv[1] names the optimizer
("adam" or "sgd").  Checks, on every rank:

  - the parameters after every step match DDP's within float tolerance (the
    same sums, reduced in another order) and are identical on all ranks;
  - the optimizer state per rank is at most 1/n of DDP's plus 5 %, and no
    full gradient is left on the parameters after backward;
  - optimizer_state_dict() gathers the state DDP's optimizer holds;
  - a second ShardedDataParallel restored from the first's checkpoints
    (module and optimizer state dicts) then trains exactly as the first.

The model has odd sizes (shards padded), BatchNorm buffers (broadcast from
rank 0 before each forward), a branch that only one rank uses in a step, a
MultiheadAttention (which reads its child's parameters itself); one step
has two backwards (gradients accumulate in the shards), one starts with a
backward that raises, one zeroes with set_to_none, one clips the gradient
norm (against torch's clip_grad_norm_ under DDP); the staging buffers stay
within their bound; a checkpoint whose Adam steps differ within a bucket
is refused.
Prints "OK zero <optimizer> rank R".
"""

import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn

import fastreduce.torch as frt

RANK = int(os.environ["FR_RANK"])
SIZE = int(os.environ["FR_NRANKS"])
PORT = os.environ["FR_RENDEZVOUS"].rsplit(":", 1)[1]
STORE = "file://%s/fr_backend_store_%d_%s" % (tempfile.gettempdir(), os.getppid(), PORT)
STEPS = 6


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(13, 31, bias=False)  # BatchNorm follows
        self.bn = nn.BatchNorm1d(31)
        self.b = nn.Linear(31, 7, bias=False)
        # reads its child out_proj's parameters itself: the child's
        # forward (and pre-hook) never runs
        # (no biases: the key's gets a zero gradient, whose rounding noise
        # Adam would scale up to whole steps)
        self.attn = nn.MultiheadAttention(7, 1, bias=False)
        # used by one rank per step; registered last, so in bucket 0, which
        # waits for it on the ranks that skip it until backward ends
        self.branch = nn.Linear(13, 7)

    def forward(self, x, use_branch):
        y = self.b(torch.relu(self.bn(self.a(x))))
        if use_branch:
            y = y + self.branch(x)
        q = y.unsqueeze(1)  # a sequence of 16, batch 1
        return y + self.attn(q, q, q, need_weights=False)[0].squeeze(1)


class Boom(torch.autograd.Function):
    """Identity forward; backward raises, after every parameter's
    gradient has arrived (it sits on the input)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        raise RuntimeError("boom")


class LateGather:
    """torch's all_gather_into_tensor for the wrapper's asynchronous
    gathers, made as late as a slow network could make it: the result
    (everything but this rank's block) is NaN until wait().  A read of a
    parameter before its gather is waited for shows."""

    real = dist.all_gather_into_tensor

    def __init__(self, out, inp, group):
        self.out, self.tmp = out, torch.empty_like(out)
        LateGather.real(self.tmp, inp.clone(), group=group)
        mine = out.numel() // SIZE
        keep = inp.clone()
        out.fill_(float("nan"))
        out[RANK * mine:(RANK + 1) * mine].copy_(keep)

    def wait(self):
        self.out.copy_(self.tmp)
        return True

    @staticmethod
    def call(out, inp, group=None, async_op=False):
        if not async_op:
            return LateGather.real(out, inp, group=group)
        return LateGather(out, inp, group)


def optimizer(kind):
    if kind == "adam":
        return torch.optim.Adam, {"lr": 1e-2, "weight_decay": 1e-3}
    return torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}


def batches(step):
    g = torch.Generator().manual_seed(100 * step + RANK)
    return [(torch.randn(16, 13, generator=g), torch.randint(0, 7, (16,), generator=g))
            for _ in range(2 if step == 2 else 1)]


CLIP_STEP, NONE_STEP, BOOM_STEP = 4, 3, 1


def ddp_step(ddp, opt, step):
    opt.zero_grad(set_to_none=step == NONE_STEP)
    for x, y in batches(step):
        nn.functional.cross_entropy(ddp(x, RANK == step % SIZE), y).backward()
    if step == CLIP_STEP:
        nn.utils.clip_grad_norm_(ddp.parameters(), 0.05)
    opt.step()


def zero_step(zero, step):
    if step == BOOM_STEP:
        # a backward that raises after its buckets went: the next
        # zero_grad must wait for them and forget them (every rank uses
        # the branch here, so that every rank launched the same buckets)
        x, y = batches(step)[0]
        x = Boom.apply(x.requires_grad_())
        zero.eval()  # (BatchNorm's statistics stay as DDP's)
        try:
            nn.functional.cross_entropy(zero(x, True), y).backward()
        except RuntimeError as e:
            assert "boom" in str(e), str(e)
        else:
            raise AssertionError("no error from Boom")
        zero.train()
    zero.zero_grad(set_to_none=step == NONE_STEP)
    for x, y in batches(step):
        nn.functional.cross_entropy(zero(x, RANK == step % SIZE), y).backward()
        assert all(p.grad is None for p in zero.module.parameters()), \
            "a full gradient was kept after backward"
    if step == CLIP_STEP:
        zero.clip_grad_norm_(0.05)
    zero.step()


def close(a, b, what):
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-6), \
        "rank %d: %s differs by %g" % (RANK, what, (a - b).abs().max())


def same_on_all_ranks(t, what):
    outs = [torch.empty_like(t) for _ in range(SIZE)]
    dist.all_gather(outs, t)
    for r, o in enumerate(outs):
        assert torch.equal(o, t), "rank %d: %s differs from rank %d's" % (RANK, what, r)


def state_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values()
               for v in st.values() if torch.is_tensor(v))


def main(kind):
    dist.init_process_group("fastreduce", init_method=STORE, rank=RANK, world_size=SIZE,
                            timeout=datetime.timedelta(seconds=60))
    cls, args = optimizer(kind)

    torch.manual_seed(0)
    ref_net = Net()
    torch.manual_seed(0)
    net = Net()
    if RANK:  # the constructors' broadcasts must fix this
        with torch.no_grad():
            for p in net.parameters():
                p.add_(RANK)
    ddp = nn.parallel.DistributedDataParallel(ref_net, find_unused_parameters=True,
                                              bucket_cap_mb=0.001)
    ref_opt = cls(ddp.parameters(), **args)
    # small buckets: several per step, and shards of different sizes
    zero = frt.ShardedDataParallel(net, cls, bucket_mb=0.0001, **args)
    dist.all_gather_into_tensor = LateGather.call  # (the wrapper's calls only)
    assert len(zero.buckets) >= 3, len(zero.buckets)

    for step in range(STEPS):
        ddp_step(ddp, ref_opt, step)
        zero_step(zero, step)
        zero.wait()
        for (name, a), b in zip(net.named_parameters(), ref_net.parameters()):
            close(a, b, "step %d: %s" % (step, name))
            same_on_all_ranks(a.detach(), "step %d: %s" % (step, name))
        for (name, a), b in zip(net.named_buffers(), ref_net.buffers()):
            close(a.float(), b.float(), "step %d: buffer %s" % (step, name))

    # staging memory stays bounded (bucket 0, the branch's, waits for
    # ranks that do not use it until the end of backward)
    assert zero.staging_peak <= zero.STAGING + 1, (zero.staging_peak, len(zero.buckets))
    ours, theirs = zero.optimizer_state_bytes(), state_bytes(ref_opt)
    assert ours <= theirs / SIZE * 1.05, "optimizer state %d bytes, DDP's %d / %d ranks" % (
        ours, theirs, SIZE)

    full = zero.optimizer_state_dict()
    ref = ref_opt.state_dict()
    assert sorted(full["state"]) == sorted(ref["state"]), (sorted(full["state"]),
                                                          sorted(ref["state"]))
    for i, st in ref["state"].items():
        for key, v in st.items():
            w = full["state"][i][key]
            if torch.is_tensor(v):
                close(w.float(), v.float(), "optimizer state %d %s" % (i, key))
            else:
                assert w == v, (i, key, w, v)

    if kind == "adam":  # a bucket holds one step: uneven steps are refused
        bad = {"state": {i: dict(st) for i, st in full["state"].items()},
               "param_groups": full["param_groups"]}
        first = next(b for b in zero.buckets if len(b.params) > 1).params[0][0]
        i = next(k for k, p in enumerate(zero.trainable) if p is first)
        bad["state"][i]["step"] = bad["state"][i]["step"] + 1
        try:
            zero.load_optimizer_state_dict(bad)
        except ValueError as e:
            assert "step" in str(e), str(e)
        else:
            raise AssertionError("uneven steps in one bucket were taken")

    # restore into a new wrapper from the checkpoints; both go on alike
    torch.manual_seed(1)
    net2 = Net()
    zero2 = frt.ShardedDataParallel(net2, cls, bucket_mb=0.0001, **args)
    zero2.load_state_dict(zero.state_dict())
    zero2.load_optimizer_state_dict(full)
    for step in range(STEPS, STEPS + 2):
        for z in (zero, zero2):
            zero_step(z, step)
    for (name, a), b in zip(zero.state_dict().items(), zero2.state_dict().values()):
        assert torch.equal(a, b), "rank %d: restored %s differs" % (RANK, name)

    dist.destroy_process_group()
    print("OK zero %s rank %d (optimizer state %d bytes, DDP's %d)" % (kind, RANK, ours, theirs),
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
