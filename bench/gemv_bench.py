"""Decode GEMV bandwidth (issue 14): the weight bandwidth each matmul_decode config reaches on
the matrix shapes of a decode layer and the LM head, beside a plain copy and a plain read of the
same card measured in the same run. No model file: random valid blocks of the right types, one
drawing uploaded to enough copies that every launch reads HBM, not L2.

Shapes: per --preset (engine.synth's 1.5b / 7b, and 9b / other: the hybrid's matrices and the
legacy block types) named launches of one or more matrices (qkv: three, one launch under mmvw).
Configs: the mmvw knob settings (base ... lk_stage_lm), the float-activation mmvf_* and dmmv.
mmvw runs a launch as one grouped kernel (CudaBackend._mmvw), the others as one matmul_into a
matrix. Each (config, shape) is timed as a CUDA graph of --calls launches (PDL edges included
under matmul_decode.pdl), median of --repeats replays: us per launch, GB/s of the weight bytes
as stored on the GPU (Q6_K padded to 224 bytes a block) and its share of the copy roof.

usage: python bench/gemv_bench.py [--preset 7b,1.5b] [--configs base,split2,mmvf,...]
       [--shapes gate_up,down_q4k,...] [--calls 24] [--repeats 5] [--deadline EPOCH_S]
       [--precompile] [--out DIR] [--json] [--list]
(This replaces bench/bench_gemv.py, which measured the same thing; git has it.)
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from typing import Any

import harness
import numpy as np

ROOT = harness.ROOT
MMVW = {"matmul_decode.variant": "mmvw"}


def _k(**knobs: int) -> dict:
    return MMVW | {f"matmul_decode.{k}": v for k, v in knobs.items()}


MMVW_SETTINGS: dict[str, dict] = {  # base: mmvw's defaults (int8 activations)
    "base": _k(),
    "r2": _k(rows_per_thread=2),
    "r4": _k(rows_per_thread=4),
    "u4": _k(unroll=4),
    "w8": _k(warps=8),
    "wl1": _k(wload=1),
    "mb8": _k(min_blocks=8),
    "t16r2": _k(threads_per_row=16, rows_per_thread=2),
    # no idle slots on K = 1536 / 3584 (48 / 112 slots of 32 weights: 16 lanes x 1 divides both)
    "t16u1": _k(threads_per_row=16, unroll=1),
    "t16r2u1": _k(threads_per_row=16, rows_per_thread=2, unroll=1),
    "t16r2u1_split4": _k(threads_per_row=16, rows_per_thread=2, unroll=1, split_k=4),
    # 64-weight Q4_K slots: 56 / 24 slots a row on K = 3584 / 1536
    "wide4": _k(q4k_wide=1),
    "wide": _k(q4k_wide=1, q6k_wide=1),  # 64-weight Q6_K slots too: 56 / 24 a row
    "wide_u1": _k(q4k_wide=1, q6k_wide=1, unroll=1),
    "wide_t16": _k(q4k_wide=1, q6k_wide=1, threads_per_row=16),
    "wide_t16u1": _k(q4k_wide=1, q6k_wide=1, threads_per_row=16, unroll=1),
    "wide_t8": _k(q4k_wide=1, q6k_wide=1, threads_per_row=8),
    "wide_split2": _k(q4k_wide=1, q6k_wide=1, split_k=2),
    "wide_u4": _k(q4k_wide=1, q6k_wide=1, unroll=4),
    "split2": _k(split_k=2),
    "split4": _k(split_k=4),
    "split2_u4": _k(split_k=2, unroll=4),
    "split4_w8": _k(split_k=4, warps=8),
    "r2_split2": _k(rows_per_thread=2, split_k=2),
    "split2_all": _k(split_k=2, split_min_k=256),  # the short rows (q/k/v, o, gate/up) too
    "split4_all": _k(split_k=4, split_min_k=256),
    "stage": _k(stage=1),
    "pdl": _k(pdl=1),
    "pdl_pf": _k(pdl=1, prefetch=1),
    "pdl_stage": _k(pdl=1, stage=1),
    "pdl_split2": _k(pdl=1, split_k=2),
    # mmvw_stream (stream = ring stages): persistent blocks, bulk-copied shared-memory stages
    "s2": _k(stream=2),
    "s3": _k(stream=3),
    "s4": _k(stream=4),
    "s6": _k(stream=6),
    "s4_b2": _k(stream=4, stream_blocks=2),
    "s2_split2": _k(stream=2, split_k=2),
    "s4_split2": _k(stream=4, split_k=2),
    "s3_w8_split2": _k(stream=3, warps=8, split_k=2),
    "s4_w8_split4": _k(stream=4, warps=8, split_k=4),
    "s3_r2": _k(stream=3, rows_per_thread=2),
    "s3_t16r2u1": _k(stream=3, threads_per_row=16, rows_per_thread=2, unroll=1),
    "s4_u4": _k(stream=4, unroll=4),
    "s4_pdl": _k(stream=4, pdl=1),
    # + the activations as shared-memory planes (stream_x)
    "s3x": _k(stream=3, stream_x=1),
    "s4x": _k(stream=4, stream_x=1),
    "s4x_b2": _k(stream=4, stream_x=1, stream_blocks=2),
    "s3x_split2": _k(stream=3, stream_x=1, split_k=2),
    "s3x_w8_split2": _k(stream=3, stream_x=1, warps=8, split_k=2),
    "s3x_r2": _k(stream=3, stream_x=1, rows_per_thread=2),
    "s3x_u4": _k(stream=3, stream_x=1, unroll=4),
    # Q4_K decoded branch-free (q4k_lean) and the Q4_K-only kernel (q4k_kernel: fewer registers,
    # more warps an SM; the gemv checkpoint's rate followed warps per SM)
    "lean": _k(q4k_lean=1),
    "k4": _k(q4k_kernel=1),
    "lk": _k(q4k_lean=1, q4k_kernel=1),
    "lk_mb12": _k(q4k_lean=1, q4k_kernel=1, q4k_min_blocks=12),
    "lk_mb16": _k(q4k_lean=1, q4k_kernel=1, q4k_min_blocks=16),
    "lk_split2": _k(q4k_lean=1, q4k_kernel=1, split_k=2),
    "lk_mb16_split2": _k(q4k_lean=1, q4k_kernel=1, q4k_min_blocks=16, split_k=2),
    "lk_u4": _k(q4k_lean=1, q4k_kernel=1, unroll=4),
    "lk_w8": _k(q4k_lean=1, q4k_kernel=1, warps=8),
    "lk_wide": _k(q4k_lean=1, q4k_kernel=1, q4k_wide=1),
    "lk_wide_split2": _k(q4k_lean=1, q4k_kernel=1, q4k_wide=1, split_k=2),
    "lk_stage": _k(q4k_lean=1, q4k_kernel=1, stage=1),
    "lk_stage_lm": _k(q4k_lean=1, q4k_kernel=1, stage=1, stage_min_rows=65536),
}
MMVF = {"matmul_decode.variant": "mmvf"}


def _mmvf(**k: int) -> dict:
    return MMVF | {f"matmul_decode.{a}": v for a, v in k.items()}


# name -> flat config (the registry's names; defaults where not given)
MMVF_CONFIGS: dict[str, dict] = {  # mmvf_*: the registry defaults (threads 32, rows 2, unroll 2,
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
}
CONFIGS: dict[str, dict] = MMVW_SETTINGS | MMVF_CONFIGS
L2_SPAN = 256 << 20  # bytes of weight copies a shape rotates through (H200 L2: 50 MB)
Launch = list[tuple[str, int, int]]  # the matrices one launch multiplies: (type, N, K)
FIXED: dict[str, dict[str, Launch]] = {  # presets engine.synth does not build
    "9b": {
        "gate_up": [("Q4_K", 12288, 4096)],
        "down_q4k": [("Q4_K", 4096, 12288)],
        "down_q6k": [("Q6_K", 4096, 12288)],
    },
    "other": {t.lower(): [(t, 12288, 4096)] for t in ("Q8_0", "Q5_0", "Q4_0")},
}
PRESET_NAMES = ("1.5b", "7b", *FIXED)


def shapes(preset: str) -> dict[str, Launch]:
    """name -> the matrices one launch multiplies: (type, N, K)."""
    if preset in FIXED:
        return FIXED[preset]
    from engine.synth import PRESETS

    p = PRESETS[preset]
    C, F = p.n_embd, p.n_ff
    kv = p.n_head_kv * (C // p.n_head)
    return {
        "qkv": [("Q4_K", C, C), ("Q4_K", kv, C), ("Q6_K", kv, C)],
        "o": [("Q4_K", C, C)],
        "gate_up": [("Q4_K", F, C), ("Q4_K", F, C)],
        "down_q4k": [("Q4_K", C, F)],
        "down_q6k": [("Q6_K", C, F)],
        "lm_head": [("Q6_K", p.n_vocab, C)],
    }


def _event_s(cp: Any, stream: Any, fn: Any, repeats: int) -> float:
    """Median seconds of fn (which enqueues on stream), after a warm-up."""
    return harness.median_ms(lambda: harness.cuda_events_ms(cp, stream, fn), repeats) / 1e3


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
    copy = _event_s(cp, stream, lambda: b.__setitem__(Ellipsis, a), 5)
    k = cp.RawKernel(_READ, "read_all")
    out = cp.zeros(1, np.uint32)
    read = _event_s(cp, stream, lambda: k((sms * 8,), (256,), (a, np.int64(n // 16), out)), 5)
    return {"copy_gbs": 2 * n / copy / 1e9, "read_gbs": n / read / 1e9}


def weight(rng: np.random.Generator, n: int, k: int, qtype: str) -> Any:
    """A QTensor of random valid blocks: up to 2048 rows drawn, repeated to n rows."""
    from engine.gguf_model import QTensor
    from engine.quantize import random_quantized

    m = min(n, 2048)
    raw = random_quantized(rng, (m, k), qtype, 0.02)
    raw = np.resize(raw, (n, raw.shape[1])) if n > m else raw
    return QTensor(f"w_{n}x{k}_{qtype}", qtype, (n, k), raw)


class ShapeSet:
    """Copies of one launch's weights (enough bytes to defeat L2), its input row, outputs."""

    def __init__(self, be: Any, mats: Launch, rng: np.random.Generator) -> None:
        cp = be._cp
        hosts = [weight(rng, n, k, t) for t, n, k in mats]  # one drawing, several uploads
        first = [be.load_weight(h) for h in hosts]
        self.bytes = sum(int(w.raw.nbytes) for w in first)
        self.copies = max(2, math.ceil(L2_SPAN / self.bytes))  # small shapes: many copies
        self.sets = [first] + [[be.load_weight(h) for h in hosts] for _ in range(self.copies - 1)]
        self.x = be.upload(rng.standard_normal((1, mats[0][2])).astype(np.float32))
        self.ys = [cp.zeros((1, n), np.float32) for _, n, _ in mats]
        self.k_types = all(t in ("Q4_K", "Q6_K") for t, _, _ in mats)  # what _mmvw groups

    def launch(self, be: Any, c: int, grouped: bool) -> None:
        ws = self.sets[c % self.copies]
        if grouped:  # mmvw: the matrices of one launch in one kernel, as decode runs them
            be._mmvw(self.x, [(w, y, None) for w, y in zip(ws, self.ys, strict=True)])
            return
        for w, y in zip(ws, self.ys, strict=True):
            be.matmul_into(self.x, w, y)


def time_set(be: Any, s: ShapeSet, flat: dict, calls: int, repeats: int) -> float:
    """Median seconds per launch over graph replays of ``calls`` launches under config flat."""
    from engine.tuning import TuningConfig

    be.set_config(TuningConfig.from_flat("cuda", flat))
    grouped = flat.get("matmul_decode.variant") == "mmvw" and s.k_types  # mmvw's own launch
    for c in range(s.copies):  # warm: kernels built, mmvw's Q8_1 form of x cached
        s.launch(be, c, grouped)
    be.synchronize()
    st = be._stream
    st.begin_capture()
    try:
        for c in range(calls):
            s.launch(be, c, grouped)
    finally:
        graph = st.end_capture()
    return _event_s(be._cp, st, lambda: graph.launch(stream=st), repeats) / calls


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
    """Per shape: the best config and its share of the copy roof; last, each config's mean share
    over the shapes every config ran on."""
    out, shares = [], {n: [] for n in names}
    for shape in dict.fromkeys(r["shape"] for r in rows):
        got = [r for r in rows if r["shape"] == shape and "gbs" in r]
        if not got:
            continue
        best = max(got, key=lambda r: r["gbs"])
        out.append(f"{shape}: best {best['config']} {best['gbs']:.0f} GB/s "
                   f"({best.get('of_copy', math.nan):.0%} of copy)")  # fmt: skip
        if len(got) == len(names):
            for r in got:
                shares[r["config"]].append(r.get("of_copy", math.nan))
    for n, v in shares.items():
        if v:
            out.append(f"  {n:16} mean {sum(v) / len(v):.1%} of copy over {len(v)} shapes")
    return out


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = harness.parser(__doc__)
    ap.add_argument("--preset", default="7b,1.5b", help=f"comma list of {', '.join(PRESET_NAMES)}")
    ap.add_argument("--configs", default=",".join(MMVW_SETTINGS), help="comma list of CONFIGS")
    ap.add_argument("--shapes", default="", help="only these shapes (e.g. gate_up,down_q4k)")
    ap.add_argument("--calls", type=int, default=24, help="launches per captured graph")
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch s: no config starts past")
    ap.add_argument("--precompile", action="store_true", help="build the configs in parallel first")
    ap.add_argument(
        "--precompile-only",
        metavar="JSON",
        help="build the modules of a JSON list of flat configs in parallel, then exit",
    )
    ap.add_argument("--compile-only", metavar="SPEC", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(argv)
    if a.compile_only:
        return compile_only(a.compile_only)
    if a.precompile_only:
        print(f"precompiled {precompile(json.loads(a.precompile_only))} modules", flush=True)
        return 0
    presets, names, only = (
        harness.names(a.preset),
        harness.names(a.configs),
        harness.names(a.shapes),
    )
    bad = harness.unknown(presets, PRESET_NAMES) + harness.unknown(names, CONFIGS)
    bad += [n for n in only if all(n not in shapes(p) for p in PRESET_NAMES)]
    if bad or not names or a.calls < 1:
        return harness.refuse("gemv_bench", f"unknown preset, config or shape {bad}, or none")
    if a.list:
        return harness.list_cases({n: CONFIGS[n] for n in names}, shapes={
            p: {k: v for k, v in shapes(p).items() if not only or k in only} for p in presets
        })  # fmt: skip
    if a.precompile:
        t0 = time.time()
        n = precompile([CONFIGS[c] for c in names])
        print(f"precompiled {n} modules in {time.time() - t0:.1f} s", flush=True)
    from engine import backends

    be = backends.create("cuda")
    res: dict[str, Any] = {"device": be.device_info().name}
    try:
        res |= roofs(be._cp, be._stream, int(be.device_info().extra.get("sms", 132)))
    except Exception as e:  # noqa: BLE001 - the GEMVs are still worth measuring
        print(f"roofs: {type(e).__name__}: {e}", flush=True)
        res |= {"copy_gbs": math.nan, "read_gbs": math.nan}
    print(f"copy {res['copy_gbs']:.0f} GB/s (read + write), read {res['read_gbs']:.0f} GB/s",
          flush=True)  # fmt: skip
    rng = np.random.default_rng(0)
    res["rows"] = rows = []
    for p in presets:
        for shape, mats in shapes(p).items():
            if (only and shape not in only) or (a.deadline and time.time() > a.deadline):
                continue
            s = ShapeSet(be, mats, rng)
            for n in names:
                row = {"shape": f"{p}/{shape}", "config": n, "copies": s.copies}
                try:  # a config that fails (a build, a launch) is its row; the others go on
                    t = time_set(be, s, CONFIGS[n], a.calls, a.repeats)
                except Exception as e:  # noqa: BLE001
                    rows.append(row | {"error": f"{type(e).__name__}: {e}"[:300]})
                    print(f"{row['shape']} {n}: {rows[-1]['error']}", flush=True)
                    continue
                gbs = s.bytes / t / 1e9
                rows.append(row | {"us": round(t * 1e6, 2), "gbs": round(gbs, 1),
                                   "of_copy": gbs / res["copy_gbs"]})  # fmt: skip
                print(f"{row['shape']:>16} {n:16} {t * 1e6:8.2f} us {gbs:7.0f} GB/s", flush=True)
            harness.emit(res, a, "gemv_bench.json")
            del s
            be._cp.get_default_memory_pool().free_all_blocks()
    for line in summary(rows, names):
        print(line)
    return harness.finish(res, a, "gemv_bench.json")


if __name__ == "__main__":
    sys.exit(main())
