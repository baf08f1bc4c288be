"""The dashboard's view of a storage, row by row: the storage opened read-only, the outcome and
verdict names the pages filter by, one ``TrialRow`` per trial (what a table, a count or a plot
needs) and the ``StudyCache`` the Reader keeps per study."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from agent.dashboard.fastread import RawTrial
from agent.records import TrialRecord
from agent.storage import StorageRef
from worker.records import Outcome

FAILED = tuple(o.value for o in Outcome if o.broke)  # ran on a worker and broke
GONE = "gone"  # an agent whose status says running, but that is not (Reader.agent_stale)
OUTCOMES = (*(o.value for o in Outcome), "running", "waiting")  # + the Optuna states shown
VERDICTS = ("baseline", "accepted", "rejected")  # what an ok trial was, as a filter and a color
BUDGET = tuple(o.value for o in Outcome if o.spends_budget)  # spent a trial of the budget
PLAIN = "value"  # the target of a study without agent attrs: Optuna's first value


class NotFound(LookupError):
    """A study or trial that is not in the storage; the message says what is there."""


class StorageMissing(FileNotFoundError):
    """The storage file does not exist: the dashboard never creates one."""


def open_readonly(ref: StorageRef) -> optuna.storages.BaseStorage:
    """The storage behind ``ref`` without creating anything: a missing file raises. SQL storages
    come wrapped in Optuna's cache (``_CachedStorage``), which reads only new and unfinished
    trials on each call."""
    if ref.path is not None and not ref.path.exists():
        raise StorageMissing(
            f"no storage at {ref.path}: run the agent with --storage {ref.url} first, "
            "or give the --storage it used"
        )
    if ref.kind == "journal":
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        return JournalStorage(JournalFileBackend(str(ref.path)))
    kwargs = {"connect_args": {"timeout": 60}} if ref.kind == "sqlite" else None
    rdb = optuna.storages.RDBStorage(ref.url, engine_kwargs=kwargs, skip_table_creation=True)
    return optuna.storages.get_storage(rdb)


def _first_line(text: str, limit: int = 160) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def raw_trial(t: FrozenTrial) -> RawTrial:
    done = t.datetime_complete.timestamp() if t.datetime_complete else 0.0
    values = list(t.values) if t.values else None
    return RawTrial(
        t._trial_id, t.number, t.state, t.params, t.distributions, t.user_attrs, values, done
    )


def _metrics(t: RawTrial, target: str) -> dict[str, float]:
    m = t.user_attrs.get("metrics")
    if isinstance(m, dict):
        return {str(k): float(v) for k, v in m.items()}
    if target == PLAIN and t.values:  # a study not written by the agent: its first value
        return {PLAIN: float(t.values[0])}
    return {}


def _outcome(t: RawTrial) -> str:
    if t.state == TrialState.RUNNING:
        return "running"
    if t.state == TrialState.WAITING:
        return "waiting"
    out = t.user_attrs.get("outcome")
    if isinstance(out, str) and out:
        return out
    return {TrialState.COMPLETE: "ok", TrialState.PRUNED: "duplicate"}.get(t.state, "crash")


@dataclass(frozen=True)
class TrialRow:
    """One line of a study's trials table: what a table, a count or a plot needs, nothing big."""

    number: int
    state: str  # Optuna state: COMPLETE, FAIL, PRUNED, RUNNING, WAITING
    outcome: str
    role: str
    accepted: bool
    reason: str  # first line only
    params: dict[str, Any]
    metrics: dict[str, float]
    ratio: float | None  # paired ratio on the target objective, against the best of its time
    lower: float | None
    upper: float | None
    paired_against: int | None  # trial number of the best it was measured against
    threshold: float | None  # the lower bound had to exceed this to be accepted
    max_abs_diff: float | None
    nmse: float | None
    worker: str
    host: str
    wall_s: float
    started: float  # unix time the worker started it, 0 when unknown
    finished: float  # unix time, 0 while running
    gpu: dict[str, Any] | None  # the device's state the worker sampled after the trial
    memory_bytes: int | None = None  # measured footprint at the served context (None: unknown)

    @property
    def verdict(self) -> str:
        """The outcome a reader wants first: baseline, accepted or rejected for an ok trial."""
        if self.outcome != "ok":
            return self.outcome
        if self.role == "baseline":
            return "baseline"
        return "accepted" if self.accepted else "rejected"

    @classmethod
    def of(cls, t: RawTrial, target: str) -> TrialRow:
        rec = TrialRecord.from_attrs("", t.number, t.user_attrs)  # the typed record, as stored
        est = rec.estimates.get(target)
        val = rec.validate
        return cls(
            number=t.number,
            state=t.state.name,
            outcome=_outcome(t),
            role=rec.role,
            accepted=rec.accepted,
            reason=_first_line(rec.reason),
            params=dict(t.params),
            metrics=_metrics(t, target),
            ratio=est.ratio if est else None,
            lower=est.lower if est else None,
            upper=est.upper if est else None,
            paired_against=rec.paired_against,
            threshold=rec.decision.threshold if rec.decision else None,
            max_abs_diff=val.max_abs_diff if val else None,
            nmse=val.nmse if val else None,
            worker=rec.worker.worker_id if rec.worker else "",
            host=rec.host or (rec.worker.host if rec.worker else ""),
            wall_s=float(rec.wall_s or 0.0),
            started=float(rec.started or 0.0),
            finished=float(rec.finished or t.datetime_complete),
            gpu=rec.gpu or None,
            memory_bytes=(rec.memory or {}).get("total_bytes"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "verdict": self.verdict}


@dataclass
class StudyCache:
    """What the Reader keeps of one study: its attrs and a row per trial, read incrementally."""

    study_id: int
    name: str
    attrs: dict[str, Any]
    directions: list[str]
    rows: list[TrialRow | None] = field(default_factory=list)  # index: trial number
    trial_ids: list[int] = field(default_factory=list)  # index: trial number
    dists: list[dict[str, BaseDistribution]] = field(default_factory=list)
    unfinished: dict[int, int] = field(default_factory=dict)  # trial number -> trial id
    synced: float = 0.0
    n_finished: int = 0  # storage API path: trials below this number are all finished
    last_finished_id: int = -1  # fast path: highest trial id seen finished
    records: dict[int, TrialRecord] = field(default_factory=dict)  # finished trials
    chains: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)

    @property
    def target(self) -> str:
        t = self.attrs.get("target")
        if t:
            return str(t)
        objs = self.attrs.get("objectives") or []
        return str(objs[0]) if objs else PLAIN
