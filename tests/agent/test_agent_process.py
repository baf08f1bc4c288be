"""The agent as a process: killed mid-study and restarted (resumes, no duplicate trials), and
submitted as a Ray job to a head node this test starts (``ray job submit``)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest

from agent.records import BUDGET_OUTCOMES, Outcome
from agent.space import config_key
from agent.storage import check_storage, parse_storage
from engine.provenance import engine_commit, submit_env
from worker import ray_auth

ROOT = Path(__file__).resolve().parents[2]
INTERRUPTED = Outcome.INTERRUPTED
VENV_BIN = Path(sys.executable).parent


def write_experiment(
    path: Path, model: str, trials: int, pairs: int, name: str = "proc", seed: int = 3
) -> Path:
    path.write_text(
        f"""
name = "{name}"
models = ["{model}"]
backends = ["numpy"]
objectives = [{{ metric = "prefill_tok_s", prompt_tokens = 48 }}]
[space.numpy.prefill]
chunk_tokens = {{ min = 4, max = 128 }}
[validate]
random_prompts = [1, 20]
steps = 2
[bench]
pairs = {pairs}
[budget]
trials = {trials}
trial_timeout_s = 120
[sampler]
name = "random"
seed = {seed}
"""
    )
    return path


def budget_trials(storage: str) -> tuple[list[optuna.trial.FrozenTrial], int]:
    st = parse_storage(storage).open()
    done, interrupted = [], 0
    for s in optuna.get_all_study_summaries(st):
        for t in optuna.load_study(study_name=s.study_name, storage=st).trials:
            outcome = t.user_attrs.get("outcome")
            done += [t] if outcome in BUDGET_OUTCOMES else []
            interrupted += outcome == INTERRUPTED
    return done, interrupted


def kill_session(sid: int) -> None:
    """SIGKILL every process of the session this test started (the agent and its Ray)."""
    for _ in range(20):
        ps = subprocess.run(["ps", "-eo", "pid=,sid=,stat="], capture_output=True, text=True)
        alive = [
            int(pid)
            for pid, s, stat in (line.split() for line in ps.stdout.splitlines())
            if int(s) == sid and not stat.startswith("Z")
        ]
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.5)


@pytest.fixture(params=["journal", "postgresql"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "journal":
        return str(tmp_path / "studies.journal")  # the default kind; safe to read while written
    return request.getfixturevalue("pg_url")


def _started(storage: str) -> bool:
    ref = parse_storage(storage)
    return ref.path.exists() if ref.path is not None else check_storage(ref, create=False)


def _has_trials(storage: str, n: int) -> bool:
    """The agent has made its storage and recorded at least n budget trials there."""
    return _started(storage) and len(budget_trials(storage)[0]) >= n


def _wait_while_running(
    p: subprocess.Popen, until: Callable[[], bool], log: Path, poll_s: float = 0.3
) -> None:
    """Wait up to 240 s for until() while p runs; p must still be running then (its log's
    tail says why not)."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and p.poll() is None:
        if until():
            break
        time.sleep(poll_s)
    assert p.poll() is None, log.read_text()[-3000:]


def test_agent_killed_mid_study_resumes_without_duplicates(
    tiny_model_path: Path, tmp_path: Path, storage: str
) -> None:
    """kill -9 of the agent with its embedded Ray (the Ray head) mid-study, then a new agent on
    the same storage: no trial lost or run twice. On PostgreSQL this is the fleet's head restart;
    the dead agent's lease is taken over at once (its pid is gone on this host)."""
    exp = write_experiment(tmp_path / "exp.toml", str(tiny_model_path), trials=7, pairs=16)
    cmd = [sys.executable, "-m", "agent", "run", str(exp), "--storage", storage, "--no-promote"]
    log = (tmp_path / "agent1.log").open("w")
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=log, start_new_session=True)
    try:
        _wait_while_running(p, lambda: _has_trials(storage, 2), tmp_path / "agent1.log")
    finally:
        kill_session(p.pid)
        p.wait()
    before, _ = budget_trials(storage)
    assert 2 <= len(before) < 7

    r = subprocess.run(cmd + ["--json"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["studies"][0]["evaluated"] == 7
    done, interrupted = budget_trials(storage)
    assert len(done) == 7
    assert len({config_key(t.user_attrs["config"]) for t in done}) == 7  # no duplicates
    assert sum(t.user_attrs["role"] == "baseline" for t in done) == 1
    # In flight when the agent died (the running trial, the one queued behind it, and one whose
    # result was not yet written): failed as interrupted on resume, their configs free again.
    assert 1 <= interrupted <= 3
    assert {t.number for t in before} <= {t.number for t in done}  # old results kept


def test_two_agents_one_storage(tiny_model_path: Path, tmp_path: Path, pg_url: str) -> None:
    """Issue 13.1: a second agent on a study another agent runs (a re-submitted job on the
    fleet's PostgreSQL) must not fail the first one's live trials; it stops, naming the holder.
    An agent on another study of the same database runs alongside; the dashboard reads both."""
    model = str(tiny_model_path)
    # A's trials must outlast B's refusal and C's whole start (its own embedded Ray, its A/A):
    # at 400 pairs a fresh clone saw A finish 0.3 s before C's first trial began.
    exp_a = write_experiment(tmp_path / "a.toml", model, trials=8, pairs=1200)
    exp_c = write_experiment(tmp_path / "c.toml", model, trials=2, pairs=3, name="other", seed=5)
    run = [sys.executable, "-m", "agent", "run", "--storage", pg_url, "--no-promote", "--json"]
    log = (tmp_path / "a.log").open("w")
    a = subprocess.Popen(
        [*run, str(exp_a)], cwd=ROOT, stdout=subprocess.PIPE, stderr=log, start_new_session=True
    )
    try:
        _wait_while_running(a, lambda: _has_trials(pg_url, 1), tmp_path / "a.log")
        b = subprocess.run(
            [*run, str(exp_a)], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert b.returncode == 2, b.stderr[-3000:]
        err = b.stderr.strip().splitlines()[-1]
        assert err.startswith("error: study proc/cpu/") and "in use by another agent" in err
        assert f"host {socket.gethostname()} pid {a.pid} since" in err
        c = subprocess.run(
            [*run, str(exp_c)], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert c.returncode == 0, c.stderr[-3000:]
        assert json.loads(c.stdout)["studies"][0]["evaluated"] == 2
        out, _ = a.communicate(timeout=300)
    finally:
        kill_session(a.pid)
        a.wait()
    assert a.returncode == 0, (tmp_path / "a.log").read_text()[-3000:]
    assert json.loads(out)["studies"][0]["evaluated"] == 8
    st = parse_storage(pg_url).open()
    studies = {s.study_name: s for s in optuna.get_all_study_summaries(st)}
    assert len(studies) == 2
    spans = {}
    for name in studies:
        trials = optuna.load_study(study_name=name, storage=st).trials
        outcomes = [t.user_attrs.get("outcome") for t in trials]
        assert INTERRUPTED not in outcomes and all(t.state.is_finished() for t in trials)
        assert sum(o in BUDGET_OUTCOMES for o in outcomes) == (8 if name.startswith("proc") else 2)
        spans[name[:4]] = (
            min(t.datetime_start for t in trials if t.datetime_start),
            max(t.datetime_complete for t in trials if t.datetime_complete),
        )
    assert spans["othe"][0] < spans["proc"][1]  # the two studies ran at once

    from fastapi.testclient import TestClient

    from agent.dashboard import create_app

    body = TestClient(create_app(pg_url, refresh_s=0.0)).get("/api/studies").json()
    assert {s["name"]: s["evaluated"] for s in body["studies"]} == {
        name: 8 if name.startswith("proc") else 2 for name in studies
    }


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:  # all bound at once: n distinct ports
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def test_ray_job_submit_against_a_head_started_here(tiny_model_path: Path, tmp_path: Path) -> None:
    port, dash, client, agent_http = _free_ports(4)  # other Ray instances may run here too
    # One auth mode for the head, the job submission and the agent inside the job.
    path = f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, **ray_auth.auth_env("token")}
    env.pop("RAY_ADDRESS", None)
    resources = json.dumps({"device:cpu": 1, "backend:numpy/cpu": 1})
    head = subprocess.Popen(
        [
            str(VENV_BIN / "ray"),
            "start",
            "--head",
            f"--port={port}",
            f"--dashboard-port={dash}",
            "--dashboard-host=127.0.0.1",
            f"--ray-client-server-port={client}",
            f"--dashboard-agent-listen-port={agent_http}",
            "--num-cpus=2",
            f"--resources={resources}",
            "--block",
        ],
        cwd=tmp_path,
        env=env,
        stdout=(tmp_path / "head.log").open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        exp = write_experiment(tmp_path / "exp.toml", str(tiny_model_path), trials=2, pairs=3)
        storage = str(tmp_path / "studies.db")
        submit = [
            str(VENV_BIN / "ray"),
            "job",
            "submit",
            f"--address=http://127.0.0.1:{dash}",
            "--working-dir",
            str(ROOT),
            # the upload leaves .git behind: the commit comes over as the runtime env names it
            f"--runtime-env-json={json.dumps({'env_vars': submit_env()})}",
            "--",
            "python",
            "-m",
            "agent",
            "run",
            str(exp),
            "--storage",
            storage,
            "--no-promote",
        ]
        deadline = time.monotonic() + 120
        while True:  # the head's job server takes a while to come up
            assert head.poll() is None, (tmp_path / "head.log").read_text()[-3000:]
            r = subprocess.run(submit, env=env, capture_output=True, text=True, timeout=300)
            if r.returncode == 0 or time.monotonic() > deadline:
                break
            out = r.stdout + r.stderr
            if not any(m in out for m in ("Failed to connect", "Connection", "try again later")):
                break
            time.sleep(2)
        assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
        assert "succeeded" in r.stdout + r.stderr
        done, _ = budget_trials(storage)
        assert len(done) == 2 and all(t.user_attrs["worker"]["device_class"] == "cpu" for t in done)
        assert {t.user_attrs["engine_commit"] for t in done} == {engine_commit()} != {"unknown"}
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        kill_session(head.pid)
        head.wait()


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"], ["status", "--help"]])
def test_cli_help(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "-m", "agent", *args], capture_output=True, text=True)
    assert r.returncode == 0 and "usage" in r.stdout


def _session_alive(sid: int) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid=,sid=,stat=,comm="], capture_output=True, text=True)
    return [
        f"{pid} {comm}"
        for pid, s, stat, comm in (line.split(None, 3) for line in ps.stdout.splitlines())
        if int(s) == sid and not stat.startswith("Z")
    ]


@pytest.mark.parametrize("how", ["SIGTERM", "Ctrl-C"])
def test_agent_stopped_by_a_signal_leaves_no_running_trial_nor_ray(
    tiny_model_path: Path, tmp_path: Path, how: str
) -> None:
    """Ctrl-C (SIGINT to the whole process group) or SIGTERM: the agent records its in-flight
    trials as interrupted, stops its workers and its embedded Ray, and exits 130 / 143."""
    # 200 pairs: ~3 s a trial on an idle 2-core machine, so trials are still in flight when the
    # signal comes (at 16 pairs an idle CI machine ran all 7 in 2 s and the agent exited 0 first)
    exp = write_experiment(tmp_path / "exp.toml", str(tiny_model_path), trials=7, pairs=200)
    storage = str(tmp_path / "studies.journal")
    cmd = [sys.executable, "-m", "agent", "run", str(exp), "--storage", storage, "--no-promote"]
    log_path = tmp_path / "agent.log"
    p = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        # as from a terminal: a test run started in the background (`cmd &`) inherits SIGINT
        # ignored, and Python then installs no KeyboardInterrupt handler in the agent
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # the agent's own log says when trial 1 is done: a cheap read (opening the storage on
        # every poll took seconds on a busy 2-core CI machine, long enough for all 7 to finish)
        _wait_while_running(p, lambda: "agent: trial 1 [" in log_path.read_text(), log_path, 0.1)
        if how == "SIGTERM":
            p.send_signal(signal.SIGTERM)
        else:
            os.killpg(p.pid, signal.SIGINT)
        code = p.wait(timeout=90)
        time.sleep(2)  # Ray's processes exit after the agent's shutdown call returns
        left = _session_alive(p.pid)
    finally:
        kill_session(p.pid)
        p.wait()
    text = log_path.read_text()
    assert code == (143 if how == "SIGTERM" else 130), text[-3000:]
    assert f"stopped by {how}" in text and "Traceback" not in text, text[-3000:]
    assert left == [], left
    st = parse_storage(storage).open()
    (summary,) = optuna.get_all_study_summaries(st)
    trials = optuna.load_study(study_name=summary.study_name, storage=st).trials
    assert all(t.state != optuna.trial.TrialState.RUNNING for t in trials)
    assert any(t.user_attrs.get("outcome") == INTERRUPTED for t in trials)
    status = json.loads(parse_storage(storage).status_path.read_text())
    assert status["agent"]["state"] == "interrupted"
