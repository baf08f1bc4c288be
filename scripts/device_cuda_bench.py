"""CUDA backend figures on the GPU machine (run by scripts/device_cuda.sh): card ceilings,
validate, pp512/tg128 per prefill variant, the chunk_tokens x variant sweep, per-kernel time and
the roofline position. Writes one JSON per model under $OUT and prints a short table.

usage: python scripts/device_cuda_bench.py MODEL.gguf [--sweep] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import backends  # noqa: E402
from engine.bench import bench, bench_prompt  # noqa: E402
from engine.gguf_model import open_model  # noqa: E402
from engine.model import Model  # noqa: E402
from engine.models import build_model
from engine.tuning import TuningConfig  # noqa: E402
from engine.validate import validate  # noqa: E402


def ceilings(cp) -> dict:
    """Device-to-device copy (bytes read + written) and an fp16 GEMM through cuBLAS."""
    n = 1 << 30
    a, b = cp.empty(n, cp.uint8), cp.empty(n, cp.uint8)
    a.fill(1)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    for _ in range(8):
        e0.record()
        b[...] = a
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
    copy = 2 * n / statistics.median(ts[2:])
    m = 8192
    x = cp.random.standard_normal((m, m), dtype=cp.float32).astype(cp.float16)
    y = cp.random.standard_normal((m, m), dtype=cp.float32).astype(cp.float16)
    ts = []
    for _ in range(8):
        e0.record()
        cp.matmul(x, y)
        e1.record()
        e1.synchronize()
        ts.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
    out = {"copy_bytes_s": copy, "fp16_gemm_flop_s": 2 * m**3 / statistics.median(ts[2:])}
    del a, b, x, y
    cp.get_default_memory_pool().free_all_blocks()
    return out


def flat_cfg(**kw) -> TuningConfig:
    return TuningConfig.from_flat("cuda", kw)


VARIANTS = {
    "default": {},
    "staged": {"matmul_prefill.variant": "staged"},
    "mmq": {"matmul_prefill.variant": "mmq"},
    "mmq_64x128": {"matmul_prefill.variant": "mmq", "matmul_prefill.tile_m": 64},
    "dmmv_kpar": {"prefill.gemm_min_t": 1 << 20, "prefill.chunk_tokens": 64,
                  "matmul_batched.max_cols": 64},
    "mmvq": {"matmul_decode.variant": "mmvq"},
    "mmq8": {"matmul_decode.variant": "mmvq", "matmul_prefill.variant": "mmq8"},
    "mmq8_64x128": {"matmul_decode.variant": "mmvq", "matmul_prefill.variant": "mmq8",
                    "matmul_prefill.tile_m": 64},
    "mmq8_128x64_4x2": {"matmul_decode.variant": "mmvq", "matmul_prefill.variant": "mmq8",
                        "matmul_prefill.tile_n": 64, "matmul_prefill.warps_m": 4,
                        "matmul_prefill.warps_n": 2},
    "mmvq_w4_r2": {"matmul_decode.variant": "mmvq", "matmul_decode.rows_per_block": 2},
    "mmvq_w8_r1": {"matmul_decode.variant": "mmvq", "matmul_decode.warps": 8},
    "mmvq_w2_r2": {"matmul_decode.variant": "mmvq", "matmul_decode.warps": 2,
                   "matmul_decode.rows_per_block": 2},
    "mmvq_w1_r4": {"matmul_decode.variant": "mmvq", "matmul_decode.warps": 1,
                   "matmul_decode.rows_per_block": 4},
    "dec_rpt1": {"matmul_decode.variant": "dmmv", "matmul_decode.rows_per_thread": 1},
    "dec_rpt4": {"matmul_decode.variant": "dmmv", "matmul_decode.rows_per_thread": 4},
    "dec_rpt2_t16_v4": {"matmul_decode.variant": "dmmv", "matmul_decode.threads_per_row": 16,
                        "matmul_decode.vec": 4},
    "dec_rpt4_t8_v4": {"matmul_decode.variant": "dmmv", "matmul_decode.rows_per_thread": 4,
                       "matmul_decode.threads_per_row": 8, "matmul_decode.vec": 4,
                       "matmul_decode.rows_per_block": 16},
    "nograph": {},
}  # fmt: skip


def model_costs(m: Model) -> dict:
    """Weight bytes read per decode token and matmul FLOP per prompt token."""
    s = m.spec
    dec_bytes, flop_tok = 0, 0
    for name, w in m.weights.items():
        if w.raw is None or name == "token_embd.weight" and not s.tied_embeddings:
            continue
        dec_bytes += w.nbytes
        if w is not m.lm_head:
            flop_tok += 2 * w.n * w.k
    return {"decode_weight_bytes": dec_bytes, "prefill_matmul_flop_per_token": flop_tok}


def profile(m: Model, be, n_prompt: int) -> dict:
    prompt = bench_prompt(n_prompt, m.spec.n_vocab)
    cache = m.new_cache(n_prompt + 16)
    be.set_profiling(True)
    m.prefill(prompt, cache)
    pre = be.profile(reset=True)
    tok = be.upload(np.array([1], np.int32))
    for i in range(8):
        lg = m.forward(tok, 1, n_prompt + i, cache)
        tok = be.argmax(lg)
    dec = be.profile(reset=True)
    be.set_profiling(False)

    def summ(p, div: int) -> dict:  # noqa: ANN001 - engine.device_info.ProfileReport
        return {k: t.total_ms / div for k, t in p.kernels.items()}  # slowest first

    return {"prefill_ms": summ(pre, 1), "decode_ms_per_token": summ(dec, 8)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma list to bench")
    ap.add_argument("--validate", default="default,staged,mmq,mmvq,mmq8,dmmv_kpar",
                    help="comma list to validate")  # fmt: skip
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    import cupy as cp

    res: dict = {"model": args.model, "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    t0 = time.time()
    be = backends.create("cuda")
    res["device"] = be.device_info().to_dict()
    g = open_model(args.model)
    m = build_model(g, be)
    be.synchronize()
    res["load_s"] = time.time() - t0
    res["file_bytes"] = g.file_bytes
    res["weight_bytes_on_gpu"] = sum(w.nbytes for w in m.weights.values())
    res.update(model_costs(m))
    name = Path(args.model).stem
    print(f"== {name}: loaded in {res['load_s']:.1f}s, weights on GPU "
          f"{res['weight_bytes_on_gpu'] / 2**30:.2f} GiB, file {g.file_bytes / 2**30:.2f} GiB",
          flush=True)  # fmt: skip
    try:
        res["ceilings"] = ceilings(cp)
        print("ceilings", res["ceilings"], flush=True)
    except Exception as e:  # noqa: BLE001
        res["ceilings_error"] = repr(e)

    prompts = [bench_prompt(n, m.spec.n_vocab, seed=7) for n in (5, 100, 1)]
    res["validate"] = {}
    for v in [v for v in args.validate.split(",") if v]:
        try:
            rep = validate(m, flat_cfg(**VARIANTS[v]), prompts, steps=8)
            res["validate"][v] = {"passed": rep.passed, "max_abs_diff": rep.max_abs_diff,
                                  "nmse": rep.nmse,
                                  "reasons": [p.reasons for p in rep.prompts]}  # fmt: skip
            print(f"validate {v}: {'PASS' if rep.passed else 'FAIL'} "
                  f"mad={rep.max_abs_diff:.3g} nmse={rep.nmse:.3g}", flush=True)  # fmt: skip
        except Exception as e:  # noqa: BLE001
            res["validate"][v] = {"error": traceback.format_exc()}
            print(f"validate {v}: ERROR {e!r}", flush=True)

    res["bench"] = {}
    for v in [v for v in args.variants.split(",") if v]:
        flat = VARIANTS[v]
        try:
            be.set_config(flat_cfg(**flat))
            be.use_graphs = v != "nograph"
            pool = cp.get_default_memory_pool()
            pool.free_all_blocks()
            rep = bench(m, [512], gen_tokens=128, repeats=args.repeats, warmup=1)
            be.use_graphs = True
            r = rep.results[0]
            res["bench"][v] = {
                "pp512": r.prefill_tok_s.median,
                "pp512_range": [r.prefill_tok_s.min, r.prefill_tok_s.max],
                "tg128": r.decode_tok_s.median if r.decode_tok_s else None,
                "tg128_range": [r.decode_tok_s.min, r.decode_tok_s.max] if r.decode_tok_s else None,
                "pool_peak_bytes": pool.total_bytes(),
            }
            print(f"bench {v:12s} pp512 {r.prefill_tok_s.median:9.1f} tok/s  "
                  f"tg128 {res['bench'][v]['tg128'] or 0:7.1f} tok/s", flush=True)  # fmt: skip
        except Exception as e:  # noqa: BLE001
            res["bench"][v] = {"error": traceback.format_exc()}
            print(f"bench {v}: ERROR {e!r}", flush=True)

    try:
        if args.no_profile:
            raise RuntimeError("profile skipped (--no-profile)")
        be.set_config(flat_cfg())
        res["profile"] = profile(m, be, 512)
        for k in ("prefill_ms", "decode_ms_per_token"):
            top = list(res["profile"][k].items())[:6]
            print(k, ", ".join(f"{a}={b:.3f}" for a, b in top), flush=True)
    except Exception as e:  # noqa: BLE001
        res["profile_error"] = traceback.format_exc()
        print("profile ERROR", repr(e), flush=True)

    out = Path(args.out) / f"bench_{name}.json"
    out.write_text(json.dumps(res, indent=1, default=str))
    if args.sweep:
        res["sweep"] = []
        grid = [("staged", mc) for mc in (64, 128, 256, 512)]
        grid += [("mmq", mc) for mc in (64, 128, 256, 512)]
        grid += [("mmq8", mc) for mc in (64, 128, 256, 512)]
        grid += [("dmmv_kpar", mc) for mc in (16, 32, 40, 64)]
        if m.spec.n_embd < 2048:  # serial-over-K is ~100x slower: the small model only
            grid += [("dmmv_serial", mc) for mc in (16, 32)]
        for v, mc in grid:
            flat = {"prefill.chunk_tokens": mc}
            if v in ("staged", "mmq", "mmq8"):
                flat |= {"matmul_prefill.variant": v, "prefill.gemm_min_t": 2}
            else:
                flat |= {"prefill.gemm_min_t": 1 << 20, "matmul_batched.max_cols": min(mc, 64),
                         "matmul_batched.variant": v}  # fmt: skip
            try:
                be.set_config(flat_cfg(**flat))
                rep = bench(m, [512], gen_tokens=1, repeats=2, warmup=1)
                tps = rep.results[0].prefill_tok_s.median
                res["sweep"].append({"variant": v, "chunk_tokens": mc, "pp512": tps})
                print(f"sweep {v:12s} chunk_tokens={mc:4d} pp512 {tps:9.1f}", flush=True)
            except Exception as e:  # noqa: BLE001
                res["sweep"].append({"variant": v, "chunk_tokens": mc, "error": repr(e)})
                print(f"sweep {v} {mc}: ERROR {e!r}", flush=True)
    out = Path(args.out) / f"bench_{name}.json"
    out.write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
