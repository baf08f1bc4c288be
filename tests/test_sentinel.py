"""The drift sentinel: a backend's reference path against NumPy, cached per key; a worker whose
reference disagrees refuses to load (lavapipe; a planted rms_norm bug both validate paths share)."""

from __future__ import annotations

import pytest

from engine import sentinel
from engine.errors import ReferenceDriftError
from tests.mutants import MUTANTS, planted


@pytest.fixture()
def vk():
    from tests.test_vulkan_helpers import make_backend

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
