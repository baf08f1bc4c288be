"""The worker's side of the memory budget (an experiment's ``[memory]``, worker.records.MemoryPlan):
a config estimated over the budget is refused before it compiles, and after its bench the
footprint is measured at the served context (engine.footprint) and judged against the budget."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.footprint import at_context, measure
from engine.tuning.memory import ModelShape, estimate, gib

if TYPE_CHECKING:
    from engine.device_info import DeviceInfo
    from engine.model import Model
    from engine.tuning import TuningConfig
    from worker.records import BenchPlan


def budget(plan: BenchPlan, device: DeviceInfo) -> int | None:
    return plan.memory.budget_for(device.memory_bytes) if plan.memory is not None else None


def context(plan: BenchPlan) -> int:
    """The context the footprint is taken at: the experiment's, else the bench's longest run."""
    if plan.memory is not None:
        return plan.memory.context_tokens
    return max((o.prompt_tokens + o.gen_tokens for o in plan.objectives), default=1)


def over_estimate(model: Model, config: TuningConfig, plan: BenchPlan, device: DeviceInfo) -> str:
    """Why ``config`` cannot fit the budget (its estimate's figures), or "" (no budget, or it
    fits)."""
    limit = budget(plan, device)
    if limit is None:
        return ""
    ctx = min(context(plan), model.spec.n_ctx_train)
    return estimate(config, ModelShape.of(model.gguf), ctx).over(limit)


def footprint(
    model: Model, plan: BenchPlan, device: DeviceInfo, prompt: list[int]
) -> tuple[dict[str, Any], str]:
    """The candidate's measured footprint (EvalResult.memory, with ``budget_bytes``), and why it
    is over the budget ("" when it fits, no budget is set, or the backend cannot report)."""
    fp = measure(model, context(plan), prompt)
    limit = budget(plan, device)
    fp["budget_bytes"] = limit
    total = at_context(fp)
    if limit is None or total is None or total <= limit:
        return fp, ""
    return fp, (
        f"measured {gib(total)} > budget {gib(limit)} at {fp['context_tokens']} tokens of "
        f"context (weights {gib(fp['weight_bytes'])}, KV/state {gib(fp['kv_state_bytes'])}, "
        f"scratch {gib(fp['scratch_bytes'])})"
    )
