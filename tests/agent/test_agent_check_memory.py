"""`agent check FILE` names the memory budget the experiment implies and, per model, the
estimated footprint of the baseline and of the space's smallest and largest configs (text and
--json); a synthetic model is estimated from its preset, nothing written (issue 30)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w

from agent.cli import main
from agent.experiment import load_experiment
from agent.memory import MemoryGate, check_shape
from agent.space import space_configs
from engine.synth import preset_tensors
from engine.tuning import TuningConfig
from engine.tuning.memory import ModelShape, estimate

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("arch", ["qwen2", "qwen35"])
def test_a_preset_s_tensors_are_the_written_file_s(tiny_model_factory, arch: str) -> None:
    written = ModelShape.read(tiny_model_factory(arch))
    planned = preset_tensors(arch, "tiny")
    assert set(planned.tensors) == set(written.tensors)
    cfg = TuningConfig.default("vulkan")
    assert estimate(cfg, planned, 512) == estimate(cfg, written, 512)


@pytest.mark.parametrize("backend", ["numpy", "vulkan"])
def test_smallest_and_largest_are_the_space_s_extremes(backend: str) -> None:
    exp = load_experiment(ROOT / "experiments" / "quickstart.toml")
    shape = check_shape("synthetic:tiny")
    assert shape is not None
    space, base = exp.search_space(backend), TuningConfig.default(backend).flat()
    every = [
        estimate(TuningConfig.from_flat(backend, c), shape, 4096).total_bytes
        for c in space_configs(space, base)
    ]
    gate = MemoryGate(exp.memory)
    assert gate.smallest(space, base, shape)[1].total_bytes == min(every)
    assert gate.largest(space, base, shape)[1].total_bytes == max(every) > min(every)


def _experiment(tmp_path: Path, models: list[str], memory: dict) -> Path:
    exp = tmp_path / "x.toml"
    doc = {
        "name": "mem",
        "models": models,
        "backends": ["numpy"],
        "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 8}],
        "space": {"numpy": {"prefill": {"chunk_tokens": [8, 128]}}},
        "memory": memory,
    }
    exp.write_text(tomli_w.dumps(doc))
    return exp


def test_check_prints_the_budget_and_each_model_s_footprints(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    models = [str(tiny_model_path), "synthetic:small", "qwen2.5-coder-0.5b-q4km"]
    exp = _experiment(tmp_path, models, {"context_tokens": 256, "budget_bytes": 9 * 2**20})
    cache = tmp_path / "cache"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FLEETTUNE_CACHE", str(cache))  # the checkpoint is not cached there
        assert main(["check", str(exp), "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert main(["check", str(exp)]) == 0
        out = capsys.readouterr().out
    assert not cache.exists() or not any(cache.rglob("*.gguf"))  # nothing synthesised
    mem = doc["memory"]
    assert mem["context_tokens"] == 256 and mem["budget_bytes"] == 9 * 2**20
    tiny, small, ckpt = mem["models"]
    assert tiny["estimated"] and small["estimated"] and not ckpt["estimated"]
    for m in (tiny, small):
        assert m["context_tokens"] == 256
        assert m["smallest"]["total_bytes"] < m["largest"]["total_bytes"]
        assert m["smallest"]["config"] == {"prefill.variant": "batched", "prefill.chunk_tokens": 8}
        assert m["largest"]["config"]["prefill.chunk_tokens"] == 128
    assert tiny["fits"] == "some" and small["fits"] == "none"  # 9 MiB: tiny's small chunks fit

    assert "memory: context 256 tokens, budget 9.00 MiB (budget_bytes)" in out
    lines = {ln.split(":")[0].strip(): ln for ln in out.splitlines() if "  memory numpy" in ln}
    mib = tiny["smallest"]["total_bytes"] / 2**20
    assert f"space {mib:.2f} MiB .. " in lines[f"memory numpy {tiny_model_path}"]
    assert "configs over the budget are infeasible" in lines[f"memory numpy {tiny_model_path}"]
    assert "NO config fits the budget" in lines["memory numpy synthetic"]
    assert "not estimated here" in lines["memory numpy qwen2.5-coder-0.5b-q4km"]


def test_check_names_a_reserve_when_no_budget_is_fixed(
    tiny_model_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    exp = _experiment(tmp_path, [str(tiny_model_path)], {"reserve_bytes": 2**30})
    assert main(["check", str(exp)]) == 0
    out = capsys.readouterr().out
    assert "budget: the device's memory less 1.00 GiB (reserve_bytes)" in out
    assert "infeasible" not in out and "NO config" not in out
