"""How much of each experiment's search space runs distinct code: per experiment file and
backend, over N configs drawn at random from the space (Optuna's RandomSampler, seed 0) and over
the whole space where it has at most 200,000 configs, count the distinct configs, those the
registry's constraints reject on any device, and those that run the same code as an earlier one
(same effective config: the chunk resolved, knobs no kernel reads dropped) though the flat config
differs, which the agent's de-duplication does not catch.

    PYTHONPATH=. python tools/space_stats.py experiments/*.toml [--samples 200] [--json]

--before applies the unread-knob rule of the tree before issue 11 (HEAD 03e9fcf: Vulkan's
prefill.max_cols was not read by the tiled GEMM), to measure that tree with this script.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna

from agent.experiment import ExperimentError, load_experiment
from agent.space import SearchSpace, build_space, config_key
from engine.tuning import REGISTRY, TuningConfig


def effective(backend: str, flat: dict[str, Any], before: bool) -> str:
    cfg = TuningConfig.from_flat(backend, flat)
    f: dict[str, Any] = cfg.flat()
    f["prefill.chunk_tokens"] = cfg.prefill_chunk
    if before:
        if backend == "vulkan" and f["matmul_prefill.variant"] == "tiled":
            f.pop("prefill.max_cols", None)  # the tiled GEMM read tile_n, not MAX_COLS
        if backend in ("numpy", "cuda"):
            f.pop("prefill.max_cols", None)  # it was the chunk, counted as chunk_tokens
    return config_key(f)


def whole(space: SearchSpace, base: dict[str, Any]) -> Iterator[dict[str, Any]]:
    per_op = []
    for o in space.ops:
        opts = []
        for v, dims in o.params:
            for values in itertools.product(*(d.choices for d in dims)):
                knobs = {d.key: x for d, x in zip(dims, values, strict=True)}
                opts.append({o.variant_dim.key: v, **knobs})
        per_op.append(opts)
    opened = {o.op for o in space.ops}
    for combo in itertools.product(*per_op):
        flat = {k: v for k, v in base.items() if k.partition(".")[0] not in opened}
        for part in combo:
            flat.update(part)
        yield flat


def stats(backend: str, flats: Iterator[dict[str, Any]], before: bool) -> dict[str, int]:
    seen, seen_code = set(), set()
    rejected = same_code = 0
    for flat in flats:
        key = config_key(flat)
        if key in seen:
            continue
        seen.add(key)
        if TuningConfig.from_flat(backend, flat).problems():
            rejected += 1
            continue
        code = effective(backend, flat, before)
        same_code += code in seen_code
        seen_code.add(code)
    return {"distinct": len(seen), "rejected": rejected, "identical_code": same_code}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiments", nargs="+", type=Path)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--before", action="store_true", help="the pre-issue-11 unread-knob rule")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    out: dict[str, Any] = {}
    for path in args.experiments:
        try:
            exp = load_experiment(path)
        except ExperimentError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for backend in (b for b in exp.backends if b in REGISTRY.backends()):
            space = build_space(backend, exp.space_for(backend))
            base = TuningConfig.default(backend).flat()
            study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
            drawn = []
            for _ in range(args.samples):
                trial = study.ask()
                drawn.append(space.suggest(trial, base))
                study.tell(trial, 0.0)
            row = {"sample": stats(backend, iter(drawn), args.before), "size": space.size}
            if space.size <= 200_000:
                row["space"] = stats(backend, whole(space, base), args.before)
            out[f"{path.name} {backend}"] = row
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            s, w = v["sample"], v.get("space", {})
            print(
                f"{k:32s} sample {s['distinct']:4d} distinct {s['rejected']:4d} rejected "
                f"{s['identical_code']:4d} same code | space {w.get('distinct', '-')} distinct "
                f"{w.get('rejected', '-')} rejected {w.get('identical_code', '-')} same code"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
