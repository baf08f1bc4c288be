"""What the CUDA declarations share: the backend name, the weight types it keeps
on the GPU, constraint helpers and the GPU size of a loaded weight."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from engine.roofline import Tensor
from engine.tuning.memory import loaded_default
from engine.tuning.registry import REGISTRY, Constraint

if TYPE_CHECKING:
    from engine.device_info import DeviceInfo

B = "cuda"

# The block-quantized types the CUDA kernels decode: a subset of engine.quant_types.BLOCK_TYPES.
CUDA_BLOCK_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"})
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
ALL_TYPES = CUDA_BLOCK_TYPES | FLOAT_TYPES
"""Weight types the CUDA backend keeps on the GPU (load_weight raises for any other)."""


def _cc_at_least(cc: int) -> Constraint:
    return Constraint(
        f"needs compute capability >= {cc // 10}.{cc % 10}",
        lambda cfg, dev: dev is None or int(dev.extra.get("cc", 0)) >= cc,
    )


def _while_chosen(
    op: str, variant: str, doc: str, check: Callable[[Any, DeviceInfo | None], bool]
) -> Constraint:
    """A rule over ``variant``'s knobs (``check(op's knob view, device)``) that holds trivially
    while another variant of op is chosen."""
    return Constraint(
        doc, lambda cfg, dev: cfg.op(op).variant != variant or check(cfg.knobs(op), dev)
    )


def _knob_needs_cc(op: str, variant: str, knob: str, cc: int, why: str = "") -> Constraint:
    """<op>.<knob> != 0 under ``variant`` needs compute capability >= cc."""
    return _while_chosen(
        op,
        variant,
        f"{op}.{knob} != 0 needs compute capability >= {cc // 10}.{cc % 10}{why}",
        lambda k, dev: (
            int(getattr(k, knob)) == 0 or dev is None or int(dev.extra.get("cc", 0)) >= cc
        ),
    )


def _block_threads_fit(op: str, variant: str) -> Constraint:
    """A dmmv-style variant's block of rows_per_block rows x threads_per_row threads fits
    CUDA's 1024 threads (holds trivially while another variant of op is chosen)."""
    return _while_chosen(
        op,
        variant,
        "rows_per_block * threads_per_row <= 1024",
        lambda k, dev: int(k.rows_per_block) * int(k.threads_per_row) <= 1024,
    )


def _loaded_bytes(t: Tensor) -> int:
    """A Q6_K tensor's blocks are padded from 210 to 224 bytes on the GPU (backend.Q6K_PADDED)."""
    if t.qtype == "Q6_K" and len(t.shape) > 1:
        return t.nbytes // 210 * 224
    return loaded_default(t)


REGISTRY.loaded_bytes[B] = _loaded_bytes
