"""The reference path against NumPy: a bug in a kernel both of validate's paths share (the default
rms_norm, RoPE, a dequant) or a driver regression passes validate, which compares a candidate with
the same backend's reference path; only an independent implementation sees it. Used by
``engine validate --cross-check`` and the drift sentinel (engine.verify.sentinel)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from engine.model import Model
from engine.models import build_model
from engine.tuning import TuningConfig
from engine.verify.blame import Blame, blame
from engine.verify.budgets import REFERENCE_BUDGET, Budget
from engine.verify.validate import ValidateReport, judge


def cross_check_numpy(
    model: Model, prompts: list[list[int]], steps: int = 4, budget: Budget | None = None
) -> dict[str, Any]:
    """This backend's reference path (per-token, default config) against the NumPy backend,
    teacher forced like validate: {passed, worst kld/nmse/max_abs_diff, reasons, blame}. The
    reference must compute the model: a bug in a kernel both of validate's paths share, or a
    driver regression, shows only here."""
    from engine.backends.numpy_ref import NumpyBackend

    default = TuningConfig.default(model.backend.name)
    budget = budget or REFERENCE_BUDGET
    np_model = build_model(model.gguf, NumpyBackend())
    reasons: list[str] = []
    worst = {"kld": 0.0, "nmse": 0.0, "max_abs_diff": 0.0}
    failing: list[int] | None = None
    model.set_config(default)
    for p in prompts:
        ref = np_model.forced_run(p, steps, "per_token", sample=frozenset(range(len(p))))
        got = model.forced_run(p, steps, "per_token", forced=ref.tokens)
        positions = sorted(got.logits)
        stats, why, *_ = judge(ref, got, positions, budget)
        for k in worst:
            worst[k] = max(worst[k], max(getattr(s, k) for s in stats))
        if why:
            reasons += [f"prompt of {len(p)} tokens: {w}" for w in why]
            if failing is None or len(p) < len(failing):
                failing = p
    out: dict[str, Any] = {"passed": not reasons, **worst, "reasons": reasons, "blame": None}
    if failing is not None:
        found = blame(np_model, model, failing, steps, budget.op_nmse, cand_path="per_token")
        out["blame"] = found.to_dict() if found else None
    return out


def apply_cross_check(rep: ValidateReport, cross: dict[str, Any]) -> ValidateReport:
    """Fold cross_check_numpy's verdict into ``rep``: a reference path that disagrees with NumPy
    cannot vouch for anything, so the candidate fails, and the blame is the cross-check's (the
    kernel both paths share, the first op off against NumPy), not validate's (which, comparing
    two paths that both run the faulty kernel, named the candidate's own kernel)."""
    rep.cross_check = cross
    if not cross["passed"]:
        rep.passed = False
        found = cross.get("blame")
        if found:
            rep.blame = Blame(**{f.name: found[f.name] for f in fields(Blame)})
    return rep
