"""Blame: the first op whose activations differ between a candidate and a reference run.

Both runs go over the same token stream (the reference's greedy continuation, teacher forced)
with the model's activation hook on (engine.model.Model.hook). The reference's outputs are kept
per (op, label, layer) and token position; each candidate output is compared as it is produced,
in the candidate's execution order, and the first one whose NMSE exceeds the numeric class's
``op_nmse`` is the blamed op: where the difference starts, before it spreads downstream.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from engine.model import Model
from engine.tuning import TuningConfig


@dataclass(frozen=True)
class Blame:
    op: str  # registry op, e.g. matmul_prefill
    variant: str
    params: dict[str, Any]
    label: str  # the schedule's name of this use, e.g. ffn_up
    layer: int  # -1: outside the layers (embedding, output norm, LM head)
    token: int  # token position with the largest |diff|
    column: int  # flat column of that row
    abs_diff: float
    nmse: float

    def __str__(self) -> str:
        knobs = ", ".join([self.variant, *(f"{k} {v}" for k, v in self.params.items())])
        where = f"layer {self.layer} " if self.layer >= 0 else ""
        return (
            f"{self.op} ({knobs}) {where}{self.label}: token {self.token} column {self.column} "
            f"|diff| {self.abs_diff:.3g} (NMSE {self.nmse:.3g})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "text": str(self)}


def _knobs(model: Model, op: str, n: int) -> tuple[str, dict[str, Any]]:
    cfg = model.config
    try:
        choice = cfg.op(op)
    except Exception:  # noqa: BLE001 - an op the config does not name (schedule-only)
        return "default", {}
    params = choice.as_dict()
    if n > 1 and op.startswith("matmul"):
        params = {**params, "chunk_tokens": cfg.prefill_chunk}
    return choice.variant, params


class _Recorder:
    """Reference side: every op output, one row per token position."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.rows: dict[tuple[str, str, int], dict[int, np.ndarray]] = {}

    def __call__(self, op: str, label: str, layer: int, t: Any, pos0: int) -> None:
        a = self.model.backend.download(t)
        a = a.reshape(a.shape[0], -1).astype(np.float64)
        store = self.rows.setdefault((op, label, layer), {})
        for j in range(a.shape[0]):
            store[pos0 + j] = a[j]


class _Comparer:
    """Candidate side: compare each op output with the reference rows; keep the first miss."""

    def __init__(self, model: Model, ref: _Recorder, op_nmse: float) -> None:
        self.model, self.ref, self.op_nmse = model, ref, op_nmse
        self.first: Blame | None = None

    def __call__(self, op: str, label: str, layer: int, t: Any, pos0: int) -> None:
        if self.first is not None:
            return
        store = self.ref.rows.get((op, label, layer))
        if store is None:
            return
        c = self.model.backend.download(t)
        n = c.shape[0]
        c = c.reshape(n, -1).astype(np.float64)
        keep = [j for j in range(n) if pos0 + j in store]
        if not keep:
            return
        r = np.stack([store[pos0 + j] for j in keep])
        c = c[keep]
        bad = ~np.isfinite(c)
        diff = np.where(bad, np.inf, np.abs(np.nan_to_num(c) - r))
        denom = max(float(np.sum(r * r)), 1e-30)
        nmse = float(np.sum(np.where(bad, np.inf, diff * diff)) / denom)
        if not nmse > self.op_nmse:
            return
        row, col = np.unravel_index(int(np.argmax(diff)), diff.shape)
        reg = self.model.backend.registry_op(op, n)
        variant, params = _knobs(self.model, reg, n)
        self.first = Blame(
            reg, variant, params, label, layer, pos0 + keep[row], int(col),
            float(diff[row, col]), nmse,
        )  # fmt: skip


def blame(
    reference: Model,
    candidate: Model,
    prompt: list[int],
    steps: int,
    op_nmse: float,
    ref_path: str = "per_token",
    cand_path: str = "batched",
    ref_config: TuningConfig | None = None,
    cand_config: TuningConfig | None = None,
) -> Blame | None:
    """The first op (in the candidate's execution order) whose output differs from the
    reference's by more than ``op_nmse``; None when every op agrees (the difference is then in
    something the hook does not see, e.g. a replayed decode graph or the device argmax).
    Each model runs on the given config (else its current one; the two may be one Model);
    hooks are removed afterwards."""
    if ref_config is not None:
        reference.set_config(ref_config)
    rec = _Recorder(reference)
    reference.hook = rec
    try:
        every = frozenset(range(len(prompt)))
        ref = reference.forced_run(prompt, steps, ref_path, sample=every, graphs=False)
    finally:
        reference.hook = None
    if cand_config is not None:
        candidate.set_config(cand_config)
    cmp = _Comparer(candidate, rec, op_nmse)
    candidate.hook = cmp
    try:
        candidate.forced_run(prompt, steps, cand_path, forced=ref.tokens, graphs=False)
    finally:
        candidate.hook = None
    return cmp.first
