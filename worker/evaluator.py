"""Evaluate one candidate config on one device: compile -> validate -> paired benchmark.

This is the worker's logic without Ray, so it can be tested and profiled in one process;
``worker.actor.TuningWorker`` wraps it as a Ray actor. Models are loaded once per worker and kept.

The paired benchmark alternates candidate and current best on the same device (AB, BA, AB, ...)
after a warm-up of each, so slow drift (clocks, temperature, a neighbour process) lands on both
sides of a pair and cancels in the per-pair ratio the agent's acceptance test works on.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.bench import bench_prompt, measure
from engine.errors import ConfigError, KernelCompileError, ReferenceDriftError
from engine.model import Generation, Model
from engine.runtime import Engine, load
from engine.tuning import TuningConfig
from engine.tuning.shape import ModelShape
from engine.verify.validate import tokenize_prompts, validate
from worker import gpustate, memory
from worker.device import engine_commit
from worker.failures import crash_reason
from worker.models import resolve_model
from worker.records import (
    BenchPlan,
    EvalResult,
    Outcome,
    PairedSamples,
    PromptDiff,
    ValidatePlan,
    ValidateSummary,
    WorkerInfo,
    same_named,
)
from worker.refcache import RefLogits, engine_code_digest, file_sha256

log = logging.getLogger(__name__)

# Seconds of warm-up before a worker's first measurement: a GPU fresh from idle ramps its clocks
# during the first runs (one such pair on an H200 measured x0.3). Paid once per worker, and again
# when its device sat idle for REWARM_AFTER_S (clocks fall back within seconds of idling).
FIRST_WARMUP_S = 2.0
REWARM_AFTER_S = 30.0


@dataclass
class _Loaded:
    engine: Engine
    family: str
    prompts: dict[ValidatePlan, list[list[int]]]
    references: dict[Any, Generation] = field(default_factory=dict)  # validate's ref_cache


class Evaluator:
    """Owns one backend instance (one device) and the models loaded on it."""

    def __init__(
        self,
        backend: str,
        worker_id: str = "local-0",
        node_id: str = "",
        commit_hint: str = "",
        sentinel: bool = True,
        device: int | None = None,
        ref_cache_dir: Path | None = None,
    ) -> None:
        self.backend = backend
        # Where reference logits persist (worker.refcache; the actor and agent --local pass the
        # node's cache_root()); None: in this process's memory only, as a test's evaluator.
        self.ref_cache_dir = ref_cache_dir
        self.device = device  # an index of the backend's list_devices(); None: its default
        self.sentinel = sentinel
        self.sentinels: dict[str, Any] = {}  # family -> engine.verify.sentinel.SentinelResult
        self.worker_id = worker_id
        self.node_id = node_id
        self._models: dict[str, _Loaded] = {}
        self._commit_hint = commit_hint
        self._info: WorkerInfo | None = None
        self._bench_end = -float("inf")  # monotonic end of this worker's last bench
        self._best_warm: dict[str, str] = {}  # model -> the best config its last bench ran
        self._ahead: Any = None  # worker.precompile.Ahead, started on the first precompile

    # --- identity -----------------------------------------------------------------------
    def info(self) -> WorkerInfo:
        """The worker and its device (loads nothing when a model is already loaded)."""
        if self._info is None:
            from engine import backends

            with backends.create(self.backend, device=self.device) as be:
                dev = be.device_info()
            commit = engine_commit()
            if commit == "unknown" and self._commit_hint:
                commit = self._commit_hint
            self._info = WorkerInfo(
                worker_id=self.worker_id,
                host=socket.gethostname(),
                node_id=self.node_id,
                pid=os.getpid(),
                backend=self.backend,
                device_name=dev.name,
                **same_named(dev, "device_class", "vendor", "driver", "memory_bytes"),
                engine_commit=commit,
                device=dev,
            )
        return self._info

    # --- compile ahead ------------------------------------------------------------------
    def precompile(self, model_ref: str, config: TuningConfig | Mapping[str, Any]) -> bool:
        """Start compiling a config the agent will send next, in a CPU process of this node
        (worker.precompile.Ahead: at most two in flight); returns at once. False when nothing
        was started (NumPy: nothing to compile; two compiles already in flight)."""
        from worker.precompile import Ahead

        if self._ahead is None:
            self._ahead = Ahead(self.backend, device=self.device)
        flat = config.flat() if isinstance(config, TuningConfig) else dict(config)
        loaded = self._models.get(model_ref)
        # the weight types set_config builds pipelines for on this backend (a Vulkan backend
        # keeps them; others compile per config, not per type)
        seen = getattr(loaded.engine.model.backend, "_qtypes", None) if loaded else None
        qtypes = tuple(sorted(seen)) if seen else None
        return bool(self._ahead.submit(flat, model_ref, qtypes))

    def close(self) -> None:
        """Stop the compile-ahead processes (the models go with the object)."""
        if self._ahead is not None:
            self._ahead.close()
            self._ahead = None

    # --- models -------------------------------------------------------------------------
    def load(self, model_ref: str) -> ModelShape:
        """Load a model once (the default config, no promoted one); returns its shape class
        (family, dimensions, quant mix: engine/tuning/shape.py), which keys its promotion. Raises
        ReferenceDriftError when this device's reference path fails the drift sentinel for the
        family: the worker refuses to tune, and the agent reports why."""
        if model_ref not in self._models:
            path = resolve_model(model_ref)
            eng = load(
                path,
                self.backend,
                TuningConfig.default(self.backend),
                use_promoted=False,
                device=self.device,
            )
            self._check_reference(eng.model, eng.gguf.spec.family)
            refs = self._reference_store(path, eng.model)
            self._models[model_ref] = _Loaded(eng, eng.gguf.spec.family, {}, refs)
        return self._models[model_ref].engine.shape

    def _reference_store(self, path: Path, model: Model) -> dict[Any, Any]:
        """validate's reference-run cache for this model, backed by the node's disk cache (a
        restarted worker, or a second one on the node, reads the reference logits back)."""
        if self.ref_cache_dir is None:
            return {}
        from engine.backends import kernel_sources

        dev = model.backend.device_info()
        identity = {
            "model_sha256": file_sha256(path),
            "backend": self.backend,
            "device_class": dev.device_class,
            "driver": dev.driver,
            "engine_code": engine_code_digest(),
            # an overlay of kernel sources (FLEETTUNE_KERNEL_SOURCES) changes the reference's
            # kernels too
            "kernel_sources": kernel_sources.digest(),
        }
        return RefLogits(identity, self.ref_cache_dir)

    def _check_reference(self, model: Model, family: str) -> None:
        if not self.sentinel or self.backend.startswith("numpy"):  # NumPy is the oracle itself
            return
        from engine.verify import sentinel

        res = sentinel.check(model.backend, family, self.info().engine_commit)
        self.sentinels[family] = res
        if not res.passed:
            raise ReferenceDriftError(f"worker refuses to tune: {res.why()}")

    def sentinel_key(self, model_ref: str) -> dict[str, str]:
        """This worker's drift-sentinel key for a loaded model's family."""
        from engine.verify.sentinel import cache_key

        info = self.info()
        family = self._models[model_ref].family
        return cache_key(self.backend, info.device_class, info.driver, info.engine_commit, family)

    def _promoted_check(self, model_ref: str, promoted: dict[str, Any]) -> dict[str, Any]:
        from engine.tuning.promoted import key_changes

        now = self.sentinel_key(model_ref)
        changes = key_changes(promoted.get("key"), now)
        if changes:
            log.info("re-validating promoted baseline %s: %s", promoted.get("path"), changes)
        return {
            "path": str(promoted.get("path", "")),
            "recorded_key": promoted.get("key"),
            "key": now,
            "changes": changes,
            "revalidated": bool(changes),
            "passed": None if changes else True,
        }

    def _model(self, model_ref: str) -> Model:
        self.load(model_ref)
        return self._models[model_ref].engine.model

    def _prompts(self, model_ref: str, plan: ValidatePlan) -> list[list[int]]:
        loaded = self._models[model_ref]
        if plan not in loaded.prompts:
            ids: list[list[int]] = []
            if plan.prompts:
                ids += tokenize_prompts(loaded.engine.tokenizer(), plan.prompts)
            vocab = loaded.engine.model.spec.n_vocab
            ids += [bench_prompt(n, vocab, seed=1) for n in plan.random_prompts]
            loaded.prompts[plan] = [p for p in ids if p]
        return loaded.prompts[plan]

    # --- evaluation ---------------------------------------------------------------------
    def evaluate(
        self,
        model_ref: str,
        candidate: TuningConfig | Mapping[str, Any],
        best: TuningConfig | Mapping[str, Any],
        vplan: ValidatePlan,
        bplan: BenchPlan,
        skip_validate: bool = False,
        promoted: dict[str, Any] | None = None,
    ) -> EvalResult:
        """Compile, validate and benchmark ``candidate`` paired with ``best``.

        A ``TuningConfig`` is taken as resolved and checked against this device by the caller
        (the agent does it once, when it asks for the trial); a flat config (a replay table, a
        recheck, a test) is resolved and checked here.

        ``promoted`` ({"path", "key"}) says the candidate is a promoted config used as a study's
        baseline, validated under the drift-sentinel ``key``: under this worker's key it is
        trusted as it stands (no validate); under another one it is re-validated first, and the
        result's ``revalidation`` says which and why.

        Never raises for a bad candidate: compile errors, invalid output and engine exceptions
        come back as the result's outcome with the reason.
        """
        t0 = time.time()
        phase: dict[str, float] = {}
        typed = isinstance(candidate, TuningConfig)
        cand_flat = candidate.flat() if isinstance(candidate, TuningConfig) else dict(candidate)
        best_flat = best.flat() if isinstance(best, TuningConfig) else dict(best)
        revalidation: dict[str, Any] | None = None

        def done(outcome: Outcome, reason: str = "", **kw: object) -> EvalResult:
            # The device's state right after the run (clocks, temperature): optional, cheap.
            dev = self.info().device
            gpu = (
                None
                if outcome is Outcome.INFEASIBLE or dev is None
                else gpustate.sample(dev.to_dict())
            )
            return EvalResult(
                outcome,
                self.info(),
                cand_flat,
                best_flat,
                reason,
                started=t0,
                finished=time.time(),
                phase_s=phase,
                gpu=gpu,
                revalidation=revalidation,
                **kw,  # type: ignore[arg-type]
            )

        try:
            model = self._model(model_ref)
            device = model.backend.device_info()
            if promoted is not None:
                revalidation = self._promoted_check(model_ref, promoted)
                skip_validate = not revalidation["revalidated"]
            try:
                cand_cfg = _resolved(self.backend, candidate)
                best_cfg = _resolved(self.backend, best)
            except ConfigError as e:
                return done(Outcome.INFEASIBLE, str(e))
            problems = [] if typed else cand_cfg.problems(device)
            if problems:
                return done(Outcome.INFEASIBLE, "; ".join(problems))
            over = memory.over_estimate(model, cand_cfg, bplan, device)
            if over:  # never compiled: the estimate alone rules it out
                return done(Outcome.INFEASIBLE, over)
            t = time.perf_counter()
            try:
                model.set_config(cand_cfg)
            except KernelCompileError as e:
                return done(Outcome.COMPILE_ERROR, str(e))
            phase["compile_s"] = time.perf_counter() - t
            summary = None
            if not skip_validate:
                summary, failed = self._validate(
                    model_ref, model, cand_cfg, vplan, revalidation, phase
                )
                if failed:
                    return done(Outcome.INVALID, failed, validate=summary)
            samples = self._bench(model_ref, model, cand_cfg, best_cfg, best_flat, bplan, phase)
            t = time.perf_counter()  # the footprint at the served context, then the budget
            longest = max(o.prompt_tokens for o in bplan.objectives)
            prompt = bench_prompt(longest, model.spec.n_vocab)
            fp, over = memory.footprint(model, bplan, device, prompt)
            phase["memory_s"] = time.perf_counter() - t
            if over:
                return done(Outcome.OVER_BUDGET, over, validate=summary, memory=fp)
            return done(Outcome.OK, validate=summary, samples=samples, memory=fp)
        except KernelCompileError as e:  # the best config's kernels, rebuilt while pairing
            return done(Outcome.COMPILE_ERROR, str(e))
        except Exception as e:  # noqa: BLE001 - the engine failing is a result, not a worker bug
            log.warning("candidate crashed: %s", e)
            tb = traceback.format_exc(limit=8)
            return done(Outcome.CRASH, crash_reason(e, tb))

    def _validate(
        self,
        model_ref: str,
        model: Model,
        cand_cfg: TuningConfig,
        vplan: ValidatePlan,
        revalidation: dict[str, Any] | None,
        phase: dict[str, float],
    ) -> tuple[ValidateSummary, str]:
        """Validate the compiled candidate against the reference: (its summary, why it failed or
        ""). A re-validated promoted baseline's ``revalidation`` records whether it passed."""
        t = time.perf_counter()
        prompts = self._prompts(model_ref, vplan)
        refs = self._models[model_ref].references
        report = validate(
            model,
            cand_cfg,
            prompts,
            vplan.steps,
            ref_cache=refs,
            budgets=vplan.budget_table(),
        )
        phase["validate_s"] = time.perf_counter() - t
        summary = validate_summary(report)
        if revalidation is not None:
            revalidation["passed"] = report.passed
        if report.passed:
            return summary, ""
        reasons = report.reasons
        if report.blame is not None:
            reasons = [f"first divergence: {report.blame}", *reasons]
        if revalidation is not None:
            why = "; ".join(revalidation["changes"])
            reasons = [f"promoted baseline fails re-validation ({why})", *reasons]
        return summary, "; ".join(reasons)

    def _bench(
        self,
        model_ref: str,
        model: Model,
        cand_cfg: TuningConfig,
        best_cfg: TuningConfig,
        best_flat: dict[str, Any],
        bplan: BenchPlan,
        phase: dict[str, float],
    ) -> tuple[PairedSamples, ...]:
        """The paired benchmark of candidate and best. Clocks warm once per worker (again after
        an idle spell), not once per trial; the best config's own warm-up runs are skipped when
        the last bench ran it here."""
        t = time.perf_counter()
        cold = time.monotonic() - self._bench_end > REWARM_AFTER_S
        best_key = repr(sorted(best_flat.items()))
        warm_best = cold or self._best_warm.get(model_ref) != best_key
        samples = paired_bench(
            model,
            cand_cfg,
            best_cfg,
            bplan,
            warm_s=FIRST_WARMUP_S if cold else 0.0,
            warm_best=warm_best,
        )
        self._bench_end = time.monotonic()
        self._best_warm[model_ref] = best_key
        phase["bench_s"] = time.perf_counter() - t
        return samples


def _resolved(backend: str, config: TuningConfig | Mapping[str, Any]) -> TuningConfig:
    if isinstance(config, TuningConfig):
        if config.backend != backend:  # a caller bug: the agent resolves for its slot's backend
            raise ConfigError(f"a {config.backend} config sent to a {backend} worker")
        return config
    return TuningConfig.from_flat(backend, config)


def validate_summary(report: object) -> ValidateSummary:
    """The part of a ValidateReport the agent records: worst and per-prompt diffs."""
    from engine.verify.validate import ValidateReport

    assert isinstance(report, ValidateReport)
    return ValidateSummary(
        **same_named(report, "passed", "max_abs_diff", "nmse", "steps"),
        kld=report.kld_max,
        tolerances=dict(report.tolerances),
        numeric_classes=tuple(report.numeric_classes),
        blame=report.blame.to_dict() if report.blame else None,
        reasons=tuple(report.reasons),
        replay=report.replay.to_dict() if report.replay else None,
        seconds=dict(report.seconds),
        # engine's PromptResult has PromptDiff's field names; from_dict makes the tuples
        prompts=tuple(
            PromptDiff.from_dict(same_named(p, *(f.name for f in fields(PromptDiff))))
            for p in report.prompts
        ),
    )


def _run_objectives(
    model: Model, plan: BenchPlan, prompts: dict[int, list[int]]
) -> dict[str, float]:
    """One measurement of every objective: one generate per distinct prompt length."""
    out: dict[str, float] = {}
    for n, prompt in prompts.items():
        objs = [o for o in plan.objectives if o.prompt_tokens == n]
        gen = max([o.gen_tokens for o in objs if o.metric == "decode_tok_s"], default=1)
        m = measure(model, prompt, gen)
        for o in objs:
            out[o.name] = m[o.metric]
    return out


def paired_bench(
    model: Model,
    candidate: TuningConfig,
    best: TuningConfig,
    plan: BenchPlan,
    on_pair: Callable[[int], None] | None = None,
    warm_s: float = 0.0,
    warm_best: bool = True,
) -> tuple[PairedSamples, ...]:
    """``plan.pairs`` alternating candidate/best measurements after warm-up (``plan.warmup``
    rounds, and more of both sides until ``warm_s`` seconds have passed); leaves the model on
    the candidate config. The candidate always runs its warm-up rounds (its first runs pay
    one-off costs: pipelines, graph captures, allocations); the best only with ``warm_best``
    (False: the worker's previous bench ran it, on a device still warm)."""
    vocab = model.spec.n_vocab
    lengths = sorted({o.prompt_tokens for o in plan.objectives})
    prompts = {n: bench_prompt(n, vocab) for n in lengths}
    sides = {"candidate": candidate, "best": best}
    t0, rounds = time.perf_counter(), 0
    while rounds < plan.warmup or time.perf_counter() - t0 < warm_s:
        timed = rounds >= plan.warmup  # past the plan's rounds: warming the clocks
        for side, cfg in sides.items():
            if side == "best" and not (warm_best or timed):
                continue
            model.set_config(cfg)
            _run_objectives(model, plan, prompts)
        rounds += 1
    runs: dict[str, list[dict[str, float]]] = {"candidate": [], "best": []}
    for i in range(plan.pairs):
        order = ("candidate", "best") if i % 2 == 0 else ("best", "candidate")
        for side in order:
            model.set_config(sides[side])
            runs[side].append(_run_objectives(model, plan, prompts))
        if on_pair:
            on_pair(i)
    model.set_config(candidate)
    return tuple(
        PairedSamples(
            o.name,
            tuple(r[o.name] for r in runs["candidate"]),
            tuple(r[o.name] for r in runs["best"]),
        )
        for o in plan.objectives
    )
