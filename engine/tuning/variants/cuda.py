"""The CUDA backend's kernels (engine/backends/cuda, shaders/cuda/*.cu): variants, parameters,
allowed values and constraints. Plain data: this module imports nothing from CuPy, so the agent
reads the search space on a head node without a GPU.

Matmul dispatch (engine/backends/cuda/backend.py): T == 1 -> matmul_decode; 1 < T <
prefill.gemm_min_t -> matmul_batched (DMMV over max_cols columns per launch); T >= gemm_min_t ->
matmul_prefill (a GEMM). A weight type a chosen GEMM variant does not decode falls back to
matmul_batched; the declared quant_types say which types each variant decodes itself.

Each knob's binding says how it reaches the kernel: a -D define of the variant's source or of a
helper module it launches (Binding.builds; built by engine.backends.cuda.kernels.modules_for),
a launch argument, or host scheduling. A value derived from knobs (Variant.derived: mmvw's rows
per block) is computed once, in its declaration, and read by the host and the kernel alike.
Constraints read DeviceInfo.extra: ``cc`` (compute capability as major*10+minor), ``sms``,
``smem_per_block`` and ``smem_per_block_optin`` (bytes).
"""

from __future__ import annotations

from engine.roofline import Tensor
from engine.tuning.memory import MemoryCost, ModelShape, dense_copies, loaded_default
from engine.tuning.registry import (
    HOST,
    PUSHED,
    REGISTRY,
    Constraint,
    Derived,
    Param,
    Variant,
    define,
)

B = "cuda"

# The block-quantized types the CUDA kernels decode: a subset of engine.quant_types.BLOCK_TYPES.
CUDA_BLOCK_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"})
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})
ALL_TYPES = CUDA_BLOCK_TYPES | FLOAT_TYPES
"""Weight types the CUDA backend keeps on the GPU (load_weight raises for any other)."""


def _staged_scratch(shape: ModelShape, context_tokens: int, params: dict) -> MemoryCost:
    """matmul_prefill.staged's fp16 scratch: scratch_mb, or the largest weight's fp16 rows when
    that is less (backend._staged takes whole rows up to the whole matrix)."""
    largest = max((2 * t.elements for t in shape.matrices(stacked=False)), default=0)
    scratch = min(int(params["scratch_mb"]) << 20, largest)
    return MemoryCost(scratch={"staged fp16 scratch": scratch})


def _cc_at_least(cc: int) -> Constraint:
    return Constraint(
        f"needs compute capability >= {cc // 10}.{cc % 10}",
        lambda cfg, dev: dev is None or int(dev.extra.get("cc", 0)) >= cc,
    )


def _p(cfg, op: str, name: str) -> int:  # noqa: ANN001 - TuningConfig
    return int(getattr(cfg.knobs(op), name))


def _knob_needs_cc(variant: str, knob: str, cc: int, why: str = "") -> Constraint:
    """matmul_decode.<knob> != 0 under ``variant`` needs compute capability >= cc."""
    return Constraint(
        f"matmul_decode.{knob} != 0 needs compute capability >= {cc // 10}.{cc % 10}{why}",
        lambda cfg, dev: (
            cfg.op("matmul_decode").variant != variant
            or _p(cfg, "matmul_decode", knob) == 0
            or dev is None
            or int(dev.extra.get("cc", 0)) >= cc
        ),
    )


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

# --- decode matmul ------------------------------------------------------------------------
# A gated delta-net layer's input projections (q/k/v, the output gate z, beta and alpha) feed
# its recurrent state, which carries their rounding into every later token: in NumPy with
# exactly CUDA's Q8_1 rounding, keeping them float takes the tiny qwen35 from KLD 0.023 (past
# the int8 budget) to 0.004 (tests/test_hybrid.py). Both int8 decode variants have the knob.
_FLOAT_SSM_IN = Param(
    "float_ssm_in",
    (0, 1),
    0,
    "1: a hybrid's delta-net input projections (attn_qkv, attn_gate, ssm_ba / ssm_beta / "
    "ssm_alpha) of a decode row take the float dmmv path; the other block-type matmuls stay "
    "int8 (no effect on models without delta-net layers)",
    HOST,
)
REGISTRY.register(
    B,
    "matmul_decode",
    [
        # mmvf first: the default (float activations, so the sentinel's float-exact path).
        Variant(
            B,
            "matmul_decode",
            "mmvf",
            params=(
                Param(
                    "threads_per_row",
                    (8, 16, 32, 64, 128),
                    32,
                    "lanes splitting a row: a group inside one warp (shuffles, no barrier), or "
                    "64 / 128 lanes of 2 / 4 warps meeting in shared memory (more blocks where N "
                    "is small). 32, the default, measured best over the 7B/9B shapes on the H200 "
                    "(twice the blocks of 16 where N is 3-4k)",
                    define("TPR"),
                ),
                Param(
                    "rows_per_thread",
                    (1, 2, 4, 8),
                    2,
                    "rows a group walks together (one activation load and its sums serve all: "
                    "L1 traffic per weight byte falls as 1 / rows)",
                    define("RPT"),
                ),
                Param("warps", (1, 2, 4, 8), 4, "warps per block", define("NW")),
                Param(
                    "unroll",
                    (1, 2, 4),
                    2,
                    "slots per lane per iteration: unroll * rows_per_thread weight loads issued "
                    "before any is used",
                    define("UNROLL"),
                ),
                Param(
                    "wload",
                    (0, 1, 2),
                    0,
                    "Q4_K / Q6_K quant loads: 0 ld.global.nc; 1 + L1::no_allocate (read once: "
                    "L1 left to the activations); 2 + L2::256B prefetch",
                    define("WLOAD"),
                ),
                Param(
                    "min_blocks",
                    (0, 4, 8, 12, 16),
                    0,
                    "blocks per SM __launch_bounds__ sizes registers for (0: no bound)",
                    define("MINB"),
                ),
                Param(
                    "xsmem",
                    (0, 1),
                    0,
                    "1: each block first copies the activation row into shared memory (K * 4 "
                    "bytes, a bank-conflict-free layout per type) and reads it there instead of "
                    "through L1, where a slot's 64-byte runs cost a cache line each per load",
                    define("XS"),
                ),
                Param(
                    "q4k_pair",
                    (0, 1),
                    0,
                    "1: a lane's Q4_K slot is a whole sub-block pair (64 weights, two 16-byte "
                    "quant loads) instead of half of one: one header load and scale decode per "
                    "64 weights, not 32",
                    define("Q4P"),
                ),
                Param(
                    "fuse_swiglu",
                    (0, 1),
                    0,
                    "1: gate, up and silu(gate) * up of a decode row in one launch (mmvf_glu: a "
                    "lane group walks rows_per_thread / 2 rows of each; needs rows_per_thread "
                    "even and gate, up of one type, else the two launches run)",
                    HOST,
                ),
                Param(
                    "pdl",
                    (0, 1),
                    0,
                    "1: programmatic dependent launch (sm_90+) of the decode kernels that "
                    "start with pdl_start (mmvf, rms_norm.block, rope_kv, attention_decode.gqa, "
                    "swiglu, argmax.multi): each launch overlaps the tail of the one before",
                    HOST,
                ),
            ),
            constraints=(
                _knob_needs_cc("mmvf", "pdl", 90),
                Constraint(
                    "mmvf: threads_per_row <= 32 * warps (a row's warps are in one block)",
                    lambda cfg, dev: (
                        cfg.op("matmul_decode").variant != "mmvf"
                        or _p(cfg, "matmul_decode", "threads_per_row")
                        <= 32 * _p(cfg, "matmul_decode", "warps")
                    ),
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/mmvf.cu",
            numeric="order_only",
            doc="float32 activations and sums (dmmv's arithmetic) in mmvw's shape: a row per "
            "lane group, 16-byte quant loads, unroll * rows_per_thread loads in flight, quants "
            "made floats by a byte permute into 2^23's mantissa (no I2F); up to three "
            "matrices per launch with the bias or residual added as it stores. Float weights "
            "use dmmv at its defaults",
        ),
        Variant(
            B,
            "matmul_decode",
            "dmmv",
            params=(
                Param(
                    "rows_per_block",
                    (1, 2, 4, 8, 16),
                    4,
                    "weight rows per thread block",
                    define("ROWS"),
                ),
                Param(
                    "threads_per_row",
                    (8, 16, 32, 64, 128),
                    32,
                    "threads splitting a row",
                    define("TPR"),
                ),
                Param(
                    "rows_per_thread",
                    (1, 2, 4),
                    2,
                    "weight rows a thread walks together (activation reuse, loads in flight)",
                    define("RPT"),
                ),
                Param(
                    "vec",
                    (1, 2, 4),
                    2,
                    "consecutive 16-weight groups per thread per step (load width, x8 bytes Q4_K)",
                    define("VEC"),
                ),
            ),
            constraints=(
                Constraint(
                    "rows_per_block * threads_per_row <= 1024",
                    lambda cfg, dev: (
                        cfg.op("matmul_decode").variant != "dmmv"
                        or _p(cfg, "matmul_decode", "rows_per_block")
                        * _p(cfg, "matmul_decode", "threads_per_row")
                        <= 1024
                    ),
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/dmmv.cu",
            defines=("COLS=1",),
            numeric="order_only",
            doc="dequantizing matrix-vector product, K split across threads_per_row threads",
        ),
        Variant(
            B,
            "matmul_decode",
            "mmvq",
            params=(
                Param(
                    "warps",
                    (1, 2, 4, 8),
                    4,
                    "warps per block, all walking the same rows",
                    define("NW"),
                ),
                Param("rows_per_block", (1, 2, 4, 8), 1, "weight rows per block", define("RPB")),
                _FLOAT_SSM_IN,
            ),
            quant_types=ALL_TYPES,
            source="cuda/mmvq.cu",
            numeric="int8_activations",
            doc="activation quantized once to Q8_1 (fused into RMSNorm / SwiGLU where they "
            "feed it), dp4a against the weight quants, 16-byte loads; float weights use dmmv. "
            "Not the default: int8 activations exceed validate's default tolerances against "
            "the float path on random-weight models (docs/cuda.md)",
        ),
        Variant(
            B,
            "matmul_decode",
            "mmvw",
            params=(
                Param(
                    "threads_per_row",
                    (8, 16, 32),
                    32,
                    "lanes splitting a row (a group inside one warp; shuffles, no barrier)",
                    define("TPR"),
                ),
                Param(
                    "rows_per_thread",
                    (1, 2, 4),
                    1,
                    "rows a group walks together (one activation load serves them all)",
                    define("RPT"),
                ),
                Param("warps", (1, 2, 4, 8), 4, "warps per block", define("NW")),
                Param(
                    "unroll",
                    (1, 2, 4, 8),
                    2,
                    "slots per lane per iteration (weight loads in flight before use)",
                    define("UNROLL"),
                ),
                Param(
                    "wload",
                    (0, 1, 2),
                    0,
                    "Q4_K / Q6_K weight loads: 0 ld.global.nc; 1 + L1::no_allocate (weights "
                    "read once leave L1 to the activations); 2 + L2::256B prefetch of the run "
                    "the neighbouring lanes read next",
                    define("WLOAD"),
                ),
                Param(
                    "min_blocks",
                    (0, 4, 8, 12, 16),
                    0,
                    "blocks per SM __launch_bounds__ sizes registers for (0: no bound): "
                    "occupancy, so more loads in flight per SM",
                    define("MINB"),
                ),
                Param(
                    "prefetch",
                    (0, 1),
                    0,
                    "1: each block asks the L2 for its weight rows (cp.async.bulk.prefetch, "
                    "sm_90) before it waits for the previous kernel: with pdl = 1 the weights "
                    "stream in while that kernel finishes",
                    define("PREFETCH"),
                ),
                Param(
                    "stage",
                    (0, 1),
                    0,
                    "1: each block's Q4_K / Q6_K weight rows come into shared memory by one bulk "
                    "copy (cp.async.bulk, sm_90; issued before the PDL wait) and are read from "
                    "there: all of a block's weight bytes in flight at once, without registers",
                    define("STAGE"),
                ),
                Param(
                    "stage_min_rows",
                    (0, 32768, 65536),
                    0,
                    "stage = 1 stages only launches of at least this many rows (the LM head: "
                    "the gemv checkpoint's 7B LM head went from 3.49 to 4.09 TB/s staged while "
                    "the down projections lost 5-12 us); smaller launches read global memory",
                    HOST,
                ),
                Param(
                    "q4k_wide",
                    (0, 1),
                    0,
                    "1: a lane's Q4_K slot is all 32 quant bytes of a sub-block pair (64 "
                    "weights, two 16-byte loads) instead of 16: half the header, scale and "
                    "activation-scale work per weight byte (the kernel runs at a fixed slot "
                    "rate, so Q4_K streams fewer bytes a second than Q6_K)",
                    define("Q4K_WIDE"),
                ),
                Param(
                    "q6k_wide",
                    (0, 1),
                    0,
                    "1: a lane's Q6_K slot is 64 weights (32 bytes of ql, 32 of qh, four "
                    "scales) instead of 32: half the per-slot work per weight byte",
                    define("Q6K_WIDE"),
                ),
                Param(
                    "split_k",
                    (1, 2, 4),
                    1,
                    "rows with K >= split_min_k split over this many lane groups of a block, "
                    "partials summed in shared memory in a fixed order: this many times the "
                    "blocks and warps on tall-skinny shapes (the down projection)",
                    define("KSPLIT"),
                ),
                Param(
                    "split_min_k",
                    (256, 2048, 4096, 8192, 16384),
                    8192,
                    "row length from which split_k applies (K >= this; mmvw_qkv never splits)",
                    define("SPLIT_MINK"),
                ),
                Param(
                    "fuse_swiglu",
                    (0, 1),
                    0,
                    "1: gate and up in one launch whose blocks own 32 rows of each and write "
                    "silu(gate) * up and its Q8_1 block (mmvw_glu): no swiglu_q8 launch",
                    HOST,
                ),
                Param(
                    "fuse_rope",
                    (0, 1),
                    0,
                    "1: q, k, v with their biases in one launch that also writes v into the KV "
                    "cache and ropes each q / k head in the last of its blocks to finish "
                    "(mmvw_qkv): no rope_kv launch",
                    HOST,
                ),
                Param(
                    "glu_threads_per_row",
                    (2, 4, 8, 16),
                    8,
                    "lanes per row of mmvw_glu (fuse_swiglu): its block is the 64 rows of 32 "
                    "outputs x this many lanes, all in one pass (fewer: more blocks resident, "
                    "one wave where 8 or 16 lanes take two)",
                    define("GLU_TPR"),
                ),
                Param(
                    "glu_unroll",
                    (1, 2, 4, 8),
                    4,
                    "slots per lane per iteration in mmvw_glu (its rows are few per block and "
                    "long per lane: its own depth of loads in flight)",
                    define("GLU_UNROLL"),
                ),
                Param(
                    "fuse_norm",
                    (0, 1),
                    0,
                    "1: the attention-output and down projections (+ residual) end in the "
                    "next RMSNorm and its Q8_1 form, run by the grid's last block "
                    "(mmvw_norm): no rms_norm_q8 launch",
                    HOST,
                ),
                Param(
                    "stream",
                    (0, 2, 3, 4, 6, 8),
                    0,
                    "Q4_K / Q6_K launches (mmvw's, not its fused epilogues) as mmvw_stream: "
                    "persistent blocks stream their row sets through a ring of this many "
                    "shared-memory stages filled by bulk copies (sm_90), the next sets' bytes in "
                    "flight while one is computed; same arithmetic as mmvw (0: off)",
                    HOST,
                ),
                Param(
                    "stream_blocks",
                    (0, 1, 2, 4, 8),
                    0,
                    "persistent mmvw_stream blocks per SM (0: as many as shared memory, threads "
                    "and registers allow)",
                    HOST,
                ),
                Param(
                    "q4k_lean",
                    (0, 1),
                    0,
                    "1: Q4_K slots decode their sub-block scales branch-free (a warp's lanes hold "
                    "different sub-block pairs: q4k_sm's branch ran both sides) and the high "
                    "nibbles' dot product without shifts (dp4a of unsigned 16 x nibble bytes, "
                    "/ 16): the same integers, about a fifth fewer instructions a slot",
                    define("Q4K_LEAN"),
                ),
                Param(
                    "q4k_kernel",
                    (0, 1),
                    0,
                    "1: an mmvw launch whose matrices are all Q4_K runs mmvw_q4k, mmvw built for "
                    "Q4_K alone: fewer registers than the six-type kernel, so more warps an SM "
                    "(the rate followed warps per SM at the gemv checkpoint)",
                    HOST,
                ),
                Param(
                    "q4k_min_blocks",
                    (0, 8, 12, 16),
                    0,
                    "blocks per SM mmvw_q4k's __launch_bounds__ sizes registers for (0: "
                    "min_blocks'); its own, since Q6_K's code spills where Q4_K's does not",
                    define("Q4K_MINB"),
                ),
                Param(
                    "stream_x",
                    (0, 1),
                    0,
                    "1: each mmvw_stream block first lays the activations out in shared memory "
                    "as planes a slot's lanes read in conflict-free 16-byte loads (narrow Q4_K / "
                    "Q6_K slots; the values mmvw reads, bit for bit)",
                    HOST,
                ),
                Param(
                    "pdl",
                    (0, 1),
                    0,
                    "1: programmatic dependent launch (sm_90+) of the fused decode kernels, so "
                    "each one's launch overlaps the tail of the one before (engine/backends/"
                    "cuda/pdl.py)",
                    HOST,
                ),
                _FLOAT_SSM_IN,
            ),
            constraints=(
                Constraint(
                    "split_k <= warps * 32 / threads_per_row (a part per lane group)",
                    lambda cfg, dev: (
                        cfg.op("matmul_decode").variant != "mmvw"
                        or _p(cfg, "matmul_decode", "split_k")
                        * _p(cfg, "matmul_decode", "threads_per_row")
                        <= 32 * _p(cfg, "matmul_decode", "warps")
                    ),
                ),
                _knob_needs_cc("mmvw", "stream", 90, " (bulk copies)"),
                _knob_needs_cc("mmvw", "pdl", 90),
            ),
            # rows per block of an unsplit launch: the host sizes its grids with it and the
            # kernel reads it (split_k divides it on long rows: _mmvw_rows_per_block)
            derived=(
                Derived(
                    "rows_per_block",
                    lambda k: k.warps * 32 // k.threads_per_row * k.rows_per_thread,
                    "warps x (32 / threads_per_row) lane groups of rows_per_thread rows",
                    define("MMVW_RPB"),
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/mmvw.cu",
            numeric="int8_activations",
            doc="mmvq's Q8_1 x dp4a arithmetic with a row per lane group (no block barrier), "
            "up to three matrices per launch (q, k, v; gate, up) and the bias or residual added "
            "as it stores (attention output, down): ~10 launches per decode layer instead of "
            "~20. Float weights use dmmv. Not the default: int8 activations (as mmvq)",
        ),
    ],
)

# --- batched DMMV (short prompts, max_cols columns per launch) -----------------------------
_MAX_COLS = Param(
    "max_cols",
    (2, 4, 8, 16, 24, 32, 40, 48, 64),
    16,
    "columns (tokens) per launch: the column tile, per-thread accumulators",
    define("COLS"),
    edge=True,
)
REGISTRY.register(
    B,
    "matmul_batched",
    [
        Variant(
            B,
            "matmul_batched",
            "dmmv_kpar",
            params=(
                _MAX_COLS,
                Param(
                    "rows_per_block",
                    (1, 2, 4, 8),
                    2,
                    "weight rows per thread block",
                    define("ROWS"),
                ),
                Param(
                    "threads_per_row", (8, 16, 32, 64), 32, "threads splitting a row", define("TPR")
                ),
            ),
            constraints=(
                Constraint(
                    "rows_per_block * threads_per_row <= 1024",
                    lambda cfg, dev: (
                        cfg.op("matmul_batched").variant != "dmmv_kpar"
                        or _p(cfg, "matmul_batched", "rows_per_block")
                        * _p(cfg, "matmul_batched", "threads_per_row")
                        <= 1024
                    ),
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/dmmv.cu",
            defines=("RPT=1", "VEC=1"),
            doc="batched DMMV, K-parallel: each decoded group feeds all max_cols columns",
            numeric="order_only",
        ),
        Variant(
            B,
            "matmul_batched",
            "dmmv_serial",
            params=(
                _MAX_COLS,
                Param(
                    "rows_per_block",
                    (32, 64, 128, 256),
                    64,
                    "rows (= threads) per block",
                    define("ROWS"),
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/dmmv.cu",
            defines=("TPR=1", "RPT=1", "VEC=1"),
            numeric="order_only",
            doc="batched DMMV, serial over K: one thread per row (the seed's slow first shape)",
        ),
    ],
)

# --- prefill GEMM -------------------------------------------------------------------------
_TILE_M = Param("tile_m", (64, 128), 128, "weight rows per block tile", define("BM"))
_TILE_N = Param("tile_n", (32, 64, 128), 128, "tokens per block tile", define("BN"), edge=True)
_WARPS_M = Param("warps_m", (1, 2, 4), 2, "warps along the weight rows", define("WM"))
_WARPS_N = Param("warps_n", (1, 2, 4), 4, "warps along the tokens", define("WN"))


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

REGISTRY.register(
    B,
    "matmul_prefill",
    [
        Variant(
            B,
            "matmul_prefill",
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
        Variant(
            B,
            "matmul_prefill",
            "mmq",
            params=(_TILE_M, _TILE_N, _WARPS_M, _WARPS_N),
            constraints=(_cc_at_least(80), _TILES_FIT_WARPS),
            quant_types=CUDA_BLOCK_TYPES,
            source="cuda/mmq.cu",
            numeric="fp16",
            doc="fused-dequant GEMM: blocks decoded into shared fp16 tiles, mma.sync m16n8k16",
        ),
        Variant(
            B,
            "matmul_prefill",
            "mmq8",
            params=(_TILE_M, _TILE_N, _WARPS_M, _WARPS_N),
            constraints=(_cc_at_least(80), _TILES_FIT_WARPS),
            quant_types=CUDA_BLOCK_TYPES,
            source="cuda/mmq8.cu",
            numeric="int8_activations",
            doc="fused-dequant int8 GEMM on Q8_1 activations: int8 weight tiles with per-16 "
            "scales, mma.sync m16n8k16 s8 -> s32, scaled into float32 per 16 k",
        ),
        Variant(
            B,
            "matmul_prefill",
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

REGISTRY.register(
    B,
    "quantize_act",
    [
        Variant(
            B,
            "quantize_act",
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

# --- the other ops ------------------------------------------------------------------------
REGISTRY.register(
    B,
    "embedding",
    [
        Variant(
            B,
            "embedding",
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
REGISTRY.register(
    B,
    "rms_norm",
    [
        Variant(
            B,
            "rms_norm",
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
        Variant(
            B,
            "rms_norm",
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


def _group_warps(default: int) -> Param:
    """attention_decode.gqa's and .tile's warps: the q heads of a KV head's group over them."""
    return Param(
        "warps",
        (1, 2, 4, 8),
        default,
        "warps per block, each taking q heads of the group (needs group size "
        "<= 4 x warps, else split runs)",
        PUSHED,
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
    REGISTRY.register(
        B,
        _op,
        [
            Variant(
                B,
                _op,
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
REGISTRY.register(
    B,
    "argmax",
    [
        Variant(
            B,
            "argmax",
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
        Variant(
            B,
            "argmax",
            "block",
            params=(Param("threads", (256, 512, 1024), 1024, "threads per row", PUSHED),),
            source="cuda/elementwise.cu",
            numeric="order_only",
            doc="one block per row; first maximum wins",
        ),
    ],
)
REGISTRY.register(
    B,
    "attention_decode",
    [
        Variant(
            B,
            "attention_decode",
            "split",
            params=(
                Param("splits", (1, 2, 4, 8, 16, 32), 8, "key ranges per head (split-KV)", PUSHED),
                Param("warps", (1, 2, 4, 8), 4, "warps per key range", PUSHED),
            ),
            source="cuda/attention.cu",
            numeric="order_only",
            doc="split-KV online softmax + combine; position read on the device (graph-safe)",
        ),
        Variant(
            B,
            "attention_decode",
            "split_kw",
            params=(
                Param("splits", (1, 2, 4, 8, 16, 32), 8, "key ranges per head (split-KV)", PUSHED),
                Param("warps", (1, 2, 4, 8), 4, "warps per key range", PUSHED),
                Param(
                    "lanes_per_key",
                    (4, 8, 16),
                    8,
                    "lanes sharing one key (32 / this many keys per warp step; needs "
                    "head_dim % (4 * lanes) == 0 and head_dim <= 32 * lanes, else split runs)",
                    PUSHED,
                ),
                Param(
                    "fuse_combine",
                    (0, 1),
                    1,
                    "1: a head's last key range to finish combines the ranges (and writes the "
                    "Q8_1 form under int8 decode): one launch instead of two",
                    PUSHED,
                ),
                Param(
                    "kv_early",
                    (0, 1),
                    0,
                    "1: each step's V rows are loaded with its K rows, before the scores' "
                    "reduction (one memory round trip a step instead of two; same arithmetic)",
                    PUSHED,
                ),
            ),
            source="cuda/attention.cu",
            numeric="order_only",
            doc="split with several keys per warp step (float4 loads, a shorter dependent "
            "chain per warp); same partials and combine",
        ),
        Variant(
            B,
            "attention_decode",
            "gqa",
            params=(
                Param(
                    "splits",
                    (4, 8, 16, 32, 64),
                    16,
                    "key ranges per KV head (blocks = splits x KV heads)",
                    PUSHED,
                ),
                _group_warps(4),
                Param(
                    "fuse_combine",
                    (0, 1),
                    1,
                    "1: a KV head's last key range to finish combines its q heads' ranges (and "
                    "writes the Q8_1 form under int8 decode): one launch instead of two",
                    PUSHED,
                ),
                Param(
                    "early",
                    (0, 1),
                    1,
                    "1: the first tile's cache rows below the current position are loaded "
                    "before the PDL wait (they overlap the previous kernel under "
                    "matmul_decode.pdl; same values)",
                    PUSHED,
                ),
                Param(
                    "fuse_rope",
                    (0, 1),
                    0,
                    "1 (with fuse_combine): q and k RoPE and the current position's KV-cache "
                    "write done by the attention kernel from the q/k/v projections' outputs "
                    "(rope_kv's arithmetic; no rope / rope_kv / kv_write launch)",
                    HOST,
                ),
            ),
            source="cuda/attn_decode.cu",
            numeric="order_only",
            doc="one block per (key range, KV head) for all q heads of the group: K and V read "
            "once per group into shared memory 32 keys at a time, lane = key for the scores, "
            "lane = 4 (8) dims for P.V; same partials and combine as split (head dim <= 256, "
            "D % 4 == 0)",
        ),
        Variant(
            B,
            "attention_decode",
            "tile",
            params=(
                Param(
                    "splits",
                    (1, 2, 4, 8, 16, 32, 64, 128),
                    32,
                    "key ranges per KV head at most (grid x; blocks past the position's "
                    "ranges exit at once)",
                    PUSHED,
                ),
                Param(
                    "min_keys",
                    (32, 64, 128, 256),
                    64,
                    "keys a range takes at least: short contexts use ceil(pos / min_keys) "
                    "ranges (a cheaper combine), long ones all splits",
                    PUSHED,
                ),
                _group_warps(8),
                Param(
                    "stages",
                    (1, 2),
                    2,
                    "shared-memory tile stages: 2 loads a range's next 32-key tile while one is "
                    "computed; 1 halves the shared memory (under 48 KiB at head dim 128)",
                    PUSHED,
                ),
                Param(
                    "fuse_combine",
                    (0, 1),
                    1,
                    "1: the KV head's last range combines (one range: writes out at once); "
                    "0: every range writes a partial and attn_combine(_q8) merges them (a "
                    "second launch, no fence / atomic / serial tail in the first)",
                    PUSHED,
                ),
                Param(
                    "fuse_rope",
                    (0, 1),
                    0,
                    "1: q and k RoPE and the current position's KV-cache write done by the "
                    "attention kernel from the q/k/v projections' outputs (rope_kv's "
                    "arithmetic, while the tiles load; no rope / rope_kv / kv_write launch)",
                    HOST,
                ),
            ),
            source="cuda/attn_tile.cu",
            numeric="order_only",
            doc="a block per (KV head, key range cut from the position at run time) for all q "
            "heads of the group: 32-key K/V tiles by cp.async in two stages (the next tile in "
            "flight while one is computed), swizzled shared rows, lane = key for the scores, "
            "lane = 4 dims for P.V; one range writes out, more ranges combine in the KV head's "
            "last block (+ Q8_1 under int8 decode): one launch (D % 32 == 0, D <= 256)",
        ),
        Variant(
            B,
            "attention_decode",
            "vec",
            params=(
                Param(
                    "splits",
                    (8, 16, 32, 64, 128, 256),
                    64,
                    "key ranges per KV head at most (grid x; blocks past the position's "
                    "ranges exit at once)",
                    PUSHED,
                ),
                Param(
                    "min_keys",
                    (8, 16, 32, 64, 128),
                    32,
                    "keys a range takes at least (rounded up to warps x 8): short contexts "
                    "use fewer ranges (a cheaper combine), long ones all splits",
                    PUSHED,
                ),
                Param(
                    "warps",
                    (1, 2, 4, 8),
                    4,
                    "warps per block, each taking 8-key rounds of the block's range (merged "
                    "in shared memory in warp order)",
                    PUSHED,
                ),
                Param(
                    "fuse_combine",
                    (0, 1),
                    1,
                    "1: the KV head's last range combines (one range: writes out at once); "
                    "0: every range writes a partial and attn_combine(_q8) merges them",
                    PUSHED,
                ),
                Param(
                    "fuse_rope",
                    (0, 1),
                    0,
                    "1: q and k RoPE and the current position's KV-cache write done by the "
                    "attention kernel from the q/k/v projections' outputs (rope_kv's "
                    "arithmetic, each lane its own dims' angles; no rope / rope_kv / kv_write "
                    "launch; head dim % 8 == 0)",
                    HOST,
                ),
                Param(
                    "cluster",
                    (0, 1),
                    0,
                    "1: a KV head's keys in 8 ranges, one thread-block cluster (sm_90) that "
                    "merges them through distributed shared memory: no partials in global "
                    "memory, no fence, ticket or last block (splits and fuse_combine unused)",
                    PUSHED,
                ),
                Param(
                    "prefetch",
                    (0, 1),
                    0,
                    "1: each warp asks L2 for the rows of all its rounds after the first at the "
                    "start (prefetch.global.L2), so a range of several rounds waits on DRAM "
                    "once; same values",
                    PUSHED,
                ),
            ),
            constraints=(
                Constraint(
                    "attention_decode.cluster != 0 needs compute capability >= 9.0",
                    lambda cfg, dev: (
                        cfg.op("attention_decode").variant != "vec"
                        or _p(cfg, "attention_decode", "cluster") == 0
                        or dev is None
                        or int(dev.extra.get("cc", 0)) >= 90
                    ),
                ),
            ),
            source="cuda/attn_vec.cu",
            numeric="order_only",
            doc="a block per (KV head, key range cut from the position at run time) for all q "
            "heads of the group, registers only: a warp loads 8 keys' K and V rows at once "
            "(a lane = 4 dims), scores them against the whole group (a reduce-scatter "
            "butterfly over the warp), online softmax, P.V with p broadcast by shuffles; "
            "one range writes out, more combine in the KV head's last block (+ Q8_1 under "
            "int8 decode): one launch (D % 4 == 0, D <= 128, group <= 8)",
        ),
    ],
)
REGISTRY.register(
    B,
    "attention_prefill",
    [
        Variant(
            B,
            "attention_prefill",
            "flash",
            params=(
                Param(
                    "block_q",
                    (8, 16, 32, 64),
                    16,
                    "query tokens per block",
                    define("BQ"),
                    edge=True,
                ),
                Param("rows_per_warp", (1, 2, 4, 8), 4, "query tokens per warp", define("RPW")),
            ),
            constraints=(
                Constraint(
                    "block_q / rows_per_warp warps, between 1 and 32",
                    lambda cfg, dev: (
                        cfg.op("attention_prefill").variant != "flash"
                        or 1
                        <= _p(cfg, "attention_prefill", "block_q")
                        // _p(cfg, "attention_prefill", "rows_per_warp")
                        <= 32
                    ),
                ),
            ),
            source="cuda/attention.cu",
            numeric="order_only",
            doc="tiled flash attention in shared memory (head dim <= 128; else the split kernel)",
        ),
        Variant(
            B,
            "attention_prefill",
            "gemm",
            params=(
                Param(
                    "block_q",
                    (64, 128, 256, 512, 1024),
                    256,
                    "query tokens per pass; a pass multiplies only the keys its last query "
                    "sees (causal: fewer passes, more masked work)",
                    HOST,
                    edge=True,
                ),
                Param(
                    "softmax_warps",
                    (1, 2, 4, 8),
                    4,
                    "warps (one score row each) per block of the masked softmax",
                    PUSHED,
                ),
            ),
            source="cuda/attention_gemm.cu",
            numeric="fp16",
            doc="tensor cores through cuBLAS: q, k, v to fp16 (each kv head repeated for its "
            "query heads), S = QK^T per head (strided-batched, fp32 accumulate and out), a "
            "causal softmax to fp16 P, O = PV written into [T, H, D]; any head dim",
        ),
        Variant(
            B,
            "attention_prefill",
            "flash_tc",
            params=(
                Param(
                    "block_q",
                    (32, 64, 128),
                    64,
                    "query rows per block, 16 per warp",
                    define("FBQ"),
                    edge=True,
                ),
                Param("block_k", (32, 64, 128), 64, "keys per shared-memory tile", define("FBK")),
            ),
            constraints=(
                _cc_at_least(80),
                Constraint(
                    "flash_tc's shared tiles (block_q + 2 * block_k) x 136 halves fit a block",
                    lambda cfg, dev: (
                        cfg.op("attention_prefill").variant != "flash_tc"
                        or dev is None
                        or not dev.extra.get("smem_per_block_optin")  # unknown: Ampere+ has 99K
                        or (
                            _p(cfg, "attention_prefill", "block_q")
                            + 2 * _p(cfg, "attention_prefill", "block_k")
                        )
                        * 136
                        * 2
                        <= int(dev.extra["smem_per_block_optin"])
                    ),
                ),
            ),
            source="cuda/attention_tc.cu",
            numeric="fp16",
            doc="one-kernel flash attention on fp16 tensor cores (mma.sync m16n8k16): Q "
            "fragments in registers, K/V tiles converted from the float32 cache into shared "
            "memory, online softmax, P rounded to fp16 for P V. Head dims 32/64/96/128 (else "
            "the gemm variant at its defaults)",
        ),
        Variant(
            B,
            "attention_prefill",
            "split",
            params=(
                Param("splits", (1, 2, 4, 8), 1, "key ranges per query", PUSHED),
                Param("warps", (1, 2, 4, 8), 4, "warps per key range", PUSHED),
            ),
            source="cuda/attention.cu",
            numeric="order_only",
            doc="the decode kernel per query token (no key reuse across queries)",
        ),
    ],
)


def _loaded_bytes(t: Tensor) -> int:
    """A Q6_K tensor's blocks are padded from 210 to 224 bytes on the GPU (backend.Q6K_PADDED)."""
    if t.qtype == "Q6_K" and len(t.shape) > 1:
        return t.nbytes // 210 * 224
    return loaded_default(t)


REGISTRY.loaded_bytes[B] = _loaded_bytes
