"""``agent status`` (text and --json) tells the budget, the best's speedup with its interval
(both figures, named) and the workers, and that an agent which stopped beating is gone
(issue 30)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import optuna
import pytest

from agent.cli import main
from agent.dashboard.synthetic import OBJECTIVES, write_study
from agent.records import TrialRecord
from agent.storage import parse_storage
from agent.win import chain_to_baseline, win_line
from tests.agent.no_device_run import run_with_no_device


def _storage_and_status(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "s.journal"
    ref = parse_storage(str(path))
    name = write_study(ref.open(), "r9700", 20, seed=5, running=0)
    worker = {
        "worker_id": "r9700-0",
        "device_class": "r9700",
        "backend": "vulkan",
        "state": "busy",
        "current": f"{name} #19",
        "restarts": 1,
        "trials_done": 12,
        "info": {"device_name": "AMD Radeon AI PRO R9700", "host": "node-a"},
    }
    agent = {"host": "node-a", "pid": 4242, "experiment": "synthetic", "state": "running"}
    status = {
        "agent": {**agent, "updated": time.time()},
        "workers": [worker],
        "studies": [{"study": name, "budget": 24}],
    }
    ref.status_path.write_text(json.dumps(status))
    return path, name


def test_status_tells_budget_speedup_and_workers(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path, name = _storage_and_status(tmp_path)
    study = optuna.load_study(study_name=name, storage=parse_storage(str(path)).open())

    def record(n: int) -> TrialRecord:
        return TrialRecord.from_attrs(name, n, study.trials[n].user_attrs)

    best = record(study.user_attrs["best"]["trial"])
    total = chain_to_baseline(record, best.trial, OBJECTIVES[0])
    est = best.estimates[OBJECTIVES[0]]
    win = win_line(est.ratio, est.lower, best.paired_against, total)
    evaluated = sum(t.user_attrs.get("outcome") not in ("duplicate", None) for t in study.trials)

    assert main(["status", "--storage", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["studies"]
    assert row["budget"] == 24 and 0 < row["evaluated"] <= evaluated
    sp = row["speedup"]
    assert sp["line"] == win and sp["vs_baseline"]["lower"] < sp["vs_baseline"]["ratio"]
    assert sp["vs_previous"]["trial"] == best.paired_against
    (w,) = doc["workers"]
    assert w["worker_id"] == "r9700-0" and w["device"] == "AMD Radeon AI PRO R9700"
    # no live lease of pid 4242 on its study: the agent that says running is gone
    assert doc["agent"]["state"] == "gone" and w["state"] == "unknown"

    assert main(["status", "--storage", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{row['evaluated']}/24 trials of the budget" in out and win in out
    assert "agent: gone" in out and "worker r9700-0: unknown" in out


def test_a_cluster_with_no_device_names_how_a_node_joins(
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """A plain `ray start --head` advertises no device: the run said "cluster has {}" and
    nothing else. It names `python -m worker start`, as the README does."""
    assert run_with_no_device("join", tiny_model_path, tmp_path, monkeypatch) == 1
    err = capsys.readouterr().err
    assert "cluster has {}" in err and "python -m worker start --address HEAD:6379" in err
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "python -m worker start --address HEAD:6379" in readme
