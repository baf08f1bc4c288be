"""A bounded local run of one backend: device info, then for each config of a sample drawn from
the registry (every variant, and every knob one step from its default; or with --grid prefill
the column tile x variant table of the batched prefill): set_config (compile), validate against
the per-token reference, bench, and a per-kernel profile of the default config (the device
contract's ProfileReport: GPU time on Vulkan and CUDA, wall time per op on NumPy). A config
that fails to compile, validate or run is recorded as such and the sweep goes on. One JSON
document with everything goes to DIR/<backend>_sweep.json.

    python -m engine.sweep --model M.gguf --out DIR [--backend vulkan] [--budget-s 420]
        [--quick] [--grid sample|prefill] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.tuning import REGISTRY, TuningConfig


def one_step_sample(backend: str = "vulkan") -> list[dict[str, Any]]:
    """The default config, each other variant at its defaults, and each knob of each variant one
    step either side of its default (a bool flipped): every variant and knob once, read from
    the registry. Configs the constraints reject on any device are left out."""
    out: list[dict[str, Any]] = [{}]
    for op in REGISTRY.ops(backend):
        for v in op.variants:
            base = {} if v is op.default else {f"{op.name}.variant": v.name}
            if base:
                out.append(base)
            for p in v.params:
                i = p.choices.index(p.default)
                steps = [c for c in p.choices[max(i - 1, 0) : i + 2] if c != p.default]
                if isinstance(p.default, bool):
                    steps = [not p.default]
                out += [{**base, f"{op.name}.{p.name}": c} for c in steps]
    default = TuningConfig.default(backend)
    return [f for f in out if not default.replace(**f).problems()]


SLOW_TILES = {(128, 128)}  # tiled 128 x 128 ran for minutes on the H200


def prefill_grid(backend: str = "vulkan") -> list[dict[str, Any]]:
    """The seed's table, widened and read from the registry: every column tile of every variant
    of the batched-prefill matmuls (matmul_prefill, and CUDA's matmul_batched) inside one
    forward (max_cols >= 8; a GEMM's tile_m x tile_n), and the seed's schedule (one forward per
    max_cols tokens, 32 and 40) on the first variant with a max_cols."""
    out: list[dict[str, Any]] = []
    seed: list[dict[str, Any]] = []
    ops = {o.name: o for o in REGISTRY.ops(backend)}
    for op in (ops[n] for n in ("matmul_prefill", "matmul_batched") if n in ops):
        for v in op.variants:
            tiles = [p for p in v.params if p.name in ("max_cols", "tile_m", "tile_n")]
            for values in itertools.product(*(p.choices for p in tiles)):
                if tuple(values) in SLOW_TILES or (len(values) == 1 and values[0] < 8):
                    continue
                flat = {f"{op.name}.variant": v.name}
                flat |= {f"{op.name}.{p.name}": x for p, x in zip(tiles, values, strict=True)}
                out.append(flat)
            if not seed and any(p.name == "max_cols" for p in tiles):
                seed = [
                    {
                        f"{op.name}.variant": v.name,
                        f"{op.name}.max_cols": mc,
                        "prefill.chunk_tokens": mc,
                    }
                    for mc in (32, 40)
                ]
    default = TuningConfig.default(backend)
    return [f for f in out + seed if not default.replace(**f).problems()]


def _prompts(tok: Any) -> list[list[int]]:
    from engine.validate import PROMPTS

    return [tok.encode(PROMPTS[0]), tok.encode(PROMPTS[1]), tok.encode("A")[:1]]


def main(argv: list[str] | None = None) -> int:
    from engine.backends import BACKENDS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--backend", choices=sorted(BACKENDS), default="vulkan")
    ap.add_argument("--json", action="store_true", help="print the JSON document at the end")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting new configs")
    ap.add_argument("--prompt-tokens", default="105,512")
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="default config only")
    ap.add_argument(
        "--grid",
        choices=("sample", "prefill"),
        default="sample",
        help="sample: every variant and knob once; prefill: the column tile x variant table "
        "(prefill only: decode is not benchmarked)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        help="only configs with this matmul_prefill (or matmul_batched) variant (repeatable)",
    )
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    from engine.backends import default_device
    from engine.bench import bench
    from engine.runtime import load
    from engine.validate import validate

    try:
        eng = load(
            args.model,
            args.backend,
            TuningConfig.default(args.backend),
            use_promoted=False,
            device=default_device(args.backend),
        )
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    model, be = eng.model, eng.backend
    args.out.mkdir(parents=True, exist_ok=True)
    out_path = args.out / f"{args.backend}_sweep.json"
    log = sys.stderr if args.json else sys.stdout
    dev = be.device_info()
    doc: dict[str, Any] = {"device": dev.to_dict(), "model": model.spec.name, "runs": []}
    print(
        f"device: {dev.name} ({dev.device_class}), driver {dev.driver}, "
        f"subgroup {dev.subgroup_size}, load {time.perf_counter() - t_start:.1f} s",
        flush=True,
        file=log,
    )
    prompts = _prompts(eng.tokenizer())
    lengths = [int(x) for x in args.prompt_tokens.split(",")]

    def save() -> None:
        out_path.write_text(json.dumps(doc, indent=1, default=str))

    try:  # per-kernel profile of the default config: a prefill and a few decode steps
        be.set_profiling(True)
    except EngineError as e:  # a Vulkan queue without timestamps
        print(f"  no profile: {e}", flush=True, file=log)
    else:
        model.generate(list(range(100, 100 + lengths[0])), 8)
        prof = be.profile()
        be.set_profiling(False)
        doc["profile_default"] = prof.to_dict()
        for name, k in list(prof.kernels.items())[:12]:
            line = f"  profile {name:36s} {k.calls:5d} calls {k.total_ms:9.2f} ms"
            print(line, flush=True, file=log)
    save()

    configs = (
        prefill_grid(args.backend) if args.grid == "prefill" else one_step_sample(args.backend)
    )
    if args.variant:
        wanted = set(args.variant)
        configs = [
            c
            for c in configs
            if {c.get("matmul_prefill.variant"), c.get("matmul_batched.variant")} & wanted
        ]
    if args.grid == "prefill":
        args.gen_tokens = 1
    for flat in configs[:1] if args.quick else configs:
        if time.perf_counter() - t_start > args.budget_s:
            doc["runs"].append({"config": flat, "outcome": "skipped: budget"})
            continue
        rec: dict[str, Any] = {"config": flat}
        t0 = time.perf_counter()
        try:
            cfg = TuningConfig.default(args.backend).replace(**flat)
            bad = cfg.problems(dev)
            if bad:
                rec["outcome"] = "not allowed on this device: " + "; ".join(bad)
                doc["runs"].append(rec)
                print(f"{flat}: {rec['outcome']}", flush=True, file=log)
                continue
            be.set_config(cfg)
            rec["compile_s"] = time.perf_counter() - t0
            rep = validate(model, cfg, prompts, steps=8)
            rec["validate"] = {
                "passed": rep.passed,
                "max_abs_diff": rep.max_abs_diff,
                "nmse": rep.nmse,
                "reasons": [r for p in rep.prompts for r in p.reasons],
            }
            if rep.passed:
                b = bench(model, lengths, args.gen_tokens, args.repeats, 1)
                rec["bench"] = [
                    {
                        "prompt_tokens": r.prompt_tokens,
                        "prefill_tok_s": r.prefill_tok_s.median,
                        "ttft_s": r.ttft_s.median,
                        "decode_tok_s": r.decode_tok_s.median if r.decode_tok_s else None,
                    }
                    for r in b.results
                ]
            rec["outcome"] = "ok" if rep.passed else "invalid"
        except EngineError as e:
            rec["outcome"] = f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - record and go on to the next config
            rec["outcome"] = f"crash {type(e).__name__}: {e}"
            rec["traceback"] = traceback.format_exc()
        rec["seconds"] = time.perf_counter() - t0
        if hasattr(be, "stats"):  # command-buffer counters: Vulkan
            rec["stats"] = be.stats()
        doc["runs"].append(rec)
        save()
        line = ", ".join(
            f"pp{r['prompt_tokens']} {r['prefill_tok_s']:.1f} tg {r['decode_tok_s'] or 0:.1f}"
            for r in rec.get("bench", [])
        )
        print(
            f"{json.dumps(flat)}: {rec['outcome']} "
            f"{rec.get('validate', {}).get('max_abs_diff', '')} {line} "
            f"({rec['seconds']:.1f} s)",
            flush=True,
            file=log,
        )
    save()
    print(f"wrote {out_path}", file=log)
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
