"""The CUDA backend's kernels of the hybrid models (engine/hybrid.py: gated delta-net, gated
attention, MoE): shaders/cuda/delta_net.cu, delta_net_chunked.cu, moe.cu, moe_grouped.cu and
hybrid.cu, run by engine/backends/cuda/hybrid.py. Plain data, like engine.tuning.variants.cuda.

Op, variant and knob names are the Vulkan backend's where it has the op (one name, one meaning
across backends): delta_net.sequential and .chunked (state_transposed, max_dk, chunk),
moe_experts.dmmv and .grouped (tile_pairs), router_topk, ssm_conv, ssm_gates, sigmoid_mul.
CUDA's own launch knobs keep CUDA's names (threads, warps, rows_per_block, threads_per_row, vec),
as in engine.tuning.variants.cuda.
"""

from __future__ import annotations

from dataclasses import replace

from engine.tuning.registry import (
    OWN,
    PUSHED,
    REGISTRY,
    Constraint,
    Param,
    define,
    variant,
)
from engine.tuning.variants.cuda import ALL_TYPES
from engine.tuning.variants.shared import delta_net_chunk, moe_tile_pairs

B = "cuda"
# Helper modules that a variant's knobs shape besides its own source: delta_net.fuse_decode's
# step (dn_step.cu) and step_cluster's (dn_clu.cu), moe_experts' decode (moe.cu) and
# fuse_decode's kernels (moe_dec.cu).
_STEP, _CLU = "cuda/dn_step.cu", "cuda/dn_clu.cu"
_MOE, _MOE_DEC = "cuda/moe.cu", "cuda/moe_dec.cu"

# The knobs the sequential kernel and the chunked variant's decode step and inter-chunk scan
# (the same warp-per-column shape) share.
_DN_WARPS = Param(
    "warps",
    (1, 2, 4, 8),
    4,
    "warps per block, one state column each (grid: dv / warps x V heads)",
    define(OWN, _STEP),
)
_DN_LAYOUT = Param(
    "state_transposed",
    (False, True),
    True,
    "the delta-net state between calls as S^T [dv, dk] (a warp's column contiguous: "
    "coalesced) instead of S [dk, dv] (a cache line per lane); the seed's 7x was this choice "
    "on a warp-per-column kernel",
    define(OWN, _STEP, _CLU),
)
_DN_PREFETCH = Param(
    "prefetch",
    (1, 2, 4, 8),
    1,
    "tokens whose q / k / g / beta / v a warp holds in registers ahead of use (1: loaded as "
    "each comes): the next tokens' loads fly during this one's warp sums, which is what a "
    "prefill scan of hundreds of tokens waits on; same arithmetic, bit-identical",
    define(),
)
_DN_FUSE = Param(
    "fuse_decode",
    (0, 1),
    1,
    "1: a one-token call (decode) runs the gates, the scan's step and the gated norm "
    "(rms_norm by ssm_norm, times silu(z)) in one launch (dn_step.cu delta_net_step, the "
    "scan's defines; bit-identical to the four launches of 0)",
    PUSHED,
)
# fuse_conv on by default: H200, 2026-12-01 (sixth session's early call, qwen35moe 35B-A3B synth:
# hdec_all_rv_ws, this with moe_experts.route_vec, down_wsum and fuse_norm, tg128 261.5 against
# the default's 224.3, validate PASS at the default's KLD 4.98e-5; bit-identical to the two
# launches in tests/engine/backends/cuda/test_cuda_dn_conv.py).
_DN_FUSE_CONV = Param(
    "fuse_conv",
    (0, 1),
    1,
    "1 (with fuse_decode): a one-token call runs the conv step too (dn_step.cu "
    "delta_net_conv_step: ssm_conv_step's taps in each block, q / k / v read from the raw "
    "projection row, the conv state rewritten by each K head's last block), one launch per "
    "delta-net layer instead of five (conv, three column copies, the step); same expressions",
    PUSHED,
)
# fuse_ba on by default: H200, 2026-12-01 (helper hdec's second call, qwen35 9B synth, tg128 after
# a 64-token prompt, one process): 222.2 tok/s against 213.6 off; per-kernel decode time (queued)
# mmvf 132 -> 108 launches a token, 2,885 -> 2,693 us; bit-identical
# (tests/engine/backends/cuda/test_cuda_dn_conv.py
# on the H200) and validate config 18 of tests/engine/backends/cuda/test_cuda_hybrid.py passed with
# it.
_DN_FUSE_BA = Param(
    "fuse_ba",
    (0, 1),
    1,
    "1: under matmul_decode.mmvf a decode row's beta and alpha projections (qwen35's "
    "ssm_beta, ssm_alpha: [Hv, C] each, one type) go through mmvf as one stacked [2 Hv, C] "
    "matrix, so the four input projections are one launch, not two; same rows, same dots",
    PUSHED,
)
_DN_MAX_DK = Param(
    "max_dk",
    (64, 128, 256),
    128,
    "register array per warp for a state column, max_dk / 32 per lane (must be >= the K head dim)",
    define(OWN, _STEP, _CLU),
)
# step_cluster / step_lanes: helper dn (issue 15), off until measured on the H200 (the 35B-A3B's
# delta_net_conv_step was 12.3 us a call, a chain of round trips over 2 MB of state).
_DN_STEP_CLUSTER = Param(
    "step_cluster",
    (0, 1, 2, 4),
    0,
    "with fuse_conv: 0 runs dn_step.cu's delta_net_conv_step (a warp per column, global "
    "tickets); n > 0 runs dn_clu.cu instead: a thread-block cluster per K head (its V heads x "
    "n blocks of dv / n columns), the gated norm summed through distributed shared memory "
    "(sm_90; H heads x n blocks); same expressions, the sums of squares in another order; "
    "dn_clu.cu is built only when it is not 0",
    define(_CLU),
)
_DN_STEP_LANES = Param(
    "step_lanes",
    (8, 16, 32),
    8,
    "with step_cluster: lanes per state column (each holds max_dk / lanes rows; a column's "
    "sums take log2(lanes) shuffles; a block is dv / step_cluster * lanes threads, <= 512)",
    define(_CLU),
)
_DN_CLUSTER_CC = Constraint(
    "delta_net.step_cluster != 0 needs compute capability >= 9.0 (thread-block clusters)",
    lambda cfg, dev: (
        int(cfg.knobs("delta_net").step_cluster) == 0
        or dev is None
        or int(dev.extra.get("cc", 0)) >= 90
    ),
)
_DN_DECODE = (  # the decode step's launch knobs
    _DN_FUSE, _DN_FUSE_CONV, _DN_FUSE_BA, _DN_STEP_CLUSTER, _DN_STEP_LANES,
)  # fmt: skip

REGISTRY.declare(
    B,
    "delta_net",
    [
        variant(
            "sequential",
            params=(_DN_WARPS, _DN_LAYOUT, _DN_MAX_DK, _DN_PREFETCH, *_DN_DECODE),
            constraints=(_DN_CLUSTER_CC,),
            source="cuda/delta_net.cu",
            numeric="order_only",
            doc="a warp per state column (lanes over its rows, in registers for the call), "
            "T tokens in sequence: decode and prefill; q/k L2 norm in the kernel",
        ),
        variant(
            "chunked",
            params=(
                _DN_WARPS,
                _DN_LAYOUT,
                _DN_MAX_DK,
                _DN_PREFETCH,
                *_DN_DECODE,
                delta_net_chunk(define()),
                Param(
                    "threads",
                    (64, 128, 256),
                    128,
                    "threads per block of the per-(chunk, head) pass (norms, A and P, the "
                    "triangular solve: a thread per column of [W | Y])",
                    PUSHED,
                ),
            ),
            constraints=(_DN_CLUSTER_CC,),
            source="cuda/delta_net_chunked.cu",
            # float32 like the sequential kernel, another summation order: a triangular solve
            # per chunk and the state carried chunk to chunk
            numeric="order_only",
            doc="prefill (T > 1) in chunks: a block per (chunk, head) solves (I + A)[W | Y] = "
            "[beta V | beta G K] and forms the masked Q K^T, then a warp per state column "
            "carries S across the T / chunk chunks; decode runs the sequential kernel",
        ),
    ],
    doc="gated delta-net scan (hybrid models); max_dk >= the K head dim",
)

# The decode DMMV's shape: moe.cu's and fuse_decode's moe_dec.cu's (and grouped's own).
_MOE_SHAPE = (
    Param("rows_per_block", (1, 2, 4, 8), 4, "expert rows per block", define()),
    Param("threads_per_row", (16, 32, 64, 128), 32, "threads per row", define()),
    Param(
        "vec",
        (1, 2),
        2,
        "consecutive 16-weight groups per thread per step (load width)",
        define(),
    ),
)


def _moe_dmmv(*builds: str, suffix: str = "") -> tuple[Param, ...]:
    """The dmmv knobs (_MOE_DECODE is defined below, read at call time), the shape's defines
    reaching ``builds``; ``suffix`` ends each doc."""
    shape = tuple(Param(p.name, p.choices, p.default, p.doc, define(*builds)) for p in _MOE_SHAPE)
    return tuple(replace(p, doc=p.doc + suffix) for p in (*shape, *_MOE_DECODE))


_MOE_DECODE = (
    Param(
        "fuse_decode",
        (0, 1),
        1,
        "1: a decode token's MoE FFN in three launches (moe_dec.cu, with this variant's rows, "
        "threads and vec): router logits + shared-expert gate logit + top-k in one, gate + up + "
        "SwiGLU of the chosen and the shared experts in one, down + weighted combine + gated "
        "shared expert + residual in one; 0: the op-by-op schedule (fifteen launches)",
        PUSHED,
    ),
    # on by default with route_vec, down_wsum, fuse_norm and delta_net.fuse_conv: H200,
    # 2026-12-01 (sixth session's early call, qwen35moe 35B-A3B synth, one process): tg128
    # 261.5 tok/s against 224.3 (llama.cpp 247.7), validate PASS (KLD 4.98e-5, the default's)
    Param(
        "route_vec",
        (0, 1),
        1,
        "fuse_decode's route: 1 reads an F32 router row (and the shared expert's gate row) "
        "with float4 loads, eight in flight per lane before the sums; 0: the scalar loop of "
        "the dense DMMV (another summation order: order_only either way)",
        PUSHED,
    ),
    # (on: see route_vec)
    Param(
        "fuse_norm",
        (0, 1),
        1,
        "fuse_decode's down kernel: 1 ends with the next layer's input RMSNorm of the new "
        "residual row (the token's last block, all its threads: rms_norm's one warp is "
        "latency-bound on a decode row), one launch per MoE layer fewer; 0: rms_norm after it",
        PUSHED,
    ),
    # (on: see route_vec)
    Param(
        "down_wsum",
        (0, 1),
        1,
        "fuse_decode's down kernel as a weighted sum per lane (moe_dec_down_w): each lane "
        "adds w_j times its share of every routed expert's row (four experts' loads in flight) "
        "and the gated shared expert's, then one reduction per output, instead of a reduction "
        "per expert with k + 1 rows' decodes held at once; another summation order",
        PUSHED,
    ),
    # topk_regs on by default: the same ids and weights as 0 by construction (same rounds,
    # comparisons and ties), so validate's verdict is 0's; H200, 2026-12-01 (helper moedec's
    # checkpoint, bench/bench_moe_dec.py at the 35B-A3B's shape): NMSE against NumPy 1.1e-14
    # with and without it (tests/engine/backends/cuda/test_cuda_moe_dec.py checks the bits, ties
    # included)
    Param(
        "topk_regs",
        (0, 1),
        1,
        "fuse_decode's route: 1 runs the last block's top-k on the token's logits loaded once "
        "into registers (all of a lane's loads in flight together; topk.cuh topk_row_regs), "
        "where 0 reads them from L2 again in each of the k rounds, a few at a time; same "
        "rounds, comparisons and ties: the same ids and weights",
        PUSHED,
    ),
    Param(
        "route_block",
        (0, 128, 256),
        0,
        "fuse_decode's route: 128 / 256 runs each router row (and the shared expert's gate "
        "row) in a block of that many threads (moe_dec_route_r: a lane's float4 loads in "
        "flight together, E + 1 blocks); 0: moe_dec_route, rows_per_block rows of "
        "threads_per_row lanes a block; F32 router rows only (else 0's kernel); another "
        "summation order",
        PUSHED,
    ),
    Param(
        "fuse_pre_norm",
        (0, 1),
        0,
        "fuse_decode's route: 1 folds the post-attention RMSNorm into it (moe_dec_route_rn: "
        "each router-row block takes the residual row's norm scale itself, rms_norm_row's "
        "sums in its order, block 0 stores the normed row for gate_up), one launch per MoE "
        "layer fewer; a block per router row of route_block threads (256 where route_block "
        "is 0); F32 routers (else the norm's own launch)",
        PUSHED,
    ),
    Param(
        "gate_up_pair",
        (0, 1),
        0,
        "fuse_decode's gate_up kernel: 1 loads each group's x once for the gate and up rows "
        "of an output (moe_dec_gate_up_p), where 0 loads it per row; fewer loads and "
        "registers for the same weight bytes; same sums in the same order, bit-identical",
        PUSHED,
    ),
    Param(
        "down_split",
        (0, 1),
        0,
        "fuse_decode's down kernel with a warp per expert slot (moe_dec_down_s): a block of "
        "k (+ 1 shared) warps owns rows_per_block outputs, each warp walks its slot's rows "
        "(their loads in flight together) and the block combines the warp sums; 9x the "
        "threads of moe_dec_down, each holding one row group, not k + 1 (threads_per_row, vec "
        "and down_wsum / down_vec1 do not apply to it); another summation order",
        PUSHED,
    ),
    Param(
        "down_vec1",
        (0, 1),
        0,
        "fuse_decode's down kernel: 1 walks the routed experts' short rows (F / 16 groups: 32 "
        "for a 35B-A3B's 512) one group per lane per step, so all threads_per_row lanes work "
        "where vec 2 leaves half of them idle; another summation order",
        PUSHED,
    ),
    # helper moe35 (seventh session): off until measured on the H200
    # (H200, moe35's checkpoint, one 35B-A3B layer, Q4_K down: 1 made gate_up 14.8 -> 16.4 us
    # and the split down 14.6 -> 13.3 (queued eager), the layer 30.07 -> 30.16 us: hence 2)
    Param(
        "dec_wide",
        (0, 1, 2),
        0,
        "fuse_decode's kernels (moe_dec.cu, qwide.cuh): 1 decodes a Q4_K group from its "
        "block's 16-byte header and 8 quant bytes (2 loads, not 8) and a Q6_K group from "
        "16-byte ql / qh / scale loads (4, not 18) in every kernel, 2 in the split and "
        "weighted-sum down kernels only (gate_up's lanes walk several groups, where the "
        "header's byte extraction costs more than the loads it saves); same weights, same "
        "sums: bit-identical (moe_dec.cu's DEC_WIDE define: moe.cu does not rebuild)",
        define(_MOE_DEC),
    ),
    Param(
        "dec_fcvt",
        (0, 1),
        0,
        "fuse_decode's kernels: 1 makes each quant byte a float by a byte permute and an FADD "
        "(qwide.cuh run_dot_x: the exact float 2^23 + v + 128 minus 2^23 + 128) where "
        "run_dot converts with I2F, a quarter-rate instruction, 16 a group (and dec_wide's "
        "scales the same way): the same floats in the same expressions, bit-identical "
        "(moe_dec.cu's DEC_FCVT define, as dec_wide)",
        define(_MOE_DEC),
    ),
    Param(
        "l2_prefetch",
        (0, 1),
        0,
        "fuse_decode's gate_up kernel: 1 has each block prefetch into L2 its share of the "
        "down matrices its slot's down pass reads (the chosen expert's, the shared one's), so "
        "the down kernel's loads meet L2 while gate_up, latency-bound, spends the spare "
        "bandwidth; a hint: bit-identical",
        PUSHED,
    ),
    Param(
        "split_occupancy",
        (0, 2, 3),
        0,
        "down_split's kernel where k + shared <= 9 warps: 3 runs moe_dec_down_s9, compiled "
        "for 3 blocks an SM (72 registers, where the compiler's 80 leave 2: 396 of a "
        "2048-wide layer's 512 blocks at once, not 264; it spills at rows_per_block 8); 2 runs "
        "moe_dec_down_s9r8, 8 outputs a block whatever rows_per_block, compiled for 2 blocks "
        "an SM (112 registers: the 256 blocks in one wave); 0: moe_dec_down_s; the same "
        "sums: bit-identical to moe_dec_down_s at the same outputs a block",
        PUSHED,
    ),
)

_MOE_DMMV = _moe_dmmv(_MOE, _MOE_DEC)
# tc's decode knobs: the same values, building moe.cu and moe_dec.cu (moe_tc.cu never sees
# them, so a decode knob's trial does not recompile the tensor-core kernels).
_MOE_DMMV_TC = _moe_dmmv(_MOE, _MOE_DEC, suffix=" (decode)")

# tc first: the default (fp16 tensor-core experts at prefill, 6.7x the per-pair DMMV at a
# 35b-a3b pp512 on the H200, 8.0x with wide_loads + direct). It failed validate on the realistic
# 35b-a3b until validate borrowed drift-explained routings (engine/verify): the kernel agrees
# with dmmv to NMSE 2.7e-7 on the reference's own inputs at every layer, and the failure was 6
# routing flips outside route_tie across 10 prompts, each with the router's logits within the
# fp16 op bound (scripts/moe_drift.py in git history, docs/verify.md). Its decode (T == 1), the
# per-token reference and chunks below prefill.gemm_min_t run dmmv's kernels at dmmv's knob
# defaults. grouped at decode is dmmv too (same kernels and knobs).
# mmvq: int8 activations (the looser numeric class), so never the default.
REGISTRY.declare(
    B,
    "moe_experts",
    [
        variant(
            "tc",
            params=(
                *_MOE_DMMV_TC,
                Param(
                    "tile_pairs",
                    (16, 32, 64),
                    32,
                    "routed (token, slot) pairs per tile: the n side of the tensor-core tile "
                    "(an expert's weight window is decoded once per tile; pairs past an "
                    "expert's count are zeros the mma still multiplies)",
                    define(),
                ),
                Param(
                    "block_rows",
                    (64, 128),
                    64,
                    "expert weight rows per block (4 warps of block_rows / 4): the m side",
                    define(),
                ),
                Param(
                    "q4k_window",
                    (0, 1),
                    0,
                    "1: a thread decodes a Q4_K row's whole 64-wide window (scales converted "
                    "once, 16-byte quant loads); 0: a 16-weight group per thread, as every "
                    "other type (same weights either way)",
                    define(),
                ),
                Param(
                    "wide_loads",
                    (0, 1),
                    1,
                    "1: Q4_K / Q6_K groups decoded from 16-byte loads (2 and 4 load "
                    "instructions, not 8 and 18: a warp's loads hit 8 rows' lines, so L1 "
                    "passes per instruction bound the narrow decoders); same weights",
                    define(),
                ),
                Param(
                    "direct",
                    (0, 1),
                    1,
                    "1: Q4_K experts (gate, up, down) decoded by each warp straight into its mma "
                    "fragments (k permuted alike in the staged x), no shared-memory weight "
                    "tile; same products, another summation order",
                    define(),
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/moe_tc.cu",
            # fp16 weights (decoded in the kernel) and activations into float32 accumulators
            numeric="fp16",
            doc="prefill chunks of >= prefill.gemm_min_t tokens (where the dense matmuls "
            "switch to fp16 GEMMs), block-type experts: the grouped variant's counting sort, "
            "then per tile of one expert's pairs gate + up + SwiGLU in one kernel and down in "
            "another on fp16 tensor cores (mma.sync), Q4_K / Q6_K / ... weights decoded into "
            "shared memory (no fp16 copy in device memory); shorter chunks, decode and float "
            "experts: the dmmv kernels",
        ),
        variant(
            "dmmv",
            params=_MOE_DMMV,
            quant_types=ALL_TYPES,
            source="cuda/moe.cu",
            numeric="order_only",
            doc="the decode DMMV per (token, chosen expert), the expert picked on the device "
            "from router_topk's ids (only chosen experts are read; graph-safe), SwiGLU, down, "
            "then a weighted sum per token (moe_combine)",
        ),
        variant(
            "grouped",
            params=(
                *_moe_dmmv(OWN, _MOE, _MOE_DEC),
                moe_tile_pairs(define()),
            ),
            quant_types=ALL_TYPES,
            source="cuda/moe_grouped.cu",
            numeric="order_only",
            doc="prefill (T > 1): a counting sort of the pairs by expert on the device into "
            "tiles, then the batched DMMV per (rows, tile) of the tile's expert on the sorted "
            "rows; decode: the dmmv kernels",
        ),
        variant(
            "mmvq",
            params=(
                Param(
                    "threads_per_row",
                    (8, 16, 32),
                    16,
                    "lanes splitting an expert row (a group inside one warp; shuffles, no barrier)",
                    define(),
                ),
                Param("warps", (1, 2, 4, 8), 4, "warps per block", define()),
            ),
            quant_types=ALL_TYPES,
            source="cuda/moe_q8.cu",
            numeric="int8_activations",
            doc="the routed experts on Q8_1 activations with integer dot products (mmvw's "
            "row split, vecdot.cuh): gate, up and SwiGLU of a pair in one launch, down on the "
            "quantized SwiGLU output, expert picked on the device (graph-safe); decode and "
            "prefill. Float experts (or gate and up of different types) use the dmmv kernels",
        ),
    ],
    doc="routed experts of a MoE FFN (gate, up, SwiGLU, down, combine)",
)

_THREADS = Param("threads", (128, 256, 512, 1024), 256, "threads per block", PUSHED)
_CONV_STEP = Param(
    "fuse_step",
    (0, 1),
    1,
    "1: a one-token call (decode) runs conv and state update as one kernel, a thread per "
    "channel (ssm_conv_step: one launch per delta-net layer fewer; same taps, bit-identical)",
    PUSHED,
)
_QK_PREP = Param(
    "fuse_qk",
    (0, 1),
    1,
    "1: a one-token call (decode) of a gated-attention layer runs the q / k RMSNorms, both "
    "partial RoPEs, the KV-cache write and the q / gate copies as one kernel (attn_qk_prep; "
    "same expressions, bit-identical) instead of seven launches",
    PUSHED,
)
_EXTRA = {"ssm_conv": (_CONV_STEP,), "rope_partial": (_QK_PREP,)}
for _op, _variant, _doc in [
    ("ssm_conv", "default", "causal depthwise conv1d + SiLU, a thread per output; then the state"),
    ("ssm_gates", "default", "softplus decay and sigmoid beta"),
    ("sigmoid_mul", "default", "x * sigmoid(gate), gate per element or per row"),
    ("rope_partial", "pairs", "neox RoPE of the first n_rot dims, angle in double"),
]:
    REGISTRY.declare(
        B,
        _op,
        [
            variant(
                _variant,
                params=(_THREADS, *_EXTRA.get(_op, ())),
                source="cuda/hybrid.cu",
                numeric="order_only",
                doc=_doc,
            )
        ],
    )

REGISTRY.declare(
    B,
    "router_topk",
    [
        variant(
            "default",
            params=(
                Param("rows_per_block", (1, 2, 4, 8), 4, "tokens (a warp each) per block", PUSHED),
            ),
            source="cuda/hybrid.cu",
            numeric="order_only",
            doc="softmax, top-k, renormalised: a warp per token (<= 1024 experts, k <= 32)",
        )
    ],
)
