"""The dense decoder (llama, qwen2, qwen3) as a backend-independent schedule of ops.

Two prefill paths, as in the seeds: ``per_token`` runs the decode step once per prompt token;
``batched`` pushes chunks of up to ``config.prefill_chunk`` tokens (``prefill.chunk_tokens``)
through batched matmul, RoPE, KV write and attention. Decode is one token at
a time. Sampling is greedy on the device: the token fed to the next step is the argmax tensor of
this step, and the host reads that same tensor, never a copy kept from an earlier step.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.backends import plan as P
from engine.backends.base import Backend, KVCache, Tensor
from engine.errors import ConfigError
from engine.gguf_model import GGUFModel, ModelSpec
from engine.tuning import TuningConfig

PREFILL_PATHS = ("batched", "per_token")
# (op, label, layer, states, pos): Model._tap_state's hook
StateHook = Callable[[str, str, int, list, int], None]


@dataclass
class Generation:
    prompt_tokens: list[int]
    tokens: list[int]  # generated, greedy
    last_logits: np.ndarray  # [V] float32, logits of the last prompt token
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_s: float = 0.0  # prompt in -> first generated token id on the host
    step_logits: list[np.ndarray] = field(default_factory=list)  # only when keep_logits


@dataclass
class ForcedRun:
    """Logits of one pass over a fixed token stream (validate's teacher forcing): the prompt,
    then ``tokens`` fed one decode step at a time. ``logits[pos]`` predicts token pos + 1;
    ``device_argmax[pos]`` is the backend's argmax of those logits (decode positions and the last
    prompt position)."""

    prompt_tokens: list[int]
    tokens: list[int]  # the continuation: greedy (reference) or forced (candidate)
    logits: dict[int, np.ndarray] = field(default_factory=dict)
    device_argmax: dict[int, int] = field(default_factory=dict)
    # MoE router logits by (layer, position), when validate's reference run records them
    router: dict[tuple[int, int], np.ndarray] = field(default_factory=dict)


def check_cache_fits(backend: Backend, spec: ModelSpec, capacity: int) -> None:
    """Estimate the KV cache before allocating it: one past the device's memory was a MemoryError
    of 46.6 TiB (or the OOM killer) from deep inside a run; refuse it in one line instead."""
    attn_layers = sum(not spec.is_recurrent(i) for i in range(spec.n_layers))
    need = 2 * attn_layers * capacity * spec.n_head_kv * spec.head_dim * 4  # float32 K and V
    have = backend.device_info().memory_bytes
    if have and need > have:
        raise ConfigError(
            f"a KV cache of {capacity:,} tokens needs {need / 2**30:,.1f} GiB, more than the "
            f"device's {have / 2**30:,.1f} GiB: use fewer prompt + generated tokens"
        )


class Model:
    """Weights of one GGUF on one backend, and the forward schedule of a dense file. Build one
    with engine.models.build_model, which gives a hybrid file (qwen35, qwen3next) the subclass
    engine.hybrid.HybridModel (it shares prefill and generate)."""

    def __init__(self, gguf: GGUFModel, backend: Backend) -> None:
        self.gguf = gguf
        self.spec: ModelSpec = gguf.spec
        self.backend = backend
        self.weights = {n: backend.load_weight(gguf.tensor(n)) for n in gguf.model_tensor_names()}
        head = "token_embd.weight" if self.spec.tied_embeddings else "output.weight"
        self.lm_head = self.weights[head]
        # validate's blame and replay: called with (op, label, layer, tensor, pos0) after every
        # op; a tensor it returns replaces the op's output downstream (engine.verify.op_replay)
        self.hook: Callable[[str, str, int, Tensor, int], Tensor | None] | None = None
        self.state_hook: StateHook | None = None  # hybrids' recurrent state (see _tap_state)

    @property
    def config(self) -> TuningConfig:
        return self.backend.config

    def set_config(self, config: TuningConfig) -> None:
        self.backend.set_config(config)

    def new_cache(self, capacity: int) -> KVCache:
        s = self.spec
        check_cache_fits(self.backend, s, capacity)
        return self.backend.new_kv_cache(s.n_layers, capacity, s.n_head_kv, s.head_dim)

    # --- forward ------------------------------------------------------------------------
    def _tap(self, op: str, label: str, layer: int, t: Tensor, pos0: int) -> Tensor:
        """Hand an op's output to ``self.hook`` (validate's blame and replay); returns it, or the
        tensor the hook gave back in its place (replay: the reference's value)."""
        if self.hook is not None:
            out = self.hook(op, label, layer, t, pos0)
            if out is not None:
                return out
        return t

    def _tap_state(self, op: str, label: str, layer: int, states: list, pos: int) -> None:
        """After op updated ``states[layer]`` in place (a recurrent state: the state after token
        position ``pos``), hand it to ``self.state_hook``, which may put another tensor of the
        same layout at ``states[layer]`` (replay: the reference's state)."""
        if self.state_hook is not None:
            self.state_hook(op, label, layer, states, pos)

    def trunk(self, ids: Tensor, n: int, pos0: int, cache: KVCache) -> Tensor:
        """n tokens (ids [n] int32 on the device) at positions pos0.. through every layer ->
        hidden states [n, C] (the KV cache is written). Every op's output passes ``_tap``."""
        b, s, w, tap = self.backend, self.spec, self.weights, self._tap
        H, Hkv, D = s.n_head, s.n_head_kv, s.head_dim
        x = tap("embedding", "token_embd", -1, b.ops.embedding(w["token_embd.weight"], ids), pos0)
        if self.hook is None and not s.qk_norm:
            return self.backend.trunk(self.plan, x, n, pos0, cache)
        for i in range(s.n_layers):
            p = f"blk.{i}."
            h = tap(
                "rms_norm",
                "attn_norm",
                i,
                b.ops.rms_norm(x, w[p + "attn_norm.weight"], s.rms_eps),
                pos0,
            )
            q, k, v = (
                tap("matmul", f"attn_{t}", i, b.ops.matmul(h, w[p + f"attn_{t}.weight"]), pos0)
                for t in "qkv"
            )
            if s.attn_bias:
                q = tap("add", "attn_q.bias", i, b.ops.add(q, w[p + "attn_q.bias"]), pos0)
                k = tap("add", "attn_k.bias", i, b.ops.add(k, w[p + "attn_k.bias"]), pos0)
                v = tap("add", "attn_v.bias", i, b.ops.add(v, w[p + "attn_v.bias"]), pos0)
            q = b.ops.reshape(q, (n, H, D))
            k = b.ops.reshape(k, (n, Hkv, D))
            v = b.ops.reshape(v, (n, Hkv, D))
            if s.qk_norm:  # qwen3: RMSNorm over each head's D values
                q = tap(
                    "rms_norm",
                    "attn_q_norm",
                    i,
                    b.ops.rms_norm(q, w[p + "attn_q_norm.weight"], s.rms_eps),
                    pos0,
                )
                k = tap(
                    "rms_norm",
                    "attn_k_norm",
                    i,
                    b.ops.rms_norm(k, w[p + "attn_k_norm.weight"], s.rms_eps),
                    pos0,
                )
            q = tap("rope", "q", i, b.ops.rope(q, pos0, s.rope_theta, s.rope_neox), pos0)
            k = tap("rope", "k", i, b.ops.rope(k, pos0, s.rope_theta, s.rope_neox), pos0)
            b.ops.kv_write(cache, i, k, v, pos0)
            if self.hook is not None:  # what landed in the cache at these positions
                tap("kv_write", "k_cache", i, b.ops.rows(cache.k[i], pos0, pos0 + n), pos0)
                tap("kv_write", "v_cache", i, b.ops.rows(cache.v[i], pos0, pos0 + n), pos0)
            a = tap(
                "attention",
                "attn",
                i,
                b.ops.reshape(b.ops.attention(q, cache, i, pos0), (n, H * D)),
                pos0,
            )
            x = tap(
                "add",
                "attn_residual",
                i,
                b.ops.add(
                    x,
                    tap(
                        "matmul",
                        "attn_output",
                        i,
                        b.ops.matmul(a, w[p + "attn_output.weight"]),
                        pos0,
                    ),
                ),
                pos0,
            )
            h = tap(
                "rms_norm",
                "ffn_norm",
                i,
                b.ops.rms_norm(x, w[p + "ffn_norm.weight"], s.rms_eps),
                pos0,
            )
            gate = tap("matmul", "ffn_gate", i, b.ops.matmul(h, w[p + "ffn_gate.weight"]), pos0)
            up = tap("matmul", "ffn_up", i, b.ops.matmul(h, w[p + "ffn_up.weight"]), pos0)
            g = tap("swiglu", "ffn_swiglu", i, b.ops.swiglu(gate, up), pos0)
            x = tap(
                "add",
                "ffn_residual",
                i,
                b.ops.add(
                    x, tap("matmul", "ffn_down", i, b.ops.matmul(g, w[p + "ffn_down.weight"]), pos0)
                ),
                pos0,
            )
        return x

    @functools.cached_property
    def plan(self) -> P.TrunkPlan:
        """The layers as the backend's fusion pass takes them (Backend.trunk), built once."""
        s, w = self.spec, self.weights

        def layer(i: int) -> P.Layer:
            p = f"blk.{i}."
            attn = P.Attention(
                wqkv=tuple(w[p + f"attn_{t}.weight"] for t in "qkv"),
                bias=tuple(w[p + f"attn_{t}.bias"] for t in "qkv") if s.attn_bias else None,
                out=w[p + "attn_output.weight"],
            )
            ffn = P.Ffn(*(w[p + f"ffn_{t}.weight"] for t in ("gate", "up", "down")))
            return P.Layer(w[p + "attn_norm.weight"], attn, w[p + "ffn_norm.weight"], ffn)

        return P.TrunkPlan(tuple(layer(i) for i in range(s.n_layers)), s)

    def head(self, x: Tensor, row: int, pos: int) -> Tensor:
        """Logits [1, V] of row ``row`` of hidden states x [n, C] (token position ``pos``)."""
        b = self.backend
        if x.shape[0] > 1:
            x = b.ops.rows(x, row, row + 1)
        x = self._tap(
            "rms_norm",
            "output_norm",
            -1,
            b.ops.rms_norm(x, self.weights["output_norm.weight"], self.spec.rms_eps),
            pos,
        )
        return self._tap("matmul", "lm_head", -1, b.ops.matmul(x, self.lm_head), pos)

    def forward(
        self, ids: Tensor, n: int, pos0: int, cache: KVCache, logits: bool = True
    ) -> Tensor:
        """n tokens (ids [n] int32 on the device) at positions pos0.. -> logits [1, V] of the
        last token (None when logits=False: an intermediate prefill chunk)."""
        x = self.trunk(ids, n, pos0, cache)
        if not logits:
            return None
        return self.head(x, n - 1, pos0 + n - 1)  # only the last token's logits are sampled

    def prefill(
        self,
        prompt: list[int],
        cache: KVCache,
        path: str = "batched",
        on_chunk: Callable[[int], None] | None = None,
    ) -> Tensor:
        """Run the prompt into the cache; returns the last token's logits [1, V].
        ``on_chunk(n)``: called after each chunk of n tokens is queued (engine run's bar)."""
        if not prompt:
            raise ValueError("empty prompt: at least one token is needed")
        if path not in PREFILL_PATHS:
            raise ValueError(f"prefill path {path!r}; choose one of {PREFILL_PATHS}")
        ids = self.backend.upload(np.asarray(prompt, dtype=np.int32))
        step = 1 if path == "per_token" else self.config.prefill_chunk
        logits = None
        for c0 in range(0, len(prompt), step):
            c1 = min(c0 + step, len(prompt))
            last = c1 == len(prompt)
            logits = self.forward(
                self.backend.ops.rows(ids, c0, c1), c1 - c0, c0, cache, logits=last
            )
            if on_chunk is not None:
                on_chunk(c1 - c0)
        return logits

    def forced_run(
        self,
        prompt: list[int],
        steps: int,
        path: str = "batched",
        forced: list[int] | None = None,
        sample: frozenset[int] | set[int] = frozenset(),
        graphs: bool = True,
    ) -> ForcedRun:
        """Prefill ``prompt`` (keeping the logits of positions in ``sample`` and the last one),
        then ``steps`` tokens: ``forced`` ones when given (teacher forcing), else the device's
        greedy tokens. ``graphs=False`` calls each decode step directly instead of through the
        backend's graph replay (blame needs every op to pass the hook)."""
        if not prompt:
            raise ValueError("empty prompt: at least one token is needed")
        if forced is not None and len(forced) < steps:
            raise ValueError(f"forced stream of {len(forced)} tokens for {steps} steps")
        b = self.backend
        P = len(prompt)
        cache = self.new_cache(P + steps)
        out = ForcedRun(list(prompt), [])
        ids = b.upload(np.asarray(prompt, dtype=np.int32))
        step = 1 if path == "per_token" else self.config.prefill_chunk
        tok = None
        for c0 in range(0, P, step):
            c1 = min(c0 + step, P)
            x = self.trunk(b.ops.rows(ids, c0, c1), c1 - c0, c0, cache)
            for pos in sorted(p for p in sample if c0 <= p < c1 and p != P - 1):
                out.logits[pos] = b.download(self.head(x, pos - c0, pos))[0]
            if c1 == P:
                lg = self.head(x, P - 1 - c0, P - 1)
                tok = b.ops.argmax(lg)
                out.logits[P - 1] = b.download(lg)[0]
                out.device_argmax[P - 1] = int(b.download(tok)[0])

        def one(t: Tensor, p: int) -> tuple[Tensor, Tensor]:
            lg = self.forward(t, 1, p, cache)
            return lg, b.ops.argmax(lg)

        cur = out.device_argmax[P - 1] if forced is None else forced[0]
        for i in range(steps):
            out.tokens.append(cur)
            if i == steps - 1:
                break
            pos = P + i
            t = b.upload(np.asarray([cur], dtype=np.int32))
            lg, tok = b.decode_step(one, t, pos, cache) if graphs else one(t, pos)
            out.logits[pos] = b.download(lg)[0]
            out.device_argmax[pos] = int(b.download(tok)[0])
            cur = out.device_argmax[pos] if forced is None else forced[i + 1]
        return out

    def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        path: str = "batched",
        stop: set[int] | frozenset[int] = frozenset(),
        keep_logits: bool = False,
        capacity: int | None = None,
        on_chunk: Callable[[int], None] | None = None,
        on_token: Callable[[int], None] | None = None,
    ) -> Generation:
        """Greedy generation; timings include the device work (each token is read on the host).
        ``on_chunk``: see prefill; ``on_token(id)``: called with each generated token."""
        b = self.backend
        cache = self.new_cache(capacity or len(prompt) + max_tokens)
        t0 = time.perf_counter()
        logits = self.prefill(prompt, cache, path, on_chunk)
        tok = b.ops.argmax(logits)  # [1] int32 on the device
        last_logits = b.download(logits)[0]
        first = int(b.download(tok)[0])
        t1 = time.perf_counter()
        out = Generation(list(prompt), [], last_logits, prefill_s=t1 - t0, ttft_s=t1 - t0)
        pos, cur = len(prompt), first

        def step(t: Tensor, p: int) -> tuple[Tensor, Tensor]:
            lg = self.forward(t, 1, p, cache)
            return lg, b.ops.argmax(lg)

        for _ in range(max_tokens):
            out.tokens.append(cur)
            if on_token is not None:
                on_token(cur)
            if cur in stop or len(out.tokens) == max_tokens:
                break
            logits, tok = b.decode_step(step, tok, pos, cache)  # a backend may replay a graph
            if keep_logits:
                out.step_logits.append(b.download(logits)[0])
            cur = int(b.download(tok)[0])
            pos += 1
        out.decode_s = time.perf_counter() - t1
        return out
