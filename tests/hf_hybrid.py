"""An independent reference for the hybrids: transformers' Qwen3Next / Qwen3.5 models with a tiny
random config on CPU torch, exported to GGUF with our writer (engine.synth_hybrid's metadata,
gguf's GGUFWriter) after the transforms llama.cpp's converter applies:

- every RMSNorm weight except the delta-net's gated norm: + 1 (HF multiplies by 1 + w);
- A_log -> ssm_a = -exp(A_log); dt_bias -> ssm_dt.bias; conv1d [Cc, 1, K] -> [Cc, K];
- qwen3next: in_proj_qkvz, grouped per K head as [q, k, v, z], -> attn_qkv [all q | all k |
  all v] and attn_gate (z); in_proj_ba kept as ssm_ba; experts' gate_up split in two;
- qwen35*: V heads reordered grouped -> tiled in in_proj_qkv's v rows, in_proj_z, in_proj_b/a,
  A_log, dt_bias, the conv's v channels and out_proj's columns; qwen35moe keeps the experts'
  gate_up fused (ffn_gate_up_exps).
Tensors are written F32, so the only differences left are the two implementations'.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGUFWriter

from engine.synth_hybrid import HybridPreset, add_hybrid_metadata

SHAPE = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=4,  # 3 delta-net layers, then full attention
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_conv_kernel_dim=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,  # square S as in the real models: S k runs, and is wrong
    linear_num_key_heads=2,
    linear_num_value_heads=6,  # 3 V heads per K head: grouped and tiled orders differ
    full_attention_interval=4,
    rms_norm_eps=1e-6,
    max_position_embeddings=512,
)
MOE = dict(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=24,
    shared_expert_intermediate_size=40,
)
ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}


def make_hf(arch: str, seed: int = 0) -> torch.nn.Module:
    """A tiny random transformers model of the architecture llama.cpp calls arch."""
    torch.manual_seed(seed)
    if arch == "qwen3next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        cfg = Qwen3NextConfig(**SHAPE, **MOE, intermediate_size=48, rope_parameters=ROPE)
        model = Qwen3NextForCausalLM(cfg)
    elif arch == "qwen35":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        cfg = Qwen3_5TextConfig(**SHAPE, intermediate_size=48, rope_parameters=ROPE)
        model = Qwen3_5ForCausalLM(cfg)
    elif arch == "qwen35moe":
        from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

        cfg = Qwen3_5MoeTextConfig(**SHAPE, **MOE, rope_parameters=ROPE)
        model = Qwen3_5MoeForCausalLM(cfg)
    else:
        raise ValueError(arch)
    with torch.no_grad():  # HF's init leaves norms at 0 and routers at 0: draw everything
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(1.0, 8.0)))
            elif name.endswith("dt_bias"):
                p.normal_(0.0, 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "norm" in name:
                p.normal_(0.0, 0.1)
            elif "embed_tokens" in name:
                p.normal_(0.0, 1.0)
            else:
                p.normal_(0.0, 1.0 / np.sqrt(p.shape[-1]))
    return model.eval()


def _reorder_v(t: np.ndarray, axis: int, n_k: int, r: int, d: int) -> np.ndarray:
    """Grouped V heads (K head-major: [K0v0, K0v1, .., K1v0, ..]) -> tiled ([K0v0, K1v0, ..])
    along axis, heads of d elements."""
    t = np.moveaxis(t, axis, 0)
    rest = t.shape[1:]
    t = t.reshape(n_k, r, d, *rest).transpose(1, 0, 2, *range(3, 3 + len(rest)))
    return np.moveaxis(t.reshape(n_k * r * d, *rest), 0, axis)


def hf_to_gguf_tensors(model: torch.nn.Module, arch: str) -> dict[str, np.ndarray]:
    cfg = model.config
    Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv, r = cfg.linear_key_head_dim, cfg.linear_value_head_dim, Hv // Hk
    kd = Hk * dk
    tiled = arch.startswith("qwen35")
    out: dict[str, np.ndarray] = {}
    sd = {k: v.detach().float().numpy().copy() for k, v in model.state_dict().items()}
    out["token_embd.weight"] = sd["model.embed_tokens.weight"]
    out["output_norm.weight"] = sd["model.norm.weight"] + 1
    out["output.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        src, dst = f"model.layers.{i}.", f"blk.{i}."
        out[dst + "attn_norm.weight"] = sd[src + "input_layernorm.weight"] + 1
        out[dst + "post_attention_norm.weight"] = sd[src + "post_attention_layernorm.weight"] + 1
        la = src + "linear_attn."
        if la + "A_log" in sd:

            def v_rows(t: np.ndarray, d: int, axis: int = 0) -> np.ndarray:
                return _reorder_v(t, axis, Hk, r, d) if tiled else t

            if arch == "qwen3next":
                w = sd[la + "in_proj_qkvz.weight"].reshape(Hk, 2 * dk + 2 * r * dv, -1)
                q, k = w[:, :dk], w[:, dk : 2 * dk]
                v, z = w[:, 2 * dk : 2 * dk + r * dv], w[:, 2 * dk + r * dv :]
                C = w.shape[-1]
                out[dst + "attn_qkv.weight"] = np.concatenate(
                    [q.reshape(-1, C), k.reshape(-1, C), v.reshape(-1, C)]
                )
                out[dst + "attn_gate.weight"] = z.reshape(-1, C)
                out[dst + "ssm_ba.weight"] = sd[la + "in_proj_ba.weight"]
            else:
                qkv = sd[la + "in_proj_qkv.weight"]
                out[dst + "attn_qkv.weight"] = np.concatenate(
                    [qkv[: 2 * kd], v_rows(qkv[2 * kd :], dv)]
                )
                out[dst + "attn_gate.weight"] = v_rows(sd[la + "in_proj_z.weight"], dv)
                out[dst + "ssm_beta.weight"] = v_rows(sd[la + "in_proj_b.weight"], 1)
                out[dst + "ssm_alpha.weight"] = v_rows(sd[la + "in_proj_a.weight"], 1)
            conv = sd[la + "conv1d.weight"][:, 0, :]  # [Cc, K]
            out[dst + "ssm_conv1d.weight"] = np.concatenate(
                [conv[: 2 * kd], v_rows(conv[2 * kd :], dv)]
            )
            out[dst + "ssm_dt.bias"] = v_rows(sd[la + "dt_bias"], 1)
            out[dst + "ssm_a"] = v_rows(-np.exp(sd[la + "A_log"]), 1)
            out[dst + "ssm_norm.weight"] = sd[la + "norm.weight"]  # no + 1: a plain weight
            out[dst + "ssm_out.weight"] = v_rows(sd[la + "out_proj.weight"], dv, axis=1)
        else:
            sa = src + "self_attn."
            for a, b in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
                out[dst + b + ".weight"] = sd[sa + a + ".weight"]
            out[dst + "attn_output.weight"] = sd[sa + "o_proj.weight"]
            out[dst + "attn_q_norm.weight"] = sd[sa + "q_norm.weight"] + 1
            out[dst + "attn_k_norm.weight"] = sd[sa + "k_norm.weight"] + 1
        mlp = src + "mlp."
        if mlp + "gate.weight" not in sd:
            for n in ("gate", "up", "down"):
                out[dst + f"ffn_{n}.weight"] = sd[mlp + f"{n}_proj.weight"]
            continue
        out[dst + "ffn_gate_inp.weight"] = sd[mlp + "gate.weight"]
        gate_up = sd[mlp + "experts.gate_up_proj"]  # [E, 2F, C], gate rows first
        if arch == "qwen35moe":
            out[dst + "ffn_gate_up_exps.weight"] = gate_up
        else:
            F = gate_up.shape[1] // 2
            out[dst + "ffn_gate_exps.weight"] = gate_up[:, :F]
            out[dst + "ffn_up_exps.weight"] = gate_up[:, F:]
        out[dst + "ffn_down_exps.weight"] = sd[mlp + "experts.down_proj"]
        out[dst + "ffn_gate_inp_shexp.weight"] = sd[mlp + "shared_expert_gate.weight"][0]
        for n in ("gate", "up", "down"):
            out[dst + f"ffn_{n}_shexp.weight"] = sd[mlp + f"shared_expert.{n}_proj.weight"]
    return out


def export_gguf(model: torch.nn.Module, arch: str, path: Path) -> Path:
    cfg = model.config
    moe = getattr(cfg, "num_experts", 0) or 0
    preset = HybridPreset(
        n_layer=cfg.num_hidden_layers,
        n_embd=cfg.hidden_size,
        n_head=cfg.num_attention_heads,
        n_head_kv=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        rope_dim=int(cfg.head_dim * ROPE["partial_rotary_factor"]),
        n_k_heads=cfg.linear_num_key_heads,
        n_v_heads=cfg.linear_num_value_heads,
        head_k_dim=cfg.linear_key_head_dim,
        head_v_dim=cfg.linear_value_head_dim,
        n_vocab=cfg.vocab_size,
        n_ff=getattr(cfg, "intermediate_size", 0) or 0,
        n_expert=moe,
        n_expert_used=cfg.num_experts_per_tok if moe else 0,
        n_ff_exp=cfg.moe_intermediate_size if moe else 0,
        n_ff_shexp=cfg.shared_expert_intermediate_size if moe else 0,
        d_conv=cfg.linear_conv_kernel_dim,
        interval=SHAPE["full_attention_interval"],
        n_ctx=cfg.max_position_embeddings,
        rope_base=ROPE["rope_theta"],
        rms_eps=cfg.rms_norm_eps,
    )
    w = GGUFWriter(path, arch)
    w.add_name(f"hf-{arch}-tiny")
    add_hybrid_metadata(w, arch, preset)
    for name, t in hf_to_gguf_tensors(model, arch).items():
        w.add_tensor(name, np.ascontiguousarray(t, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
