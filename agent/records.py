"""The typed record of one trial, stored as Optuna trial user attrs (JSON values, one attr per
field) so the dashboard and ``python -m agent status`` read it back. Keys: docs/agent.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Outcomes beyond worker.records.Outcome that only the agent gives.
DUPLICATE = "duplicate"  # config already evaluated in this study; pruned without running
INTERRUPTED = "interrupted"  # running when the agent stopped; failed on resume, may run again
# Outcomes that spent a trial of the budget (the candidate ran on a worker).
BUDGET_OUTCOMES = ("ok", "compile_error", "invalid", "crash", "timeout")


@dataclass(frozen=True)
class TrialRecord:
    study: str
    trial: int  # Optuna trial number
    role: str  # "baseline" or "candidate"
    outcome: str  # ok, infeasible, compile_error, invalid, crash, timeout, duplicate, interrupted
    reason: str = ""  # why it failed or was rejected, one line or a compiler log
    config: dict[str, Any] = field(default_factory=dict)  # flat TuningConfig
    changed: dict[str, list[Any]] = field(default_factory=dict)  # key: [baseline, candidate]
    paired_against: int | None = None  # trial number of the best it was measured against
    metrics: dict[str, float] = field(default_factory=dict)  # candidate median per objective
    samples: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    estimates: dict[str, dict[str, float]] = field(default_factory=dict)  # ratio and bounds
    accepted: bool = False
    decision: dict[str, Any] | None = None
    confirmation: dict[str, Any] | None = None  # the second worker's estimates and decision
    validate: dict[str, Any] | None = None  # worst diffs, per-prompt diffs and tokens
    worker: dict[str, Any] | None = None  # worker.records.WorkerInfo as a dict
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

    def user_attrs(self) -> dict[str, Any]:
        """The attrs to store (study and trial number are the trial's own)."""
        d = asdict(self)
        del d["study"], d["trial"]
        return d

    @classmethod
    def from_user_attrs(cls, study: str, trial: int, attrs: dict[str, Any]) -> TrialRecord:
        names = {f.name for f in fields(cls)} - {"study", "trial"}
        return cls(study, trial, **{k: v for k, v in attrs.items() if k in names})
