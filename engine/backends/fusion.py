"""The backend's own fusion pass: ``trunk`` runs a model's layer plan (engine/backends/plan.py)
through fused steps, each by default the op-by-op sequence it replaces, call for call.

A backend that runs a step in fewer launches overrides the private step (CUDA's decode
kernels, Vulkan's fused norms); one that fuses differently overrides ``trunk``. Neither the
model nor the contract changes with a new fusion. Validate's hooked schedule (engine/model.py,
engine/hybrid.py with a hook set) runs the plain ops instead, so blame sees each of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.backends import plan as P

if TYPE_CHECKING:
    from engine.backends.cache import HybridCache, KVCache
    from engine.gguf_model import ModelSpec

Tensor = Any
Weight = Any


class FusionPass:
    """Mixed into Backend: ``trunk`` and the fused steps it calls (self is the backend)."""

    def trunk(self, plan: P.TrunkPlan, x: Tensor, n: int, pos0: int, cache: KVCache) -> Tensor:
        """n tokens' embeddings x [n, C] at positions pos0.. through every layer of plan ->
        hidden states [n, C]; the cache (K/V, a hybrid's recurrent state) is updated. Each
        layer's residual add and the norm that reads the new residual stream run with the op
        before them: the mixer's output projection, the FFN (the next layer's input norm)."""
        s, b = plan.spec, self
        h = b.ops.rms_norm(x, plan.layers[0].attn_norm, s.rms_eps)
        # a backend that folds the post-attention norm into its MoE step gets the residual
        # stream alone from the mixers
        prenorm = plan.has_moe and b._moe_prenorm(n)
        for i, layer in enumerate(plan.layers):
            nxt = plan.layers[i + 1].attn_norm if i + 1 < len(plan.layers) else None
            fold = prenorm and isinstance(layer.ffn, P.Moe)
            x, h = b._mixer(layer.mixer, s, h, x, None if fold else layer.ffn_norm, cache, i, pos0)
            ffn = layer.ffn
            if isinstance(ffn, P.Ffn):
                if nxt is None:
                    return b._ffn(h, ffn.gate, ffn.up, ffn.down, x)
                x, h = b._ffn_norm(h, ffn.gate, ffn.up, ffn.down, x, nxt, s.rms_eps)
            elif isinstance(ffn, P.Moe):
                if fold:  # the post-attention norm, the MoE FFN and the next layer's norm
                    out = b._moe_ffn_prenorm(x, layer.ffn_norm, ffn, nxt, s.rms_eps)
                    if nxt is None:
                        return out
                    x, h = out
                elif nxt is None:
                    return b._moe_ffn(h, x, ffn)
                else:
                    x, h = b._moe_ffn_norm(h, x, ffn, nxt, s.rms_eps)
            else:  # the model's own FFN (forced MoE routes)
                x = b.ops.add(x, ffn(h, i, pos0))
                if nxt is not None:
                    h = b.ops.rms_norm(x, nxt, s.rms_eps)
        return x

    def _mixer(
        self,
        mixer: P.Attention | P.GatedAttention | P.DeltaNet,
        s: ModelSpec,
        h: Tensor,
        r: Tensor,
        norm: Weight | None,
        cache: Any,
        layer: int,
        pos0: int,
    ) -> tuple[Tensor, Tensor | None]:
        """A layer's mixer on h [n, C] -> (r + its output, that sum's RMSNorm by norm, or None
        with norm None)."""
        b, n = self, int(h.shape[0])
        H, Hkv, D = s.n_head, s.n_head_kv, s.head_dim
        if isinstance(mixer, P.Attention):
            heads, rope = (H, Hkv, D), (s.rope_theta, s.rope_neox)
            q = b._attn_in(P.AttnIn(h, mixer.wqkv, mixer.bias, cache, layer, pos0, heads, *rope))
            o = b.ops.reshape(b.ops.attention(q, cache, layer, pos0), (n, H * D))
        elif isinstance(mixer, P.GatedAttention):
            qg, k, v = b.ops.matmuls(h, mixer.wqkv)
            qg = b.ops.reshape(qg, (n, H, 2 * D))  # [q | gate] per head
            k, v = b.ops.reshape(k, (n, Hkv, D)), b.ops.reshape(v, (n, Hkv, D))
            q, gate = b._attn_qk_prep(
                qg, k, v, mixer.q_norm, mixer.k_norm, s.rms_eps, cache, layer, pos0,
                s.rope_theta, s.rope_dim,
            )  # fmt: skip
            a = b.ops.sigmoid_mul(gate, b.ops.attention(q, cache, layer, pos0))
            o = b.ops.reshape(a, (n, H * D))
        else:
            o = b._delta_net_layer(mixer, s, h, cache, layer)
        if norm is None:
            return b._matmul_add(o, mixer.out, r), None
        return b._matmul_add_norm(o, mixer.out, r, norm, s.rms_eps)

    def _delta_net_layer(
        self, m: P.DeltaNet, s: ModelSpec, h: Tensor, cache: HybridCache, layer: int
    ) -> Tensor:
        """A delta-net mixer up to its output projection: the in-projections (ssm_in), then
        conv, gates, scan, norm and output gate as one step -> [n, Hv * dv]."""
        b, n = self, int(h.shape[0])
        ssm = s.ssm
        Hk, Hv, rv = ssm.n_k_heads, ssm.n_v_heads, ssm.n_v_heads // ssm.n_k_heads
        qkv, z, *ba = b.ops.ssm_in(h, m.w_in)
        if len(ba) == 1:  # qwen3next: per K head [b (rv), a (rv)], V heads grouped
            packed = b.ops.reshape(ba[0], (n, Hk, 2 * rv))
            beta_in = b.ops.reshape(b.ops.cols(packed, 0, rv), (n, Hv))
            alpha = b.ops.reshape(b.ops.cols(packed, rv, 2 * rv), (n, Hv))
        else:
            beta_in, alpha = ba  # [T, Hv] each
        gated = P.DnGatedIn(
            alpha, beta_in, m.dt_bias, m.ssm_a, cache.ssm[layer], ssm.v_order, s.rms_eps, m.norm, z
        )
        return b._delta_net_conv_gated(qkv, cache.conv[layer], m.conv, Hk, ssm.head_k_dim, gated)

    # --- the fused steps: the default is the op sequence each replaces -------------------
    def _attn_in(self, a: P.AttnIn) -> Tensor:
        """The q/k/v matmuls, their bias adds (bias given), both ropes and kv_write."""
        h, wqkv, bias, cache, layer, pos0, heads, theta, neox = a
        H, Hkv, D = heads
        T = int(h.shape[0])
        q, k, v = (self.ops.matmul(h, w) for w in wqkv)
        if bias is not None:
            q, k, v = (self.ops.add(t, b) for t, b in zip((q, k, v), bias, strict=True))
        q = self.ops.rope(self.ops.reshape(q, (T, H, D)), pos0, theta, neox)
        k = self.ops.rope(self.ops.reshape(k, (T, Hkv, D)), pos0, theta, neox)
        self.ops.kv_write(cache, layer, k, self.ops.reshape(v, (T, Hkv, D)), pos0)
        return q

    def _matmul_add(self, x: Tensor, w: Weight, r: Tensor) -> Tensor:
        """r + x @ dequant(w)^T (the residual add after a projection)."""
        return self.ops.add(r, self.ops.matmul(x, w))

    def _ffn(self, h: Tensor, gate: Weight, up: Weight, down: Weight, r: Tensor) -> Tensor:
        """r + down(swiglu(h @ gate^T, h @ up^T)): a SwiGLU feed-forward block and its
        residual add."""
        g = self.ops.swiglu(self.ops.matmul(h, gate), self.ops.matmul(h, up))
        return self._matmul_add(g, down, r)

    def _matmul_add_norm(
        self, x: Tensor, w: Weight, r: Tensor, norm: Weight, eps: float
    ) -> tuple[Tensor, Tensor]:
        """(y, rms_norm(y)) with y = matmul_add(x, w, r): a projection, its residual add and
        the RMSNorm that reads the new residual stream."""
        y = self._matmul_add(x, w, r)
        return y, self.ops.rms_norm(y, norm, eps)

    def _ffn_norm(
        self,
        h: Tensor,
        gate: Weight,
        up: Weight,
        down: Weight,
        r: Tensor,
        norm: Weight,
        eps: float,
    ) -> tuple[Tensor, Tensor]:
        """(y, rms_norm(y)) with y = ffn(h, gate, up, down, r): the feed-forward block and the
        next layer's input norm."""
        y = self._ffn(h, gate, up, down, r)
        return y, self.ops.rms_norm(y, norm, eps)

    def _attn_qk_prep(
        self,
        qg: Tensor,
        k: Tensor,
        v: Tensor,
        q_norm: Weight,
        k_norm: Weight,
        eps: float,
        cache: KVCache,
        layer: int,
        pos0: int,
        theta: float,
        n_rot: int,
    ) -> tuple[Tensor, Tensor]:
        """A gated-attention layer's inputs: qg [T, H, 2D] ([q | gate] per head), k, v
        [T, Hkv, D] -> (q RMS-normalised by q_norm and partially roped, the gate); k normalised
        by k_norm and roped, then k and v stored in the layer's cache at pos0. The op-by-op
        schedule of engine/hybrid.py; a backend may run it in fewer launches."""
        D = int(k.shape[-1])
        q, gate = self.ops.cols(qg, 0, D), self.ops.cols(qg, D, 2 * D)
        q = self.ops.rope_partial(self.ops.rms_norm(q, q_norm, eps), pos0, theta, n_rot)
        k = self.ops.rope_partial(self.ops.rms_norm(k, k_norm, eps), pos0, theta, n_rot)
        self.ops.kv_write(cache, layer, k, v, pos0)
        return q, gate

    def _delta_net_gated(self, q: Tensor, k: Tensor, v: Tensor, gated: P.DnGatedIn) -> Tensor:
        """A delta-net layer after its conv: the gates of a, b (ssm_gates), the scan
        (delta_net), each head's output RMS-normalised by norm, times silu(z) -> [T, Hv * dv]
        (z's shape). The op-by-op schedule of engine/hybrid.py, in its order; a backend may
        run it in fewer launches."""
        a, b, dt_bias, ssm_a, state, v_order, eps, norm, z = gated
        g, beta = self.ops.ssm_gates(a, b, dt_bias, ssm_a)
        o = self.ops.delta_net(q, k, v, g, beta, state, v_order, eps)
        o = self.ops.rms_norm(o, norm, eps)
        return self.ops.swiglu(z, self.ops.reshape(o, tuple(z.shape)))

    def _delta_net_conv_gated(
        self,
        qkv: Tensor,
        conv_state: Tensor,
        conv_w: Weight,
        n_k_heads: int,
        head_k_dim: int,
        gated: P.DnGatedIn,
    ) -> Tensor:
        """A delta-net layer from its raw q/k/v projection qkv [T, 2 Hk dk + Hv dv]: ssm_conv
        (conv_state updated in place), the q / k / v columns, then delta_net_gated. The
        op-by-op schedule of engine/hybrid.py, in its order; a backend may run it in fewer
        launches."""
        n, kd = int(qkv.shape[0]), n_k_heads * head_k_dim
        Hv = int(gated.a.shape[-1])
        dv = int(gated.z.shape[-1]) // Hv
        x = self.ops.ssm_conv(qkv, conv_state, conv_w)
        q = self.ops.reshape(self.ops.cols(x, 0, kd), (n, n_k_heads, head_k_dim))
        k = self.ops.reshape(self.ops.cols(x, kd, 2 * kd), (n, n_k_heads, head_k_dim))
        v = self.ops.reshape(self.ops.cols(x, 2 * kd, 2 * kd + Hv * dv), (n, Hv, dv))
        return self._delta_net_gated(q, k, v, gated)

    def _moe_ffn(self, h: Tensor, r: Tensor, moe: P.Moe) -> Tensor:
        """r + a MoE FFN of h: router (logits h @ router^T, router_topk), the routed experts
        (gate, up, down: moe_experts) and, with shared = (gate_inp_shexp, gate, up, down), the
        shared expert scaled by sigmoid(h @ gate_inp_shexp^T). The op-by-op schedule of
        engine/hybrid.py's _ffn, in its order; a backend may run it in fewer launches."""
        ids, w = self.ops.router_topk(self.ops.matmul(h, moe.router), moe.k)
        y = self.ops.moe_experts(h, ids, w, *moe.experts)
        if moe.shared is not None:
            sg, gate, up, down = moe.shared
            sh = self.ops.swiglu(*self.ops.matmuls(h, (gate, up)))
            sh = self.ops.matmul(sh, down)
            y = self.ops.add(y, self.ops.sigmoid_mul(self.ops.matmul(h, sg), sh))
        return self.ops.add(r, y)

    def _moe_ffn_norm(
        self, h: Tensor, r: Tensor, moe: P.Moe, norm: Weight, eps: float
    ) -> tuple[Tensor, Tensor]:
        """(y, rms_norm(y)) with y = moe_ffn(h, r, moe): the MoE block and the next layer's
        input norm (as ffn_norm for the dense FFN)."""
        y = self._moe_ffn(h, r, moe)
        return y, self.ops.rms_norm(y, norm, eps)

    def _moe_prenorm(self, n: int) -> bool:
        """Whether moe_ffn_prenorm folds the post-attention norm into the MoE FFN for n tokens
        (the hybrid trunk then hands it the residual stream; default: no, the mixer's
        matmul_add_norm runs the norm)."""
        return False

    def _moe_ffn_prenorm(
        self, x: Tensor, pre: Weight, moe: P.Moe, norm: Weight | None, eps: float
    ) -> Any:
        """moe_ffn_norm of rms_norm(x, pre) with residual x: the post-attention norm, the MoE
        block and (norm not None) the next layer's input norm -> (y, rms_norm(y, norm)); with
        norm None, y alone."""
        h = self.ops.rms_norm(x, pre, eps)
        if norm is None:
            return self._moe_ffn(h, x, moe)
        return self._moe_ffn_norm(h, x, moe, norm, eps)
