"""Planted bugs of the hybrid family, as NumPy backends, for the verifier's mutation suite.

Each mutant breaks one thing the way a fast kernel does. With ``everywhere=False`` (the default)
only the batched prefill path (T > 1) is wrong, as a prefill kernel would be, so validate
(per-token reference vs batched candidate on one backend) must reject it; with ``everywhere=True``
both paths agree on the wrong model and only an independent reference (transformers) can.
"""

from __future__ import annotations

import numpy as np

from engine.backends.numpy_hybrid import k_head_of_v, l2_normalize
from engine.backends.numpy_ref import NumpyBackend


class _Mutant(NumpyBackend):
    everywhere = False
    candidate: dict = {}  # knobs the candidate config sets so the planted code path runs

    def _mutate(self, t: int) -> bool:
        return self.everywhere or t > 1


class SkNotStk(_Mutant):
    """The seed's warp-kernel bug: the state's prediction for k read row-wise, S k, instead of
    column-wise, S^T k (same shape when dk == dv, as in the real 128 x 128 heads)."""

    def _delta_net(self, q, k, v, g, beta, state, v_order, eps):  # noqa: ANN001, ANN201
        if not self._mutate(q.shape[0]):
            return super()._delta_net(q, k, v, g, beta, state, v_order, eps)
        kh = k_head_of_v(q.shape[1], v.shape[1], v_order)
        qn = l2_normalize(q.astype(np.float64), eps)[:, kh] / np.sqrt(q.shape[2])
        kn = l2_normalize(k.astype(np.float64), eps)[:, kh]
        S = state.astype(np.float64)
        o = np.empty(v.shape)
        for t in range(q.shape[0]):
            S *= np.exp(g[t])[:, None, None]
            kv = np.einsum("hkv,hv->hk", S, kn[t])  # BUG: S k
            u = beta[t][:, None] * (v[t] - kv)
            S += kn[t][:, :, None] * u[:, None, :]
            o[t] = np.einsum("hkv,hk->hv", S, qn[t])
        state[...] = S
        return o.astype(np.float32)


class StateNotCarried(_Mutant):
    """Prefill computes its outputs but never stores the final S: decode starts from the state
    before the prompt (zeros)."""

    def _delta_net(self, q, k, v, g, beta, state, v_order, eps):  # noqa: ANN001, ANN201
        keep = state.copy()
        out = super()._delta_net(q, k, v, g, beta, state, v_order, eps)
        if self._mutate(q.shape[0]):
            state[...] = keep  # BUG: the updated state is dropped
        return out


class ConvStateOffByOne(_Mutant):
    """The conv keeps the d_conv-1 inputs ending one before the last: the next call's window is
    shifted by a token."""

    def _ssm_conv(self, x, state, w):  # noqa: ANN001, ANN201
        before = np.concatenate([state, x])  # [K-1+T, Cc]
        y = super()._ssm_conv(x, state, w)
        if self._mutate(x.shape[0]):
            n = state.shape[0]
            state[...] = before[-n - 1 : -1]  # BUG: off by one
        return y


class RouterUnnormalised(_Mutant):
    """Top-k router weights left as softmax probabilities (they sum to < 1)."""

    def _router_topk(self, logits, k):  # noqa: ANN001, ANN201
        ids, w = super()._router_topk(logits, k)
        if not self._mutate(logits.shape[0]):
            return ids, w
        z = logits.astype(np.float64)
        p = np.exp(z - z.max(axis=-1, keepdims=True))
        p /= p.sum(axis=-1, keepdims=True)
        return ids, np.take_along_axis(p, ids.astype(np.int64), axis=-1).astype(np.float32)


class ChunkedNoIntraMask(_Mutant):
    """delta_net.chunked without the intra-chunk causal mask: O = G Q S0 + (ratio * Q K^T) U
    over the whole chunk, so each token also reads the corrections of the later tokens of its
    chunk. U and the carried state stay right (A is strictly lower): only outputs are wrong,
    and only where a chunk holds more than one token. Planted under the chunked variant, as the
    bug would live in its kernel."""

    candidate = {"delta_net.variant": "chunked", "delta_net.chunk": 4}

    def _delta_net(self, q, k, v, g, beta, state, v_order, eps):  # noqa: ANN001, ANN201
        choice = self.config.op("delta_net")
        if choice.variant != "chunked" or not self._mutate(q.shape[0]):
            return super()._delta_net(q, k, v, g, beta, state, v_order, eps)
        kh = k_head_of_v(q.shape[1], v.shape[1], v_order)
        Q = l2_normalize(q.astype(np.float64), eps)[:, kh] / np.sqrt(q.shape[2])
        K = l2_normalize(k.astype(np.float64), eps)[:, kh]
        V, G, B = v.astype(np.float64), g.astype(np.float64), beta.astype(np.float64)
        S = state.astype(np.float64)
        o = np.empty(v.shape)
        chunk = choice["chunk"]
        for c0 in range(0, q.shape[0], chunk):
            c = slice(c0, c0 + chunk)
            for h in range(v.shape[1]):
                gam = np.cumsum(G[c, h])
                L = gam.size
                ratio = np.exp(np.minimum(gam[:, None] - gam[None, :], 0.0))
                kk = K[c, h] @ K[c, h].T
                A = np.tril(B[c, h][:, None] * ratio * kk, -1)
                rhs = B[c, h][:, None] * (V[c, h] - np.exp(gam)[:, None] * (K[c, h] @ S[h]))
                U = np.linalg.solve(np.eye(L) + A, rhs)
                M = ratio  # BUG: not masked to s <= t
                o[c, h] = np.exp(gam)[:, None] * (Q[c, h] @ S[h]) + (M * (Q[c, h] @ K[c, h].T)) @ U
                decay = np.exp(gam[-1] - gam)[:, None]
                S[h] = np.exp(gam[-1]) * S[h] + K[c, h].T @ (decay * U)
        state[...] = S
        return o.astype(np.float32)


MUTANTS: dict[str, type[_Mutant]] = {
    "delta_net_Sk_not_STk": SkNotStk,
    "state_not_carried_to_decode": StateNotCarried,
    "conv_state_off_by_one": ConvStateOffByOne,
    "router_topk_unnormalised": RouterUnnormalised,
    "delta_net_chunked_no_intra_mask": ChunkedNoIntraMask,
}


def everywhere(cls: type[_Mutant]) -> type[_Mutant]:
    """The same bug in the per-token (decode) path too."""
    return type(cls.__name__ + "Everywhere", (cls,), {"everywhere": True})
