"""The Vulkan backend's KV-cache write and attention dispatch, mixed into VulkanBackend:
split, online, flash and the cooperative-matrix variants (shaders/vulkan/attention*.comp).
"""

from __future__ import annotations

import math

import numpy as np

from engine.backends.base import KVCache
from engine.backends.vulkan.kernels import MAX_GROUPS
from engine.backends.vulkan.kernels import fold_groups as _fold
from engine.backends.vulkan.tensor import VkTensor
from engine.errors import UnsupportedError

KEY_SPLITS = 64  # attention_split.comp's MAX_SPLITS: the partials its merge weighs


class VkAttentionOps:
    """Methods of VulkanBackend (engine/backends/vulkan/backend.py): kv_write and attention."""

    def _kv_write(self, cache: KVCache, layer: int, k: VkTensor, v: VkTensor, pos0: int) -> None:
        k, v = self._as_tensor(k), self._as_tensor(v)
        T = k.shape[0]
        cache.check_room(pos0, T)
        ck, cv = cache.k[layer], cache.v[layer]
        row = math.prod(ck.shape[1:])
        if k.size != T * row or v.size != k.size:
            raise ValueError(f"kv_write: k {k.shape} / v {v.shape} against cache {ck.shape}")
        pipe, c = self._pipe("kv_write")
        n = k.size
        if n:
            self.stream.dispatch(
                pipe,
                (k.buf, v.buf, ck.buf, cv.buf, self.stream.dyn_buf),
                (ck.buf, cv.buf),
                (n, row, k.offset, v.offset, ck.offset, cv.offset, self.stream.dyn(pos0)),
                _fold(-(-n // int(c.wg_size))),
            )

    def _attention(self, q: VkTensor, cache: KVCache, layer: int, pos0: int) -> VkTensor:
        q = self._as_tensor(q)
        T, H, D = q.shape
        ck, cv = cache.k[layer], cache.v[layer]
        Hkv = ck.shape[1]
        pipe, c = self._pipe("attention")
        wg = int(c.wg_size)
        if D > 256 or D > 8 * wg:
            raise UnsupportedError(
                f"vulkan attention: head dim {D} needs D <= 256 and D <= 8 * wg_size ({wg})"
            )
        if H % Hkv:
            raise ValueError(f"attention: {H} query heads over {Hkv} kv heads")
        if pos0 + T > cache.capacity:
            raise ValueError(f"attention: positions up to {pos0 + T - 1} beyond the cache")
        out = self._new((T, H, D))
        if not T:
            return out
        bufs = (q.buf, ck.buf, cv.buf)
        offs = (H, Hkv, D, q.offset, ck.offset, cv.offset)
        scale = 1.0 / math.sqrt(D)
        if c.variant in ("coopmat", "flash") and T > 1 and D % 16 == 0 and D <= 128:
            flash, _ = self._pipe("attention.flash")  # tensor cores; decode takes split below
            bq = 64 if c.variant == "flash" else 16  # queries per workgroup
            chunk = int(c.key_chunk) if c.variant == "flash" else 0
            ns = min(KEY_SPLITS, -(-T // chunk)) if chunk else 1
            if ns > 1:  # from T, not pos0: the shader sizes the ranges (replays stay valid)
                return self._flash_split(q, bufs, offs, out, (T, H, D, ns, scale), pos0)
            self.stream.dispatch(
                flash,
                (*bufs, out.buf, self.stream.dyn_buf),
                (out.buf,),
                (*offs, out.offset, self.stream.dyn(pos0), T, scale),
                (H, -(-T // bq), 1),
            )
            return out
        if c.variant == "online":
            self.stream.dispatch(
                pipe,
                (*bufs, out.buf, self.stream.dyn_buf),
                (out.buf,),
                (*offs, out.offset, self.stream.dyn(pos0), scale),
                (H, T, 1),
            )
            return out
        # split: the number of key ranges is fixed per dispatch (never derived from pos0), so a
        # replayed decode graph stays valid; the shader sizes the ranges from the position.
        ns = int(c.splits if T == 1 else c.splits_prefill)
        if T > MAX_GROUPS:
            raise UnsupportedError(f"vulkan attention: {T} tokens in one call (max {MAX_GROUPS})")
        dst = out if ns == 1 else self._new((T, H, ns, D + 2))  # partials: m, s, acc[D]
        q8_out = T == 1 and D % 32 == 0 and self._int8_row(H * D)
        if ns > 1 and int(c.fuse_combine):
            return self._attention_fused(q, cache, layer, pos0, out, dst, ns, q8_out)
        self.stream.dispatch(
            pipe,
            (*bufs, dst.buf, self.stream.dyn_buf),
            (dst.buf,),
            (*offs, dst.offset, self.stream.dyn(pos0), ns, scale),
            (H, ns, T),
        )
        if ns > 1 and q8_out:
            # the merge stores out's Q8_1 form too: the o projection reads it
            q8 = self._new((self._q8_words(H * D),), np.int32)
            merge, _ = self._pipe("attention.merge_q8")
            self.stream.dispatch(
                merge,
                (dst.buf, out.buf, q8.buf),
                (out.buf, q8.buf),
                (H, D, ns, dst.offset, out.offset, q8.offset),
                (H, T, 1),
            )
            self._q8_remember(out, q8)
        elif ns > 1:
            merge, _ = self._pipe("attention.merge")
            self.stream.dispatch(
                merge, (dst.buf, out.buf), (out.buf,), (H, D, ns, dst.offset, out.offset), (H, T, 1)
            )
        return out

    def _flash_split(
        self, q: VkTensor, bufs: tuple, offs: tuple, out: VkTensor, dims: tuple, pos0: int
    ) -> VkTensor:
        """attention.key_chunk: the flash pass over ns key ranges into the split kernel's
        partials [T, H, ns, D + 2], then its merge into out. dims: T, H, D, ns, scale."""
        T, H, D, ns, scale = dims
        if T > MAX_GROUPS:
            raise UnsupportedError(f"vulkan attention: {T} tokens in one call (max {MAX_GROUPS})")
        part = self._new((T, H, ns, D + 2))
        split, _ = self._pipe("attention.flash_split")
        self.stream.dispatch(
            split,
            (*bufs, part.buf, self.stream.dyn_buf),
            (part.buf,),
            (*offs, part.offset, self.stream.dyn(pos0), T, scale, ns),
            (H, -(-T // 64), ns),
        )
        merge, _ = self._pipe("attention.merge")
        self.stream.dispatch(
            merge, (part.buf, out.buf), (out.buf,), (H, D, ns, part.offset, out.offset), (H, T, 1)
        )
        return out
