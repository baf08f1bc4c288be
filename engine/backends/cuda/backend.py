"""The CUDA backend: CuPy arrays for activations, raw GGML blocks on the GPU for weights, and
NVRTC-compiled kernels from shaders/cuda (engine/backends/cuda/kernels.py).

Shapes as in engine.backends.base: T tokens, C width, N/K weight rows/row length, H/Hkv heads,
D head dim, V vocabulary, S cache slots. Activations are float32; the KV cache is float32.

All work goes to one non-blocking stream shared by every CudaBackend of the process, so the
order of ops is the order of calls. The decode step is captured once per KV cache as a CUDA
graph (``decode_step``) and replayed: kernels that need the position read it from a device
int32 that a one-thread kernel sets before each replay, so Python is out of the token loop.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.base import (
    Backend,
    DeviceEntry,
    DeviceInfo,
    KVCache,
    ProfileReport,
    row_stats_of,
)
from engine.backends.cuda import kernels
from engine.backends.cuda.attn_tile import launch_attn_tile, tile_fits
from engine.backends.cuda.attn_vec import launch_attn_vec, rope_fits, vec_fits
from engine.backends.cuda.decode_float import CudaFloatDecodeOps
from engine.backends.cuda.device import device_class, driver_string
from engine.backends.cuda.hybrid import CudaHybridOps
from engine.backends.cuda.prefill import (
    _COMPUTE_32F,
    _GEMM_DEFAULT,
    _OP_N,
    _OP_T,
    _R_16F,
    _R_32F,
    CudaPrefillOps,
)
from engine.errors import BackendUnavailable, EngineError, UnsupportedError
from engine.tuning.variants.cuda import ALL_TYPES, CUDA_BLOCK_TYPES

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.gguf_model import QTensor
    from engine.tuning import TuningConfig

_cp: Any = None
_STREAMS: dict[int, Any] = {}  # device index -> the one stream every backend on it shares

# cuBLAS / CUDA data-type constants: engine/backends/cuda/prefill.py

Q6K_PADDED = 224  # bytes of a Q6_K block on the GPU (210 + 14 zero bytes; common.cuh)

# GGML type ids, as mmvw.cu's switch reads them (common.cuh QT_*)
_QT = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
_NULL = np.uint64(0)
_MAX_ARGMAX_ROWS = 4096  # rows argmax.multi takes in one launch (more: argmax.block's kernel)
_WIDE = {"Q4_K": "q4k_wide", "Q6_K": "q6k_wide"}  # a type's 64-weight slot knob (no x planes)
_MAX_ROPE_HEADS = 1024  # q + k heads mmvw_qkv counts (tickets); more: mmvw, then rope_kv


def _import_cupy() -> Any:
    """CuPy and a usable GPU, or BackendUnavailable saying which is missing."""
    global _cp
    if _cp is not None:
        return _cp
    try:
        import cupy as cp
    except ImportError as e:
        raise BackendUnavailable(
            f"CuPy is not installed ({e}); install cupy-cuda12x or cupy-cuda13x "
            "(pip install -e '.[cuda]') on a machine with an NVIDIA GPU"
        ) from None
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - no driver, no device: all mean "not here"
        raise BackendUnavailable(f"CuPy found no usable CUDA driver or GPU: {e}") from None
    if n < 1:
        raise BackendUnavailable("CuPy found no CUDA GPU on this machine")
    _cp = cp
    return cp


def _stream(cp: Any, index: int) -> Any:
    if index not in _STREAMS:
        with cp.cuda.Device(index):
            _STREAMS[index] = cp.cuda.Stream(non_blocking=True)
    return _STREAMS[index]


def _name(props: dict) -> str:
    n = props["name"]
    return n.decode() if isinstance(n, bytes) else str(n)


def _driver(cp: Any) -> str:
    try:
        nvrtc = cp.cuda.nvrtc.getVersion()
    except Exception:  # noqa: BLE001
        nvrtc = (0, 0)
    return driver_string(
        cp.cuda.runtime.driverGetVersion(),
        cp.cuda.runtime.runtimeGetVersion(),
        cp.__version__,
        tuple(nvrtc),
    )


MIN_CC = 80  # mmq, cp.async and bf16 need Ampere


@dataclass
class CudaWeight:
    """A weight on the GPU: raw blocks [N, row_bytes] (2-D) or dense float32 (1-D)."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    raw: Any = None  # cupy uint8 [N, row_bytes]
    f32: Any = None  # cupy float32 [N] for norms and biases
    f16: Any = None  # cupy uint16 [N, K]: matmul_prefill.resident's copy, made at first use

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def row_bytes(self) -> int:
        return int(self.raw.shape[1])

    @property
    def nbytes(self) -> int:
        held = int((self.raw if self.raw is not None else self.f32).nbytes)
        return held + (int(self.f16.nbytes) if self.f16 is not None else 0)


@dataclass
class _PendingQ:
    """attn_in's q under attention_decode.gqa's fuse_rope: the decode row's q [1, H, D], k and
    v [1, Hkv * D] as the projections left them (biases added), RoPE and the KV write not yet
    done; only attention() of the same cache, layer and position takes it (attn_gqa does both)."""

    q: Any
    k: Any
    v: Any
    cache: KVCache
    layer: int
    pos0: int
    theta: float
    neox: bool


@dataclass
class _Graph:
    cache: weakref.ref
    config: TuningConfig
    graph: Any
    tok_in: Any
    logits: Any
    tok_out: Any
    keep: list = field(default_factory=list)  # every allocation made during capture


class CudaBackend(CudaHybridOps, CudaPrefillOps, CudaFloatDecodeOps, Backend):  # mixins
    name = "cuda"

    def __init__(self, config: TuningConfig | None = None, *, device: int | None = None) -> None:
        """``device``: the CUDA device ordinal to open (None: 0); it becomes this thread's
        current device."""
        cp = _import_cupy()
        self._cp = cp
        self._index = self._check_index(self.name, device, cp.cuda.runtime.getDeviceCount())
        cp.cuda.Device(self._index).use()
        self._stream = _stream(cp, self._index)
        self._stream.use()
        self._closed = False
        props = cp.cuda.runtime.getDeviceProperties(self._index)
        self._props = props
        self._cc = int(props["major"]) * 10 + int(props["minor"])
        if self._cc < MIN_CC:
            raise BackendUnavailable(
                f"GPU {props['name']!r} has compute capability {self._cc / 10:.1f}; the CUDA "
                "backend needs 8.0 (Ampere) or newer"
            )
        self._pos_dev = cp.zeros(1, np.int32)
        self._graph: _Graph | None = None
        self.use_graphs = True
        self._capturing = False
        self._profiling = False  # an event pair around every launch (set_profiling)
        self._prof: dict[str, list[float]] = {}  # kernel name -> [calls, total ms]
        self._events: list[tuple[str, Any, Any]] = []
        self._k: dict[str, Any] = {}
        self._fns: dict[tuple[str, str], Any] = {}  # (module key, kernel) -> RawKernel of _k
        self._pdl: Any = None  # pdl.Launcher while the config asks for it
        self._pdl_lib: Any = None
        # Q8_1 forms of recent float activations: (x, xq, xds), newest last. Holding x keeps
        # its memory from being reused, so "entry[0] is x" means the quantized form is current.
        self._q8: list[tuple[Any, Any, Any]] = []
        # fp16 forms of recent float activations (x, xh), newest last, under
        # matmul_prefill.resident: q, k and v (gate and up) read one conversion; held as _q8's.
        self._f16: list[tuple[Any, Any]] = []
        # id(first weight) -> (one fp16 buffer holding the copies of weights read by one GEMM
        # (q, k, v; gate, up), those weights): matmul_prefill.resident, prefill.py
        self._groups: dict[int, tuple[Any, tuple[CudaWeight, ...]]] = {}
        # argmax.multi's per-row tickets: zero between launches (the last block resets its row)
        self._tickets = cp.zeros(_MAX_ARGMAX_ROWS, np.uint32)
        self._head_tickets = cp.zeros(_MAX_ARGMAX_ROWS, np.uint32)  # attn_split_kw's combine
        self._norm_ticket = cp.zeros(1, np.uint32)  # mmvw_norm's last-block ticket
        self._rope_tickets = cp.zeros(_MAX_ROPE_HEADS, np.uint32)  # mmvw_qkv's, one per head
        self._alpha = np.ones(1, np.float32)
        self._beta = np.zeros(1, np.float32)
        super().__init__(config)
        self.set_config(self.config)

    # --- device and memory -------------------------------------------------------------
    @classmethod
    def list_devices(cls) -> list[DeviceEntry]:
        """The CUDA devices (ordinals as CUDA_VISIBLE_DEVICES leaves them) of compute
        capability 8.0 or newer."""
        cp = _import_cupy()
        out = []
        for i in range(cp.cuda.runtime.getDeviceCount()):
            p = cp.cuda.runtime.getDeviceProperties(i)
            if int(p["major"]) * 10 + int(p["minor"]) < MIN_CC:
                continue
            name = _name(p)
            out.append(
                DeviceEntry(
                    "cuda", i, name, device_class(name), "discrete", _driver(cp),
                    int(p["totalGlobalMem"]),
                )
            )  # fmt: skip
        return out

    def device_info(self) -> DeviceInfo:
        p = self._props
        name = _name(p)
        return DeviceInfo(
            backend="cuda",
            name=name,
            vendor="nvidia",
            device_class=device_class(name),
            driver=_driver(self._cp),
            memory_bytes=int(p["totalGlobalMem"]),
            subgroup_size=int(p.get("warpSize", 32)),
            extra={
                "cc": self._cc,
                "sms": int(p["multiProcessorCount"]),
                "smem_per_block": int(p["sharedMemPerBlock"]),
                "smem_per_block_optin": int(p.get("sharedMemPerBlockOptin", 0)),
                "smem_per_sm": int(p.get("sharedMemPerMultiprocessor", 0)),
                "l2_bytes": int(p.get("l2CacheSize", 0)),
                "pci_bus_id": int(p.get("pciBusID", 0)),
                "index": self._index,
            },
        )

    def upload(self, a: np.ndarray) -> Any:
        return self._cp.asarray(np.ascontiguousarray(a))

    def download(self, t: Any) -> np.ndarray:
        try:
            out = t.get(stream=self._stream)
            self._stream.synchronize()
        except self._faults() as e:
            raise EngineError(
                f"CUDA kernel fault ({e}); the GPU context is unusable, restart the worker"
            ) from None
        return out

    def _faults(self) -> tuple[type, ...]:
        cp = self._cp
        return (cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError)

    def synchronize(self) -> None:
        try:
            self._stream.synchronize()
        except self._faults() as e:
            raise EngineError(
                f"CUDA kernel fault ({e}); the GPU context is unusable, restart the worker"
            ) from None
        self._collect_profile()

    def load_weight(self, qt: QTensor) -> CudaWeight:
        return self.track_weight(self._load_weight(qt))

    def _load_weight(self, qt: QTensor) -> CudaWeight:
        if qt.qtype not in ALL_TYPES:
            raise UnsupportedError(
                f"cuda backend: tensor {qt.name!r} has quant type {qt.qtype}, which has no CUDA "
                f"kernel; supported: {sorted(ALL_TYPES)}"
            )
        if len(qt.shape) == 1:
            return CudaWeight(qt.name, qt.qtype, qt.shape, f32=self.upload(qt.dequantize()))
        if qt.qtype in CUDA_BLOCK_TYPES and qt.shape[-1] % 32:
            raise UnsupportedError(f"tensor {qt.name!r}: row length {qt.shape[-1]} % 32 != 0")
        raw = self.upload(qt.raw)
        if qt.qtype == "Q6_K":  # 210-byte blocks padded to 224: 16-byte loads in mmvq
            cp = self._cp
            nb = int(raw.shape[1]) // 210
            pad = cp.zeros((int(raw.shape[0]), nb, Q6K_PADDED), np.uint8)
            pad[:, :, :210] = raw.reshape(int(raw.shape[0]), nb, 210)
            raw = pad.reshape(int(raw.shape[0]), nb * Q6K_PADDED)
        return CudaWeight(qt.name, qt.qtype, tuple(qt.shape), raw=raw)

    def held_bytes(self) -> int:
        """What CuPy's memory pool holds on this device (used and cached blocks)."""
        with self._cp.cuda.Device(self._index):
            return int(self._cp.get_default_memory_pool().total_bytes())

    def release_unused(self) -> None:
        """Drop the resident fp16 copies unless the config reads them, and hand the pool's
        unused blocks back to the driver."""
        if not self._resident_on():
            self._groups.clear()
            for w in self._tracked("_live_weights"):
                w.f16 = None
        self._f16.clear()
        self._q8.clear()
        self.synchronize()
        with self._cp.cuda.Device(self._index):
            self._cp.get_default_memory_pool().free_all_blocks()

    def driver_memory(self) -> tuple[int | None, str]:
        """cudaMemGetInfo's used bytes: the whole device (every process, the CUDA context)."""
        with self._cp.cuda.Device(self._index):
            free, total = self._cp.cuda.runtime.memGetInfo()
        return int(total - free), "cudaMemGetInfo total - free (whole device, every process)"

    def close(self) -> None:
        """Drop the captured graph, kernels and cached activations and hand the pool's free
        blocks back to the driver; idempotent. Weights go when their model does."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(*self._faults()):
            self._stream.synchronize()
        self._graph, self._k, self._pos_dev, self._profiling = None, {}, None, False
        self._fns = {}
        self._tickets, self._head_tickets, self._pdl = None, None, None
        self._norm_ticket, self._rope_tickets = None, None
        self._q8.clear()
        self._f16.clear()
        self._groups.clear()
        self._events.clear()
        with self._cp.cuda.Device(self._index):
            self._cp.get_default_memory_pool().free_all_blocks()

    def new_kv_cache(self, n_layers: int, capacity: int, n_head_kv: int, head_dim: int) -> KVCache:
        cp = self._cp
        shape = (capacity, n_head_kv, head_dim)
        cache = KVCache(
            k=[cp.zeros(shape, np.float32) for _ in range(n_layers)],
            v=[cp.zeros(shape, np.float32) for _ in range(n_layers)],
            capacity=capacity,
        )
        return self.track_cache(cache)

    # --- config and kernels ------------------------------------------------------------
    def set_config(self, config: TuningConfig) -> None:
        """Compile every module the config names (KernelCompileError on failure, leaving the
        previous config and kernels in place), then switch."""
        from engine.errors import ConfigError

        if config.backend != self.name:
            raise ConfigError(f"config is for backend {config.backend!r}, not {self.name!r}")
        config.check(self.device_info())
        self._k = self._build(config)
        self._fns = {}
        self._pdl = self._pdl_launcher(config)
        self.config = config
        self._graph = None  # a captured step bakes in the old kernels
        self._q8.clear()
        self._f16.clear()

    def _pdl_launcher(self, cfg: TuningConfig) -> Any:
        c = cfg.knobs("matmul_decode")
        if c.variant not in ("mmvw", "mmvf") or int(c.pdl) == 0 or self._cc < 90:
            return None
        if self._pdl_lib is None:
            from engine.backends.cuda.pdl import Launcher

            self._pdl_lib = Launcher()
        return self._pdl_lib

    def _build(self, cfg: TuningConfig) -> dict[str, Any]:
        cp, cc = self._cp, self._cc
        return {
            key: kernels.module(cp, cc, fname, defines)
            for key, (fname, defines) in kernels.modules_for(cfg).items()
        }

    def _fn(self, mod: str, name: str) -> Any:
        # RawModule.get_function builds a new RawKernel (a driver lookup) on every call, and an
        # eager prefill makes ~500 launches: each kernel is looked up once per config
        fn = self._fns.get((mod, name))
        if fn is None:
            fn = self._fns[(mod, name)] = self._k[mod].get_function(name)
        return fn

    def _launch(
        self,
        mod: str,
        name: str,
        grid: tuple,
        block: tuple,
        args: tuple,
        smem: int = 0,
        pdl: bool = False,
    ) -> None:
        """Launch a kernel on the backend's stream. pdl: the kernel calls pdl_start() before
        touching memory, so under matmul_decode.mmvw's pdl knob it may go through
        cuLaunchKernelEx with programmatic stream serialization (pdl.py)."""
        fn = self._fn(mod, name)
        if smem > 48 * 1024 and fn.max_dynamic_shared_size_bytes < smem:
            fn.max_dynamic_shared_size_bytes = smem  # opt in beyond the 48 KiB default
        if pdl and self._pdl is not None and not self._profiling:
            self._pdl.launch(fn.kernel.ptr, grid, block, args, smem, self._stream.ptr)  # CUfunction
            return
        if not self._profiling:  # no events to record: no context manager per launch
            fn(grid, block, args, shared_mem=smem)
            return
        with self._timed(name):
            fn(grid, block, args, shared_mem=smem)

    # --- profiling: an event pair around every launch, read at the next synchronize --------
    @contextlib.contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        if not self._profiling or self._capturing:  # no events inside a graph capture
            yield
            return
        cp = self._cp
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(self._stream)
        yield
        e1.record(self._stream)
        self._events.append((name, e0, e1))

    def _collect_profile(self) -> None:
        if not self._events:
            return
        cp = self._cp
        for name, e0, e1 in self._events:
            entry = self._prof.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += cp.cuda.get_elapsed_time(e0, e1)
        self._events.clear()

    def set_profiling(self, on: bool = True) -> None:
        """Time every launch with CUDA events; while on, decode runs eagerly (no CUDA graph
        replay), so the times are of the same kernels without the graph's launch savings."""
        self.synchronize()  # events of launches so far go into the report
        self._profiling = bool(on)

    def profile(self, reset: bool = True) -> ProfileReport:
        """Per-kernel GPU time since profiling was switched on (or the last reset)."""
        self.synchronize()
        rep = ProfileReport.of("cuda-events", self._prof)
        if reset:
            self._prof = {}
        return rep

    def _empty(self, shape: tuple[int, ...], dtype: Any = np.float32) -> Any:
        out = self._cp.empty(shape, dtype)
        # validate: an element no kernel writes reads as NaN / -1 (not inside a graph capture,
        # whose replays would re-run the memset: the graph's buffers are checked unpoisoned)
        if self.poison and out.nbytes and not self._capturing:
            self._cp.cuda.runtime.memsetAsync(out.data.ptr, 0xFF, out.nbytes, self._stream.ptr)
        return out

    def _pos_ptr(self) -> np.uint64:
        return np.uint64(self._pos_dev.data.ptr if self._capturing else 0)

    @staticmethod
    def _grid1(n: int, threads: int, cap: int = 65535 * 8) -> int:
        return max(1, min(math.ceil(n / threads), cap))

    # --- ops ----------------------------------------------------------------------------
    def embedding(self, table: CudaWeight, ids: Any) -> Any:
        ids = self._cp.ascontiguousarray(ids.reshape(-1), dtype=np.int32)
        T, K = int(ids.shape[0]), table.k
        out = self._empty((T, K))
        th = int(self.config.knobs("embedding").threads)
        per = K // 16 if table.qtype in CUDA_BLOCK_TYPES else K
        self._launch(
            "dequant",
            f"get_rows_{kernels.QTYPE_SUFFIX[table.qtype]}",
            (self._grid1(T * per, th),),
            (th,),
            (table.raw, np.int32(table.row_bytes), np.int32(K), ids, np.int32(T), out),
        )
        return out

    def rms_norm(self, x: Any, w: CudaWeight, eps: float) -> Any:
        x = self._cp.ascontiguousarray(x)
        D = int(x.shape[-1])
        rows = int(x.size // D)
        out = self._empty(x.shape)
        c = self.config.knobs("rms_norm")
        blk = c.variant == "block" and D % 4 == 0 and D <= 32 * int(c.threads)
        x = self._aligned16(x) if blk else x  # float4 rows (a view may start anywhere)
        if rows == 1 and x.ndim == 2 and D % 32 == 0 and self._int8_decode() and blk:
            xq, xds = self._q8_buffers(1, D)  # rms_norm.block: the row in registers
            self._launch(
                "norm_decode", "rms_norm_row", (1,), (int(c.threads),),
                (x, w.f32, out, xq, xds, np.int32(D), np.float32(eps)), pdl=True,
            )  # fmt: skip
            self._q8_remember(out, xq, xds)
            return out
        if rows == 1 and x.ndim == 2 and D % 32 == 0 and self._int8_decode():
            xq, xds = self._q8_buffers(1, D)  # one decode row: norm and Q8_1 in one kernel
            th = int(self.config.knobs("quantize_act").threads)
            self._launch(
                "q8", "rms_norm_q8", (1,), (th,),
                (x, w.f32, out, xq, xds, np.int32(D), np.float32(eps)), pdl=True,
            )  # fmt: skip
            self._q8_remember(out, xq, xds)
            return out
        rpb = int(c.rows_per_block) if c.variant == "warp" else 4  # else warp's default
        if x.ndim == 2 and self._fuse_f16(rows):  # and the prefill GEMM's fp16 input
            return self._rms_norm_f16(x, w, out, eps, rpb)
        if blk:
            self._launch(
                "norm_decode", "rms_norm_row", (rows,), (int(c.threads),),
                (x, w.f32, out, _NULL, _NULL, np.int32(D), np.float32(eps)), pdl=True,
            )  # fmt: skip
            return out
        self._launch(
            "elementwise",
            "rms_norm",
            (math.ceil(rows / rpb),),
            (32 * rpb,),
            (x, w.f32, out, np.int32(rows), np.int32(D), np.float32(eps)),
        )
        return out

    def registry_op(self, op: str, n: int) -> str:
        """Blame's op name: batched DMMV below gemm_min_t, decode/prefill attention kernels."""
        if op == "matmul" and 1 < n < int(self.config.knobs("prefill").gemm_min_t):
            return "matmul_batched"
        if op == "attention":
            return "attention_decode" if n == 1 else "attention_prefill"
        return super().registry_op(op, n)

    def matmul(self, x: Any, w: CudaWeight) -> Any:
        x = self._cp.ascontiguousarray(x, dtype=np.float32)
        y = self._empty((int(x.shape[0]), w.n))
        self.matmul_into(x, w, y)
        return y

    def matmul_into(self, x: Any, w: CudaWeight, y: Any) -> None:
        """matmul writing into y [T, N] (contiguous; a view into a larger buffer is fine: the
        tests put canaries around it). Dispatch by T: decode, batched DMMV, or the GEMM."""
        T, K = int(x.shape[0]), int(x.shape[1])
        if K != w.k or w.raw is None:
            raise ValueError(f"matmul: x has {K} columns, weight {w.name!r} is {w.shape}")
        pre = self.config.knobs("prefill")
        self._q8_forget(y)
        self._f16_forget(y)
        x = self._aligned16(x)
        if T == 1:
            dec = self.config.knobs("matmul_decode")
            if dec.variant == "mmvq" and w.qtype in CUDA_BLOCK_TYPES:
                self._mmvq(x, w, y, dec)
            elif dec.variant == "mmvw" and w.qtype in CUDA_BLOCK_TYPES:
                self._mmvw(x, [(w, y, None)])
            elif dec.variant == "mmvf" and w.qtype in CUDA_BLOCK_TYPES and self._mmvf_fits(K):
                self._mmvf(x, [(w, y, None)])
            else:
                c = dec if dec.variant == "dmmv" else kernels.DECODE_FALLBACK_KNOBS
                self._dmmv("decode", c, x, w, y, cols=1)
        elif T < int(pre.gemm_min_t):
            self._batched(x, w, y)
        else:
            v = self.config.knobs("matmul_prefill")
            if v.variant == "staged":
                self._staged(x, w, y, int(v.scratch_mb) << 20)
            elif v.variant == "resident":
                self._resident(x, w, y)
            elif v.variant == "mmq" and w.qtype in CUDA_BLOCK_TYPES:
                self._mmq(x, w, y, v)
            elif v.variant == "mmq8" and w.qtype in CUDA_BLOCK_TYPES:
                self._mmq8(x, w, y, v)
            else:  # a type the GEMM variant does not decode: batched DMMV handles every type
                self._batched(x, w, y)

    def _aligned16(self, x: Any) -> Any:
        """x itself when it starts on a 16-byte boundary, else an aligned copy.

        The block-weight DMMV, mmvq (through quantize_q8_1) and mmq8 read activations as float4;
        a view that starts mid-vector (rows() of a larger buffer at a float offset) faults with
        CUDA_ERROR_MISALIGNED_ADDRESS and poisons the context. Row strides are aligned already
        (K % 32 == 0 for block types), so only the start needs checking; CuPy's allocations
        are 256-byte aligned, and the copy is T x K floats, once per call, only for such views.
        """
        if x.data.ptr % 16 == 0:
            return x
        out = self._empty(x.shape, x.dtype)
        out[...] = x
        return out

    def _batched(self, x: Any, w: CudaWeight, y: Any) -> None:
        c = self.config.knobs("matmul_batched")
        self._dmmv("batched", c, x, w, y, cols=int(c.max_cols))

    def _dmmv(self, mod: str, c: Any, x: Any, w: CudaWeight, y: Any, cols: int) -> None:
        T = int(x.shape[0])
        rows = int(c.rows_per_block)
        tpr = 1 if c.variant == "dmmv_serial" else int(c.threads_per_row)
        rpt = int(c.rows_per_thread) if mod == "decode" else 1
        self._launch(
            mod,
            f"dmmv_{kernels.QTYPE_SUFFIX[w.qtype]}",
            (math.ceil(w.n / (rows * rpt)), math.ceil(T / cols)),
            (rows * tpr,),
            (w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(w.k), x, np.int32(T), y),
        )

    # --- Q8_1 activations (q8.cu) and the integer decode matmul (mmvq.cu) ------------------
    def _int8_decode(self) -> bool:
        return self.config.knobs("matmul_decode").variant in ("mmvq", "mmvw")

    def _q8_lookup(self, x: Any) -> tuple[Any, Any] | None:
        for e in self._q8:  # same memory and shape (a contiguous copy or view of it counts)
            if e[0] is x or (
                e[0].data.ptr == x.data.ptr and e[0].shape == x.shape and x.flags.c_contiguous
            ):
                return e[1], e[2]
        return None

    def _q8_remember(self, x: Any, xq: Any, xds: Any) -> None:
        self._q8.append((x, xq, xds))
        del self._q8[:-4]  # a layer reuses one quantized input for at most 3 matmuls

    def _q8_forget(self, y: Any) -> None:
        """Drop quantized forms of any array whose memory y overlaps (y is being written)."""
        if not self._q8:
            return
        lo = y.data.ptr
        hi = lo + y.nbytes
        self._q8 = [e for e in self._q8 if e[0].data.ptr >= hi or e[0].data.ptr + e[0].nbytes <= lo]

    def _q8_buffers(self, T: int, K: int) -> tuple[Any, Any]:
        return self._empty((T, K), np.int8), self._empty((T, K // 32, 2), np.float32)

    def quantize_q8(self, x: Any) -> tuple[Any, Any]:
        """x [T, K] float32 (K % 32 == 0) -> (xq int8 [T, K], xds float32 [T, K/32, 2] = d and
        d * sum(q) per block of 32), reusing the form made when x was produced or last used."""
        hit = self._q8_lookup(x)
        if hit is not None:
            return hit
        T, K = int(x.shape[0]), int(x.shape[1])
        xq, xds = self._q8_buffers(T, K)
        th = int(self.config.knobs("quantize_act").threads)
        n4 = T * K // 4
        self._launch(
            "q8", "quantize_q8_1", (self._grid1(n4, th),), (th,), (x, xq, xds, np.int64(n4))
        )
        self._q8_remember(x, xq, xds)
        return xq, xds

    def _mmvq(self, x: Any, w: CudaWeight, y: Any, c: Any) -> None:
        xq, xds = self.quantize_q8(x)
        nw, rpb = int(c.warps), int(c.rows_per_block)
        self._launch(
            "mmvq",
            f"mmvq_{kernels.QTYPE_SUFFIX[w.qtype]}",
            (math.ceil(w.n / rpb),),
            (32 * nw,),
            (w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(w.k), xq, xds, y),
        )

    def _mmvw(self, x: Any, mats: list[tuple[CudaWeight, Any, Any]]) -> None:
        """Up to three decode matmuls of one activation row in one launch (mmvw.cu): for each
        (w, y, a), y = x @ w^T (+ a, a bias or residual of N floats, when not None). Block
        types only; every w has x's K."""
        xq, xds = self.quantize_q8(x)
        c = self.config.knobs("matmul_decode")
        rpb = self._mmvw_rows_per_block(mats[0][0].k)
        nbs, args = [], []
        for w, y, a in mats:
            self._q8_forget(y)
            nbs.append(math.ceil(w.n / rpb))
            args += [w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(_QT[w.qtype]), y]
            args.append(_NULL if a is None else a)
        for _ in range(3 - len(mats)):
            nbs.append(0)
            args += [_NULL, np.int32(0), np.int32(0), np.int32(0), _NULL, _NULL]
        plan = self._stream_plan(tuple(m[0] for m in mats), rpb, sum(nbs))
        if plan is not None:
            grid, stages, stage_bytes, x4, x6, smem = plan
            self._launch(
                "mmvw", "mmvw_stream", (grid,), (int(c.warps) * 32,),
                (xq, xds, np.int32(mats[0][0].k), np.int32(nbs[0]), np.int32(nbs[1]),
                 np.int32(sum(nbs)), np.int32(stages), np.int32(stage_bytes), np.int32(x4),
                 np.int32(x6), *args),
                smem=smem, pdl=True,
            )  # fmt: skip
            return
        # matmul_decode.q4k_kernel: all Q4_K -> mmvw built for that type alone (fewer registers)
        q4k = int(c.q4k_kernel) and all(m[0].qtype == "Q4_K" for m in mats)
        self._launch(
            "mmvw", "mmvw_q4k" if q4k else "mmvw", (sum(nbs),), (int(c.warps) * 32,),
            (xq, xds, np.int32(mats[0][0].k), np.int32(nbs[0]), np.int32(nbs[1]), *args),
            smem=self._stage_smem(tuple(m[0] for m in mats), rpb), pdl=True,
        )  # fmt: skip

    def _wide(self, x: Any, ws: tuple[CudaWeight, ...]) -> bool:
        """Whether ws can go through one mmvw launch on decode row x."""
        return (
            int(x.shape[0]) == 1
            and self.config.knobs("matmul_decode").variant == "mmvw"
            and all(w.qtype in CUDA_BLOCK_TYPES and w.k == int(x.shape[1]) for w in ws)
        )

    def _decode_row(self, x: Any) -> Any:
        return self._aligned16(self._cp.ascontiguousarray(x, dtype=np.float32))

    # --- fused ops (engine.backends.base): fewer launches per decode layer -----------------
    def attn_in(
        self,
        h: Any,
        wqkv: tuple[CudaWeight, CudaWeight, CudaWeight],
        bias: tuple[CudaWeight, CudaWeight, CudaWeight] | None,
        cache: KVCache,
        layer: int,
        pos0: int,
        heads: tuple[int, int, int],
        theta: float,
        neox: bool,
    ) -> Any:
        """q/k/v in one mmvw launch with the biases added as they store (matmul_decode.mmvw),
        and/or bias + both ropes + the KV write in one rope_kv launch (rope.fuse_kv)."""
        if self._qkv_ok(h, wqkv):  # a prefill chunk under resident: one GEMM (prefill.py)
            return self._attn_in_rows(h, wqkv, bias, cache, layer, pos0, heads, theta, neox)
        H, Hkv, D = heads
        T = int(h.shape[0])
        fuse = int(self.config.knobs("rope").fuse_kv) == 1
        wide = self._wide(h, wqkv)
        flt = self._mmvf_ok(h, wqkv)  # matmul_decode.mmvf: q/k/v + biases in one launch too
        if not (fuse or wide or flt):
            return super().attn_in(h, wqkv, bias, cache, layer, pos0, heads, theta, neox)
        if pos0 + T > cache.capacity:
            raise ValueError(
                f"KV cache full: writing positions {pos0}..{pos0 + T - 1} "
                f"into a cache of {cache.capacity}"
            )
        if wide and self._fuse_rope(heads):
            return self._mmvw_qkv(
                self._decode_row(h), wqkv, bias, cache, layer, pos0, heads, theta, neox
            )
        if wide or flt:
            h = self._decode_row(h)
            q, k, v = (self._empty((T, w.n)) for w in wqkv)
            adds = (None,) * 3 if bias is None else tuple(b.f32 for b in bias)
            mats = [(w, y, a) for w, y, a in zip(wqkv, (q, k, v), adds, strict=True)]
            (self._mmvf if flt else self._mmvw)(h, mats)
            bias = None
            if self._gqa_rope(heads):  # the attention kernel ropes q, k and writes the cache
                return _PendingQ(q.reshape(T, H, D), k, v, cache, layer, pos0, theta, neox)
        else:
            q, k, v = (self.matmul(h, w) for w in wqkv)
        if not fuse:
            q = self.rope(q.reshape(T, H, D), pos0, theta, neox)
            k = self.rope(k.reshape(T, Hkv, D), pos0, theta, neox)
            self.kv_write(cache, layer, k, v.reshape(T, Hkv, D), pos0)
            return q
        qo = self._empty((T, H, D))
        th = int(self.config.knobs("rope").threads)
        n = T * (H + Hkv) * (D // 2) + T * Hkv * D
        bq, bk, bv = (_NULL,) * 3 if bias is None else (b.f32 for b in bias)
        self._launch(
            "fused", "rope_kv", (self._grid1(n, th),), (th,),
            (
                q, k, v, bq, bk, bv, qo, cache.k[layer], cache.v[layer], np.int32(T),
                np.int32(H), np.int32(Hkv), np.int32(D), np.int32(pos0), self._pos_ptr(),
                np.float32(theta), np.int32(1 if neox else 0),
            ),
            pdl=True,
        )  # fmt: skip
        return qo

    def _stage_smem(self, ws: tuple[CudaWeight, ...], rpb: int | None = None) -> int:
        """Dynamic shared memory of an mmvw launch under matmul_decode.stage: a block's rows
        (rpb, default the unsplit count) of the widest matrix, or 0 (no staging) when that
        exceeds what a block may opt in to."""
        c = self.config.knobs("matmul_decode")
        if int(c.stage) == 0 or sum(w.n for w in ws) < int(c.stage_min_rows):
            return 0  # no shared memory: the kernel reads global memory (stage_start declines)
        need = (rpb or self._mmvw_rows_per_block()) * max(w.row_bytes for w in ws)
        cap = self.__dict__.get("_stage_cap")
        if cap is None:  # what a block may opt in to, less the kernels' static shared memory
            extra = self.device_info().extra
            cap = self._stage_cap = int(extra.get("smem_per_block_optin", 0)) - 1024
        return need if need <= cap else 0

    def _dev_extra(self) -> dict:
        """device_info().extra, asked of the driver once (not per decode launch)."""
        extra = self.__dict__.get("_extra")
        if extra is None:
            extra = self._extra = self.device_info().extra
        return extra

    def _stream_plan(
        self, ws: tuple[CudaWeight, ...], rpb: int, nsets: int
    ) -> tuple[int, int, int, int, int, int] | None:
        """(grid, stages, stage bytes, x4, x6, shared bytes) of an mmvw_stream launch
        (matmul_decode.stream: the ring's stages; stream_blocks: persistent blocks per SM, 0 =
        as many as fit; stream_x: the activations as shared-memory planes after the ring, x4 /
        x6 their byte offsets for the Q4_K / Q6_K slots or -1), or None: the knob is off, a
        matrix is not Q4_K / Q6_K or not 16-byte aligned, or two stages of a block's rows (and
        the planes) do not fit in a block's shared memory (then plain mmvw)."""
        c = self.config.knobs("matmul_decode")
        stages = int(c.stream)
        if stages == 0 or not all(w.qtype in ("Q4_K", "Q6_K") for w in ws):
            return None
        if any(int(w.raw.data.ptr) % 16 or w.row_bytes % 16 for w in ws):
            return None
        extra = self._dev_extra()
        stage_bytes = rpb * max(w.row_bytes for w in ws)
        planes = []  # (type, narrow slots): the x planes stream_x builds, 56 bytes a slot
        if int(c.stream_x):
            types = {w.qtype for w in ws}
            planes = [t for t in ("Q4_K", "Q6_K") if t in types and not int(getattr(c, _WIDE[t]))]
        xbytes = len(planes) * 56 * (ws[0].k // 32)
        # the kernel's static shared memory (barriers, split_k's partials) and 1 KiB a block
        # the driver reserves: 2 KiB of margin
        cap = int(extra.get("smem_per_block_optin", 0)) - 2048 - xbytes
        stages = min(stages, cap // stage_bytes)
        if stages < 2:
            return None
        off = {t: stages * stage_bytes + i * 56 * (ws[0].k // 32) for i, t in enumerate(planes)}
        smem = stages * stage_bytes + xbytes
        threads = int(c.warps) * 32
        per_sm = min(
            int(extra.get("smem_per_sm", 0)) // (smem + 2048),
            2048 // threads,  # threads per SM
            65536 // (64 * threads),  # registers, at mmvw's <= 64 a thread
            32,
        )
        if int(c.stream_blocks) > 0:
            per_sm = min(per_sm, int(c.stream_blocks))
        grid = min(nsets, max(1, per_sm) * int(extra.get("sms", 1)))
        return grid, stages, stage_bytes, off.get("Q4_K", -1), off.get("Q6_K", -1), smem

    def _mmvw_rows_per_block(self, k: int = 0) -> int:
        """Rows per block of an mmvw / mmvw_norm launch on rows of k values: the registry's
        derived rows_per_block (the kernel's MMVW_RPB), split_k times fewer from split_min_k on
        (mmvw.cu's mmvw_rpb); k = 0: unsplit (mmvw_qkv)."""
        c = self.config.knobs("matmul_decode")
        rpb, split = c.rows_per_block, int(c.split_k)
        return rpb // split if split > 1 and k >= int(c.split_min_k) else rpb

    def _fuse_rope(self, heads: tuple[int, int, int]) -> bool:
        """matmul_decode.fuse_rope on a decode row whose heads mmvw_qkv can count and hold."""
        H, Hkv, D = heads
        return (
            int(self.config.knobs("matmul_decode").fuse_rope) == 1
            and D % 2 == 0
            and H + Hkv <= _MAX_ROPE_HEADS
            and self._mmvw_rows_per_block() // D + 2 <= 32  # heads a block touches: a bitmask
        )

    def _mmvw_qkv(
        self,
        h: Any,
        wqkv: tuple[CudaWeight, CudaWeight, CudaWeight],
        bias: tuple[CudaWeight, CudaWeight, CudaWeight] | None,
        cache: KVCache,
        layer: int,
        pos0: int,
        heads: tuple[int, int, int],
        theta: float,
        neox: bool,
    ) -> Any:
        """q/k/v + biases, v into the cache, q and k roped (k into the cache): one mmvw_qkv
        launch (matmul_decode.fuse_rope) for the decode row h [1, C]."""
        H, Hkv, D = heads
        xq, xds = self.quantize_q8(h)
        c = self.config.knobs("matmul_decode")
        rpb = self._mmvw_rows_per_block()
        nbs = [math.ceil(w.n / rpb) for w in wqkv]
        q, k = self._empty((1, H * D)), self._empty((1, Hkv * D))
        qo = self._empty((1, H, D))
        adds = (_NULL,) * 3 if bias is None else tuple(b.f32 for b in bias)
        mats = []
        for w, a in zip(wqkv, adds, strict=True):
            mats += [w.raw, np.int32(w.row_bytes), np.int32(_QT[w.qtype]), a]
        self._launch(
            "mmvw", "mmvw_qkv", (sum(nbs),), (int(c.warps) * 32,),
            (
                xq, xds, np.int32(h.shape[1]), np.int32(nbs[0]), np.int32(nbs[1]), *mats, q, k,
                qo, cache.k[layer], cache.v[layer], np.int32(H), np.int32(Hkv), np.int32(D),
                np.int32(pos0), self._pos_ptr(), np.float32(theta), np.int32(1 if neox else 0),
                self._rope_tickets,
            ),
            smem=self._stage_smem(wqkv), pdl=True,
        )  # fmt: skip
        return qo

    def matmul_add(self, x: Any, w: CudaWeight, r: Any) -> Any:
        """Under matmul_decode.mmvw / mmvf a decode row's projection adds the residual as it
        stores."""
        if self._mmvf_ok(x, (w,)):
            return self._mmvf_add(x, w, r)
        if not self._wide(x, (w,)) or w.raw is None:
            return super().matmul_add(x, w, r)
        r = self._cp.ascontiguousarray(r, dtype=np.float32)
        y = self._empty((1, w.n))
        self._mmvw(self._decode_row(x), [(w, y, r)])
        return y

    def ffn(self, h: Any, gate: CudaWeight, up: CudaWeight, down: CudaWeight, r: Any) -> Any:
        """Under matmul_decode.mmvw: gate and up in one launch, swiglu_q8 (or both in one
        mmvw_glu launch under fuse_swiglu), down + residual. Under matmul_prefill.resident
        (fuse_f16) a prefill chunk's gate and up are one GEMM."""
        if self._pair_ok(h, gate, up):
            return self.matmul_add(self._gate_up(h, gate, up), down, r)
        if self._mmvf_ok(h, (gate, up)):
            return self._mmvf_ffn(h, gate, up, down, r)
        if not self._wide(h, (gate, up)):
            return super().ffn(h, gate, up, down, r)
        return self.matmul_add(self._decode_gate_up(self._decode_row(h), gate, up), down, r)

    def _decode_gate_up(self, h: Any, gate: CudaWeight, up: CudaWeight) -> Any:
        """silu(h gate^T) * (h up^T) [1, n] of a decode row, its Q8_1 form remembered."""
        c = self.config.knobs("matmul_decode")
        n = gate.n
        if int(c.fuse_swiglu) == 0 or up.n != n:
            g, u = self._empty((1, n)), self._empty((1, up.n))
            self._mmvw(h, [(gate, g, None), (up, u, None)])
            return self.swiglu(g, u)
        xq, xds = self.quantize_q8(h)
        y = self._empty((1, n))
        q8 = n % 32 == 0  # else y's consumer (a float-weight down) takes no Q8_1 form
        yq, yds = self._q8_buffers(1, n) if q8 else (_NULL, _NULL)
        self._launch(
            "mmvw", "mmvw_glu", (math.ceil(n / 32),), (64 * int(c.glu_threads_per_row),),
            (
                xq, xds, np.int32(gate.k), np.int32(n), gate.raw, np.int32(gate.row_bytes),
                np.int32(_QT[gate.qtype]), up.raw, np.int32(up.row_bytes),
                np.int32(_QT[up.qtype]), y, yq, yds,
            ),
            pdl=True,
        )  # fmt: skip
        if q8:
            self._q8_remember(y, yq, yds)
        return y

    def row_stats(self, t: Any, ref: Any, ref_host: np.ndarray) -> Any:
        """On the device (the backend's stream is current), no host wait: op-level replay
        compares a 35B's activations op by op, and a download per op stalled the stream (a
        35B-A3B trial's replay: 76 s of its 85)."""
        cp, n = self._cp, int(t.shape[0])
        c = cp.ascontiguousarray(t).reshape(n, -1).astype(cp.float64)
        return row_stats_of(cp, c, cp.ascontiguousarray(ref).reshape(n, -1).astype(cp.float64))

    def stats_host(self, stats: list[Any]) -> list[np.ndarray]:
        if not stats:
            return []
        flat = self.download(self._cp.concatenate([s.reshape(-1) for s in stats]))
        out, at = [], 0
        for s in stats:
            out.append(flat[at : at + s.size].reshape(s.shape))
            at += s.size
        return out

    def hook_bypassed_fusions(self, config: TuningConfig) -> list[str]:
        """matmul_decode's mmvw_glu / mmvw_norm / mmvw_qkv, rope's rope_kv and the fused
        decode of delta_net and moe_experts run only unhooked."""
        out = []
        dec = config.knobs("matmul_decode")
        fused = ("fuse_swiglu", "fuse_norm", "fuse_rope")
        if dec.variant == "mmvw" and any(int(getattr(dec, k)) for k in fused):
            out.append("matmul_decode")
        if dec.variant == "mmvf" and int(dec.fuse_swiglu):  # mmvf_glu
            out.append("matmul_decode")
        if int(config.knobs("rope").fuse_kv):
            out.append("rope")
        att = config.knobs("attention_decode")
        if att.variant in ("gqa", "tile", "vec") and int(att.fuse_rope):
            out.append("attention_decode")  # RoPE + KV write inside attn_gqa / tile / vec
        # the hybrids' fused decode (hybrid.py, moe_dec.py), where this backend has run it: a
        # dense model never does, so its blame never names them
        ran = getattr(self, "_fusions_ran", set())
        moe = config.knobs("moe_experts")
        for op, on in (
            ("delta_net", int(config.knobs("delta_net").fuse_decode)),
            ("rope_partial", int(config.knobs("rope_partial").fuse_qk)),
            ("moe_experts", moe.variant in ("dmmv", "grouped", "tc") and int(moe.fuse_decode)),
        ):
            if on and op in ran:
                out.append(op)
        return out

    def _fuse_norm(self, x: Any, w: CudaWeight, r: Any) -> bool:
        return (
            self._wide(x, (w,))
            and w.raw is not None
            and int(self.config.knobs("matmul_decode").fuse_norm) == 1
            and w.n % 32 == 0
            and tuple(r.shape) == (1, w.n)
        )

    def matmul_add_norm(
        self, x: Any, w: CudaWeight, r: Any, norm: CudaWeight, eps: float
    ) -> tuple[Any, Any]:
        """Under matmul_decode.fuse_norm: the projection + residual, then the grid's last block
        runs the RMSNorm of the new row and its Q8_1 form (mmvw_norm), one launch."""
        if not self._fuse_norm(x, w, r):
            return super().matmul_add_norm(x, w, r, norm, eps)
        xq, xds = self.quantize_q8(self._decode_row(x))
        r = self._cp.ascontiguousarray(r, dtype=np.float32)
        c = self.config.knobs("matmul_decode")
        rpb = self._mmvw_rows_per_block(w.k)
        y, h = self._empty((1, w.n)), self._empty((1, w.n))
        hq, hds = self._q8_buffers(1, w.n)
        self._launch(
            "mmvw", "mmvw_norm", (math.ceil(w.n / rpb),), (int(c.warps) * 32,),
            (
                xq, xds, np.int32(w.k), w.raw, np.int32(w.row_bytes), np.int32(w.n),
                np.int32(_QT[w.qtype]), y, r, norm.f32, np.float32(eps), h, hq, hds,
                self._norm_ticket,
            ),
            smem=self._stage_smem((w,), rpb), pdl=True,
        )  # fmt: skip
        self._q8_remember(h, hq, hds)
        return y, h

    def ffn_norm(
        self,
        h: Any,
        gate: CudaWeight,
        up: CudaWeight,
        down: CudaWeight,
        r: Any,
        norm: CudaWeight,
        eps: float,
    ) -> tuple[Any, Any]:
        """ffn then the next norm; under fuse_norm the down projection's launch ends in it."""
        if not self._wide(h, (gate, up)):
            return super().ffn_norm(h, gate, up, down, r, norm, eps)
        g = self._decode_gate_up(self._decode_row(h), gate, up)
        return self.matmul_add_norm(g, down, r, norm, eps)

    def _to_f16(self, x: Any) -> Any:
        cached = self._resident_on()  # fp16 forms are kept under matmul_prefill.resident
        if cached and (hit := self._f16_lookup(x)) is not None:
            return hit
        xh = self._empty(x.shape, np.uint16)
        n = int(x.size)
        self._launch("dequant", "f32_to_f16", (self._grid1(n, 256),), (256,), (x, xh, np.int64(n)))
        if cached:
            self._f16_remember(x, xh)
        return xh

    def _staged(self, x: Any, w: CudaWeight, y: Any, scratch_bytes: int) -> None:
        from cupy.cuda import cublas

        T, K, N = int(x.shape[0]), w.k, w.n
        xh = self._to_f16(x)
        chunk = max(1, min(N, scratch_bytes // (2 * K)))
        scratch = self._empty((chunk, K), np.uint16)
        handle = self._cp.cuda.device.get_cublas_handle()
        per = K // 16 if w.qtype in CUDA_BLOCK_TYPES else K
        for r0 in range(0, N, chunk):
            n = min(chunk, N - r0)
            self._launch(
                "dequant",
                f"dequant_f16_{kernels.QTYPE_SUFFIX[w.qtype]}",
                (self._grid1(n * per, 256),),
                (256,),
                (w.raw, np.int32(w.row_bytes), np.int32(K), np.int32(r0), np.int32(n), scratch),
            )
            # column-major view: Y^T[N, T] (ld N) = W[n, K] (op T) x X^T[K, T] (op N)
            with self._timed("cublas_gemm_f16"):
                cublas.gemmEx(
                    handle, _OP_T, _OP_N, n, T, K,
                    self._alpha.ctypes.data, scratch.data.ptr, _R_16F, K,
                    xh.data.ptr, _R_16F, K,
                    self._beta.ctypes.data, y.data.ptr + 4 * r0, _R_32F, N,
                    _COMPUTE_32F, _GEMM_DEFAULT,
                )  # fmt: skip

    def _mmq(self, x: Any, w: CudaWeight, y: Any, c: Any) -> None:
        T = int(x.shape[0])
        xh = self._to_f16(x)
        bm, bn = int(c.tile_m), int(c.tile_n)
        threads = int(c.warps_m) * int(c.warps_n) * 32
        self._launch(
            "mmq",
            f"mmq_{kernels.QTYPE_SUFFIX[w.qtype]}",
            (math.ceil(w.n / bm), math.ceil(T / bn)),
            (threads,),
            (w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(w.k), xh, np.int32(T), y),
        )

    def _mmq8(self, x: Any, w: CudaWeight, y: Any, c: Any) -> None:
        T = int(x.shape[0])
        xq, xds = self.quantize_q8(x)  # once for q, k and v (or gate and up)
        bm, bn = int(c.tile_m), int(c.tile_n)
        threads = int(c.warps_m) * int(c.warps_n) * 32
        self._launch(
            "mmq8",
            f"mmq8_{kernels.QTYPE_SUFFIX[w.qtype]}",
            (math.ceil(w.n / bm), math.ceil(T / bn)),
            (threads,),
            (w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(w.k), xq, xds, np.int32(T), y),
        )

    def add(self, a: Any, b: Any) -> Any:
        a = self._cp.ascontiguousarray(a)
        out = self._empty(a.shape)
        n = int(a.size)
        th = int(self.config.knobs("add").threads)
        if isinstance(b, CudaWeight):
            N = int(b.f32.size)
            self._launch(
                "elementwise", "add_bias", (self._grid1(n, th),), (th,),
                (a, b.f32, out, np.int64(n), np.int32(N)),
            )  # fmt: skip
        else:
            b = self._cp.ascontiguousarray(b)
            self._launch(
                "elementwise", "add_same", (self._grid1(n, th),), (th,), (a, b, out, np.int64(n))
            )
        return out

    def rope(self, x: Any, pos0: int, theta: float, neox: bool) -> Any:
        x = self._cp.ascontiguousarray(x)
        T, H, D = (int(s) for s in x.shape)
        out = self._empty(x.shape)
        th = int(self.config.knobs("rope").threads)
        self._launch(
            "elementwise",
            "rope",
            (self._grid1(T * H * (D // 2), th),),
            (th,),
            (
                x,
                out,
                np.int32(T),
                np.int32(H),
                np.int32(D),
                np.int32(pos0),
                self._pos_ptr(),
                np.float32(theta),
                np.int32(1 if neox else 0),
            ),
        )
        return out

    def kv_write(self, cache: KVCache, layer: int, k: Any, v: Any, pos0: int) -> None:
        T = int(k.shape[0])
        if pos0 + T > cache.capacity:
            raise ValueError(
                f"KV cache full: writing positions {pos0}..{pos0 + T - 1} "
                f"into a cache of {cache.capacity}"
            )
        k = self._cp.ascontiguousarray(k)
        v = self._cp.ascontiguousarray(v)
        HD = int(k.size // T)
        th = int(self.config.knobs("kv_write").threads)
        self._launch(
            "elementwise",
            "kv_write",
            (self._grid1(T * HD, th),),
            (th,),
            (
                k,
                v,
                cache.k[layer],
                cache.v[layer],
                np.int32(T),
                np.int32(HD),
                np.int32(pos0),
                self._pos_ptr(),
            ),
        )

    def attention(self, q: Any, cache: KVCache, layer: int, pos0: int) -> Any:
        if isinstance(q, _PendingQ):  # attn_in left RoPE and the KV write to attn_gqa
            if q.cache is not cache or q.layer != layer or q.pos0 != pos0:
                raise ValueError("attention: a pending q of another cache, layer or position")
            out = self._empty(tuple(int(s) for s in q.q.shape))
            c = self.config.knobs("attention_decode")
            if c.variant == "vec":
                T, H, D = (int(s) for s in q.q.shape)
                xq = launch_attn_vec(
                    self, q.q, cache.k[layer], cache.v[layer], out, pos0, c,
                    self._int8_decode() and D % 32 == 0, rope=q,
                )  # fmt: skip
                if xq is not None:
                    self._q8_remember(out.reshape(T, H * D), *xq)
                return out
            if c.variant == "tile":
                T, H, D = (int(s) for s in q.q.shape)
                xq = launch_attn_tile(
                    self, q.q, cache.k[layer], cache.v[layer], out, pos0, c,
                    self._int8_decode(), rope=q,
                )  # fmt: skip
                if xq is not None:
                    self._q8_remember(out.reshape(T, H * D), *xq)
                return out
            self._attn_gqa(q.q, cache, layer, pos0, out, c, self._int8_decode(), rope=q)
            return out
        q = self._cp.ascontiguousarray(q)
        T, H, D = (int(s) for s in q.shape)
        Hkv = int(cache.k[layer].shape[1])
        out = self._empty((T, H, D))
        scale = np.float32(1.0 / math.sqrt(D))
        if T == 1:
            c = self.config.knobs("attention_decode")
            q8 = self._int8_decode() and D % 32 == 0  # the o projection's Q8_1 input, fused
            if c.variant == "gqa" and self._gqa_fits(H, Hkv, D, int(c.warps)):
                self._attn_gqa(q, cache, layer, pos0, out, c, q8)
                return out
            if c.variant == "tile" and tile_fits(H, Hkv, D, int(c.warps), _MAX_ARGMAX_ROWS):
                k, v = cache.k[layer], cache.v[layer]
                xq = launch_attn_tile(self, q, k, v, out, pos0, c, q8)
                if xq is not None:
                    self._q8_remember(out.reshape(T, H * D), *xq)
                return out
            if c.variant == "vec" and vec_fits(H, Hkv, D, _MAX_ARGMAX_ROWS):
                k, v = cache.k[layer], cache.v[layer]
                xq = launch_attn_vec(self, q, k, v, out, pos0, c, q8)
                if xq is not None:
                    self._q8_remember(out.reshape(T, H * D), *xq)
                return out
            G = int(c.lanes_per_key) if c.variant == "split_kw" else 0
            G = G if G and D % (4 * G) == 0 and D <= 32 * G else 0  # else attn_split serves
            q = self._aligned16(q) if G else q  # float4 loads of q
            fc = bool(G) and int(c.fuse_combine) == 1 and H <= _MAX_ARGMAX_ROWS
            ke = bool(G) and int(c.kv_early) == 1
            self._attn_split(q, cache, layer, pos0, out, int(c.splits), int(c.warps), q8, G, fc, ke)
            return out
        c = self.config.knobs("attention_prefill")
        if c.variant in ("flash_tc", "gemm"):  # tensor cores: prefill.py
            self._attn_tc(q, cache, layer, pos0, out, c)
        elif c.variant == "flash" and D <= 128 and D % 4 == 0:
            bq, rpw = int(c.block_q), int(c.rows_per_warp)
            smem = 4 * (bq * D + 2 * 32 * (D + 4))
            self._launch(
                "attention",
                "attn_flash",
                (math.ceil(T / bq), H),
                ((bq // rpw) * 32,),
                (
                    q,
                    cache.k[layer],
                    cache.v[layer],
                    out,
                    np.int32(T),
                    np.int32(H),
                    np.int32(Hkv),
                    np.int32(D),
                    np.int32(pos0),
                    self._pos_ptr(),
                    scale,
                ),
                smem=smem,
            )
        else:
            splits = int(c.splits) if c.variant == "split" else 1
            warps = int(c.warps) if c.variant == "split" else 4
            self._attn_split(q, cache, layer, pos0, out, splits, warps)
        return out

    def _gqa_rope(self, heads: tuple[int, int, int]) -> bool:
        """attention_decode.gqa's (or .tile's) fuse_rope on a decode row its kernel takes."""
        c = self.config.knobs("attention_decode")
        if c.variant == "vec":
            fits = vec_fits(*heads, _MAX_ARGMAX_ROWS) and rope_fits(heads[2])
            return int(c.fuse_rope) == 1 and fits
        if c.variant == "tile":
            fits = tile_fits(*heads, int(c.warps), _MAX_ARGMAX_ROWS)
            return int(c.fuse_rope) == 1 and fits
        return (
            c.variant == "gqa"
            and int(c.fuse_rope) == 1
            and int(c.fuse_combine) == 1
            and self._gqa_fits(*heads, int(c.warps))
        )

    @staticmethod
    def _gqa_fits(H: int, Hkv: int, D: int, warps: int) -> bool:
        """attn_gqa's limits (attn_decode.cu): D % 4 == 0, D <= 256, a group of at most 4 q
        heads a warp and 32 a block; other shapes take attn_split."""
        G = H // Hkv
        return D % 4 == 0 and D <= 256 and G <= min(32, 4 * warps) and H % Hkv == 0

    def _attn_gqa(
        self,
        q: Any,
        cache: KVCache,
        layer: int,
        pos0: int,
        out: Any,
        c: Any,
        q8: bool,
        rope: _PendingQ | None = None,
    ) -> None:
        """attention_decode.gqa: a block per (key range, KV head) for the group's q heads, the
        KV head's last range combining (fuse_combine; + Q8_1 under int8 decode). rope: q, k
        unroped, the kernel ropes them and writes the position's k, v rows (fuse_rope)."""
        T, H, D = (int(s) for s in q.shape)
        Hkv = int(cache.k[layer].shape[1])
        splits, warps = int(c.splits), int(c.warps)
        fc = int(c.fuse_combine) == 1 and Hkv <= _MAX_ARGMAX_ROWS
        q8 = q8 and D % 32 == 0
        rk = (_NULL, _NULL, np.float32(0), np.int32(0))
        if rope is not None:
            assert fc, "fuse_rope needs fuse_combine (_gqa_rope)"
            rk = (rope.k, rope.v, np.float32(rope.theta), np.int32(1 if rope.neox else 0))
        part = self._empty((T, H, splits, D))
        ml = self._empty((T, H, splits, 2))
        xq = xds = None
        if fc and q8:
            xq, xds = self._q8_buffers(T, H * D)
        # K / V tiles and q; the combine reuses it for the group's (max, sum) pairs
        smem = 4 * max(2 * 32 * (D + 4) + (H // Hkv) * D, 2 * (H // Hkv) * splits)
        self._launch(
            "attn_decode", "attn_gqa", (splits, Hkv), (32 * warps,),
            (
                self._aligned16(q), cache.k[layer], cache.v[layer], part, ml, np.int32(H),
                np.int32(Hkv), np.int32(D), np.int32(pos0), self._pos_ptr(),
                np.float32(1.0 / math.sqrt(D)), out if fc else _NULL,
                _NULL if xq is None else xq, _NULL if xds is None else xds,
                self._head_tickets, np.int32(int(c.early)), *rk,
            ),
            smem=smem, pdl=True,
        )  # fmt: skip
        if fc:
            if xq is not None:
                self._q8_remember(out.reshape(T, H * D), xq, xds)
            return
        xq, xds = self._q8_buffers(T, H * D) if q8 else (None, None)
        self._attn_combine(part, ml, out, splits, xq, xds)
        if xq is not None:
            self._q8_remember(out.reshape(T, H * D), xq, xds)

    def _attn_split(
        self,
        q: Any,
        cache: KVCache,
        layer: int,
        pos0: int,
        out: Any,
        splits: int,
        warps: int,
        q8: bool = False,
        lanes_per_key: int = 0,
        fuse_combine: bool = False,
        kv_early: bool = False,
    ) -> None:
        T, H, D = (int(s) for s in q.shape)
        Hkv = int(cache.k[layer].shape[1])
        part = self._empty((T, H, splits, D))
        ml = self._empty((T, H, splits, 2))
        if lanes_per_key:  # decode (T == 1): several keys per warp step
            xq = xds = None
            if fuse_combine and q8:
                xq, xds = self._q8_buffers(T, H * D)
            self._launch(
                "attention", "attn_split_kw", (splits, H), (32 * warps,),
                (
                    q, cache.k[layer], cache.v[layer], part, ml, np.int32(H), np.int32(Hkv),
                    np.int32(D), np.int32(lanes_per_key), np.int32(pos0), self._pos_ptr(),
                    np.float32(1.0 / math.sqrt(D)), out if fuse_combine else _NULL,
                    _NULL if xq is None else xq, _NULL if xds is None else xds,
                    self._head_tickets, np.int32(1 if kv_early else 0),
                ),
                smem=4 * warps * (D + 2), pdl=True,
            )  # fmt: skip
            if fuse_combine:  # the kernel's last range per head combined into out
                if xq is not None:
                    self._q8_remember(out.reshape(T, H * D), xq, xds)
                return
        else:
            self._launch(
                "attention",
                "attn_split",
                (splits, H, T),
                (32 * warps,),
                (
                    q,
                    cache.k[layer],
                    cache.v[layer],
                    part,
                    ml,
                    np.int32(T),
                    np.int32(H),
                    np.int32(Hkv),
                    np.int32(D),
                    np.int32(pos0),
                    self._pos_ptr(),
                    np.float32(1.0 / math.sqrt(D)),
                ),
                smem=4 * warps * (D + 2),
            )
        # q8: combine and quantize, out's Q8_1 form for the next matmul, no extra launch
        xq, xds = self._q8_buffers(T, H * D) if q8 else (None, None)
        self._attn_combine(part, ml, out, splits, xq, xds)
        if xq is not None:
            self._q8_remember(out.reshape(T, H * D), xq, xds)

    def _attn_combine(
        self, part: Any, ml: Any, out: Any, splits: int, xq: Any = None, xds: Any = None
    ) -> None:
        """Split decode attention's combine of the per-range partials part [T, H, splits, D]
        and their (max, sum) ml into out [T, H, D]; with xq / xds also out's Q8_1 form."""
        T, H, D = (int(s) for s in out.shape)
        dims = (np.int32(H), np.int32(D), np.int32(splits))
        if xq is not None:
            self._launch(
                "fused", "attn_combine_q8", (H, T), (min(128, max(32, D)),),
                (part, ml, out, xq, xds, *dims), pdl=True,
            )  # fmt: skip
        else:
            self._launch(
                "attention", "attn_combine", (H, T), (min(128, max(32, D)),), (part, ml, out, *dims)
            )

    def swiglu(self, gate: Any, up: Any) -> Any:
        gate = self._cp.ascontiguousarray(gate)
        up = self._cp.ascontiguousarray(up)
        out = self._empty(gate.shape)
        n = int(gate.size)
        if gate.ndim == 2 and gate.shape[0] == 1 and n % 32 == 0 and self._int8_decode():
            xq, xds = self._q8_buffers(1, n)  # the down projection's input, quantized here
            th = int(self.config.knobs("quantize_act").threads)
            n4 = n // 4
            self._launch(
                "q8", "swiglu_q8", (self._grid1(n4, th),), (th,),
                (gate, up, out, xq, xds, np.int64(n4)), pdl=True,
            )  # fmt: skip
            self._q8_remember(out, xq, xds)
            return out
        th = int(self.config.knobs("swiglu").threads)
        if gate.ndim == 2 and self._fuse_f16(int(gate.shape[0])):  # and the GEMM's fp16 input
            return self._swiglu_f16(gate, up, out, th)
        self._launch(
            "elementwise", "swiglu", (self._grid1(n, th),), (th,), (gate, up, out, np.int64(n)),
            pdl=True,
        )  # fmt: skip
        return out

    def argmax(self, logits: Any) -> Any:
        logits = self._cp.ascontiguousarray(logits)
        T, V = int(logits.shape[0]), int(logits.shape[-1])
        out = self._empty((T,), np.int32)
        c = self.config.knobs("argmax")
        th = int(c.threads)
        if c.variant == "multi" and T <= _MAX_ARGMAX_ROWS:
            nb = int(c.blocks)
            pv, pi = self._empty((T, nb)), self._empty((T, nb), np.int32)
            self._launch(
                "fused", "argmax_multi", (nb, T), (th,),
                (logits, np.int32(V), out, pv, pi, self._tickets), pdl=True,
            )  # fmt: skip
            return out
        self._launch("elementwise", "argmax", (T,), (th,), (logits, np.int32(V), out))
        return out

    # --- the decode step as a CUDA graph -------------------------------------------------
    def decode_step(
        self,
        step: Callable[[Any, int], tuple[Any, Any]],
        tok: Any,
        pos: int,
        cache: KVCache,
    ) -> tuple[Any, Any]:
        """Capture step(tok, pos) once per KV cache and config, then replay it. The graph's
        logits and token buffers are returned every step: the caller reads them before the
        next step (the model downloads the token each step), and the next step's input token
        is copied from ``tok`` into the graph's own input before the replay."""
        if pos + 1 > cache.capacity:
            raise ValueError(
                f"KV cache full: writing positions {pos}..{pos} into a cache of {cache.capacity}"
            )
        if not self.use_graphs or self._profiling:
            return step(tok, pos)
        g = self._graph
        if g is None or g.cache() is not cache or g.config is not self.config:
            g = self._capture(step, tok, pos, cache)
        self._launch(
            "elementwise", "decode_prep", (1,), (32,),
            (self._pos_dev, np.int32(pos), g.tok_in, tok),
        )  # fmt: skip
        g.graph.launch(stream=self._stream)
        return g.logits, g.tok_out

    def _capture(self, step: Callable, tok: Any, pos: int, cache: KVCache) -> _Graph:
        cp = self._cp
        self._graph = None
        tok_in = cp.zeros(1, np.int32)
        keep: list = []
        pool = cp.get_default_memory_pool()

        def alloc(size: int) -> Any:
            mem = pool.malloc(size)
            keep.append(mem)  # held by the graph: never handed back to the pool
            return mem

        self._stream.synchronize()
        self._q8.clear()  # quantized forms made outside the capture are not in the graph
        self._f16.clear()
        cp.cuda.set_allocator(alloc)
        self._capturing = True
        self._stream.begin_capture()
        try:
            logits, tok_out = step(tok_in, pos)
        finally:
            graph = self._stream.end_capture()
            self._capturing = False
            self._q8.clear()
            cp.cuda.set_allocator(pool.malloc)
        g = _Graph(weakref.ref(cache), self.config, graph, tok_in, logits, tok_out, keep)
        self._graph = g
        return g
