"""Dashboard API and pages over a storage filled by a real agent run (NumPy backend, synthetic tiny
model, 4 trials), plus one synthetic study in the agent's shape that carries what a short CPU run
cannot produce on demand: failures, invalid candidates, accepted trials and a promotion."""

from __future__ import annotations

import hashlib
import html
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from fastapi.testclient import TestClient

from agent.dashboard import create_app
from agent.dashboard.data import Reader
from agent.dashboard.rows import StorageMissing
from agent.dashboard.synthetic import write_study
from agent.records import TrialRecord
from agent.storage import parse_storage

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENT = """
name = "dashtest"
models = ["synthetic:tiny"]
backends = ["numpy"]
[space.numpy.prefill]
chunk_tokens = [4, 8, 16]
[space.numpy.matmul_prefill]
variants = "all"
[[objectives]]
metric = "prefill_tok_s"
prompt_tokens = 16
[[objectives]]
metric = "decode_tok_s"
prompt_tokens = 4
gen_tokens = 2
[validate]
random_prompts = [5]
steps = 2
[bench]
pairs = 2
warmup = 0
[budget]
trials = 4
trial_timeout_s = 120
[acceptance]
confirm = false
[sampler]
seed = 0
startup_trials = 2
"""
REAL = "dashtest/cpu/synthetic-qwen2-tiny-q4_k_m"
SYNTH = "synthetic/r9700/synthetic-qwen2-tiny-q4_k_m"
SYNTH_TRIALS = 40


def build_storage(root: Path) -> Path:
    """Run the agent once into root/studies.db and add the synthetic study; reused when done."""
    db = root / "studies.db"
    done = root / "done"
    if done.exists():
        return db
    root.mkdir(parents=True, exist_ok=True)
    exp = root / "dashtest.toml"
    exp.write_text(EXPERIMENT)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    r = subprocess.run(
        [sys.executable, "-m", "agent", "run", str(exp), "--storage", str(db), "--no-promote"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, f"agent run failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    write_study(parse_storage(str(db)).open(), "r9700", SYNTH_TRIALS, seed=3, running=1)
    done.write_text("ok")
    return db


@pytest.fixture(scope="session")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_storage(tmp_path_factory.getbasetemp() / "dashboard-storage")


@pytest.fixture(scope="module")
def client(storage: Path) -> TestClient:
    return TestClient(create_app(str(storage), refresh_s=0.0))


def q(name: str) -> str:
    return name  # study names are path segments: slashes stay as they are


# --- studies --------------------------------------------------------------------------------
def test_studies_lists_the_real_and_synthetic_studies(client: TestClient) -> None:
    body = client.get("/api/studies").json()
    by_name = {s["name"]: s for s in body["studies"]}
    assert set(by_name) == {REAL, SYNTH}
    real = by_name[REAL]
    assert real["device_class"] == "cpu" and real["backend"] == "numpy"
    assert real["target"] == "prefill_tok_s@16"
    assert real["evaluated"] == 4  # the budget, every trial ran on the worker
    assert real["baseline_trial"] == 0
    assert real["best_trial"] is not None and real["speedup"] is not None
    synth = by_name[SYNTH]
    assert synth["trials"] == SYNTH_TRIALS
    assert synth["running"] == 1
    assert synth["failed"] > 0 and synth["invalid"] > 0
    # Every trial is counted once: ok (baseline, accepted, rejected), failures, duplicates...
    assert sum(synth["verdicts"].values()) == sum(synth["counts"].values()) == SYNTH_TRIALS
    assert synth["verdicts"]["duplicate"] > 0 and synth["verdicts"]["interrupted"] > 0
    v = synth["verdicts"]
    assert v["baseline"] + v["accepted"] + v["rejected"] == synth["done"]
    assert synth["promoted"] and synth["speedup"] > 1.0


def test_study_summary_matches_storage(client: TestClient, storage: Path) -> None:
    s = client.get(f"/api/studies/{q(REAL)}").json()
    study = optuna.load_study(study_name=REAL, storage=f"sqlite:///{storage}")
    assert s["trials"] == len(study.trials)
    ok = [t for t in study.trials if t.user_attrs.get("outcome") == "ok"]
    assert s["done"] == len(ok)
    base = next(t for t in ok if t.user_attrs["role"] == "baseline")
    assert s["baseline_metrics"] == base.user_attrs["metrics"]


# --- trials ---------------------------------------------------------------------------------
def test_trials_are_paged_newest_first(client: TestClient) -> None:
    p1 = client.get(f"/api/studies/{q(SYNTH)}/trials", params={"per_page": 15}).json()
    assert p1["total"] == SYNTH_TRIALS and p1["pages"] == 3
    assert [r["number"] for r in p1["rows"]] == list(range(SYNTH_TRIALS - 1, SYNTH_TRIALS - 16, -1))
    p3 = client.get(f"/api/studies/{q(SYNTH)}/trials", params={"per_page": 15, "page": 3}).json()
    assert [r["number"] for r in p3["rows"]] == list(range(9, -1, -1))
    assert p1["rows"][0]["outcome"] == "running"


def test_trials_filter_and_sort(client: TestClient) -> None:
    url = f"/api/studies/{q(SYNTH)}/trials"
    inv = client.get(url, params={"outcome": "invalid"}).json()
    assert inv["total"] > 0 and all(r["outcome"] == "invalid" for r in inv["rows"])
    assert all(r["max_abs_diff"] > 0.01 and r["reason"] for r in inv["rows"])
    failed = client.get(url, params={"outcome": "failed"}).json()
    assert {r["outcome"] for r in failed["rows"]} <= {"compile_error", "crash", "timeout"}
    best = client.get(url, params={"sort": "-metric", "per_page": 5}).json()
    vals = [r["metrics"][best["target"]] for r in best["rows"]]
    assert vals == sorted(vals, reverse=True)
    for verdict in ("accepted", "rejected", "baseline"):
        rows = client.get(url, params={"outcome": verdict, "per_page": 1000}).json()["rows"]
        assert rows and all(r["verdict"] == verdict and r["outcome"] == "ok" for r in rows)
    acc = client.get(url, params={"outcome": "accepted", "per_page": 1000}).json()["rows"]
    assert all(r["accepted"] and r["lower"] > r["threshold"] for r in acc)
    rej = client.get(url, params={"outcome": "rejected", "per_page": 1000}).json()["rows"]
    assert all(not r["accepted"] and r["lower"] <= r["threshold"] for r in rej)
    r = client.get(url, params={"outcome": "acepted"})
    assert r.status_code == 400 and "outcome='acepted'" in r.json()["detail"]
    r = client.get(url, params={"sort": "sideways"})
    assert r.status_code == 400 and "sort='sideways'" in r.json()["detail"]
    assert client.get(url, params={"page": 0}).status_code == 422


def test_trial_detail_is_the_agents_record(client: TestClient, storage: Path) -> None:
    study = optuna.load_study(study_name=REAL, storage=f"sqlite:///{storage}")
    t = next(t for t in study.trials if t.user_attrs.get("outcome") == "ok" and t.number > 0)
    body = client.get(f"/api/studies/{q(REAL)}/trials/{t.number}").json()
    assert body["outcome"] == "ok" and body["params"] == t.params
    rec = TrialRecord.from_attrs(REAL, t.number, body["record"])
    assert rec == TrialRecord.from_attrs(REAL, t.number, t.user_attrs)
    assert set(rec.samples) == {"prefill_tok_s@16", "decode_tok_s@4"}
    assert len(rec.samples["prefill_tok_s@16"].candidate) == 2  # bench.pairs
    assert rec.validate and rec.validate.passed


def test_bad_ids_answer_404_with_a_message(client: TestClient) -> None:
    r = client.get("/api/studies/no/such/study")
    assert r.status_code == 404
    assert "no study named 'no/such/study'" in r.json()["detail"] and REAL in r.json()["detail"]
    r = client.get(f"/api/studies/{q(REAL)}/trials/999")
    assert r.status_code == 404 and "has no trial 999" in r.json()["detail"]
    for url in (f"/api/studies/{q(REAL)}/trials/-1", f"/studies/{q(REAL)}/trials/-1"):
        r = client.get(url)  # was "no study named '<study>/trials/-1'"
        assert r.status_code == 404 and "has no trial -1" in r.text and "no study" not in r.text
    r = client.get("/studies/no/such/study")
    assert r.status_code == 404 and "no study named" in r.text and "<html" in r.text
    r = client.get(f"/studies/{q(REAL)}/trials/999")
    assert r.status_code == 404 and "has no trial 999" in r.text
    r = client.get("/nowhere")
    assert r.status_code == 404 and "no page at /nowhere" in r.text
    assert client.get("/api/nowhere").status_code == 404


# --- plots ----------------------------------------------------------------------------------
def test_speedup_is_the_chained_paired_estimate(client: TestClient, storage: Path) -> None:
    """Not best median / baseline median (measured at different times): the product of the
    accepted paired ratios from the baseline to the best, each against the best of its time."""
    s = client.get(f"/api/studies/{q(SYNTH)}").json()
    study = optuna.load_study(study_name=SYNTH, storage=f"sqlite:///{storage}")
    by_n = {t.number: t.user_attrs for t in study.trials}
    n, product, links = s["best_trial"], 1.0, []
    while by_n[n].get("role") != "baseline":
        product *= by_n[n]["estimates"][s["target"]]["ratio"]
        links.append(n)
        n = by_n[n]["paired_against"]
    assert len(links) >= 2  # a real chain, not one link
    assert [x["trial"] for x in s["chain"]["links"]] == links[::-1]
    assert s["speedup"] == pytest.approx(product, rel=1e-12)
    assert s["speedup_lower"] < s["speedup"] < s["speedup_upper"]
    # The interval of a chain is wider than that of its last link.
    last = by_n[s["best_trial"]]["estimates"][s["target"]]
    assert s["speedup_upper"] / s["speedup_lower"] > last["upper"] / last["lower"]
    assert s["median_ratio_unpaired"] != pytest.approx(s["speedup"], rel=1e-9)
    page = client.get(f"/studies/{SYNTH}").text
    assert f"×{s['speedup']:.3f}" in page and f"{s['speedup_lower']:.3f}" in page
    assert f"×{s['median_ratio_unpaired']:.3f}" not in page


def test_history_shows_the_chained_speedup(client: TestClient) -> None:
    h = client.get(f"/api/studies/{q(SYNTH)}/history").json()
    s = client.get(f"/api/studies/{q(SYNTH)}").json()
    assert h["target"] == "prefill_tok_s@64"
    assert h["numbers"] == sorted(h["numbers"]) and len(h["numbers"]) == len(h["values"])
    sp = h["speedup"]
    assert sp["numbers"][0] == s["baseline_trial"] and sp["ratio"][0] == 1.0
    assert sp["ratio"][-1] == pytest.approx(s["speedup"]) and sp["complete"]
    assert sp["upper"][-1] == pytest.approx(s["speedup_upper"])
    assert all(
        lo <= r <= hi for lo, r, hi in zip(sp["lower"], sp["ratio"], sp["upper"], strict=True)
    )
    assert set(h["accepted"]["numbers"]) >= {x["trial"] for x in s["chain"]["links"]}


def test_importances(client: TestClient) -> None:
    body = client.get(f"/api/studies/{q(SYNTH)}/importances").json()
    assert body["error"] == "" and body["importances"]
    assert abs(sum(body["importances"].values()) - 1.0) < 1e-6
    assert body["figure"]["data"][0]["type"] == "bar"


# --- promotions and fleet -------------------------------------------------------------------
def test_promotions_carry_evidence_and_diff(client: TestClient) -> None:
    proms = client.get("/api/promotions").json()["promotions"]
    assert len(proms) == 1
    p = proms[0]
    assert p["study"] == SYNTH and p["commit"] and p["evidence"]["lower_bound"] == 1.05
    assert p["diff"] and all(old != new for old, new in p["diff"].values())
    page = client.get("/promotions").text
    assert p["path"] in page and p["commit"][:12] in page


def test_fleet_reads_the_agents_status_file(client: TestClient) -> None:
    f = client.get("/api/fleet").json()
    assert f["present"] and f["agent"]["experiment"] == "dashtest"
    assert f["agent"]["state"] == "finished"
    (w,) = f["workers"]
    assert w["worker_id"] == "cpu-0" and w["device_class"] == "cpu" and w["trials_done"] == 4
    assert f["device_classes"] == {"cpu": {w["state"]: 1}}
    assert f["nodes"][0]["workers"] == ["cpu-0"]
    # What the agent now records for the progress card and the runs table.
    assert f["agent"]["trial_timeout_s"] == 120 and f["agent"]["acceptance"]["min_gain"] >= 0
    assert w["evaluated_all"] == 4 and w["current_s"] is None
    (run,) = [i for i in f["invocations"] if i.get("pid") == f["agent"]["pid"]]
    studies = client.get("/api/studies").json()["studies"]
    assert sum(i["total"] for i in f["invocations"]) == sum(s["trials"] for s in studies)
    assert run["counts"].get("baseline") == 1
    # trials per GPU-hour: this run's (the status file) and all runs' (the storage), a figure
    assert w["throughput"]["trials"] == 4 and w["throughput"]["trials_per_hour"] > 0
    assert w["throughput_all"]["trials"] == 4
    fig = f["throughput_figure"]
    assert fig["data"][0]["x"] == ["cpu-0"] and fig["data"][0]["y"][0] > 0
    page = client.get("/").text
    assert "cpu-0" in page and REAL in page and 'id="throughput-fig"' in page


# --- pages ----------------------------------------------------------------------------------
def test_pages_render(client: TestClient) -> None:
    for url in ("/", "/studies", "/promotions", f"/studies/{SYNTH}", f"/studies/{REAL}/trials/1"):
        r = client.get(url)
        assert r.status_code == 200, url
        assert r.headers["content-type"].startswith("text/html")
    study = client.get(f"/studies/{SYNTH}", params={"outcome": "invalid", "per_page": 5}).text
    assert 'id="history-fig"' in study and "max_abs_diff 0.31" in study
    assert "page 1 of" in study
    trial = client.get(f"/studies/{REAL}/trials/1").text
    assert 'id="samples-fig"' in trial and "Validate: passed" in trial


def test_invalid_trial_page_shows_the_blame_line_by_the_reason(client: TestClient) -> None:
    rows = client.get(f"/api/studies/{q(SYNTH)}/trials", params={"outcome": "invalid"}).json()
    n = rows["rows"][0]["number"]
    rec = client.get(f"/api/studies/{q(SYNTH)}/trials/{n}").json()["record"]
    text = rec["validate"]["blame"]["text"]
    page = client.get(f"/studies/{SYNTH}/trials/{n}").text
    assert 'id="reason"' in page and 'id="blame"' in page
    blame = page[page.index('id="blame"') :]
    assert text in html.unescape(blame[: blame.index("</p>")])
    assert page.index('id="reason"') < page.index('id="blame"') < page.index("<h2>Validate")
    ok = client.get(f"/api/studies/{q(SYNTH)}/trials", params={"outcome": "ok"}).json()
    assert 'id="blame"' not in client.get(f"/studies/{SYNTH}/trials/{ok['rows'][0]['number']}").text


def test_plotly_is_served_from_the_package(client: TestClient) -> None:
    import plotly

    js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    r = client.get("/plotly.min.js")
    assert r.status_code == 200 and len(r.content) == js.stat().st_size
    assert 'src="/plotly.min.js"' in client.get("/studies").text


# --- live refresh, read-only, token ---------------------------------------------------------
def test_stamp_changes_when_a_trial_lands(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    storage = parse_storage(str(db)).open()
    name = write_study(storage, "rx9070xt", 5, running=0)
    c = TestClient(create_app(str(db), refresh_s=0.0))
    before = c.get("/api/stamp", params={"study": name}).json()["stamp"]
    assert c.get("/api/stamp", params={"study": name}).json()["stamp"] == before
    study = optuna.load_study(study_name=name, storage=storage)
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING))
    after = c.get("/api/stamp", params={"study": name}).json()["stamp"]
    assert after != before
    assert c.get(f"/api/studies/{name}").json()["running"] == 1


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_read_only(storage: Path, tmp_path: Path) -> None:
    before = _digest(storage)
    c = TestClient(create_app(str(storage), refresh_s=0.0))
    for url in ("/", "/studies", "/promotions", f"/studies/{SYNTH}", f"/studies/{REAL}/trials/2"):
        assert c.get(url).status_code == 200
    c.get(f"/api/studies/{SYNTH}/importances")
    assert _digest(storage) == before
    missing = tmp_path / "nothing.db"
    with pytest.raises(StorageMissing, match="no storage at"):
        Reader(str(missing))
    assert not missing.exists()
    with pytest.raises(StorageMissing):
        Reader(str(tmp_path / "nothing.journal"))
    assert not (tmp_path / "nothing.journal").exists()


def test_cli_refuses_a_missing_storage(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "agent.dashboard", "--storage", str(tmp_path / "x.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no storage at" in r.stderr
    assert not (tmp_path / "x.db").exists()


def test_token(storage: Path) -> None:
    c = TestClient(create_app(str(storage), token="s3cret"))
    r = c.get("/api/studies")
    assert r.status_code == 401 and "token" in r.json()["detail"]
    assert c.get("/api/studies", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/api/studies", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    # ?token= sets the cookie and redirects to the same URL without it (address bar, history).
    r = c.get("/studies", params={"token": "s3cret", "x": "1"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/studies?x=1"
    assert "s3cret" in r.headers["set-cookie"] and "httponly" in r.headers["set-cookie"].lower()
    r = c.get("/studies", params={"token": "s3cret"})
    assert r.status_code == 200 and "token" not in str(r.url) and "s3cret" not in r.text
    assert c.get("/studies").status_code == 200  # the cookie
    assert c.get("/studies", params={"token": "wrong"}).status_code == 401


def test_host_header_must_name_this_machine(storage: Path) -> None:
    """DNS rebinding: a page at evil.example whose name resolves to this machine gets 400."""
    from agent.dashboard import allowed_hosts

    local = TestClient(create_app(str(storage), hosts=allowed_hosts("127.0.0.1")))
    for host in ("127.0.0.1:8080", "localhost:8080", "[::1]:8080", "localhost"):
        assert local.get("/api/stamp", headers={"Host": host}).status_code == 200, host
    for host in ("evil.example:8080", "evil.example", "10.0.0.5:8080", ""):
        r = local.get("/api/stamp", headers={"Host": host})
        assert r.status_code == 400 and "--allow-host" in r.text, host
    wide = TestClient(
        create_app(
            str(storage), hosts=allowed_hosts("0.0.0.0", ["tuner.lab"]), any_ip=True, token="t"
        )
    )
    auth = {"Authorization": "Bearer t"}
    for host in ("10.0.0.5:8080", "[fe80::1]:80", "tuner.lab:8080"):
        assert wide.get("/api/stamp", headers={**auth, "Host": host}).status_code == 200, host
    assert wide.get("/api/stamp", headers={**auth, "Host": "evil.example"}).status_code == 400


def test_cli_refuses_a_wide_bind_without_a_token(storage: Path) -> None:
    cmd = [sys.executable, "-m", "agent.dashboard", "--storage", str(storage)]
    r = subprocess.run(
        [*cmd, "--host", "0.0.0.0", "--port", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "FLEETTUNE_DASHBOARD_TOKEN": ""},
    )
    assert r.returncode == 2 and "--token" in r.stderr and "--insecure" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    from agent.dashboard import InsecureBind, check_bind

    check_bind("0.0.0.0", None, insecure=True)
    check_bind("0.0.0.0", "t")
    check_bind("::1", None)
    with pytest.raises(InsecureBind):
        check_bind("192.168.1.4", None)


def test_ray_dashboard_link(storage: Path) -> None:
    c = TestClient(create_app(str(storage), ray_dashboard="http://head:8265"))
    assert 'href="http://head:8265"' in c.get("/").text
    assert c.get("/api/fleet").json()["ray_dashboard"] == "http://head:8265"
    plain = TestClient(create_app(str(storage)))  # the embedded Ray of the test run has none
    assert "Ray dashboard" not in plain.get("/").text


def test_api_docs_work_offline(client: TestClient) -> None:
    page = client.get("/api/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from a CDN
    for asset in ("/api/docs-static/swagger-ui-bundle.js", "/api/docs-static/swagger-ui.css"):
        r = client.get(asset)
        assert r.status_code == 200 and len(r.content) > 10_000, asset
    assert client.get("/openapi.json").json()["paths"]


def test_storage_that_vanishes_says_so(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    name = write_study(parse_storage(str(db)).open(), "r9700", 5, running=0)
    c = TestClient(create_app(str(db), refresh_s=0.0, warm=False))
    assert c.get(f"/studies/{name}").status_code == 200
    db.unlink()
    r = c.get("/api/stamp")
    assert r.status_code == 503 and "is gone" in r.json()["detail"]
    r = c.get(f"/studies/{name}")
    assert r.status_code == 503 and "is gone" in r.text and 'id="message"' in r.text


def test_trial_page_pairs_against_the_right_best(client: TestClient, storage: Path) -> None:
    """The "best it was paired against" column shows that trial's config, not the baseline's."""
    study = optuna.load_study(study_name=SYNTH, storage=f"sqlite:///{storage}")
    t = next(
        t
        for t in study.trials
        if t.user_attrs.get("paired_against") not in (None, 0)
        and t.user_attrs.get("outcome") == "ok"
    )
    paired = study.trials[t.user_attrs["paired_against"]].user_attrs["config"]
    base = study.user_attrs["baseline"]["config"]
    body = client.get(f"/api/studies/{SYNTH}/trials/{t.number}").json()
    assert body["compare"]
    for key, b, p, v in body["compare"]:
        assert (b, p, v) == (base.get(key), paired.get(key), t.user_attrs["config"].get(key))
    assert any(p != b for _, b, p, _ in body["compare"])  # the case the old page got wrong


def test_pages_in_every_trial_state(client: TestClient) -> None:
    url = f"/api/studies/{SYNTH}/trials"
    for outcome, must in (
        ("running", ("running-card", "no config recorded yet")),
        ("duplicate", ("duplicate-card", "pruned without running")),
        ("interrupted", ("interrupted-card", "the agent stopped while it ran")),
        ("baseline", ("the reference of this study",)),
        ("accepted", ("v-accepted", "needed lower bound &gt; ×1.020")),
        ("rejected", ("v-rejected", "needed lower bound &gt; ×1.020")),
    ):
        n = client.get(url, params={"outcome": outcome}).json()["rows"][0]["number"]
        page = client.get(f"/studies/{SYNTH}/trials/{n}").text
        for m in must:
            assert m in page, (outcome, m)
        for broken in (
            'href="/studies/' + SYNTH + '/trials/"',
            ">0 keys",
            "> s<",
            "rejected: baseline",
        ):
            assert broken not in page, (outcome, broken)
    base = client.get(url, params={"outcome": "baseline"}).json()["rows"][0]["number"]
    assert (
        "rejected"
        not in client.get(f"/studies/{SYNTH}/trials/{base}")
        .text.split("Decision")[1]
        .split("</p>")[0]
    )


def test_journal_storage(tmp_path: Path) -> None:
    path = tmp_path / "studies.journal"
    name = write_study(parse_storage(str(path)).open(), "rtx4090", 6, running=0)
    c = TestClient(create_app(str(path)))
    s = c.get(f"/api/studies/{name}").json()
    assert s["trials"] == 6 and s["device_class"] == "rtx4090"
    fleet = c.get("/api/fleet").json()
    assert not fleet["present"] and fleet["status_file"].endswith("studies.fleet.json")
    assert "No fleet status file" in c.get("/").text


def test_serve_in_background(storage: Path) -> None:
    import socket
    import urllib.request

    from agent.dashboard import serve_in_background

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    thread = serve_in_background(str(storage), "127.0.0.1", port)
    assert thread.daemon
    deadline = time.monotonic() + 20
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                body = json.loads(r.read())
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    assert {s["name"] for s in body["studies"]} == {REAL, SYNTH}


def test_a_study_the_agent_did_not_write_still_shows(tmp_path: Path) -> None:
    db = tmp_path / "plain.db"
    study = optuna.create_study(study_name="plain", storage=f"sqlite:///{db}")
    # 10 trials: under about 10, importances are a caveat (issue 30), not a ranking of noise
    study.optimize(lambda t: t.suggest_float("x", 0, 1) ** 2, n_trials=10)
    optuna.create_study(study_name="empty", storage=f"sqlite:///{db}")
    c = TestClient(create_app(str(db), warm=False))
    s = c.get("/api/studies/plain").json()
    assert s["trials"] == 10 and s["done"] == 10 and s["target"] == "value" and s["speedup"] is None
    h = c.get("/api/studies/plain/history").json()
    assert h["values"] == [t.value for t in study.trials]
    for url in ("/", "/studies", "/studies/plain", "/studies/plain/trials/2", "/studies/empty"):
        assert c.get(url).status_code == 200, url
    assert "no trials yet" in c.get("/api/studies/empty/trials/0").json()["detail"]
    assert c.get("/api/studies/plain/importances").json()["importances"] == {"x": 1.0}


def test_agent_cli_dashboard_subcommand(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "agent", "dashboard", "--storage", str(tmp_path / "x.db")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no storage at" in r.stderr


def test_agent_run_serves_the_dashboard_while_it_runs(tmp_path: Path) -> None:
    """`agent run --dashboard PORT` answers the study's API while trials are still running."""
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    exp = tmp_path / "dashtest.toml"
    exp.write_text(EXPERIMENT.replace("trials = 4", "trials = 3"))
    db = tmp_path / "live.journal"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    cmd = [
        sys.executable,
        "-m",
        "agent",
        "run",
        str(exp),
        "--storage",
        str(db),
        "--no-promote",
        "--dashboard",
        str(port),
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen = None
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5) as r:
                    body = json.loads(r.read())
                if "dashtest" in json.dumps(body):
                    seen = body
                    break
            except OSError:
                pass
            time.sleep(0.5)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert seen is not None, f"the dashboard never listed the running study:\n{out[-3000:]}"


def test_fast_read_matches_the_storage_api(storage: Path) -> None:
    fast = Reader(str(storage), refresh_s=0.0)
    assert fast.fast is not None, "the SQL fast path should serve this Optuna schema"
    api = Reader(str(storage), refresh_s=0.0)
    api.fast = None
    for name in (REAL, SYNTH):
        assert fast.trials(name, per_page=1000) == api.trials(name, per_page=1000)
        assert fast.summary(name) == api.summary(name)
        assert fast.history(name) == api.history(name)
        assert fast.trial(name, 1)["record"] == api.trial(name, 1)["record"]


def test_promotion_history_from_git(tmp_path: Path) -> None:
    from agent.promote import promote
    from engine.synth import preset_shape
    from engine.tuning import TuningConfig

    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    db = tmp_path / "p.db"
    storage = parse_storage(str(db)).open()
    name = write_study(storage, "r9700", 6, running=0)
    first = TuningConfig.default("vulkan").replace(**{"prefill.chunk_tokens": 64})
    second = first.replace(**{"matmul_prefill.variant": "serial"})
    commits = []
    for i, cfg in enumerate((first, second)):
        ev = {"study": name, "trial": 2 + i, "target": "prefill_tok_s@64", "lower_bound": 1.1 + i}
        prom = promote(repo, "r9700", preset_shape("qwen2", "tiny"), 4096, cfg, ev)
        commits.append(prom.commit)
    study = optuna.load_study(study_name=name, storage=storage)
    study.set_user_attr(
        "promotion",
        {"trial": 3, "repo": str(repo), "path": str(prom.path), "commit": prom.commit, "at": 1.0},
    )
    c = TestClient(create_app(str(db), warm=False))
    proms = c.get("/api/promotions").json()["promotions"]
    assert [p["commit"] for p in proms] == commits[::-1]
    newest, oldest = proms
    assert newest["source"] == "git" and newest["previous"] == commits[0]
    assert newest["evidence"]["lower_bound"] == 2.1 and newest["trial"] == 3
    assert set(newest["diff"]) == {"matmul_prefill.variant"} | {
        k for k in second.flat() if k.startswith("matmul_prefill.") and k not in first.flat()
    } | {k for k in first.flat() if k.startswith("matmul_prefill.") and k not in second.flat()}
    assert newest["diff"]["matmul_prefill.variant"][1] == "serial"
    assert oldest["diff"]["prefill.chunk_tokens"][1] == 64  # against the study's baseline
    page = c.get("/promotions").text
    assert commits[0][:12] in page and commits[1][:12] in page and "git history" in page
