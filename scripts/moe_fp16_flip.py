"""Does an fp16-rounded prefill GEMM flip MoE routing? (CPU emulation of CUDA's staged GEMM.)

Fp16Prefill: NumPy backend whose batched matmul, for T >= gemm_min_t tokens (CUDA's default 32;
chunk 512 like CUDA), rounds activations and dequantized weights to float16 before a float64
product (CUDA: fp16 operands, fp32 accumulate). Runs engine.validate.validate() of it against the
plain NumPy per-token reference with the CLI's prompts, then counts routing flips per position.

    PYTHONPATH=$PWD python scripts/moe_fp16_flip.py [--model PATH] [--random N]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from engine.backends.numpy_ref import NumpyBackend
from engine.bench import bench_prompt
from engine.gguf_model import open_model
from engine.models import build_model
from engine.runtime import load
from engine.tuning import TuningConfig
from engine.tuning.registry import NUMERIC_BUDGETS
from engine.validate import edge_lengths, tokenize_prompts, validate
from tests.fp16_prefill import GEMM_MIN_T, Fp16Prefill


def router_logits(model, prompt: list[int], path: str) -> dict[int, np.ndarray]:  # noqa: ANN001
    """{layer: [T, E] router logits} of one forward over the prompt (hooked taps)."""
    got: dict[int, list[np.ndarray]] = {}

    def hook(op, label, layer, t, pos0):  # noqa: ANN001, ANN202
        if label == "ffn_gate_inp":
            got.setdefault(layer, []).append(np.array(model.backend.download(t)))

    model.hook = hook
    try:
        model.forced_run(prompt, 0, path, sample=frozenset())
    finally:
        model.hook = None
    return {k: np.concatenate(v) for k, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default=None)
    ap.add_argument("--random", type=int, default=40, help="random prompts for the flip census")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    path = args.model
    if path is None:
        from engine.synth import write_synthetic

        path = Path(tempfile.mkdtemp()) / "qwen35moe-tiny-q4_k_m-s0.gguf"
        write_synthetic(path, arch="qwen35moe", preset="tiny", quant_mix="q4_k_m", seed=0,
                        progress=False)  # fmt: skip
    gguf = open_model(Path(path))
    k = gguf.spec.moe.n_expert_used
    cand_cfg = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 512})
    cuda_edges = edge_lengths(TuningConfig.default("cuda"))
    fp16 = {c: NUMERIC_BUDGETS["fp16"] for c in NUMERIC_BUDGETS}  # the CUDA default's class
    ref_model = build_model(gguf, NumpyBackend())
    model = build_model(gguf, Fp16Prefill())
    prompts = tokenize_prompts(load(path, "numpy", use_promoted=False).tokenizer())
    vocab = gguf.spec.n_vocab
    all_p = prompts + [bench_prompt(n, vocab, seed=7) for n in cuda_edges]
    print(f"experts {gguf.spec.moe.n_expert} used {k}; prompts {[len(p) for p in all_p]}")
    rep = validate(model, cand_cfg, all_p, steps=args.steps, budgets=fp16, edges=False)
    print(f"validate passed={rep.passed} worst NMSE {rep.nmse:.3g} KLD {rep.kld_max:.3g}")
    for r in rep.reasons:
        print("  reason:", r)
    if rep.blame:
        print("  blame:", rep.blame.to_dict())
    census = [p for p in all_p] + [
        bench_prompt(int(n), vocab, seed=100 + i)
        for i, n in enumerate(np.random.default_rng(1).integers(32, 160, args.random))
    ]
    flips = positions = 0
    gaps_flip, gaps_all, primary = [], [], []
    for p in census:
        if len(p) < GEMM_MIN_T:
            continue
        model.set_config(TuningConfig.default("numpy"))
        ref = router_logits(ref_model, p, "per_token")
        model.set_config(cand_cfg)
        cand = router_logits(model, p, "batched")
        first = None  # the primary flip: earliest token, then lowest layer (the rest cascade)
        for layer in ref:
            r, c = ref[layer].astype(np.float64), cand[layer].astype(np.float64)
            srt = -np.sort(-r, axis=-1)
            gap = srt[:, k - 1] - srt[:, k]
            ri = np.sort(np.argsort(-r, axis=-1, kind="stable")[:, :k], axis=-1)
            ci = np.sort(np.argsort(-c, axis=-1, kind="stable")[:, :k], axis=-1)
            flip = np.any(ri != ci, axis=-1)
            positions += len(flip)
            flips += int(flip.sum())
            gaps_all += list(gap)
            for t in np.nonzero(flip)[0]:
                if first is None or (t, layer) < first[:2]:
                    first = (t, layer, gap[t], np.abs(r[t] - c[t]).max())
                gaps_flip.append(gap[t])
                d = np.abs(r[t] - c[t]).max()
                if len(gaps_flip) <= 12:
                    print(f"  flip: prompt {len(p)} layer {layer} token {t} ref top-{k} "
                          f"{ri[t].tolist()} cand {ci[t].tolist()} gap(k,k+1) {gap[t]:.3g} "
                          f"max|dlogit| {d:.3g}")  # fmt: skip
        if first is not None:
            primary.append(first[2])
            print(
                f"  primary flip of prompt {len(p)}: token {first[0]} layer {first[1]} "
                f"ref gap {first[2]:.3g}, candidate router logits moved {first[3]:.3g}"
            )
    ga = np.array(gaps_all)
    print(f"census: {flips} routing flips in {positions} (token, layer) positions over "
          f"{len(census)} prompts; flip gaps max {max(gaps_flip, default=0):.3g}; "
          f"all gaps: median {np.median(ga):.3g}, fraction < 1e-2 {np.mean(ga < 1e-2):.3g}, "
          f"< 1e-3 {np.mean(ga < 1e-3):.3g}; primary flips' gaps max "
          f"{max(primary, default=0):.3g}")  # fmt: skip


if __name__ == "__main__":
    main()
