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
    promotion: dict[str, Any] | None  # action: committed | unchanged | already | recorded
    promotion_error: str = ""
    best_candidate: dict[str, Any] | None = None  # when nothing was accepted: the closest miss
    warm_start: tuple[dict[str, Any], ...] = ()  # configs of other classes enqueued first
    start_configs: tuple[str, ...] = ()  # the experiment's [[start]] configs enqueued first
    best_memory: dict[str, Any] | None = None  # the best's measured footprint (agent.report)
    paired_against: int | None = None  # the previous best the best's ratio was measured against
    vs_baseline: dict[str, Any] | None = None  # chained speedup over the baseline (agent.win)
    win: str = ""  # both figures, named (agent.win.win_line)


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
    # trials per GPU-hour (agent.throughput.summary): per worker and over the fleet
    throughput: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["overhead"]["fraction"] = self.overhead.fraction
        return d

    def text(self) -> str:
        lines = [f"experiment {self.experiment}: {len(self.studies)} studies in {self.wall_s:.1f}s"]
        for s in self.studies:
            outs = ", ".join(f"{k} {v}" for k, v in sorted(s.outcomes.items()))
            lines.append(f"  {s.study} ({s.backend}): {s.evaluated}/{s.budget} trials; {outs}")
            if s.start_configs:
                lines.append(f"    start configs tried first: {', '.join(s.start_configs)}")
            if s.warm_start:
                src = ", ".join(sorted({str(w["from"]) for w in s.warm_start}))
                lines.append(f"    warm start: {len(s.warm_start)} configs from {src} tried first")
            if s.best_is_baseline or s.best_trial is None:
                lines.append(f"    {_nothing_accepted(s)}")
            else:
                ch = ", ".join(f"{k}: {a} -> {b}" for k, (a, b) in s.changed.items())
                figures = s.win or f"x{s.ratio:.3f} (lower bound {s.lower_bound:.3f})"
                lines.append(f"    best: trial {s.best_trial} ({ch}); {s.target} {figures}")
            if s.best_memory:
                lines.append(f"    {_memory_line(s.best_memory)}")
            if s.promotion:
                lines += [f"    {line}" for line in _promotion_lines(s.promotion)]
            elif s.promotion_error:
                lines.append(f"    not promoted: {s.promotion_error}")
        o = self.overhead
        lines.append(
            f"  agent+Ray overhead: {o.mean_overhead_s * 1000:.1f} ms per trial of "
            f"{o.mean_trial_s:.2f} s ({o.fraction:.2%}) over {o.trials} trials; workers idle "
            f"{o.mean_idle_s * 1000:.1f} ms between trials"
        )
        if self.throughput.get("trials"):
            lines.append(f"  {_throughput_line(self.throughput)}")
        for w in self.warnings:
            lines.append(f"  warning: {w}")
        lines.append(f"  storage: {self.storage}  fleet status: {self.status_file}")
        return "\n".join(lines)


def _throughput_line(t: dict[str, Any]) -> str:
    per = "; ".join(
        f"{w['worker']} {w['trials_per_hour']:.0f} ({w['trials']} in {w['device_s']:.1f}s)"
        for w in t["workers"]
    )
    return (
        f"trials/h per GPU: {t['trials_per_hour_per_gpu']:.0f} ({per}); "
        f"{t['run_trials_per_hour_per_gpu']:.0f} over the whole run, setup included"
    )


def _nothing_accepted(s: StudySummary) -> str:
    c = s.best_candidate
    if c is None:
        return f"nothing accepted: no candidate measured; the baseline ({s.baseline_source}) stays"
    seen = (
        f"nothing accepted: best candidate trial {c['trial']} {s.target} x{c['ratio']:.3f} "
        f"[{c['lower']:.3f}, {c['upper']:.3f}]"
    )
    if c["lower"] > c["threshold"]:  # it cleared the bar, and something else turned it down
        why = c.get("reason") or "rejected"
        return (
            f"{seen} cleared x{c['threshold']:.3f} but was turned down: {why}; best is the "
            f"baseline ({s.baseline_source})"
        )
    return (
        f"{seen}, its lower bound had to clear x{c['threshold']:.3f} (A/A noise "
        f"{c['noise']:.1%}); best is the baseline ({s.baseline_source})"
    )


def _promotion_lines(p: dict[str, Any]) -> list[str]:
    where = f"{p.get('branch', 'main')} of {p['repo']}"
    commit = str(p.get("commit") or "")[:12]
    action = p.get("action", "committed")
    if action == "already":
        line = f"already promoted: {p['path']} (commit {commit or '-'} is still on {where})"
    elif action == "unchanged":
        line = f"promoted: {p['path']} already held this config on {where}; no new commit"
    elif action == "recorded":
        line = f"promoted: {p['path']} (commit {commit} on {where}, made by an earlier run)"
    else:
        line = f"promoted: {p['path']} (commit {commit} on {where})"
    return [line] + ([f"  ({p['note']})"] if p.get("note") else [])


def _memory_line(m: dict[str, Any]) -> str:
    gib = 2**30
    if m.get("total_bytes") is None:
        return f"memory of the best: not reported ({m.get('unavailable', 'unknown')})"
    budget = m.get("budget_bytes")
    return (
        f"memory of the best: {m['total_bytes'] / gib:.3f} GiB at {m.get('context_tokens')} "
        f"tokens of context"
        + (f" (budget {budget / gib:.3f} GiB)" if budget is not None else " (no budget)")
    )
