"""CUDA attention: decode (split, gqa, tile, ...) and prefill (flash, gemm, tc)."""

from __future__ import annotations

from engine.tuning.registry import HOST, PUSHED, REGISTRY, Param, define, variant
from engine.tuning.variants.cuda.common import B, _cc_at_least, _knob_needs_cc, _while_chosen


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


# split's key ranges and warps (attention_decode.split and .split_kw; prefill's split: the warps)
_SPLITS = Param("splits", (1, 2, 4, 8, 16, 32), 8, "key ranges per head (split-KV)", PUSHED)
_SPLIT_WARPS = Param("warps", (1, 2, 4, 8), 4, "warps per key range", PUSHED)


def _fuse_rope(when: str, how: str, needs: str = "") -> Param:
    """attention_decode's fuse_rope (gqa, tile, vec): the decode kernel does rope_kv's work."""
    return Param(
        "fuse_rope",
        (0, 1),
        0,
        f"1{when}: q and k RoPE and the current position's KV-cache write done by the attention "
        f"kernel from the q/k/v projections' outputs (rope_kv's arithmetic{how}; no rope / "
        f"rope_kv / kv_write launch{needs})",
        HOST,
    )


REGISTRY.declare(
    B,
    "attention_decode",
    [
        variant(
            "split",
            params=(
                _SPLITS,
                _SPLIT_WARPS,
            ),
            source="cuda/attention.cu",
            numeric="order_only",
            doc="split-KV online softmax + combine; position read on the device (graph-safe)",
        ),
        variant(
            "split_kw",
            params=(
                _SPLITS,
                _SPLIT_WARPS,
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
        variant(
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
                _fuse_rope(" (with fuse_combine)", ""),
            ),
            source="cuda/attn_decode.cu",
            numeric="order_only",
            doc="one block per (key range, KV head) for all q heads of the group: K and V read "
            "once per group into shared memory 32 keys at a time, lane = key for the scores, "
            "lane = 4 (8) dims for P.V; same partials and combine as split (head dim <= 256, "
            "D % 4 == 0)",
        ),
        variant(
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
                _fuse_rope("", ", while the tiles load"),
            ),
            source="cuda/attn_tile.cu",
            numeric="order_only",
            doc="a block per (KV head, key range cut from the position at run time) for all q "
            "heads of the group: 32-key K/V tiles by cp.async in two stages (the next tile in "
            "flight while one is computed), swizzled shared rows, lane = key for the scores, "
            "lane = 4 dims for P.V; one range writes out, more ranges combine in the KV head's "
            "last block (+ Q8_1 under int8 decode): one launch (D % 32 == 0, D <= 256)",
        ),
        variant(
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
                _fuse_rope("", ", each lane its own dims' angles", "; head dim % 8 == 0"),
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
            constraints=(_knob_needs_cc("attention_decode", "vec", "cluster", 90),),
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
REGISTRY.declare(
    B,
    "attention_prefill",
    [
        variant(
            "flash",
            params=(
                Param(
                    "block_q",
                    (8, 16, 32, 64),
                    16,
                    "query tokens per block",
                    define(),
                    edge=True,
                ),
                Param("rows_per_warp", (1, 2, 4, 8), 4, "query tokens per warp", define()),
            ),
            constraints=(
                _while_chosen(
                    "attention_prefill",
                    "flash",
                    "block_q / rows_per_warp warps, between 1 and 32",
                    lambda k, dev: 1 <= int(k.block_q) // int(k.rows_per_warp) <= 32,
                ),
            ),
            source="cuda/attention.cu",
            numeric="order_only",
            doc="tiled flash attention in shared memory (head dim <= 128; else the split kernel)",
        ),
        variant(
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
        variant(
            "flash_tc",
            params=(
                Param(
                    "block_q",
                    (32, 64, 128),
                    64,
                    "query rows per block, 16 per warp",
                    define(),
                    edge=True,
                ),
                Param("block_k", (32, 64, 128), 64, "keys per shared-memory tile", define()),
            ),
            constraints=(
                _cc_at_least(80),
                _while_chosen(
                    "attention_prefill",
                    "flash_tc",
                    "flash_tc's shared tiles (block_q + 2 * block_k) x 136 halves fit a block",
                    lambda k, dev: (
                        dev is None
                        or not dev.extra.get("smem_per_block_optin")  # unknown: Ampere+ has 99K
                        or (int(k.block_q) + 2 * int(k.block_k)) * 136 * 2
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
        variant(
            "split",
            params=(
                Param("splits", (1, 2, 4, 8), 1, "key ranges per query", PUSHED),
                _SPLIT_WARPS,
            ),
            source="cuda/attention.cu",
            numeric="order_only",
            doc="the decode kernel per query token (no key reuse across queries)",
        ),
    ],
)
