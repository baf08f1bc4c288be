"""The model schedule on the NumPy backend: both prefill paths agree with each other and with an
independent full-sequence implementation, for each architecture; the real checkpoint says Paris."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.gguf_model import open_model
from engine.model import Model
from engine.models import build_model
from engine.tuning import TuningConfig
from tests.independent_forward import IndependentModel


def _model(path, **flat) -> Model:
    return build_model(open_model(path), NumpyBackend(TuningConfig.from_flat("numpy", flat)))


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
def test_matches_independent_implementation(tiny_model_factory, arch):
    path = tiny_model_factory(arch, "q4_k_m")
    m = _model(path, **{"prefill.chunk_tokens": 4})
    ind = IndependentModel(open_model(path))
    prompt = [3, 17, 99, 5, 42, 7, 250, 11, 64, 2, 8]  # 11 tokens: chunks of 4, 4, 3
    g = m.generate(prompt, 6, path="batched")
    ref_logits = ind.logits(prompt)[-1]
    assert np.max(np.abs(g.last_logits - ref_logits)) < 1e-3 * max(1.0, np.abs(ref_logits).max())
    assert g.tokens == ind.greedy(prompt, 6)


@pytest.mark.parametrize("chunk", [1, 2, 8, 32])
def test_batched_equals_per_token(tiny_model_path, chunk):
    m = _model(tiny_model_path, **{"prefill.chunk_tokens": chunk})
    prompt = list(range(5, 5 + 37))  # 37: a ragged last chunk for every chunk > 1
    a = m.generate(prompt, 5, path="per_token")
    b = m.generate(prompt, 5, path="batched")
    assert np.allclose(a.last_logits, b.last_logits, atol=1e-4)
    assert a.tokens == b.tokens


def test_ondemand_variant_equals_cached(tiny_model_path):
    prompt = [1, 2, 3, 4, 5]
    a = _model(tiny_model_path).generate(prompt, 3)
    b = _model(
        tiny_model_path,
        **{"matmul_prefill.variant": "ondemand", "matmul_decode.variant": "ondemand"},
    ).generate(prompt, 3)
    assert np.array_equal(a.last_logits, b.last_logits) and a.tokens == b.tokens


def test_generation_edges(tiny_model_path):
    m = _model(tiny_model_path)
    assert m.generate([7], 0).tokens == []
    one = m.generate([7], 1).tokens
    assert len(one) == 1 and m.generate([7], 4).tokens[0] == one[0]
    stop = m.generate([7], 4).tokens[1]
    assert m.generate([7], 4, stop={stop}).tokens[-1] == stop
    with pytest.raises(ValueError, match="empty prompt"):
        m.generate([], 2)


def test_real_qwen_says_paris(real_qwen_path):
    from engine.runtime import load

    eng = load(real_qwen_path, "numpy", use_promoted=False)
    tok = eng.tokenizer()
    ids = tok.encode("The capital of France is")
    assert ids == [785, 6722, 315, 9625, 374]
    g = eng.model.generate(ids, 8, path="batched")
    assert tok.decode(g.tokens).startswith(" Paris")
    # independent implementation: full-sequence float64 forward, greedy over 3 steps
    assert g.tokens[:3] == IndependentModel(eng.gguf).greedy(ids, 3)
    per_token = eng.model.generate(ids, 8, path="per_token")
    assert per_token.tokens == g.tokens
