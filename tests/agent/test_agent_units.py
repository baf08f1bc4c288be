"""Agent pieces without Ray: experiment files, search space, statistics, acceptance, evidence
TOML, promotion into a git repository, Ray auth and the node bootstrap command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import optuna
import pytest

from agent.acceptance import decide
from agent.experiment import ExperimentError, load_experiment, parse_experiment
from agent.promote import PromotionRefused, evidence_toml, promote
from agent.space import build_space, config_key
from agent.stats import aa_noise, order_bounds, paired_ratio
from engine.synth import preset_shape
from engine.tuning import TuningConfig
from engine.tuning.promoted import find_promoted
from worker import ray_auth
from worker.bootstrap import start_command
from worker.device import NodeDevices, backends_for, device_classes_in
from worker.records import EvalResult, Outcome, PairedSamples

ROOT = Path(__file__).resolve().parents[2]
TINY = preset_shape("qwen2", "tiny")  # the shape promotions below are keyed by
TINY_REL = f"configs/cpu/qwen2/{TINY.key}.ctx4096.toml"
MINIMAL = {
    "models": ["synthetic:tiny"],
    "backends": ["numpy"],
    "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 32}],
}


def _exp(**over: object) -> dict:
    return {**MINIMAL, **over}


# --- experiments ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "path", sorted((ROOT / "experiments").glob("*.toml")), ids=lambda p: p.name
)
def test_shipped_experiments_load(path: Path) -> None:
    exp = load_experiment(path)
    assert exp.models and exp.objectives
    assert exp.acceptance.target in [o.name for o in exp.objectives]


@pytest.mark.parametrize(
    ("name", "op", "variants", "knobs"),
    [
        ("delta-net", "delta_net", ["sequential", "chunked"], ["chunked.chunk", "chunked.scan_wg"]),
        ("moe", "moe_experts", ["grouped", "dmmv"], ["grouped.tile_pairs"]),
    ],
)
def test_hybrid_experiments_search_the_hybrid_variants(
    name: str, op: str, variants: list[str], knobs: list[str]
) -> None:
    """The issue-15 experiments run a hybrid model and search both of the op's Vulkan variants
    with their knobs (a variant dropped from a toml, or a knob renamed in the registry, fails
    here rather than as a study that never tries it)."""
    from engine.synth_hybrid import HYBRID_ARCHS
    from worker.models import synthetic_args

    exp = load_experiment(ROOT / "experiments" / f"{name}.toml")
    assert all(synthetic_args(m)[1] in HYBRID_ARCHS for m in exp.models)
    grid = build_space("vulkan", exp.space_for("vulkan")).grid()
    assert grid[f"{op}.variant"] == variants
    for knob in knobs:
        assert len(grid[f"{op}.{knob}"]) > 1, knob
    if name == "delta-net":  # the same chunk knob on NumPy, searched whole
        assert "delta_net.chunked.chunk" in build_space("numpy", exp.space_for("numpy")).grid()


def test_moe_experiment_searches_the_cuda_tensor_core_experts() -> None:
    """experiments/moe.toml on CUDA: moe_experts.tc with both of its own knobs next to the
    grouped DMMV's tile (each variant's tile_pairs within its registry choices)."""
    exp = load_experiment(ROOT / "experiments" / "moe.toml")
    grid = build_space("cuda", exp.space_for("cuda")).grid()
    assert "tc" in grid["moe_experts.variant"]
    assert grid["moe_experts.tc.tile_pairs"] == [16, 32, 64]
    assert grid["moe_experts.tc.block_rows"] == [64, 128]
    assert grid["moe_experts.grouped.tile_pairs"] == [8, 16, 32]


def test_hybrid_9b_experiment_searches_the_cuda_hybrid_knobs() -> None:
    """experiments/hybrid-9b.toml: the 9B-like qwen35 on CUDA, with the decode kernels (the
    float mmvf default and mmvw both run the hybrid projections fused), both scans with chunk,
    the int8 prefill GEMM; every searched value is one the registry accepts, and decode is the
    target."""
    from worker.models import synthetic_args

    exp = load_experiment(ROOT / "experiments" / "hybrid-9b.toml")
    assert tuple(exp.backends) == ("cuda",)
    assert synthetic_args(exp.models[0])[:2] == ("9b", "qwen35")
    grid = build_space("cuda", exp.space_for("cuda")).grid()
    assert grid["matmul_decode.variant"] == ["mmvf", "dmmv", "mmvw"]  # mmvf: the default
    assert grid["matmul_decode.mmvw.pdl"] == [0, 1]
    assert grid["matmul_decode.mmvf.q4k_pair"] == [0, 1]
    assert grid["delta_net.variant"] == ["sequential", "chunked"]
    assert grid["delta_net.chunked.chunk"] == [32, 64]
    assert "mmq8" in grid["matmul_prefill.variant"]
    assert exp.acceptance.target == "decode_tok_s@16"


def test_hybrid_35b_experiment_searches_the_moe_decode_knobs() -> None:
    """experiments/hybrid-35b.toml: the 35B-A3B-like qwen35moe on CUDA, the routed experts'
    fused decode's kernels, the router and the decode GEMV; prefill variants slower than tc, the
    dense-FFN fusions (a MoE layer has no dense FFN) and the 4x slower chunked scan stay out of
    a short budget."""
    from worker.models import synthetic_args

    exp = load_experiment(ROOT / "experiments" / "hybrid-35b.toml")
    assert synthetic_args(exp.models[0])[:2] == ("35b-a3b", "qwen35moe")
    grid = build_space("cuda", exp.space_for("cuda")).grid()
    assert "moe_experts.variant" not in grid  # tc alone: the validated prefill default
    for knob in ("route_block", "topk_regs", "down_split", "gate_up_pair", "fuse_pre_norm"):
        assert len(grid[f"moe_experts.tc.{knob}"]) > 1  # the new fused-decode kernels
    assert "moe_experts.tc.fuse_decode" not in grid  # pinned: the unfused decode is slower
    assert grid["matmul_decode.variant"] == ["mmvf", "mmvw"]
    assert "matmul_decode.mmvw.fuse_swiglu" not in grid  # one value: not searched
    assert "delta_net.variant" not in grid and "delta_net.chunked.chunk" not in grid
    assert grid["delta_net.sequential.step_cluster"] == [0, 2, 4]  # dn_clu.cu (helper dn)
    assert len(grid["router_topk.default.rows_per_block"]) == 3
    assert exp.acceptance.target == "decode_tok_s@16" and exp.sampler.screen_variants


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_exp(budjet={}), "unknown key 'budjet'"),
        (_exp(objectives=[{"metric": "tok_s"}]), "allowed values: ['prefill_tok_s'"),
        (_exp(sampler={"name": "bayes"}), "sampler.name = 'bayes'"),
        (
            _exp(space={"numpy": {"matmul_prefill": {"variants": ["kpar"]}}}),
            "allowed: ['cached_f32'",
        ),
        (_exp(space={"numpy": {"prefill": {"chunk_tokens": [33]}}}), "[33] not allowed"),
        (_exp(space={"numpy": {"prefill": {"chunk_tokens": {"min": 2000}}}}), "no registry choice"),
        (_exp(space={"numpy": {"prefill": {"rows": [1]}}}), "no searched variant has this knob"),
        (_exp(space={"numpy": {"nope": {}}}), "has no such op"),
        (_exp(acceptance={"target": "decode_tok_s@1"}), "acceptance.target"),
        (_exp(budget={"trials": 0}), "budget.trials = 0: must be >= 1"),
        (_exp(backends=["opencl"]), "backends[] = 'opencl'"),
    ],
)
def test_experiment_errors_name_the_key(data: dict, message: str) -> None:
    with pytest.raises(ExperimentError) as e:
        parse_experiment(data)
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[budget]\ntrial_timeout_s = nan", "budget.trial_timeout_s = nan"),
        ("[budget]\ntrial_timeout_s = inf", "budget.trial_timeout_s = inf"),
        ("[budget]\nwall_time_s = inf", "budget.wall_time_s = inf"),
        ("[acceptance]\nconfidence = nan", "acceptance.confidence = nan"),
        ("[acceptance]\nmin_gain = inf", "acceptance.min_gain = inf"),
        ("[acceptance]\nmax_regression = nan", "acceptance.max_regression = nan"),
        ("[acceptance]\nmin_gain = -inf", "acceptance.min_gain = -inf"),
    ],
)
def test_non_finite_numbers_are_rejected_by_name(tmp_path: Path, text: str, key: str) -> None:
    """nan passed every range check (a nan timeout never fired: the agent busy-spun)."""
    f = tmp_path / "e.toml"
    f.write_text(
        'models = ["synthetic:tiny"]\nbackends = ["numpy"]\n'
        '[[objectives]]\nmetric = "prefill_tok_s"\n' + text + "\n"
    )
    with pytest.raises(ExperimentError, match=f"{key}: must be a finite number"):
        load_experiment(f)


def test_experiment_path_that_is_a_directory_or_binary(tmp_path: Path) -> None:
    from agent.cli import main

    b = tmp_path / "blob.toml"
    b.write_bytes(bytes(range(256)))
    for path, message in ((tmp_path, "is a directory"), (b, "not a text file")):
        with pytest.raises(ExperimentError, match=message):
            load_experiment(path)
        assert main(["check", str(path)]) == 2
        assert main(["run", str(path)]) == 2


def test_cmaes_needs_one_objective() -> None:
    objs = [
        {"metric": "prefill_tok_s", "prompt_tokens": 32},
        {"metric": "decode_tok_s", "prompt_tokens": 8},
    ]
    with pytest.raises(ExperimentError, match="one objective"):
        parse_experiment(_exp(objectives=objs, sampler={"name": "cmaes"}))


# --- search space ---------------------------------------------------------------------------
def test_space_is_read_from_the_registry_and_round_trips() -> None:
    exp = parse_experiment(
        _exp(space={"numpy": {"prefill": {"chunk_tokens": [8, 16, 64]}, "matmul_prefill": {}}})
    )
    space = build_space("numpy", exp.space_for("numpy"))
    assert space.size == 3 * 2
    grid = space.grid()
    assert grid["prefill.batched.chunk_tokens"] == [8, 16, 64]
    assert grid["matmul_prefill.variant"] == ["cached_f32", "ondemand"]
    base = TuningConfig.default("numpy").flat()
    assert space.params_of(base) is None  # chunk_tokens 32 is outside this space
    cand = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 64}).flat()
    params = space.params_of(cand)
    assert params == {"prefill.batched.chunk_tokens": 64, "matmul_prefill.variant": "cached_f32"}
    assert config_key(cand) == config_key(dict(reversed(list(cand.items()))))


def test_everything_space_covers_all_knobs() -> None:
    exp = parse_experiment(_exp())
    space = build_space("numpy", exp.space_for("numpy"))
    assert {
        "prefill.batched.chunk_tokens",
        "matmul_prefill.variant",
        "matmul_decode.variant",
    } <= set(space.grid())


# --- statistics and acceptance --------------------------------------------------------------
def _result(cand: list[float], best: list[float], name: str = "prefill_tok_s@32") -> EvalResult:
    return EvalResult(
        Outcome.OK, None, {}, {}, samples=(PairedSamples(name, tuple(cand), tuple(best)),)
    )


def test_paired_ratio_bounds() -> None:
    rng = np.random.default_rng(1)
    best = 100 * (1 + 0.02 * rng.standard_normal(8))
    est = paired_ratio(best * 1.3, best)
    assert est.ratio == pytest.approx(1.3) and est.lower == pytest.approx(1.3)
    assert aa_noise(best, best) == pytest.approx(0.0)
    # One cold pair among five (a GPU ramping its clocks) does not set the worker's bias.
    cold = list(best[:5])
    cold[0] *= 0.3
    assert aa_noise(cold, best[:5]) == pytest.approx(0.0)
    assert aa_noise(best * 1.04, best) == pytest.approx(0.04)  # a bias every pair shows


def test_paired_ratio_bounds_hold_under_burst_contention() -> None:
    """Pairs slowed in bursts (a contended machine, one side's runs hit): an A/A run read beside
    CPU hogs, x1.33 with a t/bootstrap lower bound of 1.04, as CI accepted one at x1.36. The sign
    test's bound is the smallest pair at 5 pairs, so every pair has to clear the threshold; at
    16 pairs the 5th."""
    best = [100.0] * 5
    burst = [100.0 * r for r in (1.481, 1.831, 1.481, 1.013, 1.027)]
    est = paired_ratio(burst, best)
    assert est.ratio == pytest.approx(1.331, abs=1e-3)
    assert est.lower == pytest.approx(1.013) and est.upper == pytest.approx(1.831)
    acc = parse_experiment(_exp(acceptance={"min_gain": 0.02})).acceptance
    assert not decide(_result(burst, best), acc, {}).accepted
    logs = np.log(np.arange(1.0, 17.0))
    assert order_bounds(logs, 0.95) == (pytest.approx(np.log(5.0)), pytest.approx(np.log(12.0)))
    assert order_bounds(logs[:3], 0.95) == (0.0, pytest.approx(np.log(3.0)))


def test_acceptance_needs_the_bound_above_gain_and_noise() -> None:
    acc = parse_experiment(_exp(acceptance={"min_gain": 0.05})).acceptance
    rng = np.random.default_rng(2)
    best = list(100 * (1 + 0.01 * rng.standard_normal(6)))
    clear = [b * 1.2 for b in best]
    assert decide(_result(clear, best), acc, {}).accepted
    assert not decide(_result(clear, best), acc, {"prefill_tok_s@32": 0.25}).accepted
    small = [b * 1.03 for b in best]
    assert not decide(_result(small, best), acc, {}).accepted


def test_aa_noop_is_never_accepted_over_many_runs() -> None:
    """Candidate == best: independent noisy pairs, 200 repeats, no acceptance."""
    acc = parse_experiment(_exp(acceptance={"min_gain": 0.02})).acceptance
    rng = np.random.default_rng(3)
    accepted = 0
    for _ in range(200):
        a = list(100 * (1 + 0.03 * rng.standard_normal(5)))
        b = list(100 * (1 + 0.03 * rng.standard_normal(5)))
        accepted += decide(_result(a, b), acc, {}).accepted
    assert accepted == 0


def test_regression_on_another_objective_rejects() -> None:
    exp = parse_experiment(
        _exp(
            objectives=[
                {"metric": "prefill_tok_s", "prompt_tokens": 32},
                {"metric": "decode_tok_s", "prompt_tokens": 8},
            ],
            acceptance={"max_regression": 0.05},
        )
    )
    best = [100.0, 101.0, 99.0, 100.5, 99.5]
    res = EvalResult(
        Outcome.OK,
        None,
        {},
        {},
        samples=(
            PairedSamples("prefill_tok_s@32", tuple(b * 1.5 for b in best), tuple(best)),
            PairedSamples("decode_tok_s@8", tuple(b * 0.7 for b in best), tuple(best)),
        ),
    )
    d = decide(res, exp.acceptance, {})
    assert not d.accepted and "decode_tok_s@8 regresses" in d.reason


# --- evidence TOML and promotion ------------------------------------------------------------
def test_toml_writer_round_trips() -> None:
    data = {
        "evidence": {
            "trial": 3,
            "ratio": 1.25,
            "ok": True,
            "device": 'AMD "R9700"\nline',
            "changed": {"prefill.chunk_tokens": {"from": 32, "to": 40}},
            "objectives": {"prefill_tok_s@64": {"candidate": [1.0, 2.5], "best": [1.0, 2.0]}},
            "missing": None,
        }
    }
    assert tomllib.loads(evidence_toml(data)) == {"evidence": {**data["evidence"], "missing": ""}}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def test_promotion_commits_only_the_config(repo: Path) -> None:
    cfg = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 64})
    (repo / "unrelated.txt").write_text("work in progress\n")  # untracked: must stay out
    p = promote(repo, "cpu", TINY, 4096, cfg, {"trial": 4, "ratio": 1.2, "target": "x"})
    assert _git(repo, "show", "--name-only", "--format=", p.commit) == TINY_REL
    assert "unrelated.txt" in _git(repo, "status", "--porcelain")
    found = find_promoted("numpy", "cpu", TINY, 4096, root=repo / "configs")
    assert found is not None and found.config == cfg and found.path == p.path
    evidence = tomllib.loads(p.path.read_text())["evidence"]
    assert evidence["trial"] == 4 and evidence["tuned_on"]["context_tokens"] == 4096
    assert (
        evidence["tuned_on"]["shape_key"] == TINY.key
        and evidence["tuned_on"]["dims"]["layers"] == 2
    )
    again = promote(repo, "cpu", TINY, 4096, cfg, {"trial": 4, "ratio": 1.2, "target": "x"})
    assert again.commit == ""  # same content: no empty commit


def test_promotion_refuses_staged_changes_and_other_branches(repo: Path) -> None:
    cfg = TuningConfig.default("numpy")
    (repo / "README").write_text("changed\n")
    _git(repo, "add", "README")
    with pytest.raises(PromotionRefused, match="staged changes"):
        promote(repo, "cpu", TINY, 4096, cfg, {})
    _git(repo, "reset", "-q")
    _git(repo, "checkout", "-q", "-b", "feature")
    with pytest.raises(PromotionRefused, match="not main"):
        promote(repo, "cpu", TINY, 4096, cfg, {})
    assert not (repo / "configs").exists()


def test_promotion_refuses_to_overwrite_an_untracked_config(repo: Path) -> None:
    hand = repo / TINY_REL
    hand.parent.mkdir(parents=True)
    hand.write_text("# mine\nbackend = 'numpy'\n")
    cfg = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 64})
    with pytest.raises(PromotionRefused, match=rf"{TINY_REL} exists but git does not"):
        promote(repo, "cpu", TINY, 4096, cfg, {})
    assert hand.read_text() == "# mine\nbackend = 'numpy'\n"
    assert _git(repo, "log", "--format=%s") == "init"


def test_failed_promotion_commit_is_rolled_back(repo: Path) -> None:
    """A hook that fails the commit left the config staged: the engine then loaded a config
    nobody promoted, and every later promotion was refused for the staged change."""
    hook = repo / ".git" / "hooks" / "pre-commit"
    hook.write_text("#!/bin/sh\necho 'policy says no' >&2\nexit 1\n")
    hook.chmod(0o755)
    cfg = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 64})
    with pytest.raises(PromotionRefused, match="rolled back.*policy says no"):
        promote(repo, "cpu", TINY, 4096, cfg, {"trial": 1})
    assert _git(repo, "status", "--porcelain") == ""
    assert not (repo / "configs").exists()
    hook.unlink()
    p = promote(repo, "cpu", TINY, 4096, cfg, {"trial": 1})  # nothing left in the way
    assert _git(repo, "show", "--name-only", "--format=", p.commit) == TINY_REL
    # A failed update of an existing file restores the committed version.
    hook.write_text("#!/bin/sh\nexit 1\n")
    hook.chmod(0o755)
    committed = p.path.read_text()
    with pytest.raises(PromotionRefused, match="rolled back"):
        promote(repo, "cpu", TINY, 4096, cfg.replace(**{"prefill.chunk_tokens": 32}), {"trial": 2})
    assert p.path.read_text() == committed and _git(repo, "status", "--porcelain") == ""


def test_promotion_target_checked_up_front(tmp_path: Path, repo: Path) -> None:
    from agent.promote import check_target

    with pytest.raises(PromotionRefused, match="does not exist"):
        check_target(tmp_path / "nope", "main")
    (tmp_path / "plain").mkdir()
    with pytest.raises(PromotionRefused, match="not a git repository"):
        check_target(tmp_path / "plain", "main")
    _git(repo, "checkout", "-q", "--detach")
    with pytest.raises(PromotionRefused, match="detached HEAD"):
        check_target(repo, "main")
    _git(repo, "checkout", "-q", "main")
    check_target(repo, "main")


def test_a_recorded_promotion_is_checked_against_its_branch(repo: Path) -> None:
    from agent.promote import still_there

    cfg = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 64})
    p = promote(repo, "cpu", TINY, 4096, cfg, {"trial": 1})
    rel = p.path.relative_to(repo)
    assert still_there(repo, "main", rel, p.commit, cfg) == ""
    assert "holds" in still_there(repo, "main", rel, p.commit, TuningConfig.default("numpy"))
    _git(repo, "reset", "-q", "--hard", "HEAD~1")  # the promotion commit reset away
    assert "no longer on main" in still_there(repo, "main", rel, p.commit, cfg)
    assert "not in" in still_there(repo, "main", rel, "0" * 40, cfg)


# --- Ray auth and the node bootstrap --------------------------------------------------------
def test_auth_token_mode_needs_a_token_to_join(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "none"))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    with pytest.raises(ray_auth.AuthSetupError, match="auth_token"):
        ray_auth.auth_env("token", joining=True)
    assert ray_auth.auth_env("disabled", joining=True) == {"RAY_AUTH_MODE": "disabled"}
    (tmp_path / "none").write_text("secret")
    assert ray_auth.auth_env("token", joining=True) == {"RAY_AUTH_MODE": "token"}
    with pytest.raises(ray_auth.AuthSetupError, match="allowed values"):
        ray_auth.auth_env("maybe")


def test_start_command_advertises_devices() -> None:
    from engine.backends.base import DeviceInfo

    gpu = DeviceInfo("cuda", "NVIDIA H200", "nvidia", "h200")
    amd = DeviceInfo("vulkan", "AMD Radeon AI PRO R9700", "amd", "r9700")
    devices = NodeDevices((gpu, gpu, amd), cuda_count=2)
    cmd = start_command(devices, "head:6379", auth_mode="disabled")
    text = cmd.shell()
    assert "--address=head:6379" in text and "--num-gpus=2" in text
    assert cmd.env == {"RAY_AUTH_MODE": "disabled"}
    res = devices.resources()
    assert device_classes_in(res) == {"h200": 2, "r9700": 1}
    assert backends_for(res, "r9700") == ["vulkan"]


def test_worker_cli_dry_run() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "worker", "start", "--head", "--dry-run", "--backends", "numpy"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert "ray start --head" in out and '"device:cpu": 1' in out


# --- studies: samplers, duplicates, resume ---------------------------------------------------
def _study(storage, sampler: str = "tpe"):  # noqa: ANN001, ANN202
    from agent.study import StudyState

    exp = parse_experiment(
        _exp(
            space={"numpy": {"prefill": {"chunk_tokens": [8, 16, 32, 64]}, "matmul_prefill": {}}},
            sampler={"name": sampler, "startup_trials": 2},
        )
    )
    base = TuningConfig.default("numpy").flat()
    return StudyState(exp, "cpu", "numpy", "synthetic:tiny", "qwen2", storage, base, "default")


@pytest.mark.parametrize("sampler", ["tpe", "random", "grid", "coordinate", "nsga2", "cmaes"])
def test_samplers_never_repeat_a_config(sampler: str) -> None:
    import optuna

    from agent.records import TrialRecord

    st = _study(optuna.storages.InMemoryStorage(), sampler)
    seen = []
    while (asked := st.ask()) is not None:
        trial, flat, role = asked
        assert role == ("baseline" if not seen else "candidate")
        seen.append(config_key(flat))
        rec = TrialRecord(st.name, trial.number, role, "ok", config=flat)
        st.finish(trial, rec, [float(len(seen))])
        st.flush()
    assert len(seen) == len(set(seen)) == st.space.size == 8


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_told_repeats_never_end_the_search_early(sampler: str) -> None:
    """Repeats told their config's values make TPE ask for tried configs again: after
    ``repeat_guard`` of them an untried config is enqueued, so every config still gets its turn
    before the space is called exhausted."""
    from agent.records import TrialRecord

    st = _study(optuna.storages.InMemoryStorage(), sampler)
    st.tell_duplicates = True
    seen = []
    while (asked := st.ask()) is not None:
        trial, flat, role = asked
        seen.append(config_key(flat))
        rec = TrialRecord(st.name, trial.number, role, "ok", config=flat)
        st.finish(trial, rec, [100.0 - len(seen)] * len(st.exp.objectives))
        st.flush()
    assert len(seen) == len(set(seen)) == st.space.size == 8
    assert st.duplicates_in_a_row < 30  # ended because every config was tried, not by the limit


def test_after_repeat_guard_repeats_an_untried_config_is_enqueued() -> None:
    from agent.records import TrialRecord

    st = _study(optuna.storages.InMemoryStorage(), "random")
    st.tell_duplicates = True
    for _ in range(7):
        trial, flat, role = st.ask()
        st.finish(trial, TrialRecord(st.name, trial.number, role, "ok", config=flat), [1.0])
        st.flush()
    for _ in range(3):  # the sampler insists on a tried config (repeat_guard 3)
        st.study.enqueue_trial(st.space.params_of(flat) or {}, user_attrs={"role": "candidate"})
    trial, last, _ = st.ask()
    assert config_key(last) not in st.tried
    # the guard's pick (an enqueued trial: its params fixed), not a lucky random draw
    assert "fixed_params" in st.study.trials[trial.number].system_attrs


@pytest.mark.parametrize(("outcome", "tell"), [("ok", True), ("ok", False), ("invalid", True)])
def test_a_repeat_is_told_what_its_config_was_told(outcome: str, tell: bool) -> None:
    """A repeat (never run, no budget) of an ok config is told COMPLETE with that config's
    values when tell_duplicates is on (else PRUNED, as the agent does by default); a repeat of
    a failed config is told PRUNED with the violated constraint, like the failure itself."""
    from agent.records import TrialRecord
    from agent.study import CONSTRAINT

    st = _study(optuna.storages.InMemoryStorage())
    st.tell_duplicates = tell
    trial, flat, role = st.ask()
    values = [5.0 + i for i in range(len(st.exp.objectives))]
    rec = TrialRecord(st.name, trial.number, role, outcome, config=flat)
    st.finish(trial, rec, values if outcome == "ok" else None)
    st.flush()
    st.study.enqueue_trial(st.space.params_of(flat) or {}, user_attrs={"role": "candidate"})
    nxt, flat2, _ = st.ask()
    assert config_key(flat2) != config_key(flat) and st.evaluated == 1
    dup = st.study.trials[nxt.number - 1]
    assert dup.user_attrs["outcome"] == "duplicate" and dup.user_attrs["config"] == flat
    State = optuna.trial.TrialState  # noqa: N806
    if outcome == "ok" and tell:
        assert dup.state == State.COMPLETE and dup.values == values
    else:
        assert dup.state == State.PRUNED and dup.values is None
        assert dup.constraints == ({CONSTRAINT: 1.0} if outcome != "ok" else {})


def test_tpe_uses_a_light_prior() -> None:
    """TPE's prior weight (agent/samplers.py): 0.25 cut the replay's trials-to-best."""
    from agent.samplers import PRIOR_WEIGHT

    st = _study(optuna.storages.InMemoryStorage())
    assert st.study.sampler._parzen_estimator_parameters.prior_weight == PRIOR_WEIGHT == 0.25


def test_resume_fails_running_trials_and_keeps_the_baseline_once(tmp_path: Path) -> None:
    from agent.records import TrialRecord
    from agent.storage import parse_storage

    ref = parse_storage(str(tmp_path / "s.journal"))
    st = _study(ref.open())
    trial, flat, _ = st.ask()
    st.finish(trial, TrialRecord(st.name, trial.number, "baseline", "ok", config=flat), [1.0])
    st.flush()
    st.ask()  # left RUNNING: the agent "dies" here
    again = _study(ref.open())
    assert again.interrupted_on_resume == 1 and again.evaluated == 1
    assert config_key(flat) in again.tried
    _, flat2, role = again.ask()
    assert role == "candidate" and config_key(flat2) != config_key(flat)


def test_resume_keeps_a_result_written_before_tell(tmp_path: Path) -> None:
    """Killed after the trial's record reached the storage but before tell: resume completes
    the trial with the recorded metrics instead of failing it as interrupted."""
    import optuna

    from agent.records import TrialRecord
    from agent.storage import parse_storage

    ref = parse_storage(str(tmp_path / "s.journal"))
    st = _study(ref.open())
    trial, flat, _ = st.ask()
    names = [o.name for o in st.exp.objectives]
    metrics = {n: 10.0 + i for i, n in enumerate(names)}
    rec = TrialRecord(st.name, trial.number, "baseline", "ok", config=flat, metrics=metrics)
    for k, v in rec.to_attrs().items():  # the record, outcome last, then the agent "dies"
        if k != "outcome":
            trial.set_user_attr(k, v)
    trial.set_user_attr("outcome", "ok")
    again = _study(ref.open())
    assert again.interrupted_on_resume == 0 and again.evaluated == 1
    t = again.study.trials[trial.number]
    assert t.state == optuna.trial.TrialState.COMPLETE
    assert t.values == [metrics[n] for n in names]
    assert again.best.trial == trial.number  # the baseline result is the best so far


def test_resume_warns_when_the_search_space_changed(tmp_path: Path) -> None:
    """A study resumed after the registry or the experiment changed its space says so (its old
    trials would otherwise silently stand for configs of another meaning)."""
    from agent.records import TrialRecord
    from agent.storage import parse_storage
    from agent.study import StudyState

    ref = parse_storage(str(tmp_path / "s.journal"))
    st = _study(ref.open())
    trial, flat, _ = st.ask()
    st.finish(trial, TrialRecord(st.name, trial.number, "baseline", "ok", config=flat), [1.0])
    st.flush()
    assert _study(ref.open()).space_changed == ""
    exp = parse_experiment(
        _exp(
            space={"numpy": {"prefill": {"chunk_tokens": [8, 16]}, "matmul_prefill": {}}},
            sampler={"name": "tpe", "startup_trials": 2},
        )
    )
    base = TuningConfig.default("numpy").flat()
    again = StudyState(exp, "cpu", "numpy", "synthetic:tiny", "qwen2", ref.open(), base, "default")
    assert "prefill.batched.chunk_tokens choices" in again.space_changed
    assert again.evaluated == 1


def test_run_dashboard_on_a_taken_port_is_refused_up_front(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The run announced http://127.0.0.1:PORT while another program served that port."""
    import socket

    from agent.cli import main

    exp = tmp_path / "e.toml"
    exp.write_text(
        'models = ["synthetic:tiny"]\nbackends = ["numpy"]\n'
        '[[objectives]]\nmetric = "prefill_tok_s"\n'
    )
    storage = tmp_path / "s.db"
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        argv = ["run", str(exp), "--storage", str(storage), "--dashboard", str(port)]
        assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} is taken" in err and err.count("\n") == 1
    assert "http://" not in err and not storage.exists()


def test_worker_calls_follow_the_phase_table(monkeypatch: pytest.MonkeyPatch) -> None:
    """The setup a (re)started worker is given is a path through agent.phase's table, and the
    table refuses calls out of order (an evaluation before the worker is identified)."""
    from agent import runner
    from agent.phase import WORKER_NEXT, IllegalTransition, Phase, advance

    monkeypatch.setattr(runner, "spawn", lambda *a: object())  # no Ray: the setup list only
    f = runner.Fleet({"cpu": 1}, {"cpu": ("numpy",)}, None, "")
    for fresh in (True, False):
        slot = f.slots[0]
        slot.phase = Phase.TRIAL
        f.start(slot, ("a", "b"), fresh)
        assert [p for p, _ in slot.setup].count(Phase.AA) == (2 if fresh else 0)
        last = slot.phase
        for phase, _ in [*slot.setup, (Phase.TRIAL, "a"), (Phase.CONFIRM, "a")]:
            last = advance(last, phase)
        assert last is Phase.CONFIRM
    assert set(WORKER_NEXT) == {None, *Phase} and str(Phase.AA) == "aa"
    for last, nxt in [(None, Phase.TRIAL), (Phase.TRIAL, Phase.LOAD), (Phase.AA, Phase.INFO)]:
        with pytest.raises(IllegalTransition, match=f"a {nxt} call cannot follow"):
            advance(last, nxt)


def test_a_trial_moves_only_as_the_table_allows() -> None:
    """A trial's life is agent.phase's table: asked -> running -> (confirm) -> finished, a
    lost call back to its own phase; any other move raises, and a finished trial is done."""
    import optuna

    from agent.phase import TRIAL_MOVES, IllegalTransition, Phase, TrialStage
    from agent.records import TrialRecord

    assert set(TRIAL_MOVES) == set(TrialStage) and not TRIAL_MOVES[TrialStage.FINISHED]
    st = _study(optuna.storages.InMemoryStorage())
    trial, flat, role = st.ask()
    n = trial.number
    assert st.states[n] is TrialStage.ASKED
    with pytest.raises(IllegalTransition, match=f"trial {n}: asked -> confirming"):
        st.move(n, TrialStage.sent(Phase.CONFIRM))  # a confirmation of a trial never run
    for nxt in (
        TrialStage.RUNNING,
        TrialStage.retry(Phase.TRIAL),
        TrialStage.RUNNING,
        TrialStage.CONFIRM_WAIT,
        TrialStage.CONFIRMING,
        TrialStage.retry(Phase.CONFIRM),
        TrialStage.CONFIRMING,
    ):
        st.move(n, nxt)
    with pytest.raises(IllegalTransition, match="confirming -> running"):
        st.move(n, TrialStage.RUNNING)  # a confirmed trial is not run again
    rec = TrialRecord(st.name, n, role, "ok", config=flat)
    st.finish(trial, rec, [1.0])
    assert n not in st.states
    with pytest.raises(IllegalTransition, match="unknown -> finished"):
        st.finish(trial, rec, [1.0])  # told twice


# --- the typed trial record ------------------------------------------------------------------
OLD_RECORD = {  # user attrs as an older agent stored them: fewer keys, one since dropped
    "role": "candidate",
    "outcome": "ok",
    "reason": "",
    "config": {"prefill.chunk_tokens": 16},
    "changed": {"prefill.chunk_tokens": [8, 16]},
    "paired_against": 0,
    "metrics": {"prefill_tok_s@32": 120.0},
    "samples": {"prefill_tok_s@32": {"candidate": [120.0, 121.0], "best": [100.0, 99.0]}},
    "estimates": {"prefill_tok_s@32": {"ratio": 1.2, "lower": 1.1, "upper": 1.3}},
    "accepted": True,
    "decision": {"accepted": True, "reason": "x1.200", "threshold": 1.05, "noise": 0.01},
    "confirmation": {"worker": {"worker_id": "cpu-1", "host": "h2"}, "outcome": "ok",
                     "accepted": True, "reason": "again",
                     "estimates": {"prefill_tok_s@32": {"ratio": 1.19, "lower": 1.08,
                                                        "upper": 1.3}}},
    "validate": {"passed": True, "max_abs_diff": 1e-4, "nmse": 1e-9, "steps": 2,
                 "tolerances": {"nmse": 1e-5},
                 "prompts": [{"prompt_tokens": 5, "max_abs_diff": 1e-4, "nmse": 1e-9,
                              "token_agreement": 1.0, "reference_tokens": [1, 2]}]},
    "worker": {"worker_id": "cpu-0", "host": "h1", "backend": "numpy", "gone_key": 1},
    "host": "h1",
    "wall_s": 2.5,
    "old_field": "ignored",
}  # fmt: skip


def test_trial_record_reads_older_records_and_round_trips() -> None:
    """A record stored by older code reads typed (missing fields take defaults, unknown keys
    are dropped); the typed record stores and reads back equal; the dashboard's row reads it."""
    from agent.dashboard.fastread import RawTrial
    from agent.dashboard.rows import TrialRow
    from agent.records import Confirmation, TrialRecord, Verdict

    rec = TrialRecord.from_attrs("s", 3, OLD_RECORD)
    assert rec.outcome is Outcome.OK and rec.outcome.spends_budget and rec.accepted
    est = rec.estimates["prefill_tok_s@32"]
    assert (est.ratio, est.lower, est.pairs) == (1.2, 1.1, 0)
    assert rec.decision == Verdict(True, "x1.200", "", 1.05, 0.01)
    assert rec.samples["prefill_tok_s@32"].best == (100.0, 99.0)
    assert rec.validate and rec.validate.passed and rec.validate.kld is None
    assert rec.validate.numeric_classes is None
    assert rec.validate.prompts[0].reference_tokens == (1, 2)
    assert rec.worker and rec.worker.worker_id == "cpu-0" and rec.worker.device is None
    conf = rec.confirmation
    assert isinstance(conf, Confirmation) and conf.accepted and conf.paired_against is None
    assert conf.worker and conf.worker.host == "h2" and conf.estimates["prefill_tok_s@32"].lower
    stored = json.loads(json.dumps(rec.to_attrs()))  # as Optuna keeps it: JSON
    assert "old_field" not in stored and stored["outcome"] == "ok"
    assert TrialRecord.from_attrs("s", 3, stored) == rec
    assert TrialRecord.from_attrs("s", 4, {"outcome": "no-such"}).outcome is Outcome.CRASH

    raw = RawTrial(7, 3, optuna.trial.TrialState.COMPLETE, {}, {}, OLD_RECORD, [120.0], 1.0)
    row = TrialRow.of(raw, "prefill_tok_s@32")
    assert (row.verdict, row.ratio, row.threshold, row.worker, row.max_abs_diff) == (
        "accepted",
        1.2,
        1.05,
        "cpu-0",
        1e-4,
    )


def test_aa_run_settles_before_the_worker_gets_trials(tmp_path) -> None:
    """A first A/A run far off (the hybrid-9b fleet's 101%) is measured again; the last run's
    bias is the noise; a bias that stays is kept after AA_RUNS runs."""
    from dataclasses import replace

    from agent.fleet import Slot
    from agent.loop import AA_RUNS, AA_SETTLE, Agent, RunOptions
    from agent.phase import Phase
    from agent.storage import StorageRef
    from worker.records import EvalResult, Outcome, PairedSamples

    exp = load_experiment(ROOT / "experiments" / "quickstart.toml")
    opts = RunOptions(StorageRef(f"sqlite:///{tmp_path}/s.db", "sqlite", tmp_path / "s.db"))
    agent = Agent(exp, replace(opts, local=True))
    slot = Slot("w0", "cpu", ("numpy",))

    def aa(ratio: float) -> EvalResult:
        s = PairedSamples("decode_tok_s@16", (100.0 * ratio,) * 3, (100.0,) * 3)
        return EvalResult(Outcome.OK, None, {}, {}, samples=(s,))

    agent.got_aa(slot, "m", aa(2.01))  # a cold first run
    assert "m" not in slot.noise and slot.setup == [(Phase.AA, "m")]
    slot.setup.clear()
    agent.got_aa(slot, "m", aa(1.01))
    assert slot.noise["m"]["decode_tok_s@16"] == pytest.approx(0.01) and not slot.setup
    other = Slot("w1", "cpu", ("numpy",))  # a bias that stays is that worker's noise
    for run in range(1, AA_RUNS + 1):
        agent.got_aa(other, "m", aa(1.0 + 2 * AA_SETTLE))
        assert other.setup == ([(Phase.AA, "m")] if run < AA_RUNS else [])
        other.setup.clear()
    assert other.noise["m"]["decode_tok_s@16"] == pytest.approx(2 * AA_SETTLE)


def test_signals_held_wait_for_the_end_of_a_storage_write() -> None:
    """A SIGTERM or Ctrl-C inside signals_held() is taken at its end, by the handler that was
    in place (a SIGTERM once cut Optuna's journal lock release in half: exit 1, not 143)."""
    import os
    import signal

    from agent.signals import signals_held, stop_on_sigterm

    done = []
    with stop_on_sigterm(), pytest.raises(KeyboardInterrupt, match="signal 15"):
        with signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("write")  # not interrupted
    assert done == ["write"]
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt), signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("write 2")
    finally:
        signal.signal(signal.SIGINT, old)
    assert done == ["write", "write 2"]
    with signals_held():  # nothing pending: no exception
        pass


@pytest.mark.parametrize(
    ("start", "expect"),
    [
        ([{"name": "a", "config": {"matmul.nope": 1}}], "start 'a': matmul.nope is not a knob"),
        ([{"name": "a", "config": {"matmul_decode.variant": "warp9"}}], "outside the space's"),
        ([{"name": "a", "config": {}}], "start[0].config: at least one"),
        ([{"name": "a", "backend": "cuda", "config": {"x.y": 1}}], "start[0].backend"),
        ([{"name": "a", "config": {"matmul_decode.variant": "ondemand"}}] * 2, "used twice"),
        ({"name": "a"}, "start must be an array"),
    ],
)
def test_a_bad_start_config_is_refused_at_load(start: object, expect: str) -> None:
    with pytest.raises(ExperimentError, match=re.escape(expect)):
        parse_experiment(_exp(start=start))


def test_a_start_config_inside_the_space_loads() -> None:
    start = [{"name": "a", "config": {"matmul_decode.variant": "ondemand"}}]
    exp = parse_experiment(_exp(start=start))
    assert [(s.name, s.backend, s.config) for s in exp.start] == [
        ("a", "numpy", {"matmul_decode.variant": "ondemand"})
    ]
