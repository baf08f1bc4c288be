"""The caches a model's forward writes: K/V per attention layer and a hybrid's recurrent state.
Backends fill them with their own tensors (Backend.new_kv_cache; HybridModel.new_cache)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Tensor = Any


@dataclass
class KVCache:
    """Per-layer K and V storage of ``capacity`` positions: k[layer], v[layer] are [S, Hkv, D]."""

    k: list[Tensor]
    v: list[Tensor]
    capacity: int

    def check_room(self, pos0: int, T: int) -> None:
        """Raise ValueError unless positions pos0 .. pos0+T-1 fit (every backend's one check)."""
        if pos0 + T > self.capacity:
            raise ValueError(
                f"KV cache full: writing positions {pos0}..{pos0 + T - 1} "
                f"into a cache of {self.capacity}"
            )


@dataclass
class HybridCache(KVCache):
    """A hybrid's cache: K/V for its full-attention layers (None at delta-net layers) and, beside
    it, the recurrent state of each delta-net layer (None at attention layers): conv[layer] the
    last d_conv-1 inputs of the conv [d_conv-1, conv_dim], ssm[layer] the matrix state S per V
    head [Hv, dk, dv]. Prefill leaves both for decode; the ops update them in place."""

    conv: list[Tensor | None] = field(default_factory=list)
    ssm: list[Tensor | None] = field(default_factory=list)
