"""The bootstrap path of docs/deploy.md, end to end on one machine (two Ray nodes on one host):

1. a head started as the deploy files start it (`ray start --head --num-gpus=0`, no device),
   with token auth on (RAY_AUTH_MODE=token, one token file through RAY_AUTH_TOKEN_PATH);
2. a worker node started as a separate process with `python -m worker start --address ...`;
3. the cluster shows the worker's device-class resources, on the worker node only;
4. `ray job submit --working-dir <copy of the checkout> -- python -m agent run
   experiments/quickstart.toml` with its storage and promote repository in a temp dir;
5. the job succeeds, its study has trials that ran on the worker node, and a promotion, if the
   agent accepted a candidate, is one commit of configs/<class>/<family>/<shape key>.ctx<N>.toml.

Everything the test starts runs in its own process groups and is killed at the end, pass or
fail; Ray's files live under a temp dir. Heavy (about two minutes on 2 cores): marked slow.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RAY = str(BIN / "ray")
BUDGET = 3  # trials: enough for a baseline and candidates, short enough for CI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Fleet:
    """Processes started by this test, each in its own process group, and their logs."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.procs: list[tuple[subprocess.Popen, Path]] = []

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = self.root / f"{name}.log"
        with log.open("w") as out:
            p = subprocess.Popen(
                argv,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append((p, log))
        return p

    def run(self, argv: list[str], timeout: float = 60, env: dict | None = None):
        return subprocess.run(
            argv, cwd=ROOT, env=env or self.env, capture_output=True, text=True, timeout=timeout
        )

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log in self.procs)

    def stop(self) -> None:
        for p, _ in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p, _ in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            try:  # stragglers of the group too
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=10)
        # Ray puts its worker processes (ray::IDLE, actors, job drivers) in process groups of
        # their own; they exit when their raylet dies. Any left are found by this test's token
        # path in their environment, which no other process on the machine has.
        marker = f"RAY_AUTH_TOKEN_PATH={self.env['RAY_AUTH_TOKEN_PATH']}".encode()
        deadline = time.monotonic() + 15
        while left := self.leftovers(marker):
            if time.monotonic() > deadline:
                for pid in left:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                break
            time.sleep(0.5)

    @staticmethod
    def leftovers(marker: bytes) -> list[int]:
        out = []
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit() or int(proc.name) == os.getpid():
                continue
            try:
                if marker in (proc / "environ").read_bytes().split(b"\0"):
                    out.append(int(proc.name))
            except OSError:  # gone, or not ours to read
                continue
        return out


@pytest.fixture
def fleet() -> Iterator[Fleet]:
    # A short root: Ray's Unix socket paths under it must stay below ~107 characters.
    root = Path(tempfile.mkdtemp(prefix="ft-", dir="/tmp"))
    token = root / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "FLEETTUNE_CACHE": str(root / "cache"),
    }
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN", None)
    f = Fleet(root, env)
    try:
        yield f
    finally:
        f.stop()
        shutil.rmtree(root, ignore_errors=True)


def wait_for(what: str, check, timeout: float, fleet: Fleet, every: float = 1):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        for p, log in fleet.procs:
            if p.poll() is not None:
                pytest.fail(
                    f"{log.stem} exited with {p.returncode} waiting for {what}\n" + fleet.logs()
                )
        time.sleep(every)
    pytest.fail(f"timed out after {timeout}s waiting for {what}\n{fleet.logs()}")


def copy_checkout(dst: Path) -> Path:
    """The files a Ray job's working dir would get from this checkout: tracked and untracked
    but not ignored (no .git, no .venv, no caches)."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for rel in filter(None, out.split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)
    return dst


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@t.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@t.invalid",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def test_head_worker_node_and_quickstart_job(fleet: Fleet) -> None:
    port, dash, client = free_port(), free_port(), free_port()
    gcs = f"127.0.0.1:{port}"
    jobs = f"http://127.0.0.1:{dash}"

    # 1. The head, as deploy/ starts it: no GPU, no device resource, token auth on.
    fleet.spawn(
        "head",
        [
            RAY, "start", "--head", "--block", f"--port={port}", "--num-gpus=0",
            f"--dashboard-port={dash}", "--dashboard-host=127.0.0.1",
            f"--ray-client-server-port={client}", f"--temp-dir={fleet.root / 'ray'}",
        ],
    )  # fmt: skip
    wait_for("the head", lambda: fleet.run([RAY, "status", f"--address={gcs}"]).returncode == 0,
             60, fleet)  # fmt: skip

    # 2. A worker node, as a separate process, through the worker bootstrap.
    fleet.spawn("worker", [sys.executable, "-m", "worker", "start", f"--address={gcs}", "--block"])

    def nodes() -> list[dict]:
        r = fleet.run([RAY, "list", "nodes", f"--address={jobs}", "--format=json", "--detail"])
        try:
            return json.loads(r.stdout) if r.returncode == 0 else []
        except json.JSONDecodeError:  # "No resource in the cluster" while the head starts
            return []

    def worker_node() -> dict | None:
        alive = [n for n in nodes() if n["state"] == "ALIVE"]
        found = [n for n in alive if not n["is_head_node"]]
        return found[0] if found and len(alive) == 2 else None

    # 3. The cluster sees the worker's device class, on the worker node and not on the head.
    node = wait_for("the worker node", worker_node, 180, fleet)
    classes = {
        k.removeprefix("device:"): v
        for k, v in node["resources_total"].items()
        if k.startswith("device:")
    }
    assert len(classes) == 1, node["resources_total"]
    ((device_class, count),) = classes.items()
    assert count >= 1
    assert any(k.startswith("backend:") for k in node["resources_total"])
    (head,) = [n for n in nodes() if n["is_head_node"]]
    assert not [k for k in head["resources_total"] if k.startswith(("device:", "backend:"))]
    assert head["resources_total"].get("GPU", 0) == 0

    # Token auth is really on: without the token the job server refuses the same request.
    no_auth = {k: v for k, v in fleet.env.items() if not k.startswith("RAY_AUTH")}
    refused = fleet.run([RAY, "job", "list", f"--address={jobs}"], env=no_auth)
    assert refused.returncode != 0 and "token" in (refused.stdout + refused.stderr).lower()

    # 4. The quickstart as a Ray job, storage and promote repository in the temp dir.
    src = copy_checkout(fleet.root / "src")
    repo = fleet.root / "promote"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    git(repo, "commit", "-q", "--allow-empty", "-m", "init")
    init = git(repo, "rev-parse", "HEAD")
    storage = f"sqlite:///{fleet.root / 'studies.db'}"
    job_id = f"fleettune-bootstrap-{secrets.token_hex(4)}"
    runtime_env = {"env_vars": {"FLEETTUNE_CACHE": fleet.env["FLEETTUNE_CACHE"]}}
    submit_argv = [
        RAY, "job", "submit", f"--address={jobs}", f"--submission-id={job_id}", "--no-wait",
        f"--working-dir={src}", f"--runtime-env-json={json.dumps(runtime_env)}", "--",
        "python", "-m", "agent", "run", "experiments/quickstart.toml",
        f"--storage={storage}", f"--promote-repo={repo}", f"--budget={BUDGET}",
    ]  # fmt: skip

    last: list[str] = []

    def submitted() -> bool:
        # The head's job agent registers a few seconds after the node ("No available agent
        # to submit job, please try again later"): retry, keeping what the CLI said.
        r = fleet.run(submit_argv, timeout=120)
        last[:] = [r.stdout[-3000:] + r.stderr[-3000:]]
        return r.returncode == 0

    # 120 s was not always enough on a busy 2-core CI machine (a fresh-clone run, 2026-11-30)
    deadline = time.monotonic() + 300
    while not submitted():
        if time.monotonic() > deadline:
            pytest.fail(f"ray job submit kept failing:\n{last[0]}\n{fleet.logs()}")
        time.sleep(2)

    def finished() -> str | None:
        out = fleet.run([RAY, "job", "status", f"--address={jobs}", job_id]).stdout.lower()
        return next((s for s in ("succeeded", "failed", "stopped") if s in out), None)

    status = wait_for("the quickstart job", finished, 900, fleet, every=5)
    logs = fleet.run([RAY, "job", "logs", f"--address={jobs}", job_id]).stdout
    detail = f"{logs[-8000:]}\n{fleet.logs()}"
    assert status == "succeeded", detail

    # 5. The study of the worker's device class has its trials, run on the worker node.
    import optuna

    summaries = optuna.get_all_study_summaries(storage)
    mine = [s for s in summaries if s.study_name.startswith(f"quickstart/{device_class}/")]
    assert len(mine) == 1, ([s.study_name for s in summaries], detail)
    study = optuna.load_study(study_name=mine[0].study_name, storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) >= 1, detail
    fleet_status = json.loads((fleet.root / "studies.fleet.json").read_text())
    assert fleet_status["agent"]["state"] == "finished"
    workers = fleet_status["workers"]
    assert workers and {w["info"]["node_id"] for w in workers} == {node["node_id"]}
    assert {w["device_class"] for w in workers} == {device_class}

    # The dashboard of docs/deploy.md serves the same storage: the study and the worker.
    ui = free_port()
    fleet.spawn(
        "dashboard",
        [sys.executable, "-m", "agent", "dashboard", f"--storage={storage}", f"--port={ui}"],
    )

    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never a proxy

    def api(path: str):  # noqa: ANN202
        try:
            with direct.open(f"http://127.0.0.1:{ui}{path}", timeout=10) as r:
                return json.loads(r.read())
        except OSError:
            return None

    studies = wait_for("the dashboard", lambda: api("/api/studies"), 60, fleet)
    assert mine[0].study_name in json.dumps(studies)
    assert node["node_id"] in json.dumps(api("/api/fleet"))

    # A promotion (when the agent accepted a candidate) is exactly one config file, committed
    # to main of the promote repository; without one the repository is untouched.
    commits = git(repo, "rev-list", f"{init}..HEAD").split()
    assert git(repo, "status", "--porcelain") == ""
    for c in commits:
        files = git(repo, "show", "--name-only", "--format=", c).split()
        assert len(files) == 1 and files[0].startswith(f"configs/{device_class}/"), files
        assert files[0].endswith(".toml")
    if commits:
        text = (repo / files[0]).read_text()
        assert "[evidence]" in text and "[evidence.sentinel_key]" in text
