"""validate passes honest configs and catches planted bugs: a batched path that drops the last
column (token) of each chunk, and a sampler that reads a stale argmax."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.gguf_model import open_model
from engine.model import Model
from engine.tuning import TuningConfig
from engine.validate import Tolerances, compare_logits, validate

PROMPTS = [list(range(3, 3 + n)) for n in (1, 5, 37)]


class DropLastColumn(NumpyBackend):
    """Planted bug: batched matmul leaves the last column of every chunk unwritten."""

    def matmul(self, x, w):
        out = super().matmul(x, w)
        if x.shape[0] > 1:
            out[-1] = 0.0
        return out


class StaleArgmax(NumpyBackend):
    """Planted bug (the seed's): the batched prefill tail never runs argmax; the sampler reads
    whatever the argmax buffer held before."""

    stale = np.zeros(1, np.int32)

    def argmax(self, logits):
        return self.stale if self._batched_tail else super().argmax(logits)

    def matmul(self, x, w):
        self._batched_tail = x.shape[0] > 1 or getattr(self, "_batched_tail", False)
        return super().matmul(x, w)

    def embedding(self, table, ids):
        self._batched_tail = False
        return super().embedding(table, ids)


def _run(backend_cls, flat=None, steps=4):
    m = Model(open_model(pytest.tiny_path), backend_cls())
    cand = TuningConfig.from_flat("numpy", flat or {"prefill.chunk_tokens": 8})
    return validate(m, cand, PROMPTS, steps=steps)


@pytest.fixture(autouse=True)
def _tiny(tiny_model_path):
    pytest.tiny_path = tiny_model_path


@pytest.mark.parametrize("chunk", [1, 4, 32, 128])
def test_honest_configs_pass(chunk):
    rep = _run(NumpyBackend, {"prefill.chunk_tokens": chunk})
    assert rep.passed, rep.to_dict()
    assert rep.max_abs_diff < 1e-4


def test_catches_dropped_last_column():
    rep = _run(DropLastColumn)
    assert not rep.passed
    bad = [p for p in rep.prompts if not p.passed]
    assert {p.prompt_tokens for p in bad} >= {5, 37}
    assert any("max_abs_diff" in r for p in bad for r in p.reasons)


def test_catches_stale_argmax():
    rep = _run(StaleArgmax)
    assert not rep.passed
    # logits are right, so only the greedy tokens can tell
    assert all(p.max_abs_diff < 1e-4 for p in rep.prompts)
    assert any("greedy tokens agree" in r for p in rep.prompts for r in p.reasons)


def test_compare_logits_counts_nan_inf():
    ref = np.zeros(5, np.float32)
    cand = np.array([0, np.nan, np.inf, 0, 0], np.float32)
    mad, idx, nmse, nan, inf = compare_logits(ref, cand)
    assert (nan, inf) == (1, 1) and mad == np.inf and idx == 1


def test_tolerances_are_applied():
    rep = _run(NumpyBackend, {"prefill.chunk_tokens": 4})
    assert rep.passed
    m = Model(open_model(pytest.tiny_path), NumpyBackend())
    strict = validate(
        m,
        TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 4}),
        PROMPTS,
        steps=2,
        tol=Tolerances(max_abs_diff=-1.0),
    )
    assert not strict.passed and "max_abs_diff" in strict.prompts[0].reasons[0]


def test_reference_cache_runs_the_reference_once_and_still_catches_bugs():
    """With a ref_cache the per-token reference runs once per (config, prompt, steps); later
    candidates, good and planted-bad, are judged against it exactly as without the cache."""
    m = Model(open_model(pytest.tiny_path), DropLastColumn())
    calls = []
    real = m.generate
    m.generate = lambda p, n, path="batched", **k: calls.append(path) or real(p, n, path, **k)
    cache: dict = {}
    good = TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 1})  # no batched chunks
    bad = TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 8})
    first = validate(m, good, PROMPTS, steps=4, ref_cache=cache)
    assert first.passed and calls.count("per_token") == len(PROMPTS)
    second = validate(m, bad, PROMPTS, steps=4, ref_cache=cache)
    assert calls.count("per_token") == len(PROMPTS)  # no reference reruns
    fresh = _run(DropLastColumn)
    assert not second.passed
    assert [p.max_abs_diff for p in second.prompts] == [p.max_abs_diff for p in fresh.prompts]
    assert m.config == bad  # left on the candidate
    validate(m, bad, PROMPTS, steps=6, ref_cache=cache)  # other steps: a new reference
    assert calls.count("per_token") == 2 * len(PROMPTS)
