"""The NumPy reference backend: the specification every other backend is tested against.

Written plainly. Small ops accumulate in float64 and return float32; matmul is float32 BLAS over
weights dequantized by gguf.quants (cached once per weight with the ``cached_f32`` variant).
Shapes as in engine.backends.base: T tokens, C width, H/Hkv heads, D head dim, S cache slots.
"""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.base import Backend, DeviceEntry, DeviceInfo, KVCache, host_scratch
from engine.backends.numpy_hybrid import NumpyHybridOps
from engine.backends.numpy_weight import NumpyWeight
from engine.gguf_model import QTensor

if TYPE_CHECKING:
    from engine.tuning import TuningConfig


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


class NumpyBackend(NumpyHybridOps, Backend):
    name = "numpy"

    def __init__(self, config: TuningConfig | None = None, *, device: int | None = None) -> None:
        self._check_index(self.name, device, 1)  # one device: the host
        super().__init__(config)

    @classmethod
    def list_devices(cls) -> list[DeviceEntry]:
        info = cls.device_info(cls.__new__(cls))  # reads nothing of an instance
        return [
            DeviceEntry(
                info.backend, 0, info.name, info.device_class, "cpu", info.driver,
                info.memory_bytes,
            )
        ]  # fmt: skip

    def device_info(self) -> DeviceInfo:
        return DeviceInfo(
            backend="numpy",
            name=_cpu_name(),
            vendor="cpu",
            device_class="cpu",
            driver=f"numpy {np.__version__}",
            memory_bytes=_host_memory(),
            extra={"cores": os.cpu_count() or 1},
        )

    def upload(self, a: np.ndarray) -> np.ndarray:
        return np.array(a, copy=True)

    def download(self, t: np.ndarray) -> np.ndarray:
        return np.array(t, copy=True)

    def load_weight(self, qt: QTensor) -> NumpyWeight:
        w = NumpyWeight(qt)
        if len(qt.shape) == 1:  # norms and biases: always dense
            w.f32 = qt.dequantize()
        return self._track_weight(w)

    def _weight_nbytes(self, w: NumpyWeight) -> int:
        """The quantized blocks (a view of the file's memory map) plus any dense copy."""
        return int(w.qt.raw.nbytes) + (int(w.f32.nbytes) if w.f32 is not None else 0)

    def release_unused(self) -> None:
        """Drop the float32 copies of matrices (the conv kernel's stays: ssm_conv always reads
        it); the next run remakes those its config's cached_f32 variants keep."""
        for w in self._tracked("_live_weights"):
            if len(w.qt.shape) > 1 and "ssm_conv1d" not in w.qt.name:
                w.f32 = None

    # --- ops ----------------------------------------------------------------------------
    def _embedding(self, table: NumpyWeight, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        if table.f32 is not None:
            return table.f32[ids].copy()
        return table.qt.dequantize_rows(ids)  # [T, C]

    def _rms_norm(self, x: np.ndarray, w: NumpyWeight, eps: float) -> np.ndarray:
        x64 = x.astype(np.float64)
        scale = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
        return (x64 * scale * w.f32).astype(np.float32)

    def _matmul(self, x: np.ndarray, w: NumpyWeight) -> np.ndarray:
        op = "matmul_decode" if x.shape[0] == 1 else "matmul_prefill"
        cache = self.config.op(op).variant == "cached_f32"
        return x.astype(np.float32) @ w.dense(cache).T  # [T, K] @ [K, N] -> [T, N]

    def _add(self, a: np.ndarray, b: np.ndarray | NumpyWeight) -> np.ndarray:
        b = b.f32 if isinstance(b, NumpyWeight) else b
        return (a.astype(np.float64) + b).astype(np.float32)

    def _rope(self, x: np.ndarray, pos0: int, theta: float, neox: bool) -> np.ndarray:
        T, _, D = x.shape
        pos = np.arange(pos0, pos0 + T, dtype=np.float64)[:, None]  # [T, 1]
        inv_freq = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)  # [D/2]
        ang = (pos * inv_freq)[:, None, :]  # [T, 1, D/2]
        cos, sin = np.cos(ang), np.sin(ang)
        x64 = x.astype(np.float64)
        if neox:
            x1, x2 = x64[..., : D // 2], x64[..., D // 2 :]
            out = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        else:
            x1, x2 = x64[..., 0::2], x64[..., 1::2]
            out = self.scratch(x64.shape, x64.dtype)
            out[..., 0::2] = x1 * cos - x2 * sin
            out[..., 1::2] = x2 * cos + x1 * sin
        return out.astype(np.float32)

    def _kv_write(
        self, cache: KVCache, layer: int, k: np.ndarray, v: np.ndarray, pos0: int
    ) -> None:
        T = k.shape[0]
        cache.check_room(pos0, T)
        cache.k[layer][pos0 : pos0 + T] = k
        cache.v[layer][pos0 : pos0 + T] = v

    def _attention(self, q: np.ndarray, cache: KVCache, layer: int, pos0: int) -> np.ndarray:
        T, H, D = q.shape
        L = pos0 + T  # keys visible to the last query
        k = cache.k[layer][:L].astype(np.float64)  # [L, Hkv, D]
        v = cache.v[layer][:L].astype(np.float64)
        group = H // k.shape[1]
        k = np.repeat(k, group, axis=1)  # [L, H, D]: query head h reads kv head h // group
        v = np.repeat(v, group, axis=1)
        scores = np.einsum("thd,lhd->htl", q.astype(np.float64), k) / np.sqrt(D)  # [H, T, L]
        visible = np.arange(L)[None, :] <= (pos0 + np.arange(T))[:, None]  # [T, L] causal
        scores = np.where(visible[None], scores, -np.inf)
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        return np.einsum("htl,lhd->thd", p, v).astype(np.float32)  # [T, H, D]

    def _swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        g = gate.astype(np.float64)
        return (g / (1.0 + np.exp(-g)) * up).astype(np.float32)

    def scratch(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """An output or scratch array a kernel fills: poisoned under validate (Backend.poison)."""
        return host_scratch(shape, dtype, self.poison)

    def _argmax(self, logits: np.ndarray) -> np.ndarray:
        return np.argmax(logits, axis=-1).astype(np.int32)  # first maximum, like the GPU kernels


def _host_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 0
