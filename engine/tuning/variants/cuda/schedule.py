"""The CUDA engine schedule: which matmul path a prompt chunk takes."""

from __future__ import annotations

from engine.tuning.registry import HOST, REGISTRY, Param
from engine.tuning.variants.cuda.common import B

# --- engine schedule -----------------------------------------------------------------------
REGISTRY.register_prefill(
    B,
    512,
    Param(
        "gemm_min_t",
        (2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 1 << 20),
        32,
        "chunk length at which matmul switches from batched DMMV (matmul_batched) "
        "to a GEMM (matmul_prefill); 1<<20 = never",
        HOST,
        edge=True,
    ),
    doc="prompt in chunks of chunk_tokens tokens; matmul path chosen by chunk length",
)
