"""A bounded device run of the Vulkan backend: device info, then for each config of a fixed
sample (every variant, MAX_COLS, rows/workgroup, workgroup sizes, command-buffer knobs; or with
--grid prefill the MAX_COLS x variant x tile table of the batched prefill):
set_config (compile), validate against the per-token reference, bench, and a per-kernel profile
of the default config. A config that fails to compile, validate or run is recorded as such and
the sweep goes on. One JSON document with everything goes to --out.

    python -m engine.sweep --model M.gguf --out DIR [--budget-s 420] [--quick]
        [--grid sample|prefill]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.tuning import TuningConfig

# The seed's table, widened: MAX_COLS x {serial, kpar} inside one 512-token forward, the seed's
# one-forward-per-MAX_COLS schedule (chunk_tokens 0) at its shipped points, and the tiled GEMM's
# tile shapes. (tile 128 x 128 is left out: on the H200 it ran for minutes.)
PREFILL_GRID: list[dict[str, Any]] = [
    *(
        {"matmul_prefill.variant": "tiled", "matmul_prefill.tile_m": m, "matmul_prefill.tile_n": n}
        for m, n in ((64, 64), (128, 64), (64, 32), (32, 64), (64, 128), (32, 32))
    ),
    *(
        {"matmul_prefill.variant": v, "prefill.max_cols": mc}
        for v in ("kpar", "serial")
        for mc in (8, 16, 32, 40, 64)
    ),
    *(
        {"matmul_prefill.variant": "kpar", "prefill.max_cols": mc, "prefill.chunk_tokens": 0}
        for mc in (32, 40)
    ),
]

SAMPLE: list[dict[str, Any]] = [
    {},
    {"matmul_prefill.variant": "serial"},
    {"matmul_decode.variant": "subgroup"},
    {"matmul_decode.rows_per_thread": 1},
    {"matmul_decode.rows_per_thread": 4, "matmul_decode.rows_per_wg": 8},
    {"matmul_decode.threads_per_row": 16, "matmul_decode.rows_per_wg": 8},
    {"matmul_decode.variant": "shmem", "matmul_decode.threads_per_row": 32},
    {
        "matmul_decode.variant": "shmem",
        "matmul_decode.threads_per_row": 64,
        "matmul_decode.wg_size": 128,
    },
    {"matmul_prefill.variant": "kpar", "matmul_prefill.rows_per_wg": 1},
    {
        "matmul_prefill.variant": "kpar",
        "matmul_prefill.rows_per_wg": 4,
        "matmul_prefill.wg_size": 128,
    },
    {"matmul_decode.rows_per_wg": 1},
    {"matmul_decode.rows_per_wg": 4, "matmul_decode.wg_size": 128},
    {"matmul_decode.rows_per_wg": 8, "matmul_decode.wg_size": 256},
    {"submit.replay": False},
    {"submit.max_nodes": 4096},
    {"attention.wg_size": 128},
    {"attention.variant": "online"},
    {"attention.splits": 8},
    {"attention.splits": 16},
    {"attention.splits": 64},
    {"attention.key_threads": 4},
    {"attention.key_threads": 32},
    {"attention.wg_size": 64, "attention.key_threads": 4},
    {"argmax.variant": "default"},
    {"argmax.slices": 32},
    {"argmax.slices": 512},
    {"matmul_decode.subgroup_size": 32},
    {"matmul_decode.subgroup_size": 64},
]


def _prompts(tok: Any) -> list[list[int]]:
    from engine.validate import PROMPTS

    return [tok.encode(PROMPTS[0]), tok.encode(PROMPTS[1]), tok.encode("A")[:1]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
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
        help="sample: every variant and knob once; prefill: the MAX_COLS x variant x tile table "
        "(prefill only: decode is not benchmarked)",
    )
    ap.add_argument(
        "--variant",
        action="append",
        help="only configs with this matmul_prefill variant (repeatable)",
    )
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)

    from engine.bench import bench
    from engine.runtime import load
    from engine.validate import validate

    eng = load(args.model, "vulkan", TuningConfig.default("vulkan"), use_promoted=False)
    model, be = eng.model, eng.backend
    dev = be.device_info()
    doc: dict[str, Any] = {"device": dev.to_dict(), "model": model.spec.name, "runs": []}
    print(
        f"device: {dev.name} ({dev.device_class}), driver {dev.driver}, "
        f"subgroup {dev.subgroup_size}, load {time.perf_counter() - t_start:.1f} s",
        flush=True,
    )
    prompts = _prompts(eng.tokenizer())
    lengths = [int(x) for x in args.prompt_tokens.split(",")]

    def save() -> None:
        (args.out / "vulkan_sweep.json").write_text(json.dumps(doc, indent=1, default=str))

    # Per-kernel profile of the default config: one prefill chunk and a few decode steps.
    be.set_profiling(True)
    model.generate(list(range(100, 100 + lengths[0])), 8)
    doc["profile_default"] = be.profile()
    be.set_profiling(False)
    for name, p in list(doc["profile_default"].items())[:12]:
        print(f"  profile {name:36s} {p['calls']:5d} calls {p['total_ms']:9.2f} ms", flush=True)
    save()

    configs = PREFILL_GRID if args.grid == "prefill" else SAMPLE
    if args.variant:
        configs = [c for c in configs if c.get("matmul_prefill.variant") in args.variant]
    if args.grid == "prefill":
        args.gen_tokens = 1
    for flat in configs[:1] if args.quick else configs:
        if time.perf_counter() - t_start > args.budget_s:
            doc["runs"].append({"config": flat, "outcome": "skipped: budget"})
            continue
        rec: dict[str, Any] = {"config": flat}
        t0 = time.perf_counter()
        try:
            cfg = TuningConfig.default("vulkan").replace(**flat)
            bad = cfg.problems(dev)
            if bad:
                rec["outcome"] = "not allowed on this device: " + "; ".join(bad)
                doc["runs"].append(rec)
                print(f"{flat}: {rec['outcome']}", flush=True)
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
        )
    save()
    print(f"wrote {args.out / 'vulkan_sweep.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
