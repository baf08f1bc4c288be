"""The CUDA backend's quantized decode matmuls, mixed into CudaBackend: DMMV (dmmv.cu, also
batched DMMV's launcher), Q8_1 activations (q8.cu) with mmvq (mmvq.cu) and mmvw (mmvw.cu), and
the fused decode ops (engine.backends.base) that run a layer's projections in fewer launches.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.cuda import kernels
from engine.backends.cuda.attention import _PendingQ
from engine.backends.cuda.decode_float import _NULL, QT_IDS, three_matrix_args
from engine.backends.cuda.weight import CudaWeight
from engine.backends.plan import AttnIn
from engine.tuning.variants.cuda import CUDA_BLOCK_TYPES

if TYPE_CHECKING:
    from engine.tuning import TuningConfig


_QT = QT_IDS  # GGML type ids, as mmvw.cu's switch reads them (common.cuh QT_*)
_WIDE = {"Q4_K": "q4k_wide", "Q6_K": "q6k_wide"}  # a type's 64-weight slot knob (no x planes)
_MAX_ROPE_HEADS = 1024  # q + k heads mmvw_qkv counts (tickets); more: mmvw, then rope_kv


class CudaDecodeMatmulOps:
    """Methods of CudaBackend (engine/backends/cuda/backend.py): dmmv, mmvq, mmvw, fused ops."""

    def _dmmv(self, mod: str, c: Any, x: Any, w: CudaWeight, y: Any, cols: int) -> None:
        T = int(x.shape[0])
        rows = int(c.rows_per_block)
        tpr = 1 if c.variant == "dmmv_serial" else int(c.threads_per_row)
        rpt = int(c.rows_per_thread) if mod == "decode" else 1
        self._launch(
            mod,
            f"dmmv_{kernels.QTYPE_SUFFIX[w.qtype]}",
            (math.ceil(w.n / (rows * rpt)), math.ceil(T / cols)),
            (rows * tpr,),
            (w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(w.k), x, np.int32(T), y),
        )

    # --- Q8_1 activations (q8.cu) and the integer decode matmul (mmvq.cu) ------------------
    def _int8_decode(self) -> bool:
        return self.config.knobs("matmul_decode").variant in ("mmvq", "mmvw")

    def _q8_lookup(self, x: Any) -> tuple[Any, Any] | None:
        for e in self._q8:  # same memory and shape (a contiguous copy or view of it counts)
            if e[0] is x or (
                e[0].data.ptr == x.data.ptr and e[0].shape == x.shape and x.flags.c_contiguous
            ):
                return e[1], e[2]
        return None

    def _q8_remember(self, x: Any, xq: Any, xds: Any) -> None:
        self._q8.append((x, xq, xds))
        del self._q8[:-4]  # a layer reuses one quantized input for at most 3 matmuls

    def _q8_forget(self, y: Any) -> None:
        """Drop quantized forms of any array whose memory y overlaps (y is being written)."""
        if not self._q8:
            return
        lo = y.data.ptr
        hi = lo + y.nbytes
        self._q8 = [e for e in self._q8 if e[0].data.ptr >= hi or e[0].data.ptr + e[0].nbytes <= lo]

    def _q8_buffers(self, T: int, K: int) -> tuple[Any, Any]:
        return self._empty((T, K), np.int8), self._empty((T, K // 32, 2), np.float32)

    def quantize_q8(self, x: Any) -> tuple[Any, Any]:
        """x [T, K] float32 (K % 32 == 0) -> (xq int8 [T, K], xds float32 [T, K/32, 2] = d and
        d * sum(q) per block of 32), reusing the form made when x was produced or last used."""
        hit = self._q8_lookup(x)
        if hit is not None:
            return hit
        T, K = int(x.shape[0]), int(x.shape[1])
        xq, xds = self._q8_buffers(T, K)
        th = int(self.config.knobs("quantize_act").threads)
        n4 = T * K // 4
        self._launch(
            "q8", "quantize_q8_1", (self._grid1(n4, th),), (th,), (x, xq, xds, np.int64(n4))
        )
        self._q8_remember(x, xq, xds)
        return xq, xds

    def _mmvq(self, x: Any, w: CudaWeight, y: Any, c: Any) -> None:
        xq, xds = self.quantize_q8(x)
        nw, rpb = int(c.warps), int(c.rows_per_block)
        self._launch(
            "mmvq",
            f"mmvq_{kernels.QTYPE_SUFFIX[w.qtype]}",
            (math.ceil(w.n / rpb),),
            (32 * nw,),
            (w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(w.k), xq, xds, y),
        )

    def _mmvw(self, x: Any, mats: list[tuple[CudaWeight, Any, Any]]) -> None:
        """Up to three decode matmuls of one activation row in one launch (mmvw.cu): for each
        (w, y, a), y = x @ w^T (+ a, a bias or residual of N floats, when not None). Block
        types only; every w has x's K."""
        xq, xds = self.quantize_q8(x)
        c = self.config.knobs("matmul_decode")
        rpb = self._mmvw_rows_per_block(mats[0][0].k)
        for _, y, _ in mats:
            self._q8_forget(y)
        nbs, args = three_matrix_args(mats, rpb)
        plan = self._stream_plan(tuple(m[0] for m in mats), rpb, sum(nbs))
        if plan is not None:
            grid, stages, stage_bytes, x4, x6, smem = plan
            self._launch(
                "mmvw", "mmvw_stream", (grid,), (int(c.warps) * 32,),
                (xq, xds, np.int32(mats[0][0].k), np.int32(nbs[0]), np.int32(nbs[1]),
                 np.int32(sum(nbs)), np.int32(stages), np.int32(stage_bytes), np.int32(x4),
                 np.int32(x6), *args),
                smem=smem, pdl=True,
            )  # fmt: skip
            return
        # matmul_decode.q4k_kernel: all Q4_K -> mmvw built for that type alone (fewer registers)
        q4k = int(c.q4k_kernel) and all(m[0].qtype == "Q4_K" for m in mats)
        self._launch(
            "mmvw", "mmvw_q4k" if q4k else "mmvw", (sum(nbs),), (int(c.warps) * 32,),
            (xq, xds, np.int32(mats[0][0].k), np.int32(nbs[0]), np.int32(nbs[1]), *args),
            smem=self._stage_smem(tuple(m[0] for m in mats), rpb), pdl=True,
        )  # fmt: skip

    def _wide(self, x: Any, ws: tuple[CudaWeight, ...]) -> bool:
        """Whether ws can go through one mmvw launch on decode row x."""
        return (
            int(x.shape[0]) == 1
            and self.config.knobs("matmul_decode").variant == "mmvw"
            and all(w.qtype in CUDA_BLOCK_TYPES and w.k == int(x.shape[1]) for w in ws)
        )

    def _decode_row(self, x: Any) -> Any:
        return self._aligned16(self._cp.ascontiguousarray(x, dtype=np.float32))

    # --- fused ops (engine.backends.base): fewer launches per decode layer -----------------
    def _attn_in(self, a: AttnIn) -> Any:
        """q/k/v in one mmvw launch with the biases added as they store (matmul_decode.mmvw),
        and/or bias + both ropes + the KV write in one rope_kv launch (rope.fuse_kv)."""
        h, wqkv, bias, cache, layer, pos0, heads, theta, neox = a
        if self._qkv_ok(h, wqkv):  # a prefill chunk under resident: one GEMM (prefill.py)
            return self._attn_in_rows(a)
        H, Hkv, D = heads
        T = int(h.shape[0])
        fuse = int(self.config.knobs("rope").fuse_kv) == 1
        wide = self._wide(h, wqkv)
        flt = self._mmvf_ok(h, wqkv)  # matmul_decode.mmvf: q/k/v + biases in one launch too
        if not (fuse or wide or flt):
            return super()._attn_in(a)
        cache.check_room(pos0, T)
        if wide and self._fuse_rope(heads):
            return self._mmvw_qkv(a._replace(h=self._decode_row(h)))
        if wide or flt:
            h = self._decode_row(h)
            q, k, v = (self._empty((T, w.n)) for w in wqkv)
            adds = (None,) * 3 if bias is None else tuple(b.f32 for b in bias)
            mats = [(w, y, a) for w, y, a in zip(wqkv, (q, k, v), adds, strict=True)]
            (self._mmvf if flt else self._mmvw)(h, mats)
            bias = None
            if self._gqa_rope(heads):  # the attention kernel ropes q, k and writes the cache
                return _PendingQ(q.reshape(T, H, D), k, v, cache, layer, pos0, theta, neox)
        else:
            q, k, v = (self.ops.matmul(h, w) for w in wqkv)
        if not fuse:
            q = self.ops.rope(q.reshape(T, H, D), pos0, theta, neox)
            k = self.ops.rope(k.reshape(T, Hkv, D), pos0, theta, neox)
            self.ops.kv_write(cache, layer, k, v.reshape(T, Hkv, D), pos0)
            return q
        qo = self._empty((T, H, D))
        th = int(self.config.knobs("rope").threads)
        n = T * (H + Hkv) * (D // 2) + T * Hkv * D
        bq, bk, bv = (_NULL,) * 3 if bias is None else (b.f32 for b in bias)
        self._launch(
            "fused", "rope_kv", (self._grid1(n, th),), (th,),
            (
                q, k, v, bq, bk, bv, qo, cache.k[layer], cache.v[layer], np.int32(T),
                np.int32(H), np.int32(Hkv), np.int32(D), np.int32(pos0), self._pos_ptr(),
                np.float32(theta), np.int32(1 if neox else 0),
            ),
            pdl=True,
        )  # fmt: skip
        return qo

    def _stage_smem(self, ws: tuple[CudaWeight, ...], rpb: int | None = None) -> int:
        """Dynamic shared memory of an mmvw launch under matmul_decode.stage: a block's rows
        (rpb, default the unsplit count) of the widest matrix, or 0 (no staging) when that
        exceeds what a block may opt in to."""
        c = self.config.knobs("matmul_decode")
        if int(c.stage) == 0 or sum(w.n for w in ws) < int(c.stage_min_rows):
            return 0  # no shared memory: the kernel reads global memory (stage_start declines)
        need = (rpb or self._mmvw_rows_per_block()) * max(w.row_bytes for w in ws)
        cap = self.__dict__.get("_stage_cap")
        if cap is None:  # what a block may opt in to, less the kernels' static shared memory
            extra = self.device_info().extra
            cap = self._stage_cap = int(extra.get("smem_per_block_optin", 0)) - 1024
        return need if need <= cap else 0

    def _dev_extra(self) -> dict:
        """device_info().extra, asked of the driver once (not per decode launch)."""
        extra = self.__dict__.get("_extra")
        if extra is None:
            extra = self._extra = self.device_info().extra
        return extra

    def _stream_plan(
        self, ws: tuple[CudaWeight, ...], rpb: int, nsets: int
    ) -> tuple[int, int, int, int, int, int] | None:
        """(grid, stages, stage bytes, x4, x6, shared bytes) of an mmvw_stream launch
        (matmul_decode.stream: the ring's stages; stream_blocks: persistent blocks per SM, 0 =
        as many as fit; stream_x: the activations as shared-memory planes after the ring, x4 /
        x6 their byte offsets for the Q4_K / Q6_K slots or -1), or None: the knob is off, a
        matrix is not Q4_K / Q6_K or not 16-byte aligned, or two stages of a block's rows (and
        the planes) do not fit in a block's shared memory (then plain mmvw)."""
        c = self.config.knobs("matmul_decode")
        stages = int(c.stream)
        if stages == 0 or not all(w.qtype in ("Q4_K", "Q6_K") for w in ws):
            return None
        if any(int(w.raw.data.ptr) % 16 or w.row_bytes % 16 for w in ws):
            return None
        extra = self._dev_extra()
        stage_bytes = rpb * max(w.row_bytes for w in ws)
        planes = []  # (type, narrow slots): the x planes stream_x builds, 56 bytes a slot
        if int(c.stream_x):
            types = {w.qtype for w in ws}
            planes = [t for t in ("Q4_K", "Q6_K") if t in types and not int(getattr(c, _WIDE[t]))]
        xbytes = len(planes) * 56 * (ws[0].k // 32)
        # the kernel's static shared memory (barriers, split_k's partials) and 1 KiB a block
        # the driver reserves: 2 KiB of margin
        cap = int(extra.get("smem_per_block_optin", 0)) - 2048 - xbytes
        stages = min(stages, cap // stage_bytes)
        if stages < 2:
            return None
        off = {t: stages * stage_bytes + i * 56 * (ws[0].k // 32) for i, t in enumerate(planes)}
        smem = stages * stage_bytes + xbytes
        threads = int(c.warps) * 32
        per_sm = min(
            int(extra.get("smem_per_sm", 0)) // (smem + 2048),
            2048 // threads,  # threads per SM
            65536 // (64 * threads),  # registers, at mmvw's <= 64 a thread
            32,
        )
        if int(c.stream_blocks) > 0:
            per_sm = min(per_sm, int(c.stream_blocks))
        grid = min(nsets, max(1, per_sm) * int(extra.get("sms", 1)))
        return grid, stages, stage_bytes, off.get("Q4_K", -1), off.get("Q6_K", -1), smem

    def _mmvw_rows_per_block(self, k: int = 0) -> int:
        """Rows per block of an mmvw / mmvw_norm launch on rows of k values: the registry's
        derived rows_per_block (the kernel's ROWS_PER_BLOCK), split_k times fewer from
        split_min_k on (mmvw.cu's mmvw_rpb); k = 0: unsplit (mmvw_qkv)."""
        c = self.config.knobs("matmul_decode")
        rpb, split = c.rows_per_block, int(c.split_k)
        return rpb // split if split > 1 and k >= int(c.split_min_k) else rpb

    def _fuse_rope(self, heads: tuple[int, int, int]) -> bool:
        """matmul_decode.fuse_rope on a decode row whose heads mmvw_qkv can count and hold."""
        H, Hkv, D = heads
        return (
            int(self.config.knobs("matmul_decode").fuse_rope) == 1
            and D % 2 == 0
            and H + Hkv <= _MAX_ROPE_HEADS
            and self._mmvw_rows_per_block() // D + 2 <= 32  # heads a block touches: a bitmask
        )

    def _mmvw_qkv(self, a: AttnIn) -> Any:
        """q/k/v + biases, v into the cache, q and k roped (k into the cache): one mmvw_qkv
        launch (matmul_decode.fuse_rope) for the decode row a.h [1, C]."""
        h, wqkv, bias, cache, layer, pos0, heads, theta, neox = a
        H, Hkv, D = heads
        xq, xds = self.quantize_q8(h)
        c = self.config.knobs("matmul_decode")
        rpb = self._mmvw_rows_per_block()
        nbs = [math.ceil(w.n / rpb) for w in wqkv]
        q, k = self._empty((1, H * D)), self._empty((1, Hkv * D))
        qo = self._empty((1, H, D))
        adds = (_NULL,) * 3 if bias is None else tuple(b.f32 for b in bias)
        mats = []
        for w, a in zip(wqkv, adds, strict=True):
            mats += [w.raw, np.int32(w.row_bytes), np.int32(_QT[w.qtype]), a]
        self._launch(
            "mmvw", "mmvw_qkv", (sum(nbs),), (int(c.warps) * 32,),
            (
                xq, xds, np.int32(h.shape[1]), np.int32(nbs[0]), np.int32(nbs[1]), *mats, q, k,
                qo, cache.k[layer], cache.v[layer], np.int32(H), np.int32(Hkv), np.int32(D),
                np.int32(pos0), self._pos_ptr(), np.float32(theta), np.int32(1 if neox else 0),
                self._rope_tickets,
            ),
            smem=self._stage_smem(wqkv), pdl=True,
        )  # fmt: skip
        return qo

    def _matmul_add(self, x: Any, w: CudaWeight, r: Any) -> Any:
        """Under matmul_decode.mmvw / mmvf a decode row's projection adds the residual as it
        stores."""
        if self._mmvf_ok(x, (w,)):
            return self._mmvf_add(x, w, r)
        if not self._wide(x, (w,)) or w.raw is None:
            return super()._matmul_add(x, w, r)
        r = self._cp.ascontiguousarray(r, dtype=np.float32)
        y = self._empty((1, w.n))
        self._mmvw(self._decode_row(x), [(w, y, r)])
        return y

    def _ffn(self, h: Any, gate: CudaWeight, up: CudaWeight, down: CudaWeight, r: Any) -> Any:
        """Under matmul_decode.mmvw: gate and up in one launch, swiglu_q8 (or both in one
        mmvw_glu launch under fuse_swiglu), down + residual. Under matmul_prefill.resident
        (fuse_f16) a prefill chunk's gate and up are one GEMM."""
        if self._pair_ok(h, gate, up):
            return self._matmul_add(self._gate_up(h, gate, up), down, r)
        if self._mmvf_ok(h, (gate, up)):
            return self._mmvf_ffn(h, gate, up, down, r)
        if not self._wide(h, (gate, up)):
            return super()._ffn(h, gate, up, down, r)
        return self._matmul_add(self._decode_gate_up(self._decode_row(h), gate, up), down, r)

    def _decode_gate_up(self, h: Any, gate: CudaWeight, up: CudaWeight) -> Any:
        """silu(h gate^T) * (h up^T) [1, n] of a decode row, its Q8_1 form remembered."""
        c = self.config.knobs("matmul_decode")
        n = gate.n
        if int(c.fuse_swiglu) == 0 or up.n != n:
            g, u = self._empty((1, n)), self._empty((1, up.n))
            self._mmvw(h, [(gate, g, None), (up, u, None)])
            return self.ops.swiglu(g, u)
        xq, xds = self.quantize_q8(h)
        y = self._empty((1, n))
        q8 = n % 32 == 0  # else y's consumer (a float-weight down) takes no Q8_1 form
        yq, yds = self._q8_buffers(1, n) if q8 else (_NULL, _NULL)
        self._launch(
            "mmvw", "mmvw_glu", (math.ceil(n / 32),), (64 * int(c.glu_threads_per_row),),
            (
                xq, xds, np.int32(gate.k), np.int32(n), gate.raw, np.int32(gate.row_bytes),
                np.int32(_QT[gate.qtype]), up.raw, np.int32(up.row_bytes),
                np.int32(_QT[up.qtype]), y, yq, yds,
            ),
            pdl=True,
        )  # fmt: skip
        if q8:
            self._q8_remember(y, yq, yds)
        return y

    def hook_bypassed_fusions(self, config: TuningConfig) -> list[str]:
        """matmul_decode's mmvw_glu / mmvw_norm / mmvw_qkv, rope's rope_kv and the fused
        decode of delta_net and moe_experts run only unhooked."""
        out = []
        dec = config.knobs("matmul_decode")
        fused = ("fuse_swiglu", "fuse_norm", "fuse_rope")
        if dec.variant == "mmvw" and any(int(getattr(dec, k)) for k in fused):
            out.append("matmul_decode")
        if dec.variant == "mmvf" and int(dec.fuse_swiglu):  # mmvf_glu
            out.append("matmul_decode")
        if int(config.knobs("rope").fuse_kv):
            out.append("rope")
        att = config.knobs("attention_decode")
        if att.variant in ("gqa", "tile", "vec") and int(att.fuse_rope):
            out.append("attention_decode")  # RoPE + KV write inside attn_gqa / tile / vec
        # the hybrids' fused decode (hybrid.py, moe_dec.py), where this backend has run it: a
        # dense model never does, so its blame never names them
        ran = getattr(self, "_fusions_ran", set())
        moe = config.knobs("moe_experts")
        for op, on in (
            ("delta_net", int(config.knobs("delta_net").fuse_decode)),
            ("rope_partial", int(config.knobs("rope_partial").fuse_qk)),
            ("moe_experts", moe.variant in ("dmmv", "grouped", "tc") and int(moe.fuse_decode)),
        ):
            if on and op in ran:
                out.append(op)
        return out

    def _fuse_norm(self, x: Any, w: CudaWeight, r: Any) -> bool:
        return (
            self._wide(x, (w,))
            and w.raw is not None
            and int(self.config.knobs("matmul_decode").fuse_norm) == 1
            and w.n % 32 == 0
            and tuple(r.shape) == (1, w.n)
        )

    def _matmul_add_norm(
        self, x: Any, w: CudaWeight, r: Any, norm: CudaWeight, eps: float
    ) -> tuple[Any, Any]:
        """Under matmul_decode.fuse_norm: the projection + residual, then the grid's last block
        runs the RMSNorm of the new row and its Q8_1 form (mmvw_norm), one launch."""
        if not self._fuse_norm(x, w, r):
            return super()._matmul_add_norm(x, w, r, norm, eps)
        xq, xds = self.quantize_q8(self._decode_row(x))
        r = self._cp.ascontiguousarray(r, dtype=np.float32)
        c = self.config.knobs("matmul_decode")
        rpb = self._mmvw_rows_per_block(w.k)
        y, h = self._empty((1, w.n)), self._empty((1, w.n))
        hq, hds = self._q8_buffers(1, w.n)
        self._launch(
            "mmvw", "mmvw_norm", (math.ceil(w.n / rpb),), (int(c.warps) * 32,),
            (
                xq, xds, np.int32(w.k), w.raw, np.int32(w.row_bytes), np.int32(w.n),
                np.int32(_QT[w.qtype]), y, r, norm.f32, np.float32(eps), h, hq, hds,
                self._norm_ticket,
            ),
            smem=self._stage_smem((w,), rpb), pdl=True,
        )  # fmt: skip
        self._q8_remember(h, hq, hds)
        return y, h

    def _ffn_norm(
        self,
        h: Any,
        gate: CudaWeight,
        up: CudaWeight,
        down: CudaWeight,
        r: Any,
        norm: CudaWeight,
        eps: float,
    ) -> tuple[Any, Any]:
        """ffn then the next norm; under fuse_norm the down projection's launch ends in it."""
        if not self._wide(h, (gate, up)):
            return super()._ffn_norm(h, gate, up, down, r, norm, eps)
        g = self._decode_gate_up(self._decode_row(h), gate, up)
        return self._matmul_add_norm(g, down, r, norm, eps)
