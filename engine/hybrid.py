"""Hybrid decoders (qwen35 / qwen35moe / qwen3next) as a backend-independent schedule of ops.

Layers are gated delta-net (linear attention with a matrix state per V head) except every
full_attention_interval-th, which is gated full attention; the FFN is SwiGLU or a mixture of
experts with a sigmoid-gated shared expert. Each block: x += mixer(norm(x)); x += ffn(norm(x)).
The recurrent state (conv inputs + S per delta-net layer) lives in the HybridCache beside the K/V
of the attention layers, so both prefill paths of engine.model and decode share it.

Shapes: T tokens, C width, H/Hkv/D attention heads, Hk/Hv delta-net heads of dk/dv,
Kd = Hk dk, Vd = Hv dv.
"""

from __future__ import annotations

import numpy as np

from engine.backends import plan as P
from engine.backends.base import Backend, HybridCache, Tensor
from engine.errors import UnsupportedError
from engine.gguf_model import GGUFModel, QTensor
from engine.model import Model, check_cache_fits

HYBRID_OPS = ("rope_partial", "sigmoid_mul", "ssm_conv", "ssm_gates", "delta_net")
MOE_OPS = ("router_topk", "moe_experts")


def _split_gate_up(qt: QTensor) -> tuple[QTensor, QTensor]:
    """ffn_gate_up_exps [E, 2F, C] (gate rows first, as llama.cpp splits it) -> gate, up."""
    E, F2, C = qt.shape
    raw = qt.raw.reshape(E, F2, -1)
    half = F2 // 2

    def part(name: str, rows: slice) -> QTensor:
        data = np.ascontiguousarray(raw[:, rows]).reshape(E * half, -1)
        return QTensor(qt.name.replace("gate_up", name), qt.qtype, (E, half, C), data)

    return part("gate", slice(0, half)), part("up", slice(half, F2))


class HybridModel(Model):
    """Model for files whose spec.hybrid is set (engine.model.Model builds this for them)."""

    def __init__(self, gguf: GGUFModel, backend: Backend) -> None:
        needed = HYBRID_OPS + (MOE_OPS if gguf.spec.moe else ())
        missing = [op for op in needed if not backend.ops.has(op)]
        if missing:  # at load, not after the weights are on the device
            raise UnsupportedError(
                f"{gguf.path.name}: {gguf.spec.arch} models need the ops {', '.join(missing)}, "
                f"which backend {backend.name!r} does not have (numpy has them all)"
            )
        self.gguf = gguf
        self.spec = gguf.spec
        self.backend = backend
        self.weights = {}
        for name in gguf.model_tensor_names():
            qt = gguf.tensor(name)
            if name.endswith("ffn_gate_up_exps.weight"):
                for part in _split_gate_up(qt):
                    self.weights[part.name] = backend.load_weight(part)
                continue
            if name.endswith("ffn_gate_inp_shexp.weight") and len(qt.shape) == 1:
                qt = QTensor(qt.name, qt.qtype, (1, qt.shape[0]), qt.raw)  # a [1, C] matrix
            self.weights[name] = backend.load_weight(qt)
        head = "token_embd.weight" if self.spec.tied_embeddings else "output.weight"
        self.lm_head = self.weights[head]
        self.hook = None  # validate's blame and replay (see Model)
        self.state_hook = None
        # validate's teacher-forced routing: (layer, position) -> the reference's expert ids
        self.routes: dict[tuple[int, int], np.ndarray] = {}
        # drift-explained routing (proposed for validate, issue 15; off while empty): the
        # reference's router logits per (layer, position); where the candidate's own logits
        # agree with them within ``route_nmse`` (the class's per-op bound) yet pick another
        # top-k, the reference's choice is borrowed (see _forced_routes)
        self.route_ref: dict[tuple[int, int], np.ndarray] = {}
        self.route_nmse = 0.0
        # drift-explained borrowings so far: (layer, position, reference k-th minus (k+1)-th gap)
        self.routes_borrowed: list[tuple[int, int, float]] = []
        self._plans: dict[bool, P.TrunkPlan] = {}  # by whether MoE routes are forced

    def new_cache(self, capacity: int) -> HybridCache:
        s, b, ssm = self.spec, self.backend, self.spec.ssm
        check_cache_fits(b, s, capacity)
        kv_shape = (capacity, s.n_head_kv, s.head_dim)
        k, v, conv, state = [], [], [], []
        for i in range(s.n_layers):
            rec = s.is_recurrent(i)
            k.append(None if rec else b.upload(np.zeros(kv_shape, np.float32)))
            v.append(None if rec else b.upload(np.zeros(kv_shape, np.float32)))
            conv.append(
                b.upload(np.zeros((ssm.d_conv - 1, ssm.conv_dim), np.float32)) if rec else None
            )
            dk, dv = ssm.head_k_dim, ssm.head_v_dim
            state.append(b.upload(np.zeros((ssm.n_v_heads, dk, dv), np.float32)) if rec else None)
        return b.track_cache(HybridCache(k=k, v=v, capacity=capacity, conv=conv, ssm=state))

    # --- forward (Model.forward, prefill, forced_run and generate call trunk and head) ----
    def trunk(self, ids: Tensor, n: int, pos0: int, cache: HybridCache) -> Tensor:
        """n tokens at positions pos0.. through every layer -> hidden states [n, C]; the K/V of
        the attention layers and the recurrent state of the delta-net layers are updated. Every
        op's output passes ``_tap`` (validate's blame). With no hook watching, the layers go to
        the backend's fusion pass (Backend.trunk) as a plan."""
        b, s, w, tap = self.backend, self.spec, self.weights, self._tap
        x = tap("embedding", "token_embd", -1, b.ops.embedding(w["token_embd.weight"], ids), pos0)
        if self.hook is None:
            return b.trunk(self.plan, x, n, pos0, cache)
        for i in range(s.n_layers):
            p = f"blk.{i}."
            h = tap(
                "rms_norm",
                "attn_norm",
                i,
                b.ops.rms_norm(x, w[p + "attn_norm.weight"], s.rms_eps),
                pos0,
            )
            if s.is_recurrent(i):
                mix = self._delta_net(h, n, i, pos0, cache)
            else:
                mix = self._attention(h, n, i, pos0, cache)
            x = tap("add", "attn_residual", i, b.ops.add(x, mix), pos0)
            h = b.ops.rms_norm(x, w[p + "post_attention_norm.weight"], s.rms_eps)
            h = tap("rms_norm", "post_attention_norm", i, h, pos0)
            x = tap("add", "ffn_residual", i, b.ops.add(x, self._ffn(h, i, pos0)), pos0)
        return x

    @property
    def plan(self) -> P.TrunkPlan:  # type: ignore[override]
        """The layers as the backend's fusion pass takes them (Backend.trunk). Under forced MoE
        routes (validate) the FFNs are the model's own op-by-op _ffn, which applies them."""
        forced = bool(self.routes or self.route_ref)
        if forced not in self._plans:
            self._plans[forced] = P.TrunkPlan(
                tuple(self._layer_plan(i, forced) for i in range(self.spec.n_layers)), self.spec
            )
        return self._plans[forced]

    def _layer_plan(self, i: int, forced: bool) -> P.Layer:
        s, w, p = self.spec, self.weights, f"blk.{i}."
        mixer: P.GatedAttention | P.DeltaNet
        if s.is_recurrent(i):
            ba = ("ssm_ba",) if p + "ssm_ba.weight" in w else ("ssm_beta", "ssm_alpha")
            mixer = P.DeltaNet(
                w_in=tuple(w[p + nm + ".weight"] for nm in ("attn_qkv", "attn_gate", *ba)),
                conv=w[p + "ssm_conv1d.weight"],
                dt_bias=w[p + "ssm_dt.bias"],
                ssm_a=w[p + "ssm_a"],
                norm=w[p + "ssm_norm.weight"],
                out=w[p + "ssm_out.weight"],
            )
        else:
            mixer = P.GatedAttention(
                wqkv=tuple(w[p + f"attn_{t}.weight"] for t in "qkv"),
                q_norm=w[p + "attn_q_norm.weight"],
                k_norm=w[p + "attn_k_norm.weight"],
                out=w[p + "attn_output.weight"],
            )
        ffn: P.Ffn | P.Moe | P.ModelFfn
        if s.moe is None:
            ffn = P.Ffn(*(w[p + f"ffn_{t}.weight"] for t in ("gate", "up", "down")))
        elif forced:
            ffn = self._ffn
        else:
            ffn = P.Moe(*self._moe_weights(i))
        return P.Layer(w[p + "attn_norm.weight"], mixer, w[p + "post_attention_norm.weight"], ffn)

    def _out(self, o: Tensor, name: str, i: int, pos0: int) -> Tensor:
        """The mixer's output projection."""
        wt = self.weights[f"blk.{i}.{name}.weight"]
        return self._tap("matmul", name, i, self.backend.ops.matmul(o, wt), pos0)

    def _delta_net(self, h: Tensor, n: int, i: int, pos0: int, cache: HybridCache) -> Tensor:
        b, w, ssm, p = self.backend, self.weights, self.spec.ssm, f"blk.{i}."
        eps = self.spec.rms_eps

        def tap(op: str, label: str, t: Tensor) -> Tensor:
            return self._tap(op, label, i, t, pos0)

        Hk, Hv, dk, dv = ssm.n_k_heads, ssm.n_v_heads, ssm.head_k_dim, ssm.head_v_dim
        kd, rv = ssm.key_dim, Hv // Hk
        # the in-projections of h in one matmuls call: [T, 2Kd + Vd], [T, Vd], then b and a
        ba_names = ("ssm_ba",) if p + "ssm_ba.weight" in w else ("ssm_beta", "ssm_alpha")
        names = ("attn_qkv", "attn_gate", *ba_names)
        outs = b.ops.ssm_in(h, tuple(w[p + nm + ".weight"] for nm in names))
        qkv, z, *ba_out = (tap("matmul", nm, t) for nm, t in zip(names, outs, strict=True))
        if len(ba_out) == 1:  # qwen3next: per K head [b (rv), a (rv)], V heads grouped
            ba = b.ops.reshape(ba_out[0], (n, Hk, 2 * rv))
            beta_in = b.ops.reshape(tap("cols", "ssm_b", b.ops.cols(ba, 0, rv)), (n, Hv))
            alpha = b.ops.reshape(tap("cols", "ssm_a_in", b.ops.cols(ba, rv, 2 * rv)), (n, Hv))
        else:
            beta_in, alpha = ba_out  # [T, Hv] each
        conv_w = w[p + "ssm_conv1d.weight"]
        qkv = tap("ssm_conv", "ssm_conv", b.ops.ssm_conv(qkv, cache.conv[i], conv_w))
        self._tap_state("ssm_conv", "conv_state", i, cache.conv, pos0 + n - 1)
        q = b.ops.reshape(tap("cols", "ssm_q", b.ops.cols(qkv, 0, kd)), (n, Hk, dk))
        k = b.ops.reshape(tap("cols", "ssm_k", b.ops.cols(qkv, kd, 2 * kd)), (n, Hk, dk))
        v = tap("cols", "ssm_v", b.ops.cols(qkv, 2 * kd, 2 * kd + ssm.value_dim))
        v = b.ops.reshape(v, (n, Hv, dv))
        g, beta = b.ops.ssm_gates(alpha, beta_in, w[p + "ssm_dt.bias"], w[p + "ssm_a"])
        g = tap("ssm_gates", "ssm_g", g)
        beta = tap("ssm_gates", "ssm_beta_sigmoid", beta)
        o = b.ops.delta_net(q, k, v, g, beta, cache.ssm[i], ssm.v_order, eps)  # [T, Hv, dv]
        o = tap("delta_net", "ssm_scan", o)
        self._tap_state("delta_net", "ssm_state", i, cache.ssm, pos0 + n - 1)
        o = tap("rms_norm", "ssm_norm", b.ops.rms_norm(o, w[p + "ssm_norm.weight"], eps))
        # silu(z) * o on [T, Vd] rows (elementwise; a decode row's int8 form comes with it)
        o = tap("swiglu", "ssm_gated", b.ops.swiglu(z, b.ops.reshape(o, (n, ssm.value_dim))))
        return self._out(o, "ssm_out", i, pos0)

    def _attention(self, h: Tensor, n: int, i: int, pos0: int, cache: HybridCache) -> Tensor:
        b, s, w, p = self.backend, self.spec, self.weights, f"blk.{i}."
        H, Hkv, D = s.n_head, s.n_head_kv, s.head_dim

        def tap(op: str, label: str, t: Tensor) -> Tensor:
            return self._tap(op, label, i, t, pos0)

        qkv = b.ops.matmuls(h, tuple(w[p + f"attn_{t}.weight"] for t in "qkv"))
        qg, k, v = (tap("matmul", f"attn_{t}", y) for t, y in zip("qkv", qkv, strict=True))
        qg = b.ops.reshape(qg, (n, H, 2 * D))  # [q | gate] per head
        k, v = b.ops.reshape(k, (n, Hkv, D)), b.ops.reshape(v, (n, Hkv, D))
        q, gate = (
            tap("cols", "q", b.ops.cols(qg, 0, D)),
            tap("cols", "q_gate", b.ops.cols(qg, D, 2 * D)),
        )
        q = tap(
            "rms_norm", "attn_q_norm", b.ops.rms_norm(q, w[p + "attn_q_norm.weight"], s.rms_eps)
        )
        k = tap(
            "rms_norm", "attn_k_norm", b.ops.rms_norm(k, w[p + "attn_k_norm.weight"], s.rms_eps)
        )
        q = tap("rope_partial", "q", b.ops.rope_partial(q, pos0, s.rope_theta, s.rope_dim))
        k = tap("rope_partial", "k", b.ops.rope_partial(k, pos0, s.rope_theta, s.rope_dim))
        b.ops.kv_write(cache, i, k, v, pos0)
        # what landed in the cache at these positions (a hook always watches here: trunk hands
        # the unwatched layers to the backend's fusion pass)
        tap("kv_write", "k_cache", b.ops.rows(cache.k[i], pos0, pos0 + n))
        tap("kv_write", "v_cache", b.ops.rows(cache.v[i], pos0, pos0 + n))
        a = tap("attention", "attn", b.ops.attention(q, cache, i, pos0))  # [T, H, D]
        a = tap("sigmoid_mul", "attn_gated", b.ops.sigmoid_mul(gate, a))
        return self._out(b.ops.reshape(a, (n, H * D)), "attn_output", i, pos0)

    def _forced_routes(self, logits: Tensor, i: int, pos0: int) -> Tensor:
        """Push the experts the reference did not choose far down at the positions in
        ``routes`` (and, with ``route_ref``, where drift explains a differing choice): top-k
        then picks the reference's, with this path's own renormalised weights (shifting
        unchosen logits leaves the chosen ones' softmax over the k unchanged)."""
        if not self.routes and not self.route_ref:
            return logits
        b, n, E = self.backend, int(logits.shape[0]), self.spec.moe.n_expert
        forced = [(t, self.routes.get((i, pos0 + t))) for t in range(n)]
        if any((i, pos0 + t) in self.route_ref for t in range(n)):  # (never in a graph capture)
            forced = self._drift_routes(b.download(logits), i, pos0, forced)
        forced = [(t, ids) for t, ids in forced if ids is not None]
        if not forced:
            return logits
        mask = np.zeros((n, E), np.float32)
        for t, ids in forced:
            mask[t] = -1e4  # exp underflows to 0 in float32 softmax; finite, so no NaN
            mask[t, ids] = 0.0
        return b.ops.add(logits, b.upload(mask))

    def _drift_routes(self, z: np.ndarray, i: int, pos0: int, forced: list) -> list:
        """forced, plus the reference's top-k at rows whose top-k set differs from the
        reference's while the row's logits agree with it within ``route_nmse``: rounding the
        class admits moved a near-tie, not a fault of the router (a wrong router matmul moves
        more than that; a wrong top-k kernel moves no logit: neither is borrowed)."""
        k = self.spec.moe.n_expert_used
        out = []
        for t, ids in forced:
            zr = self.route_ref.get((i, pos0 + t))
            if ids is None and zr is not None:
                zc = np.asarray(z[t], np.float64)
                ref_ids = np.argsort(-zr, kind="stable")[:k]
                own = set(np.argsort(-zc, kind="stable")[:k].tolist())
                err = float(np.sum((zc - zr) ** 2) / max(float(np.sum(zr * zr)), 1e-30))
                if own != set(ref_ids.tolist()) and err <= self.route_nmse:
                    ids = ref_ids
                    srt = np.sort(zr)[::-1]
                    self.routes_borrowed.append((i, pos0 + t, float(srt[k - 1] - srt[k])))
            out.append((t, ids))
        return out

    def _moe_weights(self, i: int) -> tuple:
        """moe_ffn's weights of layer i: router, k, (gate, up, down), shared expert or None."""
        w, p = self.weights, f"blk.{i}."
        experts = tuple(w[p + f"ffn_{t}_exps.weight"] for t in ("gate", "up", "down"))
        shared = None
        if p + "ffn_up_shexp.weight" in w:
            names = ("gate_inp_shexp", "gate_shexp", "up_shexp", "down_shexp")
            shared = tuple(w[p + f"ffn_{t}.weight"] for t in names)
        return w[p + "ffn_gate_inp.weight"], self.spec.moe.n_expert_used, experts, shared

    def _ffn(self, h: Tensor, i: int, pos0: int) -> Tensor:
        b, w, moe, p = self.backend, self.weights, self.spec.moe, f"blk.{i}."

        def tap(op: str, label: str, t: Tensor) -> Tensor:
            return self._tap(op, label, i, t, pos0)

        if moe is None:
            gate = tap("matmul", "ffn_gate", b.ops.matmul(h, w[p + "ffn_gate.weight"]))
            up = tap("matmul", "ffn_up", b.ops.matmul(h, w[p + "ffn_up.weight"]))
            g = tap("swiglu", "ffn_swiglu", b.ops.swiglu(gate, up))
            return tap("matmul", "ffn_down", b.ops.matmul(g, w[p + "ffn_down.weight"]))
        logits = tap("matmul", "ffn_gate_inp", b.ops.matmul(h, w[p + "ffn_gate_inp.weight"]))
        logits = self._forced_routes(logits, i, pos0)
        ids, weights = b.ops.router_topk(logits, moe.n_expert_used)
        ids = tap("router_topk", "router_ids", ids)
        weights = tap("router_topk", "router_weights", weights)
        y = b.ops.moe_experts(
            h,
            ids,
            weights,
            w[p + "ffn_gate_exps.weight"],
            w[p + "ffn_up_exps.weight"],
            w[p + "ffn_down_exps.weight"],
        )
        y = tap("moe_experts", "ffn_moe", y)
        if p + "ffn_up_shexp.weight" not in w:
            return y
        gate, up = b.ops.matmuls(h, (w[p + "ffn_gate_shexp.weight"], w[p + "ffn_up_shexp.weight"]))
        gate, up = tap("matmul", "ffn_gate_shexp", gate), tap("matmul", "ffn_up_shexp", up)
        sh = tap("swiglu", "ffn_swiglu_shexp", b.ops.swiglu(gate, up))
        sh = tap("matmul", "ffn_down_shexp", b.ops.matmul(sh, w[p + "ffn_down_shexp.weight"]))
        sgate = tap(
            "matmul", "ffn_gate_inp_shexp", b.ops.matmul(h, w[p + "ffn_gate_inp_shexp.weight"])
        )
        return tap("add", "ffn_moe_shexp", b.ops.add(y, b.ops.sigmoid_mul(sgate, sh)))
