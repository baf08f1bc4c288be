"""``python -m agent status``: the studies in a storage, their progress against the budget, their
best trials with both speedups named (agent.win), and the workers of the last agent run (from its
fleet status file; "gone" when it says running but holds no live study lease)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from agent.lease import Holder, holder_of
from agent.records import TrialRecord
from agent.storage import StorageRef
from agent.win import chain_to_baseline, win_line
from worker.records import Outcome


@dataclass(frozen=True)
class StudyRow:
    study: str
    device_class: str
    model: str
    trials: int  # all Optuna trials, duplicates included
    outcomes: dict[str, int]
    best_trial: int | None
    best_metrics: dict[str, float]
    best_changed: dict[str, list[Any]]
    promotion: dict[str, Any] | None
    lease: dict[str, Any] | None = None  # the live agent holding it (agent.lease), else None
    evaluated: int = 0  # trials that spent budget
    budget: int | None = None  # trials per study, as the last agent run had it (status file)
    speedup: dict[str, Any] | None = None  # vs_previous, vs_baseline and the line (agent.win)
    # trials per GPU-hour of its workers over all its runs (agent.throughput.summary)
    throughput: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        outs = ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items()))
        best = (
            "baseline"
            if not self.best_changed
            else ", ".join(f"{k}={b}" for k, (_, b) in self.best_changed.items())
        )
        metrics = " ".join(f"{k}={v:.1f}" for k, v in self.best_metrics.items())
        budget = f"{self.evaluated}/{self.budget}" if self.budget else f"{self.evaluated}"
        line = (
            f"{self.study}: {budget} trials of the budget, {self.trials} in all ({outs}); "
            f"best trial {self.best_trial}: {best}"
        )
        line += f" {metrics}" if metrics else ""
        if self.speedup and self.speedup.get("line"):
            line += f"; {self.speedup['line']}"
        if self.promotion:
            line += (
                f"; promoted {self.promotion.get('path')} @{self.promotion.get('commit', '')[:12]}"
            )
        if self.lease:
            holder = Holder(**self.lease)
            line += f"; in use by {holder.describe()}"
        return line


def study_rows(ref: StorageRef) -> list[StudyRow]:
    storage = ref.open()
    rows = []
    now = time.time()
    budgets = budgets_of(ref)
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        attrs = study.user_attrs
        counts: dict[str, int] = {}
        spans: list[tuple[str, float, float]] = []
        for t in study.get_trials(deepcopy=False):
            a = t.user_attrs
            if a.get("started") and a.get("outcome") not in (None, "duplicate"):
                wid = str((a.get("worker") or {}).get("worker_id", ""))
                spans.append((wid, float(a["started"]), float(a.get("finished") or 0.0)))
            k = t.user_attrs.get("outcome") or (
                "running" if t.state == TrialState.RUNNING else t.state.name.lower()
            )
            counts[k] = counts.get(k, 0) + 1
        best = attrs.get("best") or {}
        base = (attrs.get("baseline") or {}).get("config", {})
        cfg = best.get("config", base)
        holder = holder_of(storage, study._study_id)
        evaluated = sum(
            Outcome.of(k).spends_budget for t in study.trials if (k := t.user_attrs.get("outcome"))
        )
        rows.append(
            StudyRow(
                study=s.study_name,
                device_class=str(attrs.get("device_class", "")),
                model=str(attrs.get("model", "")),
                trials=len(study.trials),
                outcomes=counts,
                best_trial=best.get("trial"),
                best_metrics=best.get("metrics", {}),
                best_changed={k: [base.get(k), v] for k, v in cfg.items() if base.get(k) != v},
                promotion=attrs.get("promotion"),
                lease=asdict(holder) if holder and not holder.dead(now) else None,
                evaluated=evaluated,
                budget=budgets.get(s.study_name),
                speedup=_speedup(study, attrs, best.get("trial")),
                throughput=_throughput(spans),
            )
        )
    return rows


def _speedup(study: optuna.Study, attrs: dict[str, Any], best: int | None) -> dict[str, Any] | None:
    """The best's two figures (agent.win), None while the best is the baseline."""
    target = str(attrs.get("target") or "")
    trials = study.get_trials(deepcopy=False)

    def record(n: int) -> TrialRecord | None:
        if not 0 <= n < len(trials):
            return None
        return TrialRecord.from_attrs(study.study_name, n, trials[n].user_attrs)

    rec = record(best) if isinstance(best, int) else None
    est = rec.estimates.get(target) if rec else None
    if rec is None or rec.role == "baseline" or est is None:
        return None
    total = chain_to_baseline(record, rec.trial, target)
    return {
        "target": target,
        "vs_previous": {"trial": rec.paired_against, **est.to_dict()},
        "vs_baseline": total,
        "line": win_line(est.ratio, est.lower, rec.paired_against, total),
    }


def fleet_status(ref: StorageRef, rows: list[StudyRow]) -> dict[str, Any]:
    """The last agent run's state and workers, from its fleet status file ({} when none): its
    state reads "gone" when it says running but holds no live lease on its studies."""
    try:
        data = json.loads(ref.status_path.read_text())
    except (OSError, ValueError):
        return {}
    agent = dict(data.get("agent") or {})
    if agent.get("state") == "running" and not any(
        r.lease and r.lease.get("pid") == agent.get("pid") for r in rows
    ):
        agent["reported_state"], agent["state"] = agent["state"], "gone"
    keys = ("worker_id", "device_class", "backend", "state", "current", "restarts", "trials_done")
    workers = []
    for w in data.get("workers") or []:
        info = w.get("info") or {}
        out = {k: w.get(k) for k in keys}
        out |= {"device": info.get("device_name", ""), "host": info.get("host", "")}
        if agent.get("state") == "gone" and out["state"] != "dead":
            out["reported_state"], out["state"] = out["state"], "unknown"
        workers.append(out)
    return {
        "agent": {k: agent.get(k) for k in ("host", "pid", "experiment", "state", "updated")},
        "workers": workers,
    }


def budgets_of(ref: StorageRef) -> dict[str, int]:
    """Each study's budget as the last agent run wrote it in its fleet status file."""
    try:
        data = json.loads(ref.status_path.read_text())
    except (OSError, ValueError):
        return {}
    return {
        str(s.get("study")): int(s["budget"])
        for s in data.get("studies") or []
        if isinstance(s.get("budget"), int)
    }


def _throughput(spans: list[tuple[str, float, float]]) -> dict[str, Any]:
    from agent.throughput import per_gpu, rates

    workers = rates(spans)
    return {
        "trials_per_hour_per_gpu": round(per_gpu(workers), 1),
        "trials": sum(w.trials for w in workers),
        "workers": [w.to_dict() for w in workers],
    }
