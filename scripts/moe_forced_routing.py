"""Teacher-forced MoE routing: does the fp16-prefill candidate pass validate once it routes like
the reference where the reference's k-th/(k+1)-th router gap is below a bound?

Forcing adds -1e4 to the router logits of the experts the reference did not choose (at forced
(layer, position) only): top-k then picks the reference's experts, and their renormalised
weights are the candidate's own (a constant shift of unchosen logits leaves the chosen ones'
renormalised softmax unchanged), so only the discrete choice is borrowed.

    PYTHONPATH=$PWD python scripts/moe_forced_routing.py [--bound 0.01] [--random 40]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from moe_fp16_flip import Fp16Prefill  # noqa: E402

from engine.backends.numpy_ref import NumpyBackend  # noqa: E402
from engine.bench import bench_prompt  # noqa: E402
from engine.gguf_model import open_model  # noqa: E402
from engine.models import build_model  # noqa: E402
from engine.runtime import load  # noqa: E402
from engine.tuning import TuningConfig  # noqa: E402
from engine.tuning.registry import NUMERIC_BUDGETS  # noqa: E402
from engine.validate import edge_lengths, tokenize_prompts, validate  # noqa: E402


class ForcedRoutes(Fp16Prefill):
    routes: dict[tuple[int, int], np.ndarray] = {}
    where = (0, 0)

    def router_topk(self, logits, k):  # noqa: ANN001, ANN201
        layer, pos0 = self.where
        z = np.array(logits, dtype=np.float32)
        for t in range(z.shape[0]):
            ids = self.routes.get((layer, pos0 + t))
            if ids is not None:
                m = np.full(z.shape[1], -1e4, np.float32)
                m[ids] = 0.0
                z[t] += m
        return super().router_topk(z, k)


def ref_router(model, prompt: list[int], steps: int) -> dict[tuple[int, int], np.ndarray]:  # noqa: ANN001
    got: dict[tuple[int, int], np.ndarray] = {}

    def hook(op, label, layer, t, pos0):  # noqa: ANN001, ANN202
        if label == "ffn_gate_inp":
            for j, row in enumerate(np.array(model.backend.download(t))):
                got[(layer, pos0 + j)] = row.astype(np.float64)

    model.hook = hook
    try:
        run = model.forced_run(prompt, steps, "per_token", sample=frozenset(), graphs=False)
    finally:
        model.hook = None
    return got, run.tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bound", type=float, default=1e-2, help="force where ref gap < bound")
    ap.add_argument("--random", type=int, default=40)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    path = Path(tempfile.mkdtemp()) / "qwen35moe-tiny-q4_k_m-s0.gguf"
    from engine.synth import write_synthetic

    write_synthetic(path, arch="qwen35moe", preset="tiny", quant_mix="q4_k_m", seed=0,
                    progress=False)  # fmt: skip
    gguf = open_model(path)
    k = gguf.spec.moe.n_expert_used
    vocab = gguf.spec.n_vocab
    cand_cfg = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 512})
    fp16 = {c: NUMERIC_BUDGETS["fp16"] for c in NUMERIC_BUDGETS}
    ref_model = build_model(gguf, NumpyBackend())
    be = ForcedRoutes()
    model = build_model(gguf, be)
    prompts = tokenize_prompts(load(path, "numpy", use_promoted=False).tokenizer())
    prompts += [bench_prompt(n, vocab, seed=7) for n in edge_lengths(TuningConfig.default("cuda"))]
    rng = np.random.default_rng(1)
    prompts += [bench_prompt(int(n), vocab, seed=100 + i)
                for i, n in enumerate(rng.integers(32, 160, args.random))]  # fmt: skip
    failed, forced_n, pos_n, worst, fails = 0, 0, 0, [0.0, 0.0], []
    for p in prompts:
        logits, _ = ref_router(ref_model, p, args.steps)
        routes = {}
        for key, z in logits.items():
            srt = np.sort(z)[::-1]
            if srt[k - 1] - srt[k] < args.bound:
                routes[key] = np.argsort(-z, kind="stable")[:k]
        be.routes, forced_n, pos_n = routes, forced_n + len(routes), pos_n + len(logits)

        def hook(op, label, layer, t, pos0):  # noqa: ANN001, ANN202
            if label == "ffn_gate_inp":
                be.where = (layer, pos0)

        model.hook = hook
        rep = validate(model, cand_cfg, [p], steps=args.steps, budgets=fp16, edges=False,
                       blame_failures=False)  # fmt: skip
        model.hook = None
        worst = [max(worst[0], rep.nmse), max(worst[1], rep.kld_max)]
        if not rep.passed:
            failed += 1
            fails.append((len(p), rep.nmse, rep.kld_max, rep.reasons[:1]))
    print(f"bound {args.bound:g}: {failed} of {len(prompts)} prompts fail validate (fp16 budget); "
          f"forced {forced_n} of {pos_n} (layer, position) routings; "
          f"worst NMSE {worst[0]:.3g} KLD {worst[1]:.3g}")  # fmt: skip
    for f in fails[:8]:
        print("  fail:", f)


if __name__ == "__main__":
    main()
