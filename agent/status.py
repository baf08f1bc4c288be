"""``python -m agent status``: the studies in a storage, their progress and best trials."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from agent.lease import Holder, holder_of
from agent.storage import StorageRef


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
        line = f"{self.study}: {self.trials} trials ({outs}); best trial {self.best_trial}: {best}"
        line += f" {metrics}" if metrics else ""
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
                throughput=_throughput(spans),
            )
        )
    return rows


def _throughput(spans: list[tuple[str, float, float]]) -> dict[str, Any]:
    from agent.throughput import per_gpu, rates

    workers = rates(spans)
    return {
        "trials_per_hour_per_gpu": round(per_gpu(workers), 1),
        "trials": sum(w.trials for w in workers),
        "workers": [w.to_dict() for w in workers],
    }
