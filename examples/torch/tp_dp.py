"""Tensor parallel x data parallel over the torch.distributed backend
"fastreduce", checked against the same model trained in one process.

The world is a grid of TP x DP ranks (TP = argv[1], default 2; 4 ranks are
2 x 2).  Rank r is TP rank r % TP of tensor-parallel group r // TP, and the
ranks that hold the same slice (same r % TP) form a data-parallel group:

    TP groups [0 1] [2 3]   (one model replica each, split in two)
    DP groups [0 2] [1 3]   (the same slice in each replica)

The model, in the Megatron style: a Linear every rank holds whole, then an
MLP block split over the TP group,

    x -> Linear(D, D) -> tanh -> f -> ColumnParallel(D, H) -> tanh
      -> RowParallel(H, O) -> g -> + b_out -> MSE loss

 * ColumnParallel: TP rank t holds rows [t H/TP, (t+1) H/TP) of the weight
   (its outputs) and computes those outputs from the whole input;
 * RowParallel: the same rank holds the matching columns of the next weight,
   computes a partial output from its slice of the hidden units, and g
   sums the partials (all_reduce over TP); the bias is added after;
 * f is the identity forward and an all_reduce of the gradient backward:
   each TP rank's input gradient only counts its slice of the hidden units;
   g is an all_reduce forward and the identity backward (every rank gets
   the whole output gradient already).  Both are torch.autograd.Functions.

Schedule of a step: each DP group takes its own part of the global batch;
forward and backward with the TP collectives above; then every gradient is
averaged over the DP group (all_reduce AVG) and SGD steps.  At the end every
rank gathers the full weights of its replica (all_gather over TP) and checks
them against a copy of the model it trained alone on the whole batches
(allclose: sums run in another order), and that its DP group holds the same
bits; it prints "OK tp_dp rank R", or exits 1.

Run (from the source tree, after make; the library and extension are found
as fastreduce.backend says; Debian 12's torchrun needs
--redirects and --tee other than 0, see examples/README.md):

    PYTHONPATH=python build/frrun -n 4 /usr/bin/python3 examples/torch/tp_dp.py
    PYTHONPATH=python torchrun --nproc_per_node 4 --redirects 1 --tee 1 examples/torch/tp_dp.py
"""

import copy
import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn.functional as F

import fastreduce.torch  # noqa: F401  registers the backend "fastreduce"

D, H, O = 8, 16, 4          # input, hidden (split over TP), output widths
BATCH, STEPS, LR = 8, 5, 0.1  # per DP group, so the global batch is BATCH * DP


def init():
    """Under frrun (FR_RANK...): a file store, one per job (frrun is every
    rank's parent); under torchrun: env:// (RANK, MASTER_ADDR...)."""
    if "FR_RANK" in os.environ:
        port = os.environ["FR_RENDEZVOUS"].rsplit(":", 1)[1]
        store = "file://%s/fr_example_store_%d_%s" % (tempfile.gettempdir(), os.getppid(), port)
        dist.init_process_group("fastreduce", init_method=store,
                                rank=int(os.environ["FR_RANK"]),
                                world_size=int(os.environ["FR_NRANKS"]),
                                timeout=datetime.timedelta(seconds=60))
    else:
        dist.init_process_group("fastreduce", init_method="env://",
                                timeout=datetime.timedelta(seconds=60))


class CopyToTP(torch.autograd.Function):
    """f: identity forward; backward sums the input gradient over TP."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTP(torch.autograd.Function):
    """g: sums the partial outputs over TP forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def full_model():
    """The whole model's parameters, the same on every rank (seeded)."""
    torch.manual_seed(0)
    return {"w0": torch.randn(D, D) / D ** 0.5, "b0": torch.randn(D) * 0.1,
            "w1": torch.randn(H, D) / D ** 0.5, "b1": torch.randn(H) * 0.1,
            "w2": torch.randn(O, H) / H ** 0.5, "b2": torch.randn(O) * 0.1}


def forward(p, x, tp_group=None):
    """The model on parameters p: whole (tp_group None) or this rank's slice."""
    h = torch.tanh(F.linear(x, p["w0"], p["b0"]))
    if tp_group is not None:
        h = CopyToTP.apply(h, tp_group)
    h = torch.tanh(F.linear(h, p["w1"], p["b1"]))   # column-parallel: our outputs
    y = F.linear(h, p["w2"])                         # row-parallel: a partial sum
    if tp_group is not None:
        y = ReduceFromTP.apply(y, tp_group)
    return y + p["b2"]


def batch(step, n):
    """Global batch of a step: n rows, the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, D, generator=g), torch.randn(n, O, generator=g)


def main():
    torch.set_num_threads(1)  # several ranks share the cores
    init()
    rank, size = dist.get_rank(), dist.get_world_size()
    tp = int(sys.argv[1]) if len(sys.argv) > 1 else min(2, size)
    if size % tp or H % tp:
        sys.exit("tp_dp: TP=%d must divide the world size %d and H=%d" % (tp, size, H))
    dp = size // tp
    t, d = rank % tp, rank // tp  # our TP rank, our replica (= DP rank)

    # every rank creates every group, in the same order; keeps its own
    tp_group = dp_group = None
    for i in range(dp):
        g = dist.new_group([i * tp + j for j in range(tp)])
        tp_group = g if i == d else tp_group
    for j in range(tp):
        g = dist.new_group([i * tp + j for i in range(dp)])
        dp_group = g if j == t else dp_group

    ref = {k: v.clone().requires_grad_() for k, v in full_model().items()}
    rows = slice(t * H // tp, (t + 1) * H // tp)  # our hidden units
    mine = copy.deepcopy(ref)
    mine["w1"] = mine["w1"][rows].detach().clone().requires_grad_()
    mine["b1"] = mine["b1"][rows].detach().clone().requires_grad_()
    mine["w2"] = mine["w2"][:, rows].detach().clone().requires_grad_()
    opt = torch.optim.SGD(mine.values(), lr=LR)
    ref_opt = torch.optim.SGD(ref.values(), lr=LR)

    for step in range(STEPS):
        x, y = batch(step, BATCH * dp)
        # the distributed model: our replica's part of the batch
        xs, ys = x[d * BATCH:(d + 1) * BATCH], y[d * BATCH:(d + 1) * BATCH]
        opt.zero_grad()
        F.mse_loss(forward(mine, xs, tp_group), ys).backward()
        for p in mine.values():  # each replica's mean-loss gradient -> the global mean's
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=dp_group)
        opt.step()
        # the reference: the whole batch in one process
        ref_opt.zero_grad()
        F.mse_loss(forward(ref, x), y).backward()
        ref_opt.step()

    # assemble our replica's full weights from the TP slices
    def gather(v, dim):
        parts = [torch.empty_like(v) for _ in range(tp)]
        dist.all_gather(parts, v.detach().contiguous(), group=tp_group)
        return torch.cat(parts, dim)

    full = {k: v.detach() for k, v in mine.items()}
    full.update(w1=gather(mine["w1"], 0), b1=gather(mine["b1"], 0), w2=gather(mine["w2"], 1))
    bad = [k for k in full if not torch.allclose(full[k], ref[k].detach(), rtol=1e-4, atol=1e-5)]
    diff = max((full[k] - ref[k].detach()).abs().max().item() for k in full)
    # the DP replicas must hold the same bits: AVG gives every rank one result
    flat = torch.cat([v.flatten() for v in mine.values()]).detach()
    peers = [torch.empty_like(flat) for _ in range(dp)]
    dist.all_gather(peers, flat, group=dp_group)
    if any(not torch.equal(q, flat) for q in peers):
        bad.append("DP replicas differ")
    dist.destroy_process_group()
    if bad:
        print("FAIL tp_dp rank %d: %s (max diff %.3g)" % (rank, ", ".join(bad), diff))
        sys.exit(1)
    print("OK tp_dp rank %d (tp=%d dp=%d, %d steps, max diff %.3g)" % (rank, tp, dp, STEPS, diff))


if __name__ == "__main__":
    main()
