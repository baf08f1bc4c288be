"""Vulkan single-variant row ops: embedding, rms_norm, add, rope, kv_write,
swiglu and the hybrid models' elementwise ops."""

from __future__ import annotations

from engine.tuning.registry import HOST, REGISTRY, Constraint, Param, variant
from engine.tuning.variants.vulkan.common import QUANT_TYPES, B, _shared_fits, _wg, _wg_fits

_SIMPLE = [
    ("embedding", "default", "embedding.comp", (), "get_rows of a quantized table, ids on device"),
    ("rms_norm", "default", "rms_norm.comp", (), "one workgroup per row, shared-memory sum"),
    ("add", "default", "eltwise.comp", ("OP_ADD",), "residual add and broadcast bias"),
    ("rope", "table", "rope.comp", (), "normal and neox, float64-built cos/sin table"),
    ("kv_write", "default", "kv_write.comp", (), "k and v into the float32 cache"),
    ("swiglu", "default", "eltwise.comp", ("OP_SWIGLU",), "silu(gate) * up"),
    # hybrid models (engine/hybrid.py)
    ("sigmoid_mul", "default", "eltwise.comp", ("OP_SIGMOID_MUL",), "x * sigmoid(gate)"),
    ("cols", "default", "slice.comp", (), "a contiguous copy of a column range"),
    ("ssm_conv", "default", "ssm_conv.comp", (), "causal conv1d + SiLU, a thread per channel"),
    ("ssm_gates", "default", "ssm_gates.comp", (), "softplus decay and sigmoid beta"),
    ("router_topk", "default", "router_topk.comp", (), "softmax, top-k, renormalised"),
]
# Same name and meaning as CUDA's rope.fuse_kv.
_FUSE_KV = Param(
    "fuse_kv",
    (0, 1),
    0,
    "1: RoPE of q and k and the KV-cache write in one dispatch (rope.comp FUSE_KV; the q/k/v "
    "biases are added by mmvw as it stores, or by add dispatches); same arithmetic",
    HOST,
)
# With fuse_kv, the q/k/v bias adds in the same dispatch (Vulkan only).
_FUSE_BIAS = Param(
    "fuse_bias",
    (0, 1),
    0,
    "1 (with fuse_kv = 1): the q, k and v bias adds happen in the RoPE + KV-write dispatch as it "
    "reads q, k and v (rope.comp FUSE_BIAS): three add dispatches fewer per layer; same "
    "arithmetic",
    HOST,
)
# The residual add before each RMSNorm (after the o and down projections) in the norm's
# dispatch: engine.backends.vulkan.fused_norm (CUDA fuses it into its matmuls instead).
_FUSE_ADD = Param(
    "fuse_add",
    (0, 1),
    0,
    "1: the residual add before an RMSNorm (attention output and FFN residuals) in the norm's "
    "dispatch (rms_norm.comp ADD_RES): it stores the sum and the normed row; same arithmetic",
    HOST,
)
for _op, _variant, _src, _defines, _doc in _SIMPLE:
    _constraints = [_wg_fits(_op)]
    if _op == "rope":
        _constraints.append(
            Constraint(
                "fuse_bias needs fuse_kv (the bias adds ride on the RoPE + KV-write dispatch)",
                lambda cfg, dev: (
                    not int(cfg.knobs("rope").fuse_bias) or int(cfg.knobs("rope").fuse_kv) == 1
                ),
            )
        )
    if _op == "rms_norm":
        _constraints.append(_shared_fits(_op, 2))
    _params = (_wg(256), _FUSE_KV, _FUSE_BIAS) if _op == "rope" else (_wg(256),)
    _params = (_wg(256), _FUSE_ADD) if _op == "rms_norm" else _params
    REGISTRY.declare(
        B,
        _op,
        [
            variant(
                _variant,
                params=_params,
                constraints=tuple(_constraints),
                quant_types=QUANT_TYPES if _op == "embedding" else None,
                source=f"vulkan/{_src}",
                defines=_defines,
                numeric="order_only",
                doc=_doc,
            )
        ],
    )
