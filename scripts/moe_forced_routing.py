"""Validate of the fp16-prefill emulation (tests/fp16_prefill.py) on the tiny qwen35moe synth
with MoE routing near-ties borrowed from the reference below each --bound (the fp16 budget's
route_tie replaced; 0 borrows none): prompts failing, routings forced, worst NMSE / KLD.

    PYTHONPATH=$PWD python scripts/moe_forced_routing.py [--bounds 0,1e-3,3e-3,1e-2] [--random 40]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from engine.bench import bench_prompt
from engine.gguf_model import open_model
from engine.models import build_model
from engine.runtime import load
from engine.synth import write_synthetic
from engine.tuning import TuningConfig
from engine.validate import edge_lengths, tokenize_prompts, validate
from tests.fp16_prefill import Fp16Prefill, candidate, fp16_budgets


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bounds", default="0,1e-3,3e-3,1e-2,2e-2")
    ap.add_argument("--random", type=int, default=40, help="random prompts of 32..159 tokens")
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    path = Path(tempfile.mkdtemp()) / "qwen35moe-tiny-q4_k_m-s0.gguf"
    write_synthetic(path, arch="qwen35moe", preset="tiny", quant_mix="q4_k_m", seed=0,
                    progress=False)  # fmt: skip
    gguf = open_model(path)
    vocab = gguf.spec.n_vocab
    prompts = tokenize_prompts(load(path, "numpy", use_promoted=False).tokenizer())
    prompts += [bench_prompt(n, vocab, seed=7) for n in edge_lengths(TuningConfig.default("cuda"))]
    rng = np.random.default_rng(1)
    prompts += [bench_prompt(int(n), vocab, seed=100 + i)
                for i, n in enumerate(rng.integers(32, 160, args.random))]  # fmt: skip
    model = build_model(gguf, Fp16Prefill())
    cache: dict = {}
    for bound in (float(b) for b in args.bounds.split(",")):
        budgets = {c: dataclasses.replace(b, route_tie=bound) for c, b in fp16_budgets().items()}
        failed, forced, worst, first = 0, 0, [0.0, 0.0], None
        for p in prompts:
            rep = validate(model, candidate(), [p], steps=args.steps, budgets=budgets,
                           edges=False, ref_cache=cache, blame_failures=False)  # fmt: skip
            forced += rep.prompts[0].routes_forced
            worst = [max(worst[0], rep.nmse), max(worst[1], rep.kld_max)]
            if not rep.passed:
                failed += 1
                first = first or (len(p), rep.reasons[0])
        print(f"route_tie {bound:g}: {failed} of {len(prompts)} prompts fail; {forced} routings "
              f"forced; worst NMSE {worst[0]:.3g} KLD {worst[1]:.3g}; "
              f"first failure {first}")  # fmt: skip


if __name__ == "__main__":
    main()
