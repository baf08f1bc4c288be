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

The Reader answers the pages; what they show is built apart: rows.py (a trial as a row), chain.py
(the chained speedup), figures.py (the study page's figures), promotions.py and fleet_view.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from typing import Any

import optuna

from agent.dashboard import figures, fleet_view, promotions
from agent.dashboard.chain import chain_of
from agent.dashboard.fastread import FastReader, RawTrial
from agent.dashboard.rows import (
    BUDGET,
    FAILED,
    OUTCOMES,
    VERDICTS,
    NotFound,
    StorageMissing,
    StudyCache,
    TrialRow,
    open_readonly,
    raw_trial,
)
from agent.records import TrialRecord
from agent.storage import parse_storage

log = logging.getLogger(__name__)

__all__ = ["Reader"]


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
        self.lock = threading.RLock()  # guards the caches: pages are served from threads
        self._studies: dict[str, StudyCache] = {}
        self._listed = 0.0
        self.importances_cache: dict[tuple[str, int], dict[str, Any]] = {}  # figures.importances
        self.gitlog_cache: dict[tuple[str, str, str], list[dict[str, Any]]] = {}  # promotions

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
                c = StudyCache(s._study_id, s.study_name, {}, [])
            c.attrs = dict(s.user_attrs)
            c.directions = [d.name.lower() for d in s.directions]
            found[s.study_name] = c
        self._studies = found
        self._listed = time.monotonic()

    def sync(self, c: StudyCache, force: bool = False) -> StudyCache:
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
                    self._studies[k] = StudyCache(old.study_id, old.name, old.attrs, old.directions)
                c = self._studies.get(c.name, c)
        if self.fast is None:
            self._sync_api(c)
        c.synced = time.monotonic()
        return c

    def _put(self, c: StudyCache, t: RawTrial) -> None:
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

    def _sync_fast(self, c: StudyCache) -> None:
        assert self.fast is not None
        for t in self.fast.read(c.study_id, c.last_finished_id, set(c.unfinished.values())):
            self._put(c, t)
            if t.state.is_finished():
                c.last_finished_id = max(c.last_finished_id, t.trial_id)

    def _sync_api(self, c: StudyCache) -> None:
        trials = self.storage.get_all_trials(c.study_id, deepcopy=False)
        for t in trials[c.n_finished :]:
            n = t.number
            if n < len(c.rows) and c.rows[n] is not None and n not in c.unfinished:
                continue
            self._put(c, raw_trial(t))
        # Trials before the first unfinished one are final: later syncs start after them.
        c.n_finished = min(c.unfinished, default=len(trials))

    def warm(self) -> None:
        """Read every study's trials once (the cold load), logging rather than raising."""
        try:
            for name in self.study_names():
                self.study_cache(name)
        except Exception:  # noqa: BLE001 - a page request will raise it with context
            log.exception("warming the dashboard cache failed")

    def study_names(self) -> list[str]:
        with self.lock:
            self._list()
            return sorted(self._studies)

    def study_cache(self, name: str) -> StudyCache:
        with self.lock:
            self._list()
            c = self._studies.get(name)
            if c is None:
                known = ", ".join(sorted(self._studies)[:10]) or "none"
                raise NotFound(f"no study named {name!r} in {self.ref.display} (studies: {known})")
            return self.sync(c)

    def listed(self, name: str) -> StudyCache | None:
        """The study's cache as last listed, not synced (None: not listed)."""
        return self._studies.get(name)

    def study_ids(self, names: list[str]) -> list[int]:
        """The storage ids of the named studies that exist now."""
        with self.lock:
            self._list()
            return [self._studies[n].study_id for n in names if n in self._studies]

    def stamp(self, name: str | None = None) -> str:
        """Changes whenever something a page shows changes (for live refresh)."""
        with self.lock:
            self._list()
            names = [name] if name else sorted(self._studies)
            parts = []
            for n in names:
                c = self.study_cache(n)
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
        c = self.study_cache(name)
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
        chain = self.chain(c, best_trial)
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
    def record(self, c: StudyCache, number: int) -> TrialRecord:
        """A finished trial's full record, read once (finished trials never change)."""
        rec = c.records.get(number)
        if rec is None:
            attrs = self.storage.get_trial(c.trial_ids[number]).user_attrs
            rec = TrialRecord.from_attrs(c.name, number, attrs)
            if number not in c.unfinished:
                c.records[number] = rec
        return rec

    def link(self, c: StudyCache, row: TrialRow) -> tuple[int | None, dict[str, Any]]:
        """(the best this accepted trial was measured against, the estimate against it). When
        the best moved before a confirmation ran, the confirmation measured it against the newer
        best: that is the link to follow."""
        est = {"ratio": row.ratio, "lower": row.lower, "upper": row.upper, "source": "trial"}
        conf = self.record(c, row.number).confirmation
        if conf is not None and conf.paired_against is not None:
            if conf.paired_against != row.paired_against:
                e = conf.estimates.get(c.target)
                return conf.paired_against, {**(e.to_dict() if e else {}), "source": "confirmation"}
        return row.paired_against, est

    def _win(self, c: StudyCache, chain: dict[str, Any], baseline: int | None) -> str:
        """Both figures of the best, named (agent.win): its last link (the ratio acceptance
        decided on, against the previous best) and the chained speedup over the baseline."""
        from agent.win import win_line

        if not chain["links"]:
            return ""
        last = chain["links"][-1]
        total = chain if chain["complete"] else None
        return win_line(last["ratio"], last["lower"], last["against"], total, baseline)

    def chain(self, c: StudyCache, best: int | None) -> dict[str, Any]:
        """The best's speedup over the baseline as the product of the paired ratios along the
        chain baseline -> each accepted best -> ``best``, with an interval: each link's
        [lower, upper] read as a normal interval on the log ratio, the links' variances added
        (independent measurements)."""
        key = (best, c.n_finished, c.last_finished_id, len(c.rows))
        got = c.chains.get(key)
        if got is not None:
            return got
        out = chain_of(self, c, best)
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
        c = self.study_cache(name)
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
        c = self.study_cache(name)
        if number < 0 or number >= len(c.rows) or c.rows[number] is None:
            raise NotFound(
                f"study {name!r} has no trial {number} (its trials are 0..{len(c.rows) - 1})"
                if c.rows
                else f"study {name!r} has no trials yet"
            )
        t = self.storage.get_trial(c.trial_ids[number])
        row = TrialRow.of(raw_trial(t), c.target)
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

    def _compare(self, c: StudyCache, rec: TrialRecord) -> list[list[Any]]:
        """[key, baseline, best it was paired against, this trial] for every config key where
        this trial differs from either (the record's ``changed`` is against the baseline only)."""
        cand = rec.config
        if not cand:
            return []
        base = dict((c.attrs.get("baseline") or {}).get("config") or {})
        against = rec.paired_against
        paired: dict[str, Any] | None = None
        if against is not None and 0 <= against < len(c.rows) and c.rows[against]:
            paired = dict(self.record(c, against).config) or None
        out = []
        for k in sorted(set(cand) | set(base) | set(paired or {})):
            b, p, v = base.get(k), (paired or {}).get(k) if paired else None, cand.get(k)
            if v != b or (paired is not None and v != p):
                out.append([k, b, p if paired is not None else "?", v])
        return out

    # --- figures (figures.py) -------------------------------------------------------------
    def history(self, name: str) -> dict[str, Any]:
        return figures.history(self, name)

    def optuna_study(self, name: str) -> tuple[optuna.Study, list[str]]:
        return figures.optuna_study(self, name)

    def importances(self, name: str) -> dict[str, Any]:
        return figures.importances(self, name)

    # --- promotions (promotions.py) -------------------------------------------------------
    def promotions(self) -> list[dict[str, Any]]:
        return promotions.promotions(self)

    # --- fleet (fleet_view.py) ------------------------------------------------------------
    def status_file(self) -> dict[str, Any]:
        return fleet_view.status_file(self)

    def fleet(self) -> dict[str, Any]:
        return fleet_view.fleet(self)

    def agent_stale(self, status: dict[str, Any] | None = None) -> str:
        return fleet_view.agent_stale(self, status)

    def progress(self, name: str) -> dict[str, Any]:
        return fleet_view.progress(self, name)
