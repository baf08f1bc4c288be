"""The device contract every backend implements.

A backend is one device and one tuning config. Its contract: the devices it can open
(``list_devices``, ``open``, ``device_info``, ``close``), tensors and weights (``upload``,
``download``, ``load_weight``, ``synchronize``), the config (``set_config``), memory
(``memory_report`` and its helpers), profiling, the verifier's hooks, and the model's
layers: the model hands ``trunk`` a layer plan (engine/backends/plan.py), and which ops run
fused is the backend's own pass (engine/backends/fusion.py).

The op set is its own interface, ``backend.ops`` (engine/backends/ops.py states each op); a
backend implements op X as ``_X``. ``Tensor`` is opaque to the model (a NumPy array, a CuPy
array, a Vulkan buffer), so a new backend is a new subclass;
``tests/engine/backends/test_backend_ops.py`` runs every op of every backend against NumPy.
"""

from __future__ import annotations

import time
import weakref
from abc import ABC, abstractmethod
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.cache import HybridCache, KVCache
from engine.backends.fusion import FusionPass
from engine.backends.ops import Ops
from engine.device_info import DeviceEntry, DeviceInfo, MemoryReport, ProfileReport

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.errors import UnsupportedError
    from engine.gguf_model import QTensor
    from engine.tuning import TuningConfig

Tensor = Any
Weight = Any

# DeviceInfo and the reports: re-exported
__all__ = [
    "Backend",
    "DeviceEntry",
    "DeviceInfo",
    "HybridCache",
    "KVCache",
    "MemoryReport",
    "ProfileReport",
    "Tensor",
    "Weight",
]

# The ops the NumPy wall-clock profiler times (Backend.set_profiling's default).
PROFILED_OPS = (
    "embedding", "rms_norm", "matmul", "add", "rope", "kv_write", "attention", "swiglu",
    "argmax", "rope_partial", "sigmoid_mul", "ssm_conv", "ssm_gates", "delta_net",
    "router_topk", "moe_experts",
)  # fmt: skip


class _Live:
    """Objects still alive, by identity (weights and caches are unhashable dataclasses)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}

    def add(self, obj: Any) -> None:
        key = id(obj)
        self._refs[key] = weakref.ref(obj, lambda _r, k=key: self._refs.pop(k, None))

    def __iter__(self) -> Any:
        return iter([o for o in (r() for r in list(self._refs.values())) if o is not None])


POISON_BYTE = 0xFF


def _unsupported(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Marks the base's default of an optional op (it raises UnsupportedError): Ops.has."""
    fn.unsupported = True  # type: ignore[attr-defined]
    return fn


def host_scratch(shape: tuple[int, ...], dtype: Any, poison: bool) -> np.ndarray:
    """np.empty, or under validate (``Backend.poison``) filled with POISON_BYTE."""
    out = np.empty(shape, dtype)
    if poison:
        out.reshape(-1).view(np.uint8).fill(POISON_BYTE)
    return out


class Backend(FusionPass, ABC):
    """One device, one tuning config. Ops return new tensors unless documented otherwise.

    The device contract, the same on every backend: ``list_devices()`` (what this machine has,
    without opening anything), ``open(index)`` (one of them), ``device_info()``,
    ``memory_report()``, ``set_profiling(on)`` / ``profile()``, and ``close()`` (idempotent;
    also on leaving a ``with`` block). A subclass's constructor takes ``device=`` (an index
    from its list, None: its own default choice)."""

    name: str = "abstract"
    # validate sets it for its runs: new outputs and scratch come filled with POISON_BYTE (a NaN
    # as float32, -1 as int32), so an element no kernel wrote is caught every time, not when
    # the memory it read happened to hold a losing value (an argmax leaving a slice unwritten
    # was caught 1 time in 5). Backends fill at allocation; nothing else reads it.
    poison: bool = False

    def __init__(self, config: TuningConfig | None = None) -> None:
        from engine.tuning import TuningConfig

        self.config = config if config is not None else TuningConfig.default(self.name)

    # --- the device contract -----------------------------------------------------------
    @classmethod
    @abstractmethod
    def list_devices(cls) -> list[DeviceEntry]:
        """The devices this backend can open here, by index; BackendUnavailable when its
        library or driver is missing."""

    @classmethod
    def open(cls, index: int | None = None, config: TuningConfig | None = None) -> Backend:
        """Open device ``index`` of ``list_devices()`` (None: the backend's default choice);
        ConfigError naming the valid indices when there is no such device."""
        return cls(config, device=index)  # type: ignore[call-arg]

    @staticmethod
    def _check_index(backend: str, index: int | None, count: int) -> int:
        from engine.errors import ConfigError

        i = 0 if index is None else index
        if not 0 <= i < count:
            raise ConfigError(
                f"{backend} device {index}: no such device; "
                + (f"choose an index 0..{count - 1}" if count else "this machine has none")
            )
        return i

    @abstractmethod
    def device_info(self) -> DeviceInfo: ...

    def close(self) -> None:  # noqa: B027 - optional: backends holding no device need nothing
        """Release the device (the backend cannot be used afterwards); idempotent."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- memory report: weights and caches are tracked as they are made ----------------
    def _tracked(self, what: str) -> _Live:
        live = self.__dict__.get(what)
        if live is None:
            live = self.__dict__[what] = _Live()
        return live

    def _track_weight(self, w: Weight) -> Weight:
        """Count a loaded weight in ``memory_report`` while it lives (load_weight calls it)."""
        self._tracked("_live_weights").add(w)
        return w

    def track_cache(self, cache: KVCache) -> KVCache:
        """Count a KV cache / recurrent state in ``memory_report`` while it lives."""
        self._tracked("_live_caches").add(cache)
        return cache

    def _weight_nbytes(self, w: Weight) -> int:
        """Bytes a weight holds on the device (overridden where a weight is not ``.nbytes``)."""
        return int(w.nbytes)

    def _held_bytes(self) -> int | None:
        """Every byte the backend holds on its device (pools included), or None when it holds
        nothing beyond weights and caches (scratch is then reported as 0)."""
        return None

    def memory_report(self) -> MemoryReport:
        """Weights, KV/state and scratch bytes held on the device now."""
        weights = sum(self._weight_nbytes(w) for w in self._tracked("_live_weights"))
        kv = 0
        for c in self._tracked("_live_caches"):
            parts = [*c.k, *c.v, *getattr(c, "conv", []), *getattr(c, "ssm", [])]
            kv += sum(int(t.nbytes) for t in parts if t is not None)
        held = self._held_bytes()
        return MemoryReport(weights, kv, max(0, held - weights - kv) if held is not None else 0)

    def release_unused(self) -> None:  # noqa: B027 - optional: nothing kept beyond use
        """Free what the current config does not use: copies kept for another config's
        variants, pooled or cached blocks nobody holds (engine.footprint measures after it, so
        a footprint is the config's own, not what a paired bench left behind)."""

    def driver_memory(self) -> tuple[int | None, str]:
        """The driver's own figure of device memory in use (bytes, what it counts), or (None,
        why there is none): a check on ``memory_report``, which counts what the backend made."""
        return None, f"{self.name}: no driver figure (the backend's own count only)"

    # --- profile: wall clock per op by default; GPU backends time their kernels ----------
    def set_profiling(self, on: bool = True) -> None:
        """Start (or stop) timing; ``profile()`` reports what was timed. The default times each
        contract op by the host's wall clock (exact for synchronous backends: NumPy)."""
        ops = self.ops
        for op in PROFILED_OPS:
            ops.__dict__.pop(op, None)  # drop the timed wrappers of an earlier call
        self.__dict__.setdefault("_wall", {})
        if not on:
            return
        for op in PROFILED_OPS:
            setattr(ops, op, self._timed_op(op, getattr(ops, op)))

    def _timed_op(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        wall: dict[str, list[float]] = self.__dict__["_wall"]
        depth = self.__dict__.setdefault("_wall_depth", [0])

        def timed(*args: Any, **kw: Any) -> Any:
            if depth[0]:  # an op inside an op (MoE's matmuls): counted in the outer one
                return fn(*args, **kw)
            depth[0] += 1
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kw)
            finally:
                depth[0] -= 1
            name = self.registry_op(op, int(args[0].shape[0])) if op == "matmul" else op
            entry = wall.setdefault(name, [0, 0.0])
            entry[0] += 1
            entry[1] += 1e3 * (time.perf_counter() - t0)
            return out

        return timed

    def profile(self, reset: bool = True) -> ProfileReport:
        """Time per kernel since profiling started or the last reset, slowest first."""
        wall = self.__dict__.setdefault("_wall", {})
        rep = ProfileReport.of("wall", wall)
        if reset:
            wall.clear()
        return rep

    # --- tensors ------------------------------------------------------------------------

    @abstractmethod
    def upload(self, a: np.ndarray) -> Tensor:
        """Copy a host array (float32 or int32) to the device."""

    @abstractmethod
    def download(self, t: Tensor) -> np.ndarray:
        """Copy a device tensor to the host (synchronizes)."""

    @abstractmethod
    def load_weight(self, qt: QTensor) -> Weight:
        """Put a quantized weight on the device, still quantized (the NumPy backend may cache
        a dequantized copy)."""

    def synchronize(self) -> None:  # noqa: B027 - optional: synchronous backends need nothing
        """Wait for all queued work (no-op for synchronous backends)."""

    def set_config(self, config: TuningConfig) -> None:
        """Switch kernel variants and parameters; weights stay loaded. Backends that compile
        kernels per parameter set override this to (re)build them, raising KernelCompileError."""
        if config.backend != self.name:
            from engine.errors import ConfigError

            raise ConfigError(f"config is for backend {config.backend!r}, not {self.name!r}")
        self.config = config

    def decode_step(
        self,
        step: Callable[[Tensor, int], tuple[Tensor, Tensor]],
        tok: Tensor,
        pos: int,
        cache: KVCache,
    ) -> tuple[Tensor, Tensor]:
        """One decode step: ``step(tok, pos)`` -> (logits [1, V], next token [1]). Optional hook:
        a backend may capture the step once per cache and replay it (CUDA graphs); the default
        just calls it."""
        return step(tok, pos)

    def new_kv_cache(self, n_layers: int, capacity: int, n_head_kv: int, head_dim: int) -> KVCache:
        shape = (capacity, n_head_kv, head_dim)
        zeros = np.zeros(shape, np.float32)
        cache = KVCache(
            k=[self.upload(zeros) for _ in range(n_layers)],
            v=[self.upload(zeros) for _ in range(n_layers)],
            capacity=capacity,
        )
        return self.track_cache(cache)

    # --- the op set: ``self.ops`` (engine/backends/ops.py states each op) calls these -------
    @cached_property
    def ops(self) -> Ops:
        """The op set on this backend's device (engine/backends/ops.py)."""
        return Ops(self)

    @abstractmethod
    def _embedding(self, table: Weight, ids: Tensor) -> Tensor: ...

    @abstractmethod
    def _rms_norm(self, x: Tensor, w: Weight, eps: float) -> Tensor: ...

    @abstractmethod
    def _matmul(self, x: Tensor, w: Weight) -> Tensor: ...

    @abstractmethod
    def _add(self, a: Tensor, b: Tensor) -> Tensor: ...

    @abstractmethod
    def _rope(self, x: Tensor, pos0: int, theta: float, neox: bool) -> Tensor: ...

    @abstractmethod
    def _kv_write(self, cache: KVCache, layer: int, k: Tensor, v: Tensor, pos0: int) -> None: ...

    @abstractmethod
    def _attention(self, q: Tensor, cache: KVCache, layer: int, pos0: int) -> Tensor: ...

    @abstractmethod
    def _swiglu(self, gate: Tensor, up: Tensor) -> Tensor: ...

    @abstractmethod
    def _argmax(self, logits: Tensor) -> Tensor: ...

    # projections of one activation: one matmul each unless a backend batches them
    def _matmuls(self, x: Tensor, ws: tuple[Weight, ...]) -> tuple[Tensor, ...]:
        return tuple(self.ops.matmul(x, w) for w in ws)

    def _ssm_in(self, x: Tensor, ws: tuple[Weight, ...]) -> tuple[Tensor, ...]:
        return self.ops.matmuls(x, ws)

    # the hybrid and MoE ops are optional: a backend without them cannot load such a model
    # (HybridModel checks ``ops.has``, which reads the ``unsupported`` mark, at load) and says
    # so at the first op
    def _no_hybrid(self, op: str) -> UnsupportedError:
        from engine.errors import UnsupportedError

        return UnsupportedError(f"backend {self.name!r} has no {op} op: hybrid models need it")

    @_unsupported
    def _rope_partial(self, x: Tensor, pos0: int, theta: float, n_rot: int) -> Tensor:
        raise self._no_hybrid("rope_partial")

    @_unsupported
    def _sigmoid_mul(self, gate: Tensor, x: Tensor) -> Tensor:
        raise self._no_hybrid("sigmoid_mul")

    @_unsupported
    def _ssm_conv(self, x: Tensor, state: Tensor, w: Weight) -> Tensor:
        raise self._no_hybrid("ssm_conv")

    @_unsupported
    def _ssm_gates(self, a: Tensor, b: Tensor, dt_bias: Weight, ssm_a: Weight) -> tuple:
        raise self._no_hybrid("ssm_gates")

    @_unsupported
    def _delta_net(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        state: Tensor,
        v_order: str,
        eps: float,
    ) -> Tensor:
        raise self._no_hybrid("delta_net")

    @_unsupported
    def _router_topk(self, logits: Tensor, k: int) -> tuple:
        raise self._no_hybrid("router_topk")

    @_unsupported
    def _moe_experts(
        self, x: Tensor, ids: Tensor, weights: Tensor, gate: Weight, up: Weight, down: Weight
    ) -> Tensor:
        raise self._no_hybrid("moe_experts")

    # views and slices: array semantics by default (NumPy, CuPy); Vulkan overrides them
    def _reshape(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        return x.reshape(shape)

    def _rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        return x[start:stop]

    def _cols(self, x: Tensor, start: int, stop: int) -> Tensor:
        return x[..., start:stop].copy()

    # --- the verifier's hooks -----------------------------------------------------------
    def registry_op(self, op: str, n: int) -> str:
        """The registry op that runs schedule op ``op`` on n tokens (validate's blame names it);
        backends whose dispatch differs (CUDA: batched DMMV below gemm_min_t) override this."""
        if op == "matmul":
            return "matmul_decode" if n == 1 else "matmul_prefill"
        return op

    def numeric_classes(self, config: TuningConfig) -> dict[str, str]:
        """{registry op: numeric class} of config's variants, as validate and its op-level replay
        judge them: the registry's declarations (a test backend that emulates other arithmetic,
        tests/int8_decode.py, declares it here)."""
        from engine.tuning.registry import REGISTRY

        return REGISTRY.numeric_classes(config)

    def row_stats(self, t: Tensor, ref: Tensor, ref_host: np.ndarray) -> Any:
        """Op-level replay's comparison of t [n, ...] with ``ref`` (``ref_host`` on the device)
        per row: [4, n] float64 of sum (t - ref)^2, sum ref^2, max |t - ref| and its column.
        Here on the host; a backend may compute it where the tensors are and hand back a
        device array without waiting: ``stats_host`` downloads many of them at once."""
        return host_row_stats(self.download(t), ref_host)

    def stats_host(self, stats: list[Any]) -> list[np.ndarray]:
        """row_stats' results on the host, in order (one transfer where the backend can)."""
        return [np.asarray(s) for s in stats]

    def hook_bypassed_fusions(self, config: TuningConfig) -> list[str]:
        """Registry ops of config whose fused kernels only the unhooked schedule runs (blame's
        hooked replay runs the plain ops, so it cannot see a fault in them); [] by default."""
        return []


def host_row_stats(out: np.ndarray, ref_host: np.ndarray) -> np.ndarray:
    """row_stats on the host of an op's output [n, ...] against the reference's rows."""
    n = int(out.shape[0])
    c = np.asarray(out).reshape(n, -1).astype(np.float64)
    return row_stats_of(np, c, np.asarray(ref_host).reshape(n, -1).astype(np.float64))


def row_stats_of(xp: Any, c: Any, r: Any) -> Any:
    """row_stats with array module ``xp`` (numpy or cupy) on float64 [n, w] rows."""
    d = c - r
    a = xp.abs(d)
    return xp.stack([(d * d).sum(axis=1), (r * r).sum(axis=1), a.max(axis=1), a.argmax(axis=1)])
