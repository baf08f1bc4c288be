"""The NumPy reference backend's kernels. Few knobs: it is the oracle, not a fast path, but its
prefill chunking and weight cache are real choices, so the agent can run end to end on a CPU."""

from __future__ import annotations

from engine.quant_types import SUPPORTED
from engine.tuning.registry import REGISTRY, Variant

B = "numpy"

REGISTRY.register_prefill(
    B,
    32,
    doc="prompt in chunks of chunk_tokens tokens: batched matmul, RoPE, KV write, attention",
)

for _op in ("matmul_decode", "matmul_prefill"):
    REGISTRY.register(
        B,
        _op,
        [
            Variant(
                B,
                _op,
                "cached_f32",
                quant_types=SUPPORTED,
                source="engine/backends/numpy_ref.py",
                numeric="order_only",
                doc="dequantize each weight once to float32 and keep it (fast, 4 B/weight RAM)",
            ),
            Variant(
                B,
                _op,
                "ondemand",
                quant_types=SUPPORTED,
                source="engine/backends/numpy_ref.py",
                numeric="order_only",
                doc="dequantize the weight on every call (slow, no extra RAM)",
            ),
        ],
    )

for _op, _doc in [
    ("embedding", "dequantized rows of token_embd"),
    ("rms_norm", "float64 accumulation"),
    ("add", "residual and bias"),
    ("rope", "normal and neox"),
    ("kv_write", "into float32 cache"),
    ("attention", "causal GQA softmax attention"),
    ("swiglu", "silu(gate) * up"),
    ("argmax", "first maximum"),
]:
    REGISTRY.register(
        B,
        _op,
        [
            Variant(
                B,
                _op,
                "default",
                source="engine/backends/numpy_ref.py",
                doc=_doc,
                numeric="order_only",
            )
        ],
    )
