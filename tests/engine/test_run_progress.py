"""`engine run` is not silent while it works: a bar per phase on stderr (weights loaded / total,
compile, prefill, decode), the timings at the end, and the same timings in --json (issue 30)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engine.cli import main
from engine.gguf_model import open_model
from engine.runtime import load
from engine.tuning import TuningConfig


@pytest.mark.parametrize("arch", ["qwen2", "qwen35"])  # the dense and the hybrid loading loop
def test_load_reports_every_weight_byte(tiny_model_factory, arch: str) -> None:
    path = tiny_model_factory(arch)
    calls: list[tuple[int, int]] = []
    eng = load(path, "numpy", use_promoted=False, progress=lambda d, t: calls.append((d, t)))
    gguf = open_model(path)
    total = sum(gguf.tensor(n).nbytes for n in gguf.model_tensor_names())
    assert calls and calls[-1] == (total, total)
    done = [d for d, _ in calls]
    assert done == sorted(done) and len(calls) >= len(gguf.model_tensor_names())
    assert "load_weight" not in vars(eng.backend)  # the counting wrapper is gone after loading


def test_generate_reports_chunks_and_tokens(tiny_model_path: Path) -> None:
    cfg = TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 8})
    eng = load(tiny_model_path, "numpy", cfg)
    chunks: list[int] = []
    tokens: list[int] = []
    prompt = list(range(3, 23))  # 20 tokens: chunks of 8, 8, 4
    g = eng.model.generate(prompt, 4, on_chunk=chunks.append, on_token=tokens.append)
    assert chunks == [8, 8, 4] and tokens == g.tokens and len(tokens) == 4


def test_run_prints_its_timings_apart_from_the_text(capsys, tiny_model_path: Path) -> None:
    argv = ["run", "--model", str(tiny_model_path), "--prompt", "Hello", "--max-tokens", "4"]
    assert main(argv + ["--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert err == ""  # --json: no bars
    for key in ("load_s", "warmup_s", "prefill_s", "prefill_tok_s", "decode_s", "decode_tok_s"):
        assert doc[key] > 0, key
    assert doc["prefill_tok_s"] == pytest.approx(len(doc["prompt_tokens"]) / doc["prefill_s"])

    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == "Hello" + doc["text"] + "\n"  # stdout holds the text alone
    for phase in ("load", "compile (warm-up)", "prefill", "decode"):
        assert f"{phase}:" in err, phase
    last = err.strip().splitlines()[-1]
    n = len(doc["prompt_tokens"])
    assert re.fullmatch(
        rf".*load \d+\.\d s, compile \(warm-up\) \d+\.\d s, prefill {n} tok \d+\.\d tok/s, "
        r"decode 3 tok \d+\.\d tok/s",
        last,
    ), last
