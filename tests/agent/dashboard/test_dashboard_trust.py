"""The dashboard as a skeptical user or an attacker meets it: a PostgreSQL password never shown,
an unreachable storage one line, a dead agent never shown as running (issue 30)."""

from __future__ import annotations

import json
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


def _fleet_of_an_agent_on_another_host(tmp_path, heartbeat_ago: float) -> tuple[str, str]:  # noqa: ANN001
    """A journal with one study whose lease an agent on another host holds (its last heartbeat
    ``heartbeat_ago`` s ago), and the status file that agent last wrote a second ago: running,
    its worker busy on trial 3. Its pid cannot be checked from here."""
    import json
    import time
    from dataclasses import asdict

    from agent.lease import KEY, Holder

    ref = parse_storage(str(tmp_path / "s.journal"))
    storage = ref.open()
    name = write_study(storage, "r9700", 6, seed=2, running=1)
    now = time.time()
    # agent, host, pid, experiment, since, heartbeat, expires (pidns unknown)
    beat = now - heartbeat_ago
    holder = Holder("other-agent", "head-node-elsewhere", 4242, "e", now - 100, beat, beat + 60)
    storage.set_study_system_attr(storage.get_study_id_from_name(name), KEY, asdict(holder))
    agent = {
        "host": "head-node-elsewhere",
        "pid": 4242,
        "experiment": "e",
        "started": now - 100,
        "updated": now - 1,
        "state": "running",
        "trial_timeout_s": 600,
        "wall_time_s": 3600,
    }
    worker = {"worker_id": "r9700-0", "device_class": "r9700", "state": "busy"}
    worker |= {"current": f"{name} #5", "current_since": now - 5}
    status = {"agent": agent, "workers": [worker], "studies": [{"study": name, "budget": 20}]}
    ref.status_path.write_text(json.dumps(status))
    return ref.url, name


def test_a_dead_agent_is_shown_gone_everywhere(tmp_path) -> None:  # noqa: ANN001
    """Killed on another host: its status file still said running a second before, so the
    dashboard showed the agent running, its worker busy, time left, and /studies no banner.
    Its study leases stopped beating: every view says it is gone."""
    url, name = _fleet_of_an_agent_on_another_host(tmp_path, heartbeat_ago=45)
    client = TestClient(create_app(url, refresh_s=0.0))
    fleet = client.get("/api/fleet").json()
    assert "lease heartbeat stopped 45 s ago" in fleet["stale"]
    assert fleet["agent"]["state"] == "gone" and fleet["agent"]["reported_state"] == "running"
    (w,) = fleet["workers"]
    assert w["state"] == "unknown" and w["reported_state"] == "busy"
    (run,) = [i for i in fleet["invocations"] if i.get("pid") == 4242]
    assert run["state"] == "gone"
    progress = client.get(f"/api/studies/{quote(name)}/progress").json()
    assert progress["agent_state"] == "gone" and progress["eta_s"] is None and progress["stale"]
    page = client.get("/studies").text
    assert 'id="stale"' in page and "agent gone" in page
    assert "busy" not in client.get("/").text.split("<table")[1]  # the workers table


def test_a_live_agent_on_another_host_is_not_called_gone(tmp_path) -> None:  # noqa: ANN001
    url, _ = _fleet_of_an_agent_on_another_host(tmp_path, heartbeat_ago=5)
    client = TestClient(create_app(url, refresh_s=0.0))
    fleet = client.get("/api/fleet").json()
    assert fleet["stale"] == "" and fleet["agent"]["state"] == "running"
    assert fleet["workers"][0]["state"] == "busy"
    assert 'id="stale"' not in client.get("/studies").text


def test_history_colours_by_verdict_every_objective_pareto_and_parallel(tmp_path) -> None:  # noqa: ANN001
    """The history drew every ok trial in one colour (a rejected trial above the accepted best
    read as a winner), the target alone, and no crash. Now: a trace per verdict, a panel per
    objective, failures drawn with their reason; Optuna's Pareto front (two objectives) and
    parallel coordinates served beside it."""
    from agent.dashboard.synthetic import OBJECTIVES

    ref = parse_storage(str(tmp_path / "s.journal"))
    name = write_study(ref.open(), "r9700", 40, seed=4, running=0)
    client = TestClient(create_app(ref.url, refresh_s=0.0))
    h = client.get(f"/api/studies/{quote(name)}/history").json()
    trials = client.get(f"/api/studies/{quote(name)}/trials?per_page=1000").json()["rows"]
    verdict_of = {t["number"]: t["verdict"] for t in trials}
    for group, points in h["by_verdict"].items():
        for n in points["numbers"]:
            v = verdict_of[n]
            assert v == group or (
                group == "failed" and v in ("crash", "compile_error", "timeout", "invalid")
            )
    assert h["by_verdict"]["rejected"]["numbers"] and h["by_verdict"]["failed"]["numbers"]
    page = client.get(f"/studies/{quote(name)}").text
    fig = json.loads(page.split('id="history-fig" class="live-figure">')[1].split("</script>")[0])
    colours = {t["name"]: t["marker"]["color"] for t in fig["data"] if t.get("legendgroup")}
    assert set(colours) == {"baseline", "accepted", "rejected", "failed"}
    assert len(set(colours.values())) == 4
    panels = {t["yaxis"] for t in fig["data"]}
    assert len(panels) == len(OBJECTIVES) + 1  # one per objective, and the speedup
    assert 'id="pareto"' in page and 'id="parallel"' in page
    pareto = client.get(f"/api/studies/{quote(name)}/pareto").json()
    assert pareto["figure"]["data"] and not pareto["error"]
    titles = json.dumps(pareto["figure"]["layout"])
    assert OBJECTIVES[0] in titles and OBJECTIVES[1] in titles
    parallel = client.get(f"/api/studies/{quote(name)}/parallel").json()
    assert parallel["figure"]["layout"]["title"]["text"] == "Parallel Coordinate Plot"
    axes = json.dumps(parallel["figure"])
    assert "matmul_" in axes and OBJECTIVES[0] in axes  # the parameters and the target


def test_importances_under_ten_trials_are_a_caveat_not_an_error(tmp_path) -> None:  # noqa: ANN001
    ref = parse_storage(str(tmp_path / "s.journal"))
    name = write_study(ref.open(), "r9700", 5, seed=1, running=0)
    client = TestClient(create_app(ref.url, refresh_s=0.0))
    imp = client.get(f"/api/studies/{quote(name)}/importances").json()
    assert imp["error"] == "" and imp["figure"] is None
    assert imp["caveat"].startswith("only ") and "about 10 or more" in imp["caveat"]
