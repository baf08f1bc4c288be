"""The dense decoder (llama, qwen2, qwen3) as a backend-independent schedule of ops.

Two prefill paths, as in the seeds: ``per_token`` runs the decode step once per prompt token;
``batched`` pushes chunks of up to ``config.prefill_chunk`` tokens (MAX_COLS unless the backend
decouples the two) through batched matmul, RoPE, KV write and attention. Decode is one token at
a time. Sampling is greedy on the device: the token fed to the next step is the argmax tensor of
this step, and the host reads that same tensor, never a copy kept from an earlier step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from engine.backends.base import Backend, KVCache, Tensor
from engine.gguf_model import GGUFModel, ModelSpec
from engine.tuning import TuningConfig

PREFILL_PATHS = ("batched", "per_token")


@dataclass
class Generation:
    prompt_tokens: list[int]
    tokens: list[int]  # generated, greedy
    last_logits: np.ndarray  # [V] float32, logits of the last prompt token
    prefill_s: float = 0.0
    decode_s: float = 0.0
    ttft_s: float = 0.0  # prompt in -> first generated token id on the host
    step_logits: list[np.ndarray] = field(default_factory=list)  # only when keep_logits


class Model:
    """Weights of one GGUF on one backend, and the forward schedule. A hybrid file (qwen35,
    qwen3next) gets engine.hybrid.HybridModel, which shares prefill and generate."""

    def __new__(cls, gguf: GGUFModel, backend: Backend) -> Model:  # noqa: ARG004
        if cls is Model and gguf.spec.hybrid:
            from engine.hybrid import HybridModel

            return super().__new__(HybridModel)
        return super().__new__(cls)

    def __init__(self, gguf: GGUFModel, backend: Backend) -> None:
        self.gguf = gguf
        self.spec: ModelSpec = gguf.spec
        self.backend = backend
        self.weights = {n: backend.load_weight(gguf.tensor(n)) for n in gguf.model_tensor_names()}
        head = "token_embd.weight" if self.spec.tied_embeddings else "output.weight"
        self.lm_head = self.weights[head]

    @property
    def config(self) -> TuningConfig:
        return self.backend.config

    def set_config(self, config: TuningConfig) -> None:
        self.backend.set_config(config)

    def new_cache(self, capacity: int) -> KVCache:
        s = self.spec
        return self.backend.new_kv_cache(s.n_layers, capacity, s.n_head_kv, s.head_dim)

    # --- forward ------------------------------------------------------------------------
    def forward(
        self, ids: Tensor, n: int, pos0: int, cache: KVCache, logits: bool = True
    ) -> Tensor:
        """n tokens (ids [n] int32 on the device) at positions pos0.. -> logits [1, V] of the
        last token (None when logits=False: an intermediate prefill chunk)."""
        b, s, w = self.backend, self.spec, self.weights
        H, Hkv, D = s.n_head, s.n_head_kv, s.head_dim
        x = b.embedding(w["token_embd.weight"], ids)  # [n, C]
        for i in range(s.n_layers):
            p = f"blk.{i}."
            h = b.rms_norm(x, w[p + "attn_norm.weight"], s.rms_eps)
            q, k, v = (b.matmul(h, w[p + f"attn_{t}.weight"]) for t in "qkv")
            if s.attn_bias:
                q = b.add(q, w[p + "attn_q.bias"])
                k = b.add(k, w[p + "attn_k.bias"])
                v = b.add(v, w[p + "attn_v.bias"])
            q = b.reshape(q, (n, H, D))
            k = b.reshape(k, (n, Hkv, D))
            v = b.reshape(v, (n, Hkv, D))
            if s.qk_norm:  # qwen3: RMSNorm over each head's D values
                q = b.rms_norm(q, w[p + "attn_q_norm.weight"], s.rms_eps)
                k = b.rms_norm(k, w[p + "attn_k_norm.weight"], s.rms_eps)
            q = b.rope(q, pos0, s.rope_theta, s.rope_neox)
            k = b.rope(k, pos0, s.rope_theta, s.rope_neox)
            b.kv_write(cache, i, k, v, pos0)
            a = b.reshape(b.attention(q, cache, i, pos0), (n, H * D))
            x = b.add(x, b.matmul(a, w[p + "attn_output.weight"]))
            h = b.rms_norm(x, w[p + "ffn_norm.weight"], s.rms_eps)
            g = b.swiglu(b.matmul(h, w[p + "ffn_gate.weight"]), b.matmul(h, w[p + "ffn_up.weight"]))
            x = b.add(x, b.matmul(g, w[p + "ffn_down.weight"]))
        if not logits:
            return None
        if n > 1:
            x = b.rows(x, n - 1, n)  # only the last token's logits are sampled
        x = b.rms_norm(x, w["output_norm.weight"], s.rms_eps)
        return b.matmul(x, self.lm_head)  # [1, V]

    def prefill(self, prompt: list[int], cache: KVCache, path: str = "batched") -> Tensor:
        """Run the prompt into the cache; returns the last token's logits [1, V]."""
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
            logits = self.forward(self.backend.rows(ids, c0, c1), c1 - c0, c0, cache, logits=last)
        return logits

    def generate(
        self,
        prompt: list[int],
        max_tokens: int,
        path: str = "batched",
        stop: set[int] | frozenset[int] = frozenset(),
        keep_logits: bool = False,
        capacity: int | None = None,
    ) -> Generation:
        """Greedy generation; timings include the device work (each token is read on the host)."""
        b = self.backend
        cache = self.new_cache(capacity or len(prompt) + max_tokens)
        t0 = time.perf_counter()
        logits = self.prefill(prompt, cache, path)
        tok = b.argmax(logits)  # [1] int32 on the device
        last_logits = b.download(logits)[0]
        first = int(b.download(tok)[0])
        t1 = time.perf_counter()
        out = Generation(list(prompt), [], last_logits, prefill_s=t1 - t0, ttft_s=t1 - t0)
        pos, cur = len(prompt), first

        def step(t: Tensor, p: int) -> tuple[Tensor, Tensor]:
            lg = self.forward(t, 1, p, cache)
            return lg, b.argmax(lg)

        for _ in range(max_tokens):
            out.tokens.append(cur)
            if cur in stop or len(out.tokens) == max_tokens:
                break
            logits, tok = b.decode_step(step, tok, pos, cache)  # a backend may replay a graph
            if keep_logits:
                out.step_logits.append(b.download(logits)[0])
            cur = int(b.download(tok)[0])
            pos += 1
        out.decode_s = time.perf_counter() - t1
        return out
