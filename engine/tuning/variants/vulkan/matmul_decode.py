"""Vulkan decode matmul (T == 1) and activation quantization."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.tuning.registry import HOST, REGISTRY, Constraint, Param, define, spec, variant
from engine.tuning.variants.vulkan.common import (
    _SUBGROUP,
    QUANT_TYPES,
    SUBGROUP_FEATURE_SHUFFLE,
    B,
    _effective_subgroup,
    _extra,
    _rows_per_wg,
    _selected,
    _shared_fits,
    _subgroup_wg,
    _wg,
    _wg_fits,
)

if TYPE_CHECKING:
    from engine.device_info import DeviceInfo
    from engine.tuning.config import TuningConfig


def _tpr_le_wg(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_decode")
    return int(c.threads_per_row) <= int(c.wg_size)


def _block_tpr_in_subgroup(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    tpr = int(cfg.knobs("matmul_decode").threads_per_row)
    sg = _effective_subgroup(cfg, "matmul_decode", dev)
    return tpr == 0 or sg is None or tpr <= sg


def _block_rows_per_thread(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_decode")
    return int(c.rows_per_thread) <= int(c.rows_per_wg)


def _fuse_rope_rows(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_decode")
    return not int(c.fuse_rope) or int(c.rows_per_thread) >= 2


def _has_shuffle(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    ops = _extra(dev, "subgroup_operations")
    return ops is None or bool(int(ops) & SUBGROUP_FEATURE_SHUFFLE)


# block's and mmvw's row split (the same meaning in both decode variants)
_LANES_PER_ROW = Param(
    "threads_per_row",
    (0, 4, 8, 16, 32, 64),
    0,
    "lanes of one subgroup per row (0: the whole subgroup)",
    spec(2),
)
# block's and mmvw's workgroup: rows_per_wg rows, each split over threads_per_row lanes
_BLOCK_SPLIT = (_wg(64), _rows_per_wg(4, (1, 2, 4, 8, 16, 32)), _LANES_PER_ROW)

# block's and mmvw's rules (the same row split and lane reduction)
_BLOCK_CONSTRAINTS = (
    *_subgroup_wg("matmul_decode"),
    Constraint(
        "threads_per_row 0 or at most the subgroup size (required or device "
        "default): a row's lanes reduce inside one subgroup",
        _block_tpr_in_subgroup,
    ),
    Constraint("rows_per_thread <= rows_per_wg", _block_rows_per_thread),
    Constraint("the device has subgroup shuffle operations", _has_shuffle),
)


REGISTRY.declare(
    B,
    "matmul_decode",
    [
        # The default: decode is memory-bound, and this is the variant built to stream weight
        # bytes (wide loads, scales once per block chunk, x loaded once for several rows); the
        # 8-weights-per-lane subgroup/shmem variants reload scales every 8 weights and ran at
        # ~8-15% of the H200's bandwidth. Not yet timed on a GPU: see docs/vulkan.md.
        _selected(
            "vulkan/matmul_decode.comp",
            "block",
            params=(
                *_BLOCK_SPLIT,
                Param(
                    "rows_per_thread",
                    (1, 2, 4),
                    2,
                    "rows a lane accumulates at once, sharing each load of x",
                    spec(3),
                ),
                _SUBGROUP,
            ),
            constraints=_BLOCK_CONSTRAINTS,
            doc="DMMV in block-sized chunks per lane: wide weight loads, scales once per chunk, "
            "vec4 x shared by rows_per_thread rows; subgroupAdd or shuffle-xor reduction",
        ),
        _selected(
            "vulkan/matmul_decode.comp",
            "subgroup",
            params=(_wg(64), _rows_per_wg(2), _SUBGROUP),
            constraints=_subgroup_wg("matmul_decode"),
            doc="DMMV, one subgroup per row, lanes split K, subgroupAdd",
        ),
        _selected(
            "vulkan/matmul_decode.comp",
            "shmem",
            params=(
                _wg(64),
                _rows_per_wg(2),
                Param(
                    "threads_per_row",
                    (1, 2, 4, 8, 16, 32, 64, 128, 256),
                    32,
                    "threads cooperating on one row (reduced in shared memory)",
                    spec(2),
                ),
            ),
            constraints=(
                _wg_fits("matmul_decode"),
                Constraint("threads_per_row <= wg_size", _tpr_le_wg),
                _shared_fits("matmul_decode", 1),
            ),
            doc="DMMV, threads_per_row threads per row, shared-memory tree reduction",
        ),
        # Not the default: int8 activations. The knobs mean what the block variant's do (and
        # threads_per_row / rows_per_thread what CUDA's mmvw's do); the defaults are block's,
        # the values measured best for it on the H200.
        variant(
            "mmvw",
            params=(
                *_BLOCK_SPLIT,
                Param(
                    "rows_per_thread",
                    (1, 2, 4),
                    2,
                    "rows a lane accumulates at once, sharing each slot's int8 activations",
                    spec(3),
                ),
                Param(
                    "unroll",
                    (1, 2, 4),
                    2,
                    "slots per lane per iteration (weight loads in flight before use)",
                    spec(4),
                ),
                Param(
                    "fuse_rope",
                    (0, 1),
                    0,
                    "1: q, k, v with their biases in one dispatch that also ropes q and k and "
                    "writes k and v into the KV cache as it stores (a lane's rows are whole RoPE "
                    "pairs; rows_per_thread >= 2): no rope dispatch (as CUDA's fuse_rope)",
                    HOST,
                ),
                Param(
                    "pair_mul",
                    (False, True),
                    True,
                    "two int8 products per 32-bit multiply (16-bit halves, exact) instead of "
                    "byte-by-byte multiply-adds: fewer integer ops per weight",
                    define(),
                ),
                _SUBGROUP,
            ),
            constraints=(
                *_BLOCK_CONSTRAINTS,
                Constraint(
                    "fuse_rope needs rows_per_thread >= 2 (a lane holds whole RoPE pairs)",
                    _fuse_rope_rows,
                ),
            ),
            quant_types=QUANT_TYPES,
            source="vulkan/mmvw.comp",
            numeric="int8_activations",
            doc="Q4_K / Q6_K rows against Q8_1 activations with integer dot products (the port "
            "of CUDA's mmvw): a row per cluster of subgroup lanes, up to three matrices per "
            "dispatch (q, k, v; gate, up) and the bias or residual added as it stores; the "
            "norm and SwiGLU before a matmul write the Q8_1 form (quantize_act). Other weight "
            "types run the block DMMV on float activations",
        ),
    ],
    doc="matmul with T == 1 (decode and per-token prefill)",
)

# The Q8_1 producers of matmul_decode.mmvw: quantize (an activation with no Q8_1 form yet), and
# the fused rms_norm and SwiGLU that write it as they store (a decode row, width % 32 == 0).
REGISTRY.declare(
    B,
    "quantize_act",
    [
        variant(
            "q8_1",
            params=(
                _wg(256),
                Param(
                    "coalesced",
                    (False, True),
                    True,
                    "a thread per value (coalesced; block max and sum through shared memory; "
                    "the norm pass in ceil(D / wg_size) workgroups) instead of a thread per "
                    "32-block",
                    define(),
                ),
            ),
            constraints=(_wg_fits("quantize_act"), _shared_fits("quantize_act", 1)),
            source="vulkan/q8_quant.comp",
            # Its rounding is budgeted where it is consumed: matmul_decode.mmvw declares
            # int8_activations; a config without mmvw never dispatches it.
            numeric="order_only",
            doc="float32 activations to Q8_1 blocks (int8 + d + d * sum(q)), a thread per "
            "32-block; passes norm (rms_norm + Q8_1) and swiglu (SwiGLU + Q8_1); the split "
            "attention's merge_q8 pass stores the attention output's form the same way",
        )
    ],
    doc="activation quantization feeding matmul_decode.mmvw",
)
