"""The agent's side of the memory budget (docs/agent.md, ``[memory]``): a config whose estimated
footprint (engine.tuning.memory, from the registry's declarations and the GGUF's tensor list) is
over the device class's budget is infeasible before it takes a worker's turn, told to the sampler
as a violated constraint like any other; a budget that no config of the space can meet is
refused before the study's first trial, naming the smallest footprint.

The estimate needs the model's tensor list on the head: a GGUF path, a cached checkpoint or a
synthetic model a worker has written into this machine's cache. Where the head has none, the
worker makes the same check before compiling (worker.memory).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.space import SearchSpace
from agent.space_rules import ExperimentError
from engine.device_info import DeviceInfo
from engine.tuning import TuningConfig
from engine.tuning.memory import GiB, MemoryEstimate, ModelShape, estimate, gib
from worker.records import MemoryPlan

log = logging.getLogger("agent")


def local_shape(model_ref: str) -> ModelShape | None:
    """The model's shape when its GGUF is on this machine already (never downloads a checkpoint
    or writes a synthetic model: a worker does that)."""
    from worker.models import is_synthetic, model_label

    try:
        if is_synthetic(model_ref):
            from engine.checkpoints import cache_dir

            path = cache_dir() / f"{model_label(model_ref)}.gguf"  # as worker.models writes it
            return ModelShape.read(path) if path.is_file() else None
        if Path(model_ref).expanduser().is_file():
            return ModelShape.read(Path(model_ref).expanduser())
        from engine import checkpoints

        if checkpoints.is_cached(model_ref):
            return ModelShape.read(checkpoints.cached_path(model_ref))
    except Exception as e:  # noqa: BLE001 - the worker checks it then, or says what is wrong
        log.info("memory estimate of %s not made on the head: %s", model_ref, e)
    return None


class MemoryGate:
    """The budget of each (device class, model): estimates on the head, cached shapes."""

    def __init__(self, plan: MemoryPlan) -> None:
        self.plan = plan
        self._shapes: dict[str, ModelShape | None] = {}
        self.checked: set[tuple[str, str]] = set()  # (study, worker) whose space was checked

    def shape(self, model_ref: str) -> ModelShape | None:
        """Looked up again while absent: a worker on this machine may write it meanwhile."""
        if self._shapes.get(model_ref) is None:
            self._shapes[model_ref] = local_shape(model_ref)
        return self._shapes[model_ref]

    def budget(self, device: DeviceInfo | None) -> int | None:
        return self.plan.budget_for(device.memory_bytes if device else 0)

    def _context(self, shape: ModelShape) -> int:
        return min(self.plan.context_tokens, shape.spec.n_ctx_train)

    def over(self, config: TuningConfig, model_ref: str, device: DeviceInfo | None) -> str:
        """Why ``config`` is over the budget on ``device`` ("" when it fits or cannot be told)."""
        shape, limit = self.shape(model_ref), self.budget(device)
        if shape is None or limit is None:
            return ""
        return estimate(config, shape, self._context(shape)).over(limit)

    def smallest(
        self, space: SearchSpace, baseline: Mapping[str, Any], shape: ModelShape
    ) -> tuple[dict[str, Any], MemoryEstimate]:
        """The space's config of least estimated footprint: per op, the variant (knobs at their
        least values) that holds least, the rest at the baseline. Variants' costs add up per op
        (named copies, scratch), so choosing each op's least gives the least overall."""
        return self._extreme(space, baseline, shape, most=False)

    def largest(
        self, space: SearchSpace, baseline: Mapping[str, Any], shape: ModelShape
    ) -> tuple[dict[str, Any], MemoryEstimate]:
        """The space's config of most estimated footprint, as smallest (knobs at their greatest
        values): what the budget must hold for the whole space to be feasible."""
        return self._extreme(space, baseline, shape, most=True)

    def _extreme(
        self, space: SearchSpace, baseline: Mapping[str, Any], shape: ModelShape, most: bool
    ) -> tuple[dict[str, Any], MemoryEstimate]:
        backend = space.backend
        flat = dict(baseline)
        ctx = self._context(shape)
        pick = max if most else min
        for o in space.ops:
            best: tuple[int, dict[str, Any]] | None = None
            for v in o.variant_dim.choices:
                option = {o.variant_dim.key: v}
                for d in o.dims_of(str(v)):
                    nums = [c for c in d.choices if isinstance(c, int) and not isinstance(c, bool)]
                    option[d.key] = pick(nums) if len(nums) == len(d.choices) else d.choices[0]
                trial = {k: x for k, x in flat.items() if k.partition(".")[0] != o.op} | option
                total = estimate(TuningConfig.from_flat(backend, trial), shape, ctx).total_bytes
                if best is None or (total > best[0] if most else total < best[0]):
                    best = (total, option)
            if best is not None:
                flat = {k: x for k, x in flat.items() if k.partition(".")[0] != o.op} | best[1]
        return flat, estimate(TuningConfig.from_flat(backend, flat), shape, ctx)

    def refuse_impossible(
        self, study: str, space: SearchSpace, baseline: Mapping[str, Any], model_ref: str,
        device: DeviceInfo | None,
    ) -> None:  # fmt: skip
        """ExperimentError (exit 2) when no config of the space fits the budget."""
        shape, limit = self.shape(model_ref), self.budget(device)
        if shape is None or limit is None:
            return
        flat, est = self.smallest(space, baseline, shape)
        if est.total_bytes > limit:
            searched = {o.variant_dim.key for o in space.ops}
            held = ", ".join(f"{k}={v}" for k, v in sorted(flat.items()) if k in searched)
            raise ExperimentError(
                f"memory: no config of study {study} fits the budget of {gib(limit)} at "
                f"{est.context_tokens} tokens of context: the smallest footprint is "
                f"{gib(est.total_bytes)} (weights {gib(est.weight_bytes)}, KV/state "
                f"{gib(est.kv_state_bytes)}, scratch {gib(est.scratch_bytes)}"
                + (f"; {held}" if held else "")
                + "); raise [memory] budget_bytes or lower context_tokens"
            )


def check_shape(model_ref: str) -> ModelShape | None:
    """The shape `agent check` estimates from: a synthetic model's from its preset (nothing
    written), else the local GGUF's (local_shape; None when it is not on this machine)."""
    from worker.models import is_synthetic, synthetic_args

    if is_synthetic(model_ref):
        from engine.synth import preset_tensors

        preset, arch, mix = synthetic_args(model_ref)
        return preset_tensors(arch, preset, mix)
    return local_shape(model_ref)


def plan_text(plan: MemoryPlan) -> str:
    """The budget an experiment's [memory] implies, in words."""
    if plan.budget_bytes is not None:
        budget = f"budget {gib(plan.budget_bytes)} (budget_bytes)"
    elif plan.reserve_bytes:
        budget = f"budget: the device's memory less {gib(plan.reserve_bytes)} (reserve_bytes)"
    else:
        budget = f"budget: the device's memory less {plan.reserve_fraction:.0%} (reserve_fraction)"
    return f"memory: context {plan.context_tokens} tokens, {budget}"


def check_footprints(
    plan: MemoryPlan, backend: str, space: SearchSpace, models: tuple[str, ...]
) -> list[dict[str, Any]]:
    """Per model: the estimated footprint of the registry-default baseline and of the space's
    smallest and largest configs at the served context (no device: the budget is checked
    against these when a device class's memory is known)."""
    gate = MemoryGate(plan)
    baseline = TuningConfig.default(backend).flat()
    opened = {o.op for o in space.ops}

    def searched(flat: Mapping[str, Any]) -> dict[str, Any]:  # the rest is the baseline's
        return {k: v for k, v in flat.items() if k.partition(".")[0] in opened}

    out: list[dict[str, Any]] = []
    for model in models:
        shape = check_shape(model)
        if shape is None:
            out.append({"model": model, "backend": backend, "estimated": False})
            continue
        ctx = min(plan.context_tokens, shape.spec.n_ctx_train)  # as the gate serves it
        small, small_est = gate.smallest(space, baseline, shape)
        large, large_est = gate.largest(space, baseline, shape)
        fixed = plan.budget_bytes
        out.append(
            {
                "model": model,
                "backend": backend,
                "estimated": True,
                "context_tokens": ctx,
                "baseline": estimate(
                    TuningConfig.from_flat(backend, baseline), shape, ctx
                ).to_dict(),
                "smallest": small_est.to_dict() | {"config": searched(small)},
                "largest": large_est.to_dict() | {"config": searched(large)},
                "fits": _fits(fixed, small_est.total_bytes, large_est.total_bytes),
            }
        )
    return out


def _fits(budget: int | None, smallest: int, largest: int) -> str | None:
    """Of the space under a fixed budget: "all", "some" or "none" (None: a device's budget)."""
    if budget is None:
        return None
    return "all" if largest <= budget else "some" if smallest <= budget else "none"


def footprint_line(f: Mapping[str, Any]) -> str:
    """One check line for check_footprints' entry."""
    head = f"  memory {f['backend']} {f['model']}: "
    if not f["estimated"]:
        return head + "not estimated here (no local GGUF; the worker checks it before compiling)"
    base, lo, hi = (f[k]["total_bytes"] for k in ("baseline", "smallest", "largest"))
    unit, div = ("GiB", GiB) if max(base, hi) >= GiB else ("MiB", 2**20)  # one unit a line

    def size(n: int) -> str:
        return f"{n / div:.2f} {unit}"

    line = (
        f"{head}baseline {size(base)}, space {size(lo)} .. {size(hi)} at "
        f"{f['context_tokens']} tokens (KV/state {size(f['baseline']['kv_state_bytes'])})"
    )
    if f["fits"] == "some":
        line += "; configs over the budget are infeasible (told to the sampler, never run)"
    elif f["fits"] == "none":
        line += "; NO config fits the budget: the run refuses this study"
    return line
