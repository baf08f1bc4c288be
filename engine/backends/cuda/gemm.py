"""The CUDA backend's prompt matmuls outside the tensor-core path (prefill.py), mixed into
CudaBackend: batched DMMV (matmul_batched), the staged fp16 cuBLAS GEMM and the mmq / mmq8
tiles (mmq.cu, mmq8.cu), and the 16-byte alignment every float4 reader needs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.backends.cuda import kernels
from engine.backends.cuda.prefill import _COMPUTE_32F, _GEMM_DEFAULT, _OP_N, _OP_T, _R_16F, _R_32F
from engine.backends.cuda.weight import CudaWeight
from engine.tuning.variants.cuda import CUDA_BLOCK_TYPES


class CudaGemmOps:
    """Methods of CudaBackend (engine/backends/cuda/backend.py): batched DMMV, staged, mmq."""

    def _aligned16(self, x: Any) -> Any:
        """x itself when it starts on a 16-byte boundary, else an aligned copy.

        The block-weight DMMV, mmvq (through quantize_q8_1) and mmq8 read activations as float4;
        a view that starts mid-vector (rows() of a larger buffer at a float offset) faults with
        CUDA_ERROR_MISALIGNED_ADDRESS and poisons the context. Row strides are aligned already
        (K % 32 == 0 for block types), so only the start needs checking; CuPy's allocations
        are 256-byte aligned, and the copy is T x K floats, once per call, only for such views.
        """
        if x.data.ptr % 16 == 0:
            return x
        out = self._empty(x.shape, x.dtype)
        out[...] = x
        return out

    def _batched(self, x: Any, w: CudaWeight, y: Any) -> None:
        c = self.config.knobs("matmul_batched")
        self._dmmv("batched", c, x, w, y, cols=int(c.max_cols))

    def _to_f16(self, x: Any) -> Any:
        cached = self._resident_on()  # fp16 forms are kept under matmul_prefill.resident
        if cached and (hit := self._f16_lookup(x)) is not None:
            return hit
        xh = self._empty(x.shape, np.uint16)
        n = int(x.size)
        self._launch("dequant", "f32_to_f16", (self._grid1(n, 256),), (256,), (x, xh, np.int64(n)))
        if cached:
            self._f16_remember(x, xh)
        return xh

    def _staged(self, x: Any, w: CudaWeight, y: Any, scratch_bytes: int) -> None:
        from cupy.cuda import cublas

        T, K, N = int(x.shape[0]), w.k, w.n
        xh = self._to_f16(x)
        chunk = max(1, min(N, scratch_bytes // (2 * K)))
        scratch = self._empty((chunk, K), np.uint16)
        handle = self._cp.cuda.device.get_cublas_handle()
        per = K // 16 if w.qtype in CUDA_BLOCK_TYPES else K
        for r0 in range(0, N, chunk):
            n = min(chunk, N - r0)
            self._launch(
                "dequant",
                f"dequant_f16_{kernels.QTYPE_SUFFIX[w.qtype]}",
                (self._grid1(n * per, 256),),
                (256,),
                (w.raw, np.int32(w.row_bytes), np.int32(K), np.int32(r0), np.int32(n), scratch),
            )
            # column-major view: Y^T[N, T] (ld N) = W[n, K] (op T) x X^T[K, T] (op N)
            with self._timed("cublas_gemm_f16"):
                cublas.gemmEx(
                    handle, _OP_T, _OP_N, n, T, K,
                    self._alpha.ctypes.data, scratch.data.ptr, _R_16F, K,
                    xh.data.ptr, _R_16F, K,
                    self._beta.ctypes.data, y.data.ptr + 4 * r0, _R_32F, N,
                    _COMPUTE_32F, _GEMM_DEFAULT,
                )  # fmt: skip

    def _mmq(self, x: Any, w: CudaWeight, y: Any, c: Any) -> None:
        T = int(x.shape[0])
        xh = self._to_f16(x)
        bm, bn = int(c.tile_m), int(c.tile_n)
        threads = int(c.warps_m) * int(c.warps_n) * 32
        self._launch(
            "mmq",
            f"mmq_{kernels.QTYPE_SUFFIX[w.qtype]}",
            (math.ceil(w.n / bm), math.ceil(T / bn)),
            (threads,),
            (w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(w.k), xh, np.int32(T), y),
        )

    def _mmq8(self, x: Any, w: CudaWeight, y: Any, c: Any) -> None:
        T = int(x.shape[0])
        xq, xds = self.quantize_q8(x)  # once for q, k and v (or gate and up)
        bm, bn = int(c.tile_m), int(c.tile_n)
        threads = int(c.warps_m) * int(c.warps_n) * 32
        self._launch(
            "mmq8",
            f"mmq8_{kernels.QTYPE_SUFFIX[w.qtype]}",
            (math.ceil(w.n / bm), math.ceil(T / bn)),
            (threads,),
            (w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(w.k), xq, xds, np.int32(T), y),
        )
