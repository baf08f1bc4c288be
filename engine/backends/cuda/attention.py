"""The CUDA backend's KV-cache write and attention launchers, mixed into CudaBackend:
attention_decode (split, split_kw, gqa, tile, vec) and attention_prefill's dispatch
(shaders/cuda/attention.cu, attn_decode.cu; tile and vec in attn_tile.py / attn_vec.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backends.base import KVCache
from engine.backends.cuda.attn_tile import launch_attn_tile, rope_args, tile_fits
from engine.backends.cuda.attn_vec import launch_attn_vec, rope_fits, vec_fits
from engine.backends.cuda.elementwise import _MAX_ARGMAX_ROWS

_NULL = np.uint64(0)


@dataclass
class _PendingQ:
    """attn_in's q under attention_decode.gqa's fuse_rope: the decode row's q [1, H, D], k and
    v [1, Hkv * D] as the projections left them (biases added), RoPE and the KV write not yet
    done; only attention() of the same cache, layer and position takes it (attn_gqa does both)."""

    q: Any
    k: Any
    v: Any
    cache: KVCache
    layer: int
    pos0: int
    theta: float
    neox: bool


class CudaAttentionOps:
    """Methods of CudaBackend (engine/backends/cuda/backend.py): kv_write and attention."""

    def _kv_write(self, cache: KVCache, layer: int, k: Any, v: Any, pos0: int) -> None:
        T = int(k.shape[0])
        cache.check_room(pos0, T)
        k = self._cp.ascontiguousarray(k)
        v = self._cp.ascontiguousarray(v)
        HD = int(k.size // T)
        th = int(self.config.knobs("kv_write").threads)
        self._launch(
            "elementwise",
            "kv_write",
            (self._grid1(T * HD, th),),
            (th,),
            (
                k,
                v,
                cache.k[layer],
                cache.v[layer],
                np.int32(T),
                np.int32(HD),
                np.int32(pos0),
                self._pos_ptr(),
            ),
        )

    def _q8_kept(self, out: Any, xq: tuple[Any, Any] | None) -> Any:
        """out [T, H, D] of an attn_tile / attn_vec launch, with the Q8_1 form the launch
        returned (None: it made none) remembered for the next matmul."""
        if xq is not None:
            T, H, D = (int(s) for s in out.shape)
            self._q8_remember(out.reshape(T, H * D), *xq)
        return out

    def _attn_args(self, q: Any, cache: KVCache, layer: int, pos0: int, *outs: Any) -> tuple:
        """attn_flash's and attn_split's arguments: q [T, H, D], the layer's k and v, ``outs``,
        then T, H, Hkv, D, pos0, the device position pointer and the softmax scale."""
        T, H, D = (int(s) for s in q.shape)
        Hkv = int(cache.k[layer].shape[1])
        dims = (np.int32(T), np.int32(H), np.int32(Hkv), np.int32(D), np.int32(pos0))
        scale = np.float32(1.0 / math.sqrt(D))
        return (q, cache.k[layer], cache.v[layer], *outs, *dims, self._pos_ptr(), scale)

    def _attention(self, q: Any, cache: KVCache, layer: int, pos0: int) -> Any:
        if isinstance(q, _PendingQ):  # attn_in left RoPE and the KV write to attn_gqa
            if q.cache is not cache or q.layer != layer or q.pos0 != pos0:
                raise ValueError("attention: a pending q of another cache, layer or position")
            out = self._empty(tuple(int(s) for s in q.q.shape))
            c = self.config.knobs("attention_decode")
            if c.variant in ("vec", "tile"):
                vec = c.variant == "vec"  # attn_vec stores the Q8_1 form only where D % 32 == 0
                q8 = self._int8_decode() and (not vec or int(q.q.shape[2]) % 32 == 0)
                launch = launch_attn_vec if vec else launch_attn_tile
                xq = launch(self, q.q, cache.k[layer], cache.v[layer], out, pos0, c, q8, rope=q)
                return self._q8_kept(out, xq)
            self._attn_gqa(q.q, cache, layer, pos0, out, c, self._int8_decode(), rope=q)
            return out
        q = self._cp.ascontiguousarray(q)
        T, H, D = (int(s) for s in q.shape)
        Hkv = int(cache.k[layer].shape[1])
        out = self._empty((T, H, D))
        if T == 1:
            c = self.config.knobs("attention_decode")
            q8 = self._int8_decode() and D % 32 == 0  # the o projection's Q8_1 input, fused
            if c.variant == "gqa" and self._gqa_fits(H, Hkv, D, int(c.warps)):
                self._attn_gqa(q, cache, layer, pos0, out, c, q8)
                return out
            if c.variant == "tile" and tile_fits(H, Hkv, D, int(c.warps), _MAX_ARGMAX_ROWS):
                xq = launch_attn_tile(self, q, cache.k[layer], cache.v[layer], out, pos0, c, q8)
                return self._q8_kept(out, xq)
            if c.variant == "vec" and vec_fits(H, Hkv, D, _MAX_ARGMAX_ROWS):
                xq = launch_attn_vec(self, q, cache.k[layer], cache.v[layer], out, pos0, c, q8)
                return self._q8_kept(out, xq)
            G = int(c.lanes_per_key) if c.variant == "split_kw" else 0
            G = G if G and D % (4 * G) == 0 and D <= 32 * G else 0  # else attn_split serves
            q = self._aligned16(q) if G else q  # float4 loads of q
            fc = bool(G) and int(c.fuse_combine) == 1 and H <= _MAX_ARGMAX_ROWS
            ke = bool(G) and int(c.kv_early) == 1
            self._attn_split(q, cache, layer, pos0, out, int(c.splits), int(c.warps), q8, G, fc, ke)
            return out
        c = self.config.knobs("attention_prefill")
        if c.variant in ("flash_tc", "gemm"):  # tensor cores: prefill.py
            self._attn_tc(q, cache, layer, pos0, out, c)
        elif c.variant == "flash" and D <= 128 and D % 4 == 0:
            bq, rpw = int(c.block_q), int(c.rows_per_warp)
            smem = 4 * (bq * D + 2 * 32 * (D + 4))
            self._launch(
                "attention",
                "attn_flash",
                (math.ceil(T / bq), H),
                ((bq // rpw) * 32,),
                self._attn_args(q, cache, layer, pos0, out),
                smem=smem,
            )
        else:
            splits = int(c.splits) if c.variant == "split" else 1
            warps = int(c.warps) if c.variant == "split" else 4
            self._attn_split(q, cache, layer, pos0, out, splits, warps)
        return out

    def _gqa_rope(self, heads: tuple[int, int, int]) -> bool:
        """attention_decode.gqa's (or .tile's) fuse_rope on a decode row its kernel takes."""
        c = self.config.knobs("attention_decode")
        if c.variant == "vec":
            fits = vec_fits(*heads, _MAX_ARGMAX_ROWS) and rope_fits(heads[2])
            return int(c.fuse_rope) == 1 and fits
        if c.variant == "tile":
            fits = tile_fits(*heads, int(c.warps), _MAX_ARGMAX_ROWS)
            return int(c.fuse_rope) == 1 and fits
        return (
            c.variant == "gqa"
            and int(c.fuse_rope) == 1
            and int(c.fuse_combine) == 1
            and self._gqa_fits(*heads, int(c.warps))
        )

    @staticmethod
    def _gqa_fits(H: int, Hkv: int, D: int, warps: int) -> bool:
        """attn_gqa's limits (attn_decode.cu): D % 4 == 0, D <= 256, a group of at most 4 q
        heads a warp and 32 a block; other shapes take attn_split."""
        G = H // Hkv
        return D % 4 == 0 and D <= 256 and G <= min(32, 4 * warps) and H % Hkv == 0

    def _attn_gqa(
        self,
        q: Any,
        cache: KVCache,
        layer: int,
        pos0: int,
        out: Any,
        c: Any,
        q8: bool,
        rope: _PendingQ | None = None,
    ) -> None:
        """attention_decode.gqa: a block per (key range, KV head) for the group's q heads, the
        KV head's last range combining (fuse_combine; + Q8_1 under int8 decode). rope: q, k
        unroped, the kernel ropes them and writes the position's k, v rows (fuse_rope)."""
        T, H, D = (int(s) for s in q.shape)
        Hkv = int(cache.k[layer].shape[1])
        splits, warps = int(c.splits), int(c.warps)
        fc = int(c.fuse_combine) == 1 and Hkv <= _MAX_ARGMAX_ROWS
        q8 = q8 and D % 32 == 0
        assert rope is None or fc, "fuse_rope needs fuse_combine (_gqa_rope)"
        part = self._empty((T, H, splits, D))
        ml = self._empty((T, H, splits, 2))
        xq = xds = None
        if fc and q8:
            xq, xds = self._q8_buffers(T, H * D)
        # K / V tiles and q; the combine reuses it for the group's (max, sum) pairs
        smem = 4 * max(2 * 32 * (D + 4) + (H // Hkv) * D, 2 * (H // Hkv) * splits)
        self._launch(
            "attn_decode", "attn_gqa", (splits, Hkv), (32 * warps,),
            (
                self._aligned16(q), cache.k[layer], cache.v[layer], part, ml, np.int32(H),
                np.int32(Hkv), np.int32(D), np.int32(pos0), self._pos_ptr(),
                np.float32(1.0 / math.sqrt(D)), out if fc else _NULL,
                _NULL if xq is None else xq, _NULL if xds is None else xds,
                self._head_tickets, np.int32(int(c.early)), *rope_args(rope),
            ),
            smem=smem, pdl=True,
        )  # fmt: skip
        if fc:
            if xq is not None:
                self._q8_remember(out.reshape(T, H * D), xq, xds)
            return
        xq, xds = self._q8_buffers(T, H * D) if q8 else (None, None)
        self._attn_combine(part, ml, out, splits, xq, xds)
        if xq is not None:
            self._q8_remember(out.reshape(T, H * D), xq, xds)

    def _attn_split(
        self,
        q: Any,
        cache: KVCache,
        layer: int,
        pos0: int,
        out: Any,
        splits: int,
        warps: int,
        q8: bool = False,
        lanes_per_key: int = 0,
        fuse_combine: bool = False,
        kv_early: bool = False,
    ) -> None:
        T, H, D = (int(s) for s in q.shape)
        Hkv = int(cache.k[layer].shape[1])
        part = self._empty((T, H, splits, D))
        ml = self._empty((T, H, splits, 2))
        if lanes_per_key:  # decode (T == 1): several keys per warp step
            xq = xds = None
            if fuse_combine and q8:
                xq, xds = self._q8_buffers(T, H * D)
            self._launch(
                "attention", "attn_split_kw", (splits, H), (32 * warps,),
                (
                    q, cache.k[layer], cache.v[layer], part, ml, np.int32(H), np.int32(Hkv),
                    np.int32(D), np.int32(lanes_per_key), np.int32(pos0), self._pos_ptr(),
                    np.float32(1.0 / math.sqrt(D)), out if fuse_combine else _NULL,
                    _NULL if xq is None else xq, _NULL if xds is None else xds,
                    self._head_tickets, np.int32(1 if kv_early else 0),
                ),
                smem=4 * warps * (D + 2), pdl=True,
            )  # fmt: skip
            if fuse_combine:  # the kernel's last range per head combined into out
                if xq is not None:
                    self._q8_remember(out.reshape(T, H * D), xq, xds)
                return
        else:
            self._launch(
                "attention",
                "attn_split",
                (splits, H, T),
                (32 * warps,),
                self._attn_args(q, cache, layer, pos0, part, ml),
                smem=4 * warps * (D + 2),
            )
        # q8: combine and quantize, out's Q8_1 form for the next matmul, no extra launch
        xq, xds = self._q8_buffers(T, H * D) if q8 else (None, None)
        self._attn_combine(part, ml, out, splits, xq, xds)
        if xq is not None:
            self._q8_remember(out.reshape(T, H * D), xq, xds)

    def _attn_combine(
        self, part: Any, ml: Any, out: Any, splits: int, xq: Any = None, xds: Any = None
    ) -> None:
        """Split decode attention's combine of the per-range partials part [T, H, splits, D]
        and their (max, sum) ml into out [T, H, D]; with xq / xds also out's Q8_1 form."""
        T, H, D = (int(s) for s in out.shape)
        dims = (np.int32(H), np.int32(D), np.int32(splits))
        if xq is not None:
            self._launch(
                "fused", "attn_combine_q8", (H, T), (min(128, max(32, D)),),
                (part, ml, out, xq, xds, *dims), pdl=True,
            )  # fmt: skip
        else:
            self._launch(
                "attention", "attn_combine", (H, T), (min(128, max(32, D)),), (part, ml, out, *dims)
            )
