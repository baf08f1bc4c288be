"""CUDA row ops: embedding, rms_norm, add / swiglu / rope / kv_write, argmax."""

from __future__ import annotations

from engine.tuning.registry import HOST, PUSHED, REGISTRY, Param, variant
from engine.tuning.variants.cuda.common import ALL_TYPES, B

# --- the other ops ------------------------------------------------------------------------
REGISTRY.declare(
    B,
    "embedding",
    [
        variant(
            "get_rows",
            params=(Param("threads", (64, 128, 256, 512), 256, "threads per block", PUSHED),),
            quant_types=ALL_TYPES,
            source="cuda/dequant.cu",
            numeric="order_only",
            doc="rows of a quantized table, ids on the device",
        )
    ],
)
# block first: the default (H200, 1.5B synth tg64, helper dec15: float 427.7 -> 469.0, +9.7%;
# int8 dec8_split2 613.2 -> 625.0; a 1,536-wide row took ~9 us a call in the warp kernel).
REGISTRY.declare(
    B,
    "rms_norm",
    [
        variant(
            "block",
            params=(
                Param(
                    "threads",
                    (128, 256, 512),
                    256,
                    "threads of the block that takes one row (rows longer than 32 x threads "
                    "values take the warp kernel)",
                    PUSHED,
                ),
            ),
            source="cuda/norm_decode.cu",
            numeric="order_only",
            doc="one block per row, x and w loaded once into registers before the reduction "
            "(one memory round trip); under int8 decode it also writes the row's Q8_1 form "
            "(rms_norm_q8's arithmetic and order)",
        ),
        variant(
            "warp",
            params=(
                Param("rows_per_block", (1, 2, 4, 8), 4, "rows (one warp each) per block", PUSHED),
            ),
            source="cuda/elementwise.cu",
            numeric="order_only",
            doc="one warp per row of the last dim ([T, C] and per-head [T, H, D])",
        ),
    ],
)


_FUSE_KV = Param(
    "fuse_kv",
    (0, 1),
    0,
    "1: the q/k/v bias adds, RoPE of q and k and the KV-cache write in one launch "
    "(decode_fused.cu rope_kv; same arithmetic, one launch instead of six)",
    HOST,
)
for _op, _name, _doc, _extra in [
    ("add", "elementwise", "residual add and 1-D bias broadcast", ()),
    ("swiglu", "elementwise", "silu(gate) * up", ()),
    (
        "rope",
        "pairs",
        "normal and neox pairs, angle in double, position from the device",
        (_FUSE_KV,),
    ),
    ("kv_write", "copy", "k, v into the float32 cache at the device position", ()),
]:
    REGISTRY.declare(
        B,
        _op,
        [
            variant(
                _name,
                params=(
                    Param("threads", (128, 256, 512, 1024), 256, "threads per block", PUSHED),
                    *_extra,
                ),
                source="cuda/elementwise.cu",
                numeric="order_only",
                doc=_doc,
            )
        ],
    )
# multi is the default: one block streamed the 35B-A3B's 248k vocabulary in 92 us a decode token
# (3% of it) and the 1.5B's 152k in ~55 us; multi takes ~11 us (docs/BENCHMARKS.md, eighth session)
REGISTRY.declare(
    B,
    "argmax",
    [
        variant(
            "multi",
            params=(
                Param("blocks", (8, 16, 32, 64, 128, 256), 64, "blocks per row", PUSHED),
                Param("threads", (128, 256, 512, 1024), 256, "threads per block", PUSHED),
            ),
            source="cuda/decode_fused.cu",
            numeric="order_only",
            doc="many blocks per row in one launch (the last block to finish reduces their "
            "partials); first maximum wins. One block streams a 152k vocabulary at ~15 GB/s",
        ),
        variant(
            "block",
            params=(Param("threads", (256, 512, 1024), 1024, "threads per row", PUSHED),),
            source="cuda/elementwise.cu",
            numeric="order_only",
            doc="one block per row; first maximum wins",
        ),
    ],
)
