"""The Vulkan engine schedule: prompts in chunks through the batched matmul."""

from __future__ import annotations

from engine.tuning.registry import REGISTRY
from engine.tuning.variants.vulkan.common import B

# The seed's schedule (one forward per MAX_COLS tokens) is chunk_tokens == max_cols.
REGISTRY.register_prefill(
    B,
    512,
    doc="prompt in chunks of chunk_tokens tokens through batched matmul, RoPE, KV write, attention",
)
