"""What the dashboard shows, read from the agent's storage and fleet status file, never written.

``Reader`` is a ``StudyStore`` (store.py: the storage opened read-only, one incremental cache
per study, so a page of a 10,000-trial study costs a slice of a list, not a load of every
trial's attrs) that answers the pages: a study's summary, its trials table, one trial here;
what the rest show is built apart: figures.py (the study page's figures), promotions.py,
fleet_view.py (the fleet page, a study's progress), over rows.py (a trial as a row) and chain.py
(the chained speedup).

The shapes read here are the agent's (docs/agent.md): study user attrs ``experiment``,
``device_class``, ``backend``, ``model``, ``family``, ``objectives``, ``target``, ``baseline``,
``best``, ``promotion``; trial user attrs are an ``agent.records.TrialRecord``; the fleet status
file is ``agent.fleet.write_status``'s ``{"agent", "workers", "studies"}``. Every key is optional
here, so studies written by hand or by an older agent still show.
"""

from __future__ import annotations

from typing import Any

import optuna

from agent.dashboard import figures, fleet_view, promotions
from agent.dashboard.rows import (
    BUDGET,
    FAILED,
    OUTCOMES,
    VERDICTS,
    NotFound,
    StudyCache,
    TrialRow,
    raw_trial,
)
from agent.dashboard.store import StudyStore
from agent.records import TrialRecord

__all__ = ["Reader"]


class Reader(StudyStore):
    """Read-only view of one storage and its fleet status file, cached per study: the data of
    every page (summary, trials, a trial here; figures, promotions and the fleet apart)."""

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

    def _win(self, c: StudyCache, chain: dict[str, Any], baseline: int | None) -> str:
        """Both figures of the best, named (agent.win): its last link (the ratio acceptance
        decided on, against the previous best) and the chained speedup over the baseline."""
        from agent.win import win_line

        if not chain["links"]:
            return ""
        last = chain["links"][-1]
        total = chain if chain["complete"] else None
        return win_line(last["ratio"], last["lower"], last["against"], total, baseline)

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
