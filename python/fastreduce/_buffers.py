"""Turning numpy arrays, torch tensors and other buffers into (address,
element count, fastreduce dtype) without copying.

Nothing here imports numpy or torch: numpy arrays are read through
``__array_interface__``, torch tensors through ``data_ptr()``, anything
else through the buffer protocol (``memoryview``).
"""

import ctypes
import enum


class DType(enum.IntEnum):
    """Element types (fr_dtype_t)."""

    FLOAT32 = 0
    FLOAT64 = 1
    FLOAT16 = 2
    BFLOAT16 = 3
    INT8 = 4
    UINT8 = 5
    INT32 = 6
    UINT32 = 7
    INT64 = 8
    UINT64 = 9


ITEMSIZE = {
    DType.FLOAT32: 4, DType.FLOAT64: 8, DType.FLOAT16: 2, DType.BFLOAT16: 2,
    DType.INT8: 1, DType.UINT8: 1, DType.INT32: 4, DType.UINT32: 4,
    DType.INT64: 8, DType.UINT64: 8,
}

# Names as numpy and torch spell them (torch.float32 -> "float32").
_BY_NAME = {d.name.lower(): d for d in DType}
_BY_NAME.update({
    "float": DType.FLOAT32, "f32": DType.FLOAT32, "double": DType.FLOAT64,
    "f64": DType.FLOAT64, "half": DType.FLOAT16, "f16": DType.FLOAT16,
    "bf16": DType.BFLOAT16, "long": DType.INT64, "int": DType.INT32,
})
# numpy's typestr (kind + size) of __array_interface__, e.g. "<f4".
_BY_TYPESTR = {
    "f4": DType.FLOAT32, "f8": DType.FLOAT64, "f2": DType.FLOAT16,
    "i1": DType.INT8, "u1": DType.UINT8, "i4": DType.INT32, "u4": DType.UINT32,
    "i8": DType.INT64, "u8": DType.UINT64,
}
# struct-module formats of memoryview.format
_BY_FORMAT = {
    "f": DType.FLOAT32, "d": DType.FLOAT64, "e": DType.FLOAT16,
    "b": DType.INT8, "B": DType.UINT8, "c": DType.UINT8,
}
for _f, _size, _signed in (("i", ctypes.sizeof(ctypes.c_int), True),
                           ("I", ctypes.sizeof(ctypes.c_uint), False),
                           ("l", ctypes.sizeof(ctypes.c_long), True),
                           ("L", ctypes.sizeof(ctypes.c_ulong), False),
                           ("q", 8, True), ("Q", 8, False)):
    _BY_FORMAT[_f] = {(4, True): DType.INT32, (4, False): DType.UINT32,
                      (8, True): DType.INT64, (8, False): DType.UINT64}[(_size, _signed)]


def dtype_of(spec):
    """A DType from a DType, an int, a name ("float32", "bf16"), a numpy
    dtype or a torch dtype."""
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, int):
        return DType(spec)
    name = str(spec)
    if name.startswith("torch."):
        name = name[len("torch."):]
    name = name.lower()
    if name in _BY_NAME:
        return _BY_NAME[name]
    raise ValueError("fastreduce: unsupported dtype %r (supported: %s)"
                     % (spec, ", ".join(d.name.lower() for d in DType)))


class View:
    """A buffer as the C library sees it; holds a reference to the object
    (and to whatever keeps its memory alive) while it is in use."""

    __slots__ = ("obj", "ptr", "count", "dtype", "readonly", "_keep")

    def __init__(self, obj, ptr, count, dtype, readonly, keep=None):
        self.obj = obj
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.readonly = readonly
        self._keep = keep

    @property
    def nbytes(self):
        return self.count * ITEMSIZE[self.dtype]


def _is_torch(obj):
    return type(obj).__module__.split(".")[0] == "torch" and hasattr(obj, "data_ptr")


def view(obj, dtype=None, what="buffer"):
    """Describe obj (numpy array, torch CPU tensor, writable buffer) as a
    View.  dtype overrides the element type when the object's own cannot
    say it (a uint16 array holding bfloat16 bits); its size must match."""
    if isinstance(obj, View):
        return obj
    if _is_torch(obj):
        if obj.device.type != "cpu":
            raise ValueError("fastreduce: %s is a %s tensor; only CPU tensors "
                             "are supported" % (what, obj.device.type))
        if not obj.is_contiguous():
            raise ValueError("fastreduce: %s is not contiguous (call "
                             ".contiguous() first)" % what)
        own = dtype_of(obj.dtype)
        d = _override(own, dtype, obj.element_size(), what)
        n = obj.numel() * obj.element_size() // ITEMSIZE[d]
        return View(obj, obj.data_ptr(), n, d, False)
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        if ai.get("strides") is not None and not _c_contiguous(obj):
            raise ValueError("fastreduce: %s is not C-contiguous (use "
                             "numpy.ascontiguousarray)" % what)
        typestr = ai["typestr"]
        if typestr[0] == ">":
            raise ValueError("fastreduce: %s is big-endian" % what)
        own = _BY_TYPESTR.get(typestr[1:])
        size = int(typestr[2:])
        if own is None and dtype is None:
            raise ValueError("fastreduce: %s has element type %r; pass dtype="
                             % (what, typestr))
        d = _override(own, dtype, size, what)
        count = 1
        for s in ai["shape"]:
            count *= s
        ptr, readonly = ai["data"]
        return View(obj, ptr, count * size // ITEMSIZE[d], d, bool(readonly))
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError("fastreduce: %s must be a numpy array, a CPU torch "
                        "tensor or a writable buffer, not %s"
                        % (what, type(obj).__name__)) from None
    if not mv.c_contiguous:
        raise ValueError("fastreduce: %s is not contiguous" % what)
    if mv.readonly:
        raise ValueError("fastreduce: %s is read-only (bytes?); pass a "
                         "bytearray, array.array or numpy array" % what)
    own = _BY_FORMAT.get(mv.format.lstrip("@=<"))
    if own is None and dtype is None:
        raise ValueError("fastreduce: %s has format %r; pass dtype="
                         % (what, mv.format))
    d = _override(own, dtype, mv.itemsize, what, raw=mv.format in ("B", "c"))
    raw = mv.cast("B")
    if raw.nbytes % ITEMSIZE[d]:
        raise ValueError("fastreduce: %s has %d bytes, not a whole number of "
                         "%s elements" % (what, raw.nbytes, d.name.lower()))
    ptr = ctypes.addressof(ctypes.c_char.from_buffer(raw)) if raw.nbytes else 0
    return View(obj, ptr, raw.nbytes // ITEMSIZE[d], d, False, keep=raw)


def _override(own, dtype, itemsize, what, raw=False):
    if dtype is None:
        return own
    d = dtype_of(dtype)
    if ITEMSIZE[d] != itemsize and not raw:
        # Only raw bytes (bytearray) may be read as wider elements; for a
        # typed array that would silently change the element count.
        raise ValueError("fastreduce: %s holds %d-byte elements; dtype=%s "
                         "needs %d" % (what, itemsize, d.name.lower(), ITEMSIZE[d]))
    return d


def _c_contiguous(obj):
    flags = getattr(obj, "flags", None)
    if flags is not None:
        return bool(flags["C_CONTIGUOUS"])
    return memoryview(obj).c_contiguous


def empty_like(obj, count, dtype):
    """A new 1-D array or tensor of count elements, of obj's kind."""
    if _is_torch(obj):
        import torch

        return torch.empty(count, dtype=obj.dtype)
    if hasattr(obj, "__array_interface__"):
        import numpy

        return numpy.empty(count, dtype=obj.dtype)
    return bytearray(count * ITEMSIZE[dtype])


def block(obj, start, count):
    """Elements [start, start+count) of obj flattened, as a view."""
    if _is_torch(obj) or hasattr(obj, "__array_interface__"):
        return obj.reshape(-1)[start:start + count]
    raise TypeError("fastreduce: in-place reduce-scatter needs a numpy "
                    "array or a torch tensor (pass recv=)")
