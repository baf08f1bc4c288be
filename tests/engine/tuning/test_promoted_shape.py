"""Promotions keyed by what they were tuned on (issue 28 item 4): the shape key of a model, the
nearest promoted file for a shape and a served context (and why), and the engine saying which
file it loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomli_w

from engine.errors import ConfigError
from engine.gguf_model import open_model
from engine.synth import preset_shape
from engine.tuning import TuningConfig
from engine.tuning.promoted import (
    DEFAULT_CONTEXT,
    Candidate,
    find_promoted,
    nearest,
    promoted_path,
    tuned_on,
)
from engine.tuning.shape import QUANT_MISMATCH, ModelShape, shape_of

TINY = preset_shape("qwen2", "tiny")
SMALL = preset_shape("qwen2", "small")


def write_promoted(
    root: Path, shape: ModelShape, ctx: int, cfg: TuningConfig, device_class: str = "cpu"
) -> Path:
    """A promoted file as agent/promote.py writes it: the config and [evidence.tuned_on]."""
    p = promoted_path(device_class, shape, ctx, root)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(
        cfg.to_toml() + "\n" + tomli_w.dumps({"evidence": {"tuned_on": tuned_on(shape, ctx)}})
    )
    return p


def chunk(n: int) -> TuningConfig:
    return TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": n})


def test_shape_key_is_stable_and_tells_presets_apart(tiny_model_factory) -> None:
    """The key of a written file is the preset's (one function derives both), the same every
    time; two presets, or one preset at two quant mixes, have different keys."""
    path = tiny_model_factory("qwen2", "q4_k_m")
    assert shape_of(open_model(path)) == TINY == preset_shape("qwen2", "tiny")
    assert TINY.key == "l2-c256-ff640-h4-kv2-d64-v512-q4_k_m"
    assert SMALL.key != TINY.key and preset_shape("qwen2", "tiny", "q8_0").key != TINY.key
    assert preset_shape("qwen2", "1.5b").key != preset_shape("qwen2", "7b").key
    hybrid = preset_shape("qwen35moe", "tiny")
    assert shape_of(open_model(tiny_model_factory("qwen35moe", "q4_k_m"))) == hybrid
    assert "-e8-eu2-" in hybrid.key and "-rl3-" in hybrid.key  # experts, delta-net layers
    assert "-e" not in preset_shape("qwen35", "tiny").key  # qwen35 has no experts
    assert ModelShape.from_dict(TINY.to_dict()) == TINY
    with pytest.raises(ConfigError, match="shape dimension layers = -1"):
        ModelShape.from_dict({**TINY.to_dict(), "dims": {"layers": -1}})


def test_distance_is_log2_per_dimension_plus_the_quant() -> None:
    assert TINY.distance(TINY) == 0.0
    assert TINY.distance(SMALL) == SMALL.distance(TINY) > 0
    # one dimension doubled (+1 smoothing keeps zeros finite): about 1
    wide = ModelShape(
        "qwen2", tuple((k, 2 * v + 1 if k == "hidden" else v) for k, v in TINY.dims), "q4_k_m"
    )
    assert wide.distance(TINY) == pytest.approx(1.0)
    assert preset_shape("qwen2", "tiny", "q8_0").distance(TINY) == QUANT_MISMATCH
    assert TINY.distance(preset_shape("llama", "tiny")) == float("inf")


def cands(*items: tuple[ModelShape, int]) -> list[Candidate]:
    return [Candidate(Path(f"{s.key}.ctx{c}.toml"), s, c) for s, c in items]


def test_nearest_exact_shape_then_context_at_or_above() -> None:
    found = cands((TINY, 512), (TINY, 4096), (TINY, 8192), (SMALL, 2048))
    pick, why = nearest(found, TINY, 2048)
    assert (pick.shape, pick.context_tokens) == (TINY, 4096)
    assert why == f"exact shape {TINY.key}; context 4096 >= serving 2048 (the smallest at or above)"
    pick, why = nearest(found, TINY, 512)
    assert pick.context_tokens == 512 and why.endswith("context 512 = serving 512")
    pick, why = nearest(found, TINY, 16384)  # none at or above: the largest below
    assert pick.context_tokens == 8192 and "none at or above: the largest below" in why


def test_nearest_shape_when_no_exact_one() -> None:
    big = preset_shape("qwen2", "1.5b")
    other_quant = preset_shape("qwen2", "small", "q8_0")
    found = cands((big, 4096), (SMALL, 256), (other_quant, 4096))
    pick, why = nearest(found, TINY, 4096)
    assert pick.shape == SMALL  # small is nearer than 1.5b; the same shape at q8_0 is not
    assert why.startswith(f"nearest shape {SMALL.key} at distance {TINY.distance(SMALL):.2f}")
    assert "no exact match among 3" in why and "none at or above" in why
    assert nearest([], TINY, 4096) is None


def test_find_promoted_reads_the_files_and_skips_what_it_cannot_use(tmp_path: Path) -> None:
    assert find_promoted("numpy", "cpu", TINY, 4096, tmp_path) is None
    write_promoted(tmp_path, SMALL, 4096, chunk(8))
    a = write_promoted(tmp_path, TINY, 1024, chunk(16))
    b = write_promoted(tmp_path, TINY, 8192, chunk(32))
    m = find_promoted("numpy", "cpu", TINY, 4096, tmp_path)
    assert m is not None and (m.path, m.config, m.context_tokens) == (b, chunk(32), 8192)
    assert m.shape_key == TINY.key and m.reason.startswith("exact shape")
    assert find_promoted("numpy", "cpu", TINY, 1000, tmp_path).path == a
    assert find_promoted("vulkan", "cpu", TINY, 4096, tmp_path) is None  # other backend
    # a file that does not say what it was tuned on, or no longer loads, is passed over
    b.write_text(chunk(32).to_toml())
    assert find_promoted("numpy", "cpu", TINY, 4096, tmp_path).path == a
    a.write_text(a.read_text().replace("chunk_tokens = 16", "chunk_tokens = 3"))
    m = find_promoted("numpy", "cpu", TINY, 4096, tmp_path)
    assert m.config == chunk(8) and m.reason.startswith("nearest shape")


def test_engine_says_which_promoted_file_it_loaded_and_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, tiny_model_path: Path
) -> None:
    from engine.cli import main
    from engine.runtime import load

    p = write_promoted(tmp_path, TINY, 2048, chunk(8))
    q = write_promoted(tmp_path, SMALL, 4096, chunk(16))
    monkeypatch.setenv("FLEETTUNE_CONFIGS", str(tmp_path))
    eng = load(tiny_model_path, "numpy", context_tokens=1024)
    assert eng.config_source == f"promoted:{p}" and eng.model.config.prefill_chunk == 8
    assert eng.source.reason == f"exact shape {TINY.key}; context 2048 >= serving 1024"
    assert load(tiny_model_path, "numpy", use_promoted=False).source.kind == "default"
    p.unlink()
    eng = load(tiny_model_path, "numpy")
    assert eng.source.path == str(q) and eng.source.reason.startswith("nearest shape")
    assert eng.source.context_tokens == DEFAULT_CONTEXT

    argv = ["bench", "--model", str(tiny_model_path), "--prompt-tokens", "4", "--gen-tokens", "2"]
    assert main([*argv, "--repeats", "1", "--warmup", "0", "--json", "--context", "64"]) == 0
    src = json.loads(capsys.readouterr().out)["config_source"]
    assert src["source"] == f"promoted:{q}" and src["kind"] == "promoted"
    assert src["shape_key"] == TINY.key and src["context_tokens"] == 64
    assert "context 4096 >= serving 64" in src["reason"]
    mine = tmp_path / "mine.toml"
    mine.write_text(chunk(32).to_toml())
    assert main([*argv, "--repeats", "1", "--warmup", "0", "--config", str(mine)]) == 0
    assert f"config: --config {mine} (--config)" in capsys.readouterr().out
    assert main([*argv, "--repeats", "1", "--no-promoted", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["config_source"]["kind"] == "default"
    model = ["--model", str(tiny_model_path), "--json"]
    assert main(["info", *model]) == 0
    assert json.loads(capsys.readouterr().out)["shape_key"] == TINY.key
    assert main(["run", *model, "--prompt", "Hi", "--max-tokens", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["config_source"]["path"] == str(q)
    assert main(["run", *model, "--prompt", "Hi", "--max-tokens", "2", "--context", "8192"]) == 0
    src = json.loads(capsys.readouterr().out)["config_source"]
    assert src["path"] == str(q) and "context 4096 < serving 8192" in src["reason"]


def test_context_flag_refuses_nonsense(capsys, tiny_model_path: Path) -> None:
    from engine.cli import main

    with pytest.raises(SystemExit) as e:
        main(["run", "--model", str(tiny_model_path), "--prompt", "x", "--context", "0"])
    assert e.value.code == 2 and "--context" in capsys.readouterr().err


def test_engine_default_context_is_the_experiments() -> None:
    from worker.records import MemoryPlan

    assert DEFAULT_CONTEXT == MemoryPlan().context_tokens


def test_objective_at_the_served_context() -> None:
    """``prompt_tokens = "served"``: decode measured at the [memory] context (the prompt fills
    it less the generated tokens), named by its length; the target may name it as @served."""
    from agent.experiment import ExperimentError, parse_experiment
    from worker.records import Objective

    served = {"metric": "decode_tok_s", "prompt_tokens": "served", "gen_tokens": 8}
    data = {
        "models": ["synthetic:tiny"],
        "backends": ["numpy"],
        "objectives": [{"metric": "decode_tok_s", "prompt_tokens": 16}, served],
        "memory": {"context_tokens": 96},
        "acceptance": {"target": "decode_tok_s@served"},
    }
    exp = parse_experiment(data)
    assert exp.objectives[1] == Objective("decode_tok_s", 88, 8)
    assert exp.acceptance.target == "decode_tok_s@88" and exp.bench.objectives == exp.objectives
    default = parse_experiment({**data, "memory": {}, "acceptance": {}})
    assert default.objectives[1].prompt_tokens == DEFAULT_CONTEXT - 8
    with pytest.raises(ExperimentError, match="context_tokens 8 leaves no prompt before 8"):
        parse_experiment({**data, "memory": {"context_tokens": 8}})
    with pytest.raises(
        ExperimentError, match=r'prompt_tokens = \'all\': a number of tokens or "served"'
    ):
        parse_experiment({**data, "objectives": [{**served, "prompt_tokens": "all"}]})
