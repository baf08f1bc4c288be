"""The op contract every backend implements.

Shapes: T tokens in a chunk, C model width, N output rows of a weight, K its input
width,
H query heads, Hkv key/value heads, D head dimension, V vocabulary, S KV-cache capacity.

A backend owns its tensors (``Tensor`` is opaque to the model: a NumPy array, a CuPy array, a
Vulkan buffer). The model code in ``engine.model`` only calls the methods below, so a new backend
is a new subclass; ``tests/test_backend_ops.py`` runs every op of every backend against NumPy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.device_info import DeviceInfo

if TYPE_CHECKING:
    from collections.abc import Callable

    from engine.gguf_model import QTensor
    from engine.tuning import TuningConfig

Tensor = Any
Weight = Any

__all__ = ["Backend", "DeviceInfo", "KVCache", "Tensor", "Weight"]  # DeviceInfo: re-exported


@dataclass
class KVCache:
    """Per-layer K and V storage of ``capacity`` positions: k[layer], v[layer] are [S, Hkv, D]."""

    k: list[Tensor]
    v: list[Tensor]
    capacity: int


class Backend(ABC):
    """One device, one tuning config. Ops return new tensors unless documented otherwise."""

    name: str = "abstract"

    def __init__(self, config: TuningConfig | None = None) -> None:
        from engine.tuning import TuningConfig

        self.config = config if config is not None else TuningConfig.default(self.name)

    # --- device and memory -------------------------------------------------------------
    @abstractmethod
    def device_info(self) -> DeviceInfo: ...

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
        return KVCache(
            k=[self.upload(zeros) for _ in range(n_layers)],
            v=[self.upload(zeros) for _ in range(n_layers)],
            capacity=capacity,
        )

    # --- ops ----------------------------------------------------------------------------
    @abstractmethod
    def embedding(self, table: Weight, ids: Tensor) -> Tensor:
        """ids [T] int32 -> rows of table [T, C] (dequantized)."""

    @abstractmethod
    def rms_norm(self, x: Tensor, w: Weight, eps: float) -> Tensor:
        """Normalize over the last dim and scale by w: x [..., D], w [D]."""

    @abstractmethod
    def matmul(self, x: Tensor, w: Weight) -> Tensor:
        """x [T, K] @ dequant(w)[N, K]^T -> [T, N]. T == 1 is decode (DMMV); T > 1 is a batched
        prefill chunk of at most config.prefill_chunk columns."""

    @abstractmethod
    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """a + b, with b either a tensor of the same shape (residual) or a 1-D Weight [N]
        broadcast over rows (bias)."""

    @abstractmethod
    def rope(self, x: Tensor, pos0: int, theta: float, neox: bool) -> Tensor:
        """Rotary embedding of x [T, H, D] at positions pos0 .. pos0+T-1.
        neox pairs (i, i + D/2); normal pairs (2i, 2i + 1)."""

    @abstractmethod
    def kv_write(self, cache: KVCache, layer: int, k: Tensor, v: Tensor, pos0: int) -> None:
        """Store k, v [T, Hkv, D] at positions pos0 .. pos0+T-1 of layer's cache (in place)."""

    @abstractmethod
    def attention(self, q: Tensor, cache: KVCache, layer: int, pos0: int) -> Tensor:
        """Causal GQA attention: q [T, H, D] at positions pos0+t attends to cache positions
        0 .. pos0+t with scale 1/sqrt(D) -> [T, H, D]."""

    @abstractmethod
    def swiglu(self, gate: Tensor, up: Tensor) -> Tensor:
        """silu(gate) * up, elementwise."""

    @abstractmethod
    def argmax(self, logits: Tensor) -> Tensor:
        """logits [T, V] -> [T] int32 on the device; the sampler downloads this, never a copy
        kept from an earlier step."""

    def registry_op(self, op: str, n: int) -> str:
        """The registry op that runs schedule op ``op`` on n tokens (validate's blame names it);
        backends whose dispatch differs (CUDA: batched DMMV below gemm_min_t) override this."""
        if op == "matmul":
            return "matmul_decode" if n == 1 else "matmul_prefill"
        return op

    # --- helpers shared by backends -----------------------------------------------------
    def reshape(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """A view with a new shape (row-major, same element count)."""
        return x.reshape(shape)

    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Rows start..stop-1 of a [T, ...] tensor."""
        return x[start:stop]
