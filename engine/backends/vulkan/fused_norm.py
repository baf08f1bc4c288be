"""rms_norm.fuse_add on Vulkan: the residual add before an RMSNorm in the norm's own dispatch
(shaders/vulkan/rms_norm.comp ADD_RES), a mixin of VulkanBackend.

The fusion pass (engine/backends/fusion.py) ends the attention block with ``_matmul_add_norm``
(o projection, residual add, the FFN's input norm) and the FFN block with ``_ffn_norm`` (...,
down projection, residual add, the next layer's input norm). With the knob the add and the norm
are one dispatch that stores both the new residual stream and its normed rows: one dispatch and
one barrier fewer per residual, in prefill and decode, whatever the matmul variant. Where the
int8 decode path adds the residual as its matmul stores (matmul_decode.mmvw), that path is kept.
"""

from __future__ import annotations

from typing import Any

from engine.backends.vulkan.kernels import fold_groups as _fold


class FusedNorm:
    """Mixin: expects VulkanBackend's config, stream, _new, _pipe, _as_tensor, matmul, swiglu,
    _int8 and the base class's fused ops (super())."""

    def _fuse_add(self) -> bool:
        return int(self.config.knobs("rms_norm").fuse_add) == 1

    def add_rms_norm(self, r: Any, x: Any, w: Any, eps: float) -> tuple[Any, Any]:
        """(s, rms_norm(s) * w) with s = r + x, in one dispatch."""
        r, x = self._as_tensor(r), self._as_tensor(x)
        D = x.shape[-1]
        wt = w.f32
        if r.size != x.size or wt.size != D:
            raise ValueError(f"add_rms_norm: r {r.shape}, x {x.shape}, weight {wt.size}")
        s, out = self._new(x.shape), self._new(x.shape)
        rows = x.size // D
        if x.ndim == 2 and self.x16_fused(rows):  # the GEMMs' fp16 input too (fuse_x16)
            xh, kp = self.x16_for(out)
            pipe, _ = self._pipe("rms_norm.add_x16")
            self.stream.dispatch(
                pipe,
                (x.buf, wt.buf, out.buf, r.buf, s.buf, xh.buf),
                (out.buf, s.buf, xh.buf),
                (D, rows, x.offset, wt.offset, out.offset, float(eps), r.offset, s.offset, kp,
                 xh.offset),
                _fold(rows),
            )  # fmt: skip
            return s, out
        pipe, _ = self._pipe("rms_norm.add")
        self.stream.dispatch(
            pipe,
            (x.buf, wt.buf, out.buf, r.buf, s.buf),
            (out.buf, s.buf),
            (D, rows, x.offset, wt.offset, out.offset, float(eps), r.offset, s.offset),
            _fold(rows),
        )
        return s, out

    def _fused_here(self, x: Any) -> bool:
        """fuse_add on, and x is not a decode row of the int8 path (matmul_decode.mmvw adds
        the residual as it stores and its norm writes the Q8_1 form: that schedule stays)."""
        return self._fuse_add() and not (x.shape[0] == 1 and self._int8())

    def _matmul_add_norm(self, x: Any, w: Any, r: Any, norm: Any, eps: float) -> tuple[Any, Any]:
        x = self._as_tensor(x)
        if not self._fused_here(x):
            return super()._matmul_add_norm(x, w, r, norm, eps)
        return self.add_rms_norm(r, self.ops.matmul(x, w), norm, eps)

    def _ffn_norm(
        self, h: Any, gate: Any, up: Any, down: Any, r: Any, norm: Any, eps: float
    ) -> tuple[Any, Any]:
        h = self._as_tensor(h)
        if not self._fused_here(h):
            return super()._ffn_norm(h, gate, up, down, r, norm, eps)
        g = self.ops.swiglu(self.ops.matmul(h, gate), self.ops.matmul(h, up))
        return self.add_rms_norm(r, self.ops.matmul(g, down), norm, eps)

    def hook_bypassed_fusions(self, config: Any) -> list[str]:
        """Registry ops whose fused kernels only the unhooked schedule runs (validate's blame
        turns their fuse_* knobs off one at a time): rms_norm.fuse_add, rope.fuse_kv, mmvw's
        fuse_rope and the resident GEMM's fuse_x16 (its input from the fused add + norm;
        attn_in, matmul_add_norm and ffn_norm are the fused trunk's ops)."""
        out = []
        pre = config.knobs("matmul_prefill")
        if pre.variant == "resident" and int(pre.fuse_x16):  # the fused norm's fp16 rows
            out.append("matmul_prefill")
        dec = config.knobs("matmul_decode")
        if dec.variant == "mmvw" and int(dec.fuse_rope):
            out.append("matmul_decode")
        if int(config.knobs("rope").fuse_kv):
            out.append("rope")
        if int(config.knobs("rms_norm").fuse_add):
            out.append("rms_norm")
        return out
