"""The dashboard's read-only store: ``StudyStore`` opens the Optuna storage read-only (no table
creation; a missing file is an error, not a new empty storage) and keeps one incremental cache
per study: a small ``TrialRow`` per trial, built once when the trial finishes (finished trials
never change). Only unfinished trials and new ones are read again, at most once per
``refresh_s``. A finished trial's full record is read once, when a chain or a page needs it."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from typing import Any

import optuna

from agent.dashboard.chain import chain_of
from agent.dashboard.fastread import FastReader, RawTrial
from agent.dashboard.rows import (
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


class StudyStore:
    """One storage read-only, cached per study: what every page's data is read through."""

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

    def chain(self, c: StudyCache, best: int | None) -> dict[str, Any]:
        """The best's speedup over the baseline as the product of the paired ratios along the
        chain baseline -> each accepted best -> ``best``, with an interval: each link's
        [lower, upper] read as a normal interval on the log ratio, the links' variances added
        (independent measurements)."""
        key = (best, c.n_finished, c.last_finished_id, len(c.rows))
        got = c.chains.get(key)
        if got is not None:
            return got
        out = chain_of(c, best, self.link, self.record)
        c.chains = {key: out}
        return out
