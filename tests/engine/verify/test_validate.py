"""validate passes honest configs and catches planted bugs: a batched path that drops the last
column (token) of each chunk, and a sampler that reads a stale argmax. The standing mutation
suite is tests/engine/verify/test_mutants.py."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.gguf_model import open_model
from engine.models import build_model
from engine.tuning import TuningConfig
from engine.verify.validate import Tolerances, compare_logits, validate

PROMPTS = [list(range(3, 3 + n)) for n in (1, 5, 37)]


class DropLastColumn(NumpyBackend):
    """Planted bug: batched matmul leaves the last column of every chunk unwritten."""

    def _matmul(self, x, w):
        out = super()._matmul(x, w)
        if x.shape[0] > 1:
            out[-1] = 0.0
        return out


class StaleArgmax(NumpyBackend):
    """Planted bug (the seed's): the batched prefill tail never runs argmax; the sampler reads
    whatever the argmax buffer held before."""

    stale = np.zeros(1, np.int32)

    def _argmax(self, logits):
        return self.stale if self._batched_tail else super()._argmax(logits)

    def _matmul(self, x, w):
        self._batched_tail = x.shape[0] > 1 or getattr(self, "_batched_tail", False)
        return super()._matmul(x, w)

    def _embedding(self, table, ids):
        self._batched_tail = False
        return super()._embedding(table, ids)


def _run(backend_cls, flat=None, steps=4, **kw):
    m = build_model(open_model(pytest.tiny_path), backend_cls())
    cand = TuningConfig.from_flat("numpy", flat or {"prefill.chunk_tokens": 8})
    return validate(m, cand, PROMPTS, steps=steps, **kw)


@pytest.fixture(autouse=True)
def _tiny(tiny_model_path):
    pytest.tiny_path = tiny_model_path


@pytest.mark.parametrize("chunk", [1, 4, 32, 128])
def test_honest_configs_pass(chunk):
    rep = _run(NumpyBackend, {"prefill.chunk_tokens": chunk})
    assert rep.passed, rep.to_dict()
    assert rep.max_abs_diff < 1e-4


def test_catches_dropped_last_column_and_blames_the_batched_matmul():
    rep = _run(DropLastColumn)
    assert not rep.passed
    bad = [p for p in rep.prompts if not p.passed]
    assert {p.prompt_tokens for p in bad} >= {5, 37}
    assert any("KLD" in r for p in bad for r in p.reasons)
    assert any("top-1 differs" in r for p in bad for r in p.reasons)
    assert rep.blame is not None and rep.blame.op == "matmul_prefill"
    assert rep.blame.layer == 0 and rep.blame.label == "attn_q"
    assert rep.blame.token == 4  # blame replays the shortest failing prompt (5): its last column
    assert "matmul_prefill (cached_f32, chunk_tokens 8) layer 0 attn_q: token" in str(rep.blame)


def test_catches_stale_argmax():
    rep = _run(StaleArgmax)
    assert not rep.passed
    # logits are right, so only the device argmax can tell
    assert all(p.max_abs_diff < 1e-4 for p in rep.prompts)
    assert any("device argmax" in r for p in rep.prompts for r in p.reasons)


def test_teacher_forcing_keeps_comparing_after_a_near_tie():
    """The candidate consumes the reference's tokens: its compared positions are the
    reference's, all of them, whatever its own greedy choice would have been."""
    rep = _run(NumpyBackend, {"prefill.chunk_tokens": 4}, steps=6)
    for p in rep.prompts:
        assert p.positions >= 6  # last prompt position + 5 decode steps (+ sampled ones)
        assert p.top1_agree == p.top1_checked
        assert p.kld_max < 1e-9


def test_kl_divergence_and_margin():
    from engine.verify.validate import kl_divergence, margin

    a = np.array([1.0, 2.0, 3.0])
    assert kl_divergence(a, a) == 0.0
    assert kl_divergence(a, a + 5.0) < 1e-15  # a shift is the same distribution
    assert kl_divergence(a, a[::-1].copy()) > 0.5
    assert kl_divergence(a, np.array([1.0, np.nan, 3.0])) == np.inf
    assert margin(np.array([0.0, 2.5, 2.0])) == 0.5


def test_edge_prompts_hit_chunk_edges():
    from engine.verify.validate import edge_lengths

    cfg = TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 16})
    assert edge_lengths(cfg) == [15, 16, 17, 33]
    vk = TuningConfig.from_flat(
        "vulkan", {"matmul_prefill.variant": "kpar", "matmul_prefill.max_cols": 24}
    )
    got = edge_lengths(vk)
    assert {23, 24, 25, 49} <= set(got) and max(got) <= 160


def test_compare_logits_counts_nan_inf():
    ref = np.zeros(5, np.float32)
    cand = np.array([0, np.nan, np.inf, 0, 0], np.float32)
    mad, idx, nmse, nan, inf = compare_logits(ref, cand)
    assert (nan, inf) == (1, 1) and mad == np.inf and idx == 1


def test_tolerances_are_applied():
    rep = _run(NumpyBackend, {"prefill.chunk_tokens": 4})
    assert rep.passed
    m = build_model(open_model(pytest.tiny_path), NumpyBackend())
    strict = validate(
        m,
        TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 4}),
        PROMPTS,
        steps=2,
        tol=Tolerances(max_abs_diff=-1.0),
    )
    assert not strict.passed and any("max_abs_diff" in r for r in strict.prompts[0].reasons)


def test_reference_cache_runs_the_reference_once_and_still_catches_bugs():
    """With a ref_cache the per-token reference runs once per (config, prompt, steps); later
    candidates, good and planted-bad, are judged against it exactly as without the cache."""
    m = build_model(open_model(pytest.tiny_path), DropLastColumn())
    calls = []
    real = m.forced_run
    m.forced_run = lambda p, n, path="batched", **k: calls.append(path) or real(p, n, path, **k)
    cache: dict = {}
    good = TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 1})  # no batched chunks
    bad = TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 8})
    first = validate(m, good, PROMPTS, steps=4, ref_cache=cache, edges=False)
    assert first.passed and calls.count("per_token") == len(PROMPTS)
    second = validate(m, bad, PROMPTS, steps=4, ref_cache=cache, edges=False, blame_failures=False)
    assert calls.count("per_token") == len(PROMPTS)  # no reference reruns
    fresh = _run(DropLastColumn, edges=False)
    assert not second.passed
    assert [p.max_abs_diff for p in second.prompts] == [p.max_abs_diff for p in fresh.prompts]
    assert m.config == bad  # left on the candidate
    validate(m, bad, PROMPTS, steps=6, ref_cache=cache, edges=False, blame_failures=False)
    assert calls.count("per_token") == 2 * len(PROMPTS)


def test_a_variant_without_a_numeric_class_is_refused():
    from engine.tuning.registry import Registry, Variant

    with pytest.raises(ValueError, match="numeric class"):
        Registry().register("numpy", "x", [Variant("numpy", "x", "v")])


def test_budget_is_the_loosest_class_of_the_chosen_variants():
    from engine.tuning.registry import REGISTRY
    from engine.verify.budgets import NUMERIC_BUDGETS

    budget, classes = REGISTRY.budget(TuningConfig.default("numpy"))
    assert classes == ["order_only"] and budget == NUMERIC_BUDGETS["order_only"]
    mmvq = TuningConfig.from_flat("cuda", {"matmul_decode.variant": "mmvq"})
    budget, classes = REGISTRY.budget(mmvq)
    assert "int8_activations" in classes
    assert budget.nmse == NUMERIC_BUDGETS["int8_activations"].nmse


def test_experiment_may_tighten_a_class_budget_but_not_loosen_it():
    from agent.experiment import ExperimentError, _validate
    from engine.verify.budgets import NUMERIC_BUDGETS

    plan = _validate({"budgets": {"int8_activations": {"nmse": 1e-4}}})
    assert plan.budget_table()["int8_activations"].nmse == 1e-4
    assert plan.budget_table()["fp16"] == NUMERIC_BUDGETS["fp16"]
    loose = NUMERIC_BUDGETS["order_only"].kld_max * 10
    with pytest.raises(ExperimentError, match=r"validate.budgets.order_only: budget kld_max"):
        _validate({"budgets": {"order_only": {"kld_max": loose}}})
    with pytest.raises(ExperimentError, match="no numeric class 'int4'"):
        _validate({"budgets": {"int4": {"nmse": 1e-9}}})
    with pytest.raises(ExperimentError, match="budget key 'typo'"):
        _validate({"budgets": {"fp16": {"typo": 1e-9}}})


def test_experiment_budget_reaches_validate(tiny_model_path):
    """A tightened budget is the one validate applies (an honest config fails a zero budget)."""
    from agent.experiment import _validate

    plan = _validate({"budgets": {"order_only": {"nmse": 0.0}}})
    m = build_model(open_model(tiny_model_path), NumpyBackend())
    cand = TuningConfig.from_flat("numpy", {"prefill.chunk_tokens": 4})
    rep = validate(m, cand, PROMPTS[1:2], steps=2, budgets=plan.budget_table(), edges=False)
    assert rep.tolerances["nmse"] == 0.0
    assert not rep.passed and any("NMSE" in r for r in rep.reasons)


def test_validate_reports_where_its_time_goes(tiny_model_path):
    """Each phase's wall seconds (a 35B-A3B trial on the H200 spent 145 of 148 s validating):
    in the report, its JSON and the trial record the agent keeps."""
    import json
    import time

    from worker.evaluator import validate_summary
    from worker.records import ValidateSummary

    m = build_model(open_model(tiny_model_path), NumpyBackend())
    t0 = time.perf_counter()
    rep = validate(m, TuningConfig.default("numpy"), [[3, 17, 99, 5]], steps=3)
    wall = time.perf_counter() - t0
    assert list(rep.seconds) == ["reference", "candidate", "probe", "replay", "ragged"]
    assert all(v >= 0 for v in rep.seconds.values())
    assert rep.seconds["reference"] > 0 and rep.seconds["replay"] > 0
    assert sum(rep.seconds.values()) <= wall + 1e-3
    assert json.loads(json.dumps(rep.to_dict()))["seconds"] == rep.seconds
    rec = ValidateSummary.from_dict(json.loads(json.dumps(validate_summary(rep).to_dict())))
    assert rec.seconds == rep.seconds
    assert ValidateSummary.from_dict({"passed": True}).seconds == {}  # an older record
