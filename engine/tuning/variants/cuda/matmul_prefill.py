"""CUDA prompt matmuls: batched DMMV (short prompts), the prefill GEMMs and
activation quantization."""

from __future__ import annotations

from engine.tuning.memory import MemoryCost, ModelShape, dense_copies
from engine.tuning.registry import (
    HOST,
    PUSHED,
    REGISTRY,
    Constraint,
    Param,
    VariantDecl,
    define,
    variant,
)
from engine.tuning.variants.cuda.common import (
    ALL_TYPES,
    CUDA_BLOCK_TYPES,
    B,
    _block_threads_fit,
    _cc_at_least,
)


def _staged_scratch(shape: ModelShape, context_tokens: int, params: dict) -> MemoryCost:
    """matmul_prefill.staged's fp16 scratch: scratch_mb, or the largest weight's fp16 rows when
    that is less (backend._staged takes whole rows up to the whole matrix)."""
    largest = max((2 * t.elements for t in shape.matrices(stacked=False)), default=0)
    scratch = min(int(params["scratch_mb"]) << 20, largest)
    return MemoryCost(scratch={"staged fp16 scratch": scratch})


# --- batched DMMV (short prompts, max_cols columns per launch) -----------------------------
_MAX_COLS = Param(
    "max_cols",
    (2, 4, 8, 16, 24, 32, 40, 48, 64),
    16,
    "columns (tokens) per launch: the column tile, per-thread accumulators",
    define(),
    edge=True,
)
REGISTRY.declare(
    B,
    "matmul_batched",
    [
        variant(
            "dmmv_kpar",
            params=(
                _MAX_COLS,
                Param(
                    "rows_per_block",
                    (1, 2, 4, 8),
                    2,
                    "weight rows per thread block",
                    define(),
                ),
                Param("threads_per_row", (8, 16, 32, 64), 32, "threads splitting a row", define()),
            ),
            constraints=(_block_threads_fit("matmul_batched", "dmmv_kpar"),),
            quant_types=ALL_TYPES,
            source="cuda/dmmv.cu",
            defines=("ROWS_PER_THREAD=1", "VEC=1"),
            doc="batched DMMV, K-parallel: each decoded group feeds all max_cols columns",
            numeric="order_only",
        ),
        variant(
            "dmmv_serial",
            params=(
                _MAX_COLS,
                Param(
                    "rows_per_block",
                    (32, 64, 128, 256),
                    64,
                    "rows (= threads) per block",
                    define(),
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/dmmv.cu",
            defines=("THREADS_PER_ROW=1", "ROWS_PER_THREAD=1", "VEC=1"),
            numeric="order_only",
            doc="batched DMMV, serial over K: one thread per row (the seed's slow first shape)",
        ),
    ],
)

# --- prefill GEMM -------------------------------------------------------------------------
_TILE_M = Param("tile_m", (64, 128), 128, "weight rows per block tile", define())
_TILE_N = Param("tile_n", (32, 64, 128), 128, "tokens per block tile", define(), edge=True)
_WARPS_M = Param("warps_m", (1, 2, 4), 2, "warps along the weight rows", define())
_WARPS_N = Param("warps_n", (1, 2, 4), 4, "warps along the tokens", define())


def _tile_ok(cfg) -> bool:  # noqa: ANN001
    c = cfg.op("matmul_prefill")
    if c.variant not in ("mmq", "mmq8"):
        return True
    tm, tn, wm, wn = (int(c[k]) for k in ("tile_m", "tile_n", "warps_m", "warps_n"))
    return tm % (16 * wm) == 0 and tn % (16 * wn) == 0


# Shared by the fp16 and int8 fused GEMMs: each warp owns whole 16x16 mma tiles.
_TILES_FIT_WARPS = Constraint(
    "tile_m % (16 * warps_m) == 0 and tile_n % (16 * warps_n) == 0",
    lambda cfg, dev: _tile_ok(cfg),
)


def _mmq(name: str, numeric: str, doc: str) -> VariantDecl:
    """A fused-dequant mma GEMM (mmq.cu, mmq8.cu): the same tiles, warps and rules."""
    return variant(
        name,
        params=(_TILE_M, _TILE_N, _WARPS_M, _WARPS_N),
        constraints=(_cc_at_least(80), _TILES_FIT_WARPS),
        quant_types=CUDA_BLOCK_TYPES,
        source=f"cuda/{name}.cu",
        numeric=numeric,
        doc=doc,
    )


REGISTRY.declare(
    B,
    "matmul_prefill",
    [
        variant(
            "staged",
            params=(
                Param(
                    "scratch_mb",
                    (32, 64, 128, 256, 512),
                    128,
                    "fp16 scratch per GEMM in MiB (weights dequantized in row chunks)",
                    HOST,
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/dequant.cu",
            numeric="fp16",
            memory=_staged_scratch,
            doc="dequantize to an fp16 scratch, then cuBLAS GEMM (fp32 accumulate, fp32 out)",
        ),
        _mmq(
            "mmq",
            "fp16",
            "fused-dequant GEMM: blocks decoded into shared fp16 tiles, mma.sync m16n8k16",
        ),
        _mmq(
            "mmq8",
            "int8_activations",
            "fused-dequant int8 GEMM on Q8_1 activations: int8 weight tiles with per-16 "
            "scales, mma.sync m16n8k16 s8 -> s32, scaled into float32 per 16 k",
        ),
        variant(
            "resident",
            params=(
                Param(
                    "fuse_f16",
                    (0, 1),
                    1,
                    "1: rms_norm and swiglu of a prefill chunk also store the fp16 copy the "
                    "GEMM reads (prefill_f16.cu), so no separate f32_to_f16 pass; the bits are "
                    "the same as the pass's",
                    HOST,
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/prefill_f16.cu",
            numeric="fp16",
            # the fp16 copy [N, K] of every 2-D matmul weight of the layers (prefill.py)
            memory=dense_copies(2, "f16", stacked=False),
            doc="staged's arithmetic without its per-GEMM dequantize: each 2-D weight's fp16 "
            "copy is made once, at its first prefill GEMM, and kept on the GPU (counted in "
            "memory_report's weights; 7B ~14 GiB more), then one cuBLAS GEMM (fp16 in, fp32 "
            "accumulate and out)",
        ),
    ],
)

REGISTRY.declare(
    B,
    "quantize_act",
    [
        variant(
            "q8_1",
            params=(
                Param(
                    "threads",
                    (128, 256, 512, 1024),
                    256,
                    "threads per block of quantize_q8_1 / rms_norm_q8 (one row) / swiglu_q8",
                    PUSHED,
                ),
            ),
            source="cuda/q8.cu",
            # Its rounding is budgeted where it is consumed: mmvq and mmq8 declare
            # int8_activations; a config using neither never calls it.
            numeric="order_only",
            doc="float32 activations to Q8_1 blocks (int8 + d + d*sum) for the integer matmuls",
        )
    ],
    doc="activation quantization feeding matmul_decode.mmvq and matmul_prefill.mmq8",
)
