"""One rank of the package API test (run under frrun by test_api.py).

Every collective of fastreduce.Comm, blocking and non-blocking, on numpy
arrays, torch CPU tensors (when torch is installed; bfloat16 and float16
included) and plain buffers, against numpy references computed from every
rank's input (each rank can build all inputs: they depend only on the rank).
Inputs are small integers, so sums and products are exact in every type and
the reference is bit-exact whatever the reduction order.  At the end every
rank all-gathers a digest of all its results; they must be identical.
Exits non-zero (with the failing case) on the first mismatch.
"""

import array
import hashlib
import os
import sys
import time

import numpy as np

import fastreduce as fr

try:
    import torch
except ImportError:  # torch is optional for the API
    torch = None

DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8",
          "int32", "uint32", "int64", "uint64"]
COUNTS = [0, 1, 3, 7, 1000, 65537]
digest = hashlib.sha256()


def f32_to_bf16_bits(a):
    return (np.asarray(a, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def bf16_bits_to_f32(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def inp(rank, n, dt, op):
    """Rank's input: small integers (exact in every dtype)."""
    i = np.arange(n, dtype=np.int64)
    if op == "prod":
        v = np.where((i + rank) % 3 == 0, 2, 1)
        if dt not in ("uint8", "uint32", "uint64"):
            v = np.where((i * 7 + rank) % 5 == 0, -v, v)
    elif dt.startswith("u"):
        v = (i * 3 + rank * 5) % 50
    else:
        v = (i * 3 + rank * 5) % 50 - 20
    return as_dtype(v, dt)


def as_dtype(v, dt):
    if dt == "bfloat16":
        return f32_to_bf16_bits(v.astype(np.float32))
    return v.astype(dt)


def as_f64(a, dt):
    return bf16_bits_to_f32(a).astype(np.float64) if dt == "bfloat16" else a.astype(np.float64)


def reference(size, n, dt, op):
    xs = [as_f64(inp(r, n, dt, op), dt) for r in range(size)]
    if op in ("sum", "avg"):
        ref = np.sum(xs, axis=0) if n else np.zeros(0)
        if op == "avg":
            ref = ref / size
    elif op == "prod":
        ref = np.prod(xs, axis=0) if n else np.zeros(0)
    elif op == "min":
        ref = np.min(xs, axis=0) if n else np.zeros(0)
    else:
        ref = np.max(xs, axis=0) if n else np.zeros(0)
    return ref


def check(name, got, dt, ref, tol=0.0, same=True):
    """got == ref (within tol, relative); same: every rank has this result,
    so it goes into the digest compared across ranks."""
    g = as_f64(np.asarray(got), dt)
    if g.shape != ref.shape or (np.abs(g - ref) > tol * np.maximum(1, np.abs(ref))).any():
        bad = np.nonzero(np.abs(g - ref) > tol * np.maximum(1, np.abs(ref)))[0][:5]
        sys.exit("FAIL %s: at %s got %s want %s" % (name, bad, g[bad], ref[bad]))
    if same:
        digest.update(np.ascontiguousarray(got).tobytes())


def test_allreduce(c):
    n_ranks, rank = c.size, c.rank
    for dt in DTYPES:
        for op in ("sum", "prod", "min", "max", "avg"):
            if op == "avg" and not dt.startswith(("float", "bfloat")):
                continue
            for n in COUNTS:
                ref = reference(n_ranks, n, dt, op)
                tol = {"float16": 1e-3, "bfloat16": 8e-3}.get(dt, 0.0) if op == "avg" else 0.0
                if op == "avg" and dt in ("float32", "float64"):
                    tol = 1e-6
                x = inp(rank, n, dt, op)
                kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
                out = np.empty_like(x)
                c.allreduce(x, op, out=out, **kw)  # out of place
                check("allreduce %s %s n=%d" % (dt, op, n), out, dt, ref, tol)
                if not np.array_equal(x, inp(rank, n, dt, op)):
                    sys.exit("FAIL allreduce changed its input")
                c.allreduce(x, op, **kw)  # in place
                check("allreduce in place %s %s n=%d" % (dt, op, n), x, dt, ref, tol)
                y = inp(rank, n, dt, op)
                req = c.iallreduce(y, op, **kw)  # non-blocking
                while not req.test():
                    pass
                check("iallreduce %s %s n=%d" % (dt, op, n), req.wait(), dt, ref, tol)


def test_torch(c):
    if torch is None:
        return
    rank, n_ranks = c.rank, c.size
    for tdt, dt in ((torch.float32, "float32"), (torch.float64, "float64"),
                    (torch.float16, "float16"), (torch.bfloat16, "bfloat16"),
                    (torch.int32, "int32"), (torch.int64, "int64"),
                    (torch.int8, "int8"), (torch.uint8, "uint8")):
        for n in (0, 5, 4099):
            x = inp(rank, n, "float32" if dt == "bfloat16" else dt, "sum")
            t = torch.from_numpy(x.astype(np.float32)).to(tdt) if dt == "bfloat16" \
                else torch.from_numpy(x.copy())
            ref = reference(n_ranks, n, "float32" if dt == "bfloat16" else dt, "sum")
            c.allreduce(t)
            got = t.to(torch.float64).numpy()
            if not np.array_equal(got, ref):
                sys.exit("FAIL torch allreduce %s n=%d" % (dt, n))
            digest.update(got.tobytes())
    # 2-D tensor, non-blocking, average
    t = torch.full((3, 4), float(rank + 1))
    c.iallreduce(t, "avg").wait()
    if not torch.allclose(t, torch.full((3, 4), (n_ranks + 1) / 2)):
        sys.exit("FAIL torch iallreduce avg")
    # allgather allocates a tensor like its input
    g = c.allgather(torch.tensor([rank, rank * 10], dtype=torch.int64))
    if not isinstance(g, torch.Tensor) or g.tolist() != sum(([r, r * 10] for r in range(n_ranks)), []):
        sys.exit("FAIL torch allgather %s" % g)
    # non-contiguous tensors are refused before anything is sent
    try:
        c.allreduce(torch.zeros(4, 4).t())
        sys.exit("FAIL non-contiguous tensor accepted")
    except ValueError:
        pass


def test_other_collectives(c):
    rank, n_ranks = c.rank, c.size
    for dt in ("float32", "int64", "bfloat16", "uint8"):
        for k in (0, 1, 5, 4097):
            send = inp(rank, k * n_ranks, dt, "sum")
            full = reference(n_ranks, k * n_ranks, dt, "sum")
            ref = full[rank * k:(rank + 1) * k]
            kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
            recv = np.empty(k, send.dtype)
            c.reduce_scatter(send, recv, "sum", **kw)
            check("reduce_scatter %s k=%d" % (dt, k), recv, dt, ref, same=False)
            got = c.ireduce_scatter(send.copy(), None, "sum", **kw).wait()  # in place
            check("ireduce_scatter in place %s k=%d" % (dt, k), got, dt, ref, same=False)
            mine = inp(rank, k, dt, "max")
            allref = np.concatenate([as_f64(inp(r, k, dt, "max"), dt) for r in range(n_ranks)])
            g = c.allgather(mine, **kw)
            check("allgather %s k=%d" % (dt, k), g, dt, allref)
            buf = np.zeros(k * n_ranks, mine.dtype)
            buf[rank * k:(rank + 1) * k] = mine
            c.iallgather(fr.IN_PLACE, buf, **kw).wait()
            check("allgather in place %s k=%d" % (dt, k), buf, dt, allref)
            for root in range(n_ranks):
                b = inp(rank if rank == root else 99, k, dt, "min")
                (c.broadcast(b, root, **kw) if root % 2 else c.ibroadcast(b, root, **kw).wait())
                check("broadcast %s k=%d root=%d" % (dt, k, root), b, dt,
                      as_f64(inp(root, k, dt, "min"), dt))
    c.barrier()
    c.ibarrier().wait()
    # plain buffers: array.array and bytearray (with dtype=)
    a = array.array("d", [rank + 0.5] * 9)
    c.allreduce(a)
    if list(a) != [sum(r + 0.5 for r in range(n_ranks))] * 9:
        sys.exit("FAIL array.array allreduce %s" % a)
    b = bytearray([rank + 1] * 6)
    c.allreduce(b, "max", dtype="uint8")
    if list(b) != [n_ranks] * 6:
        sys.exit("FAIL bytearray allreduce")


def test_new_collectives(c):
    """reduce, alltoall(v), allgatherv, reduce_scatterv (numpy and torch)."""
    rank, n = c.rank, c.size
    for dt in ("float32", "int32", "bfloat16", "uint8"):
        kw = {"dtype": "bfloat16"} if dt == "bfloat16" else {}
        for k in (0, 1, 7, 4099):
            for root in (0, n - 1):
                x = inp(rank, k, dt, "sum")
                ref = reference(n, k, dt, "sum")
                out = np.empty_like(x)
                got = c.reduce(x, root, "sum", out=out, **kw) if root % 2 == 0 else \
                    c.ireduce(x, root, "sum", out=out, **kw).wait()
                if rank == root:
                    check("reduce %s k=%d root=%d" % (dt, k, root), got, dt, ref, same=False)
                elif got is not None:
                    sys.exit("FAIL reduce returned %r off the root" % (got,))
            # alltoall: block q of rank r is inp(r * n + q)
            send = np.concatenate([inp(rank * n + q, k, dt, "max") for q in range(n)]) \
                if n else np.zeros(0)
            want = np.concatenate([as_f64(inp(r * n + rank, k, dt, "max"), dt) for r in range(n)])
            check("alltoall %s k=%d" % (dt, k), c.alltoall(send, **kw), dt, want, same=False)
            buf = send.copy()
            c.ialltoall(fr.IN_PLACE, buf, **kw).wait()
            check("alltoall in place %s k=%d" % (dt, k), buf, dt, want, same=False)
            # uneven: rank r sends (r + q + k) % 4 elements to rank q
            sc = [(rank + q + k) % 4 for q in range(n)]
            rc = [(r + rank + k) % 4 for r in range(n)]
            send = np.concatenate([inp(rank * n + q, sc[q], dt, "max") for q in range(n)])
            want = np.concatenate([as_f64(inp(r * n + rank, rc[r], dt, "max"), dt)
                                   for r in range(n)])
            check("alltoallv %s k=%d" % (dt, k), c.alltoallv(send, sc, rc, **kw), dt, want,
                  same=False)
            # allgatherv: rank r contributes (r + k) % 3 + k elements
            cnt = [(r + k) % 3 + k for r in range(n)]
            want = np.concatenate([as_f64(inp(r, cnt[r], dt, "min"), dt) for r in range(n)])
            got = c.iallgatherv(inp(rank, cnt[rank], dt, "min"), cnt, **kw).wait()
            check("allgatherv %s k=%d" % (dt, k), got, dt, want)
            # reduce_scatterv over those blocks
            total = sum(cnt)
            full = reference(n, total, dt, "sum")
            lo = sum(cnt[:rank])
            got = c.reduce_scatterv(inp(rank, total, dt, "sum"), cnt, **kw)
            check("reduce_scatterv %s k=%d" % (dt, k), got, dt, full[lo:lo + cnt[rank]],
                  same=False)
    # point-to-point around the ring, eager and rendezvous sizes
    for k in (0, 3, 100000):
        out = np.arange(k, dtype=np.float32) + rank
        got = np.empty(k, np.float32)
        req = c.irecv(got, (rank - 1) % n, tag=k % 7)
        c.send(out, (rank + 1) % n, tag=k % 7)
        req.wait()
        if not np.array_equal(got, np.arange(k, dtype=np.float32) + (rank - 1) % n):
            sys.exit("FAIL p2p k=%d" % k)
    c.isend(np.ones(2, np.int64) * rank, rank, tag=3).wait()
    if c.recv(np.empty(2, np.int64), rank, tag=3).tolist() != [rank, rank]:
        sys.exit("FAIL p2p to itself")
    if torch is not None:
        t = torch.arange(2 * n, dtype=torch.float32) + 100 * rank
        got = c.alltoall(t)
        want = [float(100 * r + 2 * rank + j) for r in range(n) for j in range(2)]
        if not isinstance(got, torch.Tensor) or got.tolist() != want:
            sys.exit("FAIL torch alltoall %s" % got)
    for bad in (lambda: c.alltoallv(np.ones(3, np.float32), [1] * (n + 1), [1] * n),
                lambda: c.allgatherv(np.ones(2, np.float32), [-1] * n),
                lambda: c.alltoall(np.ones(n + 1, np.float32)) if n > 1 else
                c.alltoall(np.ones(3, np.float32), np.ones(2, np.float32))):
        try:
            bad()
            sys.exit("FAIL bad counts accepted")
        except ValueError:
            pass


def test_registration_and_stats(c):
    arena = np.zeros(1 << 16, np.float32)
    mem = c.register(arena)
    before = c.stats()
    for step in range(5):
        arena[:] = c.rank + step
        c.allreduce(arena[:4096])       # slices of the registered arena
        c.allreduce(arena[4096:])
        want = sum(r + step for r in range(c.size))
        if (arena != want).any():
            sys.exit("FAIL registered allreduce step %d" % step)
    after = c.stats()
    if c.size > 1 and after["mem_registrations"] != before["mem_registrations"]:
        sys.exit("FAIL registered arena was registered again: %s %s" % (before, after))
    if after["collectives"] < before["collectives"] + 10:
        sys.exit("FAIL stats.collectives did not count")
    mem.deregister()
    with c.register(np.zeros(16, np.float64)):
        pass


def test_compression(c):
    n = 100003
    rng = np.random.default_rng(7 + c.rank)
    for fmt, bound in (("bf16", 1e-2), ("fp16", 2e-3), ("int8", 3e-2)):
        xs = [np.random.default_rng(7 + r).standard_normal(n).astype(np.float32)
              for r in range(c.size)]
        ref = np.sum(np.array(xs, np.float64), axis=0)
        x = xs[c.rank].copy()
        res = np.zeros(n, np.float32)
        c.iallreduce(x, "sum", compress=fmt, residual=res).wait()
        err = np.max(np.abs(x - ref)) / np.max(np.abs(ref))
        if c.size > 1 and not err < bound:
            sys.exit("FAIL compress %s relerr %g" % (fmt, err))
        if c.size > 1 and not np.any(res):
            sys.exit("FAIL compress %s left the residual zero" % fmt)
        digest.update(x.tobytes())
    del rng


def test_library_refusal(c):
    """Last: an argument only the library refuses fails the communicator
    on every rank (the others would wait for this one)."""
    try:
        c.allreduce(np.ones(3), compress="int8")  # float64 cannot be compressed
        sys.exit("FAIL compress of float64 accepted")
    except fr.FastReduceError as e:
        if e.code != fr.EINVAL or "f32" not in e.message or e.name != "FR_EINVAL":
            sys.exit("FAIL error fields %r %r %r" % (e.code, e.name, e.message))
    try:
        c.barrier()
        if c.size > 1:
            sys.exit("FAIL the communicator works after a refused call")
    except fr.FastReduceError as e:
        if c.size == 1:
            sys.exit("FAIL a single rank's communicator failed: %s" % e.message)


def test_errors(c):
    for i, (bad, exc) in enumerate(((lambda: c.allreduce(np.ones(3, np.float32), "mean"), ValueError),
                     (lambda: c.allreduce(b"abc", dtype="uint8"), ValueError),
                     (lambda: c.allreduce("text"), TypeError),
                     (lambda: c.allreduce(np.ones(4)[::2]), ValueError),
                     (lambda: c.allreduce(np.ones(4, np.float32), out=np.ones(3, np.float32)), ValueError),
                     (lambda: c.allreduce(np.ones(4, np.float32), compress="zip"), ValueError),
                     (lambda: c.allreduce(np.ones(4, np.float32), compress="bf16",
                                          residual=np.zeros(3, np.float32)), ValueError),
                     (lambda: c.allreduce(bytearray(6), dtype="float32"), ValueError),
                     (lambda: c.allreduce(np.ones(4, np.complex64)), ValueError),
                     (lambda: c.allreduce(np.ones(4, np.int16), dtype="float32"), ValueError))):
        try:
            bad()
            sys.exit("FAIL bad argument %d accepted" % i)
        except exc:
            pass
    c.barrier()  # arguments the package refused never reached the library


def test_split(c):
    """Rows of two ranks (reversed by key), a dup, UNDEFINED; closed in any
    order, the parent working throughout."""
    row = c.split(c.rank // 2, key=-c.rank)
    members = [r for r in range(c.size) if r // 2 == c.rank // 2]
    if row.size != len(members) or row.rank != sorted(members, reverse=True).index(c.rank):
        sys.exit("FAIL split: rank %d of %d" % (row.rank, row.size))
    got = row.allreduce(np.full(5, c.rank, np.int32))
    if not np.array_equal(got, np.full(5, sum(members), np.int32)):
        sys.exit("FAIL split allreduce: %s" % got)
    d = c.dup()
    if d.size != c.size or d.rank != c.rank:
        sys.exit("FAIL dup: rank %d of %d" % (d.rank, d.size))
    none = c.split(fr.UNDEFINED if c.rank == 0 else 1)
    if (none is None) != (c.rank == 0):
        sys.exit("FAIL split UNDEFINED: %r" % none)
    d.close()  # before the rows, after its parent's use
    got = c.allreduce(np.ones(3, np.float32))
    if not np.array_equal(got, np.full(3, c.size, np.float32)):
        sys.exit("FAIL parent after dup: %s" % got)
    if none is not None:
        none.close()
    row.close()
    try:
        c.split(-5)
        sys.exit("FAIL split: color -5 accepted")
    except fr.FastReduceError as e:
        if e.code != fr.EINVAL:
            sys.exit("FAIL split -5: %s" % e)

def test_revoke(c):
    """The last rank revokes a dup while the others wait in an All-Reduce
    it never joins: theirs raises EREVOKED, later calls too; the parent
    goes on."""
    if c.size < 2:
        return
    d = c.dup()
    if c.rank == c.size - 1:
        time.sleep(0.3)
        d.revoke()
    else:
        try:
            d.allreduce(np.ones(4, np.float32))
            sys.exit("FAIL revoke: the All-Reduce completed")
        except fr.FastReduceError as e:
            if e.code != fr.EREVOKED or "revoked" not in e.message:
                sys.exit("FAIL revoke: %s" % e)
    try:
        d.barrier()
        sys.exit("FAIL revoke: a later barrier completed")
    except fr.FastReduceError as e:
        if e.code != fr.EREVOKED:
            sys.exit("FAIL revoke, later barrier: %s" % e)
    d.close()
    got = c.allreduce(np.ones(3, np.float32))
    if not np.array_equal(got, np.full(3, c.size, np.float32)):
        sys.exit("FAIL parent after a revoked dup: %s" % got)


def test_agree_shrink(c):
    """With no failure: agree gives the AND of every rank's flags and no
    failed rank, on a revoked dup too; shrink gives a copy in the same
    order that reduces right."""
    flags, failed = c.agree(~(1 << c.rank) & 0xFFFFFFFF)
    want = 0xFFFFFFFF
    for r in range(c.size):
        want &= ~(1 << r)
    if flags != want or failed != [] or c.failed() != []:
        sys.exit("FAIL agree: 0x%x %s, not 0x%x []" % (flags, failed, want))
    d = c.dup()
    if c.rank == 0:
        d.revoke()
    flags, failed = d.agree(c.rank + 1)
    want = 1
    for r in range(c.size):
        want &= r + 1
    if flags != want or failed != []:
        sys.exit("FAIL agree on a revoked dup: %d %s" % (flags, failed))
    s = d.shrink()
    d.close()
    if (s.rank, s.size) != (c.rank, c.size):
        sys.exit("FAIL shrink: rank %d of %d" % (s.rank, s.size))
    got = s.allreduce(np.ones(5, np.float32))
    if not np.array_equal(got, np.full(5, c.size, np.float32)):
        sys.exit("FAIL shrunk All-Reduce: %s" % got)
    s.close()


_NEWCOMER = r"""
import sys
import numpy as np
import fastreduce as fr
with fr.Comm() as c:  # FR_JOIN=1: joins the others' grow
    got = c.allreduce(np.ones(4, np.float32))
    if c.rank < c.size - 2 or not np.array_equal(
            got, np.full(4, c.size, np.float32)):
        sys.exit("FAIL newcomer: rank %d of %d, %s" % (c.rank, c.size, got))
"""


def test_grow(c):
    """Re-admission: rank 0 starts two newcomers (FR_JOIN=1) and every
    rank grows by two at an address rank 0 picked; the newcomers are the
    last ranks of the grown communicator, which reduces right."""
    import socket
    import subprocess
    port = np.zeros(1, np.int32)
    if c.rank == 0:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port[0] = s.getsockname()[1]
        s.close()
    c.broadcast(port, root=0)
    addr = "127.0.0.1:%d" % port[0]
    os.environ["FR_GROW_RENDEZVOUS"] = addr
    kids = []
    if c.rank == 0:
        env = dict(os.environ, FR_JOIN="1")
        kids = [subprocess.Popen([sys.executable, "-c", _NEWCOMER], env=env)
                for _ in range(2)]
    try:
        g = c.grow(2)
    finally:
        del os.environ["FR_GROW_RENDEZVOUS"]
    if (g.rank, g.size) != (c.rank, c.size + 2):
        sys.exit("FAIL grow: rank %d of %d" % (g.rank, g.size))
    got = g.allreduce(np.ones(4, np.float32))
    if not np.array_equal(got, np.full(4, g.size, np.float32)):
        sys.exit("FAIL grown All-Reduce: %s" % got)
    g.close()
    for kid in kids:
        if kid.wait(timeout=60) != 0:
            sys.exit("FAIL newcomer exited %d" % kid.returncode)


def main():
    with fr.Comm(progress=sys.argv[1] if len(sys.argv) > 1 else None) as c:
        test_errors(c)
        test_allreduce(c)
        test_other_collectives(c)
        test_new_collectives(c)
        test_torch(c)
        test_registration_and_stats(c)
        test_compression(c)
        mine = np.frombuffer(digest.digest(), np.uint8).copy()
        every = c.allgather(mine)
        for r in range(c.size):
            if not np.array_equal(every[r * 32:(r + 1) * 32], mine):
                sys.exit("FAIL rank %d has different results from rank %d" % (r, c.rank))
        if c.rank == 0:
            print("api_worker: %d ranks over %s ok (%s)" % (c.size, c.transport,
                                                             digest.hexdigest()[:16]))
        test_library_refusal(c)
    with fr.Comm(progress=sys.argv[1] if len(sys.argv) > 1 else None) as c:
        test_revoke(c)
        test_agree_shrink(c)
        test_grow(c)
        test_split(c)
    rep = repr(c)
    if "closed" not in rep:
        sys.exit("FAIL repr after close: %s" % rep)


if __name__ == "__main__":
    main()
