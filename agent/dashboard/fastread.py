"""A faster first read of a big study from an SQL storage, for the trials table only.

Optuna's ``RDBStorage.get_all_trials`` builds an ORM object per attribute row: 10,000 agent
trials are ~230,000 user-attribute rows and take ~10 s on a small machine. The table needs a
dozen small attrs per trial, so this reads just those with SQLAlchemy Core selects over Optuna's
own table definitions (``optuna.storages._rdb.models``), read-only, and turns parameters back into
their external values with Optuna's distributions. Everything else (a trial's page, writes, the
journal storage) goes through Optuna's storage API.

It is an optimization with a guard: used only for schema versions it was checked against
(``SCHEMAS``); for any other version, or any error, the caller falls back to the storage API.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.trial import TrialState

SCHEMAS = ("v3.2.0.a",)  # alembic revisions of Optuna's RDB schema this reader was checked on
ROW_KEYS = (
    "outcome",
    "role",
    "accepted",
    "reason",
    "metrics",
    "estimates",
    "validate",
    "worker",
    "host",
    "wall_s",
    "started",
    "finished",
    "paired_against",
    "decision",
    "gpu",
    "memory",  # the trials table's footprint column
)


@dataclass
class RawTrial:
    """What a table row needs of one trial (attrs limited to ``ROW_KEYS``)."""

    trial_id: int
    number: int
    state: TrialState
    params: dict[str, Any]
    distributions: dict[str, BaseDistribution]
    user_attrs: dict[str, Any]
    values: list[float] | None
    datetime_complete: float  # unix time, 0 while unfinished


class FastReader:
    """Core-SQL reads of trial rows from one RDBStorage."""

    def __init__(self, rdb: optuna.storages.RDBStorage) -> None:
        version = rdb.get_current_version()
        if version not in SCHEMAS:
            raise RuntimeError(f"schema {version} not in {SCHEMAS}")
        from optuna.storages._rdb import models

        self.engine = rdb.engine
        self.t = models.TrialModel.__table__
        self.a = models.TrialUserAttributeModel.__table__
        self.p = models.TrialParamModel.__table__
        self.v = models.TrialValueModel.__table__
        self._dists: dict[str, BaseDistribution] = {}

    def _dist(self, text: str) -> BaseDistribution:
        d = self._dists.get(text)
        if d is None:
            d = self._dists[text] = json_to_distribution(text)
        return d

    def read(self, study_id: int, after_id: int, also: set[int]) -> list[RawTrial]:
        """Trials of the study with trial_id > after_id, or in ``also`` (unfinished ones)."""
        from sqlalchemy import or_, select

        t, a, p, v = self.t, self.a, self.p, self.v
        which = t.c.trial_id > after_id
        if also:
            which = or_(which, t.c.trial_id.in_(sorted(also)))
        cond = (t.c.study_id == study_id) & which
        with self.engine.connect() as conn:
            trials = conn.execute(
                select(t.c.trial_id, t.c.number, t.c.state, t.c.datetime_complete).where(cond)
            ).all()
            if not trials:
                return []
            join = t.join(a, a.c.trial_id == t.c.trial_id)
            attrs = conn.execute(
                select(a.c.trial_id, a.c.key, a.c.value_json)
                .select_from(join)
                .where(cond & a.c.key.in_(ROW_KEYS))
            ).all()
            params = conn.execute(
                select(p.c.trial_id, p.c.param_name, p.c.param_value, p.c.distribution_json)
                .select_from(t.join(p, p.c.trial_id == t.c.trial_id))
                .where(cond)
            ).all()
            values = conn.execute(
                select(v.c.trial_id, v.c.objective, v.c.value, v.c.value_type)
                .select_from(t.join(v, v.c.trial_id == t.c.trial_id))
                .where(cond)
            ).all()
        out: dict[int, RawTrial] = {}
        for tid, number, state, done in trials:
            st = state if isinstance(state, TrialState) else TrialState[str(state)]
            ts = done.replace(tzinfo=UTC).timestamp() if done is not None else 0.0
            out[tid] = RawTrial(tid, number, st, {}, {}, {}, None, ts)
        for tid, key, text in attrs:
            out[tid].user_attrs[key] = json.loads(text)
        for tid, name, value, dist_json in params:
            dist = self._dist(dist_json)
            out[tid].params[name] = dist.to_external_repr(value)
            out[tid].distributions[name] = dist
        by_trial: dict[int, dict[int, float]] = {}
        for tid, objective, value, vtype in values:
            kind = getattr(vtype, "name", str(vtype))
            x = math.inf if kind == "INF_POS" else -math.inf if kind == "INF_NEG" else value
            by_trial.setdefault(tid, {})[objective] = float(x)
        for tid, vals in by_trial.items():
            out[tid].values = [vals[k] for k in sorted(vals)]
        return sorted(out.values(), key=lambda r: r.number)
