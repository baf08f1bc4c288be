"""The dashboard's JSON API (``/api/...``): what every page shows, as data; read-only."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Query

from agent.dashboard import plots
from agent.dashboard.data import Reader


def fleet_data(reader: Reader, ray_dashboard: str | None) -> dict[str, Any]:
    """The fleet page's data: the status file's fleet, the Ray dashboard link, throughput."""
    f = reader.fleet()
    if ray_dashboard:
        f["ray_dashboard"] = ray_dashboard
    f["throughput_figure"] = plots.throughput(f.get("workers") or [])
    return f


def api_router(reader: Reader, ray_dashboard: str | None) -> APIRouter:
    """The ``/api`` routes over ``reader``; the study routes come last (``{name:path}``)."""
    api = APIRouter()

    @api.get("/api/stamp")
    def api_stamp(study: str | None = None) -> dict[str, Any]:
        """Changes whenever a page would change: poll it, reload when it differs."""
        return {"stamp": reader.stamp(study), "time": time.time()}

    @api.get("/api/fleet")
    def api_fleet() -> dict[str, Any]:
        return fleet_data(reader, ray_dashboard)

    @api.get("/api/studies")
    def api_studies() -> dict[str, Any]:
        return {"storage": reader.ref.display, "studies": reader.studies()}

    @api.get("/api/promotions")
    def api_promotions() -> dict[str, Any]:
        return {"promotions": reader.promotions()}

    @api.get("/api/studies/{name:path}/trials/{number:signed}")
    def api_trial(name: str, number: int) -> dict[str, Any]:
        return reader.trial(name, number)

    @api.get("/api/studies/{name:path}/trials")
    def api_trials(
        name: str,
        page: int = Query(1, ge=1),
        per_page: int = Query(50, ge=1, le=1000),
        outcome: str | None = None,
        sort: str = "-number",
    ) -> dict[str, Any]:
        return reader.trials(name, page, per_page, outcome or None, sort)

    @api.get("/api/studies/{name:path}/history")
    def api_history(name: str) -> dict[str, Any]:
        return reader.history(name)

    @api.get("/api/studies/{name:path}/progress")
    def api_progress(name: str) -> dict[str, Any]:
        return reader.progress(name)

    @api.get("/api/studies/{name:path}/importances")
    def api_importances(name: str) -> dict[str, Any]:
        imp = reader.importances(name)
        fig = plots.importances(imp["importances"], imp["target"]) if imp["importances"] else None
        return {**imp, "figure": fig}

    @api.get("/api/studies/{name:path}/parallel")
    def api_parallel(name: str) -> dict[str, Any]:
        """Optuna's parallel-coordinates plot of the ok trials, on the target objective."""
        import optuna.visualization as vis

        study, objs = reader.optuna_study(name)
        n = sum(bool(t.params) for t in study.trials)
        if n < 2:
            return {"figure": None, "error": f"needs 2 ok trials with parameters; has {n}"}
        fig = vis.plot_parallel_coordinate(study, target=lambda t: t.values[0], target_name=objs[0])
        return {"figure": plots.optuna_figure(fig), "error": ""}

    @api.get("/api/studies/{name:path}/pareto")
    def api_pareto(name: str) -> dict[str, Any]:
        """Optuna's Pareto-front plot, for a study of two objectives."""
        import optuna.visualization as vis

        study, objs = reader.optuna_study(name)
        if len(objs) != 2:
            return {
                "figure": None,
                "error": f"drawn for two objectives; this study has {len(objs)}",
            }
        if not study.trials:
            return {"figure": None, "error": "no ok trial with both objectives yet"}
        fig = vis.plot_pareto_front(study, target_names=objs)
        return {"figure": plots.optuna_figure(fig), "error": ""}

    @api.get("/api/studies/{name:path}")
    def api_study(name: str) -> dict[str, Any]:
        return reader.summary(name)

    return api
