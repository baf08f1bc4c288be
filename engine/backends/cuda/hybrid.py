"""The hybrid ops of the CUDA backend (qwen35 / qwen35moe / qwen3next; engine/hybrid.py), mixed
into CudaBackend: the op contract of engine.backends.base on shaders/cuda/delta_net.cu (the scan;
delta_net_chunked.cu its chunked prefill form), moe.cu (expert DMMV) and hybrid.cu (conv, gates,
sigmoid gate, partial RoPE, router, combine).

Everything stays on the device and nothing synchronizes, so a hybrid decode step is captured
as a CUDA graph like a dense one: the router's expert ids are read by the expert kernels on the
device, positions come from the device pointer while capturing, and the recurrent state (conv
inputs and S per delta-net layer) is updated in place in the HybridCache.

Shapes as in engine.backends.numpy_hybrid: T tokens, Hk q/k heads of dk, Hv value heads of dv,
Cc conv channels, E experts, F expert width, C model width.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backends.cuda import kernels
from engine.backends.cuda.kernels import QTYPE_SUFFIX
from engine.backends.cuda.moe_dec import CudaMoeDecodeOps
from engine.backends.cuda.moe_tc import MAX_TILES, CudaMoeTcOps, tc_ok, tc_tiles
from engine.backends.plan import DnGatedIn
from engine.tuning.variants.cuda import CUDA_BLOCK_TYPES as _MMVW  # the types mmvw.cu decodes

MAX_CONV = 8  # hybrid.cu ssm_conv_state keeps K - 1 <= 7 inputs per channel in registers
MAX_EXPERTS = 1024  # router_topk: 32 per lane
MAX_TOPK = 32  # router_topk: one chosen logit per lane
MAX_PAIRS = 65535  # moe.cu: pairs on grid z per launch (moe_grouped.cu: tiles)
MOE_SORT_THREADS = 1024  # moe_grouped.cu moe_sort: one block
MAX_DN_HEADS = 1024  # dn_step.cu: one ticket per V head
DN_CLU_THREADS = 512  # dn_clu.cu DNC_THREADS: its __launch_bounds__
MAX_PREP_D = 512  # hybrid.cu attn_qk_prep: a head row in shared memory
PREP_WARPS = 4  # hybrid.cu ATTN_PREP_WARPS: heads per block


@dataclass
class _Stacked:
    """Two block-type weights' rows stacked (delta_net.fuse_ba): what mmvf reads of a weight."""

    name: str
    qtype: str
    shape: tuple[int, int]
    raw: Any

    @property
    def n(self) -> int:
        return self.shape[0]

    @property
    def k(self) -> int:
        return self.shape[1]

    @property
    def row_bytes(self) -> int:
        return int(self.raw.shape[1])


def _suffix(qtype: str) -> str:
    return QTYPE_SUFFIX[qtype]


def _q8_ok(w: Any) -> bool:
    """moe_q8.cu decodes w: a stacked block-type weight whose rows split into its slots."""
    K = int(w.shape[-1])
    return (
        len(w.shape) == 3
        and w.raw is not None
        and w.qtype in _MMVW
        and K % (256 if w.qtype in ("Q4_K", "Q6_K") else 32) == 0
    )


def _max_tiles(pairs: int, experts: int, choice: Any) -> int:
    """moe_grouped.cu's tiles of P pairs at most: each expert's last tile may be partial."""
    return math.ceil(pairs / int(choice.tile_pairs)) + min(experts, pairs)


def _gated_args_fit(gated: DnGatedIn, Hv: int, dk: int, dv: int) -> bool:
    """A decode token's gate inputs (a, b, dt_bias, ssm_a: Hv values each), the norm weight (dv),
    z (Hv * dv) and a C-contiguous state of Hv * dk * dv: what dn_step.cu's fused kernels
    take."""
    g = gated
    return (
        int(g.a.size) == Hv
        and int(g.b.size) == Hv
        and int(g.dt_bias.f32.size) == Hv
        and int(g.ssm_a.f32.size) == Hv
        and g.norm.f32 is not None
        and int(g.norm.f32.size) == dv
        and int(g.z.size) == Hv * dv
        and int(g.state.size) == Hv * dk * dv
        and bool(g.state.flags.c_contiguous)
    )


class CudaHybridOps(CudaMoeTcOps, CudaMoeDecodeOps):  # moe_tc.py, moe_ffn: moe_dec.py
    """Hybrid ops of CudaBackend (needs its _launch, _empty, _grid1, _pos_ptr, _mmvw, config)."""

    _cp: Any
    config: Any

    def _threads(self, op: str) -> int:
        return int(self.config.knobs(op).threads)

    def _contig(self, x: Any, dtype: Any = np.float32) -> Any:
        return self._cp.ascontiguousarray(x, dtype=dtype)

    def _matmuls(self, x: Any, ws: tuple[Any, ...]) -> tuple[Any, ...]:
        """Under matmul_decode.mmvw a decode row's block-type projections go three to a launch
        (mmvw.cu, one Q8_1 form of x); under mmvf (mmvf.cu) likewise on the float row; other
        types, and prefill, through matmul."""
        if int(x.shape[0]) == 1 and self._mmvf_on():
            return self._mmvf_many(x, ws)
        if int(x.shape[0]) != 1 or self.config.knobs("matmul_decode").variant != "mmvw":
            return tuple(self.ops.matmul(x, w) for w in ws)
        x = self._decode_row(x)
        K = int(x.shape[1])
        outs: list[Any] = [None] * len(ws)
        wide = [i for i, w in enumerate(ws) if w.raw is not None and w.qtype in _MMVW and w.k == K]
        for j in range(0, len(wide), 3):
            group = wide[j : j + 3]
            for i in group:
                outs[i] = self._empty((1, ws[i].n))
            self._mmvw(x, [(ws[i], outs[i], None) for i in group])
        return tuple(
            self.ops.matmul(x, w) if y is None else y for w, y in zip(ws, outs, strict=True)
        )

    def _ssm_in(self, x: Any, ws: tuple[Any, ...]) -> tuple[Any, ...]:
        """Under matmul_decode.float_ssm_in an int8 decode row's delta-net input projections
        take the float dmmv path (the registry default's kernel), the rest stays int8."""
        dec = self.config.knobs("matmul_decode")
        if len(ws) == 4 and int(self.config.knobs("delta_net").fuse_ba):
            stack = self._ba_stack(ws[2], ws[3])
            if stack is not None and self._mmvf_ok(x, ws):
                return self._ssm_in_ba(x, ws, stack)
        if (
            int(x.shape[0]) != 1
            or dec.variant not in ("mmvq", "mmvw")  # the float variants (mmvf, dmmv): as is
            or not int(dec.float_ssm_in)
        ):
            return self.ops.matmuls(x, ws)
        x = self._decode_row(x)
        outs = []
        for w in ws:
            y = self._empty((1, w.n))
            self._dmmv("decode", kernels.DECODE_FALLBACK_KNOBS, x, w, y, cols=1)
            outs.append(y)
        return tuple(outs)

    def _ba_stack(self, beta: Any, alpha: Any) -> Any:
        """delta_net.fuse_ba's [beta; alpha] rows (one type and shape, block weights): made at
        the first call outside a graph capture (a prefill's, before the decode graph: a copy
        made while capturing would be a node of the graph, not done), None until then."""
        stacks = self.__dict__.setdefault("_ba_stacks", {})
        key = (id(beta), id(alpha))
        hit = stacks.get(key)
        if hit is not None and hit[1]() is beta and hit[2]() is alpha:
            return hit[0]
        if (
            self._capturing
            or beta.raw is None
            or alpha.raw is None
            or len(beta.shape) != 2
            or tuple(beta.shape) != tuple(alpha.shape)
            or beta.qtype != alpha.qtype
            or beta.row_bytes != alpha.row_bytes
        ):
            return None
        n = int(beta.shape[0])
        raw = self._empty((2 * n, beta.row_bytes), np.uint8)
        raw[:n], raw[n:] = beta.raw, alpha.raw
        stack = _Stacked(beta.name + "+alpha", beta.qtype, (2 * n, int(beta.shape[1])), raw)
        drop = lambda _: stacks.pop(key, None)  # noqa: E731 - a weight gone: its stack too
        stacks[key] = (stack, weakref.ref(beta, drop), weakref.ref(alpha, drop))
        return stack

    def _ssm_in_ba(self, x: Any, ws: tuple[Any, ...], stack: Any) -> tuple[Any, ...]:
        """qkv, z and the [beta; alpha] stack in one mmvf launch; beta and alpha come back as
        views of the stacked product (the same rows' float32 dots as two matrices)."""
        qkv, z = ws[0], ws[1]
        x = self._decode_row(x)
        n = stack.n // 2
        yq, yz, yba = self._empty((1, qkv.n)), self._empty((1, z.n)), self._empty((1, 2 * n))
        self._mmvf(x, [(qkv, yq, None), (z, yz, None), (stack, yba, None)])
        return yq, yz, yba[:, :n], yba[:, n:]

    def _rope_partial(self, x: Any, pos0: int, theta: float, n_rot: int) -> Any:
        x = self._contig(x)
        T, H, D = (int(s) for s in x.shape)
        if n_rot % 2 or not 0 < n_rot <= D:
            raise ValueError(f"rope_partial: {n_rot} rotated dims of a head of {D}")
        out = self._empty(x.shape)
        n = T * H * (n_rot // 2 + D - n_rot)
        if n:
            th = self._threads("rope_partial")
            self._launch(
                "hybrid", "rope_partial", (self._grid1(n, th),), (th,),
                (x, out, np.int32(T), np.int32(H), np.int32(D), np.int32(n_rot), np.int32(pos0),
                 self._pos_ptr(), np.float32(theta)), pdl=True,
            )  # fmt: skip
        return out

    def _attn_qk_prep(
        self,
        qg: Any,
        k: Any,
        v: Any,
        q_norm: Any,
        k_norm: Any,
        eps: float,
        cache: Any,
        layer: int,
        pos0: int,
        theta: float,
        n_rot: int,
    ) -> tuple[Any, Any]:
        """Under rope_partial.fuse_qk a one-token call is hybrid.cu's attn_qk_prep: both
        norms, both RoPEs, the cache write and the q / gate copies in one launch."""
        T, H, D2 = (int(s) for s in qg.shape)
        D = D2 // 2
        Hkv = int(k.shape[1]) if k.ndim == 3 else 0
        if (
            T != 1
            or not int(self.config.knobs("rope_partial").fuse_qk)
            or D2 % 2
            or not 0 < D <= MAX_PREP_D
            or n_rot % 2
            or not 0 < n_rot <= D
            or tuple(k.shape) != (1, Hkv, D)
            or tuple(v.shape) != (1, Hkv, D)
            or int(q_norm.f32.size) != D
            or int(k_norm.f32.size) != D
            or pos0 + 1 > cache.capacity
            or tuple(cache.k[layer].shape[1:]) != (Hkv, D)
        ):
            return super()._attn_qk_prep(  # type: ignore[misc]
                qg, k, v, q_norm, k_norm, eps, cache, layer, pos0, theta, n_rot
            )
        qg, k, v = self._contig(qg), self._contig(k), self._contig(v)
        q, gate = self._empty((1, H, D)), self._empty((1, H, D))
        self._fused_ran("rope_partial")
        self._launch(
            "hybrid", "attn_qk_prep", (math.ceil((H + Hkv) / PREP_WARPS),), (32 * PREP_WARPS,),
            (qg, k, v, q_norm.f32, k_norm.f32, q, gate, cache.k[layer], cache.v[layer],
             np.int32(H), np.int32(Hkv), np.int32(D), np.int32(n_rot), np.int32(pos0),
             self._pos_ptr(), np.float32(theta), np.float32(eps)), pdl=True,
        )  # fmt: skip
        return q, gate

    def _sigmoid_mul(self, gate: Any, x: Any) -> Any:
        gate, x = self._contig(gate), self._contig(x)
        n = int(x.size)
        if gate.shape == x.shape:
            div = 1
        elif x.ndim and int(gate.size) * int(x.shape[-1]) == n:  # one gate per row
            div = int(x.shape[-1])
        else:
            raise ValueError(f"sigmoid_mul: gate {gate.shape} against {x.shape}")
        out = self._empty(x.shape)
        if n:
            th = self._threads("sigmoid_mul")
            self._launch(
                "hybrid", "sigmoid_mul", (self._grid1(n, th),), (th,),
                (gate, x, out, np.int64(n), np.int32(div)), pdl=True,
            )  # fmt: skip
        return out

    def _ssm_conv(self, x: Any, state: Any, w: Any) -> Any:
        x = self._contig(x)
        T, Cc = (int(s) for s in x.shape)
        Cw, K = (int(s) for s in w.shape)
        if w.qtype != "F32" or w.raw is None or Cw != Cc or not 1 <= K <= MAX_CONV:
            raise ValueError(
                f"ssm_conv: {w.name} must be an F32 [{Cc}, K <= {MAX_CONV}] matrix, got "
                f"{w.qtype} {w.shape}"
            )
        if int(state.size) != (K - 1) * Cc or not state.flags.c_contiguous:
            raise ValueError(f"ssm_conv: a contiguous state of [{K - 1}, {Cc}], got {state.shape}")
        wf = w.raw.view(np.float32)  # [Cc, K]: F32 rows are the floats themselves
        out = self._empty((T, Cc))
        if T == 0:
            return out
        th = self._threads("ssm_conv")
        if T == 1 and K > 1 and int(self.config.knobs("ssm_conv").fuse_step):
            self._launch(
                "hybrid", "ssm_conv_step", (math.ceil(Cc / th),), (th,),
                (x, state, wf, out, np.int32(Cc), np.int32(K)), pdl=True,
            )  # fmt: skip
            return out
        self._launch(
            "hybrid", "ssm_conv", (self._grid1(T * Cc, th),), (th,),
            (x, state, wf, out, np.int32(T), np.int32(Cc), np.int32(K)), pdl=True,
        )  # fmt: skip
        if K > 1:  # after the conv has read the old state (same stream)
            self._launch(
                "hybrid", "ssm_conv_state", (math.ceil(Cc / th),), (th,),
                (x, state, np.int32(T), np.int32(Cc), np.int32(K)), pdl=True,
            )  # fmt: skip
        return out

    def _ssm_gates(self, a: Any, b: Any, dt_bias: Any, ssm_a: Any) -> tuple[Any, Any]:
        a, b = self._contig(a), self._contig(b)
        Hv = int(a.shape[-1])
        if b.shape != a.shape or int(dt_bias.f32.size) != Hv or int(ssm_a.f32.size) != Hv:
            raise ValueError(f"ssm_gates: a {a.shape}, b {b.shape} against {Hv} heads")
        g, beta = self._empty(a.shape), self._empty(a.shape)
        n = int(a.size)
        if n:
            th = self._threads("ssm_gates")
            self._launch(
                "hybrid", "ssm_gates", (self._grid1(n, th),), (th,),
                (a, b, dt_bias.f32, ssm_a.f32, g, beta, np.int64(n), np.int32(Hv)), pdl=True,
            )  # fmt: skip
        return g, beta

    def _delta_net(
        self,
        q: Any,
        k: Any,
        v: Any,
        g: Any,
        beta: Any,
        state: Any,
        v_order: str,
        eps: float,
    ) -> Any:
        """The base contract; state [Hv, dk, dv] holds S or, with state_transposed, S^T (a
        cache written under one layout must be read under the same one)."""
        q, k, v, g, beta = (self._contig(t) for t in (q, k, v, g, beta))
        T, Hk, dk = (int(s) for s in q.shape)
        Hv, dv = int(v.shape[1]), int(v.shape[2])
        c = self.config.knobs("delta_net")
        nw, max_dk = int(c.warps), int(c.max_dk)
        if (
            dk > max_dk
            or k.shape != q.shape
            or Hv % Hk
            or int(v.shape[0]) != T
            or g.shape != (T, Hv)
            or beta.shape != (T, Hv)
            or int(state.size) != Hv * dk * dv
            or not state.flags.c_contiguous
        ):
            raise ValueError(
                f"delta_net: dk {dk} (<= max_dk {max_dk}), q/k {q.shape}/{k.shape}, v {v.shape} "
                f"(Hv a multiple of Hk), g/beta [{T}, {Hv}], a contiguous state of "
                f"{Hv * dk * dv} values (got {state.shape})"
            )
        if v_order not in ("grouped", "tiled"):
            raise ValueError(f"delta_net: v_order {v_order!r}: 'grouped' or 'tiled'")
        out = self._empty((T, Hv, dv))
        if T == 0:
            return out
        grouped = np.int32(v_order == "grouped")
        if c.variant == "chunked" and T > 1:
            self._delta_net_chunked(q, k, v, g, beta, state, out, grouped, eps)
            return out
        mod = "delta_net_chunked" if c.variant == "chunked" else "delta_net"  # decode: same kernel
        self._launch(
            mod, "delta_net_seq", (math.ceil(dv / nw), Hv), (32 * nw,),
            (q, k, v, g, beta, state, out, np.int32(T), np.int32(Hk), np.int32(Hv), np.int32(dk),
             np.int32(dv), grouped, np.float32(eps)), pdl=True,
        )  # fmt: skip
        return out

    def _delta_net_gated(self, q: Any, k: Any, v: Any, gated: DnGatedIn) -> Any:
        """Under delta_net.fuse_decode a one-token call is dn_step.cu's delta_net_step: gates,
        the scan's step and the gated norm in one launch (bit-identical to the four)."""
        a, b, dt_bias, ssm_a, state, v_order, eps, norm, z = gated
        c = self.config.knobs("delta_net")
        T, Hk, dk = (int(s) for s in q.shape)
        Hv, dv = (int(v.shape[1]), int(v.shape[2])) if v.ndim == 3 else (0, 0)
        if (
            T != 1
            or not int(c.fuse_decode)
            or v_order not in ("grouped", "tiled")
            or dk > int(c.max_dk)
            or not 0 < Hv <= MAX_DN_HEADS
            or Hv % Hk
            or tuple(k.shape) != tuple(q.shape)
            or int(v.shape[0]) != 1
            or not _gated_args_fit(gated, Hv, dk, dv)
        ):
            return super()._delta_net_gated(q, k, v, gated)  # type: ignore[misc]
        q, k, v, a, b, z = (self._contig(t) for t in (q, k, v, a, b, z))
        o, y = self._empty((Hv, dv)), self._empty(tuple(z.shape))
        tickets = self._lazy_tickets("_dn_tickets", MAX_DN_HEADS)  # each head's last block resets
        nw = int(c.warps)
        self._fused_ran("delta_net")
        self._launch(
            "dn_step", "delta_net_step", (math.ceil(dv / nw), Hv), (32 * nw,),
            (q, k, v, a, b, dt_bias.f32, ssm_a.f32, state, o, norm.f32, z, y, np.int32(Hk),
             np.int32(Hv), np.int32(dk), np.int32(dv), np.int32(v_order == "grouped"),
             np.float32(eps), tickets), pdl=True,
        )  # fmt: skip
        return y

    def _delta_net_conv_gated(
        self,
        qkv: Any,
        conv_state: Any,
        conv_w: Any,
        n_k_heads: int,
        head_k_dim: int,
        gated: DnGatedIn,
    ) -> Any:
        """Under delta_net.fuse_conv (with fuse_decode) a one-token call is dn_step.cu's
        delta_net_conv_step: the conv step, gates, the scan's step and the gated norm in one
        launch, q / k / v read from the raw projection row (no column copies)."""
        a, b, dt_bias, ssm_a, state, v_order, eps, norm, z = gated
        c = self.config.knobs("delta_net")
        Hk, dk = n_k_heads, head_k_dim
        Hv = int(a.shape[-1]) if a.ndim else 0
        dv = int(z.shape[-1]) // Hv if Hv else 0
        Cc = 2 * Hk * dk + Hv * dv
        K = int(conv_w.shape[-1]) if len(conv_w.shape) == 2 else 0
        if (
            int(qkv.shape[0]) != 1
            or not int(c.fuse_conv)
            or not int(c.fuse_decode)
            or v_order not in ("grouped", "tiled")
            or not 0 < dk <= int(c.max_dk)
            or not 0 < Hv <= MAX_DN_HEADS
            or Hv % Hk
            or tuple(qkv.shape) != (1, Cc)
            or conv_w.qtype != "F32"
            or conv_w.raw is None
            or tuple(conv_w.shape) != (Cc, K)
            or not 1 < K <= MAX_CONV
            or int(conv_state.size) != (K - 1) * Cc
            or not conv_state.flags.c_contiguous
            or not _gated_args_fit(gated, Hv, dk, dv)
        ):
            return super()._delta_net_conv_gated(  # type: ignore[misc]
                qkv, conv_state, conv_w, n_k_heads, head_k_dim, gated
            )
        qkv, a, b, z = (self._contig(t) for t in (qkv, a, b, z))
        clu = self._dn_clu_launch(c, Hk, Hv, dk, dv)
        if clu is not None:  # delta_net.step_cluster: dn_clu.cu, a cluster per K head
            y = self._empty(tuple(z.shape))
            self._fused_ran("delta_net")
            self._launch(
                "dn_clu", clu[0], clu[1], clu[2],
                (qkv, conv_state, conv_w.raw.view(np.float32), np.int32(K), a, b, dt_bias.f32,
                 ssm_a.f32, state, norm.f32, z, y, np.int32(Hk), np.int32(Hv), np.int32(dk),
                 np.int32(dv), np.int32(v_order == "grouped"), np.float32(eps)), pdl=True,
            )  # fmt: skip
            return y
        o, y = self._empty((Hv, dv)), self._empty(tuple(z.shape))
        tickets = self._lazy_tickets("_dnc_tickets", 2 * MAX_DN_HEADS)  # [V heads | K heads]
        nw = int(c.warps)
        self._fused_ran("delta_net")
        self._launch(
            "dn_step", "delta_net_conv_step", (math.ceil(dv / nw), Hv), (32 * nw,),
            (qkv, conv_state, conv_w.raw.view(np.float32), np.int32(K), a, b, dt_bias.f32,
             ssm_a.f32, state, o, norm.f32, z, y, np.int32(Hk), np.int32(Hv), np.int32(dk),
             np.int32(dv), np.int32(v_order == "grouped"), np.float32(eps), tickets), pdl=True,
        )  # fmt: skip
        return y

    def _dn_clu_launch(
        self, c: Any, Hk: int, Hv: int, dk: int, dv: int
    ) -> tuple[str, tuple[int, int], tuple[int]] | None:
        """(kernel, grid, block) of dn_clu.cu under delta_net.step_cluster, or None where it
        does not apply (off, below sm_90, V heads per K head not 1 / 2 / 4, a cluster past 8
        blocks, a block past DN_CLU_THREADS): then delta_net_conv_step runs."""
        n, lanes = int(c.step_cluster), int(c.step_lanes)
        rv = Hv // Hk
        threads = math.ceil(math.ceil(dv / n) * lanes / 32) * 32 if n else 0
        if not n or self._cc < 90 or rv not in (1, 2, 4) or n * rv > 8 or threads > DN_CLU_THREADS:
            return None
        return f"dn_clu_r{rv}", (n, Hv), (threads,)

    def _delta_net_chunked(
        self,
        q: Any,
        k: Any,
        v: Any,
        g: Any,
        beta: Any,
        state: Any,
        out: Any,
        grouped: Any,
        eps: float,
    ) -> None:
        """delta_net_chunked.cu: the state-free per-(chunk, head) pass into scratch, then the
        scan carrying S chunk to chunk (a warp per column)."""
        T, Hk, dk = (int(s) for s in q.shape)
        Hv, dv = int(v.shape[1]), int(v.shape[2])
        c = self.config.knobs("delta_net")
        nw, chunk, th = int(c.warps), int(c.chunk), int(c.threads)
        nc = math.ceil(T / chunk)
        w, y = self._empty((Hv, T, dv)), self._empty((Hv, T, dk))
        gq, gk = self._empty((Hv, T, dk)), self._empty((Hv, T, dk))
        p, gl = self._empty((Hv, T, chunk)), self._empty((Hv, nc))
        self._launch(
            "delta_net_chunked", "delta_net_chunk_prep", (nc, Hv), (th,),
            (q, k, v, g, beta, w, y, gq, gk, p, gl, np.int32(T), np.int32(Hk), np.int32(Hv),
             np.int32(dk), np.int32(dv), grouped, np.float32(eps)),
        )  # fmt: skip
        self._launch(
            "delta_net_chunked", "delta_net_chunk_scan", (math.ceil(dv / nw), Hv), (32 * nw,),
            (w, y, gq, gk, p, gl, state, out, np.int32(T), np.int32(Hv), np.int32(dk),
             np.int32(dv)),
        )  # fmt: skip

    def _router_topk(self, logits: Any, k: int) -> tuple[Any, Any]:
        logits = self._contig(logits)
        T, E = (int(s) for s in logits.shape)
        if E > MAX_EXPERTS or not 0 < k <= min(E, MAX_TOPK):
            raise ValueError(
                f"router_topk: {E} experts (<= {MAX_EXPERTS}), k {k} (1..{MAX_TOPK}, <= E)"
            )
        ids, w = self._empty((T, k), np.int32), self._empty((T, k))
        if T:
            rpb = int(self.config.knobs("router_topk").rows_per_block)
            self._launch(
                "hybrid", "router_topk", (math.ceil(T / rpb),), (32 * rpb,),
                (logits, ids, w, np.int32(T), np.int32(E), np.int32(k)), pdl=True,
            )  # fmt: skip
        return ids, w

    def _moe_matvec(self, w: Any, x: Any, ids: Any, x_div: int) -> Any:
        """y[p] = expert ids[p] of w (rows e * N ..) . x[p // x_div] -> [pairs, N]."""
        if len(w.shape) != 3 or w.raw is None or int(x.shape[-1]) != int(w.shape[2]):
            raise ValueError(f"moe: {w.name} {w.shape} (stacked experts) against x {x.shape}")
        E, N, Kw = (int(s) for s in w.shape)
        pairs = int(ids.size)
        out = self._empty((pairs, N))
        c = self.config.knobs("moe_experts")
        rows, tpr = int(c.rows_per_block), int(c.threads_per_row)
        x = self._aligned16(x)  # float4 loads of the activation
        for p0 in range(0, pairs, MAX_PAIRS):
            self._launch(
                "moe", f"moe_{_suffix(w.qtype)}",
                (math.ceil(N / rows), 1, min(MAX_PAIRS, pairs - p0)), (rows * tpr,),
                (w.raw, np.int32(w.row_bytes), np.int32(N), np.int32(Kw), x, np.int32(x_div),
                 ids, np.int32(E), np.int32(p0), out), pdl=True,
            )  # fmt: skip
        return out

    def _moe_experts(self, x: Any, ids: Any, weights: Any, gate: Any, up: Any, down: Any) -> Any:
        x = self._contig(x)
        ids = self._contig(ids, np.int32)
        weights = self._contig(weights)
        T, C = (int(s) for s in x.shape)
        k = int(ids.shape[-1])
        if ids.shape != (T, k) or weights.shape != (T, k) or tuple(down.shape[1:2]) != (C,):
            raise ValueError(
                f"moe_experts: x {x.shape}, ids {ids.shape}, weights {weights.shape}, "
                f"down {down.shape}"
            )
        out = self._empty((T, C))
        if T == 0:
            return out
        c = self.config.knobs("moe_experts")
        E = int(gate.shape[0])
        if (  # tc: the fp16 GEMM's switch of the dense matmuls (float32 DMMV below it)
            c.variant == "tc"
            and T >= max(2, int(self.config.knobs("prefill").gemm_min_t))
            and tc_ok(gate, up, down)
            and tc_tiles(T * k, E, int(c.tile_pairs)) <= MAX_TILES
        ):
            d = self._moe_tc(x, ids, gate, up, down)
        elif c.variant == "grouped" and T > 1 and _max_tiles(T * k, E, c) <= MAX_PAIRS:
            d = self._moe_grouped(x, ids, gate, up, down)
        elif c.variant == "mmvq" and all(_q8_ok(w) for w in (gate, up, down)):
            d = self._moe_q8(x, ids, gate, up, down)
        else:
            h = self.ops.swiglu(self._moe_matvec(gate, x, ids, k), self._moe_matvec(up, x, ids, k))
            d = self._moe_matvec(down, h, ids, 1)  # [T * k, C]
        th = 256  # a memory-bound sum of k rows: not worth a knob
        self._launch(
            "hybrid", "moe_combine", (self._grid1(T * C, th),), (th,),
            (d, weights, out, np.int32(T), np.int32(C), np.int32(k)), pdl=True,
        )  # fmt: skip
        return out

    def _moe_q8(self, x: Any, ids: Any, gate: Any, up: Any, down: Any) -> Any:
        """moe_q8.cu: x as Q8_1 (the form rms_norm made at decode when there is one), gate, up
        and SwiGLU per pair in one launch (one type) or two + swiglu, its output as Q8_1, then
        down -> [T * k, C] for moe_combine."""
        k = int(ids.shape[1])
        xq, xds = self.quantize_q8(x)
        F = int(gate.shape[1])
        if gate.qtype == up.qtype and gate.row_bytes == up.row_bytes:
            h = self._moe_q8_launch("moe_q8_gu", (gate, up), xq, xds, ids, k)
        else:
            g = self._moe_q8_launch("moe_q8", (gate,), xq, xds, ids, k)
            h = self.ops.swiglu(g, self._moe_q8_launch("moe_q8", (up,), xq, xds, ids, k))
        if int(h.shape[1]) != F:
            raise ValueError(f"moe: gate {gate.shape} and up {up.shape} disagree")
        hq, hds = self.quantize_q8(h)
        return self._moe_q8_launch("moe_q8", (down,), hq, hds, ids, 1)

    def _moe_q8_launch(
        self, kernel: str, ws: tuple[Any, ...], xq: Any, xds: Any, ids: Any, x_div: int
    ) -> Any:
        """y[p] = expert ids[p] of ws (gate . x, up . x -> SwiGLU for two) -> [pairs, N]."""
        w = ws[0]
        E, N, K = (int(s) for s in w.shape)
        if int(xq.shape[-1]) != K:
            raise ValueError(f"moe: {w.name} {w.shape} (stacked experts) against x {xq.shape}")
        pairs = int(ids.size)
        out = self._empty((pairs, N))
        c = self.config.knobs("moe_experts")
        rows = int(c.warps) * 32 // int(c.threads_per_row)
        for p0 in range(0, pairs, MAX_PAIRS):
            self._launch(
                "moe_q8", f"{kernel}_{_suffix(w.qtype)}",
                (math.ceil(N / rows), 1, min(MAX_PAIRS, pairs - p0)), (int(c.warps) * 32,),
                (*(v.raw for v in ws), np.int32(w.row_bytes), np.int32(N), np.int32(K), xq, xds,
                 np.int32(x_div), ids, np.int32(E), np.int32(p0), out), pdl=True,
            )  # fmt: skip
        return out

    def _moe_grouped(self, x: Any, ids: Any, gate: Any, up: Any, down: Any) -> Any:
        """moe_grouped.cu: pairs sorted by expert on the device, gate / up / down as a batched
        DMMV per tile of one expert's pairs (rows stay sorted), then back to pair order ->
        [T * k, C] for moe_combine."""
        T, C = (int(s) for s in x.shape)
        k = int(ids.shape[1])
        P, E = T * k, int(gate.shape[0])
        if E > MAX_EXPERTS or any(len(w.shape) != 3 or int(w.shape[0]) != E for w in (up, down)):
            raise ValueError(f"moe_grouped: {E} experts (<= {MAX_EXPERTS}) in gate, up, down")
        max_tiles = _max_tiles(P, E, self.config.knobs("moe_experts"))
        route = self._empty((1 + 3 * max_tiles + P,), np.int32)
        self._launch(
            "moe_grouped", "moe_sort", (1,), (MOE_SORT_THREADS,),
            (ids, np.int32(P), np.int32(E), np.int32(max_tiles), route),
        )  # fmt: skip
        xs = self._empty((P, C))  # x[t] for each pair, in sorted order
        self._launch(
            "moe_grouped", "moe_gather", (self._grid1(P * C, 256),), (256,),
            (x, route, np.int32(max_tiles), np.int32(k), np.int32(P), np.int32(C), xs),
        )  # fmt: skip
        h = self.ops.swiglu(
            self._moe_tiles(gate, xs, route, max_tiles), self._moe_tiles(up, xs, route, max_tiles)
        )
        ds = self._moe_tiles(down, h, route, max_tiles)  # [P, C], sorted
        d = self._empty((P, C))
        self._launch(
            "moe_grouped", "moe_scatter", (self._grid1(P * C, 256),), (256,),
            (ds, route, np.int32(max_tiles), np.int32(P), np.int32(C), d),
        )  # fmt: skip
        return d

    def _moe_tiles(self, w: Any, xs: Any, route: Any, max_tiles: int) -> Any:
        """ys[i] = expert (tile of i) of w . xs[i] for the sorted rows -> [P, N]."""
        if len(w.shape) != 3 or w.raw is None or int(xs.shape[-1]) != int(w.shape[2]):
            raise ValueError(f"moe: {w.name} {w.shape} (stacked experts) against x {xs.shape}")
        E, N, Kw = (int(s) for s in w.shape)
        out = self._empty((int(xs.shape[0]), N))
        c = self.config.knobs("moe_experts")
        rows, tpr = int(c.rows_per_block), int(c.threads_per_row)
        self._launch(
            "moe_grouped", f"moe_grouped_{_suffix(w.qtype)}", (math.ceil(N / rows), 1, max_tiles),
            (rows * tpr,),
            (w.raw, np.int32(w.row_bytes), np.int32(N), np.int32(Kw), self._aligned16(xs), route,
             np.int32(E), out),
        )  # fmt: skip
        return out
