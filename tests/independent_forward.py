"""An independent forward pass for tests: the whole sequence at once, float64, no KV cache,
no chunking, written straight from the architecture definition (not from engine.model), so the
engine's cached and chunked paths are checked against something that shares none of their code
beyond the reference dequantizer (gguf.quants)."""

from __future__ import annotations

import numpy as np

from engine.gguf_model import GGUFModel


class IndependentModel:
    def __init__(self, g: GGUFModel) -> None:
        self.s = g.spec
        self.g = g
        self._w: dict[str, np.ndarray] = {}

    def w(self, name: str) -> np.ndarray:
        if name not in self._w:
            self._w[name] = self.g.tensor(name).dequantize().astype(np.float64)
        return self._w[name]

    def _norm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.s.rms_eps) * w

    def _rope(self, x: np.ndarray) -> np.ndarray:  # x [T, H, D]
        T, _, D = x.shape
        half = D // 2
        freqs = 1.0 / self.s.rope_theta ** (np.arange(half) * 2.0 / D)
        ang = np.outer(np.arange(T), freqs)  # [T, D/2]
        c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        if self.s.rope_neox:  # rotate-half convention (HF "rotate_half")
            a, b = x[..., :half], x[..., half:]
            return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)
        a, b = x[..., 0::2], x[..., 1::2]  # interleaved pairs
        return np.stack([a * c - b * s, b * c + a * s], axis=-1).reshape(x.shape)

    def logits(self, ids: list[int]) -> np.ndarray:
        """Logits [T, V] for every position of ids."""
        s, T = self.s, len(ids)
        emb = self.g.tensor("token_embd.weight").dequantize_rows(np.array(ids)).astype(np.float64)
        x = emb
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for i in range(s.n_layers):
            p = f"blk.{i}."
            h = self._norm(x, self.w(p + "attn_norm.weight"))
            q, k, v = (h @ self.w(p + f"attn_{n}.weight").T for n in "qkv")
            if s.attn_bias:
                q = q + self.w(p + "attn_q.bias")
                k = k + self.w(p + "attn_k.bias")
                v = v + self.w(p + "attn_v.bias")
            q = q.reshape(T, s.n_head, s.head_dim)
            k = k.reshape(T, s.n_head_kv, s.head_dim)
            v = v.reshape(T, s.n_head_kv, s.head_dim)
            if s.qk_norm:
                q = self._norm(q, self.w(p + "attn_q_norm.weight"))
                k = self._norm(k, self.w(p + "attn_k_norm.weight"))
            q, k = self._rope(q), self._rope(k)
            rep = s.n_head // s.n_head_kv
            out = np.zeros((T, s.n_head, s.head_dim))
            for hh in range(s.n_head):
                sc = q[:, hh] @ k[:, hh // rep].T / np.sqrt(s.head_dim) + mask
                pr = np.exp(sc - sc.max(axis=1, keepdims=True))
                out[:, hh] = (pr / pr.sum(axis=1, keepdims=True)) @ v[:, hh // rep]
            x = x + out.reshape(T, -1) @ self.w(p + "attn_output.weight").T
            h = self._norm(x, self.w(p + "ffn_norm.weight"))
            gate, up = h @ self.w(p + "ffn_gate.weight").T, h @ self.w(p + "ffn_up.weight").T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ self.w(p + "ffn_down.weight").T
        x = self._norm(x, self.w("output_norm.weight"))
        head = "token_embd.weight" if s.tied_embeddings else "output.weight"
        return x @ self.w(head).T

    def greedy(self, ids: list[int], n: int) -> list[int]:
        seq = list(ids)
        out = []
        for _ in range(n):
            t = int(np.argmax(self.logits(seq)[-1]))
            out.append(t)
            seq.append(t)
        return out
