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
)
from engine.backends.cuda import kernels
from engine.backends.cuda.attention import CudaAttentionOps
from engine.backends.cuda.decode_float import CudaFloatDecodeOps
from engine.backends.cuda.decode_matmul import _MAX_ROPE_HEADS, CudaDecodeMatmulOps
from engine.backends.cuda.device import device_class, driver_string
from engine.backends.cuda.elementwise import _MAX_ARGMAX_ROWS, CudaElementwiseOps
from engine.backends.cuda.gemm import CudaGemmOps
from engine.backends.cuda.hybrid import CudaHybridOps
from engine.backends.cuda.prefill import (
    CudaPrefillOps,
)
from engine.backends.cuda.weight import CudaWeight
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
class _Graph:
    cache: weakref.ref
    config: TuningConfig
    graph: Any
    tok_in: Any
    logits: Any
    tok_out: Any
    keep: list = field(default_factory=list)  # every allocation made during capture


class CudaBackend(  # mixins: a module per op family; theirs first, as when they were here
    CudaElementwiseOps,
    CudaDecodeMatmulOps,
    CudaGemmOps,
    CudaAttentionOps,
    CudaHybridOps,
    CudaPrefillOps,
    CudaFloatDecodeOps,
    Backend,
):
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
        return self._track_weight(self._load_weight(qt))

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

    def _held_bytes(self) -> int:
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

    # --- matmul dispatch (the launchers: decode_matmul.py, gemm.py, prefill.py) ---------
    def registry_op(self, op: str, n: int) -> str:
        """Blame's op name: batched DMMV below gemm_min_t, decode/prefill attention kernels."""
        if op == "matmul" and 1 < n < int(self.config.knobs("prefill").gemm_min_t):
            return "matmul_batched"
        if op == "attention":
            return "attention_decode" if n == 1 else "attention_prefill"
        return super().registry_op(op, n)

    def _matmul(self, x: Any, w: CudaWeight) -> Any:
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
        cache.check_room(pos, 1)
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
