"""The worker's evaluation without Ray: compile -> validate -> paired benchmark on a tiny model,
the failure kinds it reports, and A/A runs (a no-op candidate) that are never accepted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.acceptance import decide
from agent.experiment import parse_experiment
from agent.stats import aa_noise
from engine.tuning import TuningConfig
from tests import fault_backend
from worker.evaluator import Evaluator
from worker.records import BenchPlan, Objective, Outcome, ValidatePlan

VPLAN = ValidatePlan(random_prompts=(1, 20), steps=2)
BPLAN = BenchPlan((Objective("prefill_tok_s", 24), Objective("decode_tok_s", 8, 4)), pairs=3)


@pytest.fixture(scope="module")
def faulty(tiny_model_path: Path) -> Iterator[tuple[Evaluator, str]]:
    """The evaluator as a worker runs it: one BLAS thread (a Ray worker's num_cpus=0, agent
    --local's threadpool limit), so a busy CI machine slows whole runs, not half a GEMM."""
    from threadpoolctl import threadpool_limits

    fault_backend.install()
    ev = Evaluator(fault_backend.NAME, "test-0")
    ref = str(tiny_model_path)
    shape = ev.load(ref)  # the model's shape class: keys its promotion
    assert shape.family == "qwen2" and shape.key.startswith("l2-c256-")
    with threadpool_limits(limits=1):
        yield ev, ref
    fault_backend.uninstall()


def _flat(**changes: object) -> dict:
    return TuningConfig.default(fault_backend.NAME).replace(**changes).flat()


def test_ok_candidate_has_paired_samples_and_diffs(faulty: tuple[Evaluator, str]) -> None:
    ev, ref = faulty
    res = ev.evaluate(ref, _flat(**{"prefill.chunk_tokens": 8}), _flat(), VPLAN, BPLAN)
    assert res.outcome is Outcome.OK, res.reason
    assert res.validate is not None and res.validate.passed
    assert res.validate.max_abs_diff < 1e-2
    s = res.sample("prefill_tok_s@24")
    assert len(s.candidate) == len(s.best) == 3 and min(s.candidate) > 0
    assert set(res.medians()) == {"prefill_tok_s@24", "decode_tok_s@8"}
    info = res.worker
    assert info is not None and info.device_class == "cpu-sim" and info.engine_commit
    assert set(res.phase_s) == {"compile_s", "validate_s", "bench_s", "memory_s"}
    assert res.memory is not None and res.memory["total_bytes"] > 0  # the measured footprint


@pytest.mark.parametrize(
    ("variant", "outcome", "reason"),
    [
        ("wrong", Outcome.INVALID, "max_abs_diff"),
        ("nocompile", Outcome.COMPILE_ERROR, "expected ';'"),
        ("raises", Outcome.CRASH, "injected failure"),
        # a config that exhausts device memory itself: its failure, and it says so (issue 30)
        ("device_oom", Outcome.CRASH, "out of memory: this config exhausted the device's memory"),
    ],
)
def test_failures_come_back_as_outcomes(
    faulty: tuple[Evaluator, str], variant: str, outcome: Outcome, reason: str
) -> None:
    ev, ref = faulty
    res = ev.evaluate(ref, _flat(**{"matmul_prefill.variant": variant}), _flat(), VPLAN, BPLAN)
    assert res.outcome is outcome and reason in res.reason
    assert not res.samples
    if outcome is Outcome.INVALID:
        assert res.validate is not None and not res.validate.passed
        assert res.validate.prompts[0].candidate_tokens


def test_aa_noop_candidate_is_never_accepted(faulty: tuple[Evaluator, str]) -> None:
    """The default config against itself, measured for real, repeatedly: never accepted by the
    agent's rule, which weighs each decision with the worker's A/A noise measured first (as
    agent.loop's got_aa does: on a loaded CPU, 24 ms trials drift by several percent between
    pairs, which the noise term is there to absorb)."""
    ev, ref = faulty
    acc = parse_experiment(
        {
            "models": ["m"],
            "backends": ["numpy"],
            "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 24}],
            "acceptance": {"min_gain": 0.02},
        }
    ).acceptance
    plan = BenchPlan((Objective("prefill_tok_s", 24),), pairs=5)
    aa = ev.evaluate(ref, _flat(), _flat(), VPLAN, plan, skip_validate=True)
    noise = {s.objective: aa_noise(s.candidate, s.best) for s in aa.samples}
    for _ in range(6):
        res = ev.evaluate(ref, _flat(), _flat(), VPLAN, plan, skip_validate=True)
        assert res.ok
        assert not decide(res, acc, noise).accepted


def test_first_bench_warms_up_for_a_minimum_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's first measurement of a model warms the device for ``warm_s`` seconds (a GPU
    from idle ramps its clocks over its first runs), not only ``plan.warmup`` rounds."""
    import worker.evaluator as ev
    from tests.worker.stub_bench import stub_measured_model

    model, calls = stub_measured_model(monkeypatch, seconds=0.02)
    plan = BenchPlan((Objective("prefill_tok_s", 8),), pairs=2, warmup=1)
    ev.paired_bench(model, "cand", "best", plan)
    assert len(calls) == 2 + 2 * 2  # one warm-up round of both sides, then the pairs
    calls.clear()
    ev.paired_bench(model, "cand", "best", plan, warm_s=0.3)
    warm = len(calls) - 4
    assert warm >= 2 * 7 and warm % 2 == 0  # >= 0.3 s of 0.02 s runs, both sides each round
