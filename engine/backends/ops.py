"""The op set: what a model's op-by-op schedule, the fusion pass's plain steps and the op tests
call, as ``backend.ops.<op>(...)``.

It is its own interface, apart from the device contract (``Backend``: devices, tensors, memory,
profiling, the layer plan), the way ggml keeps its ops apart from ``ggml_backend_i``. A backend
implements each op as ``Backend._<op>`` (the abstract ones must be implemented; the hybrid and MoE
ops are optional, and a hybrid model checks ``ops.has`` at load). The shapes and the semantics of
each op are stated here, once; ``tests/backend_contract.py`` runs each against NumPy.

Shapes: T tokens in a chunk, C model width, N output rows of a weight, K its input width, H query
heads, Hkv key/value heads, D head dimension, V vocabulary, S KV-cache capacity.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.backends.cache import KVCache

Tensor = Any
Weight = Any

# Every op of the set, in the order above; the optional ones say so where a backend lacks them.
OP_NAMES = (
    "embedding", "rms_norm", "matmul", "matmuls", "ssm_in", "add", "rope", "rope_partial",
    "kv_write", "attention", "swiglu", "sigmoid_mul", "ssm_conv", "ssm_gates", "delta_net",
    "router_topk", "moe_experts", "argmax", "reshape", "rows", "cols",
)  # fmt: skip


class Ops:
    """One backend's ops. Ops return new tensors unless documented otherwise. Each call goes to
    the backend's ``_<op>``; profiling and tools may wrap an op on this object (an instance
    attribute), which every caller of ``backend.ops`` then goes through."""

    def __init__(self, backend: Any) -> None:  # a Backend (base.py imports this module)
        # a strong reference: `NumpyBackend().ops.add(...)` must work. The backend caches its
        # Ops, so the two form a cycle: a backend dropped without close() is freed by the
        # cyclic collector, not at once; the worker and the CLI close theirs (with-blocks).
        self._b = backend

    def has(self, op: str) -> bool:
        """Whether the backend implements op: not the base's default of an optional op, which
        raises UnsupportedError (marked ``unsupported``)."""
        return not getattr(getattr(self._b, "_" + op), "unsupported", False)

    # --- the dense model's ops ----------------------------------------------------------
    def embedding(self, table: Weight, ids: Tensor) -> Tensor:
        """ids [T] int32 -> rows of table [T, C] (dequantized)."""
        return self._b._embedding(table, ids)

    def rms_norm(self, x: Tensor, w: Weight, eps: float) -> Tensor:
        """Normalize over the last dim and scale by w: x [..., D], w [D]."""
        return self._b._rms_norm(x, w, eps)

    def matmul(self, x: Tensor, w: Weight) -> Tensor:
        """x [T, K] @ dequant(w)[N, K]^T -> [T, N]. T == 1 is decode (DMMV); T > 1 is a batched
        prefill chunk of at most config.prefill_chunk columns."""
        return self._b._matmul(x, w)

    def matmuls(self, x: Tensor, ws: tuple[Weight, ...]) -> tuple[Tensor, ...]:
        """x @ dequant(w)^T for each w of ws: projections of one activation (a hybrid layer's
        qkv, gate, beta and alpha), which a backend may run in fewer launches."""
        return self._b._matmuls(x, ws)

    def ssm_in(self, x: Tensor, ws: tuple[Weight, ...]) -> tuple[Tensor, ...]:
        """A gated delta-net layer's input projections of x (q/k/v, z, then beta and alpha):
        ``matmuls``, unless a backend's knob gives these their own arithmetic (CUDA's
        matmul_decode.float_ssm_in)."""
        return self._b._ssm_in(x, ws)

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """a + b, with b either a tensor of the same shape (residual) or a 1-D Weight [N]
        broadcast over rows (bias)."""
        return self._b._add(a, b)

    def rope(self, x: Tensor, pos0: int, theta: float, neox: bool) -> Tensor:
        """Rotary embedding of x [T, H, D] at positions pos0 .. pos0+T-1.
        neox pairs (i, i + D/2); normal pairs (2i, 2i + 1)."""
        return self._b._rope(x, pos0, theta, neox)

    def kv_write(self, cache: KVCache, layer: int, k: Tensor, v: Tensor, pos0: int) -> None:
        """Store k, v [T, Hkv, D] at positions pos0 .. pos0+T-1 of layer's cache (in place)."""
        return self._b._kv_write(cache, layer, k, v, pos0)

    def attention(self, q: Tensor, cache: KVCache, layer: int, pos0: int) -> Tensor:
        """Causal GQA attention: q [T, H, D] at positions pos0+t attends to cache positions
        0 .. pos0+t with scale 1/sqrt(D) -> [T, H, D]."""
        return self._b._attention(q, cache, layer, pos0)

    def swiglu(self, gate: Tensor, up: Tensor) -> Tensor:
        """silu(gate) * up, elementwise."""
        return self._b._swiglu(gate, up)

    def argmax(self, logits: Tensor) -> Tensor:
        """logits [T, V] -> [T] int32 on the device; the sampler downloads this, never a copy
        kept from an earlier step."""
        return self._b._argmax(logits)

    # --- hybrid ops (qwen35 / qwen3next; engine/hybrid.py): optional -------------------
    def rope_partial(self, x: Tensor, pos0: int, theta: float, n_rot: int) -> Tensor:
        """Neox RoPE of the first n_rot dims of each head of x [T, H, D] (frequencies over
        n_rot), the other D - n_rot dims unchanged."""
        return self._b._rope_partial(x, pos0, theta, n_rot)

    def sigmoid_mul(self, gate: Tensor, x: Tensor) -> Tensor:
        """x * sigmoid(gate); gate broadcasts ([T, 1] against [T, C])."""
        return self._b._sigmoid_mul(gate, x)

    def ssm_conv(self, x: Tensor, state: Tensor, w: Weight) -> Tensor:
        """Causal depthwise conv + SiLU: x [T, Cc], w [Cc, d_conv], state [d_conv-1, Cc] the
        inputs before x (updated in place to the last d_conv-1 inputs) -> [T, Cc]."""
        return self._b._ssm_conv(x, state, w)

    def ssm_gates(self, a: Tensor, b: Tensor, dt_bias: Weight, ssm_a: Weight) -> tuple:
        """a, b [T, Hv] -> (g = softplus(a + dt_bias) * ssm_a, beta = sigmoid(b)), both [T, Hv]."""
        return self._b._ssm_gates(a, b, dt_bias, ssm_a)

    def delta_net(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        state: Tensor,
        v_order: str,
        eps: float,
    ) -> Tensor:
        """Gated delta rule. q, k [T, Hk, dk] (L2-normalised here, q also by 1/sqrt(dk)),
        v [T, Hv, dv], g, beta [T, Hv]; V head j reads q/k head j // (Hv/Hk) ("grouped") or
        j % Hk ("tiled"). Per token and V head, with S = state[j] [dk, dv]:
        S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q. -> o [T, Hv, dv]; state in place."""
        return self._b._delta_net(q, k, v, g, beta, state, v_order, eps)

    def router_topk(self, logits: Tensor, k: int) -> tuple:
        """Softmax over experts of logits [T, E], the k largest, renormalised to sum to 1 ->
        (ids [T, k] int32, weights [T, k])."""
        return self._b._router_topk(logits, k)

    def moe_experts(
        self, x: Tensor, ids: Tensor, weights: Tensor, gate: Weight, up: Weight, down: Weight
    ) -> Tensor:
        """sum_j weights[t, j] * down_e(silu(gate_e x_t) * up_e x_t), e = ids[t, j]; gate, up
        [E, F, C], down [E, C, F]; x [T, C] -> [T, C]."""
        return self._b._moe_experts(x, ids, weights, gate, up, down)

    # --- views and slices ---------------------------------------------------------------
    def reshape(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """A view with a new shape (row-major, same element count)."""
        return self._b._reshape(x, shape)

    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Rows start..stop-1 of a [T, ...] tensor."""
        return self._b._rows(x, start, stop)

    def cols(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Elements start..stop-1 of the last dim of x (a contiguous copy)."""
        return self._b._cols(x, start, stop)
