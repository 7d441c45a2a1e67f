"""The torch.distributed backend "fastreduce" in pure Python: the fallback
where the C++ extension cannot be built (no libtorch-dev or pybind11-dev,
no compiler), or when FASTREDUCE_TORCH_PG=python asks for it.

A subclass of torch's ``ProcessGroup`` over :class:`fastreduce.Comm`: every
call starts the library's non-blocking collective at once (ctypes releases
the GIL while the library works) and returns a ``Work`` over a
``torch.futures.Future``; one thread per group waits for the collectives in
the order they started, another polls the pending send/recv, and futures
are completed on a pool of threads (their callbacks may start and wait for
another collective).  What torch 1.13 needs of a Python process group, and
how this one meets it:

  - an exception set on a Python future is stored in torch's C++ future
    as a *successful* value, and the Work torch makes from a future
    returns from wait() quietly even after an error: calls made through
    torch.distributed's functions get a Work of ours, whose wait() raises;
    calls from C++ (DDP, which hangs on a Python Work) get torch's Work
    over ``fut.then(value)``, a future that really failed;
  - a future whose value is not a list of tensors crashes DDP's reducer:
    every future holds a flat list of the output tensors;
  - ``getBackendName`` is overridden; ``barrier`` takes ``opts`` by keyword.

Limits against the C++ backend: each call costs some Python (tens of
microseconds); no compression through pg_options.
"""

import atexit
import os
import queue
import sys
import threading
import time
import weakref
from typing import List, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ProcessGroup, Work, _create_work_from_future

from . import EPEER, Comm, FastReduceError, UNDEFINED

__all__ = ["ProcessGroupFastReducePy"]

_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "prod", dist.ReduceOp.MIN: "min",
        dist.ReduceOp.MAX: "max", dist.ReduceOp.AVG: "avg"}
_DTYPES = {torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8,
           torch.uint8, torch.int32, torch.int64, torch.bool}


_C10D_PY = os.path.join("torch", "distributed", "distributed_c10d.py")


def _work(fut):
    """The Work of a call.  Called from torch.distributed's Python
    functions (dist.all_reduce and the rest): a _Work, whose wait() raises
    the collective's error.  Called from C++ (DDP's reducer and its
    construction, which hang on a Python Work): torch's own Work over the
    future, whose wait() returns quietly but whose future's value() (what
    DDP reads) raises."""
    try:
        caller = sys._getframe(3)  # _work <- _submit <- allreduce() <- caller
    except ValueError:  # no Python below: a thread of torch's (autograd)
        caller = None
    if caller is not None and caller.f_code.co_filename.endswith(_C10D_PY):
        return _Work(fut)
    return _create_work_from_future(fut.then(_value))


def _value(fut):
    return fut.value()  # raises the collective's error: this future fails


class _Work(Work):
    """A Work over a torch Future: wait() raises the collective's error
    (torch 1.13's _create_work_from_future makes a Work whose wait()
    returns quietly after a failure); get_future() hands DDP the future
    itself."""

    def __init__(self, fut):
        super().__init__()
        self._fut = fut

    def is_completed(self):
        return self._fut.done()

    def is_success(self):
        if not self._fut.done():
            raise RuntimeError("fastreduce: the work has not completed")
        try:
            self._fut.value()
        except Exception:  # noqa: BLE001
            return False
        return True

    def exception(self):
        return None

    def wait(self, timeout=None):
        self._fut.wait()  # raises the collective's error
        return True

    def result(self):
        return self._fut.wait()

    def get_future(self):
        return self._fut

    def synchronize(self):
        pass


def _wire(t: torch.Tensor) -> torch.Tensor:
    """The tensor the library reads and writes: t itself when it is
    contiguous, else a contiguous copy (copied back when done); bool as
    bytes."""
    if t.dtype not in _DTYPES:
        raise RuntimeError("fastreduce: dtype %s is not supported" % t.dtype)
    if t.device.type != "cpu":
        raise RuntimeError("fastreduce: tensors must be on the CPU, not %s" % t.device)
    w = t if t.is_contiguous() else t.contiguous()
    return w.view(torch.uint8) if w.dtype == torch.bool else w


def _op(opts_op, t: torch.Tensor) -> str:
    op = _OPS.get(opts_op)
    if op is None:
        raise RuntimeError("fastreduce: ReduceOp %s is not supported: SUM, PRODUCT, MIN, "
                           "MAX and AVG are" % opts_op)
    if t.dtype == torch.bool:  # a logical or / and, as torch's Gloo does
        if op == "avg":
            raise RuntimeError("fastreduce: ReduceOp.AVG needs a floating-point tensor")
        return {"sum": "max", "prod": "min"}.get(op, op)
    if op == "avg" and not t.is_floating_point():
        raise RuntimeError("fastreduce: ReduceOp.AVG needs a floating-point tensor, "
                           "not %s" % t.dtype)
    return op


class ProcessGroupFastReducePy(ProcessGroup):
    """torch.distributed's process group over a :class:`fastreduce.Comm`
    (see the module's docstring)."""

    def __init__(self, rank: int, size: int, comm: Comm):
        super().__init__(rank, size)
        self.comm = comm
        # what the threads use; they never hold the group itself, so that
        # dropping it (destroy_process_group) runs __del__ on a caller's
        # thread, which can wait for them
        self._st = _State(comm, rank, size)
        _groups.add(self._st)

    def getBackendName(self) -> str:
        return "fastreduce"

    def split(self, color: int, key: int) -> Optional["ProcessGroupFastReducePy"]:
        """new_group: fr_comm_split of this group's communicator."""
        sub = self.comm.split(color if color >= 0 else UNDEFINED, key)
        return None if sub is None else ProcessGroupFastReducePy(sub.rank, sub.size, sub)

    # recovery (fastreduce.survive): as the C++ group's
    def revoke(self) -> None:
        self.comm.revoke()

    def agree(self, flags: int):
        """(0 or FR_EPEER, AND of the survivors' flags, failed ranks)."""
        f, failed = self.comm.agree(flags)
        return (EPEER if failed else 0), f, failed

    def shrink(self) -> "ProcessGroupFastReducePy":
        s = self.comm.shrink()
        return ProcessGroupFastReducePy(s.rank, s.size, s)

    def grow(self, nnew: int) -> "ProcessGroupFastReducePy":
        g = self.comm.grow(nnew)
        return ProcessGroupFastReducePy(g.rank, g.size, g)

    @staticmethod
    def join(timeout_ms: int = 0, transport: str = "", compress: str = "",
             error_feedback: bool = True) -> "ProcessGroupFastReducePy":
        """A newcomer (FR_JOIN=1 in the environment: Comm() joins)."""
        c = Comm(transport=transport or None, timeout_ms=timeout_ms or None)
        return ProcessGroupFastReducePy(c.rank, c.size, c)

    def _submit(self, what, start, outputs, done=None, p2p=False):
        return _work(self._st.submit(what, start, outputs, done, p2p))

    def __del__(self):
        try:
            self._st.close()
        except Exception:  # noqa: BLE001
            pass

    @staticmethod
    def _copy_back(pairs):
        def done():
            for t, w in pairs:
                if w is not t and w.data_ptr() != t.data_ptr():
                    t.copy_(w.view(torch.bool) if t.dtype == torch.bool else w)
        return done

    # -- collectives -------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        if len(tensors) != 1:
            raise RuntimeError("fastreduce: allreduce takes one tensor, got %d" % len(tensors))
        t = tensors[0]
        w = _wire(t)
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, t)
        return self._submit("allreduce", lambda: self.comm.iallreduce(w, op), tensors,
                            self._copy_back([(t, w)]))

    def allreduce_coalesced(self, tensors, opts=None):
        if not tensors:
            return self._submit("allreduce_coalesced", lambda: None, tensors)
        if len({t.dtype for t in tensors}) != 1:
            raise RuntimeError("fastreduce: allreduce_coalesced needs one dtype")
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, tensors[0])
        flat = _wire(torch.cat([t.reshape(-1) for t in tensors]))

        def done():
            at = 0
            src = flat.view(torch.bool) if tensors[0].dtype == torch.bool else flat
            for t in tensors:
                t.copy_(src[at:at + t.numel()].view_as(t))
                at += t.numel()
        return self._submit("allreduce_coalesced", lambda: self.comm.iallreduce(flat, op),
                            tensors, done)

    def broadcast(self, tensors, opts=None):
        if len(tensors) != 1:
            raise RuntimeError("fastreduce: broadcast takes one tensor, got %d" % len(tensors))
        t = tensors[0]
        w = _wire(t)
        root = opts.rootRank if opts is not None else 0
        return self._submit("broadcast", lambda: self.comm.ibroadcast(w, root), tensors,
                            self._copy_back([(t, w)]))

    def reduce(self, tensors, opts=None):
        t = tensors[0]
        w = _wire(t)
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, t)
        root = opts.rootRank if opts is not None else 0
        # non-roots' tensors are left as they were, as torch documents
        return self._submit("reduce", lambda: self.comm.ireduce(w, root, op), tensors,
                            self._copy_back([(t, w)]) if self.rank() == root else None)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if len(input_tensors) != 1 or len(output_tensors) != 1 or \
                len(output_tensors[0]) != self.size():
            raise RuntimeError("fastreduce: all_gather needs one input and a list of %d "
                               "outputs" % self.size())
        t = input_tensors[0]
        outs = output_tensors[0]
        for o in outs:
            if o.dtype != t.dtype or o.numel() != t.numel():
                raise RuntimeError("fastreduce: all_gather: every output must have the "
                                   "input's dtype and size")
        w = _wire(t)
        flat = torch.empty(self.size() * w.numel(), dtype=w.dtype)

        def done():
            n = t.numel()
            src = flat.view(torch.bool) if t.dtype == torch.bool else flat
            for r, o in enumerate(outs):
                o.copy_(src[r * n:(r + 1) * n].view_as(o))
        return self._submit("allgather", lambda: self.comm.iallgather(w, flat),
                            output_tensors, done)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        n = self.size()
        if len(output_lists) != n or any(len(o) != len(input_tensors) for o in output_lists):
            raise RuntimeError("fastreduce: allgather_coalesced needs %d output lists "
                               "shaped as the inputs" % n)
        if len({t.dtype for t in input_tensors}) > 1:
            raise RuntimeError("fastreduce: allgather_coalesced needs one dtype")
        for outs in output_lists:
            for o, t in zip(outs, input_tensors):
                if o.dtype != t.dtype or o.numel() != t.numel():
                    raise RuntimeError("fastreduce: allgather_coalesced: each output must "
                                       "have its input's dtype and size")
        if not input_tensors:
            return self._submit("allgather_coalesced", lambda: None, output_lists)
        flat = _wire(torch.cat([t.reshape(-1) for t in input_tensors]))
        whole = torch.empty(n * flat.numel(), dtype=flat.dtype)

        def done():
            src = whole.view(torch.bool) if input_tensors[0].dtype == torch.bool else whole
            at = 0
            for r in range(n):
                for o in output_lists[r]:
                    o.copy_(src[at:at + o.numel()].view_as(o))
                    at += o.numel()
        return self._submit("allgather_coalesced", lambda: self.comm.iallgather(flat, whole),
                            output_lists, done)

    def _allgather_base(self, output, input, opts=None):
        if output.numel() != input.numel() * self.size() or output.dtype != input.dtype:
            raise RuntimeError("fastreduce: all_gather_into_tensor: the output must have "
                               "world size x the input's elements, of its dtype")
        w, o = _wire(input), _wire(output)
        return self._submit("all_gather_into_tensor", lambda: self.comm.iallgather(w, o),
                            [output], self._copy_back([(output, o)]))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        if len(output_tensors) != 1 or len(input_tensors) != 1 or \
                len(input_tensors[0]) != self.size():
            raise RuntimeError("fastreduce: reduce_scatter needs one output and a list of "
                               "%d inputs" % self.size())
        t = output_tensors[0]
        for i in input_tensors[0]:
            if i.dtype != t.dtype or i.numel() != t.numel():
                raise RuntimeError("fastreduce: reduce_scatter: every input must have the "
                                   "output's dtype and size")
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, t)
        flat = _wire(torch.cat([i.reshape(-1) for i in input_tensors[0]]))
        w = _wire(t)
        return self._submit("reduce_scatter", lambda: self.comm.ireduce_scatter(flat, w, op),
                            output_tensors, self._copy_back([(t, w)]))

    def _reduce_scatter_base(self, output, input, opts=None):
        if input.numel() != output.numel() * self.size() or output.dtype != input.dtype:
            raise RuntimeError("fastreduce: reduce_scatter_tensor: the input must have "
                               "world size x the output's elements, of its dtype")
        op = _op(opts.reduceOp if opts is not None else dist.ReduceOp.SUM, output)
        i, w = _wire(input), _wire(output)
        return self._submit("reduce_scatter_tensor",
                            lambda: self.comm.ireduce_scatter(i, w, op), [output],
                            self._copy_back([(output, w)]))

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        n = self.size()
        if output.dtype != input.dtype or output.dim() == 0 or input.dim() == 0:
            raise RuntimeError("fastreduce: all_to_all_single needs an input and an output "
                               "of one dtype, with a first dimension")
        row_in = input.numel() // max(input.shape[0], 1) if input.dim() else 1
        row_out = output.numel() // max(output.shape[0], 1) if output.dim() else 1
        if not input_split_sizes and not output_split_sizes:
            if input.numel() % n or output.numel() != input.numel():
                raise RuntimeError("fastreduce: all_to_all_single without splits needs equal "
                                   "sizes divisible by the world size")
            sc = rc = [input.numel() // n] * n
        else:
            ins = list(input_split_sizes) or [input.shape[0] // n] * n
            outs = list(output_split_sizes) or [output.shape[0] // n] * n
            if len(ins) != n or len(outs) != n or sum(ins) != input.shape[0] or \
                    sum(outs) != output.shape[0]:
                raise RuntimeError("fastreduce: all_to_all_single: split sizes must name "
                                   "every rank and add up to the first dimension")
            sc = [s * row_in for s in ins]
            rc = [s * row_out for s in outs]
        i, w = _wire(input), _wire(output)
        return self._submit("all_to_all_single",
                            lambda: self.comm.ialltoallv(i, sc, rc, w), [output],
                            self._copy_back([(output, w)]))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        n = self.size()
        if len(output_tensors) != n or len(input_tensors) != n:
            raise RuntimeError("fastreduce: all_to_all needs %d inputs and outputs" % n)
        flat_in = _wire(torch.cat([t.reshape(-1) for t in input_tensors]))
        flat_out = torch.empty(sum(t.numel() for t in output_tensors), dtype=flat_in.dtype)
        sc = [t.numel() for t in input_tensors]
        rc = [t.numel() for t in output_tensors]

        def done():
            at = 0
            bools = output_tensors[0].dtype == torch.bool
            src = flat_out.view(torch.bool) if bools else flat_out
            for t in output_tensors:
                t.copy_(src[at:at + t.numel()].view_as(t))
                at += t.numel()
        return self._submit("all_to_all", lambda: self.comm.ialltoallv(flat_in, sc, rc, flat_out),
                            output_tensors, done)

    def gather(self, output_tensors, input_tensors, opts=None):
        # an all-to-all where only the root receives (as the C++ backend)
        n, root = self.size(), opts.rootRank if opts is not None else 0
        t = input_tensors[0]
        w = _wire(t)
        sc = [w.numel() if q == root else 0 for q in range(n)]
        me_root = self.rank() == root
        rc = [w.numel() if me_root else 0] * n
        flat = torch.empty(sum(rc), dtype=w.dtype)

        def done():
            if me_root:
                src = flat.view(torch.bool) if t.dtype == torch.bool else flat
                for r, o in enumerate(output_tensors[0]):
                    o.copy_(src[r * t.numel():(r + 1) * t.numel()].view_as(o))
        if me_root and len(output_tensors[0]) != n:
            raise RuntimeError("fastreduce: gather needs a list of %d outputs on the root" % n)
        return self._submit("gather", lambda: self.comm.ialltoallv(w, sc, rc, flat),
                            output_tensors, done)

    def scatter(self, output_tensors, input_tensors, opts=None):
        n, root = self.size(), opts.rootRank if opts is not None else 0
        t = output_tensors[0]
        w = _wire(t)
        me_root = self.rank() == root
        if me_root:
            if len(input_tensors[0]) != n:
                raise RuntimeError("fastreduce: scatter needs a list of %d inputs on the "
                                   "root" % n)
            if any(i.dtype != t.dtype or i.numel() != t.numel() for i in input_tensors[0]):
                raise RuntimeError("fastreduce: scatter: every input must have the "
                                   "output's dtype and size")
            flat = _wire(torch.cat([i.reshape(-1) for i in input_tensors[0]]))
        else:
            flat = torch.empty(0, dtype=w.dtype)
        sc = [w.numel() if me_root else 0] * n
        rc = [w.numel() if q == root else 0 for q in range(n)]
        return self._submit("scatter", lambda: self.comm.ialltoallv(flat, sc, rc, w),
                            output_tensors, self._copy_back([(t, w)]))

    def barrier(self, opts=None):
        return self._submit("barrier", lambda: self.comm.ibarrier(), [])

    # -- point to point ----------------------------------------------------------

    def send(self, tensors, dst, tag):
        w = _wire(tensors[0])
        return self._submit("send", lambda: self.comm.isend(w, dst, tag), tensors, p2p=True)

    def recv(self, tensors, src, tag):
        t = tensors[0]
        w = _wire(t)
        return self._submit("recv", lambda: self.comm.irecv(w, src, tag), tensors,
                            self._copy_back([(t, w)]), p2p=True)

    def recv_anysource(self, tensors, tag):
        raise RuntimeError("fastreduce: a receive from any source is not supported: "
                           "name the sender")

class _CallbackPool:
    """Where futures are completed: a Future's callbacks run on the thread
    that completes it, and a callback may start another collective of the
    group and wait for it (torch's PowerSGD hook does), which the
    completion thread would then wait for forever.  A thread is started
    whenever none is idle."""

    def __init__(self):
        self._q: "queue.Queue" = queue.Queue()
        self._idle = 0
        self._busy = 0  # handed over and not yet finished
        self._cv = threading.Condition()

    def run(self, fn, arg):
        with self._cv:
            self._busy += 1
            if self._idle == 0:
                threading.Thread(target=self._serve, daemon=True,
                                 name="fastreduce-pg-cb").start()
            else:
                self._idle -= 1
        self._q.put((fn, arg))

    def _serve(self):
        while True:
            fn, arg = self._q.get()
            try:
                fn(arg)
            except Exception:  # noqa: BLE001 - a callback's error is its future's
                pass
            with self._cv:
                self._idle += 1
                self._busy -= 1
                self._cv.notify_all()

    def drain(self, timeout: float) -> None:
        """Wait until no completion is running.  A waiter wakes when its
        future is marked complete, before the future's callbacks (then())
        have run on our thread: a process that then exits would stop that
        thread inside torch's C++ code, which aborts it ("terminate called
        without an active exception")."""
        with self._cv:
            self._cv.wait_for(lambda: self._busy == 0, timeout)


_callbacks = _CallbackPool()
_groups: "weakref.WeakSet" = weakref.WeakSet()


@atexit.register
def _shutdown():
    # a thread left to die with the interpreter may hold the last
    # reference to one of torch's C++ objects, whose destruction then
    # aborts the process
    for st in list(_groups):
        st.close()
    _callbacks.drain(30.0)


class _State:
    """A group's communicator, queues and threads."""

    def __init__(self, comm, rank, size):
        self.comm, self.rank, self.size = comm, rank, size
        self.colls: "queue.Queue" = queue.Queue()
        self.p2p: List = []
        self.cv = threading.Condition()
        self.lock = threading.Lock()  # start + enqueue, in one order
        self.closed = False  # no more submissions
        self.p2p_stop = False  # the send/recv thread ends
        self.coll_thread = threading.Thread(target=self._complete_colls, daemon=True,
                                            name="fastreduce-pg")
        self.p2p_thread = threading.Thread(target=self._complete_p2p, daemon=True,
                                           name="fastreduce-pg-p2p")
        self.coll_thread.start()
        self.p2p_thread.start()

    def submit(self, what, start, outputs, done, p2p):
        fut = torch.futures.Future()
        # one lock: requests enter the queue in the order they started
        # (the completion thread waits for them in queue order), and none
        # after close
        with self.lock:
            if self.closed:
                raise RuntimeError("fastreduce: %s: the group was destroyed" % what)
            try:
                req = start()
            except FastReduceError as e:
                raise self.fail(what, e) from None
            item = (req, what, fut, outputs, done)
            if p2p:
                with self.cv:
                    self.p2p.append(item)
                    self.cv.notify()
            else:
                self.colls.put(item)
        return fut

    def fail(self, what, e):
        return RuntimeError("fastreduce: %s on rank %d of %d failed: %s"
                            % (what, self.rank, self.size, e))

    def finish(self, item, error=None):
        what, fut, outputs, done = item
        if error is None and done is not None:
            try:
                # results go into the callers' tensors, which may require
                # grad: outside autograd, as on the caller's thread
                with torch.no_grad():
                    done()
            except Exception as e:  # noqa: BLE001 - handed to the caller
                error = e
        if error is not None:
            _callbacks.run(fut.set_exception, self.fail(what, error))
        else:
            # a flat list of tensors: anything else crashes DDP's reducer
            flat = []
            for o in outputs:
                flat.extend(o if isinstance(o, (list, tuple)) else [o])
            _callbacks.run(fut.set_result, flat)

    def _complete_colls(self):
        """Wait for the collectives in the order they started (the library
        completes a group's in that order) and complete their futures."""
        while True:
            item = self.colls.get()
            if item is None:
                return
            try:
                if item[0] is not None:
                    item[0].wait()
            except FastReduceError as e:
                self.finish(item[1:], e)
            except Exception as e:  # noqa: BLE001 - never leave a future hanging
                self.finish(item[1:], e)
            else:
                self.finish(item[1:])

    def _complete_p2p(self):
        """Poll every pending send/recv: a receive may be posted long
        before its sender comes, and must hold back the report of no
        other.  200 us between polls while some complete, up to 1 ms while
        none does."""
        idle = 0.0002
        while True:
            with self.cv:
                while not self.p2p and not self.p2p_stop:
                    self.cv.wait()
                    idle = 0.0002
                if self.p2p_stop:
                    return
                items = list(self.p2p)
            for item in items:
                err = None
                with self.cv:  # close() may not destroy the comm under a test
                    if self.p2p_stop:
                        return
                try:
                    finished = item[0].test()
                except FastReduceError as e:
                    finished, err = True, e
                if finished:
                    with self.cv:
                        if item in self.p2p:
                            self.p2p.remove(item)
                    self.finish(item[1:], err)
                    idle = 0.0002
            time.sleep(idle)
            idle = min(idle * 2, 0.001)

    def close(self):
        """The group was dropped (destroy_process_group) or the interpreter
        exits: pending collectives complete first, pending send/recv fail,
        the threads end, then the communicator goes."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.colls.put(None)
        me = threading.current_thread()
        if me is not self.coll_thread:
            self.coll_thread.join()
        with self.cv:
            self.p2p_stop = True
            left, self.p2p[:] = list(self.p2p), []
            self.cv.notify()
        if me is not self.p2p_thread:
            self.p2p_thread.join()
        for item in left:
            self.finish(item[1:], "the group was destroyed before it completed")
        self.comm.close()
