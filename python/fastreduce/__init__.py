"""fastreduce: Python bindings of libfastreduce.

Fast All-Reduce (and reduce-scatter, all-gather, broadcast, barrier) of
CPU memory between the ranks of a job, over RDMA verbs or TCP.  Buffers are
numpy arrays, CPU torch tensors or writable buffers; they are used in place,
never copied.  Example, under ``frrun -n 4``, ``mpirun``, ``srun`` or
``torchrun --no-python``::

    import numpy as np
    import fastreduce

    with fastreduce.Comm() as comm:               # from the launcher's environment
        grads = np.ones(1 << 20, dtype=np.float32)
        comm.register(grads)                      # once: zero copy every call
        comm.allreduce(grads, op="avg")           # in place
        req = comm.iallreduce(grads, compress="bf16")
        ...                                       # compute
        req.wait()

Every failure of the library raises :class:`FastReduceError`, carrying the
FR_E* code and the communicator's message ("rank 2: peer rank 3 (next)
closed the connection").  For PyTorch DDP see :mod:`fastreduce.torch`.
"""

import ctypes
import enum
import weakref
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _lib
from ._buffers import ITEMSIZE, DType, dtype_of, view, empty_like, block

__all__ = [
    "Comm", "Request", "Mem", "FastReduceError", "DType", "Op", "Compress",
    "Progress", "version", "strerror", "errname", "IN_PLACE", "UNDEFINED",
]

L = _lib.lib


class Op(enum.IntEnum):
    """Reduction operations (fr_op_t)."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4


class Compress(enum.IntEnum):
    """Wire formats of a compressed All-Reduce of float32 data."""

    NONE = 0
    BF16 = 1
    FP16 = 2
    INT8 = 3


class Progress(enum.IntEnum):
    """Who advances collectives (fr_progress_t)."""

    DEFAULT = 0
    CALLER = 1
    THREAD = 2


SUM, PROD, MIN, MAX, AVG = Op.SUM, Op.PROD, Op.MIN, Op.MAX, Op.AVG

#: Pass as ``send`` of :meth:`Comm.allgather` when this rank's block is
#: already in place in ``recv``.
IN_PLACE = None

#: The color of :meth:`Comm.split` for a rank that joins no communicator.
UNDEFINED = -1

# Error codes, as in fastreduce.h (FR_EINVAL = -1, ...).
EINVAL, ENOMEM, ENODEV, ETIMEDOUT, EMISMATCH, EPEER, EBOOTSTRAP = range(-1, -8, -1)
EPROTO, ESYS, EAGAIN, ENOTSUP, EBUSY, EAUTH, ERANGE, EREVOKED = range(-8, -16, -1)


def version() -> str:
    """The version of the loaded libfastreduce ("0.1.0")."""
    return L.fr_version().decode()


__version__ = version()


def strerror(code: int) -> str:
    """The static text of an FR_E* code ("invalid argument")."""
    return L.fr_strerror(code).decode()


def errname(code: int) -> str:
    """The name of an FR_E* code ("FR_EINVAL")."""
    return L.fr_errname(code).decode()


class FastReduceError(RuntimeError):
    """A libfastreduce call failed.

    Attributes: ``code`` (negative FR_E* value), ``name`` ("FR_ETIMEDOUT"),
    ``message`` (the communicator's last-error text, naming the rank
    involved, or the code's text when there is none)."""

    def __init__(self, code: int, message: str = ""):
        self.code = code
        self.name = errname(code)
        self.message = message or strerror(code)
        super().__init__("%s: %s" % (self.name, self.message))


def _op(op) -> int:
    if isinstance(op, str):
        try:
            return Op[op.upper()]
        except KeyError:
            raise ValueError("fastreduce: unknown op %r (sum, prod, min, max, "
                             "avg)" % op) from None
    return int(Op(op))


def _compress(c) -> int:
    if c is None:
        return Compress.NONE
    if isinstance(c, str):
        out = ctypes.c_int()
        if L.fr_compress_from_name(c.encode(), ctypes.byref(out)) != 0:
            raise ValueError("fastreduce: unknown compression %r (none, bf16, "
                             "fp16, int8)" % c)
        return out.value
    return int(Compress(c))


class Mem:
    """A buffer registered with the transport (:meth:`Comm.register`).
    Collectives whose buffers lie inside it run zero copy with no further
    registration.  Keeps the buffer alive; :meth:`deregister` (or leaving a
    ``with`` block) releases it."""

    def __init__(self, comm: "Comm", buf):
        self._comm = comm
        self._view = view(buf, what="registered buffer")
        self.buffer = buf
        h = ctypes.c_void_p()
        comm._check(L.fr_mem_register(comm._h, self._view.ptr,
                                      self._view.nbytes, ctypes.byref(h)))
        self._h = h
        comm._mems.add(self)

    def deregister(self) -> None:
        """Release the registration (FastReduceError FR_EBUSY while a
        collective in flight uses it)."""
        if self._h is None or self._comm._h is None:
            self._h = None
            return
        rc = L.fr_mem_deregister(self._h)
        self._comm._check(rc)
        self._h = None
        self._comm._mems.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.deregister()


class Request:
    """A non-blocking collective in flight.  :meth:`wait` blocks until it
    completes and returns its result buffer; :meth:`test` says whether it
    has.  The buffers stay referenced (and must not be touched) until then.
    Dropping an unfinished request waits for it, so its buffers are never
    freed under the transport."""

    def __init__(self, comm: "Comm", handle: ctypes.c_void_p, result, keep):
        self._comm = comm
        self._h = handle
        self._result = result
        self._keep = keep
        self._rc = None
        comm._reqs.add(self)

    def _finish(self, rc):
        self._rc = rc
        self._h = None
        self._keep = None
        self._comm._reqs.discard(self)

    def _abandon(self):
        # The communicator was closed under it.
        if self._h is not None:
            self._h = None
            self._keep = None
            self._rc = EPEER
            self._msg = "communicator closed before the request completed"

    def test(self) -> bool:
        """Make progress; True once complete (raises if it failed)."""
        if self._h is not None:
            done = ctypes.c_int(0)
            rc = L.fr_test(ctypes.byref(self._h), ctypes.byref(done))
            if done.value:
                self._finish(rc)
            elif rc != 0:
                self._finish(rc)
        if self._rc is None:
            return False
        self._raise()
        return True

    def wait(self):
        """Block until complete; return the result buffer (raises
        FastReduceError if the collective failed)."""
        if self._h is not None:
            rc = L.fr_wait(ctypes.byref(self._h))
            self._finish(rc)
        self._raise()
        return self._result

    @property
    def done(self) -> bool:
        return self._rc is not None

    def _raise(self):
        if self._rc:
            msg = getattr(self, "_msg", None) or self._comm.last_error()
            raise FastReduceError(self._rc, msg)

    def __del__(self):
        try:
            if self._h is not None and self._comm._h is not None:
                L.fr_wait(ctypes.byref(self._h))
        except Exception:
            pass


class Comm:
    """A communicator: every rank of the job creates one, collectively.

    ``Comm()`` takes rank, size and the rendezvous address from the
    launcher: frrun (FR_RANK, FR_NRANKS, FR_RENDEZVOUS), Open MPI, MPICH,
    Slurm srun or torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; the
    rendezvous uses MASTER_PORT+1, so torch's own store keeps its port).
    ``Comm(rank=r, size=n, rendezvous="host:port")`` gives them explicitly.

    Settings left at None come from the environment (FR_TRANSPORT,
    FR_TIMEOUT_MS, FR_PROGRESS, ...; see fastreduce(7)):

    - transport: "auto", "tcp", "shm" or "verbs"
    - progress: "caller" (collectives advance inside library calls) or
      "thread" (a progress thread completes non-blocking collectives while
      Python computes)
    - timeout_ms: how long to wait for a peer before failing
    - job_token: shared secret every rank must present
    - algo: force an algorithm ("ring", "rd", "rabenseifner", "hier", ...)

    Calls on one communicator may come from several Python threads; the
    library serializes them and releases the GIL while it waits.
    """

    def __init__(self, rank: Optional[int] = None, size: Optional[int] = None,
                 rendezvous: Optional[str] = None, *,
                 transport: Optional[str] = None,
                 progress: Union[str, int, None] = None,
                 timeout_ms: Optional[int] = None,
                 job_token: Optional[str] = None,
                 segment_bytes: Optional[int] = None,
                 slots: Optional[int] = None,
                 algo: Union[str, int, None] = None):
        self._h = None
        self._reqs = weakref.WeakSet()
        self._mems = set()
        cfg = _lib.Config()
        L.fr_config_init(ctypes.byref(cfg))
        keep = []

        def s(v):
            b = v.encode()
            keep.append(b)
            return b

        if transport is not None:
            cfg.transport = s(transport)
        if job_token is not None:
            cfg.job_token = s(job_token)
        if timeout_ms is not None:
            cfg.timeout_ms = int(timeout_ms)
        if segment_bytes is not None:
            cfg.segment_bytes = int(segment_bytes)
        if slots is not None:
            cfg.slots = int(slots)
        if progress is not None:
            cfg.progress = (Progress[progress.upper()] if isinstance(progress, str)
                            else int(Progress(progress)))
        if algo is not None:
            cfg.algo = _algo(algo)
        h = ctypes.c_void_p()
        explicit = rank is not None or size is not None or rendezvous is not None
        if explicit:
            if rank is None or size is None or rendezvous is None:
                raise ValueError("fastreduce: give rank, size and rendezvous "
                                 "together, or none of them (launcher's "
                                 "environment)")
            cfg.rank, cfg.nranks = int(rank), int(size)
            cfg.rendezvous = s(rendezvous)
            rc = L.fr_comm_create(ctypes.byref(cfg), ctypes.byref(h))
        else:
            rc = L.fr_comm_create_from_env(ctypes.byref(cfg), ctypes.byref(h))
        if rc != 0:
            raise FastReduceError(rc, L.fr_comm_last_error(None).decode())
        self._h = h

    # ---- properties --------------------------------------------------------
    @property
    def rank(self) -> int:
        """This process's rank, 0..size-1."""
        return L.fr_comm_rank(self._live())

    @property
    def size(self) -> int:
        """Number of ranks."""
        return L.fr_comm_size(self._live())

    @property
    def transport(self) -> str:
        """"tcp", "shm" or "verbs"."""
        return L.fr_comm_transport(self._live()).decode()

    @property
    def last_algo(self) -> str:
        """The algorithm of the most recently started collective."""
        return _ALGOS.get(L.fr_comm_last_algo(self._live()), "?")

    def last_error(self) -> str:
        """The communicator's most recent error message ("" if none)."""
        if self._h is None:
            return ""
        return L.fr_comm_last_error(self._h).decode()

    def stats(self) -> Dict[str, int]:
        """Counters: collectives, bytes_sent, wire_bytes, ... (fr_stats_t)."""
        st = _lib.Stats()
        st.size = ctypes.sizeof(st)
        self._check(L.fr_comm_stats(self._live(), ctypes.byref(st)))
        return {f: getattr(st, f) for f in _lib.STATS_FIELDS}

    # ---- memory ------------------------------------------------------------
    def register(self, buf) -> Mem:
        """Register buf once so collectives on it (or on slices of it) run
        zero copy with no per-call registration."""
        self._live()
        return Mem(self, buf)

    # ---- collectives -------------------------------------------------------
    def allreduce(self, buf, op: Union[str, int] = "sum", *, out=None,
                  compress: Union[str, int, None] = None, residual=None,
                  dtype=None):
        """All-Reduce buf over every rank; the result goes to ``out`` if
        given, else into buf (in place).  Returns the result buffer.

        compress ("bf16", "fp16", "int8") narrows float32 data on the wire;
        residual (float32, same length, zero at first, kept between calls)
        adds error feedback.  All ranks must pass the same op, count, dtype
        and compression."""
        return self._allreduce(buf, op, out, compress, residual, dtype, False)

    def iallreduce(self, buf, op: Union[str, int] = "sum", *, out=None,
                   compress: Union[str, int, None] = None, residual=None,
                   dtype=None) -> Request:
        """Non-blocking :meth:`allreduce`; ``wait()`` returns the result."""
        return self._allreduce(buf, op, out, compress, residual, dtype, True)

    def _allreduce(self, buf, op, out, compress, residual, dtype, nb):
        h = self._live()
        v = view(buf, dtype, "buf")
        o = v if out is None or out is buf else view(out, dtype, "out")
        if o.count != v.count or o.dtype != v.dtype:
            raise ValueError("fastreduce: out has %d %s elements, buf %d %s"
                             % (o.count, o.dtype.name.lower(), v.count,
                                v.dtype.name.lower()))
        opts = _lib.CollOpts()
        L.fr_coll_opts_init(ctypes.byref(opts))
        opts.compress = _compress(compress)
        r = None
        if residual is not None:
            r = view(residual, None, "residual")
            if r.dtype != DType.FLOAT32 or r.count != v.count:
                raise ValueError("fastreduce: residual must be float32 with "
                                 "%d elements" % v.count)
            opts.residual = ctypes.cast(ctypes.c_void_p(r.ptr),
                                        ctypes.POINTER(ctypes.c_float))
        send = None if o is v else v.ptr
        keep = (v, o, r, opts)
        result = out if out is not None else buf
        if nb:
            req = ctypes.c_void_p()
            self._check(L.fr_iallreduce_ex(h, send if send else o.ptr, o.ptr,
                                           v.count, v.dtype, _op(op),
                                           ctypes.byref(opts), ctypes.byref(req)))
            return Request(self, req, result, keep)
        self._check(L.fr_allreduce_ex(h, send if send else o.ptr, o.ptr, v.count,
                                      v.dtype, _op(op), ctypes.byref(opts)))
        return result

    def reduce_scatter(self, send, recv=None, op: Union[str, int] = "sum", *,
                       dtype=None):
        """Reduce-scatter with equal blocks: recv (len(send) / size
        elements) on rank r = op over all ranks of block r of send.
        recv=None reduces in place and returns block ``rank`` of send.
        Returns recv."""
        return self._reduce_scatter(send, recv, op, dtype, False)

    def ireduce_scatter(self, send, recv=None, op: Union[str, int] = "sum", *,
                        dtype=None) -> Request:
        """Non-blocking :meth:`reduce_scatter`."""
        return self._reduce_scatter(send, recv, op, dtype, True)

    def _reduce_scatter(self, send, recv, op, dtype, nb):
        h = self._live()
        n = self.size
        s = view(send, dtype, "send")
        if s.count % n:
            raise ValueError("fastreduce: reduce_scatter needs a send length "
                             "divisible by size (%d elements, %d ranks)"
                             % (s.count, n))
        k = s.count // n
        if recv is None:
            recv = block(send, self.rank * k, k)
        r = view(recv, s.dtype, "recv")
        if r.count != k:
            raise ValueError("fastreduce: recv has %d elements, needs %d"
                             % (r.count, k))
        keep = (s, r)
        if nb:
            req = ctypes.c_void_p()
            self._check(L.fr_ireduce_scatter(h, s.ptr, r.ptr, k, s.dtype, _op(op),
                                             ctypes.byref(req)))
            return Request(self, req, recv, keep)
        self._check(L.fr_reduce_scatter(h, s.ptr, r.ptr, k, s.dtype, _op(op)))
        return recv

    def allgather(self, send, recv=None, *, dtype=None):
        """All-gather: block r of recv (size * len(send) elements) = rank
        r's send.  recv=None allocates it (numpy/torch, like send).
        send=None (IN_PLACE): this rank's block is already in recv.
        Returns recv."""
        return self._allgather(send, recv, dtype, False)

    def iallgather(self, send, recv=None, *, dtype=None) -> Request:
        """Non-blocking :meth:`allgather`."""
        return self._allgather(send, recv, dtype, True)

    def _allgather(self, send, recv, dtype, nb):
        h = self._live()
        n = self.size
        if send is None:
            if recv is None:
                raise ValueError("fastreduce: in-place allgather needs recv")
            r = view(recv, dtype, "recv")
            if r.count % n:
                raise ValueError("fastreduce: recv length %d is not a multiple "
                                 "of size %d" % (r.count, n))
            k, sp, keep = r.count // n, _lib.IN_PLACE, (r,)
            d = r.dtype
        else:
            s = view(send, dtype, "send")
            if recv is None:
                recv = empty_like(send, n * s.count, s.dtype)
            r = view(recv, s.dtype, "recv")
            if r.count != n * s.count:
                raise ValueError("fastreduce: recv has %d elements, needs %d"
                                 % (r.count, n * s.count))
            k, sp, keep, d = s.count, s.ptr, (s, r), s.dtype
        if nb:
            req = ctypes.c_void_p()
            self._check(L.fr_iallgather(h, sp, r.ptr, k, d, ctypes.byref(req)))
            return Request(self, req, recv, keep)
        self._check(L.fr_allgather(h, sp, r.ptr, k, d))
        return recv

    def send(self, buf, peer: int, tag: int = 0, *, dtype=None) -> None:
        """Send buf to rank peer (point-to-point); returns once buf may be
        reused.  The receiver calls :meth:`recv` with the same size, type
        and tag."""
        v = view(buf, dtype, "buf")
        self._check(L.fr_send(self._live(), v.ptr, v.count, v.dtype, peer, tag))

    def isend(self, buf, peer: int, tag: int = 0, *, dtype=None) -> Request:
        """Non-blocking :meth:`send`."""
        v = view(buf, dtype, "buf")
        req = ctypes.c_void_p()
        self._check(L.fr_isend(self._live(), v.ptr, v.count, v.dtype, peer, tag,
                               ctypes.byref(req)))
        return Request(self, req, None, (v,))

    def recv(self, buf, peer: int, tag: int = 0, *, dtype=None):
        """Receive into buf the message rank peer sent with tag; returns
        buf."""
        v = view(buf, dtype, "buf")
        self._check(L.fr_recv(self._live(), v.ptr, v.count, v.dtype, peer, tag))
        return buf

    def irecv(self, buf, peer: int, tag: int = 0, *, dtype=None) -> Request:
        """Non-blocking :meth:`recv`; wait() returns buf."""
        v = view(buf, dtype, "buf")
        req = ctypes.c_void_p()
        self._check(L.fr_irecv(self._live(), v.ptr, v.count, v.dtype, peer, tag,
                               ctypes.byref(req)))
        return Request(self, req, buf, (v,))

    def reduce(self, send, root: int = 0, op: Union[str, int] = "sum", *,
               out=None, dtype=None):
        """Reduce to rank root: on root, out (or send itself when out is
        None) = op over all ranks of send; elsewhere nothing is written.
        Returns the result on root, None elsewhere."""
        return self._reduce(send, root, op, out, dtype, False)

    def ireduce(self, send, root: int = 0, op: Union[str, int] = "sum", *,
                out=None, dtype=None) -> Request:
        """Non-blocking :meth:`reduce`."""
        return self._reduce(send, root, op, out, dtype, True)

    def _reduce(self, send, root, op, out, dtype, nb):
        h = self._live()
        v = view(send, dtype, "send")
        if out is not None:
            o = view(out, v.dtype, "out")
            if o.count != v.count:
                raise ValueError("fastreduce: out has %d elements, send %d"
                                 % (o.count, v.count))
            sp, rp, keep = v.ptr, o.ptr, (v, o)
        else:
            sp, rp, keep = _lib.IN_PLACE, v.ptr, (v,)
        result = (out if out is not None else send) if self.rank == root else None
        if nb:
            req = ctypes.c_void_p()
            self._check(L.fr_ireduce(h, sp, rp, v.count, v.dtype, _op(op), root,
                                     ctypes.byref(req)))
            return Request(self, req, result, keep)
        self._check(L.fr_reduce(h, sp, rp, v.count, v.dtype, _op(op), root))
        return result

    def alltoall(self, send, recv=None, *, dtype=None):
        """All-to-all: block q of send (len(send) / size elements) goes to
        rank q, block r of recv comes from rank r.  recv=None allocates it
        (like send); send=None (IN_PLACE): the blocks to send are in recv
        and are replaced.  Returns recv."""
        return self._alltoall(send, recv, dtype, False)

    def ialltoall(self, send, recv=None, *, dtype=None) -> Request:
        """Non-blocking :meth:`alltoall`."""
        return self._alltoall(send, recv, dtype, True)

    def _alltoall(self, send, recv, dtype, nb):
        h = self._live()
        n = self.size
        if send is None:
            if recv is None:
                raise ValueError("fastreduce: in-place alltoall needs recv")
            r = view(recv, dtype, "recv")
            sp, keep = _lib.IN_PLACE, (r,)
        else:
            s = view(send, dtype, "send")
            if recv is None:
                recv = empty_like(send, s.count, s.dtype)
            r = view(recv, s.dtype, "recv")
            if r.count != s.count:
                raise ValueError("fastreduce: recv has %d elements, send %d"
                                 % (r.count, s.count))
            sp, keep = s.ptr, (s, r)
        if r.count % n:
            raise ValueError("fastreduce: alltoall needs a length divisible by "
                             "size (%d elements, %d ranks)" % (r.count, n))
        k = r.count // n
        if nb:
            req = ctypes.c_void_p()
            self._check(L.fr_ialltoall(h, sp, r.ptr, k, r.dtype, ctypes.byref(req)))
            return Request(self, req, recv, keep)
        self._check(L.fr_alltoall(h, sp, r.ptr, k, r.dtype))
        return recv

    def _counts(self, counts, what):
        n = self.size
        c = [int(x) for x in counts]
        if len(c) != n or min(c, default=0) < 0:
            raise ValueError("fastreduce: %s needs %d counts >= 0, got %r"
                             % (what, n, counts))
        arr = (ctypes.c_size_t * n)(*c)
        displs, at = (ctypes.c_size_t * n)(), 0
        for i, x in enumerate(c):
            displs[i] = at
            at += x
        return arr, displs, at

    def alltoallv(self, send, send_counts, recv_counts, recv=None, *,
                  dtype=None):
        """All-to-all with a count per pair: send holds send_counts[q]
        elements for each rank q, back to back in rank order; recv (or a
        new array like send) gets recv_counts[r] elements from each rank r,
        back to back.  send_counts[q] on this rank must equal recv_counts[this
        rank] on rank q.  Returns recv."""
        return self._alltoallv(send, send_counts, recv_counts, recv, dtype, False)

    def ialltoallv(self, send, send_counts, recv_counts, recv=None, *,
                   dtype=None) -> Request:
        """Non-blocking :meth:`alltoallv`."""
        return self._alltoallv(send, send_counts, recv_counts, recv, dtype, True)

    def _alltoallv(self, send, scounts, rcounts, recv, dtype, nb):
        h = self._live()
        sc, sd, stotal = self._counts(scounts, "send_counts")
        rc, rd, rtotal = self._counts(rcounts, "recv_counts")
        s = view(send, dtype, "send")
        if s.count != stotal:
            raise ValueError("fastreduce: send has %d elements, the counts say %d"
                             % (s.count, stotal))
        if recv is None:
            recv = empty_like(send, rtotal, s.dtype)
        r = view(recv, s.dtype, "recv")
        if r.count != rtotal:
            raise ValueError("fastreduce: recv has %d elements, the counts say %d"
                             % (r.count, rtotal))
        keep = (s, r, sc, sd, rc, rd)
        if nb:
            req = ctypes.c_void_p()
            self._check(L.fr_ialltoallv(h, s.ptr, sc, sd, r.ptr, rc, rd, s.dtype,
                                        ctypes.byref(req)))
            return Request(self, req, recv, keep)
        self._check(L.fr_alltoallv(h, s.ptr, sc, sd, r.ptr, rc, rd, s.dtype))
        return recv

    def allgatherv(self, send, recv_counts, recv=None, *, dtype=None):
        """All-gather with a count per rank: recv (or a new array like send)
        = every rank's send back to back in rank order, rank r's
        recv_counts[r] elements long (the same list on every rank; len(send)
        == recv_counts[rank]).  Returns recv."""
        return self._allgatherv(send, recv_counts, recv, dtype, False)

    def iallgatherv(self, send, recv_counts, recv=None, *, dtype=None) -> Request:
        """Non-blocking :meth:`allgatherv`."""
        return self._allgatherv(send, recv_counts, recv, dtype, True)

    def _allgatherv(self, send, rcounts, recv, dtype, nb):
        h = self._live()
        rc, rd, total = self._counts(rcounts, "recv_counts")
        s = view(send, dtype, "send")
        if recv is None:
            recv = empty_like(send, total, s.dtype)
        r = view(recv, s.dtype, "recv")
        if r.count != total:
            raise ValueError("fastreduce: recv has %d elements, the counts say %d"
                             % (r.count, total))
        keep = (s, r, rc, rd)
        if nb:
            req = ctypes.c_void_p()
            self._check(L.fr_iallgatherv(h, s.ptr, s.count, r.ptr, rc, rd, s.dtype,
                                         ctypes.byref(req)))
            return Request(self, req, recv, keep)
        self._check(L.fr_allgatherv(h, s.ptr, s.count, r.ptr, rc, rd, s.dtype))
        return recv

    def reduce_scatterv(self, send, recv_counts, recv=None,
                        op: Union[str, int] = "sum", *, dtype=None):
        """Reduce-scatter with a count per rank: send holds the blocks back
        to back in rank order (block r has recv_counts[r] elements, the
        same list on every rank); recv (or a new array like send) = op over
        all ranks of block ``rank``.  Returns recv."""
        return self._reduce_scatterv(send, recv_counts, recv, op, dtype, False)

    def ireduce_scatterv(self, send, recv_counts, recv=None,
                         op: Union[str, int] = "sum", *, dtype=None) -> Request:
        """Non-blocking :meth:`reduce_scatterv`."""
        return self._reduce_scatterv(send, recv_counts, recv, op, dtype, True)

    def _reduce_scatterv(self, send, rcounts, recv, op, dtype, nb):
        h = self._live()
        rc, _, total = self._counts(rcounts, "recv_counts")
        s = view(send, dtype, "send")
        if s.count != total:
            raise ValueError("fastreduce: send has %d elements, the counts say %d"
                             % (s.count, total))
        mine = rc[self.rank]
        if recv is None:
            recv = empty_like(send, mine, s.dtype)
        r = view(recv, s.dtype, "recv")
        if r.count != mine:
            raise ValueError("fastreduce: recv has %d elements, needs %d"
                             % (r.count, mine))
        keep = (s, r, rc)
        if nb:
            req = ctypes.c_void_p()
            self._check(L.fr_ireduce_scatterv(h, s.ptr, r.ptr, rc, s.dtype, _op(op),
                                              ctypes.byref(req)))
            return Request(self, req, recv, keep)
        self._check(L.fr_reduce_scatterv(h, s.ptr, r.ptr, rc, s.dtype, _op(op)))
        return recv

    def broadcast(self, buf, root: int = 0, *, dtype=None):
        """Broadcast buf of rank root to every rank's buf; returns buf."""
        v = view(buf, dtype, "buf")
        self._check(L.fr_broadcast(self._live(), v.ptr, v.count, v.dtype, root))
        return buf

    def ibroadcast(self, buf, root: int = 0, *, dtype=None) -> Request:
        """Non-blocking :meth:`broadcast`."""
        v = view(buf, dtype, "buf")
        req = ctypes.c_void_p()
        self._check(L.fr_ibroadcast(self._live(), v.ptr, v.count, v.dtype, root,
                                    ctypes.byref(req)))
        return Request(self, req, buf, (v,))

    def barrier(self) -> None:
        """Return once every rank has entered the barrier."""
        self._check(L.fr_barrier(self._live()))

    def ibarrier(self) -> Request:
        """Non-blocking :meth:`barrier`."""
        req = ctypes.c_void_p()
        self._check(L.fr_ibarrier(self._live(), ctypes.byref(req)))
        return Request(self, req, None, ())

    def progress(self) -> None:
        """Advance every collective in flight without blocking."""
        self._check(L.fr_progress(self._live()))

    # ---- sub-communicators ---------------------------------------------------
    @classmethod
    def _of(cls, h) -> "Comm":
        c = cls.__new__(cls)
        c._h = h
        c._reqs = weakref.WeakSet()
        c._mems = set()
        return c

    def split(self, color: int, key: Optional[int] = None) -> Optional["Comm"]:
        """Collective: the ranks passing the same color (>= 0) form a new
        communicator, ordered by key (default: this rank), then rank here;
        color UNDEFINED gives None.  The new one shares this one's
        connections and is closed on its own, in any order (fr_comm_split(3))."""
        h = ctypes.c_void_p()
        self._check(L.fr_comm_split(self._live(), int(color),
                                    self.rank if key is None else int(key),
                                    ctypes.byref(h)))
        return Comm._of(h) if h.value else None

    def dup(self) -> "Comm":
        """Collective: a communicator of the same ranks in the same order,
        whose calls never mix with this one's."""
        h = ctypes.c_void_p()
        self._check(L.fr_comm_dup(self._live(), ctypes.byref(h)))
        return Comm._of(h)

    def revoke(self) -> None:
        """Not collective: every pending and later call on this
        communicator fails with EREVOKED, here and on every other rank as
        the notice reaches it (fr_comm_revoke(3))."""
        self._check(L.fr_comm_revoke(self._live()))

    def agree(self, flags: int = 0xFFFFFFFF) -> Tuple[int, List[int]]:
        """Fault-tolerant agreement over the ranks alive, also on a failed
        or revoked communicator: every survivor gets the same
        (AND of the survivors' flags, ranks known failed); raises only for
        errors other than failed ranks (fr_comm_agree(3))."""
        f = ctypes.c_uint32(int(flags) & 0xFFFFFFFF)
        rc = L.fr_comm_agree(self._live(), ctypes.byref(f))
        if rc not in (0, EPEER):
            self._check(rc)
        return f.value, self.failed()

    def failed(self) -> List[int]:
        """The ranks known to have failed, ascending; after agree() the
        same on every survivor (fr_comm_failed(3))."""
        n = ctypes.c_int()
        self._check(L.fr_comm_failed(self._live(), None, 0, ctypes.byref(n)))
        if n.value == 0:
            return []
        ranks = (ctypes.c_int * n.value)()
        self._check(L.fr_comm_failed(self._live(), ranks, n.value,
                                     ctypes.byref(n)))
        return list(ranks[:n.value])

    def shrink(self) -> "Comm":
        """Collective over the survivors, fault-tolerant: a communicator
        of the ranks that have not failed, in this one's order; works on a
        failed or revoked communicator, which stays open (close it)
        (fr_comm_shrink(3))."""
        h = ctypes.c_void_p()
        self._check(L.fr_comm_shrink(self._live(), ctypes.byref(h)))
        return Comm._of(h)

    def grow(self, nnew: int) -> "Comm":
        """Collective over this communicator's ranks and nnew newcomers
        (processes whose Comm() joins: FR_JOIN=1, as frrun --respawn
        starts them): a communicator of both, this one's ranks first;
        this one stays open (close it).  Raises FR_ETIMEDOUT on every
        rank here when not all newcomers came (fr_comm_grow(3))."""
        h = ctypes.c_void_p()
        self._check(L.fr_comm_grow(self._live(), int(nnew), ctypes.byref(h)))
        return Comm._of(h)

    # ---- lifetime ----------------------------------------------------------
    def close(self) -> None:
        """Release the communicator.  Requests still in flight are
        abandoned (their wait() raises)."""
        if self._h is None:
            return
        # the abandoned requests' buffers stay referenced until the
        # communicator is gone: its progress thread may still touch them
        reqs = list(self._reqs)
        kept = [r._keep for r in reqs]
        for r in reqs:
            r._abandon()
        for m in list(self._mems):
            if m._h is not None:
                L.fr_mem_deregister(m._h)
                m._h = None
        self._mems.clear()
        h, self._h = self._h, None
        L.fr_comm_destroy(h)
        del kept

    def __enter__(self) -> "Comm":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self):
        if self._h is None:
            return "<fastreduce.Comm closed>"
        return "<fastreduce.Comm rank %d of %d over %s>" % (self.rank, self.size,
                                                           self.transport)

    # ---- helpers -----------------------------------------------------------
    def _live(self):
        if self._h is None:
            raise ValueError("fastreduce: the communicator is closed")
        return self._h

    def _check(self, rc: int) -> None:
        if rc != 0:
            raise FastReduceError(rc, self.last_error())


_ALGOS = {0: "auto", 1: "ring", 2: "rd", 3: "rabenseifner", 4: "tree",
          5: "dissemination", 6: "hier", 7: "oneshot",
          8: "pairwise", 9: "bruck"}


def _algo(a) -> int:
    if isinstance(a, str):
        for k, v in _ALGOS.items():
            if v == a.lower():
                return k
        raise ValueError("fastreduce: unknown algorithm %r (%s)"
                         % (a, ", ".join(_ALGOS.values())))
    return int(a)
