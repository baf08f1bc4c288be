"""The CUDA backend's kernels of the hybrid models (engine/hybrid.py: gated delta-net, gated
attention, MoE): shaders/cuda/delta_net.cu, moe.cu and hybrid.cu, run by
engine/backends/cuda/hybrid.py. Plain data, like engine.tuning.kernels.cuda.

Op, variant and knob names are the Vulkan backend's where it has the op (one name, one meaning
across backends): delta_net.sequential with state_transposed and max_dk, moe_experts.dmmv,
router_topk, ssm_conv, ssm_gates, sigmoid_mul. CUDA's own launch knobs keep CUDA's names
(threads, warps, rows_per_block, threads_per_row, vec), as in engine.tuning.kernels.cuda.
"""

from __future__ import annotations

from engine.tuning.kernels.cuda import ALL_TYPES
from engine.tuning.registry import PUSHED, REGISTRY, Param, Variant, define

B = "cuda"

REGISTRY.register(
    B,
    "delta_net",
    [
        Variant(
            B,
            "delta_net",
            "sequential",
            params=(
                Param(
                    "warps",
                    (1, 2, 4, 8),
                    4,
                    "warps per block, one state column each (grid: dv / warps x V heads)",
                    define("NW"),
                ),
                Param(
                    "state_transposed",
                    (False, True),
                    True,
                    "the delta-net state between calls as S^T [dv, dk] (a warp's column "
                    "contiguous: coalesced) instead of S [dk, dv] (a cache line per lane); the "
                    "seed's 7x was this choice on a warp-per-column kernel",
                    define("STATE_T"),
                ),
                Param(
                    "max_dk",
                    (64, 128, 256),
                    128,
                    "register array per warp for a state column, max_dk / 32 per lane (must be "
                    ">= the K head dim)",
                    define("MAX_DK"),
                ),
            ),
            source="cuda/delta_net.cu",
            numeric="order_only",
            doc="a warp per state column (lanes over its rows, in registers for the call), "
            "T tokens in sequence: decode and prefill; q/k L2 norm in the kernel",
        )
    ],
    doc="gated delta-net scan (hybrid models); max_dk >= the K head dim",
)

REGISTRY.register(
    B,
    "moe_experts",
    [
        Variant(
            B,
            "moe_experts",
            "dmmv",
            params=(
                Param("rows_per_block", (1, 2, 4, 8), 4, "expert rows per block", define("ROWS")),
                Param("threads_per_row", (16, 32, 64, 128), 32, "threads per row", define("TPR")),
                Param(
                    "vec",
                    (1, 2),
                    2,
                    "consecutive 16-weight groups per thread per step (load width)",
                    define("VEC"),
                ),
            ),
            quant_types=ALL_TYPES,
            source="cuda/moe.cu",
            numeric="order_only",
            doc="the decode DMMV per (token, chosen expert), the expert picked on the device "
            "from router_topk's ids (only chosen experts are read; graph-safe), SwiGLU, down, "
            "then a weighted sum per token (moe_combine)",
        )
    ],
    doc="routed experts of a MoE FFN (gate, up, SwiGLU, down, combine)",
)

_THREADS = Param("threads", (128, 256, 512, 1024), 256, "threads per block", PUSHED)
for _op, _variant, _doc in [
    ("ssm_conv", "default", "causal depthwise conv1d + SiLU, a thread per output; then the state"),
    ("ssm_gates", "default", "softplus decay and sigmoid beta"),
    ("sigmoid_mul", "default", "x * sigmoid(gate), gate per element or per row"),
    ("rope_partial", "pairs", "neox RoPE of the first n_rot dims, angle in double"),
]:
    REGISTRY.register(
        B,
        _op,
        [
            Variant(
                B,
                _op,
                _variant,
                params=(_THREADS,),
                source="cuda/hybrid.cu",
                numeric="order_only",
                doc=_doc,
            )
        ],
    )

REGISTRY.register(
    B,
    "router_topk",
    [
        Variant(
            B,
            "router_topk",
            "default",
            params=(
                Param("rows_per_block", (1, 2, 4, 8), 4, "tokens (a warp each) per block", PUSHED),
            ),
            source="cuda/hybrid.cu",
            numeric="order_only",
            doc="softmax, top-k, renormalised: a warp per token (<= 1024 experts, k <= 32)",
        )
    ],
)
