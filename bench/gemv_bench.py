"""Decode GEMV bandwidth per shape (issue 14): the int8 decode matmul (matmul_decode.mmvw)
on the weight shapes of one qwen2 decode layer and the LM head, against the card's copy
bandwidth, for a list of knob settings. No model file: random weight bytes of the right
types (timing does not depend on the values), rotated through enough copies that every call
reads HBM, not L2.

Each (setting, shape) is timed as a CUDA graph of --calls back-to-back launches (what a decode
step's graph replays, PDL edges included under matmul_decode.pdl), median of --repeats
replays: us per call and weight GB/s (bytes of the weights read / time).

usage: python bench/gemv_bench.py [--preset 7b,1.5b] [--settings base,split2,...]
       [--shapes gate_up,down_q4k,...] [--calls 40] [--repeats 5] [--deadline EPOCH_S]
       [--out DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.synth import PRESETS  # noqa: E402
from engine.tuning import TuningConfig  # noqa: E402

MMVW = {"matmul_decode.variant": "mmvw"}


def _k(**knobs: int) -> dict:
    return MMVW | {f"matmul_decode.{k}": v for k, v in knobs.items()}


SETTINGS: dict[str, dict] = {
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
Q4K_ROW, Q6K_ROW = 144, 224  # bytes per 256 weights (Q6_K as loaded: padded to 224)
L2_DEFEAT = 256 << 20  # bytes of weight copies a shape rotates through (H200 L2: 50 MB)


def shapes(preset: str) -> dict[str, list[tuple[str, int, int]]]:
    """name -> the matrices one launch multiplies: (type, N, K)."""
    p = PRESETS[preset]
    C, F = p.n_embd, p.n_ff
    D = C // p.n_head
    kv = p.n_head_kv * D
    return {
        "qkv": [("Q4_K", C, C), ("Q4_K", kv, C), ("Q6_K", kv, C)],
        "o": [("Q4_K", C, C)],
        "gate_up": [("Q4_K", F, C), ("Q4_K", F, C)],
        "down_q4k": [("Q4_K", C, F)],
        "down_q6k": [("Q6_K", C, F)],
        "lm_head": [("Q6_K", p.n_vocab, C)],
    }


def row_bytes(qtype: str, k: int) -> int:
    return k // 256 * (Q4K_ROW if qtype == "Q4_K" else Q6K_ROW)


def copy_tb_s(cp, nbytes: int = 1 << 30) -> float:  # noqa: ANN001
    """Device-to-device copy rate, read + write bytes counted (the issue's 4.2 TB/s)."""
    a = cp.zeros(nbytes, np.uint8)
    b = cp.empty_like(a)
    b[...] = a
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(5):
        e0.record()
        b[...] = a
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
    del a, b
    return 2 * nbytes / float(np.median(ts)) / 1e12


class ShapeSet:
    """Copies of one launch's weights (enough bytes to defeat L2), its input rows, outputs."""

    def __init__(self, cp, be, mats: list[tuple[str, int, int]], seed: int) -> None:  # noqa: ANN001
        from engine.backends.cuda.backend import CudaWeight

        self.bytes = sum(n * row_bytes(t, k) for t, n, k in mats)
        self.copies = max(2, math.ceil(L2_DEFEAT / self.bytes))
        rs = cp.random.RandomState(seed)
        self.sets = []
        for c in range(self.copies):
            ws = []
            for i, (t, n, k) in enumerate(mats):
                raw = rs.randint(0, 256, size=(n, row_bytes(t, k)), dtype=np.uint8)
                if t == "Q6_K":  # keep the fp16 d of every block finite (bytes 208-209)
                    raw.reshape(n, -1, Q6K_ROW)[:, :, 208:210] = 0x20
                else:  # Q4_K d / dmin (bytes 0-3)
                    raw.reshape(n, -1, Q4K_ROW)[:, :, 0:4] = 0x20
                ws.append(CudaWeight(f"w{c}_{i}", t, (n, k), raw=raw))
            self.sets.append(ws)
        k = mats[0][2]
        self.x = be.upload(np.random.default_rng(seed).standard_normal((1, k)).astype(np.float32))
        self.ys = [cp.zeros((1, n), np.float32) for _, n, _ in mats]
        self.adds = [cp.zeros((1, n), np.float32) for _, n, _ in mats]

    def launch(self, be, c: int) -> None:  # noqa: ANN001
        ws = self.sets[c % self.copies]
        be._mmvw(self.x, [(w, y, a) for w, y, a in zip(ws, self.ys, self.adds, strict=True)])


def time_set(cp, be, s: ShapeSet, calls: int, repeats: int) -> float:  # noqa: ANN001
    """Median seconds per launch over graph replays of `calls` launches."""
    be.quantize_q8(s.x)  # its Q8_1 form is remembered: the graph holds only the GEMVs
    for c in range(2):
        s.launch(be, c)
    be.synchronize()
    st = be._stream
    st.begin_capture()
    try:
        for c in range(calls):
            s.launch(be, c)
    finally:
        graph = st.end_capture()
    graph.launch(stream=st)
    st.synchronize()
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(repeats):
        e0.record(st)
        graph.launch(stream=st)
        e1.record(st)
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3 / calls)
    return float(np.median(ts))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", default="7b,1.5b")
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--shapes", default="", help="only these shapes (e.g. gate_up,down_q4k)")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--deadline", type=float, default=0.0, help="epoch s: no setting starts past")
    ap.add_argument("--out", type=Path, default=None, help="directory for gemv_bench.json")
    ap.add_argument("--json", action="store_true", help="print the JSON record")
    a = ap.parse_args(argv)
    presets = [p for p in a.preset.split(",") if p]
    names = [n for n in a.settings.split(",") if n]
    only = [n for n in a.shapes.split(",") if n]
    bad = [p for p in presets if p not in PRESETS] + [n for n in names if n not in SETTINGS]
    bad += [n for n in only if n not in shapes("1.5b")]
    if bad:
        print(f"gemv_bench: unknown preset or setting {bad}; settings: {', '.join(SETTINGS)}")
        return 2
    import cupy as cp

    from engine import backends

    be = backends.create("cuda")
    rec: dict = {"copy_tb_s": copy_tb_s(cp), "results": {}}
    print(f"copy {rec['copy_tb_s']:.2f} TB/s (read + write)", flush=True)
    sets = {
        (p, name): ShapeSet(cp, be, mats, seed=i)
        for p in presets
        for i, (name, mats) in enumerate(shapes(p).items())
        if not only or name in only
    }
    for n in names:
        if a.deadline and time.time() > a.deadline:
            print(f"deadline: {n} and later settings not run", flush=True)
            break
        t0 = time.time()
        be.set_config(TuningConfig.from_flat("cuda", SETTINGS[n]))
        row = rec["results"][n] = {}
        for (p, shape), s in sets.items():
            try:
                t = time_set(cp, be, s, a.calls, a.repeats)
            except Exception as e:  # noqa: BLE001 - one failed setting is that setting's result
                row[f"{p}/{shape}"] = {"error": f"{type(e).__name__}: {e}"[:300]}
                continue
            row[f"{p}/{shape}"] = {"us": round(t * 1e6, 2), "gb_s": round(s.bytes / t / 1e9, 1)}
        cells = "  ".join(f"{k}={v.get('us', 'ERR')}us/{v.get('gb_s', '')}" for k, v in row.items())
        print(f"{n:12s} ({time.time() - t0:.1f}s)  {cells}", flush=True)
        if a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / "gemv_bench.json").write_text(json.dumps(rec, indent=1))
    if a.json:
        print(json.dumps(rec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
