"""Loading libfastreduce.so and declaring its C interface for ctypes.

The library is found, in this order, at:

1. ``$FASTREDUCE_LIB`` (a path to ``libfastreduce.so``), for tests and for
   using a build tree without installing it;
2. the path ``make install`` wrote into ``_config.py`` next to this file;
3. ``build/.libs/`` of the source tree this package sits in (``python/``
   of a checkout built as the README says);
4. the dynamic linker's search path (``libfastreduce.so.0``).

ctypes.CDLL releases the GIL for every call, so a collective that blocks in
C does not stop other Python threads (the DDP hook's completion thread
relies on it).
"""

import ctypes
import ctypes.util
import os

_SONAME = "libfastreduce.so.0"


def _candidates():
    env = os.environ.get("FASTREDUCE_LIB")
    if env:
        yield env
        return
    try:
        from . import _config  # written by `make install`

        yield _config.LIBRARY
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    top = os.path.dirname(os.path.dirname(here))
    yield os.path.join(top, "build", ".libs", _SONAME)
    yield _SONAME
    found = ctypes.util.find_library("fastreduce")
    if found:
        yield found


def _load():
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (missing)")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError(
        "fastreduce: cannot load libfastreduce.so; tried: "
        + "; ".join(tried)
        + ". Build and install the library (README), or set FASTREDUCE_LIB "
        "to the path of libfastreduce.so."
    )


lib, path = _load()

c_size_t = ctypes.c_size_t
c_int = ctypes.c_int
c_void_p = ctypes.c_void_p
c_char_p = ctypes.c_char_p


class Config(ctypes.Structure):
    """fr_config_t (fastreduce.h); filled by fr_config_init()."""

    _fields_ = [
        ("size", c_size_t),
        ("rank", c_int),
        ("nranks", c_int),
        ("rendezvous", c_char_p),
        ("transport", c_char_p),
        ("job_token", c_char_p),
        ("timeout_ms", c_int),
        ("segment_bytes", c_size_t),
        ("slots", c_int),
        ("regcache_entries", c_int),
        ("algo", c_int),
        ("progress", c_int),
    ]


STATS_FIELDS = (
    "collectives",
    "bytes_sent",
    "bytes_received",
    "writes",
    "mem_registrations",
    "regcache_hits",
    "regcache_misses",
    "regcache_evictions",
    "rkeys_sent",
    "wire_bytes",
    "compress_in_bytes",
    "compress_out_bytes",
)


class Stats(ctypes.Structure):
    """fr_stats_t (fastreduce.h)."""

    _fields_ = [("size", c_size_t)] + [(f, ctypes.c_uint64) for f in STATS_FIELDS]


class CollOpts(ctypes.Structure):
    """fr_coll_opts_t (fastreduce.h)."""

    _fields_ = [
        ("size", c_size_t),
        ("compress", c_int),
        ("residual", ctypes.POINTER(ctypes.c_float)),
    ]


P = ctypes.POINTER
_comm = c_void_p
_req_out = P(c_void_p)


def _proto(name, restype, *argtypes):
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


_proto("fr_version", c_char_p)
_proto("fr_version_number", ctypes.c_uint)
_proto("fr_strerror", c_char_p, c_int)
_proto("fr_errname", c_char_p, c_int)
_proto("fr_compress_from_name", c_int, c_char_p, P(c_int))
_proto("fr_config_init", None, P(Config))
_proto("fr_comm_create", c_int, P(Config), P(c_void_p))
_proto("fr_comm_create_from_env", c_int, P(Config), P(c_void_p))
_proto("fr_comm_destroy", c_int, _comm)
_proto("fr_comm_split", c_int, _comm, c_int, c_int, P(c_void_p))
_proto("fr_comm_dup", c_int, _comm, P(c_void_p))
_proto("fr_comm_rank", c_int, _comm)
_proto("fr_comm_size", c_int, _comm)
_proto("fr_comm_transport", c_char_p, _comm)
_proto("fr_comm_last_error", c_char_p, _comm)
_proto("fr_comm_revoke", c_int, _comm)
_proto("fr_comm_agree", c_int, _comm, P(ctypes.c_uint32))
_proto("fr_comm_failed", c_int, _comm, P(c_int), c_int, P(c_int))
_proto("fr_comm_shrink", c_int, _comm, P(c_void_p))
_proto("fr_comm_grow", c_int, _comm, c_int, P(c_void_p))
_proto("fr_comm_stats", c_int, _comm, P(Stats))
_proto("fr_comm_last_algo", c_int, _comm)
_proto("fr_mem_register", c_int, _comm, c_void_p, c_size_t, P(c_void_p))
_proto("fr_mem_deregister", c_int, c_void_p)
_proto("fr_coll_opts_init", None, P(CollOpts))
_proto("fr_allreduce_ex", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int, c_int, P(CollOpts))
_proto("fr_iallreduce_ex", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int, c_int, P(CollOpts), _req_out)
_proto("fr_reduce_scatter", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int, c_int)
_proto("fr_ireduce_scatter", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int, c_int, _req_out)
_proto("fr_allgather", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int)
_proto("fr_iallgather", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int, _req_out)
_proto("fr_send", c_int, _comm, c_void_p, c_size_t, c_int, c_int, c_int)
_proto("fr_recv", c_int, _comm, c_void_p, c_size_t, c_int, c_int, c_int)
_proto("fr_isend", c_int, _comm, c_void_p, c_size_t, c_int, c_int, c_int, _req_out)
_proto("fr_irecv", c_int, _comm, c_void_p, c_size_t, c_int, c_int, c_int, _req_out)
_proto("fr_reduce", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int, c_int, c_int)
_proto("fr_ireduce", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, _req_out)
_proto("fr_alltoall", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int)
_proto("fr_ialltoall", c_int, _comm, c_void_p, c_void_p, c_size_t, c_int, _req_out)
_sizes = P(c_size_t)
_proto("fr_alltoallv", c_int, _comm, c_void_p, _sizes, _sizes, c_void_p, _sizes, _sizes, c_int)
_proto("fr_ialltoallv", c_int, _comm, c_void_p, _sizes, _sizes, c_void_p, _sizes, _sizes, c_int,
       _req_out)
_proto("fr_allgatherv", c_int, _comm, c_void_p, c_size_t, c_void_p, _sizes, _sizes, c_int)
_proto("fr_iallgatherv", c_int, _comm, c_void_p, c_size_t, c_void_p, _sizes, _sizes, c_int,
       _req_out)
_proto("fr_reduce_scatterv", c_int, _comm, c_void_p, c_void_p, _sizes, c_int, c_int)
_proto("fr_ireduce_scatterv", c_int, _comm, c_void_p, c_void_p, _sizes, c_int, c_int, _req_out)
_proto("fr_broadcast", c_int, _comm, c_void_p, c_size_t, c_int, c_int)
_proto("fr_ibroadcast", c_int, _comm, c_void_p, c_size_t, c_int, c_int, _req_out)
_proto("fr_barrier", c_int, _comm)
_proto("fr_ibarrier", c_int, _comm, _req_out)
_proto("fr_test", c_int, _req_out, P(c_int))
_proto("fr_wait", c_int, _req_out)
_proto("fr_progress", c_int, _comm)

#: FR_IN_PLACE of fastreduce.h
IN_PLACE = c_void_p(1)
