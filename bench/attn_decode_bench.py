"""Decode attention alone (issue 14): us per call of each attention_decode variant / knob set at
several contexts, on the qwen2 1.5B (H 12, Hkv 2, D 128) and 7B (H 28, Hkv 4, D 128) shapes.

Each case is validated first (one eager call of layer 0 against float64 NumPy, NMSE printed),
then timed as a captured CUDA graph of N calls (CudaBackend's own capture: the position read
on the device, as in decode) with CUDA events, median of --repeats launches:
- hot: every call on one layer (its K/V stays in L2);
- cold: the calls walk over enough layers that their K/V (>= 256 MB, at most 64 layers) does not
  fit in the H200's 50 MB L2, as in decode, where ~35 MB (1.5B) of weights stream between two
  attention calls.
The config is dec8_split2 (experiments/decode-h200.toml's start of that name; int8 decode: the
kernels also write the output's Q8_1 form) with the variant's attention_decode knobs. GB/s: the
K/V bytes a call reads (2 x L x Hkv x D x 4) over its cold time.

usage: python bench/attn_decode_bench.py [--contexts 128,512,2048,8192] [--shapes 1.5b,7b]
       [--variants a,b] [--calls 64] [--repeats 5] [--deadline S] [--out FILE] [--json] [--list]
"""

from __future__ import annotations

import math
import sys
import time

import harness
import numpy as np

SHAPES = {"1.5b": (12, 2, 128), "7b": (28, 4, 128)}  # H, Hkv, D
_A = "attention_decode."
BENCH = {  # name -> attention_decode knobs over dec8_split2
    "split_kw": {},  # dec8_split2's own: split_kw, splits 8, warps 4, 8 lanes a key, fused
    "split_kw_ke_s16": {_A + "kv_early": 1, _A + "splits": 16},
    "gqa": {_A + "variant": "gqa"},
    "tile": {_A + "variant": "tile"},  # splits 32, min_keys 64, warps 8, fused combine
    "tile_w4": {_A + "variant": "tile", _A + "warps": 4},
    "tile_m32": {_A + "variant": "tile", _A + "min_keys": 32},
    "tile_m128": {_A + "variant": "tile", _A + "min_keys": 128},
    "tile_s16": {_A + "variant": "tile", _A + "splits": 16},
    "tile_s64": {_A + "variant": "tile", _A + "splits": 64},
    "tile_s64_m32": {_A + "variant": "tile", _A + "splits": 64, _A + "min_keys": 32},
    "tile_nofc": {_A + "variant": "tile", _A + "fuse_combine": 0},
    "tile_st1": {_A + "variant": "tile", _A + "stages": 1},
    "tile_m32_st1": {_A + "variant": "tile", _A + "min_keys": 32, _A + "stages": 1},
    "vec": {_A + "variant": "vec"},  # splits 64, min_keys 32, warps 4, fused combine
    "vec_w2": {_A + "variant": "vec", _A + "warps": 2},
    "vec_w8": {_A + "variant": "vec", _A + "warps": 8},
    "vec_w1_m8": {_A + "variant": "vec", _A + "warps": 1, _A + "min_keys": 8},
    "vec_w2_m16": {_A + "variant": "vec", _A + "warps": 2, _A + "min_keys": 16},
    "vec_m64": {_A + "variant": "vec", _A + "min_keys": 64},
    "vec_s128_m16": {_A + "variant": "vec", _A + "splits": 128, _A + "min_keys": 16},
    "vec_nofc": {_A + "variant": "vec", _A + "fuse_combine": 0},
    "vec_cl": {_A + "variant": "vec", _A + "cluster": 1},  # 8 ranges, warps 4
    "vec_cl_w8": {_A + "variant": "vec", _A + "cluster": 1, _A + "warps": 8},
    "vec_cl_w2": {_A + "variant": "vec", _A + "cluster": 1, _A + "warps": 2},
    "vec_cl_w8_pf": {_A + "variant": "vec", _A + "cluster": 1, _A + "warps": 8, _A + "prefetch": 1},
    "vec_cl_pf": {_A + "variant": "vec", _A + "cluster": 1, _A + "prefetch": 1},
}
BASE = {  # dec8_split2 (experiments/decode-h200.toml): the int8 decode path, split-K 2
    "matmul_prefill.variant": "resident",
    "attention_prefill.variant": "flash_tc",
    "matmul_decode.variant": "mmvw",
    "rope.fuse_kv": 1,
    "attention_decode.variant": "split_kw",
    "matmul_decode.split_k": 2,
}
COLD_BYTES = 256 << 20


def attention_ref(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int) -> np.ndarray:
    """float64 decode attention: q [1, H, D] over k, v [S, Hkv, D] rows 0..pos0 -> [1, H, D]."""
    H, Hkv = q.shape[1], k.shape[1]
    kk = k[: pos0 + 1].astype(np.float64).repeat(H // Hkv, axis=1)  # [L, H, D]
    s = np.einsum("hd,lhd->hl", q[0].astype(np.float64), kk) / np.sqrt(q.shape[2])
    p = np.exp(s - s.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    vv = v[: pos0 + 1].astype(np.float64).repeat(H // Hkv, axis=1)
    return np.einsum("hl,lhd->hd", p, vv)[None]


def _timed_graph(be, step, pos0: int, cache, repeats: int) -> float:  # noqa: ANN001
    """Median ms of one launch of a captured graph of step (CudaBackend._capture)."""
    cp = be._cp
    be._pos_dev[...] = pos0  # the graph reads the position on the device, as decode's
    g = be._capture(step, None, pos0, cache)
    be._graph = None  # not the backend's decode graph
    stream = be._stream
    return harness.median_ms(
        lambda: harness.cuda_events_ms(cp, stream, lambda: g.graph.launch(stream=stream)), repeats
    )


def bench_case(be, shape: str, ctx: int, names: list[str], calls: int, repeats: int) -> list:  # noqa: ANN001
    """Rows {shape, ctx, variant, nmse, us_hot, us_cold, gbps} for one shape and context."""
    from engine.tuning import TuningConfig

    cp = be._cp
    H, Hkv, D = SHAPES[shape]
    pos0 = ctx - 1
    layer_bytes = 2 * ctx * Hkv * D * 4
    n_layers = max(1, min(64, math.ceil(COLD_BYTES / layer_bytes)))
    cache = be.new_kv_cache(n_layers, ctx, Hkv, D)
    rs = cp.random.RandomState(ctx + H)
    for i in range(n_layers):
        cache.k[i][...] = rs.standard_normal(cache.k[i].shape, dtype=np.float32)
        cache.v[i][...] = rs.standard_normal(cache.v[i].shape, dtype=np.float32)
    qh = np.random.default_rng(ctx).standard_normal((1, H, D)).astype(np.float32)
    q = be.upload(qh)
    ref = attention_ref(qh, be.download(cache.k[0]), be.download(cache.v[0]), pos0)
    n_cold = max(calls, n_layers)
    rows = []
    for name in names:
        be.set_config(TuningConfig.from_flat("cuda", BASE | BENCH[name]))
        got = be.download(be.ops.attention(q, cache, 0, pos0)).astype(np.float64)
        nmse = float(np.sum((got - ref) ** 2) / np.sum(ref**2))

        def hot(tok, pos):  # noqa: ANN001, ANN202
            out = None
            for _ in range(calls):
                out = be.ops.attention(q, cache, 0, pos)
            return out, out

        def cold(tok, pos):  # noqa: ANN001, ANN202
            out = None
            for i in range(n_cold):
                out = be.ops.attention(q, cache, i % n_layers, pos)
            return out, out

        us_hot = _timed_graph(be, hot, pos0, cache, repeats) * 1e3 / calls
        us_cold = _timed_graph(be, cold, pos0, cache, repeats) * 1e3 / n_cold
        rows.append({
            "shape": shape, "ctx": ctx, "variant": name, "nmse": nmse,
            "us_hot": round(us_hot, 2), "us_cold": round(us_cold, 2),
            "gbps_cold": round(layer_bytes / (us_cold * 1e3), 1),
        })  # fmt: skip
    be.set_config(TuningConfig.default("cuda"))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__)
    ap.add_argument("--contexts", default="128,512,2048,8192")
    ap.add_argument("--shapes", default="1.5b,7b")
    ap.add_argument("--variants", default=",".join(BENCH))
    ap.add_argument("--calls", type=int, default=64, help="calls per captured graph (hot)")
    ap.add_argument("--deadline", type=float, default=0.0, help="stop after S seconds")
    a = ap.parse_args(argv)
    try:
        ctxs, shapes = harness.ints(a.contexts), harness.names(a.shapes)
    except ValueError:
        msg = f"--contexts must be integers, got {a.contexts!r}"
        return harness.refuse("attn_decode_bench", msg)
    names = harness.names(a.variants)
    bad = harness.unknown(shapes, SHAPES) + harness.unknown(names, BENCH)
    if bad or not ctxs or min(ctxs) < 1 or a.calls < 1 or a.repeats < 1:
        return harness.refuse(
            "attn_decode_bench", f"unknown shape or variant {bad}, or a count below 1"
        )
    if a.list:
        return harness.list_cases({n: BASE | BENCH[n] for n in names})
    from engine.backends.cuda import CudaBackend

    be = CudaBackend()
    t0 = time.time()
    rows: list = []
    for ctx in ctxs:  # context-major: under a deadline every shape gets the first contexts
        for shape in shapes:
            if a.deadline and time.time() - t0 > a.deadline:
                print(f"deadline: {shape} ctx {ctx} and later not run", flush=True)
                break
            for r in bench_case(be, shape, ctx, names, a.calls, a.repeats):
                rows.append(r)
                if not a.json:
                    print(f"{shape:>4} ctx {ctx:>5} {r['variant']:<16} hot {r['us_hot']:7.2f} us"
                          f"  cold {r['us_cold']:7.2f} us {r['gbps_cold']:7.1f} GB/s"
                          f"  nmse {r['nmse']:.1e}", flush=True)  # fmt: skip
            harness.emit(rows, a, "attn_decode_bench.json")
    return harness.finish(rows, a, "attn_decode_bench.json")


if __name__ == "__main__":
    sys.exit(main())
