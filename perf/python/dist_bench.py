"""One rank of the torch.distributed collectives benchmark: the "fastreduce"
backend against torch's own Gloo, side by side in one job.

The default group is "fastreduce" (dist.init_process_group); a second group
over the same ranks is Gloo (dist.new_group(backend="gloo")).  For every
collective and size, in rounds (every other round Gloo first), each side
does --warmup untimed calls, a barrier on its group, then timed calls one
after the other; every rank records each call's time, and after the loop a
Gloo all_reduce(MAX) of those gives, per call, the slowest rank's time.  The
figure is the median over calls (p99 and min too), the same statistic for
both sides; busbw as nccl-tests: all_reduce 2(n-1)/n * bytes / t,
all_gather and reduce_scatter (n-1)/n * bytes / t with bytes the whole
tensor (the gathered output, the scattered input).

What each side calls (torch 1.13's Gloo has no all_gather_into_tensor or
reduce_scatter on CPU, so it gets what a user of it must write instead):

  all_reduce      dist.all_reduce                 | dist.all_reduce
  all_gather      dist.all_gather_into_tensor     | dist.all_gather of a list
  reduce_scatter  dist.reduce_scatter_tensor      | dist.all_reduce, then a slice

Launch with perf/python/netns_ddp.sh --script dist_bench.py BUILD N RATE
[ARGS] (one rank per network namespace, shaped links) or under frrun;
rank 0 prints a Markdown table and writes --csv FILE.
"""

import argparse
import csv
import datetime
import os
import statistics
import time

import torch
import torch.distributed as dist

import fastreduce.torch  # noqa: F401  registers "fastreduce"

COLLS = ("all_reduce", "all_gather", "reduce_scatter")


def parse_size(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * m[s[-1].upper()] if s[-1].upper() in m else int(s)


def fmt_size(b):
    for u, k in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k and b % k == 0:
            return "%d %s" % (b // k, u)
    return "%d B" % b


def bus_factor(coll, n):
    """busbw = bus_factor * bytes / time, as nccl-tests."""
    return 2.0 * (n - 1) / n if coll == "all_reduce" else (n - 1.0) / n


def iters_for(nbytes, args):
    if args.iters:
        return args.iters
    # about 64 MiB worth of data, 3..50 calls
    return max(3, min(50, (64 << 20) // max(nbytes, 1)))


def make_call(coll, side, nbytes, n, rank, group):
    count = nbytes // 4
    if coll == "all_reduce":
        t = torch.ones(count)
        return lambda: dist.all_reduce(t, group=group)
    if coll == "all_gather":
        shard = count // n
        inp = torch.full((shard,), float(rank))
        if side == "fastreduce":
            out = torch.empty(shard * n)
            return lambda: dist.all_gather_into_tensor(out, inp, group=group)
        outs = [torch.empty(shard) for _ in range(n)]
        return lambda: dist.all_gather(outs, inp, group=group)
    shard = count // n  # reduce_scatter
    inp = torch.ones(shard * n)
    if side == "fastreduce":
        out = torch.empty(shard)
        return lambda: dist.reduce_scatter_tensor(out, inp, group=group)

    def gloo_rs():
        t = inp.clone()
        dist.all_reduce(t, group=group)
        return t[rank * shard:(rank + 1) * shard].clone()
    return gloo_rs


def measure(call, iters, warmup, group, gloo, trace=None):
    for _ in range(warmup):
        call()
    dist.barrier(group=group)
    times = torch.empty(iters, dtype=torch.float64)
    for i in range(iters):
        t0 = time.perf_counter()
        call()
        times[i] = time.perf_counter() - t0
    dist.all_reduce(times, op=dist.ReduceOp.MAX, group=gloo)  # per call, the slowest rank
    if trace is not None:
        trace(times.tolist())
    us = sorted(x * 1e6 for x in times.tolist())
    return statistics.median(us), us[min(len(us) - 1, int(0.99 * len(us)))], us[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--colls", default="all_reduce,all_gather,reduce_scatter")
    ap.add_argument("--sizes", default="64K,1M,64M")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=0, help="timed calls (default by size)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--csv", default=None)
    ap.add_argument("--per-call", action="store_true",
                    help="rank 0 prints every timed call's time (the slowest rank's)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds")
    args = ap.parse_args()

    rank, n = int(os.environ["FR_RANK"]), int(os.environ["FR_NRANKS"])
    host, port = os.environ["FR_RENDEZVOUS"].rsplit(":", 1)
    dist.init_process_group("fastreduce", init_method="tcp://%s:%d" % (host, int(port) + 2),
                            rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=args.timeout))
    gloo = dist.new_group(backend="gloo")
    sides = {"fastreduce": None, "gloo": gloo}
    colls = [c for c in args.colls.split(",") if c]
    for c in colls:
        if c not in COLLS:
            raise SystemExit("dist_bench: unknown collective %s (%s)" % (c, ", ".join(COLLS)))
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    rows = []
    for rnd in range(args.rounds):
        order = ["fastreduce", "gloo"] if rnd % 2 == 0 else ["gloo", "fastreduce"]
        for coll in colls:
            for nbytes in sizes:
                nbytes -= nbytes % (4 * n)
                for side in order:
                    call = make_call(coll, side, nbytes, n, rank, sides[side])
                    def trace(ts, what="%s %s %s round %d" % (coll, fmt_size(nbytes), side, rnd)):
                        if rank == 0:
                            print("# %s: %s us" % (what, " ".join("%.0f" % (t * 1e6) for t in ts)),
                                  flush=True)
                    med, p99, mn = measure(call, iters_for(nbytes, args), args.warmup,
                                           sides[side], gloo, trace if args.per_call else None)
                    rows.append(dict(round=rnd, coll=coll, bytes=nbytes, side=side,
                                     median_us=med, p99_us=p99, min_us=mn,
                                     busbw_GBps=bus_factor(coll, n) * nbytes / (med * 1e-6) / 1e9))
    if rank == 0:
        print("| collective | size | side | rounds | median (us) | p99 (us) | min (us) "
              "| busbw (GB/s) | fastreduce / gloo busbw |")
        print("|:--|---:|:--|---:|---:|---:|---:|---:|---:|")
        for coll in colls:
            for nbytes in sizes:
                nbytes -= nbytes % (4 * n)
                med = {}
                for side in ("fastreduce", "gloo"):
                    rs = [r for r in rows if r["coll"] == coll and r["bytes"] == nbytes
                          and r["side"] == side]
                    # the median round
                    m = statistics.median(r["median_us"] for r in rs)
                    med[side] = m
                    bw = bus_factor(coll, n) * nbytes / (m * 1e-6) / 1e9
                    ratio = "%.2f" % (m / med["fastreduce"]) if side == "gloo" else ""
                    print("| %s | %s | %s | %d | %.1f | %.1f | %.1f | %.4f | %s |"
                          % (coll, fmt_size(nbytes), side, len(rs), m,
                             statistics.median(r["p99_us"] for r in rs),
                             min(r["min_us"] for r in rs), bw, ratio))
        if args.csv:
            with open(args.csv, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
                w.writeheader()
                w.writerows(rows)
    dist.destroy_process_group(gloo)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
