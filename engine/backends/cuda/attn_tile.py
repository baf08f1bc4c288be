"""attention_decode.tile's host side (shaders/cuda/attn_tile.cu): which shapes the kernel takes
and its one launch per decode layer. CudaBackend.attention calls these; no CuPy import here.

The kernel cuts key ranges from the position on the device (a fixed grid of SPLITS x Hkv
blocks, the ones past the position's ranges exiting), so a captured decode graph serves every
position; the KV head's last range combines, so there is no second launch.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

KT = 32  # keys per shared-memory tile (attn_tile.cu)
HPW = 4  # q heads a warp holds at most


def tile_fits(H: int, Hkv: int, D: int, warps: int, max_tickets: int) -> bool:
    """attn_tile's limits: D % 32 == 0 (the swizzle and the Q8_1 blocks), D <= 256, a group
    of at most 4 q heads a warp and 32 a block, a ticket per KV head."""
    if Hkv <= 0 or H % Hkv:
        return False
    G = H // Hkv
    return D % 32 == 0 and D <= 256 and G <= min(32, HPW * warps) and Hkv <= max_tickets


def rope_args(rope: Any) -> tuple:
    """The last four arguments of a decode attention kernel that may rope (attn_gqa, attn_tile,
    attn_vec: fuse_rope): the _PendingQ's k, v, theta and neox, or nulls and zeros (None)."""
    if rope is None:
        return (np.uint64(0), np.uint64(0), np.float32(0), np.int32(0))
    return (rope.k, rope.v, np.float32(rope.theta), np.int32(1 if rope.neox else 0))


def smem_bytes(G: int, D: int, stages: int = 2) -> int:
    """q [G, D], stages x K and V tiles [KT, D] and fuse_rope's current K and V rows [D]:
    float32."""
    return 4 * (G + 2 * stages * KT + 2) * D


def ranges(L: int, splits: int, min_keys: int) -> tuple[int, int]:
    """(chunk, active ranges) for L keys: the kernel's own arithmetic, for tests and the
    bench's figures."""
    chunk = max(min_keys, math.ceil(math.ceil(L / splits) / KT) * KT)
    return chunk, math.ceil(L / chunk)


def launch_attn_tile(
    be: Any, q: Any, k: Any, v: Any, out: Any, pos0: int, c: Any, q8: bool, rope: Any = None
) -> tuple[Any, Any] | None:
    """attn_tile's launch of a decode row q [1, H, D] over the cache layer's k, v [S, Hkv, D]
    into out [1, H, D] (fuse_combine 0: then attn_combine's or, under q8, attn_combine_q8's);
    q8: also out's Q8_1 form, returned as (xq, xds) for the backend to remember (else None).
    be: the CudaBackend (its launch, buffers, position pointer). rope (fuse_rope): the
    backend's _PendingQ, q unroped; the kernel ropes q and k and writes the position's rows."""
    T, H, D = (int(s) for s in q.shape)
    Hkv = int(k.shape[1])
    splits, warps, fc = int(c.splits), int(c.warps), int(c.fuse_combine) == 1
    stages = int(c.stages)
    part = be._empty((T, H, splits, D))
    ml = be._empty((T, H, splits, 2))
    xq = xds = None
    if q8:
        xq, xds = be._q8_buffers(T, H * D)
    null = np.uint64(0)
    be._launch(
        "attn_tile", "attn_tile", (splits, Hkv), (32 * warps,),
        (
            be._aligned16(q), k, v, part, ml, np.int32(H), np.int32(Hkv), np.int32(D),
            np.int32(pos0), be._pos_ptr(), np.float32(1.0 / math.sqrt(D)),
            np.int32(int(c.min_keys)), np.int32(stages), out if fc else null,
            null if xq is None or not fc else xq, null if xds is None or not fc else xds,
            be._head_tickets, *rope_args(rope),
        ),
        smem=smem_bytes(H // Hkv, D, stages), pdl=True,
    )  # fmt: skip
    if not fc:
        be._attn_combine(part, ml, out, splits, xq, xds)
    return None if xq is None else (xq, xds)
