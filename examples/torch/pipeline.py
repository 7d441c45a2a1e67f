"""A two-stage pipeline (GPipe) over the torch.distributed backend
"fastreduce", with dist.send/dist.recv between the stages, checked against
the same model trained in one process.

Rank 2p is stage 0 and rank 2p + 1 stage 1 of pipeline p (2 ranks: one
pipeline; 4 ranks: two, data-parallel):

    stage 0:  x -> Linear(D, H) -> tanh -> Linear(H, H) -> tanh --send-->
    stage 1:  --recv--> Linear(H, O) -> MSE loss

Schedule of a step, GPipe: the pipeline's batch is cut into M micro-batches;
stage 0 runs all M forwards, sending each activation to stage 1 as it is
made; stage 1 receives each, runs its layers and the loss.  Then all M
backwards, in reverse order: stage 1 back-propagates a micro-batch's loss
and sends the gradient of its input activation to stage 0, which receives it
and back-propagates it through its layers (tensor.backward(grad)).  The
gradients accumulate over the micro-batches; each micro-batch's loss is
divided by M, so the sum is the gradient of the whole batch's mean loss.
With several pipelines, each takes its own part of the global batch and the
ranks of a stage average their gradients (all_reduce AVG over a group made
with new_group) before SGD steps.

At the end every rank checks its stage's weights against a copy of the whole
model it trained alone on the global batches (allclose: sums run in another
order) and prints "OK pipeline rank R", or exits 1.

Run (from the source tree, after make; the library and extension are found
as fastreduce.backend says; Debian 12's torchrun needs
--redirects and --tee other than 0, see examples/README.md):

    PYTHONPATH=python build/frrun -n 2 /usr/bin/python3 examples/torch/pipeline.py
    PYTHONPATH=python torchrun --nproc_per_node 2 --redirects 1 --tee 1 examples/torch/pipeline.py
    (-n 4 / --nproc_per_node 4: two pipelines x data parallel)
"""

import copy
import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import fastreduce.torch  # noqa: F401  registers the backend "fastreduce"

D, H, O = 8, 16, 4
BATCH, MICRO, STEPS, LR = 16, 4, 5, 0.1  # BATCH rows per pipeline, in MICRO pieces


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


def batch(step, n):
    """Global batch of a step: n rows, the same on every rank."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(n, D, generator=g), torch.randn(n, O, generator=g)


def main():
    torch.set_num_threads(1)  # several ranks share the cores
    init()
    rank, size = dist.get_rank(), dist.get_world_size()
    if size % 2:
        sys.exit("pipeline: needs an even number of ranks (2 stages per pipeline)")
    stage, pipe, npipes = rank % 2, rank // 2, size // 2
    peer = rank ^ 1  # the other stage of our pipeline

    # every rank creates both stages' DP groups, in the same order
    groups = [dist.new_group(list(range(s, size, 2))) for s in (0, 1)]
    dp_group = groups[stage]

    torch.manual_seed(0)  # the same whole model on every rank
    ref = nn.Sequential(nn.Linear(D, H), nn.Tanh(), nn.Linear(H, H), nn.Tanh(), nn.Linear(H, O))
    ours = copy.deepcopy(ref[:4] if stage == 0 else ref[4:])
    opt = torch.optim.SGD(ours.parameters(), lr=LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=LR)

    for step in range(STEPS):
        xg, yg = batch(step, BATCH * npipes)
        x, y = xg[pipe * BATCH:(pipe + 1) * BATCH], yg[pipe * BATCH:(pipe + 1) * BATCH]
        opt.zero_grad()
        saved = []  # per micro-batch: what its backward needs
        # all forwards
        for m, (xm, ym) in enumerate(zip(x.chunk(MICRO), y.chunk(MICRO))):
            if stage == 0:
                a = ours(xm)
                dist.send(a.detach(), peer, tag=m)
                saved.append(a)
            else:
                a = torch.empty(len(xm), H)
                dist.recv(a, peer, tag=m)
                a.requires_grad_()  # a leaf: its .grad is what stage 0 needs
                saved.append((a, F.mse_loss(ours(a), ym) / MICRO))
        # all backwards, last micro-batch first
        for m in reversed(range(MICRO)):
            if stage == 0:
                g = torch.empty_like(saved[m])
                dist.recv(g, peer, tag=MICRO + m)
                saved[m].backward(g)
            else:
                a, loss = saved[m]
                loss.backward()
                dist.send(a.grad, peer, tag=MICRO + m)
        for p in ours.parameters():  # the pipelines' batches -> the global mean
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, group=dp_group)
        opt.step()
        # the reference: the whole global batch in one process
        ref_opt.zero_grad()
        F.mse_loss(ref(xg), yg).backward()
        ref_opt.step()

    mine = ref[:4] if stage == 0 else ref[4:]
    pairs = list(zip(ours.parameters(), mine.parameters()))
    diff = max((p - q).abs().max().item() for p, q in pairs)
    ok = all(torch.allclose(p, q, rtol=1e-4, atol=1e-5) for p, q in pairs)
    dist.destroy_process_group()
    if not ok:
        print("FAIL pipeline rank %d: stage %d differs from the reference (max diff %.3g)"
              % (rank, stage, diff))
        sys.exit(1)
    print("OK pipeline rank %d (stage %d of pipeline %d/%d, %d micro-batches, %d steps, "
          "max diff %.3g)" % (rank, stage, pipe, npipes, MICRO, STEPS, diff))


if __name__ == "__main__":
    main()
