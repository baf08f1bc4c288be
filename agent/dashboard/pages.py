"""The dashboard's HTML pages (Jinja2, server-rendered): fleet, studies, a study, a trial,
promotions; each shows what its ``/api`` twin returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from agent.dashboard import plots
from agent.dashboard.api import fleet_data
from agent.dashboard.data import Reader
from agent.dashboard.rows import OUTCOMES, VERDICTS

SORTS = ("-number", "number", "-metric", "metric", "-ratio", "ratio")

# page(request, template, status_code=200, **context): a rendered template
Page = Callable[..., HTMLResponse]


def page_router(reader: Reader, page: Page, ray_dashboard: str | None) -> APIRouter:
    """The HTML routes over ``reader``, rendered by ``page``; the study route comes last."""
    pages = APIRouter()

    @pages.get("/", response_class=HTMLResponse)
    def fleet_page(request: Request) -> HTMLResponse:
        fleet = fleet_data(reader, ray_dashboard)
        return page(request, "fleet.html", title="fleet", fleet=fleet, studies=reader.studies())

    @pages.get("/fleet", include_in_schema=False)
    def fleet_alias() -> RedirectResponse:
        return RedirectResponse("/")

    @pages.get("/studies", response_class=HTMLResponse)
    def studies_page(request: Request) -> HTMLResponse:
        studies = reader.studies()
        by_class: dict[str, list[dict[str, Any]]] = {}
        for s in studies:
            by_class.setdefault(s["device_class"] or "(unknown)", []).append(s)
        return page(
            request,
            "studies.html",
            title="studies",
            by_class=by_class,
            n=len(studies),
            stale=reader.agent_stale(),
        )

    @pages.get("/promotions", response_class=HTMLResponse)
    def promotions_page(request: Request) -> HTMLResponse:
        return page(request, "promotions.html", title="promotions", promotions=reader.promotions())

    @pages.get("/studies/{name:path}/trials/{number:signed}", response_class=HTMLResponse)
    def trial_page(request: Request, name: str, number: int) -> HTMLResponse:
        t = reader.trial(name, number)
        rec = t["record"]
        fig = plots.samples(rec["samples"]) if rec.get("samples") else None
        progress = reader.progress(name) if t["outcome"] in ("running", "waiting") else None
        return page(
            request,
            "trial.html",
            title=f"{name} #{number}",
            t=t,
            rec=rec,
            figure=fig,
            study=reader.summary(name),
            progress=progress,
            page_key=t["outcome"],
            stamp_url=f"/api/stamp?study={quote(name)}",
        )

    @pages.get("/studies/{name:path}", response_class=HTMLResponse)
    def study_page(
        request: Request,
        name: str,
        page_: int = Query(1, ge=1, alias="page"),
        per_page: int = Query(50, ge=1, le=1000),
        outcome: str | None = None,
        sort: str = "-number",
    ) -> HTMLResponse:
        s = reader.summary(name)
        table = reader.trials(name, page_, per_page, outcome or None, sort)
        return page(
            request,
            "study.html",
            title=name,
            s=s,
            table=table,
            history=plots.history(reader.history(name)),
            progress=reader.progress(name),
            outcomes=[o for o in (*VERDICTS, *OUTCOMES) if s["verdicts"].get(o) and o != "ok"],
            sorts=SORTS,
            stamp_url=f"/api/stamp?study={quote(name)}",
        )

    return pages
