"""One rank of the DDP training test (run under frrun by test_ddp.py).

Trains the same MLP (64-128-64-10, fixed seed) on the sklearn digits
(examples/data/digits.csv) three ways in one process, every rank taking its
own shard of each mini-batch:

  gloo   stock DDP over torch's Gloo process group (the reference)
  hook   DDP with fastreduce.torch.allreduce_hook, no compression
  bf16, int8
         the hook with compression and error feedback

and writes, as JSON: the final full-data loss of each run, the largest
parameter difference between "hook" and "gloo", and a hash of each run's
parameters (the test checks that every rank has the same).  Small DDP
buckets (bucket_cap_mb) make several buckets, so the hook sees more than
one per step, and DDP's bucket rebuild after step 1.
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import fastreduce
import fastreduce.torch as frt


def load_digits(path):
    data = np.loadtxt(path, delimiter=",", dtype=np.float32)
    x = torch.from_numpy(data[:, 1:] / 16.0)
    y = torch.from_numpy(data[:, 0].astype(np.int64))
    return x, y


def make_model():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64),
                         nn.ReLU(), nn.Linear(64, 10))


def train(ddp, x, y, rank, size, steps, batch, lr):
    opt = torch.optim.SGD(ddp.parameters(), lr=lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(99)  # same batches on every rank
    for _ in range(steps):
        idx = torch.randint(0, x.shape[0], (batch * size,), generator=g)
        mine = idx[rank * batch:(rank + 1) * batch]
        opt.zero_grad()
        loss_fn(ddp(x[mine]), y[mine]).backward()
        opt.step()
    with torch.no_grad():
        return float(loss_fn(ddp.module(x), y))


def params(ddp):
    return torch.cat([p.detach().reshape(-1) for p in ddp.module.parameters()])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--modes", default="gloo,hook,bf16,int8")
    a = ap.parse_args()

    torch.set_num_threads(1)
    frt.init_process_group("gloo")
    comm = fastreduce.Comm(progress="thread")
    rank, size = comm.rank, comm.size
    assert (rank, size) == (dist.get_rank(), dist.get_world_size())
    x, y = load_digits(a.data)
    out = {"rank": rank, "size": size, "loss": {}, "hash": {}}
    ref = None
    # DDP puts the first 1 MiB of gradients in one bucket: shrink that too,
    # so that this small model makes several buckets from the first step.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 16384
    for mode in a.modes.split(","):
        ddp = DDP(make_model(), bucket_cap_mb=0.02)
        state = None
        if mode != "gloo":
            state = frt.FastReduceState(comm, compress=None if mode == "hook" else mode)
            ddp.register_comm_hook(state, frt.allreduce_hook)
        out["loss"][mode] = train(ddp, x, y, rank, size, a.steps, a.batch, a.lr)
        p = params(ddp)
        out["hash"][mode] = hashlib.sha256(p.numpy().tobytes()).hexdigest()
        if mode == "gloo":
            ref = p
        elif mode == "hook" and ref is not None:
            out["max_diff_vs_gloo"] = float((p - ref).abs().max())
            out["max_abs_param"] = float(ref.abs().max())
        if state is not None:
            out.setdefault("buckets", {})[mode] = state.buckets
            state.close()
    st = comm.stats()
    out["wire_bytes"] = st["wire_bytes"]
    out["compress_in_bytes"] = st["compress_in_bytes"]
    comm.close()
    dist.destroy_process_group()
    with open("%s.%d" % (a.out, rank), "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    sys.exit(main())
