"""Programmatic dependent launch (Hopper, sm_90+): a kernel launched with the
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION attribute may start while the previous
kernel of the stream is still running, once that kernel's blocks have all executed
``griddepcontrol.launch_dependents``; it waits at ``griddepcontrol.wait`` (common.cuh
``pdl_start``, which triggers its own dependents first) until the previous grid has completed
and its writes are visible. In a captured
graph this becomes a programmatic edge: the launch latency of the next kernel hides behind the
tail of the previous one.

CuPy's RawKernel launches through cuLaunchKernel, which takes no attributes, so this module calls
the driver's cuLaunchKernelEx through ctypes with the CuPy function's handle. Only kernels that
call ``pdl_start`` before reading anything may be launched this way (CudaBackend passes
``pdl=True`` for exactly those). No CuPy import here.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID (cuda.h)


class _Attr(ctypes.Structure):  # CUlaunchAttribute: id, pad to 8, a 64-byte union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint64 * 8)]


class _Config(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("gx", ctypes.c_uint), ("gy", ctypes.c_uint), ("gz", ctypes.c_uint),
        ("bx", ctypes.c_uint), ("by", ctypes.c_uint), ("bz", ctypes.c_uint),
        ("smem", ctypes.c_uint), ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_Attr)), ("nattrs", ctypes.c_uint),
    ]  # fmt: skip


_SCALARS = {
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.float32): ctypes.c_float,
}


def kernel_params(args: tuple) -> tuple[Any, list]:
    """(void** array, the ctypes values it points to, kept alive by the caller) for a launch's
    arguments: device arrays (anything with .data.ptr) as pointers, NumPy scalars by value with
    their own width, as CuPy passes them."""
    vals: list = []
    for a in args:
        if hasattr(a, "data") and hasattr(a.data, "ptr"):
            vals.append(ctypes.c_void_p(int(a.data.ptr)))
        elif isinstance(a, np.generic) and a.dtype in _SCALARS:
            vals.append(_SCALARS[a.dtype](a.item()))
        else:
            raise TypeError(f"pdl launch: argument of type {type(a).__name__} ({a!r})")
    ptrs = (ctypes.c_void_p * max(1, len(vals)))(
        *(ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in vals)
    )
    return ptrs, vals


class Launcher:
    """cuLaunchKernelEx with programmatic stream serialization, from libcuda through ctypes."""

    def __init__(self, lib: str = "libcuda.so.1") -> None:
        self._cuda = ctypes.CDLL(lib)
        self._ex = self._cuda.cuLaunchKernelEx
        self._ex.restype = ctypes.c_int
        self._ex.argtypes = [
            ctypes.POINTER(_Config),
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_void_p,
        ]
        self._attr = (_Attr * 1)()
        self._attr[0].id = _PROGRAMMATIC_STREAM_SERIALIZATION
        self._attr[0].value[0] = 1  # programmaticStreamSerializationAllowed (an int)

    def launch(
        self, func_ptr: int, grid: tuple, block: tuple, args: tuple, smem: int, stream_ptr: int
    ) -> None:
        g = tuple(max(1, int(v)) for v in (*grid, 1, 1)[:3])
        b = tuple(max(1, int(v)) for v in (*block, 1, 1)[:3])
        cfg = _Config(*g, *b, smem, ctypes.c_void_p(stream_ptr), self._attr, 1)
        params, keep = kernel_params(args)
        rc = self._ex(ctypes.byref(cfg), ctypes.c_void_p(func_ptr), params, None)
        del keep  # the driver copied the values at launch (and into the graph node)
        if rc != 0:
            raise RuntimeError(f"cuLaunchKernelEx failed: CUresult {rc}")
