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
from engine.tuning.memory import MemoryEstimate, ModelShape, estimate, gib
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
        backend = space.backend
        flat = dict(baseline)
        ctx = self._context(shape)
        for o in space.ops:
            best: tuple[int, dict[str, Any]] | None = None
            for v in o.variant_dim.choices:
                option = {o.variant_dim.key: v}
                for d in o.dims_of(str(v)):
                    nums = [c for c in d.choices if isinstance(c, int) and not isinstance(c, bool)]
                    option[d.key] = min(nums) if len(nums) == len(d.choices) else d.choices[0]
                trial = {k: x for k, x in flat.items() if k.partition(".")[0] != o.op} | option
                total = estimate(TuningConfig.from_flat(backend, trial), shape, ctx).total_bytes
                if best is None or total < best[0]:
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
