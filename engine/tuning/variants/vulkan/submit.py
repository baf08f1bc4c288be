"""Vulkan command recording: how dispatches become command buffers."""

from __future__ import annotations

from engine.tuning.registry import HOST, REGISTRY, Param, variant
from engine.tuning.variants.vulkan.common import B

REGISTRY.declare(
    B,
    "submit",
    [
        variant(
            "default",
            params=(
                Param(
                    "max_nodes",
                    (64, 256, 1024, 4096),
                    1024,
                    "dispatches recorded into one command buffer before it is submitted "
                    "(command-buffer depth; a download submits earlier)",
                    HOST,
                ),
                Param(
                    "replay",
                    (True, False),
                    True,
                    "reuse the command buffer of an identical recorded graph (decode step)",
                    HOST,
                ),
                Param(
                    "prefill_kick",
                    (0, 16, 32, 64, 128, 256),
                    0,
                    "after a prefill matmul (T > 1), submit what is recorded without waiting "
                    "once it is at least this many dispatches and the device has finished the "
                    "previous submission: the GPU starts while Python records the rest of the "
                    "forward (0: one submission per forward, at the download)",
                    HOST,
                ),
                Param(
                    "prefill_ahead",
                    (False, True),
                    False,
                    "prefill_kick's pieces queued behind the one in flight (one-time command "
                    "buffers, a fence each) instead of waiting for it before each submit: no "
                    "idle GPU between pieces (the 1.5B at pp512: 8 pieces, wall 2 ms over the "
                    "GPU's 20.8 ms)",
                    HOST,
                ),
            ),
            source="engine/backends/vulkan/stream.py",
            numeric="order_only",
            doc="command recording: dispatches batched per submit, graphs recorded once",
        )
    ],
    doc="how dispatches become command buffers",
)
