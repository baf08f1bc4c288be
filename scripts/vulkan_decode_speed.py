"""Vulkan decode speed of the int8 / fused decode variants on one model, in one process (run on
the GPU machine by /work/device-req-style scripts): tg128 after a 512-token prompt per variant
(what `engine bench --backend vulkan --no-promoted --prompt-tokens 512 --gen-tokens 128`
measures). First the GPU time per kernel, dispatches and barriers per decode token of the
--profile variants, then the benches, validate, the --sweep benches. The JSON under --out is
rewritten after every step; no step starts past --deadline, so a call that runs out of time
still returns what it measured.

usage: python scripts/vulkan_decode_speed.py MODEL.gguf [--bench a,b] [--validate a,b]
       [--profile a,b] [--sweep a,b] [--repeats N] [--deadline EPOCH_S] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.bench import bench, bench_prompt  # noqa: E402
from engine.tuning import TuningConfig  # noqa: E402
from engine.validate import tokenize_prompts, validate  # noqa: E402
from scripts.speed_record import SpeedRecord  # noqa: E402

MMVW = {"matmul_decode.variant": "mmvw"}
FUSE = {"rope.fuse_kv": 1}
MD = "matmul_decode."
VARIANTS: dict[str, dict] = {
    "default": {},
    "fuse_kv": FUSE,
    "mmvw": MMVW,
    "mmvw_fused": MMVW | FUSE,
    "fc": {"attention.fuse_combine": 1},
    "mmvw_all": MMVW | FUSE | {"attention.fuse_combine": 1},
    "mmvw_all_s16": MMVW | FUSE | {"attention.fuse_combine": 1, "attention.splits": 16},
    "mmvw_epi": MMVW | FUSE | {"attention.fuse_combine": 1, MD + "fuse_rope": 1},
    "mmvw_bytes": MMVW | FUSE | {MD + "pair_mul": False},
    "mmvw_q8blk": MMVW | FUSE | {"quantize_act.coalesced": False},
    "mmvw_u1": MMVW | FUSE | {MD + "unroll": 1},
    "mmvw_u4": MMVW | FUSE | {MD + "unroll": 4},
    "mmvw_u4_r1": MMVW | FUSE | {MD + "unroll": 4, MD + "rows_per_thread": 1},
    "mmvw_q8wg128": MMVW | FUSE | {"quantize_act.wg_size": 128},
    "mmvw_r1": MMVW | FUSE | {MD + "rows_per_thread": 1},
    "mmvw_r4_w8": MMVW | FUSE | {MD + "rows_per_thread": 4, MD + "rows_per_wg": 8},
    "mmvw_t16": MMVW | FUSE | {MD + "threads_per_row": 16},
    "mmvw_t16_w8": MMVW | FUSE | {MD + "threads_per_row": 16, MD + "rows_per_wg": 8},
    "mmvw_t8_w16": MMVW | FUSE | {MD + "threads_per_row": 8, MD + "rows_per_wg": 16,
                                  MD + "wg_size": 128},
    "mmvw_wg128_w8": MMVW | FUSE | {MD + "wg_size": 128, MD + "rows_per_wg": 8},
    "mmvw_r1_w2": MMVW | FUSE | {MD + "rows_per_thread": 1, MD + "rows_per_wg": 2},
}  # fmt: skip
# prefill on tensor cores (vkh): the resident fp16 GEMM and coopmat flash attention
RES = {"matmul_prefill.variant": "resident", "attention.variant": "coopmat"}
MP = "matmul_prefill."
VARIANTS |= {
    "res": RES,
    "res_128t": RES | {MP + "threads": 128, MP + "warp_n": 64},
    "res_n8": RES | {MP + "mma_n": 8},
    "res_512t": RES | {MP + "threads": 512, MP + "warp_m": 32, MP + "warp_n": 32},
    "res_direct": RES | {MP + "threads": 128, MP + "warp_n": 64, MP + "direct": True},
    "res_halves": RES | {MP + "smem_halves": True},
    "coopmat": {"matmul_prefill.variant": "coopmat", "attention.variant": "coopmat"},
    "res_mmvw_epi": RES | VARIANTS["mmvw_epi"],
}
# vkspd: the resident GEMM with its bounded store unrolled (accumulators kept in registers)
SU = RES | {MP + "store_unrolled": True}
VARIANTS |= {
    "res_su": SU,
    "res_su_128t": SU | {MP + "threads": 128, MP + "warp_n": 64},
    "res_su_512t": SU | {MP + "threads": 512, MP + "warp_m": 32, MP + "warp_n": 32},
    "res_su_direct": SU | {MP + "threads": 128, MP + "warp_n": 64, MP + "direct": True},
    "res_su_bk64": SU | {MP + "bk": 64, MP + "buffers": 1},
    "res_su_epi": SU | VARIANTS["mmvw_epi"],
    "coopmat_su": VARIANTS["coopmat"] | {MP + "store_unrolled": True},
}
# vkspd: the residual add in the next norm's dispatch, RoPE + KV write + q/k/v biases in one
FA = {"rms_norm.fuse_add": 1, "rope.fuse_kv": 1, "rope.fuse_bias": 1}
VARIANTS |= {"fa": FA, "res_su_fa": SU | FA, "res_su_epi_fa": VARIANTS["res_su_epi"] | FA}
# ... and the prefill submitted in pieces as it is recorded (the GPU starts before Python ends)
K64 = {"submit.prefill_kick": 64}
VARIANTS |= {"fa_k64": FA | K64, "res_su_fa_k64": SU | FA | K64,
             "res_su_epi_fa_k64": VARIANTS["res_su_epi_fa"] | K64,
             # int8 decode without fuse_combine (its fused split attention: 30 us a layer
             # against 13 + 9 for split + merge at the vkspd checkpoint)
             "res_su_int8_fa_k64": SU | MMVW | FA | K64 | {MD + "fuse_rope": 1}}  # fmt: skip
# vk (issue 14): attention.flash's prefill pass (64 queries a workgroup, output in registers)
FL = {"attention.variant": "flash"}
VARIANTS |= {"res_su_fa_k64_fl": VARIANTS["res_su_fa_k64"] | FL,
             "res_su_int8_fa_k64_fl": VARIANTS["res_su_int8_fa_k64"] | FL,
             # ... and the GEMM's tile loads two k-steps ahead
             "res_su_int8_fa_k64_fl_pf2": VARIANTS["res_su_int8_fa_k64"] | FL
             | {MP + "prefetch": 2},
             # ... and the small grids (7B q/o/down) split over 3 k-ranges, not 64 x 64 tiles
             "res_su_int8_fa_k64_fl_pf2_sk3": VARIANTS["res_su_int8_fa_k64"] | FL
             | {MP + "prefetch": 2, MP + "split_k": 3}}  # fmt: skip
# after the vk checkpoint (prefetch 2 is the default now): flash's rescale as one matrix
# multiply (its loop had 256 B of local memory), the 7B k/v grids split over 4 k-ranges
MS = {"attention.matrix_scale": True}
VARIANTS |= {"res_su_int8_fa_k64_fl_ms": VARIANTS["res_su_int8_fa_k64_fl"] | MS,
             "res_su_int8_fa_k64_fl_sk4": VARIANTS["res_su_int8_fa_k64_fl"] | {MP + "split_k": 4},
             "res_su_int8_fa_k64_fl_ms_sk4": VARIANTS["res_su_int8_fa_k64_fl"] | MS
             | {MP + "split_k": 4}}  # fmt: skip
# vk (issue 14, early8: fill_groups 64 ran the 7B q/o 136 -> 82 us, down 760 -> 467 us in the
# GEMM bench): q/o/down on the 128 x 128 tiles (fill_groups 32: the 1.5B's 48 workgroups too),
# k/v on 64 x 64; split_k per shape (split_groups): grids of at most half of it split into
# split_groups // grid ranges (1.5B q/o/down 48 -> 2 x 48, k/v 32 -> 4 x 32; 7B k/v 64 -> 2 x 64)
BEST = VARIANTS["res_su_int8_fa_k64_fl_ms"]
F32 = BEST | {MP + "fill_groups": 32}
SG = {MP + "split_k": 4, MP + "split_groups": 128}
VARIANTS |= {"fl_ms_f64": BEST | {MP + "fill_groups": 64}, "fl_ms_f32": F32,
             "fl_ms_f32_sg128": F32 | SG, "fl_ms_f32_sg256": F32 | SG | {MP + "split_groups": 256},
             "fl_ms_f32_sg128_k32": F32 | SG | {"submit.prefill_kick": 32}}  # fmt: skip
# ... and flash attention's keys over ranges of key_chunk (the 1.5B: 96 workgroups, the last
# query tile's 16 key blocks in a row, 88 us a layer)
KC = "attention.key_chunk"
VARIANTS |= {"fl_ms_kc128": BEST | {KC: 128}, "fl_ms_f32_sg128_kc128": F32 | SG | {KC: 128},
             "fl_ms_f32_sg128_kc64": F32 | SG | {KC: 64},
             "fl_ms_f32_sg128_kc256": F32 | SG | {KC: 256}}  # fmt: skip
# ... and the prefill's pieces queued behind the one in flight (submit.prefill_ahead: the GPU
# idled between the 1.5B's 8 pieces, wall 22.9 ms over 20.8 of kernels)
AH = {"submit.prefill_ahead": True, "submit.prefill_kick": 32}
VARIANTS |= {"fl_ms_ah32": BEST | AH, "fl_ms_f32_sg128_kc128_ah32": F32 | SG | {KC: 128} | AH,
             "fl_ms_f32_sg128_kc128_ah16": F32 | SG | {KC: 128} | AH
             | {"submit.prefill_kick": 16}}  # fmt: skip
# ... and the add + norm and SwiGLU store the next GEMMs' fp16 input (no x16 dispatches)
X16 = {MP + "fuse_x16": 1}
VARIANTS |= {"fl_ms_x16": BEST | X16, "fl_ms_f32_sg128_kc128_x16": F32 | SG | {KC: 128} | X16,
             "fl_ms_f32_sg128_kc128_ah32_x16": F32 | SG | {KC: 128} | AH | X16}  # fmt: skip
# The best measured (helper vk's checkpoint, H200, 7B pp512, scripts/vulkan_profile.py): the
# resident GEMM per shape (fill_groups 32, split_groups 128, split_k 4, set here explicitly),
# flash attention without key ranges (they cost the 7B 148 + 21 us a layer against 135), the
# pieces queued ahead, the fp16 GEMM input from the norm and SwiGLU: 7,501 -> ~9,300 tok/s
# (fl_ms_f32_sg128_kc128_ah32_x16, with key ranges, 9,308). The 1.5B is unmeasured with them.
VARIANTS |= {"fl_ms_f32_sg128_ah32": F32 | SG | AH, "fl_ms_f32_sg128_ah32_x16": F32 | SG | AH | X16,
             "fl_ms_f32_sg128_kc128_ah32_x16_k16": F32 | SG | {KC: 128} | AH | X16
             | {"submit.prefill_kick": 16}}  # fmt: skip
VARIANTS["best"] = VARIANTS["fl_ms_f32_sg128_ah32_x16"]
# the float32 tiled GEMM (the device-free default) with vec4 register blocks of 8 x 8
VARIANTS |= {"tv128_fa": FA | {MP + "vec4": True, MP + "tile_m": 128, MP + "tile_n": 128}}


def config(name: str) -> TuningConfig:
    return TuningConfig.from_flat("vulkan", VARIANTS[name])


def decode_profile(eng, n_prompt: int = 512, steps: int = 8) -> dict:  # noqa: ANN001
    """GPU ms per kernel per decode token (timestamps), dispatches and barriers per token."""
    m, be = eng.model, eng.model.backend
    cache = m.new_cache(n_prompt + steps + 1)
    m.prefill(bench_prompt(n_prompt, m.spec.n_vocab), cache)
    tok = be.upload(np.array([1], np.int32))
    be.set_profiling(True)
    be.profile(reset=True)
    s0 = be.stats()
    for i in range(steps):
        tok = be.argmax(m.forward(tok, 1, n_prompt + i, cache))
    be.synchronize()
    s1 = be.stats()
    rep = be.profile(reset=True)
    be.set_profiling(False)
    ms = {k: t.total_ms / steps for k, t in rep.kernels.items()}
    return {
        "dispatches_per_token": (s1["dispatches"] - s0["dispatches"]) / steps,
        "barriers_per_token": (s1["barriers"] - s0["barriers"]) / steps,
        "kernel_ms_per_token": sum(ms.values()),
        "ms_per_token": dict(sorted(ms.items(), key=lambda kv: -kv[1])),
        "calls_per_token": {k: t.calls / steps for k, t in rep.kernels.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--bench", default="default,mmvw,mmvw_fused")
    ap.add_argument("--validate", default="mmvw_fused")
    ap.add_argument("--profile", default="default,mmvw_fused")
    ap.add_argument("--sweep", default="", help="more benches, after the profiles")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--json", action="store_true", help="print the result JSON at the end")
    args = ap.parse_args()
    lists = {k: [v for v in getattr(args, k).split(",") if v] for k in VALID_LISTS}
    bad = sorted({v for vs in lists.values() for v in vs} - set(VARIANTS))
    if bad:
        print(f"unknown variant(s) {', '.join(bad)}; known: {', '.join(VARIANTS)}")
        return 2
    name = Path(args.model).stem
    out = Path(args.out) / f"vkdecode_{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    variants = {k: VARIANTS[k] for vs in lists.values() for k in vs}
    rec = SpeedRecord(args.model, out, variants, args.deadline)
    res = rec.res

    eng = rec.load("vulkan")
    be = eng.model.backend

    def run_bench(v: str) -> None:
        def body(v: str) -> None:
            be.set_config(config(v))
            r = bench(eng.model, [args.prompt], 128, args.repeats, 1).results[0]
            res["bench"][v] = {
                "pp": r.prefill_tok_s.median,
                "tg128": r.decode_tok_s.median if r.decode_tok_s else None,
                "tg128_range": [r.decode_tok_s.min, r.decode_tok_s.max] if r.decode_tok_s else None,
            }
            print(f"{name} bench {v:14s} pp{args.prompt} {r.prefill_tok_s.median:9.1f}  tg128 "
                  f"{res['bench'][v]['tg128'] or 0:7.1f} tok/s", flush=True)  # fmt: skip

        rec.step("bench", v, body)

    for v in lists["profile"]:

        def body(v: str) -> None:
            be.set_config(config(v))
            p = decode_profile(eng)
            res["profile"][v] = p
            top = ", ".join(f"{k}={t:.3f}" for k, t in list(p["ms_per_token"].items())[:8])
            print(f"{name} profile {v:14s} {p['dispatches_per_token']:.0f} dispatches "
                  f"{p['barriers_per_token']:.0f} barriers/token, kernels "
                  f"{p['kernel_ms_per_token']:.3f} ms/token: {top}", flush=True)  # fmt: skip

        rec.step("profile", v, body)
    for v in lists["bench"]:
        run_bench(v)
    prompts = tokenize_prompts(eng.tokenizer())
    ref_cache: dict = {}
    for v in lists["validate"]:

        def body(v: str) -> None:
            rep = validate(eng.model, config(v), prompts, steps=8, ref_cache=ref_cache)
            res["validate"][v] = rep.to_dict()
            print(f"{name} validate {v:14s} {'PASS' if rep.passed else 'FAIL'}  "
                  f"KLD={rep.kld_max:.3g} nmse={rep.nmse:.3g} classes {rep.numeric_classes} "
                  f"blame {rep.blame} {rep.reasons[:2]}", flush=True)  # fmt: skip

        rec.step("validate", v, body)

    for v in lists["sweep"]:
        run_bench(v)
    if args.json:
        print(json.dumps(res, default=str))
    return 0


VALID_LISTS = ("bench", "validate", "profile", "sweep")

if __name__ == "__main__":
    raise SystemExit(main())
