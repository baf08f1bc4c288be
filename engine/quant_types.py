"""Names of the GGML weight types the engine handles (the NumPy reference dequantizes all of
them through gguf.quants; GPU backends declare their own subset in the tuning registry)."""

from __future__ import annotations

FLOAT_TYPES = ("F32", "F16", "BF16")
BLOCK_TYPES = ("Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")
SUPPORTED = frozenset(FLOAT_TYPES + BLOCK_TYPES)
