"""Memory is measured and bounded (issue 28): the registry's memory model against the NumPy
backend's memory_report on the tiny model, the resident variants' declared fp16 copies, the
worker's footprint and its budget, the agent's [memory] budget (infeasible before compiling,
told to the sampler; an impossible budget refused with exit 2), and bench --json."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import tomli_w

from agent.cli import main as agent_main
from agent.dashboard.rows import TrialRow, raw_trial
from agent.records import Outcome, TrialRecord
from agent.storage import parse_storage
from agent.study import CONSTRAINT
from engine.bench import bench_prompt
from engine.cli import main as engine_main
from engine.footprint import measure
from engine.runtime import load
from engine.tuning import TuningConfig
from engine.tuning.memory import ModelShape, estimate
from tests.engine.backends.vulkan.test_vulkan_helpers import require_vulkan
from worker.evaluator import Evaluator
from worker.memory import footprint
from worker.records import BenchPlan, MemoryPlan, Objective

# Weights and KV/state are exact arithmetic (the file's blocks, float32 and fp16 copies, float32
# KV): on NumPy and lavapipe they agree to the byte on the tiny models; on CUDA (the device test)
# within TOLERANCE. The estimate's scratch is a bound (a full prefill chunk's activations), not a
# figure: NumPy reports none (its activations are host temporaries), Vulkan holds less.
TOLERANCE = 0.01

ONDEMAND = {"matmul_decode.variant": "ondemand", "matmul_prefill.variant": "ondemand"}


@pytest.fixture(scope="module")
def tiny(tiny_model_factory):  # noqa: ANN001, ANN201
    path = tiny_model_factory("qwen2", "q4_k_m")
    return path, ModelShape.read(path)


@pytest.mark.parametrize(
    ("arch", "flat"),
    [
        ("qwen2", {}),
        ("qwen2", ONDEMAND),
        ("qwen2", {"matmul_decode.variant": "ondemand"}),
        ("qwen35moe", {}),  # recurrent state, stacked experts, the conv kernel's dense copy
        ("qwen35moe", {"matmul_decode.variant": "ondemand"}),
    ],
)
def test_estimate_matches_measured_memory_report_on_numpy(tiny_model_factory, arch, flat) -> None:  # noqa: ANN001
    """Weights (the file's blocks, float32 copies of 1-D weights, of the conv kernel and of the
    matrices the cached_f32 variants keep) and KV / recurrent state agree to the byte."""
    path = tiny_model_factory(arch, "q4_k_m")
    shape = ModelShape.read(path)
    cfg = TuningConfig.default("numpy").replace(**flat)
    eng = load(path, "numpy", cfg, use_promoted=False)
    prompt = bench_prompt(40, shape.spec.n_vocab)
    eng.model.generate(prompt, 3)  # every matmul weight met by prefill and decode
    fp = measure(eng.model, 128, prompt)
    est = estimate(cfg, shape, 128)
    assert fp["estimate"] == est.to_dict()
    assert fp["weight_bytes"] == est.weight_bytes
    assert fp["kv_state_bytes"] == est.kv_state_bytes
    assert fp["driver_bytes"] is None and "no driver figure" in fp["driver"]
    if flat == ONDEMAND:
        assert est.copy_bytes == 0
    else:  # the float32 copies are the bulk: measured, not only declared
        assert est.copy_bytes > 2 * (est.weight_bytes - est.copy_bytes)


def test_estimate_matches_measured_memory_report_on_vulkan(tiny) -> None:  # noqa: ANN001
    """lavapipe (the resident variant needs cooperative matrices it lacks: the registry's
    constraint rules it out there, tests/engine/backends/vulkan/test_vulkan_resident.py): the
    loaded weights and the KV
    cache as estimated, the scratch the backend holds under the estimate's bound, and the
    driver's figure absent with its reason (lavapipe has no VK_EXT_memory_budget)."""
    require_vulkan()
    path, shape = tiny
    cfg = TuningConfig.default("vulkan")
    eng = load(path, "vulkan", cfg, use_promoted=False)
    prompt = bench_prompt(40, shape.spec.n_vocab)
    eng.model.generate(prompt, 3)
    fp = measure(eng.model, 128, prompt)
    est = estimate(cfg, shape, 128)
    # every buffer of the tiny model is a whole number of the allocator's 256-byte steps, so the
    # weights agree to the byte (norms and biases included: they were counted as scratch once)
    assert fp["weight_bytes"] == est.weight_bytes
    assert fp["kv_state_bytes"] == est.kv_state_bytes
    assert 0 < fp["scratch_bytes"] <= est.scratch_bytes
    if fp["driver_bytes"] is None:
        assert "VK_EXT_memory_budget" in fp["driver"]
    else:
        assert fp["driver_bytes"] > 0


@pytest.mark.gpu
def test_estimate_matches_measured_on_cuda_with_the_resident_copies(tiny, cuda_be) -> None:  # noqa: ANN001
    """CUDA (run on the device, not in CI): the loaded weights (Q6_K padded to 224-byte blocks)
    and KV as estimated; under matmul_prefill.resident the fp16 copies made by the prefill are
    the declared copy bytes; cudaMemGetInfo's figure covers at least what the backend holds."""
    path, shape = tiny
    held = {}
    for name, flat in (("default", {}), ("resident", {"matmul_prefill.variant": "resident"})):
        cfg = TuningConfig.default("cuda").replace(**flat)
        eng = load(path, "cuda", cfg, use_promoted=False)
        prompt = bench_prompt(40, shape.spec.n_vocab)
        eng.model.generate(prompt, 3)
        fp = measure(eng.model, 128, prompt)
        est = estimate(cfg, shape, 128)
        assert abs(fp["weight_bytes"] - est.weight_bytes) <= TOLERANCE * est.weight_bytes, name
        assert fp["kv_state_bytes"] == est.kv_state_bytes
        assert fp["driver_bytes"] >= fp["total_bytes"] and "cudaMemGetInfo" in fp["driver"]
        held[name] = (fp["weight_bytes"], est.copy_bytes)
        eng.model.backend.close()
    assert held["default"][1] == 0 and held["resident"][1] > 0
    assert held["resident"][0] - held["default"][0] == held["resident"][1]


def test_resident_variants_declare_their_fp16_copies(tiny) -> None:  # noqa: ANN001
    """CUDA and Vulkan matmul_prefill.resident hold an fp16 copy of every 2-D matmul weight of
    the layers (Vulkan's padded to 256 rows and k to 64); the other prefill variants none."""
    _, shape = tiny
    mats = [t for t in shape.tensors if t.name.startswith("blk.") and len(t.shape) == 2]
    cuda = TuningConfig.default("cuda")
    assert estimate(cuda, shape, 512).copy_bytes == 0
    res = estimate(cuda.replace(**{"matmul_prefill.variant": "resident"}), shape, 512)
    assert res.copy_bytes == sum(2 * t.shape[0] * t.shape[1] for t in mats)
    assert res.by_variant["matmul_prefill.resident"] == res.copy_bytes
    vk = TuningConfig.default("vulkan").replace(**{"matmul_prefill.variant": "resident"})
    pad = sum(2 * -(-t.shape[0] // 256) * 256 * -(-t.shape[1] // 64) * 64 for t in mats)
    assert estimate(vk, shape, 512).copy_bytes == pad
    over = res.over(res.total_bytes - 1)
    assert over.startswith("estimated ") and "> budget" in over
    assert "matmul_prefill.resident" in over
    assert res.over(res.total_bytes) == "" and res.over(None) == ""


def test_footprint_is_the_configs_own_after_another_config_ran(tiny) -> None:  # noqa: ANN001
    """A paired bench leaves the other side's copies behind (NumPy keeps its float32 cache
    across configs, CUDA its fp16 copies): the footprint frees them first, then remakes what
    its own config keeps."""
    path, shape = tiny
    eng = load(path, "numpy", TuningConfig.default("numpy"), use_promoted=False)
    prompt = bench_prompt(24, shape.spec.n_vocab)
    eng.model.generate(prompt, 3)  # the cached_f32 side: copies of every matrix
    ondemand = TuningConfig.default("numpy").replace(**ONDEMAND)
    eng.model.set_config(ondemand)
    fp = measure(eng.model, 64, prompt)
    assert fp["weight_bytes"] == estimate(ondemand, shape, 64).weight_bytes
    eng.model.set_config(TuningConfig.default("numpy"))
    fp = measure(eng.model, 64, prompt)  # and back: its copies made again by the measured run
    assert fp["weight_bytes"] == estimate(TuningConfig.default("numpy"), shape, 64).weight_bytes


def test_worker_footprint_judged_against_the_budget(tiny) -> None:  # noqa: ANN001
    path, shape = tiny
    eng = load(path, "numpy", TuningConfig.default("numpy"), use_promoted=False)
    dev = eng.model.backend.device_info()
    prompt = bench_prompt(24, shape.spec.n_vocab)
    objs = (Objective("prefill_tok_s", 24),)
    fp, over = footprint(eng.model, BenchPlan(objs, memory=MemoryPlan(context_tokens=64)), dev,
                         prompt)  # fmt: skip
    assert over == "" and fp["context_tokens"] == 64 and fp["total_bytes"] > 0
    assert fp["budget_bytes"] == MemoryPlan().budget_for(dev.memory_bytes)
    tight = MemoryPlan(context_tokens=64, budget_bytes=fp["total_bytes"] - 1)
    fp, over = footprint(eng.model, BenchPlan(objs, memory=tight), dev, prompt)
    assert over.startswith("measured ") and "> budget" in over


def _experiment(model: str, budget_bytes: int) -> dict:
    return {
        "name": "mem",
        "models": [model],
        "backends": ["numpy"],
        "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 8}],
        "validate": {"random_prompts": [6], "steps": 1},
        "bench": {"pairs": 2, "warmup": 0},
        "budget": {"trials": 4, "trial_timeout_s": 120},
        "sampler": {"name": "grid", "seed": 0},
        "memory": {"context_tokens": 128, "budget_bytes": budget_bytes},
        "space": {
            "numpy": {
                "matmul_decode": {"variants": ["cached_f32", "ondemand"]},
                "matmul_prefill": {"variants": ["cached_f32", "ondemand"]},
            }
        },
    }


def test_budget_rules_out_the_cached_decode_before_it_compiles(
    tiny, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:  # noqa: ANN001
    """A budget between the prefill-only float32 cache and the decode one (which adds the LM
    head): every config caching decode is infeasible with the estimate's figures, never sent to
    the worker, told to the sampler as a violated constraint; the others run and record their
    measured footprint."""
    path, shape = tiny
    base = TuningConfig.default("numpy").replace(**ONDEMAND)
    fits = estimate(base.replace(**{"matmul_prefill.variant": "cached_f32"}), shape, 128)
    big = estimate(base.replace(**{"matmul_decode.variant": "cached_f32"}), shape, 128)
    assert big.total_bytes > fits.total_bytes
    file = tmp_path / "x.toml"
    file.write_text(tomli_w.dumps(_experiment(str(path), fits.total_bytes)))
    storage = tmp_path / "s.journal"
    argv = ["run", str(file), "--local", "--storage", str(storage), "--no-promote", "--json"]
    assert agent_main(argv) == 0, capsys.readouterr().err
    st = parse_storage(str(storage)).open()
    (s,) = optuna.get_all_study_summaries(st)
    study = optuna.load_study(study_name=s.study_name, storage=st)
    seen = set()
    for t in study.trials:
        rec = TrialRecord.from_attrs(s.study_name, t.number, t.user_attrs)
        if rec.outcome is Outcome.DUPLICATE:
            continue
        seen.add(rec.config["matmul_decode.variant"])
        if rec.config["matmul_decode.variant"] == "cached_f32":
            assert rec.outcome is Outcome.INFEASIBLE, rec
            assert rec.reason.startswith("estimated ") and "> budget" in rec.reason
            assert rec.worker is None or not rec.phase_s  # never reached a worker
            assert t.state is optuna.trial.TrialState.PRUNED
            assert t.system_attrs.get(f"constraints:{CONSTRAINT}") == 1.0  # told as violated
        else:
            assert rec.outcome is Outcome.OK, rec
            assert rec.memory and rec.memory["total_bytes"] <= fits.total_bytes
            assert rec.memory["budget_bytes"] == fits.total_bytes
            assert rec.memory["context_tokens"] == 128
            row = TrialRow.of(raw_trial(t), "prefill_tok_s@8")  # the dashboard's trials table
            assert row.memory_bytes == rec.memory["total_bytes"]
    assert seen == {"cached_f32", "ondemand"}


def test_impossible_budget_refused_before_any_trial(
    tiny, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:  # noqa: ANN001
    path, shape = tiny
    calls: list[str] = []
    real = Evaluator.evaluate
    monkeypatch.setattr(
        Evaluator, "evaluate", lambda self, *a, **kw: calls.append(a[0]) or real(self, *a, **kw)
    )
    small = estimate(TuningConfig.default("numpy").replace(**ONDEMAND), shape, 128)
    file = tmp_path / "x.toml"
    file.write_text(tomli_w.dumps(_experiment(str(path), small.total_bytes - 1)))
    storage = tmp_path / "s.journal"
    argv = ["run", str(file), "--local", "--storage", str(storage), "--no-promote", "--json"]
    assert agent_main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    (line,) = [x for x in err if x.startswith("error:")]
    assert "smallest footprint is" in line and "matmul_decode.variant=ondemand" in line
    st = parse_storage(str(storage)).open()
    (s,) = optuna.get_all_study_summaries(st)
    trials = optuna.load_study(study_name=s.study_name, storage=st).trials
    assert all(t.state is not optuna.trial.TrialState.COMPLETE for t in trials)
    assert not [t for t in trials if "outcome" in t.user_attrs]
    assert calls == []  # refused before the worker measured anything (not even the A/A run)


def test_bench_json_reports_the_footprint(tiny, capsys: pytest.CaptureFixture) -> None:  # noqa: ANN001
    path, _ = tiny
    argv = ["bench", "--model", str(path), "--prompt-tokens", "8", "--gen-tokens", "2",
            "--repeats", "1", "--no-promoted", "--json"]  # fmt: skip
    assert engine_main(argv) == 0
    mem = json.loads(capsys.readouterr().out)["memory"]
    for key in ("weight_bytes", "kv_state_bytes", "scratch_bytes", "total_bytes", "driver"):
        assert key in mem
    assert mem["context_tokens"] == 10 and mem["total_bytes"] > 0
    assert mem["estimate"]["weight_bytes"] == mem["weight_bytes"]


def test_promoted_evidence_and_summary_carry_the_footprint() -> None:
    """[evidence.memory] in the promoted file (TOML: a figure the backend lacks is left out,
    never written as zero) and the summary's line for the best."""
    import tomllib

    from agent.promote import config_text
    from agent.report import memory_evidence
    from agent.summary import _memory_line

    measured = {"context_tokens": 4096, "weight_bytes": 5 << 30, "kv_state_bytes": 1 << 30,
                "scratch_bytes": 1 << 28, "total_bytes": (6 << 30) + (1 << 28),
                "driver_bytes": None, "driver": "numpy: no driver figure",
                "budget_bytes": 8 << 30, "estimate": {"total_bytes": 7 << 30}}  # fmt: skip
    ev = memory_evidence(measured)
    text = config_text(TuningConfig.default("numpy"), {"trial": 3, "memory": ev})
    got = tomllib.loads(text)["evidence"]["memory"]
    assert got["total_bytes"] == measured["total_bytes"] and got["budget_bytes"] == 8 << 30
    assert got["estimated_total_bytes"] == 7 << 30 and "driver_bytes" not in got
    line = _memory_line(ev)
    assert "6.250 GiB at 4096 tokens" in line and "budget 8.000 GiB" in line
    gone = memory_evidence({"context_tokens": 64, "total_bytes": None, "unavailable": "x: none"})
    assert "not reported (x: none)" in _memory_line(gone)
