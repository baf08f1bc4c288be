"""What the agent reports about a run: one log line per trial, the fleet status file the dashboard
reads, a promotion's evidence, and the end-of-run summary (its types are agent.summary's)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from agent.experiment import Experiment
from agent.fleet import INVOCATION_KEYS, Slot, write_status
from agent.fleet import agent_status as agent_status_payload
from agent.records import Confirmation, Outcome, TrialRecord
from agent.stats import RatioEstimate
from agent.study import BASELINE, StudyState
from agent.summary import Overhead, StudySummary
from agent.win import chain_to_baseline, win_line
from engine.verify.sentinel import cache_key
from worker.records import ValidateSummary, same_named

log = logging.getLogger("agent")


def log_trial(exp: Experiment, st: StudyState, rec: TrialRecord) -> None:
    changed = " ".join(f"{k}={b}" for k, (_, b) in rec.changed.items()) or "(baseline config)"
    metrics = " ".join(f"{k}={v:.1f}" for k, v in rec.metrics.items())
    target = rec.estimates.get(exp.acceptance.target)
    ratio = f" x{target.ratio:.3f} [{target.lower:.3f}, {target.upper:.3f}]" if target else ""
    verdict = " ACCEPTED" if rec.accepted else ""
    reason = f" -- {rec.reason.splitlines()[0][:160]}" if rec.reason else ""
    log.info(
        "trial %d [%s] %s %s: %s %s%s%s%s",
        rec.trial,
        st.name,
        rec.worker.worker_id if rec.worker else "",
        changed,
        rec.outcome.value,
        metrics,
        ratio,
        verdict,
        reason,
    )


def write_run_status(
    path: Path,
    exp: Experiment,
    storage: str,
    started: float,
    state: str,
    past_runs: list[dict[str, Any]],
    slots: list[Slot],
    studies: list[StudyState],
    ray_dashboard: str | None,
) -> None:
    """The fleet status file (keys in docs/agent.md), rewritten atomically."""
    agent = agent_status_payload(exp.name, storage, started, state)
    acc = exp.acceptance
    agent.update(
        trial_timeout_s=exp.budget.trial_timeout_s,
        wall_time_s=exp.budget.wall_time_s,
        acceptance={
            "target": acc.target,
            "min_gain": acc.min_gain,
            "confidence": acc.confidence,
        },
        ray_dashboard=ray_dashboard,
    )
    payload = {
        "agent": agent,
        "invocations": [*past_runs, {k: agent[k] for k in INVOCATION_KEYS}],
        "workers": [s.status() for s in slots],
        "studies": [
            {
                "study": st.name,
                "device_class": st.device_class,
                "model": st.model,
                "evaluated": st.evaluated,
                "budget": exp.budget.trials,
                "in_flight": sorted(st.in_flight),
                "best_trial": st.best.trial,
            }
            for st in studies
        ],
    }
    write_status(path, payload)


def evidence(exp: Experiment, storage: str, st: StudyState, rec: TrialRecord) -> dict[str, Any]:
    """What a promoted config's evidence file records about the trial that won."""
    target = exp.acceptance.target
    est = rec.estimates.get(target)
    worker = rec.worker
    return {
        "experiment": exp.name,
        "experiment_file": exp.source,
        "study": st.name,
        "storage": storage,
        "trial": rec.trial,
        "paired_against": rec.paired_against if rec.paired_against is not None else -1,
        "model": st.model,
        "model_family": st.family,
        "device_class": st.device_class,
        "device": rec.device,
        "vendor": worker.vendor if worker else "",
        "driver": rec.driver,
        "host": rec.host,
        "worker": worker.worker_id if worker else "",
        "engine_commit": rec.engine_commit,
        # the drift-sentinel key it was validated under: another one means re-validate
        # (agent.recheck; the worker does it for a promoted baseline)
        "sentinel_key": cache_key(
            st.backend, st.device_class, rec.driver, rec.engine_commit, st.family
        ),
        "promoted_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "baseline_source": st.baseline_source,
        "target": target,
        "ratio": est.ratio if est else 0.0,
        "lower_bound": est.lower if est else 0.0,
        "confidence": exp.acceptance.confidence,
        "min_gain": exp.acceptance.min_gain,
        "aa_noise": rec.decision.noise if rec.decision else 0.0,
        "vs_baseline": vs_baseline(st, rec.trial, target) or {},  # chained (agent.win)
        "changed": {k: {"from": a, "to": b} for k, (a, b) in rec.changed.items()},
        "objectives": {
            name: {**_est_dict(rec.estimates.get(name)), **s.to_dict()}
            for name, s in rec.samples.items()
        },
        "validate": _validate_evidence(rec.validate),
        "confirmation": _confirmation_evidence(rec.confirmation),
        "memory": memory_evidence(rec.memory),
    }


def memory_evidence(m: dict[str, Any] | None) -> dict[str, Any]:
    """The footprint it was measured at (TOML has no null: a missing figure is left out)."""
    if not m:
        return {}
    keys = ("context_tokens", "weight_bytes", "kv_state_bytes", "scratch_bytes", "total_bytes",
            "driver_bytes", "driver", "budget_bytes", "unavailable")  # fmt: skip
    out = {k: m[k] for k in keys if m.get(k) is not None}
    est = m.get("estimate")
    if isinstance(est, dict) and est.get("total_bytes") is not None:
        out["estimated_total_bytes"] = est["total_bytes"]
    return out


def _est_dict(e: RatioEstimate | None) -> dict[str, Any]:
    return e.to_dict() if e else {}


def _validate_evidence(v: ValidateSummary | None) -> dict[str, Any]:
    if not v:
        return {}
    return {
        "passed": v.passed,
        "max_abs_diff": v.max_abs_diff,
        "nmse": v.nmse,
        "kld": v.kld,  # None in records from before teacher-forced validate
        "numeric_classes": list(v.numeric_classes) if v.numeric_classes is not None else None,
        "steps": v.steps,
        "tolerances": dict(v.tolerances),
        "prompts": [
            {
                "prompt_tokens": p.prompt_tokens,
                "max_abs_diff": p.max_abs_diff,
                "nmse": p.nmse,
                "token_agreement": p.token_agreement,
            }
            for p in v.prompts
        ],
    }


def _confirmation_evidence(c: Confirmation | None) -> dict[str, Any]:
    if not c:
        return {"done": False}
    return {
        "done": True,
        "worker": c.worker.worker_id if c.worker else "",
        "host": c.worker.host if c.worker else "",
        "accepted": c.accepted,
        "estimates": {k: e.to_dict() for k, e in c.estimates.items()},
    }


def best_candidate(exp: Experiment, st: StudyState) -> dict[str, Any] | None:
    """The measured candidate with the highest target ratio, and the bar it did not clear."""
    target, best = exp.acceptance.target, None
    for t in st.study.get_trials(deepcopy=False):
        if t.user_attrs.get("outcome") != Outcome.OK or t.user_attrs.get("role") == BASELINE:
            continue
        rec = TrialRecord.from_attrs(st.name, t.number, t.user_attrs)
        est = rec.estimates.get(target)
        if est is None:
            continue
        if best is None or est.ratio > best["ratio"]:
            dec = rec.decision
            best = {
                "trial": t.number,
                "ratio": est.ratio,
                "lower": est.lower,
                "upper": est.upper,
                "threshold": dec.threshold if dec else 1.0 + exp.acceptance.min_gain,
                "noise": dec.noise if dec else 0.0,
                "reason": rec.reason,
            }
    return best


def study_summary(
    exp: Experiment,
    st: StudyState,
    promotion: dict[str, Any] | None,
    promotion_error: str,
) -> StudySummary:
    counts: dict[str, int] = {}
    for t in st.study.get_trials(deepcopy=False):
        k = t.user_attrs.get("outcome")
        if k:
            counts[k] = counts.get(k, 0) + 1
    base_trial = st.baseline_trial()
    is_base = st.best.trial is None or st.best.trial == base_trial
    ratio = lower = against = total = None
    if not is_base and st.best.trial is not None:
        rec = st.trials_record(st.best.trial)
        est = rec.estimates.get(exp.acceptance.target)
        ratio, lower = (est.ratio, est.lower) if est else (None, None)
        against = rec.paired_against
        total = vs_baseline(st, st.best.trial, exp.acceptance.target)
    best_memory = None
    if st.best.trial is not None:
        best_memory = memory_evidence(st.trials_record(st.best.trial).memory) or None
    base = st.baseline
    return StudySummary(
        study=st.name,
        **same_named(st, "device_class", "backend", "model", "family", "evaluated"),
        budget=exp.budget.trials,
        outcomes=counts,
        baseline_source=st.baseline_source,
        best_trial=st.best.trial,
        best_is_baseline=is_base,
        changed={k: [base.get(k), v] for k, v in st.best.config.items() if base.get(k) != v},
        best_metrics=st.best.metrics,
        target=exp.acceptance.target,
        ratio=ratio,
        lower_bound=lower,
        promotion=promotion,
        promotion_error=promotion_error,
        best_candidate=best_candidate(exp, st) if is_base else None,
        warm_start=tuple(st.warm_start),
        start_configs=tuple(st.start_configs),
        best_memory=best_memory,
        paired_against=against,
        vs_baseline=total,
        win=win_line(ratio, lower, against, total, base_trial),
    )


def vs_baseline(st: StudyState, trial: int, target: str) -> dict[str, Any] | None:
    """The trial's chained speedup over the baseline (agent.win), from the study's records."""

    def record(n: int) -> TrialRecord | None:
        try:
            return st.trials_record(n)
        except (IndexError, KeyError, ValueError):
            return None

    return chain_to_baseline(record, trial, target)


def overhead(overheads: list[tuple[float, float]], idle_gaps: list[float]) -> Overhead:
    """Means over the run's trials: (worker wall s, agent+Ray overhead s) pairs, idle gaps."""
    n = len(overheads)
    return Overhead(
        n,
        sum(w for w, _ in overheads) / n if n else 0.0,
        sum(o for _, o in overheads) / n if n else 0.0,
        sum(idle_gaps) / len(idle_gaps) if idle_gaps else 0.0,
    )
