"""Vulkan mixture-of-experts expert matmuls."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.tuning.registry import REGISTRY, Constraint, Param, spec, variant
from engine.tuning.variants.shared import moe_tile_pairs
from engine.tuning.variants.vulkan.common import QUANT_TYPES, B, _rows_per_wg, _wg, _wg_fits

if TYPE_CHECKING:
    from engine.device_info import DeviceInfo
    from engine.tuning.config import TuningConfig


def _moe_tpr_le_wg(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("moe_experts")
    return int(c.threads_per_row) <= int(c.wg_size)


_MOE_DMMV = (
    _wg(64, (32, 64, 128, 256)),
    _rows_per_wg(4),
    Param(
        "threads_per_row",
        (4, 8, 16, 32, 64),
        16,
        "threads splitting a row's K (partial sums meet in shared memory)",
        spec(2),
    ),
)
_MOE_CONSTRAINTS = (
    _wg_fits("moe_experts"),
    Constraint("threads_per_row <= wg_size", _moe_tpr_le_wg),
)

# grouped first, so it is the default: at decode (T == 1) it is dmmv (the same kernels and
# knobs); at prefill it decodes each chosen expert's rows once per tile of tile_pairs routed
# tokens instead of once per (token, slot) pair. Not yet timed on a GPU.
REGISTRY.declare(
    B,
    "moe_experts",
    [
        variant(
            "grouped",
            params=(
                *_MOE_DMMV,
                moe_tile_pairs(spec(3)),
            ),
            constraints=_MOE_CONSTRAINTS,
            quant_types=QUANT_TYPES,
            source="vulkan/moe_grouped.comp",
            numeric="order_only",
            doc="prefill (T > 1): a counting sort of the pairs by expert into tiles, then a "
            "grouped GEMM per (rows, tile) of the tile's expert; decode: the dmmv kernels",
        ),
        variant(
            "dmmv",
            params=_MOE_DMMV,
            constraints=_MOE_CONSTRAINTS,
            quant_types=QUANT_TYPES,
            source="vulkan/moe_matvec.comp",
            numeric="order_only",
            doc="a matrix-vector product per (token, chosen expert) reading only that expert's "
            "rows, then a weighted sum per token (the PASS_COMBINE pass)",
        ),
    ],
    doc="routed experts of a MoE FFN (gate, up, SwiGLU, down, combine)",
)
