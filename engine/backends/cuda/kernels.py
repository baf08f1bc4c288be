"""Compiling shaders/cuda/*.cu with NVRTC (through cupy.RawModule) and caching the modules.

A module is one .cu file compiled with one set of -D defines (its tunables). The in-process
cache key is (device compute capability, file, source hash, defines); CuPy's on-disk cache sits
underneath, keyed by source, options, architecture and NVRTC version, so a second process on the
same machine loads the cubin without compiling. ``#include "x.cuh"`` lines are inlined here, so
NVRTC needs no include path (and no CUDA headers: common.cuh uses PTX for fp16).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from engine.backends.planted import define
from engine.errors import KernelCompileError

SHADERS = Path(__file__).resolve().parents[3] / "shaders" / "cuda"
_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)

_MODULES: dict[tuple, Any] = {}


def source(name: str) -> str:
    """The text of shaders/cuda/<name> with its local includes inlined (each once)."""
    seen: set[str] = set()

    def expand(fname: str) -> str:
        if fname in seen:
            return ""
        seen.add(fname)
        text = (SHADERS / fname).read_text()
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text).replace("#pragma once", "")

    return expand(name)


def module(cp: Any, cc: int, fname: str, defines: dict[str, int] | None = None) -> Any:
    """A loaded cupy.RawModule of fname with defines; KernelCompileError (with the NVRTC log)
    when it does not compile. Compiling happens here, not at first launch: RawModule is lazy,
    so one kernel is fetched to force it."""
    defines = dict(defines or {})
    planted = define()  # test-only: the mutation suite's planted bug, None in production
    if planted:
        defines[planted] = 1
    defines = dict(sorted(defines.items()))
    src = source(fname)
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]
    key = (cc, fname, digest, tuple(defines.items()))
    mod = _MODULES.get(key)
    if mod is not None:
        return mod
    options = ("-std=c++17", *(f"-D{k}={v}" for k, v in defines.items()))
    first = _first_kernel(src)
    try:
        mod = cp.RawModule(code=src, options=options)
        mod.get_function(first)
    except cp.cuda.compiler.CompileException as e:
        raise KernelCompileError(
            f"shaders/cuda/{fname} with {defines or 'no defines'} failed to compile for "
            f"sm_{cc}:\n{e.get_message() if hasattr(e, 'get_message') else e}"
        ) from None
    _MODULES[key] = mod
    return mod


def _first_kernel(src: str) -> str:
    names = kernel_names(src)
    if not names:
        raise KernelCompileError('no extern "C" kernel found in the source')
    return names[0]


def kernel_names(src: str) -> list[str]:
    """Kernel names a source defines, including those made by its *_KERNEL(S) macros."""
    out = [
        n
        for n in re.findall(
            r'extern\s+"C"\s+__global__\s+void\s+'
            r"(?:__launch_bounds__\((?:[^()]|\([^()]*\))*\)\s*)?(\w+)\s*\(",
            src,
        )
        if n != "__launch_bounds__"
    ]
    macros = {
        "DMMV_KERNEL": ["dmmv_{}"],
        "MMQ_KERNEL": ["mmq_{}"],
        "MMQ8_KERNEL": ["mmq8_{}"],
        "MMVQ_KERNEL": ["mmvq_{}"],
        "DEQ_KERNELS": ["get_rows_{}", "dequant_f16_{}"],
    }
    for mac, pats in macros.items():
        for arg in re.findall(rf"^{mac}\((\w+),", src, re.M):
            out += [p.format(arg) for p in pats]
    return out


def clear_cache() -> None:
    _MODULES.clear()
