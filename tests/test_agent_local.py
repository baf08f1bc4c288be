"""The local runner end to end on the NumPy backend: the agent's strategy and acceptance on a
tiny synthetic model, in this process, without Ray; and ``python -m agent run --local``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import optuna
import pytest
import ray
import tomli_w

from agent.cli import main
from agent.experiment import parse_experiment
from agent.loop import RunOptions, run_experiment
from agent.records import Outcome, TrialRecord
from agent.storage import parse_storage
from engine import backends as engine_backends
from engine.tuning import TuningConfig
from engine.tuning.promoted import find_promoted


def _experiment(model: str) -> dict:
    return {
        "name": "loc",
        "models": [model],
        "backends": ["numpy"],
        "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 24}],
        "validate": {"random_prompts": [1, 20], "steps": 2},
        "bench": {"pairs": 6, "warmup": 1},
        "budget": {"trials": 3, "trial_timeout_s": 120},
        "acceptance": {"min_gain": 0.05},
        "sampler": {"name": "random", "seed": 1},
        "space": {"numpy": {"prefill": {"chunk_tokens": [1, 8, 16, 32]}}},
    }


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "promote"
    r.mkdir()
    git = ["git", "-C", str(r)]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    (r / "README").write_text("promote repo\n")
    subprocess.run([*git, "add", "README"], check=True)
    subprocess.run(
        [*git, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init"], check=True
    )
    return r


def _records(storage: str) -> list[TrialRecord]:
    st = parse_storage(storage).open()
    (s,) = optuna.get_all_study_summaries(st)
    study = optuna.load_study(study_name=s.study_name, storage=st)
    return [TrialRecord.from_attrs(s.study_name, t.number, t.user_attrs) for t in study.trials]


def test_local_run_finds_promotes_and_resumes_without_ray(
    tiny_model_path: Path, repo: Path, tmp_path: Path
) -> None:
    """A promoted slow config is the baseline; the local run measures candidates paired against
    it on this process's NumPy backend, accepts a faster one and promotes it, as the Ray runner
    would; a second run resumes the study. Ray is never started."""
    from agent.promote import promote

    device = engine_backends.create("numpy").device_info()
    slow = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 1})
    promote(repo, device.device_class, "qwen2", slow, {"seeded": True})
    storage = str(tmp_path / "studies.journal")
    exp = parse_experiment(_experiment(str(tiny_model_path)))
    summary = run_experiment(exp, RunOptions(parse_storage(storage), promote_repo=repo, local=True))

    assert summary.ray == "local" and not ray.is_initialized()
    (s,) = summary.studies
    assert s.device_class == device.device_class and s.evaluated == 3
    assert s.changed["prefill.chunk_tokens"][0] == 1 and s.ratio > 1.05, summary.text()
    assert s.promotion and s.promotion["commit"]
    found = find_promoted("numpy", device.device_class, "qwen2", root=repo / "configs")
    assert found is not None and found[0].prefill_chunk > 1
    recs = [r for r in _records(storage) if r.outcome.spends_budget]
    assert recs[0].role == "baseline" and recs[0].worker and recs[0].worker.backend == "numpy"
    won = next(r for r in recs if r.accepted)
    assert won.decision and won.decision.accepted and won.estimates[s.target].lower > 1.05
    assert won.validate and won.validate.passed and won.samples[s.target].candidate

    again = run_experiment(
        exp, RunOptions(parse_storage(storage), promote_repo=repo, budget=4, local=True)
    )
    assert again.studies[0].evaluated == 4 and not ray.is_initialized()
    done = [r for r in _records(storage) if r.outcome.spends_budget]
    assert len(done) == 4 and len({json.dumps(r.config, sort_keys=True) for r in done}) == 4


def test_cli_run_local(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    exp = _experiment(str(tiny_model_path))
    exp["budget"]["trials"] = 2
    path = tmp_path / "x.toml"
    path.write_text(tomli_w.dumps(exp))
    storage = tmp_path / "s.journal"
    argv = ["run", str(path), "--local", "--storage", str(storage), "--no-promote", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ray"] == "local" and out["studies"][0]["evaluated"] == 2
    assert {r.outcome for r in _records(str(storage))} <= {Outcome.OK, Outcome.DUPLICATE}
    with pytest.raises(SystemExit) as e:  # --local or --address, not both
        main([*argv, "--address", "x:1"])
    assert e.value.code == 2
