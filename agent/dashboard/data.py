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

import hashlib
import json
import logging
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
from agent.storage import StorageRef, parse_storage

log = logging.getLogger(__name__)

FAILED = ("compile_error", "crash", "timeout")  # ran on a worker and broke
OUTCOMES = (
    "ok",
    "invalid",
    "compile_error",
    "crash",
    "timeout",
    "infeasible",
    "duplicate",
    "interrupted",
    "running",
    "waiting",
)
PLAIN = "value"  # the target of a study without agent attrs: Optuna's first value
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
    max_abs_diff: float | None
    nmse: float | None
    worker: str
    host: str
    wall_s: float
    finished: float  # unix time, 0 while running

    @classmethod
    def of(cls, t: RawTrial, target: str) -> TrialRow:
        ua = t.user_attrs
        est = (ua.get("estimates") or {}).get(target) or {}
        val = ua.get("validate") or {}
        worker = ua.get("worker") or {}
        return cls(
            number=t.number,
            state=t.state.name,
            outcome=_outcome(t),
            role=str(ua.get("role", "candidate")),
            accepted=bool(ua.get("accepted", False)),
            reason=_first_line(str(ua.get("reason", ""))),
            params=dict(t.params),
            metrics=_metrics(t, target),
            ratio=est.get("ratio"),
            lower=est.get("lower"),
            max_abs_diff=val.get("max_abs_diff"),
            nmse=val.get("nmse"),
            worker=str(worker.get("worker_id", "")),
            host=str(ua.get("host") or worker.get("host", "")),
            wall_s=float(ua.get("wall_s", 0.0) or 0.0),
            finished=float(ua.get("finished") or t.datetime_complete),
        )

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
    def _list(self) -> None:
        if time.monotonic() - self._listed < self.refresh_s and self._studies:
            return
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
                raise NotFound(f"no study named {name!r} in {self.ref.url} (studies: {known})")
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
        """Counts, baseline, best and speedup of one study (no trial rows)."""
        c = self._study(name)
        rows = [r for r in c.rows if r is not None]
        counts = dict.fromkeys(OUTCOMES, 0)
        for r in rows:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
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
        speedup = None
        if target in best_metrics and base_metrics.get(target):
            speedup = best_metrics[target] / base_metrics[target]
        evaluated = sum(counts[k] for k in ("ok", "invalid", *FAILED))
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
            "evaluated": evaluated,
            "done": counts["ok"],
            "failed": sum(counts[k] for k in FAILED),
            "invalid": counts["invalid"],
            "running": counts["running"],
            "counts": {k: v for k, v in counts.items() if v},
            "baseline_trial": baseline.number if baseline else None,
            "baseline_source": (c.attrs.get("baseline") or {}).get("source", ""),
            "baseline_metrics": base_metrics,
            "best_trial": best_trial,
            "best_metrics": best_metrics,
            "best_is_baseline": best_trial is not None
            and baseline is not None
            and best_trial == baseline.number,
            "speedup": speedup,
            "promoted": bool(c.attrs.get("promotion") or c.attrs.get("promotions")),
        }

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
        """One page of the trials table, newest first by default; ``sort``: number, -number,
        metric or -metric (the target objective), ratio or -ratio."""
        c = self._study(name)
        rows = [r for r in c.rows if r is not None]
        if outcome:
            wanted = set(FAILED) if outcome == "failed" else {outcome}
            rows = [r for r in rows if r.outcome in wanted]
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
        ua = dict(t.user_attrs)
        return {
            "study": name,
            "number": number,
            "state": t.state.name,
            "outcome": row.outcome,
            "target": c.target,
            "objectives": list(c.attrs.get("objectives") or []),
            "params": dict(t.params),
            "values": list(t.values) if t.values else None,
            "started": t.datetime_start.timestamp() if t.datetime_start else None,
            "completed": t.datetime_complete.timestamp() if t.datetime_complete else None,
            "record": ua,
        }

    def history(self, name: str) -> dict[str, Any]:
        """Target metric of every ok trial and the agent's best so far (baseline, then each
        accepted candidate), for the optimization history plot."""
        c = self._study(name)
        target = c.target
        xs: list[int] = []
        ys: list[float] = []
        acc_x: list[int] = []
        acc_y: list[float] = []
        best_x: list[int] = []
        best_y: list[float] = []
        best: float | None = None
        for r in c.rows:
            if r is None or r.outcome != "ok" or target not in r.metrics:
                continue
            y = r.metrics[target]
            xs.append(r.number)
            ys.append(y)
            if r.role == "baseline" and best is None or r.accepted:
                best = y
                acc_x.append(r.number)
                acc_y.append(y)
            if best is not None:
                best_x.append(r.number)
                best_y.append(best)
        return {
            "target": target,
            "numbers": xs,
            "values": ys,
            "accepted": {"numbers": acc_x, "values": acc_y},
            "best": {"numbers": best_x, "values": best_y},
        }

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
        out: dict[str, Any] = {"target": target, "trials": len(ok), "importances": {}, "error": ""}
        try:
            if len(ok) < 2:
                raise ValueError(f"needs at least 2 ok trials with {target!r}; has {len(ok)}")
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
                ua = self._trial_attrs(c, trial)
                ev = (
                    dict(p.get("evidence") or {})
                    or _file_evidence(p.get("path"))
                    or (_record_evidence(ua, c.target))
                )
                cfg = p.get("config") or ua.get("config")
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
        out.sort(key=lambda p: float(p["at"] or 0.0), reverse=True)
        return out

    def _git_history(self, repo: Path, rel: str) -> list[dict[str, Any]]:
        head = gitlog.head(repo, rel)
        if head is None:
            return []
        key = (str(repo), rel, head)
        with self._lock:
            if key not in self._gitlog:
                self._gitlog[key] = gitlog.history(repo, rel)
            return self._gitlog[key]

    def _trial_attrs(self, c: _StudyCache, trial: Any) -> dict[str, Any]:
        if not isinstance(trial, int):
            return {}
        c = self._sync(c)
        if not 0 <= trial < len(c.rows) or c.rows[trial] is None:
            return {}
        return dict(self.storage.get_trial(c.trial_ids[trial]).user_attrs)

    # --- fleet ----------------------------------------------------------------------------
    def fleet(self) -> dict[str, Any]:
        """The agent's fleet status file, with nodes and device classes derived from workers."""
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
        }
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return base
        except (OSError, json.JSONDecodeError) as e:
            return {**base, "error": f"cannot read {path}: {e}"}
        workers = list(data.get("workers") or [])
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
        agent = data.get("agent") or None
        age = time.time() - float(agent["updated"]) if agent and agent.get("updated") else None
        return {
            **base,
            "present": True,
            "agent": agent,
            "workers": workers,
            "studies": list(data.get("studies") or []),
            "nodes": sorted(nodes.values(), key=lambda n: n["host"]),
            "device_classes": dict(sorted(classes.items())),
            "age_s": age,
        }


def _file_evidence(path: Any) -> dict[str, Any]:
    """The ``[evidence]`` table of a promoted config file, when it is readable from here."""
    if not path:
        return {}
    try:
        return dict(tomllib.loads(Path(str(path)).read_text()).get("evidence") or {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _record_evidence(ua: dict[str, Any], target: str) -> dict[str, Any]:
    """Evidence rebuilt from the promoted trial's record, when the config file is elsewhere."""
    if not ua:
        return {}
    est = (ua.get("estimates") or {}).get(target) or {}
    val = ua.get("validate") or {}
    worker = ua.get("worker") or {}
    return {
        "target": target,
        "ratio": est.get("ratio"),
        "lower_bound": est.get("lower"),
        "confidence": est.get("confidence"),
        "paired_against": ua.get("paired_against"),
        "decision": (ua.get("decision") or {}).get("reason"),
        "validate_max_abs_diff": val.get("max_abs_diff"),
        "validate_nmse": val.get("nmse"),
        "device": ua.get("device"),
        "driver": ua.get("driver"),
        "worker": worker.get("worker_id"),
        "engine_commit": ua.get("engine_commit"),
    }
