"""Per-kernel GPU time of one decode token, with the host's launch path taken out (issue 14):
the eager profile (CUDA events around every launch) of scripts/device_speed.py counts the
~20-30 us a Python launch takes inside small kernels; here each profiled step is queued behind
a spin kernel on the stream, so the launches are all enqueued before the GPU reaches them and
each event pair brackets the kernel's execution (plus the GPU's own gap between two queued
kernels). Also tg (graph replay, engine.bench) per config for comparison.

usage: python scripts/decode_times.py MODEL.gguf [--configs a,b] [--prompt 512] [--gen 64]
       [--steps 4] [--repeats 2] [--deadline EPOCH_S] [--out DIR] [--json] [--hybrid]
Config names are scripts/device_speed.py's VARIANTS (--hybrid: scripts/device_hybrid_bench.py's).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.device_speed import VARIANTS, config  # noqa: E402

_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
"""


def queued_profile(eng, n_prompt: int, steps: int, spin_cycles: int) -> dict:  # noqa: ANN001
    """Per-kernel us per decode token, each step's launches queued behind a spin kernel."""
    import cupy as cp

    from engine.bench import bench_prompt

    m, be = eng.model, eng.model.backend
    spin = cp.RawKernel(_SPIN, "spin")
    cache = m.new_cache(n_prompt + steps + 2)
    m.prefill(bench_prompt(n_prompt, m.spec.n_vocab), cache)
    tok = be.upload(np.array([1], np.int32))
    tok = be.argmax(m.forward(tok, 1, n_prompt, cache))  # first use of every decode kernel
    be.synchronize()
    be.set_profiling(True)
    be.profile(reset=True)
    t0 = time.perf_counter()
    for i in range(steps):
        spin((1,), (1,), (np.int64(spin_cycles),))  # on the backend's stream (current)
        tok = be.argmax(m.forward(tok, 1, n_prompt + 1 + i, cache))
    rep = be.profile(reset=True)
    wall = (time.perf_counter() - t0) / steps
    be.set_profiling(False)
    us = {k: t.total_ms * 1e3 / steps for k, t in rep.kernels.items()}
    return {
        "us_per_token": dict(
            sorted(((k, round(v, 2)) for k, v in us.items()), key=lambda x: -x[1])
        ),
        "calls_per_token": {k: t.calls / steps for k, t in rep.kernels.items()},
        "kernel_us_per_token": round(sum(us.values()), 1),
        "launches_per_token": sum(t.calls for t in rep.kernels.values()) / steps,
        "host_ms_per_step": round(wall * 1e3, 2),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--configs", default="ptc_tc_mmvw_all")
    ap.add_argument("--profile", default="", help="configs to profile (default: the first)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--spin-ms", type=float, default=60.0, help="spin before each step")
    ap.add_argument("--deadline", type=float, default=0.0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--hybrid",
        action="store_true",
        help="config names are scripts/device_hybrid_bench.py's (the qwen35 / qwen35moe ones)",
    )
    a = ap.parse_args(argv)
    variants, config_of = VARIANTS, config
    if a.hybrid:
        import device_hybrid_bench as hb  # (scripts/ is on the path: this script's folder)

        variants, config_of = hb.VARIANTS, hb.config
    names = [n for n in a.configs.split(",") if n]
    prof = [n for n in a.profile.split(",") if n] or names[:1]
    bad = [n for n in names + prof if n not in variants]
    if bad or not Path(a.model).is_file():
        print(f"decode_times: unknown config {bad} or no model file {a.model}")
        return 2
    from engine.bench import bench
    from engine.runtime import load
    from engine.tuning import TuningConfig

    eng = load(a.model, "cuda", TuningConfig.default("cuda"), use_promoted=False)
    be = eng.model.backend
    rec: dict = {"model": a.model, "bench": {}, "profile": {}}
    cycles = int(a.spin_ms * 2.0e6)  # SM clock cycles at ~2 GHz (the H200's is 1.98)

    def save() -> None:
        if a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / f"decode_times_{Path(a.model).stem}.json").write_text(
                json.dumps(rec, indent=1)
            )

    for n in names:
        if a.deadline and time.time() > a.deadline:
            print(f"deadline: {n} and later not run", flush=True)
            break
        try:
            be.set_config(config_of(n))
            if n in prof:
                p = rec["profile"][n] = queued_profile(eng, a.prompt, a.steps, cycles)
                top = ", ".join(f"{k} {v}" for k, v in list(p["us_per_token"].items())[:12])
                print(f"{n}: {p['kernel_us_per_token']} us/token kernels, "
                      f"{p['launches_per_token']} launches: {top}", flush=True)  # fmt: skip
            r = bench(eng.model, [a.prompt], a.gen, a.repeats, 1).results[0]
            tg = r.decode_tok_s.median if r.decode_tok_s else None
            rec["bench"][n] = {"tg": tg, "pp": r.prefill_tok_s.median}
            print(f"{n}: tg{a.gen} {tg or 0:.1f} tok/s  pp{a.prompt} "
                  f"{r.prefill_tok_s.median:.0f}", flush=True)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a failing config is that config's result
            rec["bench"][n] = {"error": f"{type(e).__name__}: {e}"[:400]}
            print(f"{n}: ERROR {rec['bench'][n]['error']}", flush=True)
        save()
    if a.json:
        print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
