"""Hybrid models on the GPU in one process (run by scripts/device_hybrid_bench.sh and the
helper's device request): load a model once, then per variant of VARIANTS `engine bench`'s
pp/tg figures, `engine validate`'s verdict (optional: a NumPy reference of a 9B costs minutes),
and the per-phase profile of scripts/profile_hybrid.py. The JSON (--out/hybrid_<model><tag>.json) is
rewritten after every step, and no step starts past --deadline (epoch seconds).

usage: python scripts/device_hybrid_bench.py MODEL.gguf [--bench a,b] [--validate a,b]
       [--reference v] [--profile a,b] [--prompt 512] [--gen 128] [--repeats N] [--deadline S]
       [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from profile_hybrid import phase_profile  # noqa: E402

from engine.bench import bench  # noqa: E402
from engine.tuning import TuningConfig  # noqa: E402
from engine.validate import tokenize_prompts, validate  # noqa: E402
from scripts.speed_record import SpeedRecord  # noqa: E402

MMVW = {"matmul_decode.variant": "mmvw"}
HDEC = {"delta_net.fuse_conv": 1, "delta_net.fuse_ba": 1, "moe_experts.fuse_norm": 1}
RV_TK = {"moe_experts.route_vec": 1, "moe_experts.topk_regs": 1}
MOE6 = {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1, "moe_experts.down_split": 1,
        "moe_experts.gate_up_pair": 1, "moe_experts.fuse_pre_norm": 1}  # fmt: skip
RB_PRE = {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,  # rb_tk_split_pre
          "moe_experts.down_split": 1, "moe_experts.fuse_pre_norm": 1}  # fmt: skip
M35 = {"moe_experts.dec_wide": 1, "moe_experts.l2_prefetch": 1}
M35B = {"moe_experts.dec_wide": 2, "moe_experts.l2_prefetch": 1, "moe_experts.dec_fcvt": 1}
VARIANTS: dict[str, dict] = {
    "default": {},
    # the default before the sixth session's flip (hdec_all_rv_ws's knobs off)
    "pre6": {"delta_net.fuse_conv": 0, "moe_experts.fuse_norm": 0, "moe_experts.route_vec": 0,
             "moe_experts.down_wsum": 0, "moe_experts.topk_regs": 0},
    "notk": {"moe_experts.topk_regs": 0},  # the default but the route's top-k from L2
    "dmmv": {"matmul_decode.variant": "dmmv"},  # the float default before mmvf (issue 14)
    "mmvf_t32": {"matmul_decode.threads_per_row": 32},  # mmvf (the default) knobs
    "mmvf_r4": {"matmul_decode.rows_per_thread": 4},
    "mmvf_u4": {"matmul_decode.unroll": 4},
    "mmvq": {"matmul_decode.variant": "mmvq"},
    "mmvw": MMVW,  # projections three to a launch, residuals added as they store
    "mmvw_pdl": MMVW | {"matmul_decode.pdl": 1},
    "mmvw_fssm": MMVW | {"matmul_decode.float_ssm_in": 1},  # delta-net in-projections float
    "mmvw_t16_r2": MMVW | {"matmul_decode.pdl": 1, "matmul_decode.threads_per_row": 16,
                           "matmul_decode.rows_per_thread": 2},
    "chunked": {"delta_net.variant": "chunked"},
    "scan_pf4": {"delta_net.prefetch": 4},  # the sequential scan with 4 tokens in flight
    "scan_pf8": {"delta_net.prefetch": 8},
    "chunked32": {"delta_net.variant": "chunked", "delta_net.chunk": 32},
    "grouped": {"moe_experts.variant": "grouped"},
    "moe_q8": {"moe_experts.variant": "mmvq"},  # int8 experts (gate + up + SwiGLU fused)
    "moe_tc": {"moe_experts.variant": "tc"},  # fp16 tensor-core experts at prefill (moe_tc.cu)
    "moe_dmmv": {"moe_experts.variant": "dmmv"},  # the per-pair DMMV at prefill (default before tc)
    "moe_tc_wide": {"moe_experts.variant": "tc", "moe_experts.wide_loads": 1},  # 16-byte decodes
    "moe_tc_wide_win": {"moe_experts.variant": "tc", "moe_experts.wide_loads": 1,
                        "moe_experts.q4k_window": 1},
    "moe_tc_direct": {"moe_experts.variant": "tc", "moe_experts.wide_loads": 1,
                      "moe_experts.direct": 1},  # Q4_K experts straight into mma fragments
    # the MoE FFN op by op at decode (sixteen launches a layer; the default fuses it in three)
    "moe_unfused": {"moe_experts.fuse_decode": 0},
    # the delta-net decode op by op (conv + state, gates, scan, norm, gate: five launches a
    # layer; the default runs ssm_conv_step and dn_step.cu's delta_net_step)
    "dn_unfused": {"delta_net.fuse_decode": 0, "ssm_conv.fuse_step": 0},
    "unfused": {"moe_experts.fuse_decode": 0, "delta_net.fuse_decode": 0,
                "ssm_conv.fuse_step": 0, "rope_partial.fuse_qk": 0},  # decode before moedec
    "qk_unfused": {"rope_partial.fuse_qk": 0},  # attention layers' q/k norms, RoPE, KV apart
    # the fused MoE decode kernels (moe_dec.cu) with other moe_experts.dmmv launch shapes
    "moe_t16": {"moe_experts.threads_per_row": 16, "moe_experts.rows_per_block": 8},
    "moe_t64": {"moe_experts.threads_per_row": 64, "moe_experts.rows_per_block": 2,
                "moe_experts.vec": 1},
    "moe_rv": {"moe_experts.route_vec": 1},  # the fused route's float4 router rows
    "moe_dv1": {"moe_experts.down_vec1": 1},  # the fused down kernel, every lane on short rows
    # helper hdec: the delta-net decode from the raw projection row in one launch (conv
    # folded in: no ssm_conv_step, no column copies), beta / alpha stacked into one mmvf launch
    "dn_fconv": {"delta_net.fuse_conv": 1},
    "dn_fba": {"delta_net.fuse_ba": 1},  # (the default since the hdec call: 213.6 -> 222.2)
    "dn_nofba": {"delta_net.fuse_ba": 0},
    "dn_fused": {"delta_net.fuse_conv": 1, "delta_net.fuse_ba": 1},
    # and the MoE down kernel ending in the next layer's input norm; with the float4 router
    # rows and the down kernel's one-group-per-lane walk
    "hdec_all": HDEC,
    "hdec_w8": HDEC | {"delta_net.warps": 8},  # the fused step's blocks: 8 state columns
    "hdec_w2": HDEC | {"delta_net.warps": 2},
    "hdec_am": HDEC | {"argmax.variant": "multi"},  # (dense decode's: 98 us a token at 248k)
    "hdec_all_rv": HDEC | {"moe_experts.route_vec": 1},
    "hdec_all_rv_dv1": HDEC | {"moe_experts.route_vec": 1, "moe_experts.down_vec1": 1},
    # the MoE down kernel as one weighted sum per lane (no per-expert reductions, no spills)
    "hdec_all_rv_ws": HDEC | {"moe_experts.route_vec": 1, "moe_experts.down_wsum": 1},
    "hdec_all_rv_ws_t16": HDEC | {"moe_experts.route_vec": 1, "moe_experts.down_wsum": 1,
                                  "moe_experts.threads_per_row": 16,
                                  "moe_experts.rows_per_block": 8},
    # helper moedec (sixth session): the route's top-k from registers (topk_regs), the down
    # kernel with a warp per expert slot (down_split), programmatic dependent launch
    "hdec_rv_tk_ws": HDEC | RV_TK | {"moe_experts.down_wsum": 1},
    "hdec_rv_tk_split": HDEC | RV_TK | {"moe_experts.down_split": 1},
    "hdec_rv_tk_split_r8": HDEC | RV_TK | {"moe_experts.down_split": 1,
                                           "moe_experts.rows_per_block": 8},
    "hdec_rv_tk_split_t64": HDEC | RV_TK | {"moe_experts.down_split": 1,
                                            "moe_experts.threads_per_row": 64,
                                            "moe_experts.vec": 1},
    "hdec_rb_tk_split": HDEC | {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                                "moe_experts.down_split": 1},
    "hdec_rb_tk_split_t64": HDEC | {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                                    "moe_experts.down_split": 1,
                                    "moe_experts.threads_per_row": 64},
    "hdec_rb_tk_split_pdl": HDEC | {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                                    "moe_experts.down_split": 1, "matmul_decode.pdl": 1},
    # and the post-attention norm folded into the route (fuse_pre_norm)
    "rb_tk_split_pre": {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                        "moe_experts.down_split": 1, "moe_experts.fuse_pre_norm": 1},
    "rb_tk_ws_pre": {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                     "moe_experts.fuse_pre_norm": 1},
    "rb_tk_split_pre_pdl": {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                            "moe_experts.down_split": 1, "moe_experts.fuse_pre_norm": 1,
                            "matmul_decode.pdl": 1},
    # helper dn (seventh session): the delta-net decode step as a thread-block cluster per K
    # head (dn_clu.cu: delta_net.step_cluster blocks per V head, step_lanes lanes a column)
    "dn_c4": RB_PRE | {"delta_net.step_cluster": 4, "delta_net.step_lanes": 8},
    "dn_c2": RB_PRE | {"delta_net.step_cluster": 2, "delta_net.step_lanes": 8},
    "dn_c4_l16": RB_PRE | {"delta_net.step_cluster": 4, "delta_net.step_lanes": 16},
    "dn_c4_pdl": RB_PRE | {"delta_net.step_cluster": 4, "delta_net.step_lanes": 8,
                           "matmul_decode.pdl": 1},
    # the default + the cluster step alone (the 9B dense hybrid: no MoE knobs)
    "dn_c4_alone": {"delta_net.step_cluster": 4, "delta_net.step_lanes": 8},
    "dn_c2_alone": {"delta_net.step_cluster": 2, "delta_net.step_lanes": 8},
    "tk": {"moe_experts.topk_regs": 1},  # the default + the register top-k alone
    # everything of the sixth session: block route + register top-k + the norm folded in,
    # paired gate / up, a warp per expert slot in down; gate_up at 64 lanes a row; with PDL
    "moe6": MOE6,
    "moe6_t64": MOE6 | {"moe_experts.threads_per_row": 64},
    "moe6_pdl": MOE6 | {"matmul_decode.pdl": 1},
    "moe6_t64_pdl": MOE6 | {"moe_experts.threads_per_row": 64, "matmul_decode.pdl": 1},
    "hdec_all_rv_ws_pdl": HDEC | {"moe_experts.route_vec": 1, "moe_experts.down_wsum": 1,
                                  "matmul_decode.pdl": 1},
    "hdec_rv_tk_split_pdl": HDEC | RV_TK | {"moe_experts.down_split": 1,
                                            "matmul_decode.pdl": 1},
    # helper moe35 (seventh session): rb_tk_split_pre with Q4_K / Q6_K groups from 16-byte
    # loads (dec_wide), gate_up prefetching the down matrices into L2 (l2_prefetch), the split
    # down built for 3 blocks an SM (split_occupancy 3); with paired gate / up; with PDL
    "moe35_w": RB_PRE | {"moe_experts.dec_wide": 1},
    "moe35_wpf": RB_PRE | M35,
    "moe35": RB_PRE | M35 | {"moe_experts.split_occupancy": 3},
    "moe35_gp": RB_PRE | M35 | {"moe_experts.split_occupancy": 3, "moe_experts.gate_up_pair": 1},
    "moe35_pdl": RB_PRE | M35 | {"moe_experts.split_occupancy": 3, "matmul_decode.pdl": 1},
    # after moe35's checkpoint (dec_wide 1 slowed gate_up and sped the down; split_occupancy 3
    # slowed the down; l2_prefetch won alone): the wide groups in the down kernels only,
    # gate_up's prefetch, bytes to floats without I2F (dec_fcvt); the experiment's first start
    "moe35_w2pf": RB_PRE | {"moe_experts.dec_wide": 2, "moe_experts.l2_prefetch": 1},
    "moe35_best": RB_PRE | M35B,
    # the eighth session's hybrid-35b first start, benched beside the fleet (rb_tk_split_pre's
    # topk_regs included here)
    "dn_c4_moe35": RB_PRE | M35B | {"delta_net.step_cluster": 4, "delta_net.step_lanes": 8},
    "moe35_best_gp": RB_PRE | M35B | {"moe_experts.gate_up_pair": 1},
    "moe35_o2": RB_PRE | M35 | {"moe_experts.split_occupancy": 2},  # 8 outputs a block, one wave
    "moe35_o2_gp": RB_PRE | M35 | {"moe_experts.split_occupancy": 2, "moe_experts.gate_up_pair": 1},
    "mmq8": {"matmul_prefill.variant": "mmq8"},
    # on the H200 (9B tg64) mmvw alone 267, mmvw + PDL + chunked + argmax.multi 248: PDL and
    # argmax.multi stay out of fast until measured apart (mmvw_pdl)
    # experts: tc (the default since the moepf run: 1.07 ms a 35b-a3b layer, grouped 11.7)
    "fast": MMVW | {"delta_net.prefetch": 4, "moe_experts.variant": "tc",
                    "ssm_conv.fuse_step": 1},
    "fast_q8": MMVW | {"delta_net.prefetch": 4, "moe_experts.variant": "mmvq",
                       "ssm_conv.fuse_step": 1},
    "fast_pdl": MMVW | {"delta_net.prefetch": 4, "moe_experts.variant": "tc",
                        "ssm_conv.fuse_step": 1, "matmul_decode.pdl": 1,
                        "argmax.variant": "multi"},
}  # fmt: skip


def config(name: str, backend: str = "cuda") -> TuningConfig:
    return TuningConfig.from_flat(backend, VARIANTS[name])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--bench", default="default,mmvw,mmvw_pdl,chunked,fast")
    ap.add_argument("--validate", default="")
    ap.add_argument(
        "--reference",
        default="default",
        help="the variant validate compares against (e.g. mmvq: do two int8 kernels agree "
        "where both differ from the float default?)",
    )
    ap.add_argument("--profile", default="default,fast")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--tag", default="", help="suffix of the JSON's name (hybrid_<model><tag>)")
    args = ap.parse_args()
    lists = {k: [v for v in getattr(args, k).split(",") if v] for k in ("bench", "validate")}
    lists["reference"] = [args.reference]
    lists["profile"] = [v for v in args.profile.split(",") if v]
    bad = sorted({v for vs in lists.values() for v in vs} - set(VARIANTS))
    if bad:
        print(f"unknown variant(s) {', '.join(bad)}; known: {', '.join(VARIANTS)}")
        return 2
    if not Path(args.model).is_file():
        print(f"error: {args.model}: no such file")
        return 2
    name = Path(args.model).stem
    out = Path(args.out) / f"hybrid_{name}{args.tag}.json"
    variants = {k: VARIANTS[k] for vs in lists.values() for k in vs}
    rec = SpeedRecord(args.model, out, variants, args.deadline)
    res = rec.res

    eng = rec.load(args.backend, memory=True)
    be = eng.model.backend

    for v in lists["bench"]:

        def body(v: str) -> None:
            be.set_config(config(v, args.backend))
            r = bench(eng.model, [args.prompt], args.gen, args.repeats, 1).results[0]
            res["bench"][v] = {
                f"pp{args.prompt}": r.prefill_tok_s.median,
                f"tg{args.gen}": r.decode_tok_s.median if r.decode_tok_s else None,
                "pp_range": [r.prefill_tok_s.min, r.prefill_tok_s.max],
                "tg_range": [r.decode_tok_s.min, r.decode_tok_s.max] if r.decode_tok_s else None,
            }
            tg = res["bench"][v][f"tg{args.gen}"] or 0
            print(f"{name} bench {v:12s} pp{args.prompt} {r.prefill_tok_s.median:9.1f}  "
                  f"tg{args.gen} {tg:7.1f} tok/s", flush=True)  # fmt: skip

        rec.step("bench", v, body)

    for v in lists["profile"]:

        def body(v: str) -> None:
            be.set_config(config(v, args.backend))
            p = phase_profile(eng.model, args.prompt, 8)
            res["profile"][v] = p
            for what in ("prefill_ms", "decode_ms_per_token"):
                row = ", ".join(f"{k}={t:.3f}" for k, t in sorted(p[what].items()))
                print(f"{name} profile {v} {what}: {row}", flush=True)

        rec.step("profile", v, body)

    prompts = tokenize_prompts(eng.tokenizer())
    ref_cache: dict = {}
    for v in lists["validate"]:

        def body(v: str) -> None:
            t1 = time.time()
            ref = config(args.reference, args.backend)
            rep = validate(
                eng.model, config(v, args.backend), prompts, 4, reference=ref, ref_cache=ref_cache
            )
            key = v if args.reference == "default" else f"{v}_vs_{args.reference}"
            res["validate"][key] = rep.to_dict() | {"seconds": time.time() - t1}
            verdict = "PASS" if rep.passed else "FAIL"
            print(f"{name} validate {key:12s} {verdict} KLD={rep.kld_max:.3g} "
                  f"nmse={rep.nmse:.3g} blame {rep.blame}", flush=True)  # fmt: skip

        rec.step("validate", v, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
