"""A NumPy backend whose batched prefill matmul computes like CUDA's default staged GEMM (numeric
class fp16): for chunks of at least ``gemm_min_t`` tokens, activations and dequantized weights
rounded to float16, then a float64 product. A correct variant, not a bug: validate must pass it
under the fp16 budget (tests/engine/verify/test_validate_routing.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.backends.numpy_ref import NumpyBackend
from engine.model import Model
from engine.tuning import TuningConfig
from engine.verify.budgets import NUMERIC_BUDGETS, Budget

GEMM_MIN_T = 32  # CUDA's prefill.gemm_min_t default


class Fp16Prefill(NumpyBackend):
    def _matmul(self, x, w):  # noqa: ANN001, ANN201
        if x.shape[0] < GEMM_MIN_T:
            return super()._matmul(x, w)
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


FP16_TINY = 2.0**-14  # the smallest normal fp16: below it fp16 keeps fewer bits (subnormals)


class Fp16Experts(Fp16Prefill):
    """And the routed experts as CUDA's moe_experts.tc computes them for chunks of at least
    ``gemm_min_t`` tokens: x, the decoded expert rows and the SwiGLU output H rounded to
    float16, the products in float64. ``stats`` (one dict a call) keeps the magnitudes fp16 has
    to hold: max |x|, |g|, |u|, |H|, the fraction of nonzero |H| below fp16's smallest normal,
    and H's rounding error as an NMSE."""

    round_h = True

    def __init__(self, *a, **kw) -> None:  # noqa: ANN002, ANN003
        super().__init__(*a, **kw)
        self.stats: list[dict[str, float]] = []

    def _moe_experts(self, x, ids, weights, gate, up, down):  # noqa: ANN001, ANN201
        if x.shape[0] < GEMM_MIN_T:
            return super()._moe_experts(x, ids, weights, gate, up, down)
        out = np.zeros(x.shape)
        st = {"x": float(np.abs(x).max()), "g": 0.0, "u": 0.0, "h": 0.0}
        tiny = n = err = energy = 0.0
        for e in np.unique(ids):
            rows, slot = np.nonzero(ids == e)
            xe = _r16(x[rows])
            g, u = xe @ _r16(self._expert(gate, e)).T, xe @ _r16(self._expert(up, e)).T
            h = g / (1 + np.exp(-g)) * u
            h16 = _r16(h)
            st["g"], st["u"] = max(st["g"], np.abs(g).max()), max(st["u"], np.abs(u).max())
            st["h"] = max(st["h"], np.abs(h).max())
            tiny += np.count_nonzero((np.abs(h) < FP16_TINY) & (h != 0))
            n, err, energy = n + h.size, err + np.sum((h16 - h) ** 2), energy + np.sum(h * h)
            h = h16 if self.round_h else h
            out[rows] += weights[rows, slot][:, None] * (h @ _r16(self._expert(down, e)).T)
        self.stats.append(
            st | {"h_subnormal_frac": tiny / max(n, 1), "h_round_nmse": err / max(energy, 1e-300)}
        )
        return out.astype(np.float32)


class Fp16ExpertsF32H(Fp16Experts):
    """Fp16Experts with H kept in float32 (the down GEMM's other operand still fp16)."""

    round_h = False


def validate_borrowing(
    model: Model, cand: Any, prompts: list[list[int]], reference: Any = None,
    cache: dict | None = None, steps: int = 4, budgets: dict | None = None, edges: bool = True,
) -> dict:  # fmt: skip
    """validate of ``cand`` (which borrows drift-explained routings over the prompt: engine.hybrid
    route_ref), summed up with the borrowings it made (issue 15's diagnosis of moe_experts.tc)."""
    from engine.verify.validate import validate

    rep = validate(model, cand, prompts, steps, reference=reference, ref_cache=cache,
                   budgets=budgets, edges=edges, blame_failures=False)  # fmt: skip
    return {
        "passed": rep.passed,
        "kld": rep.kld_max,
        "nmse": rep.nmse,
        "reasons": rep.reasons,
        "borrowed": len(rep.routes_borrowed),
        "borrowed_at": [(i, pos, round(g, 4)) for i, pos, g in rep.routes_borrowed],
    }
