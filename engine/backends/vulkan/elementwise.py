"""The Vulkan backend's row ops, mixed into VulkanBackend: embedding, rms_norm, the
elementwise dispatches (add, swiglu, sigmoid_mul; eltwise.comp), rope (rope.comp) and argmax.
"""

from __future__ import annotations

import numpy as np

from engine.backends.vulkan.kernels import fold_groups as _fold
from engine.backends.vulkan.tensor import VkTensor, VkWeight


class VkElementwiseOps:
    """Methods of VulkanBackend (engine/backends/vulkan/backend.py): row ops."""

    def _embedding(self, table: VkWeight, ids: VkTensor) -> VkTensor:
        ids = self._as_tensor(ids)
        if ids.dtype != np.int32:
            raise ValueError(f"embedding ids must be int32, got {ids.dtype}")
        T = ids.size
        _, C = table.shape
        out = self._new((T, C))
        pipe, c = self._pipe("embedding", table.qtype)
        wg = int(c.wg_size)
        work = T * -(-C // 8)
        for lease, r0, nr in table.parts:
            self.stream.dispatch(
                pipe,
                (lease.buf, ids.buf, out.buf),
                (out.buf,),
                (C, T, table.row_bytes, r0, nr, ids.offset, out.offset),
                _fold(-(-work // wg)),
            )
        return out

    def _rms_norm(self, x: VkTensor, w: VkWeight, eps: float) -> VkTensor:
        x = self._as_tensor(x)
        D = x.shape[-1]
        wt = w.f32 if isinstance(w, VkWeight) else self._as_tensor(w)
        if wt.size != D:
            raise ValueError(f"rms_norm: weight of {wt.size} values for rows of {D}")
        rows = x.size // D
        out = self._new(x.shape)
        if rows == 1 and self._int8_row(D):  # the next matmul's Q8_1 input, in this dispatch
            q8 = self._new((self._q8_words(D),), np.int32)
            pipe, _ = self._pipe("quantize_act.norm")
            self.stream.dispatch(
                pipe,
                (x.buf, wt.buf, out.buf, q8.buf),
                (out.buf, q8.buf),
                (D, rows, x.offset, wt.offset, out.offset, float(eps), q8.offset),
                self._q8_grid(D) if self.config.knobs("quantize_act").coalesced else (1, 1, 1),
            )
            self._q8_remember(out, q8)
            return out
        pipe, _ = self._pipe("rms_norm")
        self.stream.dispatch(
            pipe,
            (x.buf, wt.buf, out.buf),
            (out.buf,),
            (D, rows, x.offset, wt.offset, out.offset, float(eps)),
            _fold(rows),
        )
        return out

    def _eltwise(
        self, op: str, a: VkTensor, b: VkTensor, bcast: int, shape: tuple[int, ...] | None = None
    ) -> VkTensor:
        out = self._new(a.shape if shape is None else shape)
        pipe, c = self._pipe(op)
        n = out.size
        if n:
            self.stream.dispatch(
                pipe,
                (a.buf, b.buf, out.buf),
                (out.buf,),
                (n, a.offset, b.offset, out.offset, bcast),
                _fold(-(-n // int(c.wg_size))),
            )
        return out

    def _add(self, a: VkTensor, b: VkTensor | VkWeight) -> VkTensor:
        a = self._as_tensor(a)
        if isinstance(b, VkWeight):
            if b.f32 is None:
                raise ValueError(f"add: {b.name} is not a 1-D weight")
            b = b.f32
        b = self._as_tensor(b)
        if b.shape == a.shape:
            return self._eltwise("add", a, b, 0)
        if b.ndim == 1 and b.size == a.shape[-1]:
            return self._eltwise("add", a, b, b.size)
        raise ValueError(f"add: shapes {a.shape} and {b.shape} do not broadcast")

    def _swiglu(self, gate: VkTensor, up: VkTensor) -> VkTensor:
        gate, up = self._as_tensor(gate), self._as_tensor(up)
        if gate.shape != up.shape:
            raise ValueError(f"swiglu: shapes {gate.shape} and {up.shape} differ")
        n = gate.size
        if n and n == gate.shape[-1] and self._int8_row(n):  # one row: the down input as Q8_1
            out, q8 = self._new(gate.shape), self._new((self._q8_words(n),), np.int32)
            pipe, _ = self._pipe("quantize_act.swiglu")
            self.stream.dispatch(
                pipe,
                (gate.buf, up.buf, out.buf, q8.buf),
                (out.buf, q8.buf),
                (n, gate.offset, up.offset, out.offset, 0, q8.offset),
                self._q8_grid(n),
            )
            self._q8_remember(out, q8)
            return out
        if gate.ndim == 2 and n and self.x16_fused(gate.shape[0]):  # matmul_prefill.fuse_x16
            out = self._new(gate.shape)
            xh, kp = self.x16_for(out)
            pipe, c = self._pipe("swiglu.x16")
            T, cols = gate.shape
            self.stream.dispatch(
                pipe,
                (gate.buf, up.buf, out.buf, xh.buf),
                (out.buf, xh.buf),
                (n, gate.offset, up.offset, out.offset, 0, cols, kp, xh.offset),
                _fold(-(-T * (kp // 2) // int(c.wg_size))),
            )
            return out
        return self._eltwise("swiglu", gate, up, 0)

    def _rope(
        self, x: VkTensor, pos0: int, theta: float, neox: bool, n_rot: int | None = None
    ) -> VkTensor:
        x = self._as_tensor(x)
        T, H, D = x.shape
        n_rot = D if n_rot is None else n_rot
        if n_rot % 2 or not 0 < n_rot <= D:
            raise ValueError(f"rope: {n_rot} rotated dims of a head of {D}")
        table = self._rope_table(theta, n_rot, pos0 + T)
        out = self._new(x.shape)
        pipe, c = self._pipe("rope")
        n = T * H * (n_rot // 2 + D - n_rot)
        if n:
            self.stream.dispatch(
                pipe,
                (x.buf, table.buf, out.buf, self.stream.dyn_buf),
                (out.buf,),
                (T, H, D, x.offset, out.offset, self.stream.dyn(pos0), int(bool(neox)), n_rot),
                _fold(-(-n // int(c.wg_size))),
            )
        return out

    def _rope_partial(self, x: VkTensor, pos0: int, theta: float, n_rot: int) -> VkTensor:
        return self._rope(x, pos0, theta, True, n_rot)  # its rope with n_rot

    def _sigmoid_mul(self, gate: VkTensor, x: VkTensor) -> VkTensor:
        gate, x = self._as_tensor(gate), self._as_tensor(x)
        if gate.shape == x.shape:
            return self._eltwise("sigmoid_mul", gate, x, 0)
        if gate.size * x.shape[-1] == x.size:  # one gate per row
            return self._eltwise("sigmoid_mul", gate, x, x.shape[-1], x.shape)
        raise ValueError(f"sigmoid_mul: gate {gate.shape} against {x.shape}")

    def _argmax(self, logits: VkTensor) -> VkTensor:
        logits = self._as_tensor(logits)
        V = logits.shape[-1]
        rows = logits.size // V
        out = self._new((rows,), np.int32)
        pipe, c = self._pipe("argmax")
        if c.variant == "default":
            self.stream.dispatch(
                pipe,
                (logits.buf, out.buf),
                (out.buf,),
                (V, rows, logits.offset, out.offset),
                _fold(rows),
            )
            return out
        # two_stage: the grid depends on the row count and the slices parameter, never on data.
        slices = int(c.slices)
        parts = self._new((rows, slices, 2), np.int32)  # (float bits, index) per slice
        fx, fy, _ = _fold(rows)
        self.stream.dispatch(
            pipe,
            (logits.buf, parts.buf),
            (parts.buf,),
            (V, rows, logits.offset, parts.offset, slices),
            (slices, fx, fy),
        )
        merge, _ = self._pipe("argmax.merge")
        self.stream.dispatch(
            merge,
            (parts.buf, out.buf),
            (out.buf,),
            (slices, rows, parts.offset, out.offset),
            _fold(rows),
        )
        return out
