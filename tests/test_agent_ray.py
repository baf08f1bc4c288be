"""The whole loop on Ray, on this machine's CPU: embedded Ray with the NumPy backend (and Vulkan
on lavapipe when present), fault injection, and two device classes on a two-node cluster."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
import ray

from agent.experiment import parse_experiment
from agent.loop import RunOptions, run_experiment
from agent.records import BUDGET_OUTCOMES
from agent.space import config_key
from agent.storage import parse_storage
from engine import backends as engine_backends
from engine.tuning import TuningConfig
from engine.tuning.promoted import find_promoted
from worker import testing


@pytest.fixture(scope="module")
def model_ref(tiny_model_path: Path) -> str:
    return str(tiny_model_path)


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


@pytest.fixture
def faults() -> Iterator[None]:
    """The test-only numpy_faults backend, registered for one test."""
    testing.install()
    yield
    testing.uninstall()


@pytest.fixture(autouse=True)
def _no_ray_left() -> Iterator[None]:
    yield
    if ray.is_initialized():
        ray.shutdown()


def experiment(model: str, backend: str, **over: object) -> dict:
    data: dict = {
        "name": "t",
        "models": [model],
        "backends": [backend],
        "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 24}],
        "validate": {"random_prompts": [1, 20], "steps": 2},
        "bench": {"pairs": 6, "warmup": 1},  # 3 pairs (t = 4.3 at 2 df) was flaky under load
        "budget": {"trials": 4, "trial_timeout_s": 60},
        "acceptance": {"min_gain": 0.05, "confirm": True},
        "sampler": {"name": "random", "seed": 1},
    }
    data.update(over)
    return data


def trials(storage: str) -> list[optuna.trial.FrozenTrial]:
    st = parse_storage(storage).open()
    out = []
    for s in optuna.get_all_study_summaries(st):
        out += optuna.load_study(study_name=s.study_name, storage=st).trials
    return out


def _backends() -> list[str]:
    return [b for b in ("numpy", "vulkan") if b in engine_backends.available()]


@pytest.mark.parametrize("backend", _backends())
def test_whole_loop_promotes_a_real_win(
    backend: str, model_ref: str, repo: Path, tmp_path: Path
) -> None:
    """Baseline = a promoted slow config; the search finds the fast one, validates it, measures
    it paired, accepts it and commits configs/<class>/qwen2.toml; a rerun resumes the study."""
    from agent.promote import promote

    device = engine_backends.create(backend).device_info()
    if backend == "numpy":
        slow = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 1})  # 24 chunks
        space = {"numpy": {"prefill": {"chunk_tokens": [1, 8, 16, 32]}}}
        promote(repo, device.device_class, "qwen2", slow, {"seeded": True})
    else:
        space = {backend: {"prefill": {"chunk_tokens": [8, 16, 32, 64]}}}
    storage = str(tmp_path / "studies.db")
    exp = parse_experiment(experiment(model_ref, backend, space=space))
    opts = RunOptions(parse_storage(storage), promote_repo=repo, budget=3)
    summary = run_experiment(exp, opts)

    (s,) = summary.studies
    assert s.device_class == device.device_class and s.evaluated == 3
    recs = [t for t in trials(storage) if t.user_attrs.get("outcome") in BUDGET_OUTCOMES]
    assert recs[0].user_attrs["role"] == "baseline" and recs[0].number == 0
    for t in recs:
        ua = t.user_attrs
        assert ua["host"] and ua["engine_commit"] and ua["worker"]["worker_id"]
        assert ua["driver"] and ua["device"] and ua["finished"] >= ua["started"] > 0
    if backend == "numpy":
        assert s.baseline_source.startswith("promoted:")
        assert not s.best_is_baseline, summary.text()
        assert s.changed["prefill.chunk_tokens"][0] == 1 and s.ratio > 1.05
        assert s.promotion and s.promotion["commit"]
        found = find_promoted("numpy", device.device_class, "qwen2", root=repo / "configs")
        assert found is not None
        assert found[0].prefill_chunk > 1
    assert summary.overhead.trials == 3 and summary.overhead.fraction < 0.5

    again = run_experiment(exp, RunOptions(parse_storage(storage), promote_repo=repo, budget=4))
    assert again.studies[0].evaluated == 4
    done = [t for t in trials(storage) if t.user_attrs.get("outcome") in BUDGET_OUTCOMES]
    assert len(done) == 4
    assert len({config_key(t.user_attrs["config"]) for t in done}) == 4  # no duplicates


def test_accepted_candidate_is_confirmed_on_another_worker(
    model_ref: str, repo: Path, tmp_path: Path
) -> None:
    """Two workers of one class: a win measured on one is re-validated and re-measured on the
    other before it becomes the best and is promoted."""
    from agent.promote import promote

    slow = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 1})
    promote(repo, "cpu", "qwen2", slow, {"seeded": True})
    exp = parse_experiment(
        experiment(model_ref, "numpy", space={"numpy": {"prefill": {"chunk_tokens": [1, 32]}}})
    )
    storage = str(tmp_path / "studies.db")
    opts = RunOptions(
        parse_storage(storage),
        promote_repo=repo,
        budget=2,
        resources={"device:cpu": 2, "backend:numpy/cpu": 2},
    )
    summary = run_experiment(exp, opts)
    (s,) = summary.studies
    assert len(summary.workers) == 2 and not s.best_is_baseline, summary.text()
    (win,) = [t for t in trials(storage) if t.user_attrs.get("accepted")]
    conf = win.user_attrs["confirmation"]
    assert conf["accepted"] and conf["outcome"] == "ok"
    assert conf["worker"]["worker_id"] != win.user_attrs["worker"]["worker_id"]
    assert s.promotion and s.promotion["trial"] == win.number


@pytest.mark.usefixtures("faults")
def test_faults_fail_trials_restart_workers_and_never_promote(
    model_ref: str, repo: Path, tmp_path: Path
) -> None:
    """Wrong output, compile error, exception, killed worker, hung worker: each recorded with
    its kind, the worker restarted where it died, and the study carries on to its budget."""
    variants = ["cached_f32", "wrong", "nocompile", "raises", "crash", "hang"]
    exp = parse_experiment(
        experiment(
            model_ref,
            testing.NAME,
            space={
                testing.NAME: {
                    "matmul_prefill": {"variants": variants},
                    "prefill": {"chunk_tokens": [32]},
                }
            },
            budget={"trials": 6, "trial_timeout_s": 8},
            sampler={"name": "grid", "seed": 0},
        )
    )
    storage = str(tmp_path / "studies.db")
    opts = RunOptions(
        parse_storage(storage),
        promote_repo=repo,
        setup=testing.install,
        resources={"device:cpu-sim": 1, f"backend:{testing.NAME}/cpu-sim": 1},
    )
    summary = run_experiment(exp, opts)
    (s,) = summary.studies
    by_variant = {}
    for t in trials(storage):
        ua = t.user_attrs
        if ua.get("outcome") in BUDGET_OUTCOMES:
            by_variant[ua["config"]["matmul_prefill.variant"]] = (ua["outcome"], ua["reason"], t)
    assert {k: v[0] for k, v in by_variant.items()} == {
        "cached_f32": "ok",
        "wrong": "invalid",
        "nocompile": "compile_error",
        "raises": "crash",
        "crash": "crash",
        "hang": "timeout",
    }
    assert "worker died" in by_variant["crash"][1]
    wrong = by_variant["wrong"][2]
    assert wrong.state == optuna.trial.TrialState.PRUNED  # told to TPE as infeasible
    assert wrong.constraints == {"runs_and_validates": 1.0}
    assert not wrong.user_attrs["validate"]["passed"]
    assert s.evaluated == 6 and s.best_is_baseline and s.promotion is None
    assert not (repo / "configs").exists()
    (w,) = summary.workers
    assert w["restarts"] == 2 and w["state"] != "dead"


@pytest.mark.usefixtures("faults")
def test_two_device_classes_on_a_two_node_cluster(model_ref: str, tmp_path: Path) -> None:
    """Each node advertises its own simulated class; trials of a class run only there."""
    from ray.cluster_utils import Cluster

    def res(c: str) -> dict[str, float]:
        return {f"device:{c}": 1, f"backend:{testing.NAME}/{c}": 1}

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "resources": res("sim-a"), "include_dashboard": False},
    )
    try:
        cluster.add_node(num_cpus=1, resources=res("sim-b"))
        cluster.wait_for_nodes()
        exp = parse_experiment(
            experiment(
                model_ref,
                testing.NAME,
                space={testing.NAME: {"prefill": {"chunk_tokens": [8, 16, 32]}}},
                budget={"trials": 2, "trial_timeout_s": 60},
            )
        )
        storage = str(tmp_path / "studies.db")
        opts = RunOptions(
            parse_storage(storage), address=cluster.address, setup=testing.install, promote=False
        )
        summary = run_experiment(exp, opts)
        nodes = {
            n["NodeID"]: c
            for n in ray.nodes()
            for c in ("sim-a", "sim-b")
            if f"device:{c}" in n["Resources"]
        }
        assert len(set(nodes.values())) == 2
        assert {s.device_class for s in summary.studies} == {"sim-a", "sim-b"}
        seen = set()
        for t in trials(storage):
            ua = t.user_attrs
            if ua.get("outcome") == "ok":
                cls = ua["worker"]["device_class"]
                assert nodes[ua["worker"]["node_id"]] == cls
                assert t.user_attrs["worker"]["worker_id"].startswith(cls)
                seen.add(cls)
        assert seen == {"sim-a", "sim-b"}
    finally:
        ray.shutdown()
        cluster.shutdown()


def test_one_study_per_model(tiny_model_factory, tmp_path: Path) -> None:  # noqa: ANN001
    """Two models on one device class: two studies, each worker loads both once and measures
    A/A noise per model."""
    models = [str(tiny_model_factory("qwen2", "q4_k_m")), str(tiny_model_factory("llama", "q8_0"))]
    data = experiment(
        models[0], "numpy", space={"numpy": {"prefill": {"chunk_tokens": [8, 16, 32]}}}
    )
    exp = parse_experiment({**data, "models": models})
    storage = str(tmp_path / "studies.journal")
    summary = run_experiment(exp, RunOptions(parse_storage(storage), budget=2, promote=False))
    assert sorted(s.family for s in summary.studies) == ["llama", "qwen2"]
    assert all(s.evaluated == 2 for s in summary.studies)
    (worker,) = summary.workers
    assert set(worker["noise"]) == set(models)
