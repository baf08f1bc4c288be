"""The typed record of one trial, from the worker's result to the dashboard.

Stored as Optuna trial user attrs, one JSON value per field (``to_attrs``), read back typed
(``from_attrs``) by the agent, ``python -m agent status``, the replay tables and the dashboard.
``from_attrs`` reads records stored by older code too: a field missing there takes its default,
a key unknown here is ignored, an outcome string is the one ``Outcome`` enum. Keys: docs/agent.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from agent.stats import RatioEstimate
from worker.records import (
    BUDGET_OUTCOMES,
    FAILED_OUTCOMES,
    Outcome,
    PairedSamples,
    ValidateSummary,
    WorkerInfo,
    known_fields,
)

__all__ = [
    "BUDGET_OUTCOMES",
    "FAILED_OUTCOMES",
    "Confirmation",
    "Outcome",
    "TrialRecord",
    "Verdict",
    "estimate_from_dict",
]


def estimate_from_dict(d: Mapping[str, Any]) -> RatioEstimate:
    kw = known_fields(RatioEstimate, d, ratio=0.0, lower=0.0, upper=0.0, pairs=0, confidence=0.0)
    return RatioEstimate(**kw)


def _estimates(d: Mapping[str, Any] | None) -> dict[str, RatioEstimate]:
    return {k: estimate_from_dict(v) for k, v in (d or {}).items() if isinstance(v, Mapping)}


def _samples(d: Mapping[str, Any] | None) -> dict[str, PairedSamples]:
    items = (d or {}).items()
    return {k: PairedSamples.from_dict(k, v) for k, v in items if isinstance(v, Mapping)}


def _worker(d: Any) -> WorkerInfo | None:
    return WorkerInfo.from_dict(d) if isinstance(d, Mapping) else None


@dataclass(frozen=True)
class Verdict:
    """The acceptance decision recorded for a trial (agent.acceptance.Decision, its estimates
    kept apart in the record's ``estimates``)."""

    accepted: bool
    reason: str = ""
    target: str = ""
    threshold: float = 0.0  # the target's lower bound had to exceed this
    noise: float = 0.0  # the worker's A/A noise on the target

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        return cls(**known_fields(cls, d, accepted=False))


@dataclass(frozen=True)
class Confirmation:
    """A second measurement of an accepted candidate (another worker, or the same one against a
    best that moved): its outcome, decision and estimates."""

    outcome: Outcome
    accepted: bool
    reason: str = ""
    worker: WorkerInfo | None = None
    estimates: dict[str, RatioEstimate] = field(default_factory=dict)
    samples: dict[str, PairedSamples] = field(default_factory=dict)
    paired_against: int | None = None  # the best it was measured against (None: failed)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "worker": self.worker.to_dict() if self.worker else None,
            "outcome": self.outcome.value,
            "accepted": self.accepted,
            "reason": self.reason,
        }
        if self.outcome is Outcome.OK:
            d["estimates"] = {k: e.to_dict() for k, e in self.estimates.items()}
            d["samples"] = {k: s.to_dict() for k, s in self.samples.items()}
            d["paired_against"] = self.paired_against
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Confirmation:
        against = d.get("paired_against")
        return cls(
            outcome=Outcome.of(d.get("outcome", "ok")),
            accepted=bool(d.get("accepted", False)),
            reason=str(d.get("reason", "")),
            worker=_worker(d.get("worker")),
            estimates=_estimates(d.get("estimates")),
            samples=_samples(d.get("samples")),
            paired_against=int(against) if isinstance(against, int | float) else None,
        )


@dataclass(frozen=True)
class TrialRecord:
    study: str
    trial: int  # Optuna trial number
    role: str  # "baseline" or "candidate"
    outcome: Outcome
    reason: str = ""  # why it failed or was rejected, one line or a compiler log
    config: dict[str, Any] = field(default_factory=dict)  # flat TuningConfig
    changed: dict[str, list[Any]] = field(default_factory=dict)  # key: [baseline, candidate]
    paired_against: int | None = None  # trial number of the best it was measured against
    metrics: dict[str, float] = field(default_factory=dict)  # candidate median per objective
    samples: dict[str, PairedSamples] = field(default_factory=dict)
    estimates: dict[str, RatioEstimate] = field(default_factory=dict)  # paired ratio and bounds
    accepted: bool = False
    decision: Verdict | None = None
    confirmation: Confirmation | None = None
    validate: ValidateSummary | None = None
    worker: WorkerInfo | None = None  # where it ran: host, device, driver, engine build
    host: str = ""
    device: str = ""
    driver: str = ""
    engine_commit: str = ""
    started: float = 0.0  # unix time the worker started it
    finished: float = 0.0
    wall_s: float = 0.0  # worker-side seconds
    phase_s: dict[str, float] = field(default_factory=dict)
    overhead_s: float = 0.0  # agent + Ray seconds around it (dispatch, result, ask/tell)
    gpu: dict[str, Any] | None = None  # device state after the run (worker.gpustate), if known
    # a promoted baseline: the sentinel key it was validated under, this worker's, re-validated?
    revalidation: dict[str, Any] | None = None
    # the measured footprint at the served context (worker.memory: EvalResult.memory), or None
    memory: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "outcome", Outcome(self.outcome))  # a str given: the enum

    def estimate(self, objective: str) -> RatioEstimate | None:
        return self.estimates.get(objective)

    def to_attrs(self) -> dict[str, Any]:
        """The attrs to store, JSON values (study and trial number are the trial's own)."""
        d: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("study", "trial"):
                continue
            v = getattr(self, f.name)
            if isinstance(v, Outcome):
                v = v.value
            elif f.name in ("samples", "estimates"):
                v = {k: x.to_dict() for k, x in v.items()}
            elif hasattr(v, "to_dict"):
                v = v.to_dict()
            elif isinstance(v, dict):
                v = dict(v)
            d[f.name] = v
        return d

    @classmethod
    def from_attrs(cls, study: str, trial: int, attrs: Mapping[str, Any]) -> TrialRecord:
        """The record stored as ``attrs`` (by this code or older code: see the module doc). A
        trial with no outcome yet (running, waiting) reads as a crash: callers that show such
        trials take the outcome from the trial's state."""
        kw = known_fields(cls, attrs)
        kw.pop("study", None)
        kw.pop("trial", None)
        kw["role"] = str(kw.get("role", "candidate"))
        kw["outcome"] = Outcome.of(kw.get("outcome"))
        kw["samples"] = _samples(kw.get("samples"))
        kw["estimates"] = _estimates(kw.get("estimates"))
        for name, typ in (("decision", Verdict), ("confirmation", Confirmation)):
            v = kw.get(name)
            kw[name] = typ.from_dict(v) if isinstance(v, Mapping) else None
        v = kw.get("validate")
        kw["validate"] = ValidateSummary.from_dict(v) if isinstance(v, Mapping) else None
        kw["worker"] = _worker(kw.get("worker"))
        against = kw.get("paired_against")
        kw["paired_against"] = int(against) if isinstance(against, int | float) else None
        return cls(study, trial, **kw)
