"""Knobs that more than one backend declares with the same name, values and meaning; each
backend passes the binding by which its kernel reads the value."""

from __future__ import annotations

from engine.tuning.registry import Binding, Param

# Same name, choices and meaning as numpy's delta_net.chunked.chunk (a CUDA chunked scan uses
# the same): prompt tokens per chunk of the WY scan; the last chunk of a call is ragged.
DELTA_NET_CHUNKS = (4, 8, 16, 32, 64)


def delta_net_chunk(binding: Binding) -> Param:
    """delta_net.chunked's chunk (Vulkan and CUDA chunked scans)."""
    return Param(
        "chunk",
        DELTA_NET_CHUNKS,
        64,
        "tokens per chunk of the WY scan (the sequential steps are T / chunk; "
        "the solve and the intra-chunk products grow as chunk^2)",
        binding,
    )


def moe_tile_pairs(binding: Binding) -> Param:
    """moe_experts.grouped's tile_pairs (Vulkan and CUDA grouped GEMMs)."""
    return Param(
        "tile_pairs",
        (4, 8, 16, 32),
        16,
        "routed (token, slot) pairs per tile of the grouped GEMM: each expert "
        "row is decoded once per tile (per-thread accumulators: registers)",
        binding,
    )
