"""Promoted configs and the drift-sentinel key: a config whose recorded key is this machine's is
trusted as it stands; under another key (new driver, new engine) it is re-validated, and one
that no longer passes is listed as failing (``python -m agent recheck`` exits 1). The worker does
the same for a promoted study baseline. NumPy, and Vulkan on lavapipe, with tiny synthetic
models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main
from agent.promote import config_text
from agent.recheck import recheck_file
from engine.tuning import TuningConfig
from engine.tuning.promoted import evidence_key, key_changes, read_evidence
from engine.verify.sentinel import cache_key
from tests import fault_backend
from tests.mutants import MUTANTS, planted

ENGINE = "0123456789abcdef0123456789abcdef01234567"


def _write(root: Path, backend, flat: dict, model: Path, **key_over: str) -> Path:  # noqa: ANN001
    """configs/<class>/qwen2/<shape key>.ctx4096.toml as agent/promote.py writes it, validated
    under the backend's key with ``key_over`` changed."""
    from engine.gguf_model import open_model
    from engine.tuning.promoted import promoted_path, tuned_on
    from engine.tuning.shape import shape_of

    dev = backend.device_info()
    key = {**cache_key(backend.name, dev.device_class, dev.driver, ENGINE, "qwen2"), **key_over}
    cfg = TuningConfig.default(backend.name).replace(**flat)
    shape = shape_of(open_model(model))
    path = promoted_path(dev.device_class, shape, 4096, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    evidence = {"model": str(model), "model_family": "qwen2", "sentinel_key": key}
    evidence["tuned_on"] = tuned_on(shape, 4096)
    path.write_text(config_text(cfg, evidence))
    return path


@pytest.fixture(scope="module")
def ragged(tiny_model_factory) -> Path:  # noqa: ANN001
    return tiny_model_factory("qwen2", "q4_k_m", preset="ragged")


def test_evidence_key_and_changes() -> None:
    new = cache_key("vulkan", "r9700", "25.1", ENGINE, "qwen2")
    assert evidence_key({"sentinel_key": new}) == new
    legacy = {"device_class": "r9700", "driver": "25.1", "engine_commit": ENGINE,
              "model_family": "qwen2"}  # fmt: skip
    assert evidence_key(legacy, "vulkan") == new  # promoted before the key was recorded
    assert evidence_key({}, "vulkan") is None
    assert key_changes(new, new) == []
    assert key_changes(new, {**new, "driver": "25.2"}) == ["driver '25.1' -> '25.2'"]
    assert key_changes(None, new) == ["the evidence records no sentinel key"]
    assert key_changes(new, {**new, "engine": "x"}) == [f"engine {ENGINE!r} -> 'x'"]
    dirty = {**new, "engine": ENGINE + "+dirty"}
    assert key_changes(dirty, dirty) and "not a committed build" in key_changes(dirty, dirty)[0]


def test_numpy_matching_key_is_trusted_changed_key_is_revalidated(tmp_path, ragged) -> None:
    from engine.backends.numpy_ref import NumpyBackend

    be = NumpyBackend()
    flat = {"prefill.chunk_tokens": 16}
    path = _write(tmp_path, be, flat, ragged)
    same = recheck_file(path, be, ENGINE)
    assert same is not None and same.passed and not same.revalidated and same.changes == []
    path = _write(tmp_path, be, flat, ragged, driver="an older driver")
    new = recheck_file(path, be, ENGINE)
    assert new is not None and new.revalidated and new.passed, new.reasons
    assert new.model == str(ragged) and new.changes == [
        f"driver 'an older driver' -> {be.device_info().driver!r}"
    ]  # noqa: E501
    # no model named: a synthetic model of the family
    path.write_text(path.read_text().replace(str(ragged), "gone.gguf"))
    r = recheck_file(path, be, "other-engine")
    assert r is not None and r.revalidated and r.passed and r.model.startswith("synthetic:")


def test_numpy_subclass_bug_fails_revalidation(tmp_path, ragged) -> None:
    m = next(m for m in MUTANTS if m.id == "numpy:DROP_LAST_COLUMN")
    be = m.plant()
    path = _write(tmp_path, be, m.candidate, ragged, engine="an older engine")
    r = recheck_file(path, be, ENGINE)
    assert r is not None and r.revalidated and not r.passed
    assert r.blame.startswith("matmul_prefill"), r.blame
    assert r.text().startswith("FAIL") and str(path) in r.text()
    # under its recorded key, the same (buggy) config is trusted without a run
    _write(tmp_path, be, m.candidate, ragged)
    assert recheck_file(path, be, ENGINE).passed  # type: ignore[union-attr]


def test_cli_lists_failing_config_and_exits_1(tmp_path, ragged, capsys) -> None:
    fault_backend.install()
    try:
        from engine import backends

        be = backends.create(fault_backend.NAME)
        _write(tmp_path, be, {"matmul_prefill.variant": "wrong"}, ragged, driver="old")
        argv = ["recheck", "--configs", str(tmp_path), "--backend", fault_backend.NAME]
        assert main([*argv, "--json"]) == 1
        doc = json.loads(capsys.readouterr().out)
        (r,) = doc["results"]
        assert doc["failed"] == 1 and r["revalidated"] and not r["passed"] and r["reasons"]
        assert main(argv) == 1
        assert "FAIL" in capsys.readouterr().out
        _write(tmp_path, be, {}, ragged, driver="old")  # a correct config passes again
        assert main(argv) == 0
    finally:
        fault_backend.uninstall()


def test_cli_bad_input_exits_2(tmp_path, capsys) -> None:
    assert main(["recheck", "--configs", str(tmp_path / "none")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["recheck", "--configs", str(tmp_path), "--backend", "nope"]) == 2
    assert "--backend nope: unknown" in capsys.readouterr().err


def test_vulkan_changed_key_revalidates_and_planted_bug_fails(tmp_path, ragged) -> None:
    from tests.engine.backends.vulkan.test_vulkan_helpers import make_backend

    m = next(m for m in MUTANTS if m.id == "vulkan:FP16_ACCUMULATE")
    be = make_backend()
    try:
        path = _write(tmp_path, be, m.candidate, ragged, engine="an older engine")
        ok = recheck_file(path, be, ENGINE)
        assert ok is not None and ok.revalidated and ok.passed, ok.reasons
    finally:
        be.close()
    with planted(m):
        be = make_backend()
        try:
            bad = recheck_file(path, be, ENGINE)
            assert bad is not None and bad.revalidated and not bad.passed
            assert bad.blame.startswith(m.blamed), bad.blame
        finally:
            be.close()


def test_worker_trusts_promoted_baseline_under_its_key_revalidates_under_another(
    tiny_model_path,  # noqa: ANN001
) -> None:
    from dataclasses import replace

    from worker.evaluator import Evaluator
    from worker.records import BenchPlan, Objective, Outcome, ValidatePlan

    fault_backend.install()
    try:
        ev = Evaluator(fault_backend.NAME, "test-0")
        ev._info = replace(ev.info(), engine_commit=ENGINE)  # a committed build
        ref = str(tiny_model_path)
        ev.load(ref)
        key = ev.sentinel_key(ref)
        vplan, bplan = (
            ValidatePlan(random_prompts=(1, 20), steps=2),
            BenchPlan((Objective("decode_tok_s", 4, 2),), pairs=1, warmup=0),
        )
        good = (
            TuningConfig.default(fault_backend.NAME).replace(**{"prefill.chunk_tokens": 8}).flat()
        )

        def run(flat: dict, recorded: dict | None):  # noqa: ANN202
            return ev.evaluate(
                ref, flat, flat, vplan, bplan, promoted={"path": "p", "key": recorded}
            )

        same = run(good, key)
        assert same.outcome is Outcome.OK and same.validate is None  # trusted: no validate run
        assert same.revalidation == {**same.revalidation, "revalidated": False, "changes": []}
        moved = run(good, {**key, "driver": "older"})
        assert moved.outcome is Outcome.OK and moved.validate and moved.validate.passed
        rv = moved.revalidation
        assert rv and rv["revalidated"] and rv["passed"] and rv["changes"][0].startswith("driver")
        bad = TuningConfig.default(fault_backend.NAME).replace(
            **{"matmul_prefill.variant": "wrong"}
        )
        failed = run(bad.flat(), {**key, "engine": "older"})
        assert failed.outcome is Outcome.INVALID and failed.revalidation["passed"] is False
        assert failed.reason.startswith("promoted baseline fails re-validation (engine")
    finally:
        fault_backend.uninstall()


def test_study_sends_the_promoted_key_and_falls_back_to_default(tmp_path, ragged) -> None:
    import optuna

    from agent.experiment import parse_experiment
    from agent.promote_best import promoted_arg
    from agent.records import TrialRecord
    from agent.study import BASELINE, StudyState
    from engine.backends.numpy_ref import NumpyBackend
    from tests.agent.test_agent_units import _exp

    be = NumpyBackend()
    path = _write(tmp_path, be, {"prefill.chunk_tokens": 16}, ragged)
    promoted = TuningConfig.from_toml(path).flat()
    exp = parse_experiment(_exp(space={"numpy": {"prefill": {"chunk_tokens": [8, 16, 32]}}}))
    st = StudyState(exp, "cpu", "numpy", "synthetic:tiny", "qwen2",
                    optuna.storages.InMemoryStorage(), promoted, f"promoted:{path}")  # fmt: skip
    trial, flat, role = st.ask()
    assert role == BASELINE and flat == promoted
    arg = promoted_arg(st, role)
    assert arg == {"path": str(path), "key": evidence_key(read_evidence(path))}
    assert promoted_arg(st, "candidate") is None
    # the worker said it fails re-validation: the default becomes the baseline, tried next
    st.finish(trial, TrialRecord(st.name, trial.number, role, "invalid", config=flat), None)
    st.flush()
    default = TuningConfig.default("numpy").flat()
    st.rebase(default, "default (promoted failed re-validation)")
    trial, flat, role = st.ask()
    assert role == BASELINE and flat == default and st.best.config == default
    assert promoted_arg(st, role) is None
    assert st.study.user_attrs["baseline"]["source"].startswith("default (promoted")
