"""The local runner end to end on the NumPy backend: the agent's strategy and acceptance on a
tiny synthetic model, in this process, without Ray; and ``python -m agent run --local``, which
does not import Ray at all."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
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
from engine.synth import preset_shape
from engine.tuning import TuningConfig
from engine.tuning.promoted import find_promoted
from tests import fault_backend

TINY = preset_shape("qwen2", "tiny")  # tiny_model_path's shape


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


def _records(storage: str) -> list[TrialRecord]:
    st = parse_storage(storage).open()
    (s,) = optuna.get_all_study_summaries(st)
    study = optuna.load_study(study_name=s.study_name, storage=st)
    return [TrialRecord.from_attrs(s.study_name, t.number, t.user_attrs) for t in study.trials]


@pytest.mark.usefixtures("faults")
def test_local_run_finds_promotes_and_resumes_without_ray(
    tiny_model_path: Path, repo: Path, tmp_path: Path
) -> None:
    """The baseline is a promoted config with a slowed matmul; the local run measures each
    candidate paired against the best on this process's test backend, records the broken ones
    by kind, accepts the fast matmul and promotes it, as the Ray runner would (a deterministic
    4x, so a loaded machine cannot hide it); a second run resumes and runs nothing again."""
    from agent.promote import promote

    slow = TuningConfig.default(fault_backend.NAME).replace(**{"matmul_prefill.variant": "slow"})
    seed = promote(repo, "cpu-sim", TINY, 8192, slow, {"seeded": True})
    seed_text = seed.path.read_text()
    data = _experiment(str(tiny_model_path))
    variants = ["cached_f32", "slow", "wrong", "nocompile", "raises"]
    data |= {
        "memory": {"context_tokens": 2048},  # the seed, tuned at 8192, is the nearest above
        "backends": [fault_backend.NAME],
        "space": {fault_backend.NAME: {"matmul_prefill": {"variants": variants}}},
        "budget": {"trials": 5, "trial_timeout_s": 120},
        "sampler": {"name": "grid", "seed": 0},
    }
    exp = parse_experiment(data)
    storage = str(tmp_path / "studies.journal")
    opts = RunOptions(
        parse_storage(storage), promote_repo=repo, local=True, setup=fault_backend.install
    )
    summary = run_experiment(exp, opts)

    assert summary.ray == "local" and not ray.is_initialized()
    (s,) = summary.studies
    assert s.device_class == "cpu-sim" and s.evaluated == 5, summary.text()
    assert s.changed["matmul_prefill.variant"] == ["slow", "cached_f32"], summary.text()
    assert s.ratio > 1.05 and s.promotion and s.promotion["commit"]
    # promoted under the model's shape and the served context, which its evidence records
    found = find_promoted(fault_backend.NAME, "cpu-sim", TINY, 2048, root=repo / "configs")
    assert found is not None and found.config.op("matmul_prefill").variant == "cached_f32"
    assert found.path == repo / f"configs/cpu-sim/qwen2/{TINY.key}.ctx2048.toml"
    assert found.path == Path(s.promotion["path"])
    assert found.reason == f"exact shape {TINY.key}; context 2048 = serving 2048"
    evidence = tomllib.loads(found.path.read_text())["evidence"]
    assert evidence["baseline_source"] == f"promoted:{seed.path}"
    tuned = evidence["tuned_on"]
    assert tuned["shape_key"] == TINY.key and tuned["context_tokens"] == 2048
    assert tuned["dims"] == dict(TINY.dims) and tuned["quant"] == "q4_k_m"
    assert seed.path.read_text() == seed_text  # the 8192 promotion stays as it was
    ran = [r for r in _records(storage) if r.outcome.spends_budget]
    recs = {r.config.get("matmul_prefill.variant"): r for r in ran}
    assert recs["slow"].role == "baseline" and recs["slow"].worker.backend == fault_backend.NAME
    assert {v: recs[v].outcome for v in ("wrong", "nocompile", "raises")} == {
        "wrong": Outcome.INVALID,
        "nocompile": Outcome.COMPILE_ERROR,
        "raises": Outcome.CRASH,
    }
    won = recs["cached_f32"]
    assert won.accepted and won.decision and won.decision.accepted
    assert won.estimates[s.target].lower > 1.05 and won.samples[s.target].candidate
    assert won.validate and won.validate.passed and not recs["wrong"].validate.passed
    # every measured trial names the best it was paired against, those sent while the baseline
    # still ran too (the H100 proof promoted with "vs baseline: unknown")
    assert all(r.paired_against is not None for r in ran if r.role != "baseline"), [
        (r.trial, r.paired_against) for r in ran
    ]
    subject = subprocess.run(
        ["git", "-C", str(repo), "log", "-1", "--format=%s"], capture_output=True, text=True
    ).stdout
    assert "vs previous best (trial" in subject and "vs baseline: unknown" not in subject, subject

    again = run_experiment(exp, opts)
    assert again.studies[0].evaluated == 5 and not ray.is_initialized()
    assert again.studies[0].promotion["action"] == "already"
    assert sum(r.outcome.spends_budget for r in _records(storage)) == 5


@pytest.mark.usefixtures("faults")
def test_a_stopped_run_promotes_the_best_it_accepted(
    tiny_model_path: Path, repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C / SIGTERM (a KeyboardInterrupt in the loop) after a trial was accepted, with
    another trial queued: the queued one is recorded interrupted and the accepted best is still
    promoted, as the end of the run would have (last session's fleet call lost a promotion to
    its own timeout until a rerun)."""
    from agent.local import LocalRunner
    from agent.promote import promote

    slow = TuningConfig.default(fault_backend.NAME).replace(**{"matmul_prefill.variant": "slow"})
    promote(repo, "cpu-sim", TINY, 4096, slow, {"seeded": True})  # the baseline: a slowed matmul
    data = _experiment(str(tiny_model_path))
    data |= {
        "backends": [fault_backend.NAME],
        "space": {
            fault_backend.NAME: {
                "matmul_prefill": {"variants": ["slow", "cached_f32"]},
                "prefill": {"chunk_tokens": [8, 16, 32]},
            }
        },
        "budget": {"trials": 6, "trial_timeout_s": 120},
        "sampler": {"name": "grid", "seed": 0},
    }
    exp = parse_experiment(data)
    agents = []
    real_wait = LocalRunner.wait

    def wait(self: LocalRunner) -> bool:
        agents.append(self.strategy)
        won = [
            st
            for st in self.strategy.studies.values()
            if st.best.trial is not None and st.best.trial != st.baseline_trial()
        ]
        if won and self.pending:
            raise KeyboardInterrupt
        return real_wait(self)

    monkeypatch.setattr(LocalRunner, "wait", wait)
    storage = str(tmp_path / "studies.journal")
    opts = RunOptions(
        parse_storage(storage), promote_repo=repo, local=True, setup=fault_backend.install
    )
    with pytest.raises(KeyboardInterrupt):
        run_experiment(exp, opts)
    found = find_promoted(fault_backend.NAME, "cpu-sim", TINY, root=repo / "configs")
    assert found is not None and found.config.op("matmul_prefill").variant == "cached_f32"
    (promotion,) = agents[-1].promotions.values()
    assert promotion["action"] == "committed" and promotion["commit"]
    outcomes = [r.outcome for r in _records(storage)]
    assert Outcome.INTERRUPTED in outcomes, outcomes


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
    # trials per GPU-hour: in the summary, the fleet status file and agent status --json
    tp = out["throughput"]
    (w,) = tp["workers"]
    assert tp["trials"] == w["trials"] == 2 and w["device_s"] >= w["busy_s"] > 0
    assert tp["trials_per_hour_per_gpu"] == pytest.approx(2 * 3600 / w["device_s"], rel=0.01)
    assert 0 < tp["run_trials_per_hour_per_gpu"] < tp["trials_per_hour_per_gpu"]
    status = json.loads(parse_storage(str(storage)).status_path.read_text())
    assert status["workers"][0]["throughput"]["trials"] == 2
    assert main(["status", "--storage", str(storage), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["studies"]
    assert row["throughput"]["workers"][0]["worker"] == w["worker"]
    assert row["throughput"]["trials"] == 2
    with pytest.raises(SystemExit) as e:  # --local or --address, not both
        main([*argv, "--address", "x:1"])
    assert e.value.code == 2


def test_cli_wall_time_stops_new_trials(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """--wall-time overrides budget.wall_time_s: past it no new trial starts (3 budgeted, the
    first still runs); a non-positive one is refused before anything starts."""
    path = tmp_path / "x.toml"
    path.write_text(tomli_w.dumps(_experiment(str(tiny_model_path))))
    storage = tmp_path / "s.journal"
    argv = ["run", str(path), "--local", "--storage", str(storage), "--no-promote", "--json"]
    assert main([*argv, "--wall-time", "0"]) == 2
    assert "--wall-time must be > 0" in capsys.readouterr().err and not storage.exists()
    main([*argv, "--wall-time", "0.001"])
    out = json.loads(capsys.readouterr().out)
    assert out["studies"][0]["evaluated"] < 3 and out["studies"][0]["budget"] == 3


# ``python -m agent`` (agent/__main__.py) with Ray's modules reported once the run is over.
_NO_RAY = """
import json, sys
from agent.cli import main
rc = main(sys.argv[1:])
print(json.dumps({"rc": rc, "ray": sorted(m for m in sys.modules if m.split(".")[0] == "ray")}),
      file=sys.stderr)
"""


def test_local_run_never_imports_ray(tiny_model_path: Path, tmp_path: Path) -> None:
    """A --local run is a machine without Ray: neither the strategy (agent.loop), the local
    runner nor what they share (agent.dispatch, agent.fleet) may import it, only the Ray runner."""
    exp = _experiment(str(tiny_model_path))
    exp["budget"]["trials"] = 1
    path = tmp_path / "x.toml"
    path.write_text(tomli_w.dumps(exp))
    argv = ["run", str(path), "--local", "--storage", str(tmp_path / "s.journal"), "--no-promote"]
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run(
        [sys.executable, "-c", _NO_RAY, *argv, "--json"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["studies"][0]["evaluated"] == 1
    assert json.loads(r.stderr.strip().splitlines()[-1]) == {"rc": 0, "ray": []}


def test_cli_run_local_coordinate(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``sampler.name = "coordinate"`` end to end: the baseline, then chunk_tokens one choice at
    a time (the space's order) on the tiny model; each trial measured, none repeated."""
    exp = _experiment(str(tiny_model_path))
    exp["sampler"] = {"name": "coordinate"}
    path = tmp_path / "x.toml"
    path.write_text(tomli_w.dumps(exp))
    storage = tmp_path / "s.journal"
    argv = ["run", str(path), "--local", "--storage", str(storage), "--no-promote", "--json"]
    assert main([*argv, "--model", "synthetic:tiny"]) == 2  # not the experiment's: nothing runs
    err = capsys.readouterr().err
    assert "--model synthetic:tiny: not one of the experiment's models" in err
    assert err.count("\n") == 1 and not storage.exists()
    assert main([*argv, "--model", str(tiny_model_path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["studies"][0]["evaluated"] == 3
    ran = [r for r in _records(str(storage)) if r.outcome is Outcome.OK]
    chunks = [r.config["prefill.chunk_tokens"] for r in ran]
    assert chunks[0] == TuningConfig.default("numpy").flat()["prefill.chunk_tokens"]
    assert chunks[1:] == [c for c in [1, 8, 16, 32] if c != chunks[0]][:2]
