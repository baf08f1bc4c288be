"""Per-kernel decode times and tg of the hybrids (issue 15, helper hdec): one process per model
file, scripts/decode_times.py's queued profile (each decode step's launches queued behind a
spin kernel, so the host's launch path is out of the kernel times) for the --profile configs,
then `engine bench` tg (CUDA graph replay) for the --bench configs, A/B interleaved over
--rounds. Config names are scripts/device_hybrid_bench.py's VARIANTS. One JSON
(--out/hdec_<model>.json) rewritten after every step; no step starts past --deadline.

usage: python scripts/hybrid_decode_times.py MODEL.gguf [--profile a,b] [--bench a,b]
       [--prompt 512] [--gen 128] [--rounds 2] [--steps 4] [--deadline EPOCH_S] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.decode_times import queued_profile  # noqa: E402
from scripts.device_hybrid_bench import VARIANTS, config  # noqa: E402
from scripts.speed_record import SpeedRecord  # noqa: E402


def _names(s: str) -> list[str]:
    return [v for v in s.split(",") if v]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--profile", default="default")
    ap.add_argument("--bench", default="default")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="bench rounds over all configs")
    ap.add_argument("--steps", type=int, default=4, help="profiled decode steps")
    ap.add_argument("--spin-ms", type=float, default=40.0)
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds")
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args(argv)
    prof, benches = _names(a.profile), _names(a.bench)
    bad = sorted(set(prof + benches) - set(VARIANTS))
    if bad:
        print(f"hybrid_decode_times: unknown config(s) {', '.join(bad)}")
        return 2
    if not Path(a.model).is_file():
        print(f"hybrid_decode_times: no model file {a.model}")
        return 2
    from engine.bench import bench

    a.out.mkdir(parents=True, exist_ok=True)
    name = Path(a.model).stem
    rec = SpeedRecord(a.model, a.out / f"hdec_{name}.json", {}, a.deadline)
    eng = rec.load("cuda")
    be = eng.model.backend
    cycles = int(a.spin_ms * 2.0e6)
    for v in prof:

        def body(v: str) -> None:
            be.set_config(config(v))
            p = rec.res["profile"][v] = queued_profile(eng, a.prompt, a.steps, cycles)
            print(f"{name} profile {v}: {p['kernel_us_per_token']} us/token in kernels, "
                  f"{p['launches_per_token']} launches (CuPy's copies uncounted)")  # fmt: skip
            for k, us in p["us_per_token"].items():
                print(f"  {k:28s} {us:9.1f} us  x{p['calls_per_token'][k]:g}", flush=True)

        rec.step("profile", v, body)
    for r in range(a.rounds):
        for v in benches:

            def body(v: str, r: int = r) -> None:
                be.set_config(config(v))
                res = bench(eng.model, [a.prompt], a.gen, 1, 1).results[0]
                tg = res.decode_tok_s.median if res.decode_tok_s else 0.0
                rec.res["bench"].setdefault(v, {"tg": []})["tg"].append(tg)
                print(f"{name} round {r} {v:14s} tg{a.gen} {tg:7.1f} tok/s", flush=True)

            rec.step("bench", v, body)
    for v, b in rec.res["bench"].items():
        if b.get("tg"):
            print(f"{name} {v:14s} tg{a.gen} best {max(b['tg']):7.1f}  all {b['tg']}")
    rec.res["done"] = time.strftime("%H:%M:%S")
    rec.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
