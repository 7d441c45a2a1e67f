"""The torch.distributed backend "fastreduce" (a c10d ProcessGroup in C++).

Importing :mod:`fastreduce.torch` registers it; then::

    import torch.distributed as dist
    import fastreduce.torch  # noqa: F401  (registers "fastreduce")

    dist.init_process_group("fastreduce", init_method="env://")  # or tcp://, file://
    model = torch.nn.parallel.DistributedDataParallel(net)        # no Gloo anywhere

Bootstrap goes through the store torch's ``init_process_group`` made, so the
user chooses no port: rank 0 of each group picks a free one, and writes it,
with its address and a job token (FR_JOB_TOKEN where set, else a random
one), into the group's store; the other ranks read them there.  The address is ``MASTER_ADDR`` when set (env://,
torchrun), else the host part of ``FR_RENDEZVOUS`` (frrun), else the address
this host reaches others by (its default route), else 127.0.0.1.  The
timeout is ``init_process_group(timeout=)``'s.  ``pg_options`` may be None
or a :class:`Options`.

The ProcessGroup itself is the C++ extension ``process_group.cpp`` next to
this file, compiled by ``torch.utils.cpp_extension`` against the libfastreduce
the package uses.  ``make install`` builds it into ``_torch/`` next to this
file when torch and its headers are there, stamped with what it was built
from (this source, fastreduce.h, the library's path, torch's version); a
stamp that does not match, or no build at install, means a build on first
use into a cache directory (``$FASTREDUCE_TORCH_BUILD``, else
``~/.cache/fastreduce/torch-<version>-<hash>``).  It needs Debian's
``libtorch-dev`` and ``pybind11-dev`` (``install-deps.sh`` installs them).
:func:`build_extension` builds it ahead of time.  Where it cannot be
built, :mod:`fastreduce.pg_python` (pure Python, slower) takes its place
with a warning; ``FASTREDUCE_TORCH_PG=python|cpp|auto`` chooses.
"""

import datetime
import functools
import hashlib
import importlib.util
import inspect
import os
import secrets
import socket
import threading
import warnings
from typing import Optional

import torch
import torch.distributed as dist

from . import _lib

__all__ = ["Options", "BACKEND", "build_extension"]

BACKEND = "fastreduce"

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE = os.path.join(_HERE, "csrc", "process_group.cpp")
_lock = threading.Lock()
_module = None
# new_group: the sub-communicator every rank made before torch's creator
# runs (on the members only); see _wrap_new_group
_pending = threading.local()
# how many groups were made by a rendezvous of their own / by a split (tests)
stats = {"rendezvous": 0, "split": 0}


class Options:
    """``pg_options`` of ``init_process_group``/``new_group`` for the backend.

    transport: "auto", "tcp", "shm", "verbs" (None: FR_TRANSPORT, else auto).
    compress: None, "bf16", "fp16" or "int8": float32 all_reduce with SUM or
      AVG travels narrowed (the reduction stays in float32; every rank ends
      with the same bits); other dtypes and ops go as they are.
    error_feedback: with compress, keep a residual per buffer (DDP's
      buckets keep theirs for the whole run) and add it back at the
      buffer's next all_reduce, so nothing is lost over the steps.
    A group from new_group shares the world's transport and compression.
    """

    def __init__(self, transport: Optional[str] = None, compress: Optional[str] = None,
                 error_feedback: bool = True):
        self.transport = transport
        self.compress = None if compress in (None, "none") else compress
        self.error_feedback = bool(error_feedback)


def _include_dir(libpath: str) -> str:
    cands = []
    env = os.environ.get("FASTREDUCE_INCLUDE")
    if env:
        cands.append(env)
    top = os.path.dirname(os.path.dirname(_HERE))  # a source checkout
    cands.append(os.path.join(top, "include"))
    libdir = os.path.dirname(os.path.realpath(libpath))
    cands.append(os.path.join(os.path.dirname(libdir), "include"))  # <prefix>/include
    # a build tree's .libs: <build>/.libs -> <srcdir>/include via the tree
    cands.append(os.path.join(os.path.dirname(os.path.dirname(libdir)), "include"))
    for d in cands:
        if os.path.exists(os.path.join(d, "fastreduce.h")):
            return d
    raise ImportError("fastreduce: fastreduce.h not found (tried %s); set "
                      "FASTREDUCE_INCLUDE to the directory that holds it" % ", ".join(cands))


_PREBUILT = os.path.join(_HERE, "_torch")  # make install's build
_STAMP = "stamp"


def _key(libpath: str, include: str) -> str:
    """What a built module depends on: a rebuilt library or a changed
    source never meets a stale module."""
    h = hashlib.sha256()
    for p in (_SOURCE, os.path.join(include, "fastreduce.h")):
        with open(p, "rb") as f:
            h.update(f.read())
    h.update(os.path.realpath(libpath).encode())
    h.update(torch.__version__.encode())
    return h.hexdigest()


def _build_dir(libpath: str, include: str) -> str:
    d = os.environ.get("FASTREDUCE_TORCH_BUILD")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastreduce",
                        "torch-%s-%s" % (torch.__version__, _key(libpath, include)[:12]))


def _load_prebuilt(key: str):
    """make install's module, if its stamp says it was built from what
    we have; loaded directly (cpp_extension.load would want to write a
    lock and a build file next to it, which a user other than the one who
    installed may not)."""
    try:
        with open(os.path.join(_PREBUILT, _STAMP)) as f:
            if f.read().strip() != key:
                return None
    except OSError:
        return None
    path = os.path.join(_PREBUILT, "fastreduce_torch_c.so")
    spec = importlib.util.spec_from_file_location("fastreduce_torch_c", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build_extension(verbose: bool = False):
    """Compile (once; later calls load the cached module) and return the
    extension module ``fastreduce_torch_c``."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        from torch.utils import cpp_extension

        libpath = _lib.path
        include = _include_dir(libpath)
        libdir = os.path.dirname(os.path.realpath(libpath))
        key = _key(libpath, include)
        if not os.environ.get("FASTREDUCE_TORCH_BUILD"):
            _module = _load_prebuilt(key)
            if _module is not None:
                return _module
        build = _build_dir(libpath, include)
        os.makedirs(build, exist_ok=True)
        _module = cpp_extension.load(
            name="fastreduce_torch_c",
            sources=[_SOURCE],
            extra_include_paths=[include],
            extra_cflags=["-O2"],
            extra_ldflags=["-L" + libdir, "-l:" + os.path.basename(os.path.realpath(libpath)),
                           "-Wl,-rpath," + libdir],
            build_directory=build,
            verbose=verbose,
        )
        with open(os.path.join(build, _STAMP), "w") as f:
            f.write(key + "\n")
        return _module



def _is_local(addr: str) -> bool:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((addr, 0))
        return True
    except OSError:
        return False


def _my_address() -> str:
    # MASTER_ADDR / FR_RENDEZVOUS name rank 0 of the job: ours only where
    # this process runs there (rank 0 of a group may be on another host)
    for addr in (os.environ.get("MASTER_ADDR"),
                 (os.environ.get("FR_RENDEZVOUS") or "").rpartition(":")[0]):
        if addr and _is_local(addr):
            return addr
    try:  # the interface of the default route (no packet is sent)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _timeout_ms(timeout) -> int:
    if isinstance(timeout, datetime.timedelta):
        # the library's timeout is an int of milliseconds (24.8 days)
        return min(max(1, int(timeout.total_seconds() * 1000)), 2**31 - 1)
    return 0


def _create(dist_opts, pg_options):
    """torch's creator (register_backend(..., extended_api=True))."""
    pend = getattr(_pending, "group", None)
    if pend is not None and pend[1] is not None and \
            list(dist_opts.global_ranks_in_group or pend[0]) == pend[0]:
        stats["split"] += 1
        return pend[1]
    stats["rendezvous"] += 1
    store = dist_opts.store
    rank, size = dist_opts.group_rank, dist_opts.group_size
    transport = getattr(pg_options, "transport", None) or ""
    key = "fastreduce/rendezvous"
    # rank 0 chooses the implementation for the whole group: the C++ and
    # the pure-Python groups do not mix (e.g. compression is the C++ one's)
    if rank == 0:
        mod = _implementation()
        host = _my_address()
        port = _free_port(host)  # (another process may take it first: rare)
        # the job's token where the launcher set one (frrun), so that a
        # newcomer it starts (fastreduce.torch.Survivor) presents the same
        token = os.environ.get("FR_JOB_TOKEN") or secrets.token_hex(16)
        # the token last: it may hold blanks
        store.set(key, "%s:%d %s %s" % (host, port, "python" if mod is None else "cpp",
                                        token))
    value = store.get(key).decode()
    rdv, impl, token = value.split(" ", 2)
    if rank != 0:
        mod = _implementation(follow=impl)
    compress = getattr(pg_options, "compress", None) or ""
    if mod is None:
        from . import Comm
        from .pg_python import ProcessGroupFastReducePy
        if compress:
            warnings.warn("fastreduce: the pure-Python backend does not compress; "
                          "pg_options compress=%r is not used" % compress, stacklevel=2)
        timeout = _timeout_ms(dist_opts.timeout)
        comm = Comm(rank, size, rdv, transport=transport or None, job_token=token,
                    timeout_ms=timeout or None)
        return ProcessGroupFastReducePy(rank, size, comm)
    return mod.ProcessGroupFastReduce(rank, size, rdv, _timeout_ms(dist_opts.timeout),
                                      transport, token, compress,
                                      bool(getattr(pg_options, "error_feedback", True)))


_build_error: Optional[Exception] = None


def _implementation(follow: Optional[str] = None):
    """The C++ extension module, or None for the pure-Python process group:
    FASTREDUCE_TORCH_PG=python asks for it, =cpp refuses it, auto (the
    default) falls back to it, with a warning, where the extension cannot
    be built (tried once per process).  follow: what the group's rank 0
    chose, which the other ranks take (or fail clearly)."""
    global _build_error
    want = os.environ.get("FASTREDUCE_TORCH_PG", "auto").lower()
    if want not in ("auto", "cpp", "python"):
        raise ValueError("FASTREDUCE_TORCH_PG=%s: say auto, cpp or python" % want)
    if follow == "python":
        if want == "cpp":
            raise RuntimeError("fastreduce: FASTREDUCE_TORCH_PG=cpp here, but the group's "
                               "rank 0 uses the pure-Python backend")
        return None
    if follow == "cpp":
        try:
            return build_extension()
        except Exception as e:  # noqa: BLE001
            raise RuntimeError("fastreduce: the group's rank 0 uses the C++ backend, which "
                               "cannot be built here: %s" % e) from e
    if want == "python":
        return None
    if _build_error is None:
        try:
            return build_extension()
        except Exception as e:  # noqa: BLE001 - any build failure
            if want == "cpp":
                raise
            _build_error = e
            warnings.warn("fastreduce: the C++ backend cannot be built (%s); using the "
                          "pure-Python one (fastreduce-python(7))" % str(e).splitlines()[0],
                          stacklevel=3)
    elif want == "cpp":
        raise _build_error
    return None


def _world():
    """The default group when it is ours, else None."""
    if not dist.is_initialized():
        return None
    pg = dist.distributed_c10d._get_default_group()
    mod = _module
    if mod is not None and isinstance(pg, mod.ProcessGroupFastReduce):
        return pg
    from .pg_python import ProcessGroupFastReducePy
    return pg if isinstance(pg, ProcessGroupFastReducePy) else None


def _wrap_new_group(orig):
    """dist.new_group, made a split of the world's communicator.

    torch calls a backend's creator on the group's members only, but
    requires every rank to call new_group, in the same order: so here,
    before torch's new_group, every rank splits the world communicator
    (members by their global rank, the others FR_UNDEFINED), and the
    creator hands the members' new group to torch.  No rendezvous, no new
    connection: the group shares the world's."""
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def new_group(*args, **kwargs):
        world = _world()
        b = sig.bind(*args, **kwargs)
        b.apply_defaults()
        backend = b.arguments.get("backend")
        if world is None or (backend and str(backend).lower() != BACKEND):
            return orig(*args, **kwargs)
        ranks = b.arguments.get("ranks")
        if ranks is not None:
            ranks = list(ranks)  # a generator is read once, here
            if len(set(ranks)) != len(ranks):
                raise ValueError("new_group: ranks %s name a rank twice" % ranks)
            b.arguments["ranks"] = ranks
        if b.arguments.get("pg_options") is not None:
            warnings.warn("fastreduce: a group from new_group shares the world's transport "
                          "and compression; its pg_options are not used", stacklevel=2)
        me = dist.get_rank()
        members = sorted(ranks) if ranks is not None else list(range(dist.get_world_size()))
        sub = world.split(0 if me in members else -1, me)
        _pending.group = (members, sub)
        try:
            return orig(*b.args, **b.kwargs)
        finally:
            _pending.group = None

    new_group._fastreduce = True
    return new_group


def register() -> None:
    """Register "fastreduce" with torch.distributed and make new_group
    split its communicator (done on import of :mod:`fastreduce.torch`; a
    second call does nothing)."""
    if not getattr(dist.new_group, "_fastreduce", False):
        dist.new_group = _wrap_new_group(dist.new_group)
        dist.distributed_c10d.new_group = dist.new_group
    if BACKEND.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND, _create, extended_api=True)
