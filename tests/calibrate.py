"""Measure validate's metrics for every correct variant (and, with --mutants, every planted bug)
of a backend on one model: the numbers the numeric-class budgets in engine/verify/budgets.toml
are calibrated from (docs/verify.md); --write records them in that file. It lives beside the
planted bugs it judges (tests/mutants.py): test tooling, run from the repository root.

  python -m tests.calibrate --backend vulkan --model /tmp/ragged.gguf --mutants
  python -m tests.calibrate --backend cuda --model /tmp/models/7b.gguf \
      --variants matmul_decode.mmvq,matmul_prefill.mmq8 --json > 7b.json
  python -m tests.calibrate --backend numpy --model /tmp/ragged.gguf --write

Candidates: each variant of every op with its defaults, and every numeric knob at its smallest
and largest allowed value (configs the device refuses are skipped); --variants keeps those of the
named op.variant pairs. Per candidate: its numeric classes, worst and mean KLD, worst NMSE and
max |diff|, top-1 agreement outside near-ties, verdict and blame. Then per class: the largest
value of each metric over passing candidates against the budget (headroom = budget / worst).
--write [PATH] records the run in the budgets file (default engine/verify/budgets.toml): per
class its worst passing candidate, replacing the entry of the same backend and model, and with
--mutants the nearest planted bug above the bound (engine.verify.budgets.record_calibration). The
bounds themselves are left for a person to change in the file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def candidates(backend: str, only: set[tuple[str, str]] | None, device: Any) -> list[dict]:
    from engine.errors import ConfigError
    from engine.tuning import REGISTRY, TuningConfig

    base = TuningConfig.default(backend)
    out: list[dict] = [{}]
    for op in REGISTRY.ops(backend):
        for v in op.variants:
            if only is not None and (op.name, v.name) not in only:
                continue
            pick = {f"{op.name}.variant": v.name}
            out.append(pick)
            for p in v.params:
                if p.is_numeric and len(p.choices) > 1:
                    out += [
                        {**pick, f"{op.name}.{p.name}": x} for x in (min(p.choices), max(p.choices))
                    ]
    seen, keep = set(), []
    for flat in out:
        try:
            cfg = base.replace(**flat)
        except ConfigError:
            continue
        key = tuple(sorted(cfg.flat().items()))
        if key in seen or cfg.problems(device):
            continue
        seen.add(key)
        keep.append(flat)
    return keep


def measure(model: Any, flat: dict, prompts: list[list[int]], steps: int) -> dict:
    from engine.tuning import TuningConfig
    from engine.verify.validate import validate

    t = time.perf_counter()
    cfg = TuningConfig.default(model.backend.name).replace(**flat)
    rep = validate(model, cfg, prompts, steps=steps)
    ps = rep.prompts
    return {
        "config": flat or {"(default)": True},
        "classes": rep.numeric_classes,
        "passed": rep.passed,
        "kld_max": rep.kld_max,
        "kld_mean": max(p.kld_mean for p in ps),
        "nmse": rep.nmse,
        "max_abs_diff": rep.max_abs_diff,
        "top1": f"{sum(p.top1_agree for p in ps)}/{sum(p.top1_checked for p in ps)}",
        "positions": sum(p.positions for p in ps),
        "blame": str(rep.blame) if rep.blame else None,
        "reasons": rep.reasons[:3],
        "seconds": round(time.perf_counter() - t, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", required=True, choices=("numpy", "vulkan", "cuda"))
    ap.add_argument("--model", required=True, help="GGUF path (e.g. from `engine synth`)")
    ap.add_argument("--variants", default="", help="op.variant,... to keep (default: all)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompt-lengths", default="1,5,37,70,130", help="seeded random prompts")
    ap.add_argument("--mutants", action="store_true", help="also judge the planted bugs")
    ap.add_argument("--cross-check", action="store_true", help="reference path vs NumPy too")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", help="also write the JSON here, rewritten after every candidate")
    ap.add_argument(
        "--write",
        nargs="?",
        const="engine/verify/budgets.toml",
        metavar="PATH",
        help="record the run in the budgets file (default engine/verify/budgets.toml)",
    )
    args = ap.parse_args(argv)
    if not Path(args.model).is_file():
        print(f"--model {args.model}: no such file", file=sys.stderr)
        return 2
    only = None
    if args.variants:
        try:
            only = {tuple(x.split(".", 1)) for x in args.variants.split(",")}  # type: ignore[misc]
        except ValueError:
            print("--variants: give op.variant pairs, e.g. matmul_decode.mmvq", file=sys.stderr)
            return 2
    from engine import backends
    from engine.bench import bench_prompt
    from engine.gguf_model import open_model
    from engine.models import build_model
    from engine.verify.budgets import METRICS, NUMERIC_BUDGETS, class_rank

    be = backends.create(args.backend, device=backends.default_device(args.backend))
    model = build_model(open_model(args.model), be)
    vocab = model.spec.n_vocab
    prompts = [bench_prompt(int(n), vocab, seed=3) for n in args.prompt_lengths.split(",")]
    rows = []
    for flat in candidates(args.backend, only, be.device_info()):
        rows.append(measure(model, flat, prompts, args.steps))
        if args.out:  # a call that runs out of time still leaves what it measured
            Path(args.out).write_text(json.dumps({"candidates": rows}, indent=1, default=str))
        if not args.json:
            r = rows[-1]
            print(
                f"{'PASS' if r['passed'] else 'FAIL'} {json.dumps(r['config'])} "
                f"[{','.join(r['classes'])}] KLD {r['kld_max']:.3g} (mean {r['kld_mean']:.3g}) "
                f"NMSE {r['nmse']:.3g} max|diff| {r['max_abs_diff']:.3g} top-1 {r['top1']} "
                f"{r['seconds']}s" + (f"\n     {r['blame']}" if r["blame"] else ""),
                flush=True,
            )
    summary = {}
    for cls, budget in NUMERIC_BUDGETS.items():
        mine = [r for r in rows if r["passed"] and max(r["classes"], key=class_rank) == cls]
        if mine:
            summary[cls] = {
                m: {"worst": max(r[m] for r in mine), "budget": getattr(budget, m)} for m in METRICS
            }
    out: dict[str, Any] = {"backend": args.backend, "model": args.model, "candidates": rows}
    out["classes"] = summary
    if args.cross_check:
        from engine.verify.cross_check import cross_check_numpy

        cc = cross_check_numpy(model, prompts[1:3], steps=4)
        out["cross_check"] = {k: cc[k] for k in ("passed", "kld", "nmse", "max_abs_diff")}
    if args.mutants:
        from tests.mutants import MUTANTS, judge

        out["mutants"] = [
            judge(m, args.model).to_dict() for m in MUTANTS if m.backend == args.backend
        ]
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1, default=str))
    if args.write:
        run = {
            "backend": f"{args.backend} ({be.device_info().name})",
            "model": Path(args.model).name,
            "command": " ".join(["python -m tests.calibrate", *(argv or sys.argv[1:])]),
        }
        touched = write_calibration(Path(args.write), out, run)
        print(f"wrote {args.write}: measured {', '.join(touched) or 'no class'}", file=sys.stderr)
    if args.json:
        print(json.dumps(out, indent=1, default=str))
        return 0
    for cls, s in summary.items():
        print(
            f"{cls}: "
            + "  ".join(
                f"{m} worst {v['worst']:.3g} / budget {v['budget']:.3g}" for m, v in s.items()
            )
        )
    if "cross_check" in out:
        print(f"cross-check vs numpy: {out['cross_check']}")
    for v in out.get("mutants", []):
        print(
            f"mutant {v['mutant']}: {'rejected' if v['rejected'] else 'PASSED (missed)'} by "
            f"{v['caught_by'] or '-'}  KLD {v['kld']:.3g} NMSE {v['nmse']:.3g}  blame: {v['blame']}"
        )
    return 0


def write_calibration(path: Path, out: dict[str, Any], run: dict[str, str]) -> list[str]:
    """Record a run's candidates (and mutants) in the budgets file at ``path``; the classes it
    measured. ``run``: backend, model, command; the date is today's (UTC)."""
    from engine.verify import budgets

    doc = budgets.read(path)
    run = {"date": datetime.now(UTC).date().isoformat(), "command": run["command"], **run}
    touched = budgets.record_calibration(doc, out["candidates"], run, out.get("mutants"))
    budgets.write(doc, path)
    return touched


if __name__ == "__main__":
    raise SystemExit(main())
