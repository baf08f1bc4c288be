"""The drift sentinel: a backend's reference path against NumPy, cached per key; a worker whose
reference disagrees refuses to load (lavapipe; a planted rms_norm bug both validate paths share)."""

from __future__ import annotations

import pytest

from engine.errors import ReferenceDriftError
from engine.verify import sentinel
from tests.mutants import MUTANTS, planted


@pytest.fixture()
def vk():
    from tests.engine.backends.vulkan.test_vulkan_helpers import make_backend

    be = make_backend()
    yield be
    be.close()


def test_sentinel_passes_and_caches_per_key(vk, tmp_path):
    first = sentinel.check(vk, "llama", "abc123", root=tmp_path)
    assert first.passed and not first.cached, first.reasons
    assert first.key["device_class"] == vk.device_info().device_class
    again = sentinel.check(vk, "llama", "abc123", root=tmp_path)
    assert again.cached and again.passed and again.kld == first.kld
    other = sentinel.check(vk, "llama", "def456", root=tmp_path)  # a new engine: judged anew
    assert not other.cached


def test_a_worker_whose_reference_disagrees_refuses_to_tune(tmp_path, monkeypatch, tiny_model_path):
    from worker.evaluator import Evaluator

    monkeypatch.setenv("FLEETTUNE_CACHE", str(tmp_path))
    bug = next(m for m in MUTANTS if m.id == "vulkan:RMS_WEIGHT_TWICE")
    with planted(bug):
        ev = Evaluator("vulkan")
        with pytest.raises(ReferenceDriftError, match="refuses to tune.*rms_norm"):
            ev.load(str(tiny_model_path))
        res = ev.sentinels["qwen2"]
    assert not res.passed and res.blame["op"] == "rms_norm"


def test_validate_cross_check_disagreement_fails_the_cli(tmp_path, tiny_model_path, capsys):
    from engine.cli import main

    bug = next(m for m in MUTANTS if m.id == "vulkan:RMS_WEIGHT_TWICE")
    with planted(bug):
        rc = main(
            ["validate", "--backend", "vulkan", "--model", str(tiny_model_path), "--steps", "2",
             "--cross-check"]
        )  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 1 and "DISAGREES" in out and "rms_norm" in out


def test_sentinel_judges_a_hybrid_family_under_the_recurrent_budget(vk, tmp_path):
    from engine.verify.budgets import REFERENCE_BUDGET, REFERENCE_BUDGET_RECURRENT

    # the 'ragged' hybrid preset exists (a worker loading a qwen35 failed on its absence)
    res = sentinel.check(vk, "qwen35", "abc123", root=tmp_path)
    assert res.passed, res.reasons
    assert (tmp_path / "qwen35-ragged-q4_k_m.gguf").exists()
    # the scan's float32 drift is above the dense bound and inside the recurrent one
    assert REFERENCE_BUDGET.kld_max < REFERENCE_BUDGET_RECURRENT.kld_max
    assert res.kld <= REFERENCE_BUDGET_RECURRENT.kld_max
    bug = next(m for m in MUTANTS if m.id == "vulkan:RMS_WEIGHT_TWICE")
    from tests.engine.backends.vulkan.test_vulkan_helpers import make_backend

    with planted(bug):  # a bug in a kernel both paths share is still far outside it
        be = make_backend()  # pipelines built while the bug is planted
        try:
            bad = sentinel.check(be, "qwen35", "abc123", root=tmp_path, refresh=True)
        finally:
            be.close()
    assert not bad.passed and bad.kld > 100 * REFERENCE_BUDGET_RECURRENT.kld_max
