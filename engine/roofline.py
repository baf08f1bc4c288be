"""Roofline position of a bench figure (issue 14): the bytes one decode token streams and the
FLOPs one prefill token computes, from a model's tensor list, against the device class's
measured ceilings.

Decode is bandwidth-bound: every weight is read once per token (the token embedding: one row,
unless it is also the LM head; MoE experts: the used fraction, k of E), plus the KV cache of the
full-attention layers over the context and the delta-net state (read and written). Prefill is
compute-bound: 2 FLOPs per weight element a token meets (no LM head: only the last position runs
it) plus the attention products over the causal context. Delta-net scans and elementwise ops
are left out of both: they are small against the projections at these shapes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from engine.gguf_model import ModelSpec
from engine.quantize import row_bytes

KV_BYTES = 4  # both GPU backends keep the KV cache and the recurrent state in float32


@dataclass(frozen=True)
class Ceilings:
    """A device class's measured limits (not the datasheet's)."""

    copy_gb_s: float  # device-to-device copy: the most a decode stream can read per second
    fp16_tflops: float  # dense fp16 GEMM with fp32 accumulation
    source: str


CEILINGS: dict[str, Ceilings] = {
    "h200": Ceilings(
        copy_gb_s=4224.0,
        fp16_tflops=700.0,
        source="H200, measured 2026-11: cupy device copy (bench/gemv_bench.py) and a cuBLAS "
        "fp16 GEMM (scripts/device_cuda_bench.py (git history))",
    ),
}


@dataclass(frozen=True)
class Tensor:
    name: str
    qtype: str
    shape: tuple[int, ...]  # row-major; stacked experts [E, N, K]

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return row_bytes(self.qtype, self.shape[-1]) * math.prod(self.shape[:-1])


@dataclass(frozen=True)
class Work:
    """Per token: what decode reads and what prefill computes."""

    weight_bytes: int  # decode, weights read per token
    state_bytes: int  # decode, delta-net state read + written per token
    kv_bytes_per_pos: int  # decode, K and V read per token per context position
    matmul_flops: int  # prefill, weight GEMMs per token
    attn_flops_per_pos: int  # prefill, QK^T and PV per token per context position

    def decode_bytes(self, context: float) -> float:
        return self.weight_bytes + self.state_bytes + self.kv_bytes_per_pos * context

    def prefill_flops(self, context: float) -> float:
        return self.matmul_flops + self.attn_flops_per_pos * context


def model_work(spec: ModelSpec, tensors: Iterable[Tensor]) -> Work:
    moe = spec.moe
    used = moe.n_expert_used / moe.n_expert if moe else 1.0
    wbytes = flops = 0.0
    for t in tensors:
        if len(t.shape) < 2:  # norms and biases: read, no GEMM
            wbytes += t.nbytes
            continue
        share = used if "_exps" in t.name else 1.0
        if t.name == "token_embd.weight":
            # gathered: one row, unless it is also the LM head (decode reads it all then)
            wbytes += t.nbytes if spec.tied_embeddings else t.nbytes / t.shape[0]
            continue
        wbytes += t.nbytes * share
        if t.name != "output.weight":
            flops += 2.0 * t.elements * share
    attn_layers = sum(not spec.is_recurrent(i) for i in range(spec.n_layers))
    state = 0
    if spec.ssm:
        s = spec.ssm
        per_layer = s.n_v_heads * s.head_k_dim * s.head_v_dim + (s.d_conv - 1) * s.conv_dim
        state = 2 * KV_BYTES * per_layer * (spec.n_layers - attn_layers)
    return Work(
        weight_bytes=int(wbytes),
        state_bytes=state,
        kv_bytes_per_pos=2 * KV_BYTES * spec.n_head_kv * spec.head_dim * attn_layers,
        matmul_flops=int(flops),
        attn_flops_per_pos=4 * spec.n_head * spec.head_dim * attn_layers,
    )


def gguf_tensors(gguf: Any) -> list[Tensor]:
    """The tensor list of an opened engine.gguf_model.GGUFModel (memory-mapped: no data read)."""
    return [Tensor(n, (t := gguf.tensor(n)).qtype, t.shape) for n in gguf.tensor_names]


@dataclass(frozen=True)
class Position:
    """Where one bench figure sits: the rate it reaches and its share of the ceiling."""

    metric: str  # "decode" | "prefill"
    per_token: float  # bytes (decode) or FLOPs (prefill) per token
    achieved: float  # GB/s (decode) or TFLOP/s (prefill)
    ceiling: float | None
    fraction: float | None
    ceiling_tok_s: float | None  # tok/s at the ceiling

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        unit = "GB/s" if self.metric == "decode" else "TFLOP/s"
        s = f"{self.achieved:.3g} {unit}"
        if self.fraction is not None:
            s += f" ({self.fraction:.0%} of {self.ceiling:,.0f}; ceiling {self.ceiling_tok_s:,.0f}"
            s += " tok/s)"
        return s


def _position(metric: str, per: float, tok_s: float, ceil: float | None, unit: float) -> Position:
    rate = per * tok_s / unit
    return Position(metric, per, rate, ceil, rate / ceil if ceil else None,
                    ceil * unit / per if ceil else None)  # fmt: skip


def decode_position(
    work: Work, prompt_tokens: int, gen_tokens: int, tok_s: float, ceilings: Ceilings | None
) -> Position:
    per = work.decode_bytes(prompt_tokens + gen_tokens / 2)  # the mean context of the run
    return _position("decode", per, tok_s, ceilings.copy_gb_s if ceilings else None, 1e9)


def prefill_position(
    work: Work, prompt_tokens: int, tok_s: float, ceilings: Ceilings | None
) -> Position:
    per = work.prefill_flops(prompt_tokens / 2)  # causal: a token meets half the prompt
    return _position("prefill", per, tok_s, ceilings.fp16_tflops if ceilings else None, 1e12)
