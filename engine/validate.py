"""Validate: does a candidate config compute the same model as the reference path?

Candidate: batched prefill + decode with the candidate config. Reference: per-token prefill +
decode with the registry-default config, on the same backend (optionally cross-checked against
the NumPy backend). Compared per prompt: last-token logits (max |diff|, NMSE, NaN/Inf counts)
and the greedy tokens of N decode steps. A fast path that changes a sampled token is a different
model, so token agreement is required by default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from engine.model import Generation, Model
from engine.tuning import TuningConfig

# Fixed prompts: a short one, one longer than small prefill chunks (several chunks, a ragged last
# chunk), code, and a single character (one-token prompts exercise the T == 1 prefill edge).
PROMPTS = (
    "The capital of France is",
    "In 1889 the Eiffel Tower was completed for the World's Fair in Paris. At 330 metres it was "
    "the tallest man-made structure in the world for four decades, and engineers still study "
    "how its wrought-iron lattice spreads the wind load. Visitors climb 674 steps to the second "
    "floor, or take one of the lifts that were themselves an engineering feat of the time; the "
    "top floor offers a view that, on a clear day, reaches more than seventy kilometres.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\nprint([fibonacci(i) for i in range(10)])",
    "A",
)


@dataclass(frozen=True)
class Tolerances:
    """Defaults admit fp16 activation rounding in tensor-core GEMMs (measured on the 7B shape:
    max |diff| up to 0.017, NMSE up to 1.0e-5, every greedy token equal) and nothing coarser:
    a dropped chunk column or a stale argmax misses them by orders of magnitude."""

    max_abs_diff: float = 5e-2
    nmse: float = 2e-5
    min_token_agreement: float = 1.0  # fraction of greedy steps that must match, in order


@dataclass
class PromptResult:
    prompt_tokens: int
    max_abs_diff: float
    argmax_index: int  # where the largest difference is
    nmse: float
    nan: int
    inf: int
    reference_tokens: list[int]
    candidate_tokens: list[int]
    token_agreement: float  # length of the matching prefix / steps
    passed: bool
    reasons: list[str] = field(default_factory=list)


@dataclass
class ValidateReport:
    passed: bool
    backend: str
    device_class: str
    candidate: dict[str, Any]
    tolerances: dict[str, float]
    steps: int
    prompts: list[PromptResult]
    cross_check: dict[str, float] | None = None

    @property
    def max_abs_diff(self) -> float:
        return max((p.max_abs_diff for p in self.prompts), default=0.0)

    @property
    def nmse(self) -> float:
        return max((p.nmse for p in self.prompts), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["max_abs_diff"], d["worst_nmse"] = self.max_abs_diff, self.nmse
        return d


def compare_logits(ref: np.ndarray, cand: np.ndarray) -> tuple[float, int, float, int, int]:
    """(max |diff|, its index, NMSE, NaN count, Inf count) of candidate against reference."""
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    nan, inf = int(np.isnan(cand64).sum()), int(np.isinf(cand64).sum())
    diff = np.abs(np.nan_to_num(cand64 - ref64, nan=np.inf, posinf=np.inf, neginf=np.inf))
    idx = int(np.argmax(diff))
    nmse = float(np.sum((cand64 - ref64) ** 2) / max(np.sum(ref64 * ref64), 1e-30))
    return float(diff[idx]), idx, nmse if np.isfinite(nmse) else float("inf"), nan, inf


def agreement(ref: list[int], cand: list[int]) -> float:
    n = 0
    for a, b in zip(ref, cand, strict=False):
        if a != b:
            break
        n += 1
    return n / max(len(ref), 1)


def validate(
    model: Model,
    candidate: TuningConfig,
    prompts: list[list[int]],
    steps: int = 8,
    tol: Tolerances = Tolerances(),
    reference: TuningConfig | None = None,
    ref_cache: dict[Any, Generation] | None = None,
) -> ValidateReport:
    """Run candidate and reference on each tokenized prompt; leaves the model on the candidate.

    ``ref_cache`` (one dict per loaded model, kept by the caller) holds reference runs by
    (reference config, prompt, steps): the per-token reference is the slow half of a validate
    and does not change between candidates. A reference computed before any candidate ran is
    also the safer one: a candidate that corrupted device state cannot bend it."""
    reference = reference or TuningConfig.default(candidate.backend)
    ref_runs, cand_runs = [], []
    ref_key = tuple(sorted(reference.flat().items()))
    on_reference = False
    for p in prompts:
        key = (ref_key, tuple(p), steps)
        run = ref_cache.get(key) if ref_cache is not None else None
        if run is None:
            if not on_reference:
                model.set_config(reference)
                on_reference = True
            run = model.generate(p, steps, path="per_token")
            if ref_cache is not None:
                ref_cache[key] = run
        ref_runs.append(run)
    model.set_config(candidate)
    for p in prompts:
        cand_runs.append(model.generate(p, steps, path="batched"))
    results = []
    for p, r, c in zip(prompts, ref_runs, cand_runs, strict=True):
        mad, idx, nmse, nan, inf = compare_logits(r.last_logits, c.last_logits)
        agree = agreement(r.tokens, c.tokens)
        reasons = []
        if nan or inf:
            reasons.append(f"{nan} NaN and {inf} Inf in candidate logits")
        if mad > tol.max_abs_diff:
            reasons.append(f"max_abs_diff {mad:.3g} > {tol.max_abs_diff:g} at index {idx}")
        if nmse > tol.nmse:
            reasons.append(f"NMSE {nmse:.3g} > {tol.nmse:g}")
        if agree < tol.min_token_agreement:
            reasons.append(
                f"greedy tokens agree on {agree:.0%} of {steps} steps "
                f"(reference {r.tokens}, candidate {c.tokens})"
            )
        results.append(
            PromptResult(
                len(p), mad, idx, nmse, nan, inf, r.tokens, c.tokens, agree, not reasons, reasons
            )
        )
    dev = model.backend.device_info()
    return ValidateReport(
        all(r.passed for r in results),
        candidate.backend,
        dev.device_class,
        candidate.flat(),
        asdict(tol),
        steps,
        results,
    )


def cross_check_numpy(model: Model, prompts: list[list[int]]) -> dict[str, float]:
    """Reference path of this backend against the NumPy reference backend: worst max |diff| and
    NMSE of last-token logits (the reference itself must compute the model)."""
    from engine.backends.numpy_ref import NumpyBackend

    ref_model = Model(model.gguf, NumpyBackend())
    model.set_config(TuningConfig.default(model.backend.name))
    worst = {"max_abs_diff": 0.0, "nmse": 0.0}
    for p in prompts:
        a = ref_model.generate(p, 0, path="per_token").last_logits
        b = model.generate(p, 0, path="per_token").last_logits
        mad, _, nmse, _, _ = compare_logits(a, b)
        worst["max_abs_diff"] = max(worst["max_abs_diff"], mad)
        worst["nmse"] = max(worst["nmse"], nmse)
    return worst


def tokenize_prompts(tokenizer: Any, texts: tuple[str, ...] = PROMPTS) -> list[list[int]]:
    return [tokenizer.encode(t) for t in texts]
