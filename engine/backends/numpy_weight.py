"""A weight of the NumPy backend: the quantized tensor and, once used, its dequantized copy.
Its own module so that the backend's op mixins (numpy_hybrid) can name it without importing the
backend that includes them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.gguf_model import QTensor


@dataclass
class NumpyWeight:
    qt: QTensor
    f32: np.ndarray | None = None  # dequantized copy, filled on first use when caching

    def dense(self, cache: bool) -> np.ndarray:
        if self.f32 is not None:
            return self.f32
        w = self.qt.dequantize()
        if cache:
            self.f32 = w
        return w
