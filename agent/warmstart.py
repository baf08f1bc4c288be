"""Warm start: a new study of an experiment on one device class first tries the best configs
that the same experiment found on other classes (same backend, so the knobs mean the same).

The sources are the other studies in the storage (their accepted best, then their fastest ok
trials by the target metric); each config inside this study's space is enqueued once, after the
baseline. A GPU differs from another, but the shapes that win on one are good first guesses on
the next: docs/agent.md ("Warm start") has the replay figures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from agent.records import Outcome, TrialRecord
from agent.space import SearchSpace, config_key

TOP_K = 3  # configs taken from each other study


@dataclass(frozen=True)
class WarmConfig:
    source: str  # the study (or table) it came from
    trial: int | None  # its trial number there (None: from a table)
    config: dict[str, Any]
    metric: float | None = None  # its target metric there

    def to_dict(self) -> dict[str, Any]:
        return {"from": self.source, "trial": self.trial, "metric": self.metric}


def from_storage(
    storage: optuna.storages.BaseStorage,
    experiment: str,
    backend: str,
    device_class: str,
    target: str,
    k: int = TOP_K,
) -> list[WarmConfig]:
    """The best configs of the experiment's studies on other device classes of ``backend``."""
    out: list[WarmConfig] = []
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        ua = s.user_attrs
        if ua.get("experiment") != experiment or ua.get("backend") != backend:
            continue
        if ua.get("device_class") == device_class:
            continue
        study = optuna.load_study(study_name=s.study_name, storage=storage)
        picked: list[WarmConfig] = []
        best = ua.get("best")
        if best and best.get("config") != (ua.get("baseline") or {}).get("config"):
            metric = (best.get("metrics") or {}).get(target)
            picked.append(WarmConfig(s.study_name, best.get("trial"), dict(best["config"]), metric))
        ranked = []
        for t in study.get_trials(deepcopy=False):
            if t.user_attrs.get("outcome") != Outcome.OK or "config" not in t.user_attrs:
                continue
            rec = TrialRecord.from_attrs(s.study_name, t.number, t.user_attrs)
            value = rec.metrics.get(target)
            if value is not None:
                ranked.append((float(value), t.number, rec.config))
        for value, number, cfg in sorted(ranked, key=lambda r: -r[0]):
            picked.append(WarmConfig(s.study_name, number, dict(cfg), value))
        out += _unique(picked)[:k]
    return out


def enqueue(
    study: optuna.Study,
    space: SearchSpace,
    baseline: Mapping[str, Any],
    found: Iterable[WarmConfig],
    role: str,
) -> list[WarmConfig]:
    """Enqueue each config that is inside ``space`` and is not the baseline; returns those."""
    done = {config_key(baseline)}
    out = []
    for w in found:
        params = space.params_of(w.config)
        key = config_key({**baseline, **w.config})
        if params is None or key in done:
            continue
        done.add(key)
        study.enqueue_trial(params, user_attrs={"role": role, "warm_start": w.to_dict()})
        out.append(w)
    return out


def _unique(items: list[WarmConfig]) -> list[WarmConfig]:
    seen, out = set(), []
    for w in items:
        key = config_key(w.config)
        if key not in seen:
            seen.add(key)
            out.append(w)
    return out
