"""The NumPy reference of the hybrid ops (gated delta-net, gated attention, MoE), written plainly
in float64. Mixed into NumpyBackend; the op contract is in engine.backends.base.

Shapes: T tokens, Hk q/k heads of dk, Hv value heads of dv (r = Hv / Hk), Cc conv channels,
E experts, F expert width. State S of one V head is [dk, dv]: o = S^T q reads it column-wise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.backends.numpy_weight import NumpyWeight

_F64 = np.float64


def _f64(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=_F64)


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)  # log(1 + e^x) without overflow


def k_head_of_v(n_k: int, n_v: int, v_order: str) -> np.ndarray:
    """[Hv] index of the q/k head each V head reads."""
    j = np.arange(n_v)
    if v_order == "grouped":  # the checkpoint's order: r consecutive V heads share a K head
        return j // (n_v // n_k)
    if v_order == "tiled":  # qwen35 GGUF files: V heads reordered [K0, K1, .., K0, K1, ..]
        return j % n_k
    raise ValueError(f"v_order {v_order!r}: 'grouped' or 'tiled'")


def l2_normalize(x: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(sum x^2 + eps) over the last dim (the checkpoint's l2norm)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def delta_sequential(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray, S: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One token at a time. q, k [T, Hv, dk], v [T, Hv, dv], g, beta [T, Hv], S [Hv, dk, dv]
    -> (o [T, Hv, dv], S after the last token)."""
    S = S.copy()
    o = np.empty_like(v)
    for t in range(q.shape[0]):
        S *= np.exp(g[t])[:, None, None]  # decay
        kv = np.einsum("hkv,hk->hv", S, k[t])  # S^T k: what the state predicts for k
        u = beta[t][:, None] * (v[t] - kv)  # [Hv, dv] the delta-rule correction
        S += k[t][:, :, None] * u[:, None, :]  # S += k u^T
        o[t] = np.einsum("hkv,hk->hv", S, q[t])  # S^T q
    return o, S


def delta_chunked(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    S: np.ndarray,
    chunk: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The same recurrence in chunks of `chunk` tokens (the WY / triangular-solve form that
    llama.cpp's build_delta_net_chunking and FLA use): per chunk, with G_t = exp(cumsum g),
        (I + A) U = beta * (V - G * K S0),   A[t, s] = beta_t G_t/G_s k_t.k_s  (s < t)
        O = G * Q S0 + (M * Q K^T) U,          M[t, s] = G_t/G_s              (s <= t)
        S = G_L S0 + K^T ((G_L / G) * U)
    U [L, dv] holds the per-token corrections u_t of the sequential form."""
    T, Hv, dv = v.shape
    o = np.empty_like(v)
    S = S.copy()
    for c0 in range(0, T, chunk):
        c1 = min(c0 + chunk, T)
        L = c1 - c0
        lower = np.tril(np.ones((L, L), dtype=bool), -1)
        for h in range(Hv):
            Q, K, V = q[c0:c1, h], k[c0:c1, h], v[c0:c1, h]  # [L, dk], [L, dk], [L, dv]
            b = beta[c0:c1, h]  # [L]
            gam = np.cumsum(g[c0:c1, h])  # [L] log G
            ratio = np.exp(np.minimum(gam[:, None] - gam[None, :], 0.0))  # G_t/G_s, s <= t
            A = np.where(lower, b[:, None] * ratio * (K @ K.T), 0.0)  # [L, L]
            rhs = b[:, None] * (V - np.exp(gam)[:, None] * (K @ S[h]))  # [L, dv]
            U = np.linalg.solve(np.eye(L) + A, rhs)  # unit lower-triangular system
            M = np.where(np.tril(np.ones((L, L), dtype=bool)), ratio, 0.0)
            o[c0:c1, h] = np.exp(gam)[:, None] * (Q @ S[h]) + (M * (Q @ K.T)) @ U
            S[h] = np.exp(gam[-1]) * S[h] + K.T @ (np.exp(gam[-1] - gam)[:, None] * U)
    return o, S


class NumpyHybridOps:
    """The hybrid ops of NumpyBackend (needs self.config and NumpyWeight weights)."""

    def _rope_partial(self, x: np.ndarray, pos0: int, theta: float, n_rot: int) -> np.ndarray:
        T = x.shape[0]
        pos = np.arange(pos0, pos0 + T, dtype=_F64)[:, None]  # [T, 1]
        inv_freq = theta ** (-np.arange(0, n_rot, 2, dtype=_F64) / n_rot)  # [n_rot/2]
        ang = (pos * inv_freq)[:, None, :]  # [T, 1, n_rot/2]
        cos, sin = np.cos(ang), np.sin(ang)
        out = _f64(x).copy()
        x1, x2 = out[..., : n_rot // 2].copy(), out[..., n_rot // 2 : n_rot].copy()
        out[..., : n_rot // 2] = x1 * cos - x2 * sin
        out[..., n_rot // 2 : n_rot] = x2 * cos + x1 * sin
        return out.astype(np.float32)

    def _sigmoid_mul(self, gate: np.ndarray, x: np.ndarray) -> np.ndarray:
        return (_f64(x) * _sigmoid(_f64(gate))).astype(np.float32)

    def _ssm_conv(self, x: np.ndarray, state: np.ndarray, w: NumpyWeight) -> np.ndarray:
        wf = w.dense(True)  # [Cc, K]
        K = wf.shape[1]  # d_conv
        xs = np.concatenate([_f64(state), _f64(x)])  # [K-1+T, Cc]: the inputs before x, then x
        T = x.shape[0]
        y = np.zeros((T, x.shape[1]))
        for j in range(K):  # tap j of the kernel meets input t + j - (K-1); tap K-1 is token t
            y += wf[:, j].astype(_F64) * xs[j : j + T]
        state[...] = xs[T:]  # the last K-1 inputs, for the next call
        return _silu(y).astype(np.float32)

    def _ssm_gates(
        self, a: np.ndarray, b: np.ndarray, dt_bias: NumpyWeight, ssm_a: NumpyWeight
    ) -> tuple[np.ndarray, np.ndarray]:
        g = _softplus(_f64(a) + dt_bias.f32) * ssm_a.f32  # log-decay <= 0: ssm_a = -exp(A_log)
        return g.astype(np.float32), _sigmoid(_f64(b)).astype(np.float32)

    def _delta_net(
        self,
        q: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
        g: np.ndarray,
        beta: np.ndarray,
        state: np.ndarray,
        v_order: str,
        eps: float,
    ) -> np.ndarray:
        Hk, dk = q.shape[1], q.shape[2]
        kh = k_head_of_v(Hk, v.shape[1], v_order)
        qn = l2_normalize(_f64(q), eps)[:, kh] / np.sqrt(dk)  # [T, Hv, dk]
        kn = l2_normalize(_f64(k), eps)[:, kh]
        choice = self.config.knobs("delta_net")
        if choice.variant == "chunked" and q.shape[0] > 1:
            o, S = delta_chunked(qn, kn, _f64(v), _f64(g), _f64(beta), _f64(state), choice.chunk)
        else:
            o, S = delta_sequential(qn, kn, _f64(v), _f64(g), _f64(beta), _f64(state))
        state[...] = S
        return o.astype(np.float32)

    def _router_topk(self, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        z = _f64(logits)
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)  # softmax over all E experts
        ids = np.argsort(-p, axis=-1, kind="stable")[:, :k]  # [T, k] largest first
        w = np.take_along_axis(p, ids, axis=-1)
        w /= w.sum(axis=-1, keepdims=True)  # renormalise the chosen k
        return ids.astype(np.int32), w.astype(np.float32)

    def _expert(self, w: NumpyWeight, e: int) -> np.ndarray:
        """Expert e of a stacked [E, N, K] weight as float32 [N, K]."""
        if self.config.op("matmul_prefill").variant == "cached_f32":
            return w.dense(True)[e]
        n = w.qt.shape[1]
        return w.qt.dequantize_rows(np.arange(e * n, (e + 1) * n))

    def _moe_experts(
        self,
        x: np.ndarray,
        ids: np.ndarray,
        weights: np.ndarray,
        gate: NumpyWeight,
        up: NumpyWeight,
        down: NumpyWeight,
    ) -> np.ndarray:
        out = np.zeros(x.shape, dtype=_F64)
        x32 = x.astype(np.float32)
        for e in np.unique(ids):  # only the chosen experts are read
            rows, slot = np.nonzero(ids == e)  # tokens routed to e, and at which rank
            xe = x32[rows]  # [n, C]
            h = _silu(_f64(xe @ self._expert(gate, e).T)) * (xe @ self._expert(up, e).T)
            y = h.astype(np.float32) @ self._expert(down, e).T  # [n, C]
            out[rows] += weights[rows, slot][:, None] * y
        return out.astype(np.float32)
