"""The memory model: what a config holds on the device for one model at one context, estimated
from the GGUF's tensor list and metadata (no device, nothing loaded), so the agent can rule a
config out before it compiles.

    weights   every loaded tensor as the backend keeps it (Registry.loaded_bytes: blocks as in the
              file, 1-D tensors as float32), plus the copies the chosen variants keep beside them
              (Variant.memory: NumPy's float32 cache, the fp16 copies of matmul_prefill.resident)
    kv/state  K and V of every full-attention layer at ``context_tokens`` positions (float32, as
              every backend allocates them), and a hybrid's recurrent state (conv and S per layer)
    scratch   a prefill chunk's activations and the logits (a rough bound), plus the scratch
              buffers the chosen variants declare (CUDA staged's scratch_mb)

Copies are named: two variants keeping the same copy (NumPy's decode and prefill float32 cache)
count it once. Measured against engine.backends' memory_report on the tiny model in
tests/agent/test_memory.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.roofline import KV_BYTES, Tensor

if TYPE_CHECKING:
    from engine.gguf_model import GGUFModel, ModelSpec

GiB = 2**30


@dataclass(frozen=True)
class ModelShape:
    """What the memory model reads of a model: its spec and the tensors the engine loads."""

    spec: ModelSpec
    tensors: tuple[Tensor, ...]

    @classmethod
    def of(cls, gguf: GGUFModel) -> ModelShape:
        """From an opened GGUF (memory-mapped: only metadata and tensor headers are read)."""
        out = []
        for n in gguf.model_tensor_names():
            t = gguf.tensor(n)
            shape = tuple(int(s) for s in t.shape)
            if n.endswith("ffn_gate_inp_shexp.weight") and len(shape) == 1:
                shape = (1, shape[0])  # loaded as a [1, C] matrix (engine.hybrid)
            out.append(Tensor(n, t.qtype, shape))
        return cls(gguf.spec, tuple(out))

    @classmethod
    def read(cls, path: str | Any) -> ModelShape:
        from engine.gguf_model import open_model

        return cls.of(open_model(path))

    @property
    def lm_head(self) -> str:
        return "token_embd.weight" if self.spec.tied_embeddings else "output.weight"

    def matrices(self, lm_head: bool = False, stacked: bool = True) -> list[Tensor]:
        """The weights a matmul reads: the layers' 2-D projections (and 3-D stacked experts when
        ``stacked``), the LM head when ``lm_head``; not the embedding's gather or the conv."""
        out = []
        for t in self.tensors:
            if t.name == self.lm_head:
                if lm_head:
                    out.append(t)
            elif (
                t.name.startswith("blk.")
                and len(t.shape) >= 2
                and (stacked or len(t.shape) == 2)
                and "ssm_conv1d" not in t.name
            ):
                out.append(t)
        return out


@dataclass(frozen=True)
class MemoryCost:
    """What a variant holds beyond the loaded weights, in bytes: ``copies`` kept beside the
    weights, by name (a copy two variants keep is counted once), and ``scratch`` buffers."""

    copies: Mapping[str, int] = field(default_factory=dict)
    scratch: Mapping[str, int] = field(default_factory=dict)


# Variant.memory: (model shape, context tokens, the variant's knob values) -> its cost
MemoryFn = Callable[[ModelShape, int, Mapping[str, Any]], MemoryCost]


def dense_copies(
    dtype_bytes: int,
    form: str,
    lm_head: bool = False,
    stacked: bool = True,
    pad: Callable[[int, int], tuple[int, int]] = lambda n, k: (n, k),
) -> MemoryFn:
    """A variant that keeps a dense copy (``dtype_bytes`` per element, named ``form``) of every
    matmul weight (ModelShape.matrices); ``pad`` maps a matrix's (N, K) to the copy's."""

    def cost(shape: ModelShape, context_tokens: int, params: Mapping[str, Any]) -> MemoryCost:
        copies = {}
        for t in shape.matrices(lm_head=lm_head, stacked=stacked):
            n, k = pad(math.prod(t.shape[:-1]), t.shape[-1])
            copies[f"{form}:{t.name}"] = dtype_bytes * n * k
        return MemoryCost(copies=copies)

    return cost


def loaded_default(t: Tensor) -> int:
    """A loaded tensor's bytes: 1-D tensors (norms, biases) dequantized to float32, the rest as
    the file's blocks."""
    return 4 * t.elements if len(t.shape) == 1 else t.nbytes


def kv_state_bytes(spec: ModelSpec, context_tokens: int) -> int:
    """K and V of the full-attention layers at ``context_tokens`` positions, and a hybrid's
    recurrent state (float32, as engine.model / engine.hybrid allocate them)."""
    attn = sum(not spec.is_recurrent(i) for i in range(spec.n_layers))
    kv = 2 * KV_BYTES * context_tokens * spec.n_head_kv * spec.head_dim * attn
    if spec.ssm is None:
        return kv
    s = spec.ssm
    per = (s.d_conv - 1) * s.conv_dim + s.n_v_heads * s.head_k_dim * s.head_v_dim
    return kv + KV_BYTES * per * (spec.n_layers - attn)


def activation_bytes(spec: ModelSpec, chunk_tokens: int) -> int:
    """A rough bound on a prefill chunk's live activations: the residual, a norm, q/k/v,
    attention out, gate/up/act, a few copies in flight (x2), and one row of logits."""
    width = 4 * spec.n_embd + (spec.n_head + 2 * spec.n_head_kv) * spec.head_dim
    width += 3 * (spec.moe.n_ff_exp if spec.moe else spec.n_ff)
    return 2 * 4 * chunk_tokens * width + 4 * spec.n_vocab


@dataclass(frozen=True)
class MemoryEstimate:
    """A config's estimated footprint for one model at ``context_tokens``, in bytes.
    ``weight_bytes`` includes ``copy_bytes`` (the chosen variants' copies)."""

    weight_bytes: int
    kv_state_bytes: int
    scratch_bytes: int
    context_tokens: int
    copy_bytes: int = 0
    by_variant: dict[str, int] = field(default_factory=dict)  # "op.variant": its copies+scratch

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_state_bytes + self.scratch_bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "weight_bytes": self.weight_bytes,
            "kv_state_bytes": self.kv_state_bytes,
            "scratch_bytes": self.scratch_bytes,
            "total_bytes": self.total_bytes,
            "context_tokens": self.context_tokens,
            "copy_bytes": self.copy_bytes,
            "by_variant": dict(self.by_variant),
        }

    def over(self, budget_bytes: int | None) -> str:
        """Why this is over ``budget_bytes`` (one line), or "" when it fits or no budget."""
        if budget_bytes is None or self.total_bytes <= budget_bytes:
            return ""
        costly = ", ".join(
            f"{k} {gib(v)}" for k, v in sorted(self.by_variant.items(), key=lambda kv: -kv[1]) if v
        )
        return (
            f"estimated {gib(self.total_bytes)} > budget {gib(budget_bytes)} at "
            f"{self.context_tokens} tokens of context (weights {gib(self.weight_bytes)}, KV/state "
            f"{gib(self.kv_state_bytes)}, scratch {gib(self.scratch_bytes)}"
            + (f"; held by {costly}" if costly else "")
            + ")"
        )


def gib(n: int | float) -> str:
    """Bytes as GiB (MiB below 0.01 GiB)."""
    return f"{n / GiB:.2f} GiB" if n >= GiB / 100 else f"{n / 2**20:.2f} MiB"


def estimate(config: Any, shape: ModelShape, context_tokens: int) -> MemoryEstimate:
    """The footprint of ``config`` (a TuningConfig) on ``shape`` at ``context_tokens``, from the
    registry's declarations (Variant.memory, Registry.loaded_bytes)."""
    from engine.tuning.registry import REGISTRY

    loaded = REGISTRY.loaded_bytes.get(config.backend, loaded_default)
    base = sum(loaded(t) for t in shape.tensors)
    copies: dict[str, int] = {}
    scratch: dict[str, int] = {}
    by_variant: dict[str, int] = {}
    for op, choice in config.ops:
        v = REGISTRY.op(config.backend, op).variant(choice.variant)
        if v.memory is None:
            continue
        cost = v.memory(shape, context_tokens, dict(choice.params))
        new = {k: b for k, b in cost.copies.items() if k not in copies}
        copies.update(new)
        scratch.update(cost.scratch)
        by_variant[f"{op}.{v.name}"] = sum(new.values()) + sum(cost.scratch.values())
    copy_bytes = sum(copies.values())
    chunk = int(config.prefill_chunk)
    return MemoryEstimate(
        weight_bytes=base + copy_bytes,
        kv_state_bytes=kv_state_bytes(shape.spec, context_tokens),
        scratch_bytes=activation_bytes(shape.spec, chunk) + sum(scratch.values()),
        context_tokens=context_tokens,
        copy_bytes=copy_bytes,
        by_variant=by_variant,
    )


def smallest(
    configs: Iterable[Any], shape: ModelShape, context_tokens: int
) -> tuple[Any, MemoryEstimate]:
    """The config of ``configs`` with the smallest estimate, and that estimate."""
    best: tuple[Any, MemoryEstimate] | None = None
    for cfg in configs:
        est = estimate(cfg, shape, context_tokens)
        if best is None or est.total_bytes < best[1].total_bytes:
            best = (cfg, est)
    if best is None:
        raise ValueError("no config to estimate")
    return best
