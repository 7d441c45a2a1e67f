"""One rank of the torch.distributed backend tests (test_backend.py).

Launched by frrun; initialises torch.distributed with the "fastreduce"
backend through a file store, one per job (no Gloo anywhere)
and runs the case named by argv[1]:

  colls  every collective torch code calls, for every dtype and op that
         applies, sizes 0, 1, < ranks, a prime and a large odd one,
         contiguous and not, each against a reference every rank computes
         from the inputs it knows all ranks use; prints "OK colls"
  async  many collectives started before the first wait, futures, Work
         errors (a mismatched count: FR_EMISMATCH in the text, with the rank)
  ddp    DDP over the backend against DDP over a Gloo group of the same
         ranks, same seed, same data: parameters bit-identical after the
         steps, on every rank; prints "OK ddp"
  ddp_variants  the same for find_unused_parameters (a branch some ranks
         leave out on some steps), gradient_as_bucket_view, no_sync
         accumulation, broadcast_buffers=False, and all together
  zero_optim  ZeroRedundancyOptimizer (Adam; parameters_as_bucket_view off
         and on) over the backend against the same over a Gloo group;
         consolidate_state_dict(to=0) holds every parameter's state
  groups new_group (a split of the world's communicator, no rendezvous):
         even and odd ranks, all, each alone; collectives in them
  order  reports not held behind an early receive; chained futures; a
         receive abandoned at destroy fails its Work
  compress  pg_options=Options(compress="bf16") with error feedback
  dead   rank size-1 exits during the run; the others' next collective
         raises a RuntimeError naming the code within the timeout
  dead_ddp  the same in the middle of DDP training: backward raises
"""

import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import fastreduce.torch  # noqa: F401  registers "fastreduce"

RANK = int(os.environ["FR_RANK"])
SIZE = int(os.environ["FR_NRANKS"])
HOST, PORT = os.environ["FR_RENDEZVOUS"].rsplit(":", 1)
# torch's store in a file, one per job (frrun is every rank's parent): no
# second port to choose, which parallel tests could collide on
STORE = "file://%s/fr_backend_store_%d_%s" % (tempfile.gettempdir(), os.getppid(), PORT)

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
COUNTS = sorted({0, 1, max(SIZE - 1, 1), 13, 1031, 65537})


def init(timeout_s=60):
    dist.init_process_group("fastreduce", init_method=STORE,
                            rank=RANK, world_size=SIZE,
                            timeout=datetime.timedelta(seconds=timeout_s))
    assert dist.get_backend() == "fastreduce", dist.get_backend()


def data(rank, count, dtype, salt=0):
    """Rank rank's input: small integers, exact in every dtype and in any
    order of summation (so every op's reference is exact)."""
    g = torch.Generator().manual_seed(1000 * rank + 7 * count + salt)
    lo, hi = (1, 4) if dtype == torch.uint8 else (-3, 4)
    return torch.randint(lo, hi, (count,), generator=g).to(dtype)


def reference(op, count, dtype, salt=0):
    xs = [data(r, count, dtype, salt).to(torch.float64) for r in range(SIZE)]
    acc = xs[0].clone()
    for x in xs[1:]:
        if op == dist.ReduceOp.SUM:
            acc += x
        elif op == dist.ReduceOp.PRODUCT:
            acc *= x
        elif op == dist.ReduceOp.MIN:
            acc = torch.minimum(acc, x)
        elif op == dist.ReduceOp.MAX:
            acc = torch.maximum(acc, x)
        elif op == dist.ReduceOp.AVG:
            acc += x
    if op == dist.ReduceOp.AVG:
        acc /= SIZE
    return acc


def same(got, want, what):
    want = want.to(got.dtype) if want.dtype != got.dtype else want
    if not torch.equal(got, want):
        bad = (got != want).nonzero()
        raise AssertionError("rank %d: %s: %d of %d elements differ, first at %s: %s vs %s"
                             % (RANK, what, bad.numel(), got.numel(), bad[0].tolist(),
                                got.flatten()[bad[0, 0]].item(), want.flatten()[bad[0, 0]].item()))


def ops_for(dtype):
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.MIN, dist.ReduceOp.MAX]
    if SIZE <= 4:  # small products stay exact
        ops.append(dist.ReduceOp.PRODUCT)
    if dtype.is_floating_point:
        ops.append(dist.ReduceOp.AVG)
    return ops


def strided(t):
    """t's values in a tensor that is not contiguous."""
    big = torch.zeros(t.numel() * 2, dtype=t.dtype)
    v = big[::2]
    v.copy_(t)
    assert not v.is_contiguous() or t.numel() <= 1
    return v


def case_colls():
    init()
    for dtype in FLOATS + INTS:
        for count in COUNTS:
            for op in ops_for(dtype):
                t = data(RANK, count, dtype)
                dist.all_reduce(t, op=op)
                what = "all_reduce %s %s n=%d" % (dtype, op, count)
                if op == dist.ReduceOp.AVG:  # a division: within its rounding
                    tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-6
                    assert torch.allclose(t.double(), reference(op, count, dtype),
                                          rtol=tol, atol=tol), "rank %d: %s" % (RANK, what)
                else:
                    same(t, reference(op, count, dtype), what)
            # not contiguous: the result comes back into the view
            t = strided(data(RANK, count, dtype, 1))
            dist.all_reduce(t)
            same(t, reference(dist.ReduceOp.SUM, count, dtype, 1), "all_reduce strided %s" % dtype)
            for root in {0, SIZE - 1}:
                t = data(RANK, count, dtype, 2) if RANK == root else torch.zeros(count, dtype=dtype)
                dist.broadcast(t, src=root)
                same(t, data(root, count, dtype, 2), "broadcast %s root %d" % (dtype, root))
                t = data(RANK, count, dtype, 3)
                dist.reduce(t, dst=root)
                if RANK == root:
                    same(t, reference(dist.ReduceOp.SUM, count, dtype, 3), "reduce %s" % dtype)
                else:  # the others' tensors are left alone
                    same(t, data(RANK, count, dtype, 3), "reduce's input %s" % dtype)
            outs = [torch.full((count,), 9, dtype=dtype) for _ in range(SIZE)]
            dist.all_gather(outs, data(RANK, count, dtype, 4))
            for r in range(SIZE):
                same(outs[r], data(r, count, dtype, 4), "all_gather %s from %d" % (dtype, r))
            out = torch.empty(count * SIZE, dtype=dtype)
            dist.all_gather_into_tensor(out, data(RANK, count, dtype, 5))
            same(out, torch.cat([data(r, count, dtype, 5) for r in range(SIZE)]),
                 "all_gather_into_tensor %s" % dtype)
            # reduce-scatter: rank r's input is SIZE blocks of count
            full = [data(r, count * SIZE, dtype, 6) for r in range(SIZE)]
            want = sum(f.to(torch.float64) for f in full)[RANK * count:(RANK + 1) * count]
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter_tensor(out, full[RANK])
            same(out, want, "reduce_scatter_tensor %s n=%d" % (dtype, count))
            out = torch.empty(count, dtype=dtype)
            dist.reduce_scatter(out, list(full[RANK].split(count)) if count else
                                [torch.empty(0, dtype=dtype)] * SIZE)
            same(out, want, "reduce_scatter %s n=%d" % (dtype, count))
            # all-to-all: rank r sends block j (count + j elements) to j
            ins = [data(RANK, count + j, dtype, 10 + j) for j in range(SIZE)]
            outs = [torch.full((count + RANK,), 9, dtype=dtype) for _ in range(SIZE)]
            dist.all_to_all(outs, ins)
            for r in range(SIZE):
                same(outs[r], data(r, count + RANK, dtype, 10 + RANK), "all_to_all %s" % dtype)
            # all_to_all_single, even and with splits (rows of 2 columns)
            src = data(RANK, SIZE * count, dtype, 11)
            out = torch.empty(SIZE * count, dtype=dtype)
            dist.all_to_all_single(out, src)
            same(out, torch.cat([data(r, SIZE * count, dtype, 11)[RANK * count:(RANK + 1) * count]
                                 for r in range(SIZE)]), "all_to_all_single %s" % dtype)
            ins_rows = [(count + j) % 3 for j in range(SIZE)]  # rows rank RANK sends to j
            src = data(RANK, 2 * sum(ins_rows), dtype, 12).reshape(-1, 2)
            out_rows = [(count + RANK) % 3] * SIZE
            out = torch.empty(sum(out_rows), 2, dtype=dtype)
            dist.all_to_all_single(out, src, out_rows, ins_rows)
            want = []
            for r in range(SIZE):
                rs = data(r, 2 * sum(ins_rows), dtype, 12).reshape(-1, 2)
                want.append(rs[sum(ins_rows[:RANK]):sum(ins_rows[:RANK + 1])])
            same(out, torch.cat(want), "all_to_all_single splits %s" % dtype)
            for root in {0, SIZE - 1}:
                gl = [torch.empty(count, dtype=dtype) for _ in range(SIZE)] if RANK == root else None
                dist.gather(data(RANK, count, dtype, 13), gl, dst=root)
                if RANK == root:
                    for r in range(SIZE):
                        same(gl[r], data(r, count, dtype, 13), "gather %s" % dtype)
                out = torch.empty(count, dtype=dtype)
                sl = [data(root, count, dtype, 14 + j) for j in range(SIZE)] if RANK == root else None
                dist.scatter(out, sl, src=root)
                same(out, data(root, count, dtype, 14 + RANK), "scatter %s" % dtype)
            # point-to-point around the ring, and a pair that crosses
            if SIZE > 1:
                nxt, prv = (RANK + 1) % SIZE, (RANK - 1) % SIZE
                t = torch.empty(count, dtype=dtype)
                reqs = [dist.isend(data(RANK, count, dtype, 15), nxt, tag=5),
                        dist.irecv(t, prv, tag=5)]
                for q in reqs:
                    q.wait()
                same(t, data(prv, count, dtype, 15), "isend/irecv %s" % dtype)
                if RANK < 2:
                    t = strided(torch.zeros(count, dtype=dtype))
                    if RANK == 0:
                        dist.send(data(0, count, dtype, 16), 1, tag=count)
                        dist.recv(t, 1, tag=count)
                        same(t, data(1, count, dtype, 16), "recv %s" % dtype)
                    else:
                        dist.recv(t, 0, tag=count)
                        same(t, data(0, count, dtype, 16), "recv %s" % dtype)
                        dist.send(data(1, count, dtype, 16), 0, tag=count)
    # bool: SUM is a logical or, as Gloo and NCCL give it
    t = torch.tensor([RANK == 0, False, True])
    dist.all_reduce(t)
    same(t, torch.tensor([True, False, True]), "all_reduce bool")
    # several tensors at once
    ts = [data(RANK, c, torch.float32, 8).reshape(-1, 1) for c in (3, 0, 17)]
    dist.all_reduce_coalesced(ts)
    for c, t in zip((3, 0, 17), ts):
        same(t.flatten(), reference(dist.ReduceOp.SUM, c, torch.float32, 8), "coalesced %d" % c)
    dist.barrier()
    # into parameters that require grad (results copied back on our own
    # threads, where grad mode is on unless the group turns it off),
    # under no_grad as optimizers and DDP do
    w = torch.nn.Parameter(data(RANK, 12, torch.float32, 9).reshape(4, 3).t())
    assert not w.is_contiguous()
    ps = [torch.nn.Parameter(data(RANK, c, torch.float32, 10)) for c in (5, 7)]
    with torch.no_grad():
        dist.broadcast(w, 0)
        dist.all_reduce_coalesced(ps)
    same(w.detach().t().flatten(), data(0, 12, torch.float32, 9), "broadcast into a parameter")
    for c, p in zip((5, 7), ps):
        same(p.detach(), reference(dist.ReduceOp.SUM, c, torch.float32, 10),
             "coalesced parameters %d" % c)
    dist.barrier()
    # refused clearly, not crashed
    for bad, what in ((lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int16)), "int16"),
                      (lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int32),
                                               op=dist.ReduceOp.AVG), "AVG"),
                      (lambda: dist.all_reduce(torch.zeros(3, dtype=torch.int32),
                                               op=dist.ReduceOp.BAND), "BAND"),
                      (lambda: dist.recv(torch.zeros(3)), "recv from any source")):
        try:
            bad()
        except (RuntimeError, ValueError) as e:
            assert "fastreduce" in str(e), str(e)
        else:
            raise AssertionError("%s was accepted" % what)
    dist.barrier()
    dist.destroy_process_group()
    print("OK colls rank %d" % RANK, flush=True)


def case_async():
    init()
    ts = [data(RANK, 1000 + i, torch.float32, i) for i in range(20)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    futs = [w.get_future() for w in works]
    for i, (w, f) in enumerate(zip(works, futs)):
        w.wait()
        (res,) = f.wait()
        same(res, reference(dist.ReduceOp.SUM, 1000 + i, torch.float32, i), "async %d" % i)
        assert w.is_completed()
    # a count that differs between ranks fails on every rank, with the code
    t = torch.ones(10 + (RANK == 0))
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        msg = str(e)
        assert "FR_E" in msg and ("rank %d" % RANK) in msg, msg
    else:
        raise AssertionError("a count mismatch was accepted")
    print("OK async rank %d" % RANK, flush=True)
    os._exit(0)  # the communicator has failed: leave without a goodbye


def case_ddp():
    init()
    gloo = dist.new_group(backend="gloo")

    def train(group):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.BatchNorm1d(64),
                                  torch.nn.ReLU(), torch.nn.Linear(64, 4))
        if RANK:  # DDP's broadcast must fix this
            for p in net.parameters():
                p.data.add_(RANK)
        model = torch.nn.parallel.DistributedDataParallel(net, process_group=group,
                                                          bucket_cap_mb=0.01)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(RANK)
        for _ in range(6):
            x = torch.randn(16, 20, generator=g)
            y = torch.randint(0, 4, (16,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return ([p.detach().clone() for p in model.parameters()],
                [b.detach().clone() for b in model.buffers()])

    ours, our_bufs = train(None)  # the default group: fastreduce
    theirs, their_bufs = train(gloo)
    for i, (a, b) in enumerate(zip(ours + our_bufs, theirs + their_bufs)):
        # the same sums in a different order: equal within rounding
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), \
            "rank %d: tensor %d differs from Gloo's by %g" % (RANK, i, (a - b).abs().max())
    # and the parameters identical on every rank (the BatchNorm statistics
    # are each rank's own after its last forward, as in any DDP run)
    for a in ours:
        outs = [torch.empty_like(a) for _ in range(SIZE)]
        dist.all_gather(outs, a)
        for o in outs:
            same(o, a, "DDP parameters across ranks")
    dist.destroy_process_group()
    print("OK ddp rank %d" % RANK, flush=True)


class Branchy(torch.nn.Module):
    """A trunk with BatchNorm, a head always used and a branch used only
    when the caller says: with find_unused_parameters=True DDP finds the
    branch's parameters missing from the graph and agrees on which were
    used anywhere by an int32 allreduce of its bitmap, every step."""

    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(20, 32)
        self.bn = torch.nn.BatchNorm1d(32)
        self.head = torch.nn.Linear(32, 4)
        self.branch = torch.nn.Linear(32, 4)

    def forward(self, x, use_branch=True):
        h = torch.relu(self.bn(self.trunk(x)))
        out = self.head(h)
        return out + self.branch(h) if use_branch else out


def compare_with_gloo(ours, theirs, what):
    for i, (a, b) in enumerate(zip(ours, theirs)):
        # the same sums in a different order: equal within rounding
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), \
            "rank %d: %s: tensor %d differs from Gloo's by %g" % (RANK, what, i,
                                                                  (a - b).abs().max())


def identical_across_ranks(ts, what):
    for a in ts:
        outs = [torch.empty_like(a) for _ in range(SIZE)]
        dist.all_gather(outs, a)
        for o in outs:
            same(o, a, what + ": parameters across ranks")


def case_ddp_variants():
    """DDP's options that change what it sends or when: each run over the
    backend and over Gloo, same seed and data, parameters compared."""
    init()
    gloo = dist.new_group(backend="gloo")

    def train(group, find_unused=False, bucket_view=False, accumulate=1,
              broadcast_buffers=True):
        torch.manual_seed(0)
        net = Branchy()
        if RANK:  # DDP's broadcast must fix this
            for p in net.parameters():
                p.data.add_(RANK)
        model = torch.nn.parallel.DistributedDataParallel(
            net, process_group=group, bucket_cap_mb=0.001,
            find_unused_parameters=find_unused, gradient_as_bucket_view=bucket_view,
            broadcast_buffers=broadcast_buffers)
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(RANK)
        branch_used = 0
        for step in range(5):
            opt.zero_grad()
            for micro in range(accumulate):
                x = torch.randn(16, 20, generator=g)
                y = torch.randint(0, 4, (16,), generator=g)
                # each rank leaves the branch out on its own steps, and on
                # some steps every rank does (rank r uses it when
                # (step + r) % 4 == 0): used here and not there, and unused
                # everywhere, both happen on 2 and 3 ranks
                use = not find_unused or (step + RANK) % 4 == 0
                branch_used += use
                if micro < accumulate - 1:
                    with model.no_sync():  # gradients add up locally
                        torch.nn.functional.cross_entropy(model(x, use), y).backward()
                else:
                    torch.nn.functional.cross_entropy(model(x, use), y).backward()
            if bucket_view:  # the gradients are DDP's buckets, not copies
                assert all(p.grad is None or p.grad._base is not None
                           for p in model.parameters())
            opt.step()
        assert not find_unused or 0 < branch_used < 5 * accumulate
        return ([p.detach().clone() for p in model.parameters()],
                [b.detach().clone() for b in model.buffers()])

    variants = {
        "find_unused_parameters": dict(find_unused=True),
        "gradient_as_bucket_view": dict(bucket_view=True),
        "no_sync": dict(accumulate=3),
        "broadcast_buffers=False": dict(broadcast_buffers=False),
        "all of them": dict(find_unused=True, bucket_view=True, accumulate=3),
    }
    for what, kw in variants.items():
        ours, our_bufs = train(None, **kw)  # the default group: fastreduce
        theirs, their_bufs = train(gloo, **kw)
        compare_with_gloo(ours + our_bufs, theirs + their_bufs, what)
        identical_across_ranks(ours, what)
    dist.destroy_process_group()
    print("OK ddp_variants rank %d" % RANK, flush=True)


def case_zero_optim():
    """ZeroRedundancyOptimizer (each rank steps its shard of Adam, then
    broadcasts it) over the backend against the same over a Gloo group of
    the same ranks; consolidate_state_dict gathers every shard's state."""
    from torch.distributed.optim import ZeroRedundancyOptimizer
    init()
    gloo = dist.new_group(backend="gloo")

    def train(group, bucket_view):
        torch.manual_seed(0)
        # tensors of unequal sizes: the shards are uneven on 2 and 3 ranks
        net = torch.nn.Sequential(torch.nn.Linear(20, 48), torch.nn.ReLU(),
                                  torch.nn.Linear(48, 24), torch.nn.ReLU(),
                                  torch.nn.Linear(24, 4))
        model = torch.nn.parallel.DistributedDataParallel(net, process_group=group)
        opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                      process_group=group, lr=0.01,
                                      parameters_as_bucket_view=bucket_view)
        g = torch.Generator().manual_seed(RANK)
        for _ in range(5):
            x = torch.randn(16, 20, generator=g)
            y = torch.randint(0, 4, (16,), generator=g)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        opt.consolidate_state_dict(to=0)
        state = opt.state_dict() if RANK == 0 else None
        return [p.detach().clone() for p in model.parameters()], state

    nparams = None
    for bucket_view in (False, True):
        what = "parameters_as_bucket_view=%s" % bucket_view
        ours, our_state = train(None, bucket_view)
        theirs, their_state = train(gloo, bucket_view)
        compare_with_gloo(ours, theirs, what)
        identical_across_ranks(ours, what)
        nparams = len(ours)
        if RANK == 0:
            # every parameter's Adam state, whichever rank stepped it
            assert sorted(our_state["state"]) == list(range(nparams)), our_state["state"].keys()
            for i in range(nparams):
                for k in ("exp_avg", "exp_avg_sq"):
                    compare_with_gloo([our_state["state"][i][k]],
                                      [their_state["state"][i][k]],
                                      "%s: consolidated %s of parameter %d" % (what, k, i))
                assert float(our_state["state"][i]["step"]) == 5, our_state["state"][i]
    dist.destroy_process_group()
    print("OK zero_optim rank %d" % RANK, flush=True)


def case_groups():
    """new_group is a split of the world's communicator: no rendezvous of
    its own; collectives within it; global ranks as torch maps them."""
    from fastreduce import backend
    init()
    evens = [r for r in range(SIZE) if r % 2 == 0]
    odds = [r for r in range(SIZE) if r % 2 == 1]
    ge = dist.new_group(evens)
    go = dist.new_group(odds) if odds else None
    gall = dist.new_group()
    gme = [dist.new_group([r]) for r in range(SIZE)][RANK]  # every rank calls each
    mine, group = (evens, ge) if RANK % 2 == 0 else (odds, go)
    assert dist.get_rank(group) == mine.index(RANK), (dist.get_rank(group), mine)
    assert dist.get_world_size(group) == len(mine)
    t = torch.full((7,), float(RANK + 1))
    dist.all_reduce(t, group=group)
    same(t, torch.full((7,), float(sum(r + 1 for r in mine))), "group all_reduce")
    t = torch.full((5,), float(RANK))
    dist.broadcast(t, src=mine[-1], group=group)  # a global rank, as torch wants
    same(t, torch.full((5,), float(mine[-1])), "group broadcast")
    t = torch.ones(3)
    dist.all_reduce(t, group=gall)
    same(t, torch.full((3,), float(SIZE)), "group of all")
    t = torch.full((3,), float(RANK))
    dist.all_reduce(t, group=gme)
    same(t, torch.full((3,), float(RANK)), "group of one")
    # the world still works, and groups interleave with it
    t = torch.ones(4)
    dist.all_reduce(t)
    same(t, torch.full((4,), float(SIZE)), "world after groups")
    assert backend.stats["rendezvous"] == 1, backend.stats
    assert backend.stats["split"] == 3, backend.stats  # my parity, all, me
    dist.destroy_process_group(group)
    dist.destroy_process_group()
    print("OK groups rank %d" % RANK, flush=True)


def case_order():
    """Reports do not wait behind a receive posted early; a Future's
    callback may start and wait for another collective of the group; after
    wait() the Future's value is there; a group destroyed with a receive
    nobody matches returns, and that receive's Work fails."""
    init()
    a = torch.zeros(5)
    x, y = torch.ones(3), torch.ones(4)
    if SIZE > 1:
        # rank 0 posts a receive that rank 1 matches only after two
        # collectives rank 0 makes blocking
        if RANK == 0:
            r = dist.irecv(a, 1, tag=1)
        dist.all_reduce(x)
        dist.all_reduce(y)
        if RANK == 1:
            dist.send(torch.full((5,), 7.0), 0, tag=1)
        if RANK == 0:
            r.wait()
            same(a, torch.full((5,), 7.0), "early irecv")
    if SIZE > 2:
        # a send's report does not wait behind an unmatched receive either
        if RANK == 0:
            r = dist.irecv(a, 1, tag=2)
            dist.isend(torch.ones(5), 2, tag=2).wait()
            dist.send(torch.ones(5), 1, tag=3)
            r.wait()
        elif RANK == 1:
            dist.recv(torch.zeros(5), 0, tag=3)
            dist.send(torch.full((5,), 2.0), 0, tag=2)
        elif RANK == 2:
            dist.recv(torch.zeros(5), 0, tag=2)
    # a callback that runs another collective and waits for it (PowerSGD)
    z = torch.ones(6)
    fut = dist.all_reduce(torch.ones(2), async_op=True).get_future()
    chained = fut.then(lambda f: dist.all_reduce(z, async_op=True).get_future().wait()[0])
    same(chained.wait(), torch.full((6,), float(SIZE)), "chained future")
    w = dist.all_reduce(torch.ones(2), async_op=True)
    w.wait()
    same(w.get_future().value()[0], torch.full((2,), float(SIZE)), "future after wait")
    dist.barrier()
    if SIZE > 1:
        # rank 0 waits for a message nobody sends, and leaves
        if RANK == 0:
            r = dist.irecv(a, 1, tag=99)
            dist.destroy_process_group()
            try:
                r.wait()
            except RuntimeError as e:
                assert "destroyed" in str(e), str(e)
            else:
                raise AssertionError("an abandoned receive succeeded")
        else:
            dist.destroy_process_group()
    else:
        dist.destroy_process_group()
    print("OK order rank %d" % RANK, flush=True)


def case_compress():
    """pg_options=Options(compress="bf16"): float32 SUM/AVG travel as
    bfloat16 (results identical on every rank, within bf16's rounding of
    the exact sum, not exact), error feedback brings the mean over steps
    back to the exact value; other dtypes and ops stay exact."""
    from fastreduce.backend import Options
    dist.init_process_group("fastreduce", init_method=STORE,
                            rank=RANK, world_size=SIZE, pg_options=Options(compress="bf16"))
    g = torch.Generator().manual_seed(RANK)
    x = torch.rand(4099, generator=g) + 1.0  # needs all of f32's mantissa
    allx = [torch.rand(4099, generator=torch.Generator().manual_seed(r)) + 1.0
            for r in range(SIZE)]
    exact = sum(a.double() for a in allx)
    t = x.clone()
    dist.all_reduce(t)
    err = ((t.double() - exact).abs() / exact).max().item()
    assert err < 2 ** -7 * SIZE, "rank %d: bf16 error %g" % (RANK, err)
    if SIZE > 1:
        assert not torch.equal(t.double(), exact.float().double()), "not compressed"
    outs = [torch.empty_like(t) for _ in range(SIZE)]
    dist.all_gather(outs, t)
    for o in outs:
        same(o, t, "compressed all_reduce across ranks")
    # error feedback: the same buffer, the same values, K steps
    buf, acc, K = x.clone(), torch.zeros(4099, dtype=torch.float64), 64
    for _ in range(K):
        buf.copy_(x)
        dist.all_reduce(buf)
        acc += buf.double()
    err_ef = ((acc / K - exact).abs() / exact).max().item()
    assert SIZE == 1 or err_ef < err / 4, "rank %d: mean error %g, one call %g" % (RANK, err_ef, err)
    # not float32 or not SUM/AVG: exact as ever
    t = data(RANK, 1000, torch.int32)
    dist.all_reduce(t)
    same(t, reference(dist.ReduceOp.SUM, 1000, torch.int32), "int32 under compression")
    t = x.clone()
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    same(t, torch.stack(allx).max(0).values, "MAX under compression")
    dist.destroy_process_group()
    print("OK compress rank %d" % RANK, flush=True)


def case_dead():
    init(timeout_s=5)
    t = torch.ones(100)
    dist.all_reduce(t)
    if RANK == SIZE - 1:
        os._exit(0)
    try:
        for _ in range(100):
            dist.all_reduce(t)
    except RuntimeError as e:
        assert "FR_E" in str(e), str(e)
        print("OK dead rank %d: %s" % (RANK, str(e).splitlines()[0]), flush=True)
        os._exit(0)
    raise AssertionError("no error after a peer died")


def case_dead_ddp():
    """rank size-1 exits in the middle of DDP training: the others' backward
    (DDP's reducer reads the failed all_reduce) raises a RuntimeError that
    names the code, within the timeout; nothing crashes or hangs."""
    init()
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    model = torch.nn.parallel.DistributedDataParallel(net)
    for step in range(100):
        if step == 3 and RANK == SIZE - 1:
            os._exit(0)
        try:
            model(torch.randn(4, 8)).sum().backward()
        except RuntimeError as e:
            assert "FR_E" in str(e), str(e)
            print("OK dead_ddp rank %d: %s" % (RANK, str(e).splitlines()[0][:120]), flush=True)
            os._exit(0)
    raise AssertionError("no error after a peer died")


if __name__ == "__main__":
    {"colls": case_colls, "async": case_async, "ddp": case_ddp, "groups": case_groups,
     "compress": case_compress, "order": case_order,
     "ddp_variants": case_ddp_variants, "zero_optim": case_zero_optim,
     "dead": case_dead, "dead_ddp": case_dead_ddp}[sys.argv[1]]()
