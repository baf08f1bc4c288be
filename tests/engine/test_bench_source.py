"""``engine bench`` names its config's source (issue 30): the header read the same for the
promoted config and the defaults. Text and --json now say which, with the engine commit and the
time (``config_source`` is {"kind", "path"}, the key helper "shape" uses too)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.cli import main
from engine.provenance import config_source, engine_commit
from engine.tuning import TuningConfig

ARGS = ("--prompt-tokens", "7", "--gen-tokens", "2", "--repeats", "1", "--warmup", "0")


def _bench(capsys: pytest.CaptureFixture, model: Path, *extra: str) -> str:
    assert main(["bench", "--model", str(model), *ARGS, *extra]) == 0
    return capsys.readouterr().out


def test_bench_names_its_config_source_commit_and_time(
    capsys: pytest.CaptureFixture, tiny_model_path: Path, tmp_path: Path
) -> None:
    cfg = tmp_path / "mine.toml"
    cfg.write_text(TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 8}).to_toml())
    defaults = _bench(capsys, tiny_model_path, "--no-promoted")
    given = _bench(capsys, tiny_model_path, "--config", str(cfg))
    assert "config: the registry's defaults" in defaults
    assert f"config: --config {cfg}" in given
    commit = engine_commit()[:12]
    assert re.search(rf"engine {commit}.*, \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ", given)

    doc = json.loads(_bench(capsys, tiny_model_path, "--config", str(cfg), "--json"))
    assert doc["config_source"]["kind"] == "file" and doc["config_source"]["path"] == str(cfg)
    assert doc["engine_commit"] == engine_commit() and doc["time"].endswith("Z")
    doc = json.loads(_bench(capsys, tiny_model_path, "--no-promoted", "--json"))
    assert doc["config_source"]["kind"] == "default" and not doc["config_source"]["path"]


def test_a_promoted_source_is_named_by_its_file() -> None:
    assert config_source("promoted:/c/h200/qwen2.toml") == {
        "kind": "promoted",
        "path": "/c/h200/qwen2.toml",
    }
