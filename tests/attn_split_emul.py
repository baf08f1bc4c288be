"""What the split-KV decode attention emulators share (tests of attn_tile and attn_vec): the
per-head walk over the active key ranges, the kernels' combine (16 ranges at a time, rescaled
online) and the check of an emulator against float64 attention."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.op_cases import attention_ref

# (q_h, k [S, D], v [S, D], first key, end key, scale) -> (max, sum, acc) of one key range
RangePart = Callable[[np.ndarray, np.ndarray, np.ndarray, int, int, np.float32], tuple]


def combine(parts: list[tuple], D: int) -> np.ndarray:
    """The combine kernel's arithmetic: the ranges' (max, sum, acc) 16 at a time, online."""
    M, Ls, a = -np.inf, np.float32(0), np.zeros(D, np.float32)
    for r0 in range(0, len(parts), 16):
        group = parts[r0 : r0 + 16]
        Mn = max(M, *(p[0] for p in group))
        cw = np.float32(0 if M == -np.inf else np.exp(M - Mn))
        a, Ls = a * cw, Ls * cw
        for mr, lr, pr in group:
            w = np.float32(np.exp(mr - Mn))
            Ls, a = Ls + lr * w, a + pr * w
        M = Mn
    return a / Ls


def split_attention(q, k, v, pos0: int, chunk: int, nact: int, part: RangePart) -> np.ndarray:  # noqa: ANN001
    """q [H, D], k, v [S, Hkv, D] -> out [H, D]: each head's nact ranges of chunk keys by
    ``part``, then combined."""
    H, D = q.shape
    G, L = H // k.shape[1], pos0 + 1
    scale = np.float32(1 / np.sqrt(D))
    out = np.zeros((H, D), np.float32)
    for h in range(H):
        kv = h // G
        ranges = [(s * chunk, min(L, (s + 1) * chunk)) for s in range(nact)]
        out[h] = combine([part(q[h], k[:, kv], v[:, kv], b, e, scale) for b, e in ranges], D)
    return out


def assert_equals_reference(model: Callable, H: int, Hkv: int, D: int, pos0: int) -> None:
    """model(q [H, D], k, v) on random inputs is float64 attention within NMSE 1e-10."""
    rng = np.random.default_rng(H + D + pos0)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    k = (2 * rng.standard_normal((pos0 + 1, Hkv, D))).astype(np.float32)
    v = rng.standard_normal((pos0 + 1, Hkv, D)).astype(np.float32)
    got = model(q[0], k, v)
    ref = attention_ref(q, k, v, pos0)[0]
    err = np.sum((got - ref) ** 2) / np.sum(ref**2)
    assert err < 1e-10, err
