"""CUDA decode matmul (T == 1): mmvq, mmvw, mmvf, dmmv and their knobs."""

from __future__ import annotations

from engine.tuning.registry import HOST, REGISTRY, Derived, Param, define, variant
from engine.tuning.variants.cuda.common import (
    ALL_TYPES,
    B,
    _block_threads_fit,
    _knob_needs_cc,
    _while_chosen,
)

# --- decode matmul ------------------------------------------------------------------------
# A gated delta-net layer's input projections (q/k/v, the output gate z, beta and alpha) feed
# its recurrent state, which carries their rounding into every later token: in NumPy with
# exactly CUDA's Q8_1 rounding, keeping them float takes the tiny qwen35 from KLD 0.023 (past
# the int8 budget) to 0.004 (tests/engine/test_hybrid.py). Both int8 decode variants have the knob.
_FLOAT_SSM_IN = Param(
    "float_ssm_in",
    (0, 1),
    0,
    "1: a hybrid's delta-net input projections (attn_qkv, attn_gate, ssm_ba / ssm_beta / "
    "ssm_alpha) of a decode row take the float dmmv path; the other block-type matmuls stay "
    "int8 (no effect on models without delta-net layers)",
    HOST,
)
REGISTRY.declare(
    B,
    "matmul_decode",
    [
        # mmvf first: the default (float activations, so the sentinel's float-exact path).
        variant(
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
                    define(),
                ),
                Param(
                    "rows_per_thread",
                    (1, 2, 4, 8),
                    2,
                    "rows a group walks together (one activation load and its sums serve all: "
                    "L1 traffic per weight byte falls as 1 / rows)",
                    define(),
                ),
                Param("warps", (1, 2, 4, 8), 4, "warps per block", define()),
                Param(
                    "unroll",
                    (1, 2, 4),
                    2,
                    "slots per lane per iteration: unroll * rows_per_thread weight loads issued "
                    "before any is used",
                    define(),
                ),
                Param(
                    "wload",
                    (0, 1, 2),
                    0,
                    "Q4_K / Q6_K quant loads: 0 ld.global.nc; 1 + L1::no_allocate (read once: "
                    "L1 left to the activations); 2 + L2::256B prefetch",
                    define(),
                ),
                Param(
                    "min_blocks",
                    (0, 4, 8, 12, 16),
                    0,
                    "blocks per SM __launch_bounds__ sizes registers for (0: no bound)",
                    define(),
                ),
                Param(
                    "xsmem",
                    (0, 1),
                    0,
                    "1: each block first copies the activation row into shared memory (K * 4 "
                    "bytes, a bank-conflict-free layout per type) and reads it there instead of "
                    "through L1, where a slot's 64-byte runs cost a cache line each per load",
                    define(),
                ),
                Param(
                    "q4k_pair",
                    (0, 1),
                    0,
                    "1: a lane's Q4_K slot is a whole sub-block pair (64 weights, two 16-byte "
                    "quant loads) instead of half of one: one header load and scale decode per "
                    "64 weights, not 32",
                    define(),
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
                _knob_needs_cc("matmul_decode", "mmvf", "pdl", 90),
                _while_chosen(
                    "matmul_decode",
                    "mmvf",
                    "mmvf: threads_per_row <= 32 * warps (a row's warps are in one block)",
                    lambda k, dev: int(k.threads_per_row) <= 32 * int(k.warps),
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
        variant(
            "dmmv",
            params=(
                Param(
                    "rows_per_block",
                    (1, 2, 4, 8, 16),
                    4,
                    "weight rows per thread block",
                    define(),
                ),
                Param(
                    "threads_per_row",
                    (8, 16, 32, 64, 128),
                    32,
                    "threads splitting a row",
                    define(),
                ),
                Param(
                    "rows_per_thread",
                    (1, 2, 4),
                    2,
                    "weight rows a thread walks together (activation reuse, loads in flight)",
                    define(),
                ),
                Param(
                    "vec",
                    (1, 2, 4),
                    2,
                    "consecutive 16-weight groups per thread per step (load width, x8 bytes Q4_K)",
                    define(),
                ),
            ),
            constraints=(_block_threads_fit("matmul_decode", "dmmv"),),
            quant_types=ALL_TYPES,
            source="cuda/dmmv.cu",
            defines=("MAX_COLS=1",),
            numeric="order_only",
            doc="dequantizing matrix-vector product, K split across threads_per_row threads",
        ),
        variant(
            "mmvq",
            params=(
                Param(
                    "warps",
                    (1, 2, 4, 8),
                    4,
                    "warps per block, all walking the same rows",
                    define(),
                ),
                Param("rows_per_block", (1, 2, 4, 8), 1, "weight rows per block", define()),
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
        variant(
            "mmvw",
            params=(
                Param(
                    "threads_per_row",
                    (8, 16, 32),
                    32,
                    "lanes splitting a row (a group inside one warp; shuffles, no barrier)",
                    define(),
                ),
                Param(
                    "rows_per_thread",
                    (1, 2, 4),
                    1,
                    "rows a group walks together (one activation load serves them all)",
                    define(),
                ),
                Param("warps", (1, 2, 4, 8), 4, "warps per block", define()),
                Param(
                    "unroll",
                    (1, 2, 4, 8),
                    2,
                    "slots per lane per iteration (weight loads in flight before use)",
                    define(),
                ),
                Param(
                    "wload",
                    (0, 1, 2),
                    0,
                    "Q4_K / Q6_K weight loads: 0 ld.global.nc; 1 + L1::no_allocate (weights "
                    "read once leave L1 to the activations); 2 + L2::256B prefetch of the run "
                    "the neighbouring lanes read next",
                    define(),
                ),
                Param(
                    "min_blocks",
                    (0, 4, 8, 12, 16),
                    0,
                    "blocks per SM __launch_bounds__ sizes registers for (0: no bound): "
                    "occupancy, so more loads in flight per SM",
                    define(),
                ),
                Param(
                    "prefetch",
                    (0, 1),
                    0,
                    "1: each block asks the L2 for its weight rows (cp.async.bulk.prefetch, "
                    "sm_90) before it waits for the previous kernel: with pdl = 1 the weights "
                    "stream in while that kernel finishes",
                    define(),
                ),
                Param(
                    "stage",
                    (0, 1),
                    0,
                    "1: each block's Q4_K / Q6_K weight rows come into shared memory by one bulk "
                    "copy (cp.async.bulk, sm_90; issued before the PDL wait) and are read from "
                    "there: all of a block's weight bytes in flight at once, without registers",
                    define(),
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
                    define(),
                ),
                Param(
                    "q6k_wide",
                    (0, 1),
                    0,
                    "1: a lane's Q6_K slot is 64 weights (32 bytes of ql, 32 of qh, four "
                    "scales) instead of 32: half the per-slot work per weight byte",
                    define(),
                ),
                Param(
                    "split_k",
                    (1, 2, 4),
                    1,
                    "rows with K >= split_min_k split over this many lane groups of a block, "
                    "partials summed in shared memory in a fixed order: this many times the "
                    "blocks and warps on tall-skinny shapes (the down projection)",
                    define(),
                ),
                Param(
                    "split_min_k",
                    (256, 2048, 4096, 8192, 16384),
                    8192,
                    "row length from which split_k applies (K >= this; mmvw_qkv never splits)",
                    define(),
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
                    define(),
                ),
                Param(
                    "glu_unroll",
                    (1, 2, 4, 8),
                    4,
                    "slots per lane per iteration in mmvw_glu (its rows are few per block and "
                    "long per lane: its own depth of loads in flight)",
                    define(),
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
                    define(),
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
                    define(),
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
                _while_chosen(
                    "matmul_decode",
                    "mmvw",
                    "split_k <= warps * 32 / threads_per_row (a part per lane group)",
                    lambda k, dev: int(k.split_k) * int(k.threads_per_row) <= 32 * int(k.warps),
                ),
                _knob_needs_cc("matmul_decode", "mmvw", "stream", 90, " (bulk copies)"),
                _knob_needs_cc("matmul_decode", "mmvw", "pdl", 90),
            ),
            # rows per block of an unsplit launch: the host sizes its grids with it and the
            # kernel reads it (split_k divides it on long rows: _mmvw_rows_per_block)
            derived=(
                Derived(
                    "rows_per_block",
                    lambda k: k.warps * 32 // k.threads_per_row * k.rows_per_thread,
                    "warps x (32 / threads_per_row) lane groups of rows_per_thread rows",
                    define(),
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
