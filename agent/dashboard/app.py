"""The dashboard's FastAPI app: server-rendered pages (Jinja2) over a JSON API, both read-only.

Pages: ``/`` fleet, ``/studies``, ``/studies/<study>`` (paged trials table, history, importances),
``/studies/<study>/trials/<n>``, ``/promotions``. Every page has its JSON twin under ``/api``;
``/api/stamp`` changes when anything shown changes, and the pages poll it to refresh while an
agent runs. plotly.js and the Swagger UI of ``/api/docs`` are served from installed packages
(plotly, fastapi-offline): no CDN, fleets may be offline. With ``token`` set, every request must
carry it (``Authorization: Bearer <token>``, or ``?token=`` once: that sets a cookie and redirects
to the same URL without it, so the token does not stay in the address bar, history or logs). With
``hosts`` set, a request whose Host header names another machine is refused (DNS rebinding).
The routes: api.py (JSON), pages.py (HTML); here the app, its guards and its error pages.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.convertors import IntegerConvertor, register_url_convertor

from agent.dashboard.api import api_router
from agent.dashboard.data import Reader
from agent.dashboard.pages import Page, page_router
from agent.dashboard.rows import NotFound, StorageMissing

HERE = Path(__file__).parent


class SignedIntConvertor(IntegerConvertor):
    """Trial numbers with a sign: /trials/-1 reaches the trial route and answers "no trial -1",
    where the plain int convertor left it to the study route ("no study named .../trials/-1")."""

    regex = "-?[0-9]+"


register_url_convertor("signed", SignedIntConvertor())


def swagger_static() -> Path:
    """Swagger UI's bundle and css from the installed fastapi-offline package."""
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def host_allowed(header: str | None, hosts: Sequence[str], any_ip: bool) -> bool:
    """Whether a Host header names this dashboard: one of ``hosts`` (port ignored), or, with
    ``any_ip`` (bound to every interface), any IP literal: DNS rebinding needs a name."""
    if not header:
        return False
    name = header.strip().lower()
    if name.startswith("["):  # [v6]:port
        name = name[: name.find("]") + 1] if "]" in name else name
    else:
        name = name.rsplit(":", 1)[0] if name.count(":") == 1 else name
    if name in hosts:
        return True
    if any_ip:
        try:
            ipaddress.ip_address(name.strip("[]"))
            return True
        except ValueError:
            return False
    return False


def plotly_js() -> Path:
    """plotly.min.js from the installed plotly package."""
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: reinstall plotly (pip install plotly)")
    return path


# --- template filters -----------------------------------------------------------------------
def _num(v: Any, digits: int = 4) -> str:
    if v is None or v == "":
        return "–"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if v == 0:
        return "0"
    if abs(v) >= 1e5 or abs(v) < 1e-3:
        return f"{v:.{digits - 1}e}"
    return f"{v:.{digits}g}"


def _when(ts: Any) -> str:
    if not ts:
        return "–"
    return datetime.fromtimestamp(float(ts), UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: Any) -> str:
    return "–" if seconds is None else _dur(seconds) + " ago"


def _dur(seconds: Any) -> str:
    if seconds is None:
        return "–"
    s = float(seconds)
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _study_url(name: str) -> str:
    return "/studies/" + quote(name, safe="/")


def _trial_link(current: str) -> tuple[str, str] | None:
    """``"<study> #<n>"`` (a worker's current trial) -> (study, n)."""
    study, sep, n = str(current).rpartition(" #")
    return (study, n) if sep and n.isdigit() else None


def _pretty(v: Any) -> str:
    return json.dumps(v, indent=1, sort_keys=True, default=str)


def create_app(
    storage_url: str,
    token: str | None = None,
    refresh_s: float = 1.0,
    warm: bool = True,
    hosts: Sequence[str] | None = None,
    any_ip: bool = False,
    ray_dashboard: str | None = None,
) -> FastAPI:
    """The dashboard app over one storage (opened read-only; a missing file raises now).
    ``warm``: read every study's trials in a background thread now, so the first page a user
    opens does not pay for loading a big study. ``hosts``: the Host header names accepted (None:
    any, for in-process use); ``ray_dashboard``: a Ray dashboard URL to link to (default: the
    one in the agent's status file)."""
    reader = Reader(storage_url, refresh_s=refresh_s)
    if warm:
        threading.Thread(target=reader.warm, name="dashboard-warm", daemon=True).start()
    app = FastAPI(title="fleettune dashboard", docs_url=None, redoc_url=None)
    app.state.reader = reader
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    env = templates.env
    env.filters.update(
        num=_num, when=_when, ago=_ago, dur=_dur, study_url=_study_url, pretty=_pretty
    )
    env.globals.update(storage=reader.ref.display, trial_link=_trial_link, quote=quote)
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    app.mount("/api/docs-static", StaticFiles(directory=str(swagger_static())), name="swagger")

    def page(request: Request, name: str, status_code: int = 200, **ctx: Any) -> HTMLResponse:
        ctx.setdefault("stamp_url", "/api/stamp")
        ctx.setdefault("ray_dashboard", ray_dashboard)
        return templates.TemplateResponse(request, name, ctx, status_code=status_code)

    _guard(app, token, hosts, any_ip)
    _error_pages(app, page, reader.ref.display)
    # In this order: the first route that matches answers, and the study routes match any path.
    app.include_router(_static_router(plotly_js(), app.openapi_url or "/openapi.json"))
    app.include_router(api_router(reader, ray_dashboard))
    app.include_router(page_router(reader, page, ray_dashboard))
    return app


def _guard(app: FastAPI, token: str | None, hosts: Sequence[str] | None, any_ip: bool) -> None:
    """The token check (with ``token``) and the Host check (with ``hosts``)."""
    # Middlewares run last-added first: the Host check wraps the token check.
    if token:

        @app.middleware("http")
        async def require_token(request: Request, call_next: Any) -> Response:
            given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
            in_url = request.query_params.get("token")
            given = given or in_url or request.cookies.get("ft_token")
            if not given or not hmac.compare_digest(given.encode(), token.encode()):
                return JSONResponse({"detail": "this dashboard needs its token"}, status_code=401)
            if in_url and request.method == "GET":
                # Cookie set, token out of the URL (address bar, history, proxy logs, Referer).
                rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
                target = request.url.path + ("?" + urlencode(rest) if rest else "")
                redirect = RedirectResponse(target, status_code=303)
                redirect.set_cookie("ft_token", token, httponly=True, samesite="strict")
                return redirect
            response: Response = await call_next(request)
            return response

    if hosts is not None:
        names = tuple(h.lower() for h in hosts)

        @app.middleware("http")
        async def check_host(request: Request, call_next: Any) -> Response:
            if not host_allowed(request.headers.get("host"), names, any_ip):
                return PlainTextResponse(
                    f"Host {request.headers.get('host')!r} is not this dashboard's "
                    "(start it with --allow-host NAME to accept that name)",
                    status_code=400,
                )
            response: Response = await call_next(request)
            return response


def _error_pages(app: FastAPI, page: Page, storage: str) -> None:
    """Errors as a page (or JSON under /api): not found 404, bad request 400, the storage
    missing or failing 503 (a database down, a file locked or corrupt), never a bare 500."""

    def not_found(request: Request, e: NotFound) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": str(e)}, status_code=404)
        return page(request, "error.html", 404, title="not found", message=str(e))

    @app.exception_handler(NotFound)
    async def _nf(request: Request, e: NotFound) -> Response:
        return not_found(request, e)

    @app.exception_handler(ValueError)
    async def _bad(request: Request, e: ValueError) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": str(e)}, status_code=400)
        return page(request, "error.html", 400, title="bad request", message=str(e))

    @app.exception_handler(StorageMissing)
    async def _gone(request: Request, e: StorageMissing) -> Response:
        return unavailable(request, str(e))

    @app.exception_handler(Exception)
    async def _broken(request: Request, e: Exception) -> Response:
        # The storage failing under the dashboard (a database down, a file locked or corrupt):
        # say so on the page, not a bare 500.
        return unavailable(request, f"cannot read the storage {storage}: {e}")

    def unavailable(request: Request, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"detail": message}, status_code=503)
        return page(request, "error.html", 503, title="storage unavailable", message=message)

    @app.exception_handler(404)
    async def _404(request: Request, e: Exception) -> Response:
        msg = f"no page at {request.url.path}: see / (fleet), /studies, /promotions, /api/docs"
        return not_found(request, NotFound(msg))


def _static_router(js: Path, openapi_url: str) -> APIRouter:
    """plotly.js, the Swagger UI of /api/docs (both from installed packages) and no favicon."""
    static = APIRouter()

    @static.get("/plotly.min.js", include_in_schema=False)
    def plotly_min_js() -> FileResponse:
        return FileResponse(
            js, media_type="application/javascript", headers={"Cache-Control": "max-age=86400"}
        )

    @static.get("/api/docs", include_in_schema=False)
    def api_docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title="fleettune dashboard API",
            swagger_js_url="/api/docs-static/swagger-ui-bundle.js",
            swagger_css_url="/api/docs-static/swagger-ui.css",
            swagger_favicon_url="/api/docs-static/favicon.png",
        )

    @static.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        return Response(status_code=204)

    return static
