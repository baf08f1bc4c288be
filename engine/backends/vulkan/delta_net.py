"""The Vulkan backend's hybrid-model (engine/hybrid.py) recurrent ops, mixed into VulkanBackend:
the gated delta-net scan (sequential and chunked), the causal conv, the gates and column slices.
"""

from __future__ import annotations

from engine.backends.vulkan.kernels import fold_groups as _fold
from engine.backends.vulkan.tensor import VkTensor, VkWeight


class VkDeltaNetOps:
    """Methods of VulkanBackend (engine/backends/vulkan/backend.py): delta-net layer ops."""

    def _delta_net(
        self,
        q: VkTensor,
        k: VkTensor,
        v: VkTensor,
        g: VkTensor,
        beta: VkTensor,
        state: VkTensor,
        v_order: str,
        eps: float,
    ) -> VkTensor:
        """The base contract; state [Hv, dk, dv] as S or, with state_transposed, S^T (a
        cache written under one layout must be read under the same one)."""
        q, k, v, g, beta = (self._as_tensor(t) for t in (q, k, v, g, beta))
        T, Hk, dk = q.shape
        _, Hv, dv = v.shape
        c = self.config.knobs("delta_net")
        wg, max_dk = int(c.wg_size), int(c.max_dk)
        if dv > wg or dk > max_dk or Hv % Hk or state.size != Hv * dk * dv:
            raise ValueError(
                f"delta_net: dk {dk} (<= max_dk {max_dk}), dv {dv} (<= wg_size {wg}), Hv {Hv} "
                f"a multiple of Hk {Hk}, state of {Hv * dk * dv} values (got {state.size})"
            )
        if v_order not in ("grouped", "tiled"):
            raise ValueError(f"delta_net: v_order {v_order!r}: 'grouped' or 'tiled'")
        out = self._new((T, Hv, dv))
        if c.variant == "chunked" and T > 1:
            self._delta_net_chunked(q, k, v, g, beta, state, out, v_order == "grouped", eps)
            return out
        pipe, _ = self._pipe("delta_net")
        tensors = (q, k, v, g, beta, state, out)
        self.stream.dispatch(
            pipe,
            tuple(t.buf for t in tensors),
            (state.buf, out.buf),
            (T, Hk, Hv, dk, dv, int(v_order == "grouped"), *(t.offset for t in tensors), eps),
            _fold(Hv),
        )
        return out

    def _delta_net_chunked(
        self,
        q: VkTensor,
        k: VkTensor,
        v: VkTensor,
        g: VkTensor,
        beta: VkTensor,
        state: VkTensor,
        out: VkTensor,
        grouped: bool,
        eps: float,
    ) -> None:
        """delta_net.chunked for T > 1: PASS_PREP per (chunk, head), then PASS_SCAN per (head,
        scan_wg columns) carrying the state (shaders/vulkan/delta_net_chunked.comp)."""
        T, Hk, dk = q.shape
        _, Hv, dv = v.shape
        c = self.config.knobs("delta_net")
        ch, scan_wg = int(c.chunk), int(c.scan_wg)
        n_chunks = -(-T // ch)
        # W, Y, G Q, G_L/G K, P per (head, token), G_L per (head, chunk): see the shader
        scratch = self._new((Hv * T * (dv + 3 * dk + ch) + Hv * n_chunks,))
        prep, _ = self._pipe("delta_net.prep")
        ins = (q, k, v, g, beta)
        self.stream.dispatch(
            prep,
            (*(t.buf for t in ins), scratch.buf),
            (scratch.buf,),
            (T, Hk, Hv, dk, dv, int(grouped), *(t.offset for t in ins), scratch.offset, eps),
            _fold(n_chunks * Hv),
        )
        scan, _ = self._pipe("delta_net.scan")
        self.stream.dispatch(
            scan,
            (scratch.buf, state.buf, out.buf),
            (scratch.buf, state.buf, out.buf),
            (T, Hv, dk, dv, scratch.offset, state.offset, out.offset),
            _fold(Hv * -(-dv // scan_wg)),
        )

    def _cols(self, x: VkTensor, start: int, stop: int) -> VkTensor:
        x = self._as_tensor(x)
        width = x.shape[-1]
        if not 0 <= start < stop <= width:
            raise ValueError(f"cols: {start}..{stop} of rows of {width}")
        n, rows = stop - start, x.size // width
        out = self._new((*x.shape[:-1], n))
        pipe, c = self._pipe("cols")
        self.stream.dispatch(
            pipe,
            (x.buf, out.buf),
            (out.buf,),
            (rows, width, start, n, x.offset, out.offset),
            _fold(-(-rows * n // int(c.wg_size))),
        )
        return out

    def _ssm_conv(self, x: VkTensor, state: VkTensor, w: VkWeight) -> VkTensor:
        x = self._as_tensor(x)
        T, Cc = x.shape
        Cw, K = w.shape
        if w.qtype != "F32" or len(w.parts) != 1 or Cw != Cc or K > 8:
            raise ValueError(f"ssm_conv: {w.name} must be one F32 [{Cc}, K <= 8], got {w.shape}")
        if state.size != (K - 1) * Cc:
            raise ValueError(f"ssm_conv: a state of {state.size} values for [{K - 1}, {Cc}]")
        out = self._new((T, Cc))
        pipe, c = self._pipe("ssm_conv")
        wbuf = w.parts[0][0].buf
        self.stream.dispatch(
            pipe,
            (x.buf, wbuf, state.buf, out.buf),
            (state.buf, out.buf),
            (T, Cc, K, x.offset, 0, state.offset, out.offset),
            _fold(-(-Cc // int(c.wg_size))),
        )
        return out

    def _ssm_gates(
        self, a: VkTensor, b: VkTensor, dt_bias: VkWeight, ssm_a: VkWeight
    ) -> tuple[VkTensor, VkTensor]:
        a, b = self._as_tensor(a), self._as_tensor(b)
        Hv = a.shape[-1]
        if b.shape != a.shape or dt_bias.f32.size != Hv or ssm_a.f32.size != Hv:
            raise ValueError(f"ssm_gates: a {a.shape}, b {b.shape} against {Hv} heads")
        g, beta = self._new(a.shape), self._new(a.shape)
        pipe, c = self._pipe("ssm_gates")
        dt, sa = dt_bias.f32, ssm_a.f32
        self.stream.dispatch(
            pipe,
            (a.buf, b.buf, dt.buf, sa.buf, g.buf, beta.buf),
            (g.buf, beta.buf),
            (a.size, Hv, a.offset, b.offset, dt.offset, sa.offset, g.offset, beta.offset),
            _fold(-(-a.size // int(c.wg_size))),
        )
        return g, beta
