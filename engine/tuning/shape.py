"""A model's shape class: the dimensions that decide which tuned config fits it, as Triton's
autotune ``key=`` names the arguments that select a tuned config. Promoted configs are keyed by it
(engine/tuning/promoted.py): configs/<device class>/<family>/<shape key>.ctx<context>.toml.

The shape key lists the dimensions that are not zero, each as its abbreviation and value, then
the quant mix (the GGUF file type): ``l28-c1536-ff8960-h12-kv2-d128-v151936-q4_k_m`` is the
Qwen2.5-1.5B shape at Q4_K_M. Abbreviations (DIMS): l layers, c hidden size, ff FFN width, h
attention heads, kv KV heads, d head dim, v vocabulary; MoE: e experts, eu experts used, eff
expert FFN width, sff shared-expert FFN width; hybrids: rl delta-net (recurrent) layers, sk / sv
delta-net q-k / value heads, sdk / sdv their widths.

Distance between two shapes of one family (``ModelShape.distance``): the sum over the dimensions
of |log2((a + 1) / (b + 1))| (a factor of two in one dimension counts 1), plus QUANT_MISMATCH
when the quant mixes differ (other quant types run other kernels, whose knobs were not measured).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.gguf_model import GGUFModel, ModelSpec

# (field, abbreviation in the key), in key order
DIMS: tuple[tuple[str, str], ...] = (
    ("layers", "l"),
    ("hidden", "c"),
    ("ffn", "ff"),
    ("heads", "h"),
    ("kv_heads", "kv"),
    ("head_dim", "d"),
    ("vocab", "v"),
    ("experts", "e"),
    ("experts_used", "eu"),
    ("expert_ffn", "eff"),
    ("shared_ffn", "sff"),
    ("recurrent_layers", "rl"),
    ("ssm_k_heads", "sk"),
    ("ssm_v_heads", "sv"),
    ("ssm_k_dim", "sdk"),
    ("ssm_v_dim", "sdv"),
)
QUANT_MISMATCH = 8.0  # as far as a factor of 256 in one dimension


@dataclass(frozen=True)
class ModelShape:
    """What a config was tuned on: the family, the dimensions (every name of DIMS, in order)
    and the quant mix (``q4_k_m``, ``f16``, ...)."""

    family: str
    dims: tuple[tuple[str, int], ...]
    quant: str

    @property
    def key(self) -> str:
        abbr = dict(DIMS)
        parts = [f"{abbr[name]}{v}" for name, v in self.dims if v]
        return "-".join([*parts, self.quant])

    def dim(self, name: str) -> int:
        return dict(self.dims)[name]

    def distance(self, other: ModelShape) -> float:
        """How far apart two shapes are (the module's docstring); inf across families."""
        if other.family != self.family:
            return math.inf
        theirs = dict(other.dims)
        d = sum(abs(math.log2((v + 1) / (theirs[k] + 1))) for k, v in self.dims)
        return d + (QUANT_MISMATCH if other.quant != self.quant else 0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape_key": self.key,
            "family": self.family,
            "quant": self.quant,
            "dims": dict(self.dims),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModelShape:
        """The inverse of to_dict; a dimension the record lacks is 0 (the key is recomputed from
        the dimensions, never read). ConfigError names what is malformed."""
        family, quant, dims = d.get("family"), d.get("quant"), d.get("dims")
        if not isinstance(family, str) or not family or not isinstance(quant, str) or not quant:
            raise ConfigError("the shape record needs a family and a quant (strings)")
        if not isinstance(dims, Mapping):
            raise ConfigError("the shape record needs a [dims] table")
        out = []
        for name, _ in DIMS:
            v = dims.get(name, 0)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"shape dimension {name} = {v!r}: must be an integer >= 0")
            out.append((name, v))
        return cls(family, tuple(out), quant)


def model_shape(spec: ModelSpec, quant: str) -> ModelShape:
    """The shape of a model of this spec and quant mix: the one function that defines it."""
    moe, ssm = spec.moe, spec.ssm
    dims = {
        "layers": spec.n_layers,
        "hidden": spec.n_embd,
        "ffn": spec.n_ff,
        "heads": spec.n_head,
        "kv_heads": spec.n_head_kv,
        "head_dim": spec.head_dim,
        "vocab": spec.n_vocab,
        "experts": moe.n_expert if moe else 0,
        "experts_used": moe.n_expert_used if moe else 0,
        "expert_ffn": moe.n_ff_exp if moe else 0,
        "shared_ffn": moe.n_ff_shexp if moe else 0,
        "recurrent_layers": sum(spec.recurrent),
        "ssm_k_heads": ssm.n_k_heads if ssm else 0,
        "ssm_v_heads": ssm.n_v_heads if ssm else 0,
        "ssm_k_dim": ssm.head_k_dim if ssm else 0,
        "ssm_v_dim": ssm.head_v_dim if ssm else 0,
    }
    return ModelShape(spec.family, tuple((name, int(dims[name])) for name, _ in DIMS), quant)


def file_type_name(file_type: int) -> str:
    """``general.file_type`` as a quant-mix name: MOSTLY_Q4_K_M -> q4_k_m, ALL_F32 -> f32."""
    from gguf import LlamaFileType

    try:
        name = LlamaFileType(file_type).name.lower()
    except ValueError:
        return f"ftype{file_type}"
    for prefix in ("mostly_", "all_"):
        name = name.removeprefix(prefix)
    return name


def quant_mix(gguf: GGUFModel) -> str:
    """The file's quant mix: its ``general.file_type``, else the commonest 2-D weight type."""
    ft = gguf.metadata.get("general.file_type")
    if isinstance(ft, int):
        return file_type_name(ft)
    counts = gguf.quant_summary()
    return max(sorted(counts), key=counts.__getitem__).lower() if counts else "unknown"


def shape_of(gguf: GGUFModel) -> ModelShape:
    """An opened model file's shape."""
    return model_shape(gguf.spec, quant_mix(gguf))
