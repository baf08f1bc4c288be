"""The CUDA backend's row ops (shaders/cuda/elementwise.cu, dequant.cu, norm_decode.cu,
decode_fused.cu), mixed into CudaBackend: embedding, rms_norm, add, rope, swiglu, argmax and
the per-row statistics the tests and validation read.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.backends.base import row_stats_of
from engine.backends.cuda import kernels
from engine.backends.cuda.weight import CudaWeight
from engine.tuning.variants.cuda import CUDA_BLOCK_TYPES

_NULL = np.uint64(0)
# row_stats' one-launch kernel by the candidate tensor's dtype (elementwise.cu)
_ROW_STATS = {np.dtype(np.float32): "row_stats_f32", np.dtype(np.float16): "row_stats_f16"}
_MAX_ARGMAX_ROWS = 4096  # rows argmax.multi takes in one launch (more: argmax.block's kernel)


class CudaElementwiseOps:
    """Methods of CudaBackend (engine/backends/cuda/backend.py): row ops."""

    def _embedding(self, table: CudaWeight, ids: Any) -> Any:
        ids = self._cp.ascontiguousarray(ids.reshape(-1), dtype=np.int32)
        T, K = int(ids.shape[0]), table.k
        out = self._empty((T, K))
        th = int(self.config.knobs("embedding").threads)
        per = K // 16 if table.qtype in CUDA_BLOCK_TYPES else K
        self._launch(
            "dequant",
            f"get_rows_{kernels.QTYPE_SUFFIX[table.qtype]}",
            (self._grid1(T * per, th),),
            (th,),
            (table.raw, np.int32(table.row_bytes), np.int32(K), ids, np.int32(T), out),
        )
        return out

    def _rms_norm(self, x: Any, w: CudaWeight, eps: float) -> Any:
        x = self._cp.ascontiguousarray(x)
        D = int(x.shape[-1])
        rows = int(x.size // D)
        out = self._empty(x.shape)
        c = self.config.knobs("rms_norm")
        blk = c.variant == "block" and D % 4 == 0 and D <= 32 * int(c.threads)
        x = self._aligned16(x) if blk else x  # float4 rows (a view may start anywhere)
        if rows == 1 and x.ndim == 2 and D % 32 == 0 and self._int8_decode() and blk:
            xq, xds = self._q8_buffers(1, D)  # rms_norm.block: the row in registers
            self._launch(
                "norm_decode", "rms_norm_row", (1,), (int(c.threads),),
                (x, w.f32, out, xq, xds, np.int32(D), np.float32(eps)), pdl=True,
            )  # fmt: skip
            self._q8_remember(out, xq, xds)
            return out
        if rows == 1 and x.ndim == 2 and D % 32 == 0 and self._int8_decode():
            xq, xds = self._q8_buffers(1, D)  # one decode row: norm and Q8_1 in one kernel
            th = int(self.config.knobs("quantize_act").threads)
            self._launch(
                "q8", "rms_norm_q8", (1,), (th,),
                (x, w.f32, out, xq, xds, np.int32(D), np.float32(eps)), pdl=True,
            )  # fmt: skip
            self._q8_remember(out, xq, xds)
            return out
        rpb = int(c.rows_per_block) if c.variant == "warp" else 4  # else warp's default
        if x.ndim == 2 and self._fuse_f16(rows):  # and the prefill GEMM's fp16 input
            return self._rms_norm_f16(x, w, out, eps, rpb)
        if blk:
            self._launch(
                "norm_decode", "rms_norm_row", (rows,), (int(c.threads),),
                (x, w.f32, out, _NULL, _NULL, np.int32(D), np.float32(eps)), pdl=True,
            )  # fmt: skip
            return out
        self._launch(
            "elementwise",
            "rms_norm",
            (math.ceil(rows / rpb),),
            (32 * rpb,),
            (x, w.f32, out, np.int32(rows), np.int32(D), np.float32(eps)),
        )
        return out

    def row_stats(self, t: Any, ref: Any, ref_host: np.ndarray) -> Any:
        """On the device (the backend's stream is current), no host wait: op-level replay
        compares a 35B's activations op by op, and a download per op stalled the stream (a
        35B-A3B trial's replay: 76 s of its 85)."""
        cp, n = self._cp, int(t.shape[0])
        kernel = _ROW_STATS.get(np.dtype(t.dtype))
        if kernel is None or n == 0:  # no op hooks such a tensor today: the generic path
            c = cp.ascontiguousarray(t).reshape(n, -1).astype(cp.float64)
            r = cp.ascontiguousarray(ref).reshape(n, -1).astype(cp.float64)
            return row_stats_of(cp, c, r)
        c = cp.ascontiguousarray(t).reshape(n, -1)
        if c.dtype == np.float16:
            c = c.view(np.uint16)  # the kernel reads f16 bits (common.cuh's h2f)
        r = cp.ascontiguousarray(ref, dtype=np.float32).reshape(n, -1)
        out = cp.empty((4, n), np.float64)  # every element written: no poison fill
        args = (c, r, out, np.int32(n), np.int32(c.shape[1]))
        self._launch("elementwise", kernel, (n,), (256,), args)
        return out

    def stats_host(self, stats: list[Any]) -> list[np.ndarray]:
        if not stats:
            return []
        flat = self.download(self._cp.concatenate([s.reshape(-1) for s in stats]))
        out, at = [], 0
        for s in stats:
            out.append(flat[at : at + s.size].reshape(s.shape))
            at += s.size
        return out

    def _add(self, a: Any, b: Any) -> Any:
        a = self._cp.ascontiguousarray(a)
        out = self._empty(a.shape)
        n = int(a.size)
        th = int(self.config.knobs("add").threads)
        if isinstance(b, CudaWeight):
            N = int(b.f32.size)
            self._launch(
                "elementwise", "add_bias", (self._grid1(n, th),), (th,),
                (a, b.f32, out, np.int64(n), np.int32(N)),
            )  # fmt: skip
        else:
            b = self._cp.ascontiguousarray(b)
            self._launch(
                "elementwise", "add_same", (self._grid1(n, th),), (th,), (a, b, out, np.int64(n))
            )
        return out

    def _rope(self, x: Any, pos0: int, theta: float, neox: bool) -> Any:
        x = self._cp.ascontiguousarray(x)
        T, H, D = (int(s) for s in x.shape)
        out = self._empty(x.shape)
        th = int(self.config.knobs("rope").threads)
        self._launch(
            "elementwise",
            "rope",
            (self._grid1(T * H * (D // 2), th),),
            (th,),
            (
                x,
                out,
                np.int32(T),
                np.int32(H),
                np.int32(D),
                np.int32(pos0),
                self._pos_ptr(),
                np.float32(theta),
                np.int32(1 if neox else 0),
            ),
        )
        return out

    def _swiglu(self, gate: Any, up: Any) -> Any:
        gate = self._cp.ascontiguousarray(gate)
        up = self._cp.ascontiguousarray(up)
        out = self._empty(gate.shape)
        n = int(gate.size)
        if gate.ndim == 2 and gate.shape[0] == 1 and n % 32 == 0 and self._int8_decode():
            xq, xds = self._q8_buffers(1, n)  # the down projection's input, quantized here
            th = int(self.config.knobs("quantize_act").threads)
            n4 = n // 4
            self._launch(
                "q8", "swiglu_q8", (self._grid1(n4, th),), (th,),
                (gate, up, out, xq, xds, np.int64(n4)), pdl=True,
            )  # fmt: skip
            self._q8_remember(out, xq, xds)
            return out
        th = int(self.config.knobs("swiglu").threads)
        if gate.ndim == 2 and self._fuse_f16(int(gate.shape[0])):  # and the GEMM's fp16 input
            return self._swiglu_f16(gate, up, out, th)
        self._launch(
            "elementwise", "swiglu", (self._grid1(n, th),), (th,), (gate, up, out, np.int64(n)),
            pdl=True,
        )  # fmt: skip
        return out

    def _argmax(self, logits: Any) -> Any:
        logits = self._cp.ascontiguousarray(logits)
        T, V = int(logits.shape[0]), int(logits.shape[-1])
        out = self._empty((T,), np.int32)
        c = self.config.knobs("argmax")
        th = int(c.threads)
        if c.variant == "multi" and T <= _MAX_ARGMAX_ROWS:
            nb = int(c.blocks)
            pv, pi = self._empty((T, nb)), self._empty((T, nb), np.int32)
            self._launch(
                "fused", "argmax_multi", (nb, T), (th,),
                (logits, np.int32(V), out, pv, pi, self._tickets), pdl=True,
            )  # fmt: skip
            return out
        self._launch("elementwise", "argmax", (T,), (th,), (logits, np.int32(V), out))
        return out
