"""Where the Vulkan backend's wall time goes, per phase (prefill, decode), for a few configs.

For each config: a warm-up generate, then one timed generate under cProfile (wall per phase, the
stream's host counters: recording, vkQueueSubmit, fence waits, dispatches, submits), then one
with GPU timestamps (kernel time per phase). Also the bare submit round trip: one tiny dispatch,
submitted and waited for, a few hundred times. A diagnostic for developers, not a benchmark:
cProfile slows the Python part, so read the wall figures from `python -m engine bench`.

    python scripts/vulkan_profile.py --model M.gguf --out DIR [--prompt-tokens 512]
        [--gen-tokens 32] [--config '{"prefill.chunk_tokens": 32}' ...]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def _phase_stats(be: Any, before: dict[str, float]) -> dict[str, float]:
    after = be.stats()
    return {k: round(after[k] - before.get(k, 0), 6) for k in after}


def submit_round_trip(be: Any, n: int = 300) -> dict[str, float]:
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


def profile_config(model: Any, prompt: list[int], gen: int, top: int) -> dict[str, Any]:
    be = model.backend
    model.generate(prompt, 4)  # warm: pipelines, pooled buffers, recorded graphs
    cache = model.new_cache(len(prompt) + gen)
    rec: dict[str, Any] = {}
    prof = cProfile.Profile()
    s0 = be.stats()
    t0 = time.perf_counter()
    prof.enable()
    logits = model.prefill(prompt, cache)
    tok = be.argmax(logits)
    first = int(be.download(tok)[0])
    prof.disable()
    t1 = time.perf_counter()
    rec["prefill"] = {"wall_s": t1 - t0, **_phase_stats(be, s0)}
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    rec["prefill"]["cprofile"] = buf.getvalue()

    def step(t: Any, p: int) -> tuple[Any, Any]:
        lg = model.forward(t, 1, p, cache)
        return lg, be.argmax(lg)

    prof = cProfile.Profile()
    s0 = be.stats()
    t0 = time.perf_counter()
    prof.enable()
    pos = len(prompt)
    for _ in range(gen):
        _, tok = be.decode_step(step, tok, pos, cache)
        int(be.download(tok)[0])
        pos += 1
    prof.disable()
    rec["decode"] = {"wall_s": time.perf_counter() - t0, "steps": gen, **_phase_stats(be, s0)}
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    rec["decode"]["cprofile"] = buf.getvalue()
    rec["first_token"] = first

    # GPU time per kernel, per phase (timestamps around every dispatch: slows the wall).
    be.set_profiling(True)
    cache = model.new_cache(len(prompt) + gen)
    be.profile(reset=True)
    logits = model.prefill(prompt, cache)
    tok = be.argmax(logits)
    be.download(tok)
    rec["prefill"]["gpu"] = be.profile(reset=True).to_dict()["kernels"]
    pos = len(prompt)
    for _ in range(gen):
        _, tok = be.decode_step(step, tok, pos, cache)
        be.download(tok)
        pos += 1
    rec["decode"]["gpu"] = be.profile(reset=True).to_dict()["kernels"]
    be.set_profiling(False)
    for phase in ("prefill", "decode"):
        rec[phase]["gpu_ms"] = sum(v["total_ms"] for v in rec[phase]["gpu"].values())
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--top", type=int, default=25, help="cProfile rows per phase")
    ap.add_argument(
        "--config",
        action="append",
        default=None,
        help="flat config changes as JSON, e.g. '{\"prefill.chunk_tokens\": 32}' (repeatable; "
        "default: the registry default and 32-token forwards, the seed's schedule)",
    )
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from engine.backends import default_device
    from engine.bench import bench_prompt
    from engine.runtime import load
    from engine.tuning import TuningConfig

    cfg = TuningConfig.default("vulkan")
    eng = load(args.model, "vulkan", cfg, use_promoted=False, device=default_device("vulkan"))
    model, be = eng.model, eng.backend
    dev = be.device_info()
    doc: dict[str, Any] = {"device": dev.to_dict(), "model": model.spec.name, "runs": []}
    print(f"device: {dev.name} ({dev.device_class}), driver {dev.driver}", flush=True)
    doc["submit_round_trip_s"] = submit_round_trip(be)
    print(f"submit round trip: {doc['submit_round_trip_s']}", flush=True)
    prompt = bench_prompt(args.prompt_tokens, model.spec.n_vocab)
    configs = (
        [json.loads(c) for c in args.config]
        if args.config
        else [
            {},
            {"prefill.chunk_tokens": 32},
        ]
    )
    for flat in configs:
        model.set_config(TuningConfig.default("vulkan").replace(**flat))
        rec = profile_config(model, prompt, args.gen_tokens, args.top)
        rec["config"] = flat
        doc["runs"].append(rec)
        for phase in ("prefill", "decode"):
            r = rec[phase]
            print(
                f"{json.dumps(flat)} {phase}: wall {r['wall_s'] * 1e3:.1f} ms, gpu "
                f"{r['gpu_ms']:.1f} ms, record {r['record_s'] * 1e3:.1f} ms, submit "
                f"{r['submit_s'] * 1e3:.1f} ms, wait {r['wait_s'] * 1e3:.1f} ms, "
                f"{r['dispatches']:.0f} dispatches, {r['submits']:.0f} submits, "
                f"{r['replays']:.0f} replays",
                flush=True,
            )
            for name, g in list(r["gpu"].items())[:6]:
                print(f"    {name:40s} {g['calls']:6d} {g['total_ms']:9.2f} ms", flush=True)
        (args.out / "vulkan_profile.json").write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {args.out / 'vulkan_profile.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
