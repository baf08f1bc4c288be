"""Per-layer drift of a MoE candidate against a reference over one prompt (issue 15: why
moe_experts.tc fails validate on the realistic 35b-a3b). Both runs go through the model's
activation hook; per MoE layer it prints the expert input's NMSE (post_attention_norm), the
router logits' largest move, the routing flips (top-k sets that differ) at positions validate
does not borrow (reference gap >= route_tie) and their reference gaps, the ffn_moe output's NMSE
with and without the flipped tokens, and the hidden state's NMSE after the layer. A flip that
validate did not borrow swaps a whole expert of one token: ffn_moe's NMSE jumps by orders of
magnitude at that layer while every earlier op agrees, which is the shape of the blame.

CPU (NumPy; the candidates are tests/fp16_prefill.py's emulations of CUDA's arithmetic):
    PYTHONPATH=$PWD python scripts/moe_drift.py [--layers 8] [--tokens 64] [--route-tie 2e-2]
GPU (the CUDA backend: reference per-token default, candidates batched configs by name of
scripts/device_hybrid_bench.py's VARIANTS):
    python scripts/moe_drift.py --model M.gguf --backend cuda --candidates default,moe_tc
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.model import Model  # noqa: E402
from engine.validate import kl_divergence, near_tie_routes  # noqa: E402

EMULATIONS = ("default_emu", "tc_emu", "tc_f32h_emu")  # tests/fp16_prefill.py's, in _cpu
LABELS = ("post_attention_norm", "ffn_gate_inp", "ffn_moe", "ffn_residual")


def record(model: Model, prompt: list[int], path: str, routes: dict | None = None) -> dict:
    """{(label, layer): [T, ...] float64} of LABELS over the prompt, and 'logits' (last)."""
    got: dict[Any, list[np.ndarray]] = {}

    def hook(op: str, label: str, layer: int, t: Any, pos0: int) -> None:
        if label in LABELS:
            a = np.asarray(model.backend.download(t), dtype=np.float64)
            got.setdefault((label, layer), []).append(a.reshape(a.shape[0], -1))

    model.hook = hook
    model.routes = dict(routes or {})
    try:
        run = model.forced_run(prompt, 1, path, sample=frozenset(), graphs=False)
    finally:
        model.hook, model.routes = None, {}
    out: dict[Any, Any] = {k: np.concatenate(v) for k, v in got.items()}
    out["logits"] = run.logits[len(prompt) - 1].astype(np.float64)
    return out


def _nmse(r: np.ndarray, c: np.ndarray) -> float:
    return float(np.sum((c - r) ** 2) / max(float(np.sum(r * r)), 1e-30))


def _topk(z: np.ndarray, k: int) -> np.ndarray:
    return np.sort(np.argsort(-z, axis=-1, kind="stable")[:, :k], axis=-1)


def compare(ref: dict, cand: dict, k: int, routes: dict) -> dict:
    """Per MoE layer: drift, flips outside ``routes`` and their gaps; final-logit KLD."""
    rows = []
    layers = sorted(key[1] for key in ref if key[0] == "ffn_gate_inp")
    for i in layers:
        zr, zc = ref[("ffn_gate_inp", i)], cand[("ffn_gate_inp", i)]
        srt = -np.sort(-zr, axis=-1)
        gap = srt[:, k - 1] - srt[:, k]
        forced = np.array([(i, t) in routes for t in range(len(zr))])
        flip = np.any(_topk(zr, k) != _topk(zc, k), axis=-1) & ~forced
        mr, mc = ref[("ffn_moe", i)], cand[("ffn_moe", i)]
        keep = ~flip
        rows.append({
            "layer": i,
            "h_nmse": _nmse(ref[("post_attention_norm", i)], cand[("post_attention_norm", i)]),
            "h_absmax": float(np.abs(cand[("post_attention_norm", i)]).max()),
            "dz_max": float(np.abs(zc - zr).max()),
            "dz_rms": float(np.sqrt(np.mean((zc - zr) ** 2))),
            "gap_median": float(np.median(gap)),
            "forced": int(forced.sum()),
            "flips": int(flip.sum()),
            "flip_gaps": [round(float(g), 4) for g in gap[flip]],
            "moe_nmse": _nmse(mr, mc),
            "moe_nmse_unflipped": _nmse(mr[keep], mc[keep]) if keep.any() else 0.0,
            "x_nmse": _nmse(ref[("ffn_residual", i)], cand[("ffn_residual", i)]),
        })  # fmt: skip
    return {"layers": rows, "kld": kl_divergence(ref["logits"], cand["logits"])}


def print_rows(name: str, res: dict) -> None:
    print(f"-- {name}: final-logit KLD {res['kld']:.3g}")
    print(" layer  h_nmse   dz_max  dz_rms  gap_med forced flips  moe_nmse (unflipped)  x_nmse"
          "  flip gaps")  # fmt: skip
    for r in res["layers"]:
        print(f" {r['layer']:5d} {r['h_nmse']:8.2e} {r['dz_max']:7.4f} {r['dz_rms']:7.4f} "
              f"{r['gap_median']:7.4f} {r['forced']:6d} {r['flips']:5d}  {r['moe_nmse']:8.2e} "
              f"({r['moe_nmse_unflipped']:8.2e}) {r['x_nmse']:8.2e}  "
              f"{r['flip_gaps'][:6]}", flush=True)  # fmt: skip


def drift(
    ref_model: Model, ref_path: str, cands: dict[str, tuple[Model, Any]], prompt: list[int],
    route_tie: float, force_all: bool = False, ref: dict | None = None,
) -> dict[str, dict]:  # fmt: skip
    """Reference once (or ``ref``: record()'s of it), then each candidate (model, config or
    None) batched with the reference's near-tie routes borrowed (force_all: every position's),
    compared per layer."""
    ref = ref or record(ref_model, prompt, ref_path)
    k = ref_model.spec.moe.n_expert_used
    router = {
        (key[1], t): z for key, zs in ref.items() if key[0] == "ffn_gate_inp"
        for t, z in enumerate(zs)
    }  # fmt: skip
    routes = near_tie_routes(router, k, np.inf if force_all else route_tie)
    out = {}
    for name, (model, cfg) in cands.items():
        if cfg is not None:
            model.set_config(cfg)
        t0 = time.time()
        res = compare(ref, record(model, prompt, "batched", routes), k, routes)
        res["seconds"] = time.time() - t0
        out[name] = res
        print_rows(f"{name} (borrowed: {'all' if force_all else f'gap < {route_tie:g}'})", res)
    return out


def _cpu(args: argparse.Namespace) -> dict:
    from engine.backends.numpy_ref import NumpyBackend
    from engine.bench import bench_prompt
    from engine.gguf_model import open_model
    from engine.models import build_model
    from engine.synth import write_synthetic
    from engine.synth_hybrid import HYBRID_PRESETS
    from tests.fp16_prefill import Fp16Experts, Fp16ExpertsF32H, Fp16Prefill, candidate

    path = Path(args.model or f"/tmp/moe_drift/35b-l{args.layers}.gguf")
    if not path.exists():
        name = f"35b-l{args.layers}"  # the realistic 35b-a3b with fewer layers, a small vocab
        HYBRID_PRESETS[name] = dataclasses.replace(
            HYBRID_PRESETS["35b-a3b"], n_layer=args.layers, n_vocab=1024
        )
        write_synthetic(path, arch="qwen35moe", preset=name, progress=False)
    gguf = open_model(path)
    prompt = bench_prompt(args.tokens, gguf.spec.n_vocab, seed=args.seed)
    # experts dequantized per use (cached_f32 would keep a 35B layer's 3 GB of float32 experts)
    cfg = candidate().replace(**{f"matmul_{p}.variant": "ondemand" for p in ("prefill", "decode")})
    ref = build_model(gguf, NumpyBackend())
    ref.set_config(cfg)
    names = dict(zip(EMULATIONS, (Fp16Prefill, Fp16Experts, Fp16ExpertsF32H), strict=True))
    cands = {}
    for n in args.candidates.split(","):
        m = build_model(gguf, names[n]())
        m.set_config(cfg)
        cands[n] = (m, None)
    rec = record(ref, prompt, "batched")
    out = {"tie": drift(ref, "batched", cands, prompt, args.route_tie, ref=rec)}
    if args.force_all:
        out["all"] = drift(ref, "batched", cands, prompt, args.route_tie, True, rec)
    for n, (m, _) in cands.items():
        for i, st in enumerate(getattr(m.backend, "stats", [])):
            if i < gguf.spec.n_layers:  # (one call a MoE layer: the first run's)
                print(
                    f"   {n} magnitudes, MoE call {i}: "
                    + ", ".join(f"{k} {v:.3g}" for k, v in st.items())
                )
        out.setdefault("magnitudes", {})[n] = getattr(m.backend, "stats", [])
    return out


def kernel_check(model: Model, ref: dict, variants: list[str]) -> dict:
    """Hypothesis (c), a kernel fault at the 35B's shapes: each variant's moe_experts on the
    reference's own inputs (its post_attention_norm rows and router logits) at a few layers,
    NMSE against the first variant's output (the default: dmmv, float32 throughout)."""
    from device_hybrid_bench import config

    b, k = model.backend, model.spec.moe.n_expert_used
    layers = sorted(key[1] for key in ref if key[0] == "ffn_gate_inp")
    out = {}
    for i in sorted({layers[0], layers[len(layers) // 2], *layers[-6:]}):
        h = b.upload(ref[("post_attention_norm", i)].astype(np.float32))
        ids, w = b.router_topk(b.upload(ref[("ffn_gate_inp", i)].astype(np.float32)), k)
        exps = [model.weights[f"blk.{i}.ffn_{t}_exps.weight"] for t in ("gate", "up", "down")]
        got = {}
        for v in variants:
            model.set_config(config(v, b.name))
            got[v] = np.asarray(b.download(b.moe_experts(h, ids, w, *exps)), np.float64)
        out[i] = {v: _nmse(got[variants[0]], y) for v, y in got.items() if v != variants[0]}
        print(f"kernel check layer {i}: NMSE vs {variants[0]} on the reference's inputs "
              + ", ".join(f"{v} {e:.3g}" for v, e in out[i].items()), flush=True)  # fmt: skip
    return out


def validate_borrowing(
    model: Model, cand: Any, prompts: list[list[int]], reference: Any = None,
    cache: dict | None = None, steps: int = 4, budgets: dict | None = None, edges: bool = True,
) -> dict:  # fmt: skip
    """validate of ``cand`` (which borrows drift-explained routings over the prompt: engine.hybrid
    route_ref), summed up with the borrowings it made."""
    from engine.validate import validate

    rep = validate(model, cand, prompts, steps, reference=reference, ref_cache=cache,
                   budgets=budgets, edges=edges, blame_failures=False)  # fmt: skip
    return {
        "passed": rep.passed,
        "kld": rep.kld_max,
        "nmse": rep.nmse,
        "reasons": rep.reasons,
        "borrowed": len(rep.routes_borrowed),
        "borrowed_at": [(i, pos, round(g, 4)) for i, pos, g in rep.routes_borrowed],
    }


def _cuda(args: argparse.Namespace) -> dict:
    from device_hybrid_bench import config

    from engine.bench import bench, bench_prompt
    from engine.runtime import load
    from engine.tuning import TuningConfig
    from engine.validate import tokenize_prompts, validate

    t0 = time.time()
    eng = load(args.model, args.backend, TuningConfig.default(args.backend), use_promoted=False)
    model, out = eng.model, {}

    def save() -> None:  # after every step: a run cut by its timeout keeps what it measured
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1, default=str))

    print(f"loaded {args.model} in {time.time() - t0:.1f} s", flush=True)
    default = TuningConfig.default(args.backend)
    prompt = bench_prompt(args.tokens, model.spec.n_vocab, seed=args.seed)
    cands = {n: (model, config(n, args.backend)) for n in args.candidates.split(",") if n}
    if cands:
        model.set_config(default)
        rec = record(model, prompt, "per_token")
        out["kernel"] = kernel_check(model, rec, [v for v in args.candidates.split(",") if v])
        out["tie"] = drift(model, "per_token", cands, prompt, args.route_tie, ref=rec)
        if args.force_all:
            out["all"] = drift(model, "per_token", cands, prompt, args.route_tie, True, rec)
        save()
    prompts, cache = tokenize_prompts(eng.tokenizer()), {}
    for v in [v for v in args.validate.split(",") if v]:
        t1 = time.time()
        rep = validate(model, config(v, args.backend), prompts, 4, reference=default,
                       ref_cache=cache, blame_failures=args.blame)  # fmt: skip
        worst = max(rep.prompts, key=lambda p: p.kld_max)
        out.setdefault("validate", {})[v] = rep.to_dict()
        print(f"validate {v:16s} {'PASS' if rep.passed else 'FAIL'} KLD {rep.kld_max:.3g} "
              f"NMSE {rep.nmse:.3g} (worst prompt {worst.prompt_tokens} tokens; routes forced "
              f"{sum(p.routes_forced for p in rep.prompts)}) blame {rep.blame} "
              f"{time.time() - t1:.1f} s", flush=True)  # fmt: skip
        save()
    for v in [v for v in args.validate_borrowing.split(",") if v]:
        t1 = time.time()
        r = validate_borrowing(model, config(v, args.backend), prompts, default, cache)
        out.setdefault("validate_borrowing", {})[v] = r
        print(f"validate+borrowing {v:16s} {'PASS' if r['passed'] else 'FAIL'} KLD {r['kld']:.3g} "
              f"NMSE {r['nmse']:.3g} drift-explained routings borrowed {r['borrowed']} "
              f"(layer, position, reference gap) {r['borrowed_at'][:8]} "
              f"{r['reasons'][:2]} {time.time() - t1:.1f} s", flush=True)  # fmt: skip
        save()
    for v in [v for v in args.bench.split(",") if v]:  # pp / tg tok/s, one run after a warm-up
        model.set_config(config(v, args.backend))
        r = bench(model, [512], args.gen, 1, 1).results[0]
        out.setdefault("bench", {})[v] = [r.prefill_tok_s.median, r.decode_tok_s.median]
        print(f"bench {v:16s} pp512 {r.prefill_tok_s.median:9.1f} tok/s", flush=True)
        save()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF (CPU default: a truncated 35b-a3b)")
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--layers", type=int, default=8, help="CPU: layers of the truncated 35b")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--route-tie", type=float, default=2e-2, help="the fp16 budget's route_tie")
    ap.add_argument("--candidates", default=None)
    ap.add_argument(
        "--variants", action="store_true",
        help="candidates are device_hybrid_bench.py's VARIANTS on --backend (cuda: always)",
    )  # fmt: skip
    ap.add_argument("--force-all", action="store_true", help="and every routing borrowed")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--bench", default="", help="GPU: variants to bench (pp512) first")
    ap.add_argument("--validate", default="", help="GPU: variants to validate last")
    ap.add_argument(
        "--validate-borrowing", default="",
        help="GPU: variants to validate with drift-explained routings borrowed (proposed)",
    )  # fmt: skip
    ap.add_argument("--blame", action="store_true", help="GPU: blame validate's failures")
    ap.add_argument("--gen", type=int, default=8, help="GPU: bench's decode tokens")
    args = ap.parse_args()
    if args.tokens < 1 or args.layers < 1:
        print("error: --tokens and --layers must be >= 1")
        return 2
    if args.backend == "numpy" and not args.variants:
        args.candidates = args.candidates or ",".join(EMULATIONS)
        bad = sorted(set(args.candidates.split(",")) - set(EMULATIONS))
        if bad:
            print(f"error: unknown emulation(s) {', '.join(bad)}; known: {', '.join(EMULATIONS)}")
            return 2
        out = _cpu(args)
    else:
        if not args.model or not Path(args.model).is_file():
            print(f"error: --model {args.model}: no such file")
            return 2
        args.candidates = "default,moe_tc" if args.candidates is None else args.candidates
        from device_hybrid_bench import VARIANTS

        names = [args.candidates, args.bench, args.validate, args.validate_borrowing]
        bad = sorted({v for n in names for v in n.split(",") if v} - set(VARIANTS))
        if bad:
            print(f"error: unknown variant(s) {', '.join(bad)}; known: {', '.join(VARIANTS)}")
            return 2
        out = _cuda(args)
    if args.json:  # (the GPU flow also writes it after every step)
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
