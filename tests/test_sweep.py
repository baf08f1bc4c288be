"""engine.sweep, the local runner, on the NumPy backend: its samples come from the registry, and
a quick run validates, benches and writes the JSON document; bad input is one line and exit 2."""

from __future__ import annotations

import json

import pytest

from engine.sweep import main, one_step_sample, prefill_grid
from engine.tuning import REGISTRY, TuningConfig


@pytest.mark.parametrize("backend", ["numpy", "vulkan", "cuda"])
def test_samples_cover_every_variant_and_are_allowed(backend):
    sample = one_step_sample(backend)
    assert sample[0] == {}
    for op in REGISTRY.ops(backend):
        for v in op.variants[1:]:
            assert {f"{op.name}.variant": v.name} in sample, (op.name, v.name)
    for flat in sample + prefill_grid(backend):
        assert TuningConfig.default(backend).replace(**flat).problems() == []


def test_prefill_grid_tiles_only_the_variants_that_have_them():
    grid = prefill_grid("vulkan")
    tiled = [f for f in grid if f["matmul_prefill.variant"] == "tiled"]
    assert tiled and all("matmul_prefill.max_cols" not in f for f in tiled)
    kpar = {f["matmul_prefill.max_cols"] for f in grid if f["matmul_prefill.variant"] == "kpar"}
    assert kpar == {8, 16, 24, 32, 40, 48, 64}
    seed = [f for f in grid if "prefill.chunk_tokens" in f]
    assert all(f["prefill.chunk_tokens"] == f["matmul_prefill.max_cols"] for f in seed)
    cuda = prefill_grid("cuda")
    assert {f.get("matmul_batched.variant") for f in cuda} >= {"dmmv_kpar", "dmmv_serial"}


def test_quick_run_on_numpy(tmp_path, tiny_model_path, capsys):
    code = main(
        [
            "--backend", "numpy", "--model", str(tiny_model_path), "--out", str(tmp_path),
            "--quick", "--prompt-tokens", "9", "--gen-tokens", "3", "--repeats", "1", "--json",
        ]
    )  # fmt: skip
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc == json.loads((tmp_path / "numpy_sweep.json").read_text())
    (run,) = doc["runs"]
    assert run["outcome"] == "ok" and run["validate"]["passed"]
    assert run["bench"][0]["prompt_tokens"] == 9 and run["bench"][0]["prefill_tok_s"] > 0


def test_missing_model_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["--backend", "numpy", "--model", str(tmp_path / "nope.gguf"), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "nope.gguf" in err
    assert not out.exists()
