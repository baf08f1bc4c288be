"""What the dashboard shows, read from the agent's storage and fleet status file, never written.

``Reader`` opens the Optuna storage read-only (no table creation; a missing file is an error, not a
new empty storage) and keeps one incremental cache per study: a small ``TrialRow`` per trial,
built once when the trial finishes (finished trials never change), so a page of a 10,000-trial
study costs a slice of a list, not a load of every trial's attrs. Only unfinished trials and new
ones are read again, at most once per ``refresh_s``.

The shapes read here are the agent's (docs/agent.md): study user attrs ``experiment``,
``device_class``, ``backend``, ``model``, ``family``, ``objectives``, ``target``, ``baseline``,
``best``, ``promotion``; trial user attrs are an ``agent.records.TrialRecord``; the fleet status
file is ``agent.fleet.write_status``'s ``{"agent", "workers", "studies"}``. Every key is optional
here, so studies written by hand or by an older agent still show.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import os
import socket
import threading
import time
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from agent.dashboard import gitlog
from agent.dashboard.fastread import FastReader, RawTrial
from agent.records import TrialRecord
from agent.storage import StorageRef, parse_storage
from agent.throughput import worker_rate
from agent.win import Link, cumulative
from worker.records import Outcome

log = logging.getLogger(__name__)

FAILED = tuple(o.value for o in Outcome if o.broke)  # ran on a worker and broke
GONE = "gone"  # an agent whose status says running, but that is not (Reader.agent_stale)
OUTCOMES = (*(o.value for o in Outcome), "running", "waiting")  # + the Optuna states shown
VERDICTS = ("baseline", "accepted", "rejected")  # what an ok trial was, as a filter and a color
BUDGET = tuple(o.value for o in Outcome if o.spends_budget)  # spent a trial of the budget
PLAIN = "value"  # the target of a study without agent attrs: Optuna's first value
IMPORTANCE_MIN_TRIALS = 10  # below this, a caveat instead of a ranking of noise
IMPORTANCE_MAX_TRIALS = 2000  # importances from the most recent ok trials, so it answers in seconds


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


def _raw(t: FrozenTrial) -> RawTrial:
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
class _StudyCache:
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


class Reader:
    """Read-only view of one storage and its fleet status file, cached per study."""

    def __init__(self, storage_url: str, refresh_s: float = 1.0) -> None:
        self.ref = parse_storage(storage_url)
        self.storage = open_readonly(self.ref)
        self.fast: FastReader | None = None
        backend = getattr(self.storage, "_backend", None)
        if isinstance(backend, optuna.storages.RDBStorage):
            try:
                self.fast = FastReader(backend)
            except Exception as e:  # noqa: BLE001 - the storage API still works, only slower
                log.info("dashboard: reading trials through the storage API (%s)", e)
        self.refresh_s = refresh_s
        self._lock = threading.RLock()
        self._studies: dict[str, _StudyCache] = {}
        self._listed = 0.0
        self._importances: dict[tuple[str, int], dict[str, Any]] = {}
        self._gitlog: dict[tuple[str, str, str], list[dict[str, Any]]] = {}

    # --- studies --------------------------------------------------------------------------
    def check_storage(self) -> None:
        """Raise ``StorageMissing`` when the storage file is gone (SQLite keeps reading an
        unlinked file through its open handle: without this the pages would freeze silently)."""
        if self.ref.path is not None and not self.ref.path.exists():
            raise StorageMissing(
                f"the storage {self.ref.path} is gone (deleted or moved while the dashboard "
                "ran); the pages show what was read before"
            )

    def _list(self) -> None:
        if time.monotonic() - self._listed < self.refresh_s and self._studies:
            return
        self.check_storage()
        found = {}
        for s in self.storage.get_all_studies():
            c = self._studies.get(s.study_name)
            if c is None or c.study_id != s._study_id:
                c = _StudyCache(s._study_id, s.study_name, {}, [])
            c.attrs = dict(s.user_attrs)
            c.directions = [d.name.lower() for d in s.directions]
            found[s.study_name] = c
        self._studies = found
        self._listed = time.monotonic()

    def _sync(self, c: _StudyCache, force: bool = False) -> _StudyCache:
        if not force and time.monotonic() - c.synced < self.refresh_s:
            return c
        if self.fast is not None:
            try:
                self._sync_fast(c)
            except Exception as e:  # noqa: BLE001 - fall back to the storage API for good
                log.warning("dashboard: fast read failed (%s); using the storage API", e)
                self.fast = None
                for k in list(self._studies):
                    old = self._studies[k]
                    self._studies[k] = _StudyCache(
                        old.study_id, old.name, old.attrs, old.directions
                    )
                c = self._studies.get(c.name, c)
        if self.fast is None:
            self._sync_api(c)
        c.synced = time.monotonic()
        return c

    def _put(self, c: _StudyCache, t: RawTrial) -> None:
        n = t.number
        if n >= len(c.rows):
            grow = n + 1 - len(c.rows)
            c.rows.extend([None] * grow)
            c.trial_ids.extend([-1] * grow)
            c.dists.extend([{}] * grow)
        c.rows[n] = TrialRow.of(t, c.target)
        c.trial_ids[n] = t.trial_id
        c.dists[n] = t.distributions
        if t.state.is_finished():
            c.unfinished.pop(n, None)
        else:
            c.unfinished[n] = t.trial_id

    def _sync_fast(self, c: _StudyCache) -> None:
        assert self.fast is not None
        for t in self.fast.read(c.study_id, c.last_finished_id, set(c.unfinished.values())):
            self._put(c, t)
            if t.state.is_finished():
                c.last_finished_id = max(c.last_finished_id, t.trial_id)

    def _sync_api(self, c: _StudyCache) -> None:
        trials = self.storage.get_all_trials(c.study_id, deepcopy=False)
        for t in trials[c.n_finished :]:
            n = t.number
            if n < len(c.rows) and c.rows[n] is not None and n not in c.unfinished:
                continue
            self._put(c, _raw(t))
        # Trials before the first unfinished one are final: later syncs start after them.
        c.n_finished = min(c.unfinished, default=len(trials))

    def warm(self) -> None:
        """Read every study's trials once (the cold load), logging rather than raising."""
        try:
            for name in self.study_names():
                self._study(name)
        except Exception:  # noqa: BLE001 - a page request will raise it with context
            log.exception("warming the dashboard cache failed")

    def study_names(self) -> list[str]:
        with self._lock:
            self._list()
            return sorted(self._studies)

    def _study(self, name: str) -> _StudyCache:
        with self._lock:
            self._list()
            c = self._studies.get(name)
            if c is None:
                known = ", ".join(sorted(self._studies)[:10]) or "none"
                raise NotFound(f"no study named {name!r} in {self.ref.display} (studies: {known})")
            return self._sync(c)

    def stamp(self, name: str | None = None) -> str:
        """Changes whenever something a page shows changes (for live refresh)."""
        with self._lock:
            self._list()
            names = [name] if name else sorted(self._studies)
            parts = []
            for n in names:
                c = self._study(n)
                parts.append(
                    f"{n}:{len(c.rows)}:{len(c.unfinished)}:{c.n_finished}:{c.last_finished_id}"
                )
                parts.append(json.dumps(c.attrs.get("best"), sort_keys=True, default=str))
            fleet = self.ref.status_path
            parts.append(str(fleet.stat().st_mtime_ns) if fleet.exists() else "-")
            return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]

    def summary(self, name: str) -> dict[str, Any]:
        """Counts, baseline, best and the chained paired speedup of one study (no trial rows).
        ``counts`` by outcome, and ``verdicts`` (ok split into baseline / accepted / rejected)
        plus the other outcomes, add up to ``trials``."""
        c = self._study(name)
        rows = [r for r in c.rows if r is not None]
        counts = dict.fromkeys(OUTCOMES, 0)
        verdicts: dict[str, int] = {}
        for r in rows:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
            verdicts[r.verdict] = verdicts.get(r.verdict, 0) + 1
        target = c.target
        baseline = next((r for r in rows if r.role == "baseline" and r.outcome == "ok"), None)
        best_attr = c.attrs.get("best") or None
        base_n = baseline.number if baseline else None
        best_trial = best_attr.get("trial") if best_attr else base_n
        best_metrics = (
            dict(best_attr.get("metrics") or {})
            if best_attr
            else (dict(baseline.metrics) if baseline else {})
        )
        base_metrics = baseline.metrics if baseline else {}
        median_ratio = None  # unpaired: medians measured at different times, shown nowhere
        if target in best_metrics and base_metrics.get(target):
            median_ratio = best_metrics[target] / base_metrics[target]
        chain = self._chain(c, best_trial)
        thresholds = [r.threshold for r in rows if r.threshold and r.role != "baseline"]
        return {
            "name": c.name,
            "experiment": c.attrs.get("experiment", c.name.split("/")[0]),
            "device_class": c.attrs.get("device_class", ""),
            "backend": c.attrs.get("backend", ""),
            "model": c.attrs.get("model", ""),
            "family": c.attrs.get("family", ""),
            "objectives": list(c.attrs.get("objectives") or []),
            "directions": c.directions,
            "target": target,
            "trials": len(rows),
            "evaluated": sum(counts[k] for k in BUDGET),
            "done": counts["ok"],
            "accepted": verdicts.get("accepted", 0),
            "rejected": verdicts.get("rejected", 0),
            "failed": sum(counts[k] for k in FAILED),
            "invalid": counts["invalid"],
            "running": counts["running"] + counts["waiting"],
            "counts": {k: v for k, v in counts.items() if v},
            "verdicts": {k: verdicts[k] for k in (*VERDICTS, *OUTCOMES) if verdicts.get(k)},
            "baseline_trial": baseline.number if baseline else None,
            "baseline_source": (c.attrs.get("baseline") or {}).get("source", ""),
            "baseline_metrics": base_metrics,
            "best_trial": best_trial,
            "best_metrics": best_metrics,
            "best_is_baseline": best_trial is not None
            and baseline is not None
            and best_trial == baseline.number,
            "speedup": chain["ratio"] if chain["complete"] else None,
            "speedup_lower": chain["lower"] if chain["complete"] else None,
            "speedup_upper": chain["upper"] if chain["complete"] else None,
            "chain": chain,
            "win": self._win(c, chain, base_n),
            "median_ratio_unpaired": median_ratio,
            "threshold_min": min(thresholds) if thresholds else None,
            "threshold_max": max(thresholds) if thresholds else None,
            "promoted": bool(c.attrs.get("promotion") or c.attrs.get("promotions")),
        }

    # --- the chained paired speedup -------------------------------------------------------
    def _record(self, c: _StudyCache, number: int) -> TrialRecord:
        """A finished trial's full record, read once (finished trials never change)."""
        rec = c.records.get(number)
        if rec is None:
            attrs = self.storage.get_trial(c.trial_ids[number]).user_attrs
            rec = TrialRecord.from_attrs(c.name, number, attrs)
            if number not in c.unfinished:
                c.records[number] = rec
        return rec

    def _link(self, c: _StudyCache, row: TrialRow) -> tuple[int | None, dict[str, Any]]:
        """(the best this accepted trial was measured against, the estimate against it). When
        the best moved before a confirmation ran, the confirmation measured it against the newer
        best: that is the link to follow."""
        est = {"ratio": row.ratio, "lower": row.lower, "upper": row.upper, "source": "trial"}
        conf = self._record(c, row.number).confirmation
        if conf is not None and conf.paired_against is not None:
            if conf.paired_against != row.paired_against:
                e = conf.estimates.get(c.target)
                return conf.paired_against, {**(e.to_dict() if e else {}), "source": "confirmation"}
        return row.paired_against, est

    def _win(self, c: _StudyCache, chain: dict[str, Any], baseline: int | None) -> str:
        """Both figures of the best, named (agent.win): its last link (the ratio acceptance
        decided on, against the previous best) and the chained speedup over the baseline."""
        from agent.win import win_line

        if not chain["links"]:
            return ""
        last = chain["links"][-1]
        total = chain if chain["complete"] else None
        return win_line(last["ratio"], last["lower"], last["against"], total, baseline)

    def _chain(self, c: _StudyCache, best: int | None) -> dict[str, Any]:
        """The best's speedup over the baseline as the product of the paired ratios along the
        chain baseline -> each accepted best -> ``best``, with an interval: each link's
        [lower, upper] read as a normal interval on the log ratio, the links' variances added
        (independent measurements)."""
        key = (best, c.n_finished, c.last_finished_id, len(c.rows))
        got = c.chains.get(key)
        if got is not None:
            return got
        out = _chain_of(self, c, best)
        c.chains = {key: out}
        return out

    def studies(self) -> list[dict[str, Any]]:
        return [self.summary(n) for n in self.study_names()]

    # --- trials ---------------------------------------------------------------------------
    def trials(
        self,
        name: str,
        page: int = 1,
        per_page: int = 50,
        outcome: str | None = None,
        sort: str = "-number",
    ) -> dict[str, Any]:
        """One page of the trials table, newest first by default; ``outcome``: an outcome, a
        verdict (accepted, rejected, baseline) or ``failed``; ``sort``: number, -number, metric
        or -metric (the target objective), ratio or -ratio."""
        c = self._study(name)
        rows = [r for r in c.rows if r is not None]
        if outcome:
            wanted = set(FAILED) if outcome == "failed" else {outcome}
            if not wanted & {*OUTCOMES, *VERDICTS}:
                allowed = ", ".join((*VERDICTS, *OUTCOMES, "failed"))
                raise ValueError(f"outcome={outcome!r}: allowed {allowed}")
            rows = [r for r in rows if r.outcome in wanted or r.verdict in wanted]
        key = sort.lstrip("-")
        target = c.target
        if key == "metric":
            rows = [r for r in rows if target in r.metrics]
            rows.sort(key=lambda r: r.metrics[target], reverse=sort.startswith("-"))
        elif key == "ratio":
            rows = [r for r in rows if r.ratio is not None]
            rows.sort(key=lambda r: r.ratio or 0.0, reverse=sort.startswith("-"))
        elif sort == "-number":
            rows.reverse()
        elif sort != "number":
            allowed = "number, -number, metric, -metric, ratio, -ratio"
            raise ValueError(f"sort={sort!r}: allowed {allowed}")
        total = len(rows)
        pages = max(1, -(-total // per_page))
        start = (page - 1) * per_page
        return {
            "study": name,
            "target": target,
            "page": page,
            "per_page": per_page,
            "pages": pages,
            "total": total,
            "outcome": outcome,
            "sort": sort,
            "param_names": sorted({k for r in rows[start : start + per_page] for k in r.params}),
            "rows": [r.to_dict() for r in rows[start : start + per_page]],
        }

    def trial(self, name: str, number: int) -> dict[str, Any]:
        """Everything recorded about one trial: the full TrialRecord attrs, params, state."""
        c = self._study(name)
        if number < 0 or number >= len(c.rows) or c.rows[number] is None:
            raise NotFound(
                f"study {name!r} has no trial {number} (its trials are 0..{len(c.rows) - 1})"
                if c.rows
                else f"study {name!r} has no trials yet"
            )
        t = self.storage.get_trial(c.trial_ids[number])
        row = TrialRow.of(_raw(t), c.target)
        assert row is not None
        rec = TrialRecord.from_attrs(name, number, t.user_attrs)
        return {
            "study": name,
            "number": number,
            "state": t.state.name,
            "outcome": row.outcome,
            "verdict": row.verdict,
            "compare": self._compare(c, rec),
            "target": c.target,
            "objectives": list(c.attrs.get("objectives") or []),
            "params": dict(t.params),
            "values": list(t.values) if t.values else None,
            "started": t.datetime_start.timestamp() if t.datetime_start else None,
            "completed": t.datetime_complete.timestamp() if t.datetime_complete else None,
            "record": rec.to_attrs(),  # the typed record, as this code stores it
        }

    def _compare(self, c: _StudyCache, rec: TrialRecord) -> list[list[Any]]:
        """[key, baseline, best it was paired against, this trial] for every config key where
        this trial differs from either (the record's ``changed`` is against the baseline only)."""
        cand = rec.config
        if not cand:
            return []
        base = dict((c.attrs.get("baseline") or {}).get("config") or {})
        against = rec.paired_against
        paired: dict[str, Any] | None = None
        if against is not None and 0 <= against < len(c.rows) and c.rows[against]:
            paired = dict(self._record(c, against).config) or None
        out = []
        for k in sorted(set(cand) | set(base) | set(paired or {})):
            b, p, v = base.get(k), (paired or {}).get(k) if paired else None, cand.get(k)
            if v != b or (paired is not None and v != p):
                out.append([k, b, p if paired is not None else "?", v])
        return out

    def history(self, name: str) -> dict[str, Any]:
        """Target metric of every ok trial (accepted ones apart), and the chained paired speedup
        over the baseline after each acceptance, with its interval, for the history plot."""
        c = self._study(name)
        target = c.target
        xs: list[int] = []
        ys: list[float] = []
        acc_x: list[int] = []
        acc_y: list[float] = []
        for r in c.rows:
            if r is None or r.outcome != "ok" or target not in r.metrics:
                continue
            xs.append(r.number)
            ys.append(r.metrics[target])
            if r.accepted:
                acc_x.append(r.number)
                acc_y.append(r.metrics[target])
        best = (c.attrs.get("best") or {}).get("trial")
        if best is None:
            best = next((r.number for r in c.rows if r and r.role == "baseline"), None)
        chain = self._chain(c, best)
        base = next((r.number for r in c.rows if r and r.role == "baseline"), 0)
        last = len(c.rows) - 1
        sx, sy, slo, shi = [base], [1.0], [1.0], [1.0]
        for link in chain["links"]:
            sx.append(link["trial"])
            sy.append(link["cumulative"])
            slo.append(link["cumulative_lower"])
            shi.append(link["cumulative_upper"])
        if last > sx[-1]:  # the step holds until the latest trial
            sx.append(last)
            sy.append(sy[-1])
            slo.append(slo[-1])
            shi.append(shi[-1])
        return {
            "target": target,
            "numbers": xs,
            "values": ys,
            "accepted": {"numbers": acc_x, "values": acc_y},
            "objectives": self._objectives(c),
            "by_verdict": _by_verdict(c.rows, self._objectives(c)),
            "speedup": {
                "numbers": sx,
                "ratio": sy,
                "lower": slo,
                "upper": shi,
                "complete": chain["complete"],
                "note": chain["note"],
            },
        }

    @staticmethod
    def _objectives(c: _StudyCache) -> list[str]:
        """Every objective of the study, the target first (as the experiment listed them)."""
        objs = [str(o) for o in c.attrs.get("objectives") or []]
        return objs or ([c.target] if c.target else [])

    def optuna_study(self, name: str) -> tuple[optuna.Study, list[str]]:
        """The study's ok trials as an in-memory Optuna study with every objective's value:
        what Optuna's plotly visualizations take (parallel coordinates, Pareto front)."""
        c = self._study(name)
        objs = self._objectives(c)
        ok = [
            r
            for r in c.rows
            if r is not None and r.outcome == "ok" and all(o in r.metrics for o in objs)
        ][-IMPORTANCE_MAX_TRIALS:]
        study = optuna.create_study(directions=["maximize"] * len(objs), study_name=name)
        study.add_trials(
            [
                optuna.trial.create_trial(
                    params={k: v for k, v in r.params.items() if k in c.dists[r.number]},
                    distributions={k: d for k, d in c.dists[r.number].items() if k in r.params},
                    values=[r.metrics[o] for o in objs],
                    user_attrs={"verdict": r.verdict},
                )
                for r in ok
            ]
        )
        return study, objs

    def importances(self, name: str) -> dict[str, Any]:
        """Optuna's parameter importances (its default evaluator) for the target metric over
        the most recent ok trials; ``error`` says why when Optuna cannot compute them."""
        c = self._study(name)
        target = c.target
        ok = [r for r in c.rows if r is not None and r.outcome == "ok" and target in r.metrics][
            -IMPORTANCE_MAX_TRIALS:
        ]
        key = (name, len(ok))
        with self._lock:
            if key in self._importances:
                return self._importances[key]
        out: dict[str, Any] = {
            "target": target,
            "trials": len(ok),
            "importances": {},
            "error": "",
            "caveat": "",
        }
        if len(ok) < IMPORTANCE_MIN_TRIALS:  # a ranking of noise; Optuna raises below 2
            out["caveat"] = (
                f"only {len(ok)} ok trial(s) with {target}: parameter importances need about "
                f"{IMPORTANCE_MIN_TRIALS} or more to mean anything"
            )
            return out
        try:
            study = optuna.create_study(direction="maximize", study_name=f"importances:{name}")
            study.add_trials(
                [
                    optuna.trial.create_trial(
                        params=dict(r.params),
                        distributions=dict(c.dists[r.number]),
                        value=r.metrics[target],
                    )
                    for r in ok
                ]
            )
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "few trials per regime": shown as is
                imp = optuna.importance.get_param_importances(study)
            out["importances"] = {k: float(v) for k, v in imp.items()}
            if not imp:
                out["error"] = "no parameter takes part in every ok trial, or none varies"
        except Exception as e:  # noqa: BLE001 - shown on the page as the reason
            out["error"] = f"{type(e).__name__}: {e}"
        with self._lock:
            self._importances[key] = out
        return out

    # --- promotions -----------------------------------------------------------------------
    def promotions(self) -> list[dict[str, Any]]:
        """Every promotion, newest first: the git history of each promoted config file when its
        repository is on this machine (one entry per commit, diffed against the version before;
        the first against the study's baseline), else the promotion the study recorded (diffed
        against the study's baseline)."""
        out: list[dict[str, Any]] = []
        seen: set[tuple[str, str, str]] = set()
        for name in self.study_names():
            c = self._studies[name]
            recs = list(c.attrs.get("promotions") or [])
            if c.attrs.get("promotion") and c.attrs["promotion"] not in recs:
                recs.append(c.attrs["promotion"])
            base = dict((c.attrs.get("baseline") or {}).get("config") or {})
            for p in recs:
                p = dict(p)
                where = gitlog.locate(str(p.get("path", "")), str(p.get("repo", "")))
                hist = self._git_history(*where) if where else []
                if hist:
                    assert where is not None
                    for e in hist:
                        key = (str(where[0]), where[1], e["commit"])
                        if key in seen:
                            continue
                        seen.add(key)
                        ev = e["evidence"]
                        out.append(
                            {
                                "study": ev.get("study", name),
                                "device_class": ev.get(
                                    "device_class", c.attrs.get("device_class", "")
                                ),
                                "family": ev.get("model_family", c.attrs.get("family", "")),
                                "trial": ev.get("trial"),
                                "at": e["at"],
                                "path": str(p.get("path", "")),
                                "repo": str(p.get("repo", "")),
                                "commit": e["commit"],
                                "message": e["message"],
                                "evidence": ev,
                                "previous": e["previous"],
                                "diff": e["diff"]
                                if e["diff"] is not None
                                else gitlog.diff(base, e["config"]),
                                "source": "git",
                            }
                        )
                    continue
                trial = p.get("trial", (p.get("evidence") or {}).get("trial"))
                rec = self._trial_record(c, trial)
                ev = (
                    dict(p.get("evidence") or {})
                    or _file_evidence(p.get("path"))
                    or (_record_evidence(rec, c.target))
                )
                cfg = p.get("config") or (rec.config if rec else None)
                if cfg is None:
                    cfg = (c.attrs.get("best") or {}).get("config") or {}
                out.append(
                    {
                        "study": name,
                        "device_class": c.attrs.get("device_class", ""),
                        "family": c.attrs.get("family", ""),
                        "trial": trial,
                        "at": p.get("at") or ev.get("at") or (c.attrs.get("best") or {}).get("at"),
                        "path": p.get("path", ""),
                        "repo": p.get("repo", ""),
                        "commit": p.get("commit", ""),
                        "message": p.get("message", ""),
                        "evidence": ev,
                        "previous": "",
                        "diff": gitlog.diff(base, cfg),
                        "source": "study",
                    }
                )
        for p in out:
            p["win"] = self._promotion_win(p)
        out.sort(key=lambda p: float(p["at"] or 0.0), reverse=True)
        return out

    def _promotion_win(self, p: dict[str, Any]) -> str:
        """A promotion's two figures: from its evidence's chain when recorded, else the chain
        the study's records give for its trial now."""
        from agent.win import evidence_line, win_line

        ev = dict(p.get("evidence") or {})
        if ev.get("vs_baseline"):
            return evidence_line(ev)
        c = self._studies.get(str(p.get("study")))
        trial = p.get("trial")
        if c is None or not isinstance(trial, int):
            return evidence_line(ev)
        chain = self._chain(c, trial)
        if not chain["links"]:
            return evidence_line(ev)
        last = chain["links"][-1]
        total = chain if chain["complete"] else None
        base = next((r.number for r in c.rows if r is not None and r.role == "baseline"), None)
        return win_line(last["ratio"], last["lower"], last["against"], total, base)

    def _git_history(self, repo: Path, rel: str) -> list[dict[str, Any]]:
        head = gitlog.head(repo, rel)
        if head is None:
            return []
        key = (str(repo), rel, head)
        with self._lock:
            if key not in self._gitlog:
                self._gitlog[key] = gitlog.history(repo, rel)
            return self._gitlog[key]

    def _trial_record(self, c: _StudyCache, trial: Any) -> TrialRecord | None:
        if not isinstance(trial, int):
            return None
        c = self._sync(c)
        if not 0 <= trial < len(c.rows) or c.rows[trial] is None:
            return None
        return self._record(c, trial)

    # --- fleet ----------------------------------------------------------------------------
    def status_file(self) -> dict[str, Any]:
        """The agent's fleet status file as written, {} when absent; ``error`` when unreadable."""
        path = self.ref.status_path
        try:
            return dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as e:
            return {"error": f"cannot read {path}: {e}"}

    def fleet(self) -> dict[str, Any]:
        """The agent's fleet status file, with nodes and device classes derived from workers,
        every agent invocation recorded with the trials that finished during it, per-worker
        totals over all invocations, the last GPU state each worker recorded, and what each
        worker's A/A noise means for acceptance."""
        path = self.ref.status_path
        base: dict[str, Any] = {
            "status_file": str(path),
            "present": False,
            "agent": None,
            "workers": [],
            "studies": [],
            "nodes": [],
            "device_classes": {},
            "age_s": None,
            "stale": "",
            "invocations": [],
            "ray_dashboard": "",
        }
        data = self.status_file()
        if not data:
            return base
        if "error" in data:
            return {**base, "error": data["error"]}
        agent = data.get("agent") or None
        now = time.time()
        age = now - float(agent["updated"]) if agent and agent.get("updated") else None
        rows = [r for n in self.study_names() for r in self._study(n).rows if r is not None]
        acceptance = (agent or {}).get("acceptance") or {}
        workers = [self._worker(dict(w), rows, acceptance) for w in data.get("workers") or []]
        stale = self.agent_stale(data)
        invocations = _invocations(data, rows, now)
        if stale and agent:  # what it last said it was doing is not what is happening
            agent = {**agent, "state": GONE, "reported_state": agent.get("state")}
            for w in workers:
                if w.get("state") != "dead":
                    w["reported_state"], w["state"], w["current_s"] = (
                        w.get("state"),
                        "unknown",
                        None,
                    )
            for i in invocations:
                if i.get("pid") == agent.get("pid") and i.get("started") == agent.get("started"):
                    i["state"] = GONE if i.get("state") == "running" else i.get("state")
        nodes: dict[str, dict[str, Any]] = {}
        classes: dict[str, dict[str, int]] = {}
        for w in workers:
            info = w.get("info") or {}
            host = info.get("host") or "(not yet known)"
            node = nodes.setdefault(
                host, {"host": host, "node_id": info.get("node_id", ""), "workers": []}
            )
            node["workers"].append(w.get("worker_id", ""))
            cls = classes.setdefault(str(w.get("device_class", "")), {})
            state = str(w.get("state", ""))
            cls[state] = cls.get(state, 0) + 1
        return {
            **base,
            "present": True,
            "agent": agent,
            "workers": workers,
            "studies": list(data.get("studies") or []),
            "nodes": sorted(nodes.values(), key=lambda n: n["host"]),
            "device_classes": dict(sorted(classes.items())),
            "age_s": age,
            "stale": stale,
            "invocations": invocations,
            "ray_dashboard": str((agent or {}).get("ray_dashboard") or ""),
        }

    @staticmethod
    def _worker(
        w: dict[str, Any], rows: list[TrialRow], acceptance: dict[str, Any]
    ) -> dict[str, Any]:
        wid = str(w.get("worker_id", ""))
        mine = [r for r in rows if r.worker == wid]
        w["evaluated_all"] = sum(r.outcome in BUDGET for r in mine)
        spans = [(r.started, r.finished) for r in mine if r.outcome in BUDGET]
        w["throughput_all"] = worker_rate(wid, spans).to_dict()  # trials per GPU-hour
        with_gpu = [r for r in mine if r.gpu]
        w["gpu"] = max(with_gpu, key=lambda r: r.finished).gpu if with_gpu else None
        target = acceptance.get("target")
        min_gain = float(acceptance.get("min_gain") or 0.0)
        w["accepts_above"] = {
            model: 1.0 + max(min_gain, float(objs.get(target, 0.0)))
            for model, objs in (w.get("noise") or {}).items()
            if target and target in objs
        }
        since = w.get("current_since")
        w["current_s"] = time.time() - float(since) if since and w.get("current") else None
        return w

    def agent_stale(self, status: dict[str, Any] | None = None) -> str:
        """Why the status file's "running" agent cannot be believed, or "": its process gone
        (this host), its status not rewritten for longer than a trial may take, or its study
        leases no longer beating (the agent renews them every ttl/4 from a thread, whatever its
        loop waits on; killed, it stops)."""
        status = self.status_file() if status is None else status
        agent = status.get("agent") or None
        if not agent or agent.get("state") != "running":
            return ""
        age = time.time() - float(agent["updated"]) if agent.get("updated") else None
        studies = [str(s.get("study")) for s in status.get("studies") or [] if s.get("study")]
        return _stale(agent, age) or self._lease_stale(agent, studies)

    def _lease_stale(self, agent: dict[str, Any], studies: list[str]) -> str:
        from agent.lease import KEY, Holder

        now = time.time()
        late: list[tuple[float, float]] = []
        mine = 0
        try:
            with self._lock:
                self._list()
                ids = [self._studies[n].study_id for n in studies if n in self._studies]
            for sid in ids:
                h = Holder.from_attr(self.storage.get_study_system_attrs(sid).get(KEY))
                if h is None or h.host != agent.get("host") or h.pid != agent.get("pid"):
                    continue
                mine += 1
                ttl = max(h.expires - h.heartbeat, 1.0)
                if now - h.heartbeat <= ttl / 2:
                    return ""  # one lease beating is enough: the agent lives
                late.append((now - h.heartbeat, ttl))
        except Exception as e:  # noqa: BLE001 - the leases cannot tell; the other checks stand
            log.debug("dashboard: leases not read: %s", e)
            return ""
        if late:
            since, ttl = min(late)
            return (
                f"the agent's lease heartbeat stopped {since:.0f} s ago (it beats every "
                f"{ttl / 4:.0f} s while it runs): the agent is gone"
            )
        if ids and not mine:
            return "the agent holds none of its studies' leases any more: it is gone"
        return ""

    def progress(self, name: str) -> dict[str, Any]:
        """How far the study is: evaluated / budget, this invocation's elapsed time and rate,
        the time left, and each running trial against its timeout (from the status file)."""
        c = self._study(name)
        rows = [r for r in c.rows if r is not None]
        evaluated = sum(r.outcome in BUDGET for r in rows)
        status = self.status_file()
        agent = status.get("agent") or {}
        entry = next((s for s in status.get("studies") or [] if s.get("study") == name), {})
        budget = entry.get("budget")
        now = time.time()
        started = float(agent.get("started") or 0.0)
        stale = self.agent_stale(status)
        running_agent = agent.get("state") == "running" and bool(entry) and not stale
        end = now if running_agent else float(agent.get("updated") or now)
        elapsed = end - started if started and entry else None
        this_run = sum(r.outcome in BUDGET and r.finished >= started for r in rows) if entry else 0
        per_hour = this_run / elapsed * 3600 if elapsed and this_run else None
        left = max(0, int(budget) - evaluated) if isinstance(budget, int) else None
        eta = left / per_hour * 3600 if left is not None and per_hour and running_agent else None
        wall = agent.get("wall_time_s")
        if wall and running_agent and started:
            wall_left = max(0.0, started + float(wall) - now)
            eta = wall_left if eta is None else min(eta, wall_left)
        timeout = agent.get("trial_timeout_s")
        by_trial = {
            str(w.get("current")): w for w in status.get("workers") or [] if w.get("current")
        }
        current = []
        for r in rows:
            if r.outcome not in ("running", "waiting"):
                continue
            w = by_trial.get(f"{name} #{r.number}") or {}
            since = w.get("current_since")
            current.append(
                {
                    "number": r.number,
                    "worker": w.get("worker_id", ""),
                    "elapsed_s": now - float(since) if since else None,
                    "timeout_s": timeout,
                    "queued": not w,
                }
            )
        return {
            "evaluated": evaluated,
            "budget": budget,
            "left": left,
            "agent_state": GONE if stale else agent.get("state", ""),
            "in_this_run": bool(entry),
            "evaluated_this_run": this_run,
            "elapsed_s": elapsed,
            "per_hour": per_hour,
            "eta_s": eta,
            "trial_timeout_s": timeout,
            "current": current,
            "stale": stale,
            "acceptance": agent.get("acceptance") or {},
        }


def _stale(agent: dict[str, Any] | None, age: float | None) -> str:
    """Why a status file that says "running" cannot be believed, or ""."""
    if not agent or agent.get("state") != "running":
        return ""
    pid, host = agent.get("pid"), agent.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"the agent (pid {pid} on {host}) is not running: it stopped without saying so"
        except PermissionError:
            pass
    # The agent rewrites the file at least once per trial timeout while it runs.
    limit = float(agent.get("trial_timeout_s") or 600.0) + 60.0
    if age is not None and age > limit:
        return (
            f"the agent last wrote its status {age:.0f} s ago (it writes at least every "
            f"{limit:.0f} s while it runs): it may have died or lost its storage"
        )
    return ""


HISTORY_GROUPS = ("baseline", "accepted", "rejected", "failed")  # the history plot's colours


def _by_verdict(rows: list[TrialRow | None], objectives: list[str]) -> dict[str, dict[str, Any]]:
    """The history plot's points by verdict: ok trials (baseline, accepted, rejected) with each
    objective's median, and trials that broke (compile error, crash, timeout, invalid) with
    their reason, drawn apart so a rejected trial never looks like a win."""
    out = {
        g: {"numbers": [], "values": {o: [] for o in objectives}, "reasons": []}
        for g in HISTORY_GROUPS
    }
    for r in rows:
        if r is None:
            continue
        group = (
            r.verdict
            if r.verdict in VERDICTS
            else "failed"
            if r.outcome in (*FAILED, "invalid")
            else ""
        )
        if not group:
            continue
        g = out[group]
        g["numbers"].append(r.number)
        for o in objectives:
            g["values"][o].append(r.metrics.get(o))
        g["reasons"].append(r.reason or r.outcome)
    return out


def _invocations(data: dict[str, Any], rows: list[TrialRow], now: float) -> list[dict[str, Any]]:
    """Every agent invocation the status file recorded (oldest first), each with the trials that
    finished while it ran, by verdict; trials before the first recorded one come first, as
    "earlier": the counts add up to every trial in the storage."""
    runs = [dict(i) for i in data.get("invocations") or [] if i.get("started")]
    agent = data.get("agent")
    if (
        agent
        and agent.get("started")
        and not any(
            i.get("started") == agent.get("started") and i.get("pid") == agent.get("pid")
            for i in runs
        )
    ):
        runs.append(dict(agent))
    runs.sort(key=lambda i: float(i["started"]))
    starts = [float(i["started"]) for i in runs]
    buckets: list[dict[str, int]] = [{} for _ in range(len(runs) + 1)]

    for r in rows:
        t = r.finished or now  # unfinished: the latest invocation has it
        k = bisect.bisect_right(starts, t)  # 0: before the first recorded invocation
        buckets[k][r.verdict] = buckets[k].get(r.verdict, 0) + 1
    out = []
    if buckets[0]:
        out.append({"label": "earlier (not recorded)", "counts": buckets[0]})
    for i, run in enumerate(runs):
        counts = buckets[i + 1]
        out.append(
            {
                "label": f"{run.get('host', '?')} pid {run.get('pid', '?')}",
                "host": run.get("host"),
                "pid": run.get("pid"),
                "experiment": run.get("experiment"),
                "started": run.get("started"),
                "updated": run.get("updated"),
                "state": run.get("state"),
                "counts": counts,
            }
        )
    for o in out:
        o["total"] = sum(o["counts"].values())
    return out


def _chain_of(reader: Reader, c: _StudyCache, best: int | None) -> dict[str, Any]:
    """See ``Reader._chain``: links from ``best`` back to the baseline, then their product."""
    out: dict[str, Any] = {
        "ratio": 1.0,
        "lower": 1.0,
        "upper": 1.0,
        "links": [],
        "complete": False,
        "note": "",
    }
    rows = c.rows
    if best is None or not 0 <= best < len(rows) or rows[best] is None:
        out["note"] = "no baseline measured yet"
        return out
    confidence = 0.95
    links: list[dict[str, Any]] = []
    seen: set[int] = set()
    n: int | None = best
    while True:
        row = rows[n] if n is not None and 0 <= n < len(rows) else None
        if row is None or n in seen:
            out["note"] = f"the chain breaks at trial {n}: not in this study"
            break
        seen.add(n)
        if row.role == "baseline":
            out["complete"] = True
            break
        against, est = reader._link(c, row)
        if not est.get("ratio") or not est.get("lower") or not est.get("upper"):
            out["note"] = f"trial {n} has no paired estimate on {c.target}"
            break
        own = reader._record(c, n).estimates.get(c.target)
        confidence = float(own.confidence if own and own.confidence else confidence)
        links.append(
            {
                "trial": n,
                "against": against,
                "ratio": est["ratio"],
                "lower": est["lower"],
                "upper": est["upper"],
                "source": est.get("source", "trial"),
            }
        )
        n = against
    links.reverse()  # baseline first
    # the one chaining of paired ratios (agent.win): the summary and the evidence use it too
    typed = [Link(x["trial"], x["against"], x["ratio"], x["lower"], x["upper"]) for x in links]
    cum = cumulative(typed, confidence)
    for link, (r, lo, hi) in zip(links, cum, strict=True):
        link["cumulative"], link["cumulative_lower"], link["cumulative_upper"] = r, lo, hi
    if cum:
        out["ratio"], out["lower"], out["upper"] = cum[-1]
    out["links"] = links
    out["confidence"] = confidence
    return out


def _file_evidence(path: Any) -> dict[str, Any]:
    """The ``[evidence]`` table of a promoted config file, when it is readable from here."""
    if not path:
        return {}
    try:
        return dict(tomllib.loads(Path(str(path)).read_text()).get("evidence") or {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _record_evidence(rec: TrialRecord | None, target: str) -> dict[str, Any]:
    """Evidence rebuilt from the promoted trial's record, when the config file is elsewhere."""
    if rec is None:
        return {}
    est, val = rec.estimates.get(target), rec.validate
    return {
        "target": target,
        "ratio": est.ratio if est else None,
        "lower_bound": est.lower if est else None,
        "confidence": est.confidence if est else None,
        "paired_against": rec.paired_against,
        "decision": rec.decision.reason if rec.decision else None,
        "validate_max_abs_diff": val.max_abs_diff if val else None,
        "validate_nmse": val.nmse if val else None,
        "device": rec.device,
        "driver": rec.driver,
        "worker": rec.worker.worker_id if rec.worker else None,
        "engine_commit": rec.engine_commit,
    }
