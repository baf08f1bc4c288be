"""Trials per GPU-hour (issue 28 item 3): kernels compiled ahead in a CPU process land in the
cache the worker's compile reads; reference logits persist across trials, evaluators and
restarts, keyed so that another model file or validate plan misses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.tuning import TuningConfig
from worker.evaluator import Evaluator
from worker.records import BenchPlan, Objective, Outcome, ValidatePlan
from worker.refcache import RefLogits

VPLAN = ValidatePlan(random_prompts=(3,), steps=2)
BPLAN = BenchPlan((Objective("decode_tok_s", 4, 2),), pairs=1, warmup=1)
BASE = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 4})
# Same chunk (same edge prompts, same reference runs), another matmul variant.
OTHER = BASE.replace(**{"matmul_decode.variant": "ondemand"})


def _run(ev: Evaluator, model: Path, cand: TuningConfig, vplan: ValidatePlan = VPLAN) -> RefLogits:
    res = ev.evaluate(str(model), cand.flat(), BASE.flat(), vplan, BPLAN)
    assert res.outcome is Outcome.OK, res.reason
    refs = ev._models[str(model)].references
    assert isinstance(refs, RefLogits)
    return refs


@pytest.fixture
def no_warmup(monkeypatch: pytest.MonkeyPatch) -> None:
    """A first bench without the worker's clock warm-up: these tests are about the cache."""
    import worker.evaluator

    monkeypatch.setattr(worker.evaluator, "FIRST_WARMUP_S", 0.0)


def _reference_keys(refs: RefLogits) -> list[tuple]:
    return [k for k in refs if isinstance(k, tuple) and k and k[0] != "replay"]


def test_reference_logits_hit_across_trials_and_evaluators(
    tiny_model_factory, tmp_path: Path, no_warmup: None
) -> None:
    model = tiny_model_factory("qwen2", "q4_k_m")
    ev = Evaluator("numpy", "t-0", ref_cache_dir=tmp_path)
    refs = _run(ev, model, BASE)
    computed = refs.writes
    assert computed >= 2 and refs.hits == 0  # every prompt's reference computed and stored
    assert len(list(tmp_path.glob("*.npz"))) == computed
    refs = _run(ev, model, OTHER)  # second trial: in memory, nothing recomputed
    assert refs.writes == computed and refs.misses == computed

    second = Evaluator("numpy", "t-1", ref_cache_dir=tmp_path)  # a restarted or second worker
    refs2 = _run(second, model, OTHER)
    assert refs2.hits == computed and refs2.writes == 0 and refs2.misses == 0
    keys = _reference_keys(refs2)
    assert len(keys) == computed
    for key in keys:  # what came back from disk is what was computed
        run, was = refs2[key], refs[key]
        assert run.tokens == was.tokens and sorted(run.logits) == sorted(was.logits)
        assert all((row == was.logits[pos]).all() for pos, row in run.logits.items())

    # Another validate plan (more steps): every key differs, none is on disk.
    fresh = RefLogits(refs2.identity, tmp_path)
    assert all(fresh.get((k[0], k[1], k[2] + 1)) is None for k in keys)
    assert fresh.misses == computed and fresh.hits == 0
    # Another model file: the same keys, another identity, none is on disk.
    reseeded = str(tiny_model_factory("qwen2", "q4_k_m", seed=1))
    third = Evaluator("numpy", "t-2", ref_cache_dir=tmp_path)
    third.load(reseeded)
    other = third._models[reseeded].references
    assert isinstance(other, RefLogits) and other.identity != refs2.identity
    assert all(other.get(k) is None for k in keys) and other.misses == computed


def test_a_damaged_entry_is_recomputed(tiny_model_path: Path, tmp_path: Path) -> None:
    ev = Evaluator("numpy", "t-0", ref_cache_dir=tmp_path)
    ev.load(str(tiny_model_path))
    refs = ev._models[str(tiny_model_path)].references
    assert isinstance(refs, RefLogits)
    from engine.verify.validate import reference_run

    model = ev._model(str(tiny_model_path))
    run = reference_run(model, TuningConfig.default("numpy"), [5, 6, 7], 2, refs)
    assert refs.writes == 1
    (entry,) = tmp_path.glob("*.npz")
    entry.write_bytes(b"not a zip")
    again = RefLogits(refs.identity, tmp_path)
    rerun = reference_run(model, TuningConfig.default("numpy"), [5, 6, 7], 2, again)
    assert again.hits == 0 and again.writes == 1 and rerun.tokens == run.tokens


def test_numpy_precompile_is_a_no_op() -> None:
    ev = Evaluator("numpy", "t-0")
    assert ev.precompile("synthetic:tiny", BASE) is False
    assert ev._ahead is not None and ev._ahead._pool is None  # no process started


def test_vulkan_precompile_in_a_subprocess_fills_the_cache(
    tiny_model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subprocess compiles a config's SPIR-V; this process then compiles nothing for it."""
    pytest.importorskip("vulkan")
    from engine.backends.vulkan import spirv
    from engine.precompile import vulkan_builds
    from worker.precompile import model_qtypes

    if spirv.glslc_version(spirv.compiler_for("rms_norm")[1]) is None:
        pytest.skip("glslc is not installed (./dev setup installs it; CI has it)")
    monkeypatch.setenv("FLEETTUNE_SPIRV_CACHE", str(tmp_path))
    qtypes = model_qtypes(str(tiny_model_path))
    default = TuningConfig.default("vulkan")
    # The default config's builds stand in as cached (placeholders: only compile_spirv reads
    # them here), so the subprocess compiles just what the new knobs change.
    for shader, defines in vulkan_builds(default, qtypes):
        sub = tmp_path / spirv.compiler_tag(spirv.glslc_version(spirv.compiler_for(shader)[1]))
        sub.mkdir(exist_ok=True)
        (sub / f"{shader}-{spirv.build_key(shader, defines)}.spv").write_bytes(b"\x03\x02#\x07")
    cand = default.replace(**{"matmul_prefill.variant": "serial", "matmul_prefill.max_cols": 16})
    new = [b for b in vulkan_builds(cand, qtypes) if not spirv.cached(*b)]
    assert new, "the candidate needs builds the default does not"
    code = (
        "import sys, json; from worker.precompile import precompile_task; "
        "print(json.dumps(precompile_task('vulkan', json.loads(sys.argv[1]), sys.argv[2])))"
    )
    import json

    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(cand.flat()), str(tiny_model_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    done = json.loads(out.stdout.strip().splitlines()[-1])
    assert done["errors"] == [] and done["builds"] - done["cached"] == len(new)
    before = spirv.COMPILES[0]
    for shader, defines in vulkan_builds(cand, qtypes):  # what set_config's pipelines ask
        spirv.compile_spirv(shader, defines)
    assert spirv.COMPILES[0] == before  # every one a cache hit


def test_clocks_warm_once_per_worker(
    tiny_model_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timed warm-up runs on a worker's first bench and after an idle spell, not per trial;
    the best's warm-up round only when the last bench did not run it."""
    import worker.evaluator as wev

    seen: list[tuple[float, bool]] = []
    real = wev.paired_bench

    def spy(model, cand, best, plan, on_pair=None, warm_s=0.0, warm_best=True):  # noqa: ANN001, ANN202
        seen.append((warm_s, warm_best))
        return real(model, cand, best, plan, on_pair, 0.0, warm_best)

    monkeypatch.setattr(wev, "paired_bench", spy)
    ev = Evaluator("numpy", "t-0")
    m = str(tiny_model_path)
    for best in (BASE, BASE, OTHER):
        res = ev.evaluate(m, OTHER.flat(), best.flat(), VPLAN, BPLAN, skip_validate=True)
        assert res.outcome is Outcome.OK, res.reason
    ev._bench_end -= wev.REWARM_AFTER_S + 1  # the device sat idle
    ev.evaluate(m, OTHER.flat(), OTHER.flat(), VPLAN, BPLAN, skip_validate=True)
    first = wev.FIRST_WARMUP_S
    assert seen == [(first, True), (0.0, False), (0.0, True), (first, True)]


def test_skipping_the_best_warm_up_keeps_the_candidate_and_the_alternation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import worker.evaluator as wev
    from tests.worker.stub_bench import stub_measured_model

    model, calls = stub_measured_model(monkeypatch)
    plan = BenchPlan((Objective("prefill_tok_s", 8),), pairs=3, warmup=1)
    wev.paired_bench(model, "cand", "best", plan, warm_best=False)
    assert calls == ["cand", "cand", "best", "best", "cand", "cand", "best"]


def test_trials_per_hour_counts_device_time_not_the_gaps_between_runs() -> None:
    from agent.dashboard.plots import throughput as figure
    from agent.throughput import IDLE_CAP_S, per_gpu, rates

    # w0: three 10 s trials 2 s apart, then a fourth after a day (a resumed study)
    spans = [("w0", 100.0, 110.0), ("w0", 112.0, 122.0), ("w0", 124.0, 134.0)]
    spans += [("w0", 86400.0, 86410.0)]
    spans += [("w1", 105.0, 125.0), ("w1", 0.0, 0.0)]  # w1: one 20 s trial, one never dispatched
    w0, w1 = rates(spans)
    assert (w0.trials, w0.busy_s, w0.device_s) == (4, 40.0, 44.0 + IDLE_CAP_S)
    assert w1.trials == 1 and w1.trials_per_hour == pytest.approx(180.0)
    assert per_gpu([w0, w1]) == pytest.approx(5 * 3600 / (w0.device_s + w1.device_s))
    fig = figure([{"worker_id": "w0", "throughput": w0.to_dict(), "throughput_all": {}}])
    assert fig is not None and fig["data"][0]["y"] == [round(w0.trials_per_hour, 1)]
    assert figure([{"worker_id": "w0"}]) is None  # no trial yet: no figure


def test_local_runner_compiles_the_queued_call_ahead_and_times_it_from_its_start() -> None:
    """--local keeps two calls per slot: the queued one's config goes to the worker's
    precompile while the first runs, and its clock (overhead, gap) starts when it runs."""
    from types import SimpleNamespace

    from agent.dispatch import Pending
    from agent.fleet import Slot
    from agent.local import LocalRunner
    from agent.phase import Phase
    from worker.records import EvalResult

    class Worker:  # a stand-in for worker.evaluator.Evaluator
        def __init__(self) -> None:
            self.log: list[tuple[str, Any]] = []

        def precompile(self, model: str, config: TuningConfig) -> bool:
            self.log.append(("precompile", config))
            return True

        def evaluate(self, model: str, cand: TuningConfig, *rest: Any, **kw: Any) -> EvalResult:
            self.log.append(("evaluate", cand))
            return EvalResult(Outcome.OK, None, cand.flat(), {}, started=1.0, finished=2.0)

    third = BASE.replace(**{"prefill.chunk_tokens": 16})
    configs = [BASE, OTHER, third]
    got: list[Pending] = []

    class Strategy:
        def dispatch_work(self, slot: Slot) -> bool:
            if not configs:
                return False
            p = Pending(Phase.TRIAL, slot, None, 0.0, 0.0, "m", study, SimpleNamespace(number=0))
            p.config = configs.pop(0)
            runner.send(p)
            return True

        def evaluate_args(self, p: Pending) -> tuple[tuple[Any, ...], dict[str, Any]]:
            return (p.study.model, p.config), {}

        def got_trial(self, p: Pending, res: EvalResult, overhead: float) -> None:
            got.append(p)

    study = SimpleNamespace(name="s", model="m")
    runner = LocalRunner(Strategy(), ("m",), 60.0, [])  # type: ignore[arg-type]
    slot = Slot("cpu-0", "cpu", ("numpy",), actor=Worker())
    slot.phase = Phase.AA
    runner.slots.append(slot)
    runner.dispatch_idle()
    assert [k for k, _ in slot.actor.log] == ["precompile"]  # the second call, queued
    assert slot.actor.log[0][1] is OTHER and len(runner.pending) == 2
    assert runner.pending[0].dispatched > 0 and runner.pending[1].dispatched == 0.0
    assert runner.wait()
    queued = runner.pending[0]
    runner.dispatch_idle()  # refills to two: the third is compiled ahead too
    assert [k for k, _ in slot.actor.log] == ["precompile", "evaluate", "precompile"]
    assert runner.wait() and queued.dispatched > 0  # its clock started when it ran
    assert runner.wait() and not runner.wait()
    assert [c for k, c in slot.actor.log if k == "evaluate"] == [BASE, OTHER, third]
    assert [p.config for p in got] == [BASE, OTHER, third]
