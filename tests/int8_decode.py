"""A NumPy backend whose decode-row matmuls compute like CUDA's int8 decode kernels (mmvq, mmvw;
numeric class int8_activations): for one token, the activation row of a block-type weight is
rounded to Q8_1 as q8.cu does it (per 32 values d = max|x| / 127, q = round(x / d)), then a
float64 product with the dequantized weight; with ``prefill`` every row (mmq8), with
``experts`` the routed experts' input and SwiGLU output (moe_q8.cu); ``float_ssm_in`` keeps a
delta-net layer's input projections float (matmul_decode.float_ssm_in). Float weights (routers)
stay float. A correct variant, not a bug: CUDA's int8 paths should match it to float noise
(tests/engine/backends/cuda/test_cuda_hybrid.py); validate judges the rounding itself
(tests/engine/test_hybrid.py)."""

from __future__ import annotations

import numpy as np

from engine.backends.numpy_ref import NumpyBackend

BLOCK_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"})  # mmvw.cu's


def q8_round_trip(a: np.ndarray) -> np.ndarray:
    """Rows of a [T, K] (K % 32 == 0) through Q8_1 and back, in float64."""
    b = np.asarray(a, np.float64).reshape(a.shape[0], -1, 32)
    d = np.abs(b).max(-1, keepdims=True) / 127
    return (np.round(b / np.where(d > 0, d, 1)) * d).reshape(a.shape)


class Int8Decode(NumpyBackend):
    int8 = True  # off: the plain NumPy reference (one backend serves both runs)
    prefill = False  # on: prefill rows too (matmul_prefill.mmq8 with gemm_min_t = 2)
    experts = False  # on: the routed experts too (moe_experts.mmvq: x and the SwiGLU output)
    float_ssm_in = False  # on: delta-net input projections float (matmul_decode.float_ssm_in)

    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        qt = w.qt
        rows = x.shape[0] == 1 or self.prefill
        if not (self.int8 and rows and qt.qtype in BLOCK_TYPES and len(qt.shape) == 2):
            return super()._matmul(x, w)
        return (q8_round_trip(x) @ w.dense(True).astype(np.float64).T).astype(np.float32)

    def _ssm_in(self, x, ws):  # noqa: ANN001, ANN201
        if self.float_ssm_in:
            return tuple(NumpyBackend._matmul(self, x, w) for w in ws)
        return super()._ssm_in(x, ws)

    def _moe_experts(self, x, ids, weights, gate, up, down):  # noqa: ANN001, ANN201
        if not (self.int8 and self.experts):
            return super()._moe_experts(x, ids, weights, gate, up, down)
        out = np.zeros(x.shape, np.float64)
        xq = q8_round_trip(x)
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            g = xq[rows] @ self._expert(gate, e).astype(np.float64).T
            h = g / (1 + np.exp(-g)) * (xq[rows] @ self._expert(up, e).astype(np.float64).T)
            y = q8_round_trip(h) @ self._expert(down, e).astype(np.float64).T
            out[rows] += weights[rows, slot][:, None] * y
        return out.astype(np.float32)


class Int8Candidate(Int8Decode):
    """Int8Decode's rounding only under the candidate's ``matmul_decode.ondemand`` (as the
    mutation suite plants decode-path bugs): one backend then serves validate's float reference
    (cached_f32) and the int8 candidate, also in op-level replay, which switches between the two
    configs. It declares what it computes: the block-type matmuls as int8_activations, so
    validate judges them (and only them) under that class."""

    @property
    def int8(self) -> bool:  # type: ignore[override]
        return self.config.op("matmul_decode").variant == "ondemand"

    def numeric_classes(self, config):  # noqa: ANN001, ANN201
        out = super().numeric_classes(config)
        if config.op("matmul_decode").variant == "ondemand":
            out["matmul_decode"] = "int8_activations"
            if self.prefill:
                out["matmul_prefill"] = "int8_activations"
            if self.experts:
                out["moe_experts"] = "int8_activations"
        return out


INT8_CANDIDATE = {"matmul_decode.variant": "ondemand"}  # the flat knob that turns it on
