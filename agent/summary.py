"""The end-of-run summary: per study what ran, what won, what was promoted; and the agent's
overhead per trial. Printed as text, or as JSON with ``run --json``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class StudySummary:
    study: str
    device_class: str
    backend: str
    model: str
    family: str
    evaluated: int
    budget: int
    outcomes: dict[str, int]  # outcome -> count, duplicates included
    baseline_source: str
    best_trial: int | None
    best_is_baseline: bool
    changed: dict[str, list[Any]]  # best vs baseline: key -> [baseline, best]
    best_metrics: dict[str, float]
    target: str
    ratio: float | None  # best vs the best before it, as accepted
    lower_bound: float | None
    promotion: dict[str, Any] | None
    promotion_error: str = ""
    warm_start: tuple[dict[str, Any], ...] = ()  # configs of other classes enqueued first


@dataclass(frozen=True)
class Overhead:
    """Agent + Ray seconds per trial against the worker's own seconds per trial."""

    trials: int
    mean_trial_s: float
    mean_overhead_s: float
    mean_idle_s: float = 0.0  # worker clock: gap between one evaluation's end and the next start

    @property
    def fraction(self) -> float:
        return self.mean_overhead_s / self.mean_trial_s if self.mean_trial_s else 0.0


@dataclass(frozen=True)
class RunSummary:
    experiment: str
    storage: str
    status_file: str
    ray: str  # "embedded" or "cluster"
    wall_s: float
    studies: tuple[StudySummary, ...]
    workers: tuple[dict[str, Any], ...]
    overhead: Overhead
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["overhead"]["fraction"] = self.overhead.fraction
        return d

    def text(self) -> str:
        lines = [f"experiment {self.experiment}: {len(self.studies)} studies in {self.wall_s:.1f}s"]
        for s in self.studies:
            outs = ", ".join(f"{k} {v}" for k, v in sorted(s.outcomes.items()))
            lines.append(f"  {s.study} ({s.backend}): {s.evaluated}/{s.budget} trials; {outs}")
            if s.warm_start:
                src = ", ".join(sorted({str(w["from"]) for w in s.warm_start}))
                lines.append(f"    warm start: {len(s.warm_start)} configs from {src} tried first")
            if s.best_is_baseline or s.best_trial is None:
                lines.append(f"    best: the baseline ({s.baseline_source}); nothing accepted")
            else:
                ch = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in s.changed.items())
                lines.append(
                    f"    best: trial {s.best_trial} ({ch}); {s.target} x{s.ratio:.3f} "
                    f"(lower bound {s.lower_bound:.3f})"
                )
            if s.promotion:
                p = s.promotion
                commit = p.get("commit") or "unchanged"
                lines.append(f"    promoted: {p['path']} (commit {commit[:12]} in {p['repo']})")
            elif s.promotion_error:
                lines.append(f"    not promoted: {s.promotion_error}")
        o = self.overhead
        lines.append(
            f"  agent+Ray overhead: {o.mean_overhead_s * 1000:.1f} ms per trial of "
            f"{o.mean_trial_s:.2f} s ({o.fraction:.2%}) over {o.trials} trials; workers idle "
            f"{o.mean_idle_s * 1000:.1f} ms between trials"
        )
        for w in self.warnings:
            lines.append(f"  warning: {w}")
        lines.append(f"  storage: {self.storage}  fleet status: {self.status_file}")
        return "\n".join(lines)
