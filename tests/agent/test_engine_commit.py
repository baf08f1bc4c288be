"""The engine commit under `ray job submit --working-dir`: Ray uploads the code without .git, so
the submitter hands its commit over as $FLEETTUNE_ENGINE_COMMIT (`python -m agent runtime-env`);
a checkout's own git always wins over the variable, and a malformed value is not recorded
(issue 30)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from engine.provenance import COMMIT_ENV, commit_of, engine_commit
from tests.agent.no_device_run import run_with_no_device

ROOT = Path(__file__).resolve().parents[2]
SHA = "0123456789abcdef0123456789abcdef01234567"


def _git(repo: Path, *argv: str) -> str:
    who = {
        f"GIT_{r}_{k}": v
        for r in ("AUTHOR", "COMMITTER")
        for k, v in (("NAME", "t"), ("EMAIL", "t@t"))
    }
    env = os.environ | who
    return subprocess.run(
        ["git", "-C", str(repo), *argv], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()


def test_a_copy_without_git_takes_the_commit_handed_down(tmp_path: Path) -> None:
    assert commit_of(tmp_path, {}) == "unknown"
    assert commit_of(tmp_path, {COMMIT_ENV: SHA}) == SHA
    assert commit_of(tmp_path, {COMMIT_ENV: f" {SHA.upper()}+dirty\n"}) == f"{SHA}+dirty"
    for junk in ("abc123", "main", f"{SHA}; rm -rf /", "", f"{SHA}+clean"):
        assert commit_of(tmp_path, {COMMIT_ENV: junk}) == "unknown", junk


def test_a_checkout_s_own_git_wins_over_the_variable(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "engine").mkdir(parents=True)
    (repo / "engine" / "x.py").write_text("x = 1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "x")
    head = _git(repo, "rev-parse", "HEAD")
    assert commit_of(repo, {COMMIT_ENV: SHA}) == head
    (repo / "engine" / "x.py").write_text("x = 2\n")
    assert commit_of(repo, {COMMIT_ENV: SHA}) == f"{head}+dirty"
    # An unpacked copy that happens to sit inside another repository is not that repository's
    # commit: the variable (or "unknown") names it.
    inner = repo / "upload"
    inner.mkdir()
    assert commit_of(inner, {}) == "unknown"
    assert commit_of(inner, {COMMIT_ENV: SHA}) == SHA


@pytest.mark.parametrize("given", [None, SHA])
def test_engine_commit_of_an_uploaded_working_dir(tmp_path: Path, given: str | None) -> None:
    """As Ray runs a job: the engine package copied without .git, imported from that copy."""
    shutil.copytree(ROOT / "engine", tmp_path / "engine", ignore=shutil.ignore_patterns("__pyc*"))
    env = {k: v for k, v in os.environ.items() if k != COMMIT_ENV}
    env |= {"PYTHONPATH": str(tmp_path)} | ({COMMIT_ENV: given} if given else {})
    code = "import engine.provenance as p; print(p.engine_commit(), p.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    commit, where = out.stdout.split()
    assert Path(where).is_relative_to(tmp_path), out.stderr
    assert commit == (given or "unknown")


def test_runtime_env_carries_this_checkout_s_commit(capsys: pytest.CaptureFixture) -> None:
    from agent.cli import main

    assert main(["runtime-env", "--env", "FLEETTUNE_CACHE=/c"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"env_vars": {"FLEETTUNE_CACHE": "/c", COMMIT_ENV: engine_commit()}}
    assert engine_commit() != "unknown"  # the test runs from a checkout
    assert main(["runtime-env", "--env", "NOEQUALS"]) == 2
    assert "--env 'NOEQUALS': give KEY=VALUE" in capsys.readouterr().err


def test_a_run_without_a_commit_says_how_to_name_it(
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    import agent.loop

    monkeypatch.setattr(agent.loop, "engine_commit", lambda: "unknown")  # an uploaded copy
    run_with_no_device("nocommit", tiny_model_path, tmp_path, monkeypatch)  # nothing to run
    err = capsys.readouterr().err
    assert "engine commit unknown" in err and "$(python -m agent runtime-env)" in err
