"""The dashboard as a skeptical user or an attacker meets it: a PostgreSQL password never shown,
an unreachable storage one line, a dead agent never shown as running (issue 30)."""

from __future__ import annotations

import socket
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from agent.cli import main
from agent.dashboard import _announce, create_app
from agent.dashboard.synthetic import write_study
from agent.storage import parse_storage

SECRET = "s3cr3t-pw"


def _with_password(url: str) -> str:
    return url.replace("postgresql://postgres@", f"postgresql://postgres:{SECRET}@")


def test_the_postgres_password_is_masked_on_every_page(
    pg_url: str, capsys: pytest.CaptureFixture
) -> None:
    """Footers, 404 pages, /api/studies and the start-up line (the server trusts any password,
    so the one in the URL is the user's secret as given)."""
    url = _with_password(pg_url)
    name = write_study(parse_storage(url).open(), "r9700", 4, seed=1)
    client = TestClient(create_app(url, refresh_s=0.0))
    pages = ["/", "/studies", f"/studies/{quote(name)}", "/promotions", "/studies/nope"]
    for path in [*pages, "/api/studies", "/api/studies/nope"]:
        r = client.get(path)
        assert r.status_code in (200, 404), (path, r.status_code)
        assert SECRET not in r.text, path
    assert "postgres:***@" in client.get("/studies").text
    assert (
        client.get("/api/studies")
        .json()["storage"]
        .startswith("postgresql+psycopg://postgres:***@")
    )
    _announce(url, "127.0.0.1", 8080, None)
    line = capsys.readouterr().err
    assert SECRET not in line and "postgres:***@" in line


def test_dashboard_on_an_unreachable_postgres_is_one_line(capsys: pytest.CaptureFixture) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"postgresql://u:{SECRET}@127.0.0.1:{port}/x"
    assert main(["dashboard", "--storage", url]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("dashboard: --storage postgresql+psycopg://u:***@127.0.0.1")
    assert "cannot connect" in err and SECRET not in err
