"""A NumPy backend whose batched prefill matmul computes like CUDA's default staged GEMM (numeric
class fp16): for chunks of at least ``gemm_min_t`` tokens, activations and dequantized weights
rounded to float16, then a float64 product. A correct variant, not a bug: validate must pass it
under the fp16 budget (tests/test_validate_routing.py; scripts/moe_fp16_flip.py)."""

from __future__ import annotations

import numpy as np

from engine.backends.numpy_ref import NumpyBackend
from engine.tuning import TuningConfig
from engine.tuning.registry import NUMERIC_BUDGETS, Budget

GEMM_MIN_T = 32  # CUDA's prefill.gemm_min_t default


class Fp16Prefill(NumpyBackend):
    def matmul(self, x, w):  # noqa: ANN001, ANN201
        if x.shape[0] < GEMM_MIN_T:
            return super().matmul(x, w)
        a = x.astype(np.float16).astype(np.float64)
        b = w.dense(True).astype(np.float16).astype(np.float64)
        return (a @ b.T).astype(np.float32)


def candidate() -> TuningConfig:
    """NumPy's default with CUDA's 512-token prefill chunk (one GEMM per prompt)."""
    return TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 512})


def fp16_budgets() -> dict[str, Budget]:
    """Every class judged by the fp16 budget, the CUDA default's class."""
    return {c: NUMERIC_BUDGETS["fp16"] for c in NUMERIC_BUDGETS}


def _r16(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).astype(np.float16).astype(np.float64)


class Fp16Experts(Fp16Prefill):
    """And the routed experts as CUDA's moe_experts.tc computes them (the default) for chunks of
    at least ``gemm_min_t`` tokens: x, the decoded expert rows and the SwiGLU output rounded to
    float16, the products in float64."""

    def moe_experts(self, x, ids, weights, gate, up, down):  # noqa: ANN001, ANN201
        if x.shape[0] < GEMM_MIN_T:
            return super().moe_experts(x, ids, weights, gate, up, down)
        out = np.zeros(x.shape)
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            xe = _r16(x[rows])
            g, u = xe @ _r16(self._expert(gate, e)).T, xe @ _r16(self._expert(up, e)).T
            h = _r16(g / (1 + np.exp(-g)) * u)
            out[rows] += weights[rows, slot][:, None] * (h @ _r16(self._expert(down, e)).T)
        return out.astype(np.float32)
