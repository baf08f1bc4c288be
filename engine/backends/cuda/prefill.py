"""The tensor-core prefill of the CUDA backend (issue 14), mixed into CudaBackend:
``matmul_prefill.resident`` (fp16 copies of the 2-D weights kept on the GPU, one cuBLAS GEMM per
matmul, fp16 activations stored by their producers: shaders/cuda/prefill_f16.cu) and the
tensor-core prefill attentions ``attention_prefill.flash_tc`` (shaders/cuda/attention_tc.cu)
and ``attention_prefill.gemm`` (cuBLAS around shaders/cuda/attention_gemm.cu).

fp16 forms of activations are kept as the Q8_1 forms are (CudaBackend._q8): a short list of
(x, xh) holding x, so its memory cannot be reused while the form is listed; ``matmul_into``
drops the forms of any array it writes over.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.cuda import kernels
from engine.tuning.variants.cuda import CUDA_BLOCK_TYPES

if TYPE_CHECKING:
    from engine.backends.base import KVCache
    from engine.backends.plan import AttnIn

# cuBLAS / CUDA data-type constants (cublas_api.h, library_types.h)
_OP_N, _OP_T = 0, 1
_R_16F, _R_32F = 2, 0
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1
_NULL = np.uint64(0)

TC_HEAD_DIMS = (32, 64, 96, 128)  # attention_tc.cu's kernels
ATTG_DEFAULTS = (256, 4)  # attention_prefill.gemm's (block_q, softmax_warps): flash_tc's fallback


class CudaPrefillOps:
    """Prefill paths of CudaBackend on fp16 tensor cores (this class holds no state: the
    backend's ``_f16`` list and ``_groups`` dict are made in its constructor)."""

    _f16: list[tuple[Any, Any]]
    _groups: dict[int, tuple[Any, tuple[Any, ...]]]

    def _f16_lookup(self, x: Any) -> Any:
        for e in self._f16:  # same memory and shape: made by a producer or a last call
            if e[0] is x or (
                e[0].data.ptr == x.data.ptr and e[0].shape == x.shape and x.flags.c_contiguous
            ):
                return e[1]
        return None

    def _resident_on(self) -> bool:
        return self.config.knobs("matmul_prefill").variant == "resident"

    def _f16_remember(self, x: Any, xh: Any) -> None:
        self._f16.append((x, xh))
        del self._f16[:-4]  # a layer reuses one converted input for at most 3 matmuls

    def _f16_forget(self, y: Any) -> None:
        """Drop fp16 forms of any array whose memory y overlaps (y is being written)."""
        if not self._f16:
            return
        lo, hi = y.data.ptr, y.data.ptr + y.nbytes
        self._f16 = [
            e for e in self._f16 if e[0].data.ptr >= hi or e[0].data.ptr + e[0].nbytes <= lo
        ]

    def _fuse_f16(self, rows: int) -> bool:
        """Whether a producer of ``rows`` activation rows also stores their fp16 form: under
        matmul_prefill.resident with fuse_f16 = 1, for rows the prefill GEMM will read."""
        c = self.config.knobs("matmul_prefill")
        return (
            c.variant == "resident"
            and int(c.fuse_f16) == 1
            and rows >= max(2, int(self.config.knobs("prefill").gemm_min_t))
        )

    def resident_f16(self, w: Any, into: Any = None) -> Any:
        """w's fp16 copy [N, K], dequantized once (the staged variant's kernel, all rows);
        ``into``: where to make it (a view of rows of a larger buffer)."""
        if w.f16 is None:
            N, K = w.n, w.k
            f16 = self._empty((N, K), np.uint16) if into is None else into
            per = K // 16 if w.qtype in CUDA_BLOCK_TYPES else K
            self._launch(
                "dequant",
                f"dequant_f16_{kernels.QTYPE_SUFFIX[w.qtype]}",
                (self._grid1(N * per, 256),),
                (256,),
                (w.raw, np.int32(w.row_bytes), np.int32(K), np.int32(0), np.int32(N), f16),
            )
            w.f16 = f16
        return w.f16

    def _group_ok(self, h: Any, ws: tuple[Any, ...]) -> bool:
        """Whether matrices ws of one input can run as one GEMM: a prefill chunk under resident
        + fuse_f16, and their fp16 copies either not made yet or made as one buffer (in order)."""
        if h.ndim != 2 or not self._fuse_f16(int(h.shape[0])):
            return False
        if any(w.raw is None or w.k != int(h.shape[1]) for w in ws):  # else matmul says why
            return False
        if all(w.f16 is None for w in ws):
            return True
        group = self._groups.get(id(ws[0]))
        return (
            group is not None
            and len(group[1]) == len(ws)
            and all(a is b for a, b in zip(group[1], ws, strict=True))
        )

    def _group_copy(self, ws: tuple[Any, ...]) -> Any:
        """The fp16 copies of ws as the row blocks of one [sum N, K] buffer, made once (each
        weight's ``f16`` is its block, so the one-matrix path reads the same memory)."""
        key = id(ws[0])
        if key not in self._groups:
            buf = self._empty((sum(w.n for w in ws), ws[0].k), np.uint16)
            r0 = 0
            for w in ws:
                self.resident_f16(w, buf[r0 : r0 + w.n])
                r0 += w.n
            self._groups[key] = (buf, ws)
            weakref.finalize(ws[0], self._groups.pop, key, None)
        return self._groups[key][0]

    def _group_gemm(self, h: Any, ws: tuple[Any, ...]) -> Any:
        """h @ [w1; w2; ...]^T -> [T, sum N] in one GEMM."""
        h = self._cp.ascontiguousarray(h, dtype=np.float32)
        T, K, N = int(h.shape[0]), ws[0].k, sum(w.n for w in ws)
        buf, y = self._group_copy(ws), self._empty((T, N))
        self._gemm(_OP_T, _OP_N, N, T, K, 1.0, buf, K, 0, self._to_f16(h), K, 0, y, N, 0, 1)
        return y

    def _pair_ok(self, h: Any, gate: Any, up: Any) -> bool:
        return gate.n == up.n and self._group_ok(h, (gate, up))

    def _gate_up(self, h: Any, gate: Any, up: Any) -> Any:
        """swiglu(h gate^T, h up^T) as one GEMM into [T, 2F] and swiglu_pair_f16 (which also
        stores the down projection's fp16 input)."""
        gu = self._group_gemm(h, (gate, up))
        T, F = int(gu.shape[0]), gate.n
        out, xh = self._empty((T, F)), self._empty((T, F), np.uint16)
        th = int(self.config.knobs("swiglu").threads)
        self._launch(
            "prefill_f16", "swiglu_pair_f16", (self._grid1(F, th), T), (th,),
            (gu, out, xh, np.int32(T), np.int32(F)),
        )  # fmt: skip
        self._f16_remember(out, xh)
        return out

    def _qkv_ok(self, h: Any, wqkv: tuple[Any, Any, Any]) -> bool:
        """attn_in of a prefill chunk as one GEMM and rope_kv_rows: resident + fuse_f16 with
        rope.fuse_kv (the one launch for bias, both ropes and the KV write)."""
        return int(self.config.knobs("rope").fuse_kv) == 1 and self._group_ok(h, wqkv)

    def _attn_in_rows(self, a: AttnIn) -> Any:
        """q, k, v in one GEMM into [T, (H + 2 Hkv) D], then rope_kv_rows: q roped into
        [T, H, D], k (roped) and v into the cache, biases added first."""
        h, wqkv, bias, cache, layer, pos0, heads, theta, neox = a
        H, Hkv, D = heads
        T = int(h.shape[0])
        cache.check_room(pos0, T)
        y = self._group_gemm(h, wqkv)
        qo = self._empty((T, H, D))
        th = int(self.config.knobs("rope").threads)
        n = T * (H + Hkv) * (D // 2) + T * Hkv * D
        bq, bk, bv = (_NULL,) * 3 if bias is None else (b.f32 for b in bias)
        self._launch(
            "prefill_f16", "rope_kv_rows", (self._grid1(n, th),), (th,),
            (
                y, np.int32(int(y.shape[1])), bq, bk, bv, qo, cache.k[layer], cache.v[layer],
                np.int32(T), np.int32(H), np.int32(Hkv), np.int32(D), np.int32(pos0),
                np.float32(theta), np.int32(1 if neox else 0),
            ),
        )  # fmt: skip
        return qo

    def _resident(self, x: Any, w: Any, y: Any) -> None:
        T, K, N = int(x.shape[0]), w.k, w.n
        wh, xh = self.resident_f16(w), self._to_f16(x)
        # column-major view: Y^T[N, T] (ld N) = W[N, K] (op T) x X^T[K, T] (op N)
        self._gemm(_OP_T, _OP_N, N, T, K, 1.0, wh, K, 0, xh, K, 0, y, N, 0, 1)

    def _gemm(
        self,
        ta: int, tb: int, m: int, n: int, k: int, alpha: float,
        a: Any, lda: int, sa: int, b: Any, ldb: int, sb: int,
        c: Any, ldc: int, sc: int, batch: int, c_off: int = 0,
    ) -> None:  # fmt: skip
        """cuBLAS C = alpha op(A) op(B), column-major, fp16 A and B, fp32 accumulate and C
        (c_off: floats into c), strided-batched when batch > 1 (strides in elements)."""
        from cupy.cuda import cublas

        handle = self._cp.cuda.device.get_cublas_handle()
        al = np.full(1, alpha, np.float32)  # read by cuBLAS at the call (host pointer mode)
        cp_ = c.data.ptr + 4 * c_off
        with self._timed("cublas_gemm_f16") if self._profiling else contextlib.nullcontext():
            if batch == 1:
                cublas.gemmEx(
                    handle, ta, tb, m, n, k, al.ctypes.data, a.data.ptr, _R_16F, lda,
                    b.data.ptr, _R_16F, ldb, self._beta.ctypes.data, cp_, _R_32F, ldc,
                    _COMPUTE_32F, _GEMM_DEFAULT,
                )  # fmt: skip
            else:
                cublas.gemmStridedBatchedEx(
                    handle, ta, tb, m, n, k, al.ctypes.data, a.data.ptr, _R_16F, lda, sa,
                    b.data.ptr, _R_16F, ldb, sb, self._beta.ctypes.data, cp_, _R_32F, ldc, sc,
                    batch, _COMPUTE_32F, _GEMM_DEFAULT,
                )  # fmt: skip

    def _rms_norm_f16(self, x: Any, w: Any, out: Any, eps: float, rpb: int) -> Any:
        """rms_norm of x [rows, D] into out that also stores its fp16 form (prefill_f16.cu)."""
        rows, D = int(x.shape[0]), int(x.shape[1])
        xh = self._empty(x.shape, np.uint16)
        self._launch(
            "prefill_f16", "rms_norm_f16", (math.ceil(rows / rpb),), (32 * rpb,),
            (x, w.f32, out, xh, np.int32(rows), np.int32(D), np.float32(eps)),
        )  # fmt: skip
        self._f16_remember(out, xh)
        return out

    def _swiglu_f16(self, gate: Any, up: Any, out: Any, th: int) -> Any:
        """swiglu into out that also stores its fp16 form (prefill_f16.cu)."""
        n = int(gate.size)
        xh = self._empty(gate.shape, np.uint16)
        self._launch(
            "prefill_f16", "swiglu_f16", (self._grid1(n, th),), (th,),
            (gate, up, out, xh, np.int64(n)),
        )  # fmt: skip
        self._f16_remember(out, xh)
        return out

    def _attn_tc(self, q: Any, cache: KVCache, layer: int, pos0: int, out: Any, c: Any) -> None:
        """attention_prefill.flash_tc (one kernel; head dims TC_HEAD_DIMS, else gemm at its
        defaults) or attention_prefill.gemm into out [T, H, D]."""
        T, H, D = (int(s) for s in q.shape)
        Hkv = int(cache.k[layer].shape[1])
        if c.variant == "flash_tc" and D in TC_HEAD_DIMS:
            bq, bk = int(c.block_q), int(c.block_k)
            outh = self._empty((T, H * D), np.uint16) if self._fuse_f16(T) else None
            self._launch(
                "attention_tc", f"attn_tc_d{D}", (math.ceil(T / bq), H), (bq // 16 * 32,),
                (
                    q, cache.k[layer], cache.v[layer], out, _NULL if outh is None else outh,
                    np.int32(T), np.int32(H), np.int32(Hkv), np.int32(pos0), self._pos_ptr(),
                    np.float32(math.log2(math.e) / math.sqrt(D)),
                ),
                smem=(bq + 2 * bk) * (D + 8) * 2,
            )  # fmt: skip
            if outh is not None:  # as the model reshapes it for the o projection
                self._f16_remember(out.reshape(T, H * D), outh)
            return
        bq, sw = (int(c.block_q), int(c.softmax_warps)) if c.variant == "gemm" else ATTG_DEFAULTS
        self._attn_gemm(q, cache, layer, pos0, out, bq, sw)

    # Scores of one pass held at most this many bytes (the pass shrinks for long caches).
    ATTN_GEMM_SCORE_BYTES = 256 << 20

    def _attn_gemm(
        self, q: Any, cache: KVCache, layer: int, pos0: int, out: Any, block_q: int, warps: int
    ) -> None:
        """attention_prefill.gemm (attention_gemm.cu): fp16 packs, then per pass of query rows
        S = Q K^T, the causal softmax to fp16 P, out = P V, through cuBLAS. Keys past a pass's
        last query are not multiplied; key counts are padded to 8 (zeros in K, V and P)."""
        T, H, D = (int(s) for s in q.shape)
        Hkv = int(cache.k[layer].shape[1])
        L = pos0 + T
        Lk = -(-L // 8) * 8
        qh = self._empty((H, T, D), np.uint16)
        kh, vh = self._empty((H, Lk, D), np.uint16), self._empty((H, Lk, D), np.uint16)
        self._launch(
            "attention_gemm", "attg_pack_q", (self._grid1(T * H * D, 256),), (256,),
            (q, qh, np.int32(T), np.int32(H), np.int32(D)),
        )  # fmt: skip
        self._launch(
            "attention_gemm", "attg_pack_kv", (self._grid1(H * Lk * D, 256),), (256,),
            (cache.k[layer], cache.v[layer], kh, vh, np.int32(L), np.int32(Lk), np.int32(H),
             np.int32(Hkv), np.int32(D)),
        )  # fmt: skip
        bq = max(1, min(block_q, T, self.ATTN_GEMM_SCORE_BYTES // (4 * H * Lk)))
        scale = 1.0 / math.sqrt(D)
        for t0 in range(0, T, bq):
            tb = min(bq, T - t0)
            Lp = -(-(pos0 + t0 + tb) // 8) * 8  # keys the pass's last query sees, padded
            s = self._empty((H, tb, Lp))
            p = self._empty((H, tb, Lp), np.uint16)
            # S_h^T [Lp, tb] (col-major, ld Lp) = K_h [Lp, D] (op T) x Q_h[t0:]^T [D, tb]
            self._gemm(
                _OP_T, _OP_N, Lp, tb, D, scale, kh, D, Lk * D,
                self._offset(qh, t0 * D), D, T * D, s, Lp, tb * Lp, H,
            )  # fmt: skip
            rows = H * tb
            self._launch(
                "attention_gemm", "attg_softmax", (math.ceil(rows / warps),), (32 * warps,),
                (s, p, np.int32(rows), np.int32(tb), np.int32(Lp), np.int32(pos0 + t0)),
            )  # fmt: skip
            # out[t0:, h]^T [D, tb] (ld H*D) = V_h^T [D, Lp] (op N) x P_h^T [Lp, tb] (op N)
            self._gemm(
                _OP_N, _OP_N, D, tb, Lp, 1.0, vh, D, Lk * D, p, Lp, tb * Lp,
                out, H * D, D, H, c_off=t0 * H * D,
            )  # fmt: skip

    @staticmethod
    def _offset(a: Any, elems: int) -> Any:
        """A flat view of a starting ``elems`` elements in (a GEMM operand's start)."""
        return a.reshape(-1)[elems:]
