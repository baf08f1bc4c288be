"""Synthetic hybrid models (qwen35 / qwen35moe / qwen3next): shapes, tensor plan and metadata.

Tensor names, shapes and metadata keys follow gguf-py's constants (MODEL_TENSORS of QWEN35,
QWEN35MOE and QWEN3NEXT) and llama.cpp's loaders for those architectures: delta-net layers have
attn_qkv, attn_gate, ssm_conv1d, ssm_dt.bias, ssm_a, ssm_ba (qwen3next) or ssm_beta + ssm_alpha
(qwen35*), ssm_norm, ssm_out; every full_attention_interval-th layer is gated full attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gguf import GGUFWriter

HYBRID_ARCHS = ("qwen35", "qwen35moe", "qwen3next")
MOE_ARCHS = ("qwen35moe", "qwen3next")


@dataclass(frozen=True)
class HybridPreset:
    """Shape of a hybrid. C width, D attention head dim, Hk/Hv delta-net heads of dk/dv."""

    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dim: int  # partial RoPE: rotated dims per head
    n_k_heads: int
    n_v_heads: int
    head_k_dim: int
    head_v_dim: int
    n_vocab: int
    n_ff: int = 0  # dense FFN (qwen35)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0
    d_conv: int = 4
    interval: int = 4  # full_attention_interval
    n_ctx: int = 32768
    rope_base: float = 1e7
    rms_eps: float = 1e-6
    fast: bool = False  # draw quantized blocks directly (engine.synth)
    repeat: bool = False  # and draw one chunk per tensor, the rest rotated copies (engine.synth)


HYBRID_PRESETS: dict[str, HybridPreset] = {
    # Hv = 2 Hk so the V-head order (tiled vs grouped) matters; 4 layers: 3 delta-net, 1 attention.
    "tiny": HybridPreset(
        4, 128, 4, 2, 32, 8, 2, 4, 32, 32, 512,
        n_ff=256, n_expert=8, n_expert_used=2, n_ff_exp=64, n_ff_shexp=64, n_ctx=4096,
    ),
    # The drift sentinel's model (engine.verify.sentinel): tiny's heads, with a vocabulary and FFN
    # widths that are no multiple of any tile (509 rows, K = 320 / 96).
    "ragged": HybridPreset(
        4, 128, 4, 2, 32, 8, 2, 4, 32, 32, 509,
        n_ff=320, n_expert=8, n_expert_used=2, n_ff_exp=96, n_ff_shexp=96, n_ctx=4096,
    ),
    # Qwen3.5-9B-like dense hybrid (32 layers, 8 of them full attention).
    "9b": HybridPreset(
        32, 4096, 16, 4, 256, 64, 16, 32, 128, 128, 248320, n_ff=12288, fast=True, repeat=True,
    ),
    # Qwen3.5-35B-A3B-like MoE: 256 experts, 8 routed + 1 shared, 40 layers (21 GB at Q4_K_M:
    # repeat keeps synth near disk speed; every 8 experts are a fresh draw, the rest rotations).
    "35b-a3b": HybridPreset(
        40, 2048, 16, 2, 256, 64, 16, 32, 128, 128, 248320,
        n_expert=256, n_expert_used=8, n_ff_exp=512, n_ff_shexp=512, fast=True, repeat=True,
    ),
}  # fmt: skip


def is_recurrent(p: HybridPreset, layer: int) -> bool:
    return (layer + 1) % p.interval != 0


def hybrid_plan(arch: str, p: HybridPreset, add: Callable[..., None]) -> None:
    """Every tensor in file order through add(name, shape, kind). kind: weight, norm, bias,
    ssm_a (negative decay rates), f32 (a matrix llama.cpp never quantizes)."""
    c, kd, vd = p.n_embd, p.n_k_heads * p.head_k_dim, p.n_v_heads * p.head_v_dim
    moe = arch in MOE_ARCHS
    add("token_embd.weight", (p.n_vocab, c), "embd")
    for i in range(p.n_layer):
        b = f"blk.{i}."
        add(b + "attn_norm.weight", (c,), "norm")
        if is_recurrent(p, i):
            add(b + "attn_qkv.weight", (2 * kd + vd, c), "weight")
            add(b + "attn_gate.weight", (vd, c), "weight")
            if arch == "qwen3next":
                add(b + "ssm_ba.weight", (2 * p.n_v_heads, c), "weight")
            else:
                add(b + "ssm_beta.weight", (p.n_v_heads, c), "weight")
                add(b + "ssm_alpha.weight", (p.n_v_heads, c), "weight")
            add(b + "ssm_conv1d.weight", (2 * kd + vd, p.d_conv), "conv")
            add(b + "ssm_dt.bias", (p.n_v_heads,), "bias")
            add(b + "ssm_a", (p.n_v_heads,), "ssm_a")
            add(b + "ssm_norm.weight", (p.head_v_dim,), "norm")
            add(b + "ssm_out.weight", (c, vd), "weight")
        else:
            add(b + "attn_q.weight", (2 * p.n_head * p.head_dim, c), "weight")
            add(b + "attn_k.weight", (p.n_head_kv * p.head_dim, c), "weight")
            add(b + "attn_v.weight", (p.n_head_kv * p.head_dim, c), "weight")
            add(b + "attn_q_norm.weight", (p.head_dim,), "norm")
            add(b + "attn_k_norm.weight", (p.head_dim,), "norm")
            add(b + "attn_output.weight", (c, p.n_head * p.head_dim), "weight")
        add(b + "post_attention_norm.weight", (c,), "norm")
        if not moe:
            add(b + "ffn_gate.weight", (p.n_ff, c), "weight")
            add(b + "ffn_up.weight", (p.n_ff, c), "weight")
            add(b + "ffn_down.weight", (c, p.n_ff), "weight")
            continue
        add(b + "ffn_gate_inp.weight", (p.n_expert, c), "f32")
        add(b + "ffn_gate_exps.weight", (p.n_expert, p.n_ff_exp, c), "weight")
        add(b + "ffn_up_exps.weight", (p.n_expert, p.n_ff_exp, c), "weight")
        add(b + "ffn_down_exps.weight", (p.n_expert, c, p.n_ff_exp), "weight")
        add(b + "ffn_gate_inp_shexp.weight", (c,), "bias")
        add(b + "ffn_gate_shexp.weight", (p.n_ff_shexp, c), "weight")
        add(b + "ffn_up_shexp.weight", (p.n_ff_shexp, c), "weight")
        add(b + "ffn_down_shexp.weight", (c, p.n_ff_shexp), "weight")
    add("output_norm.weight", (c,), "norm")
    add("output.weight", (p.n_vocab, c), "weight")


# GGUF hyper-parameters written straight from a preset's field: (writer method, field), in the
# order written (a file's bytes depend on it). SHAPE_KEYS: every preset's (synth.Preset too).
SHAPE_KEYS = (
    (GGUFWriter.add_block_count, "n_layer"),
    (GGUFWriter.add_context_length, "n_ctx"),
    (GGUFWriter.add_embedding_length, "n_embd"),
    (GGUFWriter.add_feed_forward_length, "n_ff"),
    (GGUFWriter.add_head_count, "n_head"),
    (GGUFWriter.add_head_count_kv, "n_head_kv"),
)
_HYBRID_KEYS = (
    (GGUFWriter.add_key_length, "head_dim"),
    (GGUFWriter.add_value_length, "head_dim"),
    (GGUFWriter.add_rope_dimension_count, "rope_dim"),
    (GGUFWriter.add_rope_freq_base, "rope_base"),
    (GGUFWriter.add_layer_norm_rms_eps, "rms_eps"),
    (GGUFWriter.add_ssm_conv_kernel, "d_conv"),
    (GGUFWriter.add_ssm_state_size, "head_k_dim"),
    (GGUFWriter.add_ssm_group_count, "n_k_heads"),
    (GGUFWriter.add_ssm_time_step_rank, "n_v_heads"),
)
_MOE_KEYS = (
    (GGUFWriter.add_expert_count, "n_expert"),
    (GGUFWriter.add_expert_used_count, "n_expert_used"),
    (GGUFWriter.add_expert_feed_forward_length, "n_ff_exp"),
    (GGUFWriter.add_expert_shared_feed_forward_length, "n_ff_shexp"),
)


def add_fields(w: GGUFWriter, p: object, keys: tuple[tuple[Callable[..., None], str], ...]) -> None:
    """Write each (writer method, field of the preset ``p``: a HybridPreset or synth.Preset) of
    ``keys``, in order."""
    for add, name in keys:
        add(w, getattr(p, name))


def add_hybrid_metadata(w: GGUFWriter, arch: str, p: HybridPreset) -> None:
    """The hyper-parameters llama.cpp's qwen35 / qwen3next loaders read."""
    add_fields(w, p, SHAPE_KEYS + _HYBRID_KEYS)
    w.add_ssm_inner_size(p.n_v_heads * p.head_v_dim)
    w.add_full_attention_interval(p.interval)
    if arch.startswith("qwen35"):
        # Text positions only: the sections of Qwen3.5's interleaved MRoPE reduce to plain RoPE.
        w.add_rope_dimension_sections([11, 11, 10, 0])
    if arch in MOE_ARCHS:
        add_fields(w, p, _MOE_KEYS)
