"""Where the Vulkan backend's time goes: GPU microseconds per kernel per pass (prefill, decode),
largest first, for a few configs, beside the wall time of the same passes.

Per config: a warm-up generate; the wall time of a prefill and of `--gen-tokens` decode steps
without timestamps (median of `--repeats`); then the same passes with a timestamp pair around
every dispatch: per kernel (with `--grid`, per kernel and dispatch grid, so each GEMM shape is a
row) calls, total us, us per call, share of the pass; the sum of the kernels against the wall
(the rest is host recording, submits and waits); the prefill GEMMs' FLOP/s (2 T x the 2-D weight
parameters of the trunk, over the matmul_prefill GEMM kernels' time, conversion passes apart).
`--stats`: each pipeline's registers and local memory (spills) from the driver, where it offers
VK_KHR_pipeline_executable_properties. `--cprofile` adds a cProfile of the Python side per pass
(slows it). Configs: a name of scripts/vulkan_decode_speed.py's VARIANTS or flat JSON.

    python scripts/vulkan_profile.py --model M.gguf [--config default --config res ...]
        [--prompt-tokens 512] [--gen-tokens 16] [--grid] [--top 15] [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def submit_round_trip(be: Any, n: int = 200) -> dict[str, float]:
    """Seconds per (record one small dispatch, submit, wait) with replay on and off."""
    x = be.upload(np.ones(256, np.float32))
    out = {}
    for replay in (True, False):
        be.stream.replay = replay
        be.add(x, x)
        be.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            y = be.add(x, x)
            be.synchronize()
        out["replay" if replay else "record"] = (time.perf_counter() - t0) / n
        del y
    be.stream.replay = True
    return out


def kernel_table(kernels: dict[str, dict[str, Any]], per: float = 1.0) -> list[dict[str, Any]]:
    """ProfileReport kernels -> rows (largest first), times divided by ``per`` (decode steps)."""
    total = sum(k["total_ms"] for k in kernels.values()) or 1.0
    rows = [
        {
            "kernel": name,
            "calls": k["calls"] / per,
            "total_us": 1e3 * k["total_ms"] / per,
            "us_per_call": 1e3 * k["total_ms"] / max(k["calls"], 1),
            "share": k["total_ms"] / total,
        }
        for name, k in kernels.items()
    ]
    return sorted(rows, key=lambda r: -r["total_us"])


def gemm_flops(model: Any, tokens: int) -> float:
    """FLOP of the trunk's prefill GEMMs: 2 x tokens x every 2-D blk.* weight's elements."""
    n = 0
    for name, w in model.weights.items():
        shape = getattr(w, "shape", ())
        if name.startswith("blk.") and len(shape) == 2:
            n += int(shape[0]) * int(shape[1])
    return 2.0 * tokens * n


def is_gemm(kernel: str) -> bool:
    base = kernel.split("@")[0].split("[")[0]
    return base.startswith("matmul_prefill") and not base.endswith((".w16", ".x16"))


def _cprofile(fn: Any, top: int) -> tuple[Any, str]:
    prof = cProfile.Profile()
    prof.enable()
    out = fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return out, buf.getvalue()


def profile_config(
    model: Any, prompt: list[int], gen: int, repeats: int, grid: bool, cprof: int
) -> dict[str, Any]:
    be = model.backend
    model.generate(prompt, 4)  # warm: pipelines, fp16 copies, pooled buffers, recorded graphs

    def prefill() -> tuple[Any, Any]:
        cache = model.new_cache(len(prompt) + gen + 1)
        tok = be.argmax(model.prefill(prompt, cache))
        be.download(tok)
        return cache, tok

    def step(t: Any, p: int) -> tuple[Any, Any]:
        lg = model.forward(t, 1, p, cache)
        return lg, be.argmax(lg)

    def decode(cache: Any, tok: Any) -> None:
        pos = len(prompt)
        for _ in range(gen):
            _, tok = be.decode_step(step, tok, pos, cache)
            be.download(tok)
            pos += 1

    rec: dict[str, Any] = {"prefill": {}, "decode": {}}
    walls: dict[str, list[float]] = {"prefill": [], "decode": []}
    for _ in range(max(repeats, 1)):
        be.synchronize()
        s0, t0 = be.stats(), time.perf_counter()
        cache, tok = prefill()
        s1, t1 = be.stats(), time.perf_counter()
        decode(cache, tok)
        s2 = be.stats()
        walls["prefill"].append(t1 - t0)
        walls["decode"].append((time.perf_counter() - t1) / max(gen, 1))
        # host side of the last untimed run: recording, vkQueueSubmit, fence waits (ms per pass
        # or per token), command buffers recorded and replayed
        for phase, a, b, div in (("prefill", s0, s1, 1), ("decode", s1, s2, max(gen, 1))):
            rec[phase]["host"] = {
                k: (b[k] - a[k]) / div * (1e3 if k.endswith("_s") else 1)
                for k in ("record_s", "submit_s", "wait_s", "recorded", "replays", "submits")
            }
    for phase, w in walls.items():
        rec[phase]["wall_ms"] = 1e3 * statistics.median(w)
        rec[phase]["wall_ms_all"] = [round(1e3 * x, 3) for x in w]
    rec["prefill"]["tok_s"] = len(prompt) / (rec["prefill"]["wall_ms"] / 1e3)
    rec["decode"]["tok_s"] = 1e3 / rec["decode"]["wall_ms"] if gen else None
    if cprof:
        (cache, tok), rec["prefill"]["cprofile"] = _cprofile(prefill, cprof)
        _, rec["decode"]["cprofile"] = _cprofile(lambda: decode(cache, tok), cprof)

    # GPU time per kernel (timestamps around every dispatch serialize them: the sum is the
    # pass's GPU time including each dispatch's launch and barrier).
    be.set_profiling(True, grid=grid)
    be.profile(reset=True)
    s0 = be.stats()
    cache, tok = prefill()
    s1 = be.stats()
    pre = be.profile(reset=True).to_dict()["kernels"]
    decode(cache, tok)
    s2 = be.stats()
    dec = be.profile(reset=True).to_dict()["kernels"]
    be.set_profiling(False, grid=False)
    per = max(gen, 1)
    for phase, kern, a, b, div in (("prefill", pre, s0, s1, 1), ("decode", dec, s1, s2, per)):
        r = rec[phase]
        r["kernels"] = kernel_table(kern, div)
        r["gpu_ms"] = sum(k["total_us"] for k in r["kernels"]) / 1e3
        for c in ("dispatches", "barriers", "submits", "replays"):
            r[c] = (b[c] - a[c]) / div
    g_us = sum(k["total_us"] for k in rec["prefill"]["kernels"] if is_gemm(k["kernel"]))
    flop = gemm_flops(model, len(prompt))
    rec["prefill"]["gemm_ms"] = g_us / 1e3
    rec["prefill"]["gemm_tflops"] = flop / (g_us * 1e-6) / 1e12 if g_us else None
    rec["prefill"]["gemm_tflop"] = flop / 1e12
    return rec


def resolve_config(c: str) -> tuple[str, dict[str, Any]]:
    """A VARIANTS name of scripts/vulkan_decode_speed.py, or flat JSON."""
    if c.lstrip().startswith("{"):
        return c, json.loads(c)
    from scripts.vulkan_decode_speed import VARIANTS

    if c not in VARIANTS:
        raise KeyError(c)
    return c, VARIANTS[c]


def pipeline_stats(be: Any, kernels: set[str]) -> list[dict[str, Any]]:
    """The driver's statistics (registers, local memory, ...) of each pipeline whose kernel name
    ran: the device must be opened with FLEETTUNE_VK_STATS=1 (--stats)."""
    from engine.backends.vulkan.pipelines import executable_statistics

    out = []
    for (_, spec, sg), p in be.pipes.pipelines.items():
        if p.name in kernels:
            st = executable_statistics(be.dev.device, p.handle)
            out.append({"kernel": p.name, "spec": dict(spec), "subgroup": sg, "stats": st})
    return out


def print_run(name: str, rec: dict[str, Any], top: int) -> None:
    for phase in ("prefill", "decode"):
        r = rec[phase]
        unit = "" if phase == "prefill" else " per token"
        extra = (
            f", GEMMs {r['gemm_ms']:.2f} ms = {r['gemm_tflops'] or 0:.1f} TFLOP/s"
            if phase == "prefill"
            else ""
        )
        print(
            f"== {name} {phase}{unit}: wall {r['wall_ms']:.3f} ms ({r['tok_s'] or 0:.1f} tok/s), "
            f"GPU {r['gpu_ms']:.3f} ms{extra}; {r['dispatches']:.0f} dispatches, "
            f"{r['barriers']:.0f} barriers, {r['submits']:.1f} submits",
            flush=True,
        )
        h = r.get("host", {})
        print(
            f"   host (untimed run): record {h.get('record_s', 0):.2f} ms, submit "
            f"{h.get('submit_s', 0):.2f} ms, fence wait {h.get('wait_s', 0):.2f} ms, "
            f"{h.get('recorded', 0):.1f} recorded, {h.get('replays', 0):.1f} replayed",
            flush=True,
        )
        for k in r["kernels"][:top]:
            print(
                f"   {k['kernel']:56s} {k['calls']:7.1f} x {k['us_per_call']:9.2f} us = "
                f"{k['total_us']:10.1f} us {100 * k['share']:5.1f}%",
                flush=True,
            )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, default=None, help="write DIR/vulkan_profile.json")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="wall-time runs per config")
    ap.add_argument("--top", type=int, default=15, help="kernel rows printed per pass")
    ap.add_argument("--grid", action="store_true", help="a row per kernel and dispatch grid")
    ap.add_argument("--cprofile", type=int, default=0, help="cProfile rows per pass (0: none)")
    ap.add_argument(
        "--stats", action="store_true", help="registers / local memory of each pipeline run"
    )
    ap.add_argument("--round-trip", action="store_true", help="also time a bare submit")
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds")
    ap.add_argument("--json", action="store_true", help="print the result document as JSON")
    ap.add_argument(
        "--config",
        action="append",
        default=None,
        help="a scripts/vulkan_decode_speed.py variant name or flat JSON (repeatable; "
        "default: default)",
    )
    args = ap.parse_args(argv)
    try:
        configs = [resolve_config(c) for c in (args.config or ["default"])]
    except (KeyError, json.JSONDecodeError) as e:
        print(f"vulkan_profile: bad --config {e}", file=sys.stderr)
        return 2
    if not Path(args.model).exists():
        print(f"vulkan_profile: no model file {args.model}", file=sys.stderr)
        return 2
    if args.stats:  # read by device.py: VK_KHR_pipeline_executable_properties where offered
        os.environ["FLEETTUNE_VK_STATS"] = "1"
    from engine.backends import default_device
    from engine.bench import bench_prompt
    from engine.runtime import load
    from engine.tuning import TuningConfig

    cfg = TuningConfig.default("vulkan")
    eng = load(args.model, "vulkan", cfg, use_promoted=False, device=default_device("vulkan"))
    model, be = eng.model, eng.backend
    dev = be.device_info()
    doc: dict[str, Any] = {"device": dev.to_dict(), "model": model.spec.name, "runs": []}
    if not args.json:
        print(f"device: {dev.name} ({dev.device_class}), driver {dev.driver}", flush=True)
    if args.round_trip:
        doc["submit_round_trip_s"] = submit_round_trip(be)
    prompt = bench_prompt(args.prompt_tokens, model.spec.n_vocab)
    for name, flat in configs:
        if time.time() > args.deadline:
            doc["runs"].append({"config": name, "skipped": "past the deadline"})
            continue
        try:
            t0 = time.perf_counter()
            model.set_config(TuningConfig.from_flat("vulkan", flat))
            rec = profile_config(
                model, prompt, args.gen_tokens, args.repeats, args.grid, args.cprofile
            )
            rec["seconds"] = time.perf_counter() - t0
            if args.stats:
                ran = {
                    k["kernel"].split("@")[0]
                    for ph in ("prefill", "decode")
                    for k in rec[ph]["kernels"]
                }
                rec["pipelines"] = pipeline_stats(be, ran)
        except Exception as e:  # noqa: BLE001 - one config's failure is its result
            rec = {"error": f"{type(e).__name__}: {e}"}
            if not args.json:
                print(f"== {name}: ERROR {rec['error']}", flush=True)
        rec.update(config=name, flat=flat)
        doc["runs"].append(rec)
        if "error" not in rec and not args.json:
            print_run(name, rec, args.top)
            for p in rec.get("pipelines", []):
                st = p["stats"]
                keep = {k: v for k, v in st.items() if "Register" in k or "Local" in k}
                print(f"   stats {p['kernel']} {p['spec']} {keep or st}", flush=True)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "vulkan_profile.json").write_text(json.dumps(doc, indent=1, default=str))
    if args.json:
        print(json.dumps(doc, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
