"""Decode GEMV microbenchmark on the GPU (issue 14): the weight bandwidth each matmul_decode
config reaches on the 1.5B / 7B / 9B matrix shapes, beside a plain copy and a plain read of the
same card measured in the same run.

Each (shape, config) is timed as a CUDA graph of back-to-back backend.matmul_into launches (T = 1)
over enough copies of the weight that they do not fit the L2 (the weights stream from memory, as
in a decode step). GB/s counts the bytes the kernel must read: the weight as stored on the GPU
(Q6_K blocks padded to 224 bytes) plus x and y. Prints one line per measurement and writes JSON.

  python3 bench/bench_gemv.py --out DIR [--configs mmvf,dmmv,...] [--shapes 7b,9b] \
      [--deadline UNIX_S] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MMVF = {"matmul_decode.variant": "mmvf"}


def _mmvf(**k: int) -> dict:
    return MMVF | {f"matmul_decode.{a}": v for a, v in k.items()}


# name -> flat config (the registry's names; defaults where not given)
CONFIGS: dict[str, dict] = {  # mmvf_*: the registry defaults (threads 32, rows 2, unroll 2,
    "mmvf": MMVF,  # warps 4) but for the knobs the name gives
    "mmvf_t16": _mmvf(threads_per_row=16),
    "mmvf_t16_r4": _mmvf(threads_per_row=16, rows_per_thread=4),
    "mmvf_t8": _mmvf(threads_per_row=8),
    "mmvf_r4": _mmvf(rows_per_thread=4),
    "mmvf_r4_u1": _mmvf(rows_per_thread=4, unroll=1),
    "mmvf_r4_w8": _mmvf(rows_per_thread=4, warps=8),
    "mmvf_u4": _mmvf(unroll=4),
    "mmvf_u1": _mmvf(unroll=1),
    "mmvf_r1_u4": _mmvf(rows_per_thread=1, unroll=4),
    "mmvf_r8_u1": _mmvf(rows_per_thread=8, unroll=1),
    "mmvf_t64": _mmvf(threads_per_row=64),
    "mmvf_t64_r4_u1": _mmvf(threads_per_row=64, rows_per_thread=4, unroll=1),
    "mmvf_t128_w8": _mmvf(threads_per_row=128, warps=8),
    "mmvf_t128_r4_u1_w8": _mmvf(threads_per_row=128, rows_per_thread=4, unroll=1, warps=8),
    "mmvf_xs": _mmvf(xsmem=1),
    "mmvf_r4_xs": _mmvf(rows_per_thread=4, xsmem=1),
    "mmvf_t16_xs": _mmvf(threads_per_row=16, xsmem=1),
    "mmvf_t16_r4_xs": _mmvf(threads_per_row=16, rows_per_thread=4, xsmem=1),
    "mmvf_t8_r4_u1_w8_xs": _mmvf(threads_per_row=8, rows_per_thread=4, unroll=1, warps=8, xsmem=1),
    "mmvf_q4p": _mmvf(q4k_pair=1),
    "mmvf_q4p_u1": _mmvf(q4k_pair=1, unroll=1),
    "mmvf_q4p_r4_u1": _mmvf(q4k_pair=1, rows_per_thread=4, unroll=1),
    "mmvf_q4p_t16_r4_u1": _mmvf(q4k_pair=1, threads_per_row=16, rows_per_thread=4, unroll=1),
    "mmvf_wl1": _mmvf(wload=1),
    "mmvf_mb8": _mmvf(min_blocks=8),
    "dmmv": {"matmul_decode.variant": "dmmv"},  # the float default before mmvf
    "mmvw": {"matmul_decode.variant": "mmvw"},  # int8 activations: the speed to approach
}
# name -> [(N, K, qtype)]: N output rows, K the row length
SHAPES: dict[str, list[tuple[int, int, str]]] = {
    "9b": [(12288, 4096, "Q4_K"), (4096, 12288, "Q4_K"), (4096, 12288, "Q6_K")],
    "7b": [
        (18944, 3584, "Q4_K"),
        (3584, 18944, "Q6_K"),
        (152064, 3584, "Q6_K"),
        (512, 3584, "Q4_K"),
        (3584, 3584, "Q4_K"),
        (3584, 18944, "Q4_K"),
    ],
    "1.5b": [(8960, 1536, "Q4_K"), (1536, 8960, "Q6_K"), (151936, 1536, "Q6_K")],
    "other": [(12288, 4096, "Q8_0"), (12288, 4096, "Q5_0"), (12288, 4096, "Q4_0")],
}
L2_SPAN = 256 << 20  # bytes of weight copies cycled through: several times the H200's 50 MB L2
LAUNCHES = 24  # matmuls per graph


def _events(cp: Any, stream: Any, fn: Any, reps: int) -> float:
    """Seconds per call of fn (which enqueues on stream), best of reps after a warm-up."""
    fn()
    stream.synchronize()
    best = math.inf
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        fn()
        e1.record(stream)
        e1.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(e0, e1) / 1e3)
    return best


_READ = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ p, long long n, unsigned* out) {
    unsigned acc = 0;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const uint4 v = __ldg(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x12345678u) out[0] = acc;  // keeps the loads; practically never stores
}
"""


def roofs(cp: Any, stream: Any, sms: int) -> dict[str, float]:
    """GB/s of a device-to-device copy (bytes read + written) and of a plain 16-byte read."""
    n = 1 << 30
    a, b = cp.ones(n, np.uint8), cp.empty(n, np.uint8)
    copy = _events(cp, stream, lambda: b.__setitem__(Ellipsis, a), 5)
    k = cp.RawKernel(_READ, "read_all")
    out = cp.zeros(1, np.uint32)
    grid = sms * 8
    read = _events(cp, stream, lambda: k((grid,), (256,), (a, np.int64(n // 16), out)), 5)
    return {"copy_gbs": 2 * n / copy / 1e9, "read_gbs": n / read / 1e9}


def weight(rng: np.random.Generator, n: int, k: int, qtype: str) -> Any:
    """A QTensor of random valid blocks: up to 2048 rows drawn, repeated to n rows."""
    from engine.gguf_model import QTensor
    from engine.quantize import random_quantized

    m = min(n, 2048)
    raw = random_quantized(rng, (m, k), qtype, 0.02)
    raw = np.resize(raw, (n, raw.shape[1])) if n > m else raw
    return QTensor(f"w_{n}x{k}_{qtype}", qtype, (n, k), raw)


def _time_config(be: Any, cp: Any, flat: dict, x: Any, copies: list, y: Any) -> float:
    """Seconds per matmul of config flat: a CUDA graph of LAUNCHES back-to-back matmul_into
    calls cycling through the weight copies, best of 5 replays."""
    from engine.tuning import TuningConfig

    stream = be._stream
    be.set_config(TuningConfig.from_flat("cuda", flat))
    for w in copies:  # warm: kernels built, mmvw's Q8_1 form of x cached
        be.matmul_into(x, w, y)
    be.synchronize()
    stream.begin_capture()
    try:
        for i in range(LAUNCHES):
            be.matmul_into(x, copies[i % len(copies)], y)
    finally:
        graph = stream.end_capture()
    return _events(cp, stream, lambda: graph.launch(stream), 5) / LAUNCHES


def bench_shape(be: Any, cp: Any, shape: tuple[int, int, str], names: list[str], deadline: float,
                rng: np.random.Generator) -> list[dict]:  # fmt: skip
    n, k, qtype = shape
    host = weight(rng, n, k, qtype)  # one drawing, uploaded to several places: same bytes
    w0 = be.load_weight(host)
    nbytes = int(w0.raw.nbytes)
    n_copies = min(8, max(1, math.ceil(L2_SPAN / nbytes)))
    copies = [w0] + [be.load_weight(host) for _ in range(n_copies - 1)]
    x = be.upload(rng.standard_normal((1, k)).astype(np.float32))
    y = cp.empty((1, n), np.float32)
    moved = nbytes + 4 * (k + n)
    rows = []
    for name in names:
        if time.time() > deadline:
            break
        try:  # a config that fails (a build, a launch) is reported and the others go on
            t = _time_config(be, cp, CONFIGS[name], x, copies, y)
        except Exception as e:  # noqa: BLE001
            print(f"{n}x{k} {qtype} {name}: {type(e).__name__}: {e}"[:400], flush=True)
            rows.append({"shape": f"{n}x{k}", "qtype": qtype, "config": name, "error": str(e)})
            continue
        row = {"shape": f"{n}x{k}", "qtype": qtype, "config": name, "us": t * 1e6,
               "gbs": moved / t / 1e9, "copies": len(copies)}  # fmt: skip
        rows.append(row)
        print(f"{row['shape']:>12} {qtype:5} {name:16} {row['us']:8.1f} us {row['gbs']:7.0f} GB/s",
              flush=True)  # fmt: skip
    del copies, w0
    cp.get_default_memory_pool().free_all_blocks()
    return rows


def compile_only(spec: str) -> int:
    """Build one module, spec = JSON [file, {define: value}] (NVRTC; CuPy's disk cache keeps it
    for later processes)."""
    import cupy as cp

    from engine.backends.cuda import kernels

    fname, defines = json.loads(spec)
    props = cp.cuda.runtime.getDeviceProperties(0)
    cc = int(props["major"]) * 10 + int(props["minor"])  # as CudaBackend computes it
    kernels.module(cp, cc, fname, defines)
    return 0


def precompile(flats: list[dict]) -> int:
    """Compile every distinct module of the flat configs, one process each, all at once (a cold
    NVRTC cache costs seconds per module). Returns how many modules were built."""
    import os

    from engine.backends.cuda import kernels
    from engine.tuning import TuningConfig

    specs = sorted(
        {
            json.dumps([f, d], sort_keys=True)
            for flat in flats
            for f, d in kernels.modules_for(TuningConfig.from_flat("cuda", flat)).values()
        }
    )
    running: list[subprocess.Popen] = []
    for spec in specs:
        while len(running) >= (os.cpu_count() or 4):
            running.pop(0).wait()
        running.append(
            subprocess.Popen([sys.executable, __file__, "--compile-only", spec], cwd=ROOT)
        )
    for p in running:
        p.wait()
    return len(specs)


def summary(rows: list[dict], names: list[str]) -> list[str]:
    """Per shape: the best config, then each config's GB/s and share of the copy roof; last,
    each config's mean share over the shapes every config ran on."""
    out, shares = [], {n: [] for n in names}
    shapes = list(dict.fromkeys((r["shape"], r["qtype"]) for r in rows))
    for shape in shapes:
        got = [r for r in rows if (r["shape"], r["qtype"]) == shape and "gbs" in r]
        if not got:
            continue
        best = max(got, key=lambda r: r["gbs"])
        out.append(f"{shape[0]} {shape[1]}: best {best['config']} {best['gbs']:.0f} GB/s "
                   f"({best.get('of_copy', math.nan):.0%} of copy)")  # fmt: skip
        if len(got) == len(names):
            for r in got:
                shares[r["config"]].append(r.get("of_copy", math.nan))
    for n, v in shares.items():
        if v:
            out.append(f"  {n:16} mean {sum(v) / len(v):.1%} of copy over {len(v)} shapes")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="directory for gemv.json")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma list of CONFIGS names")
    ap.add_argument("--shapes", default="9b,7b", help=f"comma list of {', '.join(SHAPES)}")
    ap.add_argument("--deadline", type=float, default=0.0, help="unix time to stop starting")
    ap.add_argument("--json", action="store_true", help="print the result JSON on stdout")
    ap.add_argument("--precompile", action="store_true", help="build the configs in parallel first")
    ap.add_argument(
        "--precompile-only",
        metavar="JSON",
        help="build the modules of a JSON list of flat configs in parallel, then exit",
    )
    ap.add_argument("--compile-only", metavar="SPEC", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.compile_only:
        return compile_only(a.compile_only)
    if a.precompile_only:
        print(f"precompiled {precompile(json.loads(a.precompile_only))} modules", flush=True)
        return 0
    names = [c for c in a.configs.split(",") if c]
    sets = [s for s in a.shapes.split(",") if s]
    bad = [c for c in names if c not in CONFIGS] + [s for s in sets if s not in SHAPES]
    if bad:
        print(f"unknown config or shape set(s): {', '.join(bad)}", file=sys.stderr)
        return 2
    deadline = a.deadline or math.inf
    if a.precompile:
        t0 = time.time()
        n = precompile([CONFIGS[c] for c in names])
        print(f"precompiled {n} modules in {time.time() - t0:.1f} s", flush=True)
    from engine import backends

    be = backends.create("cuda")
    cp = be._cp
    sms = int(be.device_info().extra.get("sms", 132))
    res: dict[str, Any] = {"device": be.device_info().name}
    try:
        res |= roofs(cp, be._stream, sms)
    except Exception as e:  # noqa: BLE001 - the GEMVs are still worth measuring
        print(f"roofs: {type(e).__name__}: {e}", flush=True)
        res |= {"copy_gbs": math.nan, "read_gbs": math.nan}
    print(f"copy {res['copy_gbs']:.0f} GB/s (read + write), read {res['read_gbs']:.0f} GB/s",
          flush=True)  # fmt: skip
    rng = np.random.default_rng(0)
    res["rows"] = []
    for s in sets:
        for shape in SHAPES[s]:
            if time.time() > deadline:
                break
            res["rows"] += bench_shape(be, cp, shape, names, deadline, rng)
            if a.out:
                a.out.mkdir(parents=True, exist_ok=True)
                (a.out / "gemv.json").write_text(json.dumps(res, indent=1))
    for r in (r for r in res["rows"] if "gbs" in r):
        r["of_copy"] = r["gbs"] / res["copy_gbs"]
        r["of_read"] = r["gbs"] / res["read_gbs"]
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "gemv.json").write_text(json.dumps(res, indent=1))
    for line in summary(res["rows"], names):
        print(line)
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
