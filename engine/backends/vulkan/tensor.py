"""The Vulkan backend's tensors and weights: views of pooled device buffers (engine/backends/
vulkan/memory.py) that VulkanBackend (backend.py) and its op-family mixins make and read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from engine.backends.vulkan.memory import Buffer, Lease


class VkTensor:
    """A float32 or int32 tensor: ``shape`` elements from element ``offset`` of a buffer."""

    __slots__ = ("lease", "offset", "shape", "dtype")

    def __init__(self, lease: Lease, offset: int, shape: tuple[int, ...], dtype: Any) -> None:
        self.lease = lease
        self.offset = offset
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)

    @property
    def buf(self) -> Buffer:
        return self.lease.buf

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def reshape(self, shape: tuple[int, ...]) -> VkTensor:
        shape = tuple(shape)
        if -1 in shape:
            known = math.prod(s for s in shape if s != -1)
            shape = tuple(self.size // known if s == -1 else s for s in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        return VkTensor(self.lease, self.offset, shape, self.dtype)

    def __getitem__(self, idx: slice) -> VkTensor:
        if not isinstance(idx, slice) or idx.step not in (None, 1):
            raise TypeError("VkTensor supports only contiguous row slices t[a:b]")
        start, stop, _ = idx.indices(self.shape[0])
        stop = max(stop, start)
        row = math.prod(self.shape[1:])
        return VkTensor(
            self.lease, self.offset + start * row, (stop - start, *self.shape[1:]), self.dtype
        )

    def __repr__(self) -> str:
        return f"VkTensor({self.shape}, {self.dtype}, buffer {self.buf.id} + {self.offset})"


@dataclass
class VkWeight:
    """A weight on the device: raw GGML rows in ranges (parts) or, for 1-D weights, float32."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    row_bytes: int = 0
    parts: list[tuple[Lease, int, int]] = field(default_factory=list)  # (lease, row0, nrows)
    f32: VkTensor | None = None
    # matmul_prefill.resident: the fp16 copy [N, Kp] in row ranges (lease, row0, nrows), made
    # at the first prefill GEMM (engine/backends/vulkan/resident.py)
    f16: list[tuple[Lease, int, int]] | None = None

    @property
    def nbytes(self) -> int:
        f16 = sum(p[0].buf.size for p in self.f16 or ())
        return sum(p[0].buf.size for p in self.parts) + (self.f32.buf.size if self.f32 else 0) + f16
