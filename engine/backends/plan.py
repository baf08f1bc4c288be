"""The layer plan a model hands its backend: each layer's weights and shapes, resolved once.

``Backend.trunk(plan, ...)`` runs the layers; which ops it fuses is the backend's own pass
(engine/backends/fusion.py), so a new fusion changes a backend, not the contract or the model.
The model keeps its op-by-op schedule for validate's hooks (engine/model.py, engine/hybrid.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from engine.backends.cache import KVCache
    from engine.gguf_model import ModelSpec

Weight = Any
Tensor = Any


@dataclass(frozen=True)
class Attention:
    """A dense layer's attention: q/k/v projections (with bias or not), RoPE of every dim."""

    wqkv: tuple[Weight, Weight, Weight]
    bias: tuple[Weight, Weight, Weight] | None
    out: Weight


@dataclass(frozen=True)
class GatedAttention:
    """A hybrid layer's attention: q carries a gate per head ([q | gate]), q and k are
    RMS-normalised per head, RoPE covers the first ``rope_dim`` dims, the output is gated."""

    wqkv: tuple[Weight, Weight, Weight]
    q_norm: Weight
    k_norm: Weight
    out: Weight


@dataclass(frozen=True)
class DeltaNet:
    """A gated delta-net layer. ``w_in``: the q/k/v projection, z, then either one packed
    beta/alpha weight (qwen3next: per K head [b, a]) or beta and alpha."""

    w_in: tuple[Weight, ...]
    conv: Weight
    dt_bias: Weight
    ssm_a: Weight
    norm: Weight
    out: Weight


@dataclass(frozen=True)
class Ffn:
    """A SwiGLU feed-forward block."""

    gate: Weight
    up: Weight
    down: Weight


@dataclass(frozen=True)
class Moe:
    """A mixture-of-experts feed-forward block: router, top-k, the experts' (gate, up, down) and
    an optional shared expert (gate_inp_shexp, gate, up, down)."""

    router: Weight
    k: int
    experts: tuple[Weight, Weight, Weight]
    shared: tuple[Weight, Weight, Weight, Weight] | None


# The model's own op-by-op FFN (h, layer, pos0) -> its output: a MoE whose routes validate
# forces runs through the model, since only the model knows the reference's routes.
ModelFfn = Callable[[Tensor, int, int], Tensor]


@dataclass(frozen=True)
class Layer:
    """One layer: the input norm, the mixer, the norm before the FFN, the FFN."""

    attn_norm: Weight
    mixer: Attention | GatedAttention | DeltaNet
    ffn_norm: Weight
    ffn: Ffn | Moe | ModelFfn


@dataclass(frozen=True)
class TrunkPlan:
    """Every layer of a model, in order, and the spec that gives their shapes."""

    layers: tuple[Layer, ...]
    spec: ModelSpec

    @property
    def has_moe(self) -> bool:
        return any(isinstance(layer.ffn, Moe) for layer in self.layers)


class AttnIn(NamedTuple):
    """The fusion pass's _attn_in step's arguments as one value: h [T, C] -> q [T, H, D] with
    RoPE, k (RoPE) and v written into layer's cache at pos0; heads = (H, Hkv, D). A backend
    hands it on to its own fused paths without restating the list."""

    h: Any
    wqkv: tuple[Any, Any, Any]
    bias: tuple[Any, Any, Any] | None
    cache: KVCache
    layer: int
    pos0: int
    heads: tuple[int, int, int]
    theta: float
    neox: bool


class DnGatedIn(NamedTuple):
    """The gated delta-net steps' inputs after q / k / v (``_delta_net_gated``,
    ``_delta_net_conv_gated``) as one value: the gate inputs a (alpha) and b (beta) [T, Hv],
    the layer's dt_bias and ssm_a, its recurrent state (updated in place), the V heads' order,
    eps, the output norm and z [T, Hv * dv] (the output gate)."""

    a: Any
    b: Any
    dt_bias: Any
    ssm_a: Any
    state: Any
    v_order: str
    eps: float
    norm: Any
    z: Any
