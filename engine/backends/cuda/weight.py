"""A weight on the GPU as the CUDA backend holds it (engine/backends/cuda/backend.py loads it;
its op-family mixins read it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
