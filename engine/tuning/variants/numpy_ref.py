"""The NumPy reference backend's kernels. Few knobs: it is the oracle, not a fast path, but its
prefill chunking and weight cache are real choices, so the agent can run end to end on a CPU."""

from __future__ import annotations

from engine.quant_types import SUPPORTED
from engine.roofline import Tensor
from engine.tuning.memory import dense_copies
from engine.tuning.registry import HOST, REGISTRY, Param, variant

B = "numpy"

REGISTRY.register_prefill(
    B,
    32,
    doc="prompt in chunks of chunk_tokens tokens: batched matmul, RoPE, KV write, attention",
)

for _op in ("matmul_decode", "matmul_prefill"):
    REGISTRY.declare(
        B,
        _op,
        [
            variant(
                "cached_f32",
                quant_types=SUPPORTED,
                source="engine/backends/numpy_ref.py",
                numeric="order_only",
                # decode also meets the LM head (prefill's head runs on one row: decode's op);
                # stacked experts are cached under matmul_prefill's variant alone (_expert)
                memory=dense_copies(
                    4, "f32", lm_head=_op == "matmul_decode", stacked=_op == "matmul_prefill"
                ),
                doc="dequantize each weight once to float32 and keep it (fast, 4 B/weight RAM)",
            ),
            variant(
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
    # hybrid models (engine/hybrid.py; the ops are in engine/backends/numpy_hybrid.py)
    ("rope_partial", "neox RoPE of the first n_rot dims"),
    ("sigmoid_mul", "sigmoid-gated product"),
    ("cols", "a copy of a column range"),
    ("ssm_conv", "causal depthwise conv1d with state, SiLU"),
    ("ssm_gates", "g = softplus(a + dt_bias) * ssm_a, beta = sigmoid(b)"),
    ("router_topk", "softmax router, normalised top-k"),
    ("moe_experts", "SwiGLU experts, only the chosen ones read"),
]:
    REGISTRY.declare(
        B,
        _op,
        [
            variant(
                "default",
                source="engine/backends/numpy_ref.py",
                doc=_doc,
                numeric="order_only",
            )
        ],
    )

REGISTRY.declare(
    B,
    "delta_net",
    [
        variant(
            "sequential",
            source="engine/backends/numpy_hybrid.py",
            numeric="order_only",
            doc="gated delta rule one token at a time",
        ),
        variant(
            "chunked",
            params=(Param("chunk", (4, 8, 16, 32, 64), 64, "tokens per chunk", HOST),),
            source="engine/backends/numpy_hybrid.py",
            # float64 throughout, another summation order (a triangular solve per chunk)
            numeric="order_only",
            doc="WY form: a triangular solve per chunk, the state carried chunk to chunk",
        ),
    ],
    doc="gated delta-net scan (prefill; decode T == 1 is always sequential)",
)


def _loaded_bytes(t: Tensor) -> int:
    """The file's bytes (a view of the memory map), and a float32 copy of a 1-D weight
    (load_weight) and of the conv kernel (ssm_conv keeps one whatever the matmul variants)."""
    dense = len(t.shape) == 1 or "ssm_conv1d" in t.name
    return t.nbytes + (4 * t.elements if dense else 0)


REGISTRY.loaded_bytes[B] = _loaded_bytes
