"""The float-activation decode matmul of the CUDA backend (matmul_decode.mmvf, the default;
shaders/cuda/mmvf.cu), mixed into CudaBackend: one launch for up to three matrices of one decode
row, each with an optional vector added as it stores. The fused ops use it where the unfused
schedule would run the same products one by one (a hybrid layer's projections, gate and up, a
projection and its residual add): same float32 arithmetic per output, fewer launches.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.backends.cuda.kernels import QTYPE_SUFFIX
from engine.tuning.variants.cuda import CUDA_BLOCK_TYPES

# GGML type ids as mmvf.cu's and mmvw.cu's switches read them (common.cuh QT_*)
QT_IDS = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
_NULL = np.uint64(0)


def three_matrix_args(mats: list[tuple[Any, Any, Any]], rpb: int) -> tuple[list[int], list[Any]]:
    """mmvf.cu's and mmvw.cu's view of up to three (w, y, a): blocks per matrix (rpb rows a
    block) and the kernel's (weights, row bytes, rows, type id, y, a or null) per slot, an
    unused slot zero rows and null pointers."""
    nbs, args = [], []
    for w, y, a in mats:
        nbs.append(math.ceil(w.n / rpb))
        args += [w.raw, np.int32(w.row_bytes), np.int32(w.n), np.int32(QT_IDS[w.qtype]), y]
        args.append(_NULL if a is None else a)
    for _ in range(3 - len(mats)):
        nbs.append(0)
        args += [_NULL, np.int32(0), np.int32(0), np.int32(0), _NULL, _NULL]
    return nbs, args


class CudaFloatDecodeOps:
    """Methods of CudaBackend (engine/backends/cuda/backend.py) for matmul_decode.mmvf."""

    _cp: Any
    config: Any

    def _mmvf_on(self) -> bool:
        return self.config.knobs("matmul_decode").variant == "mmvf"

    def _mmvf_ok(self, x: Any, ws: tuple[Any, ...]) -> bool:
        """Whether ws can go through one mmvf launch on the decode row x."""
        K = int(x.shape[-1])
        return (
            int(x.shape[0]) == 1
            and self._mmvf_on()
            and self._mmvf_fits(K)
            and all(w.raw is not None and w.qtype in CUDA_BLOCK_TYPES and w.k == K for w in ws)
        )

    def _mmvf_fits(self, K: int) -> bool:
        """Under xsmem a block holds x (K floats) in shared memory: K must fit what a block may
        opt in to (the kernel's static shared memory aside); a longer row takes dmmv."""
        if not int(self.config.knobs("matmul_decode").xsmem):
            return True
        cap = self.__dict__.get("_xs_cap")
        if cap is None:  # device_info() builds its answer anew: once per backend
            cap = self._xs_cap = int(self.device_info().extra.get("smem_per_block_optin", 0))
        return 4 * K <= cap - 1024

    def _mmvf(self, x: Any, mats: list[tuple[Any, Any, Any]]) -> None:
        """For each (w, y, a) of up to three: y = x @ w^T (+ a, N floats, when not None), in
        one launch. x: a 16-byte aligned float32 row [1, K]; block types only."""
        c = self.config.knobs("matmul_decode")
        rpb = int(c.warps) * 32 // int(c.threads_per_row) * int(c.rows_per_thread)
        for _, y, _ in mats:
            self._q8_forget(y)
            self._f16_forget(y)
        nbs, args = three_matrix_args(mats, rpb)
        types = {w.qtype for w, _, _ in mats}  # one type: its own kernel (its own registers)
        name = f"mmvf_{QTYPE_SUFFIX[types.pop()]}" if len(types) == 1 else "mmvf"
        self._launch(
            "mmvf", name, (sum(nbs),), (int(c.warps) * 32,),
            (x, np.int32(mats[0][0].k), np.int32(nbs[0]), np.int32(nbs[1]), *args),
            smem=4 * mats[0][0].k if int(c.xsmem) else 0,  # xsmem: the block's copy of x
            pdl=True,
        )  # fmt: skip

    def _mmvf_many(self, x: Any, ws: tuple[Any, ...]) -> tuple[Any, ...]:
        """x @ w^T for each w of ws: the block-type ones of x's K three to a launch, the others
        through matmul."""
        x = self._decode_row(x)
        outs: list[Any] = [None] * len(ws)
        fit = [i for i, w in enumerate(ws) if self._mmvf_ok(x, (w,))]
        for j in range(0, len(fit), 3):
            group = fit[j : j + 3]
            for i in group:
                outs[i] = self._empty((1, ws[i].n))
            self._mmvf(x, [(ws[i], outs[i], None) for i in group])
        return tuple(
            self.ops.matmul(x, w) if y is None else y for w, y in zip(ws, outs, strict=True)
        )

    def _mmvf_add(self, x: Any, w: Any, r: Any) -> Any:
        """r + x @ w^T of a decode row, the residual added as the products store."""
        r = self._cp.ascontiguousarray(r, dtype=np.float32)
        y = self._empty((1, w.n))
        self._mmvf(self._decode_row(x), [(w, y, r.reshape(-1))])
        return y

    def _mmvf_ffn(self, h: Any, gate: Any, up: Any, down: Any, r: Any) -> Any:
        """r + down(swiglu(h gate^T, h up^T)) of a decode row: gate and up in one launch (under
        fuse_swiglu with the SwiGLU: mmvf_glu)."""
        h = self._decode_row(h)
        c = self.config.knobs("matmul_decode")
        rpt = int(c.rows_per_thread)
        if int(c.fuse_swiglu) and rpt % 2 == 0 and gate.qtype == up.qtype and gate.n == up.n:
            y = self._empty((1, gate.n))
            per = int(c.warps) * 32 // int(c.threads_per_row) * rpt // 2  # outputs a block
            self._launch(
                "mmvf", f"mmvf_glu_{QTYPE_SUFFIX[gate.qtype]}", (math.ceil(gate.n / per),),
                (int(c.warps) * 32,),
                (h, np.int32(gate.k), gate.raw, up.raw, np.int32(gate.row_bytes),
                 np.int32(gate.n), y),
                smem=4 * gate.k if int(c.xsmem) else 0, pdl=True,
            )  # fmt: skip
            return self._matmul_add(y, down, r)
        g, u = self._empty((1, gate.n)), self._empty((1, up.n))
        self._mmvf(h, [(gate, g, None), (up, u, None)])
        return self._matmul_add(self.ops.swiglu(g, u), down, r)
