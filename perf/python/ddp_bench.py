"""One rank of the DDP step-time benchmark: stock Gloo DDP vs DDP with the
fastreduce comm hook (fastreduce.torch.allreduce_hook).

Launch N ranks under frrun (loopback) or with perf/python/netns_ddp.sh (one
rank per network namespace, shaped links); see perf/python/README.md.

Every mode trains the same MLP (same seeded initial weights, same seeded
synthetic data; each rank its own batch) with plain SGD, in one process, one
mode after the other, each with its own DDP instance:

  gloo   stock DDP, gradients over torch's Gloo process group
  hook   DDP + fastreduce hook, no compression
  bf16   the hook, bf16 on the wire + error feedback
  int8   the hook, int8 on the wire + error feedback
  backend  stock DDP over a "fastreduce" process group (the backend, no
         hook: dist.new_group(backend="fastreduce"))
  zero   fastreduce.torch.ShardedDataParallel (ZeRO stage 2) over that
         group: gradients reduce-scattered into shards during backward, the
         optimizer on the shard, parameters all-gathered behind the next
         forward (its bucket size is --bucket-cap-mb too)
  local  no DDP, no communication: the compute-only floor (optional)

--optim adam gives the optimizer a state (SGD without momentum has none);
each mode reports the optimizer state it holds per rank (rank 0's).

Per mode: --warmup untimed steps (DDP rebuilds its buckets after the first),
one Gloo barrier, then --steps timed steps with no synchronisation between
them.  A step is zero_grad + forward + loss + backward (DDP reduces the
gradients during backward and waits for them at its end) + optimizer step;
each rank records every step's wall time (and, inside it, forward,
backward-including-the-wait-for-the-gradients, and optimizer times).  Per
rank: median, mean, min; the figure of a mode is the maximum over ranks of
each statistic (a step is as slow as its slowest rank), gathered over Gloo
after the timed loop.

--rounds K repeats the mode list K times (every other round in reverse order,
so slow drifts of a shared machine hit all modes alike); rank 0 prints one
table per round and a summary with the rounds side by side, and writes
--csv FILE (one row per round and mode).
"""

import argparse
import csv
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import fastreduce
import fastreduce.torch as frt

MODES = ("gloo", "hook", "bf16", "int8", "backend", "zero", "local")


def make_model(sizes):
    torch.manual_seed(1234)
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def make_data(sizes, batch, nbatches, rank):
    g = torch.Generator().manual_seed(4242 + rank)
    xs = [torch.randn(batch, sizes[0], generator=g) for _ in range(nbatches)]
    ys = [torch.randint(0, sizes[-1], (batch,), generator=g) for _ in range(nbatches)]
    return xs, ys


def make_optim(a, params):
    if a.optim == "adam":
        return torch.optim.Adam(params, lr=a.lr)
    return torch.optim.SGD(params, lr=a.lr)


def state_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values()
               for v in st.values() if torch.is_tensor(v))


def run_mode(mode, a, sizes, data, comm, group):
    """Warm up, time a.steps steps; returns (per-step seconds, phases,
    buckets/step, optimizer state bytes)."""
    net = make_model(sizes)
    state = None
    if mode == "local":
        model = net
    elif mode == "backend":
        model = DDP(net, bucket_cap_mb=a.bucket_cap_mb, process_group=group,
                    gradient_as_bucket_view=a.bucket_view)
    elif mode == "zero":
        model = frt.ShardedDataParallel(
            net, torch.optim.Adam if a.optim == "adam" else torch.optim.SGD,
            process_group=group, bucket_mb=a.bucket_cap_mb, lr=a.lr)
    else:
        model = DDP(net, bucket_cap_mb=a.bucket_cap_mb,
                    gradient_as_bucket_view=a.bucket_view)
        if mode != "gloo":
            state = frt.FastReduceState(comm, compress=None if mode == "hook" else mode,
                                        error_feedback=not a.no_ef)
            model.register_comm_hook(state, frt.allreduce_hook)
    # the sharded mode steps its own optimizer on its shards
    opt = model if mode == "zero" else make_optim(a, model.parameters())
    loss_fn = nn.CrossEntropyLoss()
    xs, ys = data

    def step(i, phases=None):
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(xs[i % len(xs)]), ys[i % len(ys)])
        t1 = time.perf_counter()
        loss.backward()  # with DDP: returns once every bucket is reduced
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if phases is not None:
            phases.append((t1 - t0, t2 - t1, t3 - t2))
        return loss

    for i in range(a.warmup):
        step(i)
    b0 = state.buckets if state is not None else 0
    dist.barrier()
    times, phases = [], []
    for i in range(a.steps):
        t0 = time.perf_counter()
        step(a.warmup + i, phases)
        times.append(time.perf_counter() - t0)
    bps = (state.buckets - b0) / a.steps if state is not None else 0.0
    if mode == "zero":
        bps = len(model.buckets)
        nbytes = model.optimizer_state_bytes()
    else:
        nbytes = state_bytes(opt)
    if state is not None:
        state.close()
    del model, opt, net
    return times, phases, bps, nbytes


def gather_max(vals):
    """Element-wise max over ranks of a list of floats (Gloo all-reduce)."""
    t = torch.tensor(vals, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", default="gloo,hook,bf16,int8",
                    help="comma-separated, of %s (default %%(default)s)" % ",".join(MODES))
    ap.add_argument("--sizes", default="1024,2048,2048,2048,1000",
                    help="MLP layer widths (default %(default)s)")
    ap.add_argument("--batch", type=int, default=32, help="per-rank batch (default 32)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per mode")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--optim", choices=("sgd", "adam"), default="sgd",
                    help="optimizer (default sgd, without momentum: no state)")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0,
                    help="DDP bucket_cap_mb (default 25, DDP's own)")
    ap.add_argument("--first-bucket-mb", type=float, default=None,
                    help="DDP's first bucket cap (torch default 1 MiB)")
    ap.add_argument("--bucket-view", action="store_true",
                    help="DDP gradient_as_bucket_view=True")
    ap.add_argument("--no-ef", action="store_true", help="compression without error feedback")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--csv", default=None, help="rank 0 writes the results here")
    ap.add_argument("--label", default="", help="free text for the CSV 'label' column")
    a = ap.parse_args()

    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            ap.error("unknown mode %r" % m)
    sizes = [int(s) for s in a.sizes.split(",")]
    torch.set_num_threads(a.threads)
    if a.first_bucket_mb is not None:
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(a.first_bucket_mb * 1024 * 1024)

    frt.init_process_group("gloo")
    comm = fastreduce.Comm(progress="thread")
    rank, size = comm.rank, comm.size
    assert (rank, size) == (dist.get_rank(), dist.get_world_size())

    # the backend's group, for the modes that need it (every rank makes it)
    group = dist.new_group(backend="fastreduce") if {"backend", "zero"} & set(modes) else None

    nparams = sum(p.numel() for p in make_model(sizes).parameters())
    data = make_data(sizes, a.batch, 4, rank)
    if rank == 0:
        print("ddp_bench: %d ranks, MLP %s, %d gradient parameters (%.1f MB f32), "
              "batch %d/rank, warmup %d, steps %d, rounds %d, bucket_cap_mb %g, "
              "optimizer %s, transport %s, torch %s, threads %d"
              % (size, "-".join(map(str, sizes)), nparams, nparams * 4 / 1e6, a.batch,
                 a.warmup, a.steps, a.rounds, a.bucket_cap_mb, a.optim, comm.transport,
                 torch.__version__, torch.get_num_threads()), flush=True)

    results = []  # (round, mode, stats dict)
    for rnd in range(a.rounds):
        order = modes if rnd % 2 == 0 else modes[::-1]
        for mode in order:
            times, phases, bps, nbytes = run_mode(mode, a, sizes, data, comm, group)
            med, mean, mn = statistics.median(times), statistics.fmean(times), min(times)
            ph = [statistics.median(p[k] for p in phases) for k in range(3)]
            gmed, gmean, gmin, gbps, gf, gb, go = gather_max([med, mean, mn, bps] + ph)
            st = {"median_ms": gmed * 1e3, "mean_ms": gmean * 1e3, "min_ms": gmin * 1e3,
                  "buckets_per_step": gbps, "fwd_ms": gf * 1e3, "bwd_ms": gb * 1e3,
                  "opt_ms": go * 1e3, "optim_state_mb": nbytes / 1e6,
                  "rank0_steps_ms": " ".join("%.1f" % (t * 1e3) for t in times)}
            results.append((rnd, mode, st))
            if rank == 0:
                print("  round %d %-5s median %8.1f ms  mean %8.1f ms  min %8.1f ms  "
                      "(fwd %.1f bwd+comm %.1f opt %.1f)  buckets/step %.1f  optim state %.1f MB"
                      % (rnd, mode, st["median_ms"], st["mean_ms"], st["min_ms"],
                         st["fwd_ms"], st["bwd_ms"], st["opt_ms"], gbps,
                         st["optim_state_mb"]), flush=True)

    if rank == 0:
        report(results, a, sizes, nparams, size)
    st = comm.stats()
    if rank == 0:
        print("fastreduce stats (rank 0): wire_bytes %d, compress_in_bytes %d"
              % (st["wire_bytes"], st["compress_in_bytes"]))
    comm.close()
    dist.destroy_process_group()
    return 0


def report(results, a, sizes, nparams, size):
    by = {(r, m): s for r, m, s in results}
    rounds = sorted({r for r, _, _ in results})
    modes = []
    for _, m, _ in results:
        if m not in modes:
            modes.append(m)

    def ratio(r, m, key):
        g = by.get((r, "gloo"))
        return by[(r, m)][key] / g[key] if g else float("nan")

    print()
    print("| mode | params | " + " | ".join(
        "r%d median ms | r%d mean ms | r%d ratio vs gloo (median)" % (r, r, r)
        for r in rounds) + " |")
    print("|---|---:|" + "---:|---:|---:|" * len(rounds))
    for m in modes:
        cells = []
        for r in rounds:
            s = by[(r, m)]
            cells += ["%.1f" % s["median_ms"], "%.1f" % s["mean_ms"], "%.3f" % ratio(r, m, "median_ms")]
        print("| %s | %d | %s |" % (m, nparams, " | ".join(cells)))
    print()
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["label", "ranks", "round", "mode", "params", "model", "batch",
                        "steps", "bucket_cap_mb", "buckets_per_step", "step_ms_median",
                        "step_ms_mean", "step_ms_min", "ratio_median_vs_gloo",
                        "ratio_mean_vs_gloo", "fwd_ms_median", "bwd_ms_median",
                        "opt_ms_median", "optim_state_mb", "rank0_steps_ms"])
            for r, m, s in results:
                w.writerow([a.label, size, r, m, nparams, "-".join(map(str, sizes)), a.batch,
                            a.steps, a.bucket_cap_mb, "%.2f" % s["buckets_per_step"],
                            "%.2f" % s["median_ms"], "%.2f" % s["mean_ms"], "%.2f" % s["min_ms"],
                            "%.4f" % ratio(r, m, "median_ms"), "%.4f" % ratio(r, m, "mean_ms"),
                            "%.2f" % s["fwd_ms"], "%.2f" % s["bwd_ms"], "%.2f" % s["opt_ms"],
                            "%.3f" % s["optim_state_mb"], s["rank0_steps_ms"]])
        print("wrote %s" % a.csv)


if __name__ == "__main__":
    sys.exit(main())
