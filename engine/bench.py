"""Bench: prefill tok/s per prompt length, decode tok/s, time to first token.

Warm-up runs are timed apart and not counted; each figure is the median of ``repeats`` runs with
min and max beside it. Prompts are fixed pseudo-random token ids (seeded), so runs compare.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from engine.model import Model


@dataclass
class Stat:
    median: float
    min: float
    max: float
    samples: list[float]

    @classmethod
    def of(cls, xs: list[float]) -> Stat:
        return cls(statistics.median(xs), min(xs), max(xs), list(xs))


@dataclass
class LengthResult:
    prompt_tokens: int
    prefill_tok_s: Stat
    ttft_s: Stat
    decode_tok_s: Stat | None
    warmup_prefill_s: float


@dataclass
class BenchReport:
    model: str
    backend: str
    device: dict[str, Any]
    path: str
    gen_tokens: int
    repeats: int
    config: dict[str, Any]
    results: list[LengthResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench_prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    """n pseudo-random ordinary token ids (the low part of the vocabulary: no special tokens)."""
    rng = np.random.default_rng(seed + n)
    return rng.integers(0, max(min(vocab, 100_000) - 1, 2), size=n).tolist()


def measure(
    model: Model, prompt: list[int], gen_tokens: int, path: str = "batched"
) -> dict[str, float]:
    """One run: prefill tok/s, TTFT, decode tok/s (the agent's paired benchmark calls this)."""
    g = model.generate(prompt, gen_tokens, path=path)
    out = {"prefill_tok_s": len(prompt) / g.prefill_s, "ttft_s": g.ttft_s}
    steps = len(g.tokens) - 1  # the first token comes from prefill
    if steps > 0:
        out["decode_tok_s"] = steps / g.decode_s
    return out


def bench(
    model: Model,
    prompt_lengths: list[int],
    gen_tokens: int = 128,
    repeats: int = 5,
    warmup: int = 1,
    path: str = "batched",
    progress: Any = None,
) -> BenchReport:
    dev = model.backend.device_info()
    report = BenchReport(
        model.spec.name, dev.backend, dev.to_dict(), path, gen_tokens, repeats, model.config.flat()
    )
    for n in prompt_lengths:
        prompt = bench_prompt(n, model.spec.n_vocab)
        wt = 0.0
        for _ in range(warmup):
            wt = n / measure(model, prompt, min(gen_tokens, 2), path)["prefill_tok_s"]
        runs = []
        for _ in range(repeats):
            runs.append(measure(model, prompt, gen_tokens, path))
            if progress:
                progress.update(1)
        dec = [r["decode_tok_s"] for r in runs if "decode_tok_s" in r]
        report.results.append(
            LengthResult(
                n,
                Stat.of([r["prefill_tok_s"] for r in runs]),
                Stat.of([r["ttft_s"] for r in runs]),
                Stat.of(dec) if dec else None,
                wt,
            )
        )
    return report
