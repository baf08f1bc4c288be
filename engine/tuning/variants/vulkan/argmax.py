"""Vulkan argmax (greedy sampling over the vocabulary)."""

from __future__ import annotations

from engine.tuning.registry import PUSHED, REGISTRY, Param, variant
from engine.tuning.variants.vulkan.common import B, _shared_fits, _wg, _wg_fits

# two_stage first, so it is the default: one workgroup per row leaves a big GPU idle over a
# 152k vocabulary; both give np.argmax's answer (first maximum, first NaN).
REGISTRY.declare(
    B,
    "argmax",
    [
        variant(
            "two_stage",
            params=(
                _wg(256),
                Param(
                    "slices",
                    (1, 8, 16, 32, 64, 128, 256, 512, 1024),
                    128,
                    "workgroups per row in pass 1, each over ceil(V / slices) elements",
                    PUSHED,
                ),
            ),
            constraints=(_wg_fits("argmax"), _shared_fits("argmax", 2)),
            source="vulkan/argmax.comp",
            numeric="order_only",
            doc="slices of a row reduce to (value, index) pairs, a second pass picks the first "
            "maximum among them",
        ),
        variant(
            "default",
            params=(_wg(256),),
            constraints=(_wg_fits("argmax"), _shared_fits("argmax", 2)),
            source="vulkan/argmax.comp",
            numeric="order_only",
            doc="first maximum per row, one workgroup per row",
        ),
    ],
    doc="greedy token: first maximum per row, on the device",
)
