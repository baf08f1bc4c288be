"""A CudaBackend without a GPU, for host-side tests: every op runs its real host code (shapes,
dispatch, knob reading, grid and block sizes) and each kernel launch is checked against the
kernel's signature in shaders/cuda (name, argument count, each argument's C type against the
NumPy scalar or array dtype passed), then recorded instead of run. Outputs are zeros.

What a wrong launch does on a GPU (a float passed as a long long, an int32 array as float*, a
missing argument) is garbage or a fault in a test that costs device time; here it is an
assertion on a CPU."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from engine.backends.base import Backend, DeviceInfo
from engine.backends.cuda import kernels
from engine.backends.cuda.backend import CudaBackend

_PLAIN = re.compile(
    r'extern\s+"C"\s+__global__\s+void\s+'
    r"(?:(?:__launch_bounds__|__cluster_dims__|__maxnreg__)\((?:[^()]|\([^()]*\))*\)\s*)*"
    r"(\w+)\s*\(([^)]*)\)"
)
_MACRO = re.compile(r"^#define\s+(\w+)\(\s*name\b[^)]*\)((?:[^\n]*\\\n)*[^\n]*)", re.M)

POINTER_DTYPES = {
    "float": np.float32,
    "double": np.float64,
    "float2": np.float32,  # vector loads of float32 arrays
    "float4": np.float32,
    "int": np.int32,
    "u8": np.uint8,
    "u16": np.uint16,
    "s8": np.int8,
    "signed char": np.int8,
    "char": np.int8,
    "int8_t": np.int8,
    "unsigned int": np.uint32,  # ticket counters
    "unsigned": np.uint32,
}
SCALAR_DTYPES = {
    "int": np.int32,
    "long long": np.int64,
    "float": np.float32,
    "unsigned": np.uint32,
    "unsigned int": np.uint32,
    "u32": np.uint32,
}


@dataclass(frozen=True)
class Param:
    ctype: str  # base type without const / __restrict__
    pointer: bool


def _params(text: str) -> tuple[Param, ...]:
    out = []
    for p in text.replace("\\\n", " ").split(","):
        p = re.sub(r"\b(const|__restrict__)\b", " ", p).strip()
        if not p:
            continue
        pointer = "*" in p
        ctype = " ".join(p.replace("*", " ").split()[:-1])
        out.append(Param(ctype, pointer))
    return tuple(out)


@cache
def signatures(fname: str) -> dict[str, tuple[Param, ...]]:
    """kernel name -> parameters, for every kernel of shaders/cuda/<fname> (includes inlined),
    those its *_KERNEL(S) macros make included."""
    src = kernels.source(fname)
    sigs = {m.group(1): _params(m.group(2)) for m in _PLAIN.finditer(src)}
    sigs.pop("__launch_bounds__", None)
    for macro, body in _MACRO.findall(src):
        made = re.findall(r"(\w+)##name\s*\(([^)]*)\)", body)
        for arg in re.findall(rf"^{macro}\((\w+),", src, re.M):
            for prefix, params in made:
                sigs[prefix + arg] = _params(params)
    return sigs


def check_args(name: str, sig: tuple[Param, ...], args: tuple) -> None:
    assert len(args) == len(sig), f"{name}: {len(args)} arguments for {len(sig)} parameters"
    for i, (p, a) in enumerate(zip(sig, args, strict=True)):
        where = f"{name} argument {i} ({p.ctype}{'*' if p.pointer else ''})"
        if p.pointer:
            if isinstance(a, np.uint64):  # a raw device pointer (the graph's position, or null)
                continue
            assert isinstance(a, np.ndarray), f"{where}: got {type(a).__name__}"
            want = POINTER_DTYPES[p.ctype]
            assert a.dtype == want, f"{where}: array of {a.dtype}, kernel reads {np.dtype(want)}"
            assert a.flags.c_contiguous, f"{where}: a strided view"
        else:
            want = SCALAR_DTYPES[p.ctype]
            got = f"{type(a).__name__} {getattr(a, 'dtype', '')}"
            assert isinstance(a, np.generic) and a.dtype == want, f"{where}: got {got}"


class _Ptr:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class DevArray(np.ndarray):
    """A NumPy array with CuPy's ``.data.ptr`` (the backend compares addresses)."""

    @property
    def data(self) -> _Ptr:  # type: ignore[override]
        return _Ptr(self.ctypes.data)

    def get(self) -> np.ndarray:
        """CuPy's copy to the host."""
        return np.array(self, copy=True)


def _dev(a: np.ndarray) -> DevArray:
    return a.view(DevArray)


class _NpCupy:
    """The few CuPy calls the backend's host code (and tests/cuda_decode_cases.py) makes, on
    NumPy (allocations are zeros)."""

    @staticmethod
    def ascontiguousarray(a: Any, dtype: Any = None) -> DevArray:
        return _dev(np.ascontiguousarray(a, dtype=dtype))

    @staticmethod
    def asarray(a: Any, dtype: Any = None) -> DevArray:
        return _dev(np.asarray(a, dtype=dtype))

    @staticmethod
    def zeros(shape: Any, dtype: Any = np.float32) -> DevArray:
        return _dev(np.zeros(shape, dtype))

    empty = zeros

    @staticmethod
    def full(shape: Any, value: Any, dtype: Any = np.float32) -> DevArray:
        return _dev(np.full(shape, value, dtype))

    float64 = np.float64
    abs = staticmethod(np.abs)

    @staticmethod
    def stack(arrays: Any) -> DevArray:
        return _dev(np.stack(arrays))

    @staticmethod
    def concatenate(arrays: Any) -> DevArray:
        return _dev(np.concatenate(arrays))


def _row_stats(c: np.ndarray, r: np.ndarray, out: np.ndarray, n: Any, w: Any) -> None:
    """elementwise.cu's row_stats_f32 / _f16 on the host (the verifier reads its numbers)."""
    from engine.backends.base import host_row_stats

    rows = c.view(np.float16) if c.dtype == np.uint16 else c
    out[...] = host_row_stats(np.asarray(rows).reshape(int(n), int(w)), np.asarray(r))


# Kernels whose output the host code reads back, run here on NumPy instead of left zero.
_ON_HOST = {"row_stats_f32": _row_stats, "row_stats_f16": _row_stats}


@dataclass
class Launch:
    module: str
    fname: str
    kernel: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    args: tuple
    defines: dict[str, int]
    smem: int = 0  # dynamic shared memory bytes


class FakeCuda(CudaBackend):
    """CudaBackend's host code on NumPy; ``launches`` records every checked launch."""

    def __init__(self, config: Any = None) -> None:
        self._cp = _NpCupy
        self._stream = None
        self._pos_dev = np.zeros(1, np.int32)
        self._graph = None
        self.use_graphs = False
        self._capturing = False
        self.profile = None
        self._events = []
        self._k = {}
        self._q8 = []
        self._f16 = []
        self._groups = {}
        self.gemms: list[tuple] = []
        self._alpha = np.ones(1, np.float32)
        self._beta = np.zeros(1, np.float32)
        self._cc = 90
        self._norm_ticket = _dev(np.zeros(1, np.uint32))
        self._rope_tickets = _dev(np.zeros(1024, np.uint32))
        self._tickets = _dev(np.zeros(64, np.uint32))
        self._head_tickets = _dev(np.zeros(64, np.uint32))
        self.launches: list[Launch] = []
        Backend.__init__(self, config)
        self.set_config(self.config)

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(
            backend="cuda",
            name="fake H200",
            vendor="nvidia",
            device_class="fake",
            driver="none",
            memory_bytes=1 << 37,
            subgroup_size=32,
            extra={"cc": 90, "sms": 132, "smem_per_block": 49152,
                   "smem_per_block_optin": 232448, "smem_per_sm": 233472, "l2_bytes": 1 << 26},
        )  # fmt: skip

    def set_config(self, config: Any) -> None:
        config.check(self.device_info())
        self._mods = kernels.modules_for(config)
        self.config = config

    def upload(self, a: np.ndarray) -> DevArray:
        return _dev(np.array(a, copy=True, order="C"))

    def download(self, t: Any) -> np.ndarray:
        return np.array(t, copy=True)

    def synchronize(self) -> None:
        pass

    def _aligned16(self, x: Any) -> Any:
        return x

    def _launch(
        self,
        mod: str,
        name: str,
        grid: tuple,
        block: tuple,
        args: tuple,
        smem: int = 0,
        pdl: bool = False,  # how CudaBackend would launch it; the checks are the same
    ) -> None:
        assert mod in self._mods, f"launch from module {mod!r}, which the config does not build"
        fname, defines = self._mods[mod]
        sigs = signatures(fname)
        assert name in sigs, f"{fname} has no kernel {name!r}"
        check_args(name, sigs[name], tuple(args))
        grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
        block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
        assert all(g >= 1 for g in grid) and grid[0] < 2**31 and max(grid[1:]) <= 65535, grid
        assert all(b >= 1 for b in block) and math.prod(block) <= 1024, block
        assert smem <= self.device_info().extra["smem_per_block_optin"], smem
        self.launches.append(Launch(mod, fname, name, grid, block, tuple(args), defines, smem))
        if name in _ON_HOST:
            _ON_HOST[name](*args)

    def _gemm(self, *args: Any, **kw: Any) -> None:
        """cuBLAS calls are recorded (shapes, strides, operands), not run."""
        self.gemms.append((args, kw))

    def kernels_run(self) -> set[str]:
        return {launch.kernel for launch in self.launches}


def decode_step(path: Any, flat: dict, prompt: list[int]) -> tuple[list[Launch], Any]:
    """(the launches of one decode token after prompt's prefill, the model): the GGUF at path
    on a FakeCuda under the flat config."""
    from engine.gguf_model import open_model
    from engine.models import build_model
    from engine.tuning import TuningConfig

    be = FakeCuda(TuningConfig.from_flat("cuda", flat))
    m = build_model(open_model(path), be)
    cache = m.new_cache(len(prompt) + 2)
    m.prefill(prompt, cache)
    be.launches.clear()
    m.forward(be.upload(np.array([1], np.int32)), 1, len(prompt), cache)
    return list(be.launches), m


def fused_rope_launches(
    launches: list[Launch], m: Any, kernel: str, knew: int, neox: int, vnew: int | None = None
) -> list[Launch]:
    """The decode step's launches of an attention kernel with RoPE and the KV write fused in,
    checked: one a layer, no rope / rope_kv / kv_write launch, the k (and v) projections passed
    at args[knew] (args[vnew]) as arrays, not null pointers, the neox flag at args[neox]."""
    count = Counter(launch.kernel for launch in launches)
    assert count[kernel] == m.spec.n_layers
    assert count["rope_kv"] == count["rope"] == count["kv_write"] == 0
    ours = [launch for launch in launches if launch.kernel == kernel]
    for i in (knew,) if vnew is None else (knew, vnew):
        assert all(not isinstance(t.args[i], np.uint64) for t in ours)
    assert all(int(t.args[neox]) == int(m.spec.rope_neox) for t in ours)
    return ours


def assert_attention_fusion_bypassed(fused: dict, unfused: dict) -> None:
    """The hook-bypass report names attention_decode under the fused flat config only."""
    from engine.tuning import TuningConfig

    be = FakeCuda(TuningConfig.from_flat("cuda", fused))
    assert "attention_decode" in be.hook_bypassed_fusions(be.config)
    off = TuningConfig.from_flat("cuda", unfused)
    assert "attention_decode" not in be.hook_bypassed_fusions(off)


def assert_attention_falls_back_to_split(flat: dict, D: int) -> None:
    """A decode attention of head dim D that flat's variant cannot take (4 heads over 2 KV
    heads, position 5) runs attn_split and attn_combine instead."""
    from engine.tuning import TuningConfig

    be = FakeCuda(TuningConfig.from_flat("cuda", flat))
    q = be.upload(np.zeros((1, 4, D), np.float32))
    cache = be.new_kv_cache(1, 8, 2, D)
    be.launches.clear()
    be.ops.attention(q, cache, 0, 5)
    assert [launch.kernel for launch in be.launches] == ["attn_split", "attn_combine"]
