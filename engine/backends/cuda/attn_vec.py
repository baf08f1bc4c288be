"""attention_decode.vec's host side (shaders/cuda/attn_vec.cu): which shapes the kernel takes,
its range arithmetic and its one launch per decode layer. CudaBackend.attention calls these; no
CuPy import here.

The kernel keeps every K / V row of a warp's 8-key round in registers (no shared-memory tiles:
4 KiB of shared memory for the block's merge), scores them against the KV head's whole group at
once and cuts its key ranges from the position on the device (a fixed grid of SPLITS x Hkv
blocks, those past the position's ranges exiting), so one captured graph serves every position.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.backends.cuda.attn_tile import rope_args

KU = 8  # keys a warp loads and scores at once (attn_vec.cu)
VCL = 8  # blocks of a KV head's thread-block cluster under the cluster knob (attn_vec*_c)
GP_MAX = 8  # q heads of a KV group the kernel takes at most (attn_vec8)


def vec_fits(H: int, Hkv: int, D: int, max_tickets: int) -> bool:
    """attn_vec's limits: a lane holds 4 dims (D % 4 == 0, D <= 128), a group of at most 8 q
    heads, a ticket per KV head."""
    if Hkv <= 0 or H % Hkv:
        return False
    return D % 4 == 0 and D <= 128 and H // Hkv <= GP_MAX and Hkv <= max_tickets


def kernel_name(G: int, rope: bool = False, cluster: bool = False) -> str:
    """attn_vec4 for groups of up to 4 q heads (padded to 4), attn_vec8 up to 8; the _c builds
    under cluster, the _rope builds under fuse_rope."""
    base = "attn_vec4" if G <= 4 else "attn_vec8"
    return base + ("_c" if cluster else "") + ("_rope" if rope else "")


def rope_fits(D: int) -> bool:
    """fuse_rope's extra limit: a neox pair's halves start on float4 boundaries."""
    return D % 8 == 0


def ranges(L: int, splits: int, min_keys: int, warps: int) -> tuple[int, int]:
    """(chunk, active ranges) for L keys: the kernel's own arithmetic (chunks are whole rounds
    of warps x KU keys), for tests and the bench."""
    step = warps * KU
    chunk = math.ceil(max(min_keys, math.ceil(L / splits)) / step) * step
    return chunk, math.ceil(L / chunk)


def launch_attn_vec(
    be: Any, q: Any, k: Any, v: Any, out: Any, pos0: int, c: Any, q8: bool, rope: Any = None
) -> tuple[Any, Any] | None:
    """attn_vec's launch of a decode row q [1, H, D] over the cache layer's k, v [S, Hkv, D]
    into out [1, H, D] (fuse_combine 0: then attn_combine's or, under q8, attn_combine_q8's);
    q8: also out's Q8_1 form, returned as (xq, xds) for the backend to remember (else None).
    be: the CudaBackend (its launch, buffers, position pointer). rope (fuse_rope): the
    backend's _PendingQ, q unroped; the kernel ropes q and k and writes the position's rows."""
    T, H, D = (int(s) for s in q.shape)
    Hkv = int(k.shape[1])
    splits, warps, fc = int(c.splits), int(c.warps), int(c.fuse_combine) == 1
    cl = int(c.cluster) == 1
    xq = xds = None
    if q8:
        xq, xds = be._q8_buffers(T, H * D)
    null = np.uint64(0)
    if cl:  # a cluster of VCL ranges a KV head, merged in shared memory: no partials
        splits, fc = VCL, True
        part = ml = null
    else:
        part = be._empty((T, H, splits, D))
        ml = be._empty((T, H, splits, 2))
    be._launch(
        "attn_vec", kernel_name(H // Hkv, rope is not None, cl), (splits, Hkv), (32 * warps,),
        (
            be._aligned16(q), k, v, part, ml, np.int32(H), np.int32(Hkv), np.int32(D),
            np.int32(pos0), be._pos_ptr(), np.float32(1.0 / math.sqrt(D)),
            np.int32(int(c.min_keys)), out if fc else null,
            null if xq is None or not fc else xq, null if xds is None or not fc else xds,
            be._head_tickets, *rope_args(rope), np.int32(int(c.prefetch)),
        ),
        pdl=True,
    )  # fmt: skip
    if not fc:
        be._attn_combine(part, ml, out, splits, xq, xds)
    return None if xq is None else (xq, xds)
