"""The Vulkan backend's mixture-of-experts ops, mixed into VulkanBackend: the router's top-k and
the expert matmuls (a matvec per routed row, or rows grouped by expert through a GEMM).
"""

from __future__ import annotations

import numpy as np

from engine.backends.vulkan.kernels import fold_groups as _fold
from engine.backends.vulkan.tensor import VkTensor, VkWeight


class VkMoeOps:
    """Methods of VulkanBackend (engine/backends/vulkan/backend.py): router and experts."""

    def _router_topk(self, logits: VkTensor, k: int) -> tuple[VkTensor, VkTensor]:
        logits = self._as_tensor(logits)
        T, E = logits.shape
        if E > 1024 or not 0 < k <= min(E, 32):
            raise ValueError(f"router_topk: {E} experts (<= 1024), k {k} (<= 32)")
        ids, w = self._new((T, k), np.int32), self._new((T, k))
        pipe, _ = self._pipe("router_topk")
        self.stream.dispatch(
            pipe,
            (logits.buf, ids.buf, w.buf),
            (ids.buf, w.buf),
            (T, E, k, logits.offset, ids.offset, w.offset),
            _fold(T),
        )
        return ids, w

    def _moe_matvec(self, w: VkWeight, x: VkTensor, ids: VkTensor, x_div: int) -> VkTensor:
        """y[p, n] = expert ids[p] of w, row n, . x[p / x_div] -> [pairs, N]."""
        E, N, Kw = w.shape
        if len(w.parts) != 1 or x.shape[-1] != Kw:
            raise ValueError(f"moe: {w.name} {w.shape} (one buffer) against x {x.shape}")
        pairs = ids.size
        out = self._new((pairs, N))
        pipe, c = self._pipe("moe_experts", w.qtype)
        blocks = -(-N // int(c.rows_per_wg))
        self.stream.dispatch(
            pipe,
            (w.parts[0][0].buf, x.buf, ids.buf, out.buf),
            (out.buf,),
            (Kw, N, w.row_bytes, x.offset, out.offset, ids.offset, blocks, x_div),
            _fold(pairs * blocks),
        )
        return out

    def _moe_route(self, ids: VkTensor, E: int, qtype: str) -> tuple[VkTensor, int]:
        """moe_grouped.comp PASS_SORT: the (token, slot) pairs sorted by expert and cut into
        tiles of tile_pairs -> (route [n_tiles, tiles, order] int32, the bound on tiles). The
        pass reads no weights; like every pass of a weighted op it is built per weight type."""
        P = ids.size
        c = self.config.knobs("moe_experts")
        if E > 1024:
            raise ValueError(f"moe_experts.grouped: {E} experts (<= 1024)")
        max_tiles = -(-P // int(c.tile_pairs)) + min(E, P)
        route = self._new((1 + 3 * max_tiles + P,), np.int32)
        pipe, _ = self._pipe("moe_experts.sort", qtype)
        self.stream.dispatch(
            pipe,
            (ids.buf, route.buf),
            (route.buf,),
            (P, E, ids.offset, route.offset, max_tiles),
            (1, 1, 1),
        )
        return route, max_tiles

    def _moe_gemm(
        self, w: VkWeight, x: VkTensor, route: tuple[VkTensor, int], pairs: int, x_div: int
    ) -> VkTensor:
        """y[p, n] = expert of pair p in w, row n, . x[p / x_div], as grouped tiles -> [P, N]."""
        E, N, Kw = w.shape
        if len(w.parts) != 1 or x.shape[-1] != Kw:
            raise ValueError(f"moe: {w.name} {w.shape} (one buffer) against x {x.shape}")
        r, max_tiles = route
        out = self._new((pairs, N))
        pipe, c = self._pipe("moe_experts.gemm", w.qtype)
        self.stream.dispatch(
            pipe,
            (w.parts[0][0].buf, x.buf, r.buf, out.buf),
            (out.buf,),
            (Kw, N, w.row_bytes, x.offset, out.offset, r.offset, max_tiles, x_div),
            (-(-N // int(c.wg_size)), max_tiles, 1),
        )
        return out

    def _moe_experts(
        self,
        x: VkTensor,
        ids: VkTensor,
        weights: VkTensor,
        gate: VkWeight,
        up: VkWeight,
        down: VkWeight,
    ) -> VkTensor:
        x = self._as_tensor(x)
        T, C = x.shape
        k = ids.shape[-1]
        if self.config.knobs("moe_experts").variant == "grouped" and T > 1:
            route = self._moe_route(ids, gate.shape[0], gate.qtype)
            h = self.ops.swiglu(
                self._moe_gemm(gate, x, route, ids.size, k),
                self._moe_gemm(up, x, route, ids.size, k),
            )
            d = self._moe_gemm(down, h, route, ids.size, 1)  # [T * k, C]
        else:
            h = self.ops.swiglu(self._moe_matvec(gate, x, ids, k), self._moe_matvec(up, x, ids, k))
            d = self._moe_matvec(down, h, ids, 1)  # [T * k, C]
        out = self._new((T, C))
        pipe, c = self._pipe("moe_experts.merge", down.qtype)
        self.stream.dispatch(
            pipe,
            (d.buf, weights.buf, out.buf),
            (out.buf,),
            (T, C, k, d.offset, weights.offset, out.offset),
            _fold(-(-T * C // int(c.wg_size))),
        )
        return out
