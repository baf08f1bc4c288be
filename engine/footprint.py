"""A run's device footprint, measured: what the backend holds (weights with the variants' copies,
the KV cache or state at a context, scratch) while one prompt's cache is alive, the driver's own
figure where the backend has one, and the memory model's estimate beside it
(engine.tuning.memory). ``engine bench --json``, ``validate --json`` and the worker's trial
record carry it.

A backend that cannot report memory says so (``total_bytes`` None and ``unavailable``): a
footprint is never zeros.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.tuning.memory import ModelShape, estimate, gib

if TYPE_CHECKING:
    from engine.model import Model

MEASURED = ("weight_bytes", "kv_state_bytes", "scratch_bytes", "total_bytes")


def measure(model: Model, context_tokens: int, prompt: list[int]) -> dict[str, Any]:
    """The footprint of the model's current config: free what it does not use
    (Backend.release_unused), prefill ``prompt`` into a cache of ``context_tokens`` positions
    (at most the model's context), run one decode step, and report while that cache lives:
    MemoryReport's fields, ``context_tokens``, ``driver_bytes`` / ``driver`` (the driver's
    figure and what it counts, or None and why not), ``estimate`` (the memory model's figures
    for the same config and context)."""
    b = model.backend
    cap = max(2, min(context_tokens, model.spec.n_ctx_train))
    out: dict[str, Any] = {"context_tokens": cap}
    try:
        out["estimate"] = estimate(model.config, ModelShape.of(model.gguf), cap).to_dict()
    except Exception as e:  # noqa: BLE001 - a test backend the registry does not know
        out["estimate"] = None
        out["estimate_unavailable"] = f"{type(e).__name__}: {e}"
    b.release_unused()  # what a paired bench's other side left behind is not this config's
    cache = model.new_cache(cap)
    try:
        head = prompt[: cap - 1] or [0]
        tok = b.ops.argmax(model.prefill(head, cache))
        model.forward(tok, 1, len(head), cache)  # one decode step: its variants' copies too
        b.synchronize()
        try:
            rep = b.memory_report()
        except NotImplementedError as e:
            rep, why = None, f"{b.name}: memory_report is not implemented ({e})"
        else:
            why = "" if rep.weight_bytes > 0 else f"{b.name}: tracks none of its weights"
        driver, source = b.driver_memory()
    finally:
        del cache
    if rep is None or why:
        out.update(dict.fromkeys(MEASURED), unavailable=why)
    else:
        out.update(rep.to_dict())
    out["driver_bytes"], out["driver"] = driver, source
    return out


def at_context(fp: dict[str, Any]) -> int | None:
    """The measured total (None when the backend could not report)."""
    total = fp.get("total_bytes")
    return int(total) if isinstance(total, int | float) else None


def lines(fp: dict[str, Any] | None) -> list[str]:
    """The footprint as text lines (bench and validate print them)."""
    if not fp:
        return []
    ctx = fp.get("context_tokens")
    if fp.get("total_bytes") is None:
        head = f"  memory at {ctx} tokens: not reported ({fp.get('unavailable', 'unknown')})"
    else:
        head = (
            f"  memory at {ctx} tokens: {gib(fp['total_bytes'])} (weights "
            f"{gib(fp['weight_bytes'])}, KV/state {gib(fp['kv_state_bytes'])}, scratch "
            f"{gib(fp['scratch_bytes'])})"
        )
    out = [head]
    est = fp.get("estimate")
    if est:
        out.append(
            f"    estimated {gib(est['total_bytes'])} (weights {gib(est['weight_bytes'])}, of "
            f"which variants' copies {gib(est['copy_bytes'])}; scratch {gib(est['scratch_bytes'])})"
        )
    drv = fp.get("driver_bytes")
    shown = f"driver: {gib(drv)} ({fp['driver']})" if drv is not None else fp["driver"]
    out.append("    " + shown)
    return out
