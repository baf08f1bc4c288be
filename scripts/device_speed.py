"""Decode speed of the CUDA fusions on one model, in one process (run by scripts/device_speed.sh
on the GPU machine): what `engine bench --backend cuda --no-promoted --prompt-tokens 512
--gen-tokens 128` measures, per variant; what `engine validate --backend cuda` judges, per
variant (one per-token reference shared by all); then the per-kernel decode time and launches
per token of a few variants (eager, CUDA events). The JSON under --out is rewritten after
every step, and no step starts past --deadline, so a call that runs out of time still returns
what it measured.

usage: python scripts/device_speed.py MODEL.gguf [--bench a,b] [--validate a,b] [--profile a,b]
       [--repeats N] [--deadline EPOCH_S] [--out DIR] [--tag SUFFIX]
       [--sweep VARIANT [--sweep-knobs k1,k2] [--sweep-repeats N]]

--sweep walks matmul_decode's knobs one at a time from VARIANT (greedy coordinate descent,
tg128 per setting), then benches, validates and profiles the best setting as 'swept': one
device call picks the mmvw defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.bench import bench, bench_prompt  # noqa: E402
from engine.tuning import TuningConfig  # noqa: E402
from engine.validate import tokenize_prompts, validate  # noqa: E402
from scripts.speed_record import SpeedRecord  # noqa: E402

MMVW = {"matmul_decode.variant": "mmvw"}
FUSE = {"rope.fuse_kv": 1}
RESIDENT = {"matmul_prefill.variant": "resident"}
ATTG = {"attention_prefill.variant": "gemm"}
TC = {"attention_prefill.variant": "flash_tc"}
VARIANTS: dict[str, dict] = {
    "default": {},
    "dmmv": {"matmul_decode.variant": "dmmv"},  # the float default before mmvf (issue 14)
    "mmvf_t32": {"matmul_decode.threads_per_row": 32},  # mmvf (the default) knobs
    "mmvf_r4": {"matmul_decode.rows_per_thread": 4},
    "mmvf_u4": {"matmul_decode.unroll": 4},
    "mmvq": {"matmul_decode.variant": "mmvq"},
    "fuse_kv": FUSE,
    "mmvw": MMVW,
    "mmvw_fused": MMVW | FUSE,
    "mmvw_t16_r2": MMVW | FUSE | {"matmul_decode.threads_per_row": 16,
                                  "matmul_decode.rows_per_thread": 2},
    "mmvw_t8_r2": MMVW | FUSE | {"matmul_decode.threads_per_row": 8,
                                 "matmul_decode.rows_per_thread": 2},
    "mmvw_r2": MMVW | FUSE | {"matmul_decode.rows_per_thread": 2},
    "mmvw_u4": MMVW | FUSE | {"matmul_decode.unroll": 4},
    "mmvw_u1_w8": MMVW | FUSE | {"matmul_decode.unroll": 1, "matmul_decode.warps": 8},
    "mmvw_t16_r4_u1": MMVW | FUSE | {"matmul_decode.threads_per_row": 16,
                                     "matmul_decode.rows_per_thread": 4,
                                     "matmul_decode.unroll": 1},
    # decode attention: one warp per key walks its range serially (a load -> shuffle chain per
    # key), so more key ranges may pay at 512-640 positions
    "mmvw_s32": MMVW | FUSE | {"attention_decode.splits": 32},
    "mmvw_s16_w8": MMVW | FUSE | {"attention_decode.splits": 16, "attention_decode.warps": 8},
    "s32": {"attention_decode.splits": 32},
    "kw": {"attention_decode.variant": "split_kw"},
    "mmvw_kw": MMVW | FUSE | {"attention_decode.variant": "split_kw"},
    "mmvw_kw_s16": MMVW | FUSE | {"attention_decode.variant": "split_kw",
                                  "attention_decode.splits": 16},
    "mmvw_kw_g4": MMVW | FUSE | {"attention_decode.variant": "split_kw",
                                 "attention_decode.lanes_per_key": 4},
    "mmvw_kw_nofc": MMVW | FUSE | {"attention_decode.variant": "split_kw",
                                   "attention_decode.fuse_combine": 0},
    # every decode change of issue 14 at once
    "mmvw_all": MMVW | FUSE | {"attention_decode.variant": "split_kw", "argmax.variant": "multi"},
    "all_dmmv": FUSE | {"attention_decode.variant": "split_kw", "argmax.variant": "multi"},
    # programmatic dependent launch (ctypes cuLaunchKernelEx): run in a process of its own
    "mmvw_all_pdl": MMVW | FUSE | {"attention_decode.variant": "split_kw",
                                   "argmax.variant": "multi", "matmul_decode.pdl": 1},
    "mmvw_kw_pdl": MMVW | FUSE | {"attention_decode.variant": "split_kw",
                                  "matmul_decode.pdl": 1},
    # prefill on tensor cores (issue 14): fp16 weights kept resident, fp16 activations stored
    # by their producers, attention through cuBLAS
    "ptc_resident": RESIDENT,
    "ptc_attn": ATTG,
    "ptc": RESIDENT | ATTG,
    "ptc_nofuse": RESIDENT | ATTG | {"matmul_prefill.fuse_f16": 0},
    "ptc_bq128": RESIDENT | ATTG | {"attention_prefill.block_q": 128},
    "ptc_bq512": RESIDENT | ATTG | {"attention_prefill.block_q": 512},
    "ptc_sw8": RESIDENT | ATTG | {"attention_prefill.softmax_warps": 8},
    "ptc_tc": RESIDENT | TC,
    "ptc_tc_fkv": RESIDENT | TC | FUSE,  # + bias, both ropes and the KV write in one launch
    "ptc_tc_128": RESIDENT | TC | {"attention_prefill.block_q": 128},
    "ptc_tc_32": RESIDENT | TC | {"attention_prefill.block_q": 32},
    "ptc_tc_k32": RESIDENT | TC | {"attention_prefill.block_k": 32},
    "ptc_tc_k128": RESIDENT | TC | {"attention_prefill.block_k": 128},
    "ptc_tc_mmvw_all": RESIDENT | TC | MMVW | FUSE | {"attention_decode.variant": "split_kw",
                                                     "argmax.variant": "multi"},
    "ptc_mmvw_all": RESIDENT | ATTG | MMVW | FUSE | {"attention_decode.variant": "split_kw",
                                                    "argmax.variant": "multi"},
}  # fmt: skip
# issue 14, second round: mmvw's fused epilogues (SwiGLU + Q8_1 in the gate/up launch; the next
# RMSNorm + Q8_1 in the o / down launch's last block; rope_kv in the q/k/v launch) and its
# weight-load knobs
ALL = VARIANTS["mmvw_all"]
GLU, NORM = {"matmul_decode.fuse_swiglu": 1}, {"matmul_decode.fuse_norm": 1}
ROPE = {"matmul_decode.fuse_rope": 1}
VARIANTS |= {
    "fused_glu": ALL | GLU,
    "fused_norm": ALL | NORM,
    "fused_rope": ALL | ROPE,
    "fused_all": ALL | GLU | NORM | ROPE,
    "fused_all_wl1": ALL | GLU | NORM | ROPE | {"matmul_decode.wload": 1},
    "fused_all_wl2": ALL | GLU | NORM | ROPE | {"matmul_decode.wload": 2},
    "fused_all_t8r4": ALL | GLU | NORM | ROPE | {"matmul_decode.threads_per_row": 8,
                                          "matmul_decode.rows_per_thread": 4},
    "fused_all_t16r2u4": ALL | GLU | NORM | ROPE | {"matmul_decode.threads_per_row": 16,
                                             "matmul_decode.rows_per_thread": 2,
                                             "matmul_decode.unroll": 4},
    # programmatic dependent launch, and with it each block's L2 prefetch of its weights before
    # the wait (prefetch): run in a process of their own, as the other PDL variants
    "fused_all_pdl": ALL | GLU | NORM | ROPE | {"matmul_decode.pdl": 1},
    "fused_all_pdl_pf": ALL | GLU | NORM | ROPE | {"matmul_decode.pdl": 1,
                                                   "matmul_decode.prefetch": 1},
    "mmvw_all_pdl_pf": ALL | {"matmul_decode.pdl": 1, "matmul_decode.prefetch": 1},
    # each block's weight rows staged in shared memory by one bulk copy (before the PDL wait)
    "fused_all_stage": ALL | GLU | NORM | ROPE | {"matmul_decode.stage": 1},
    "fused_all_pdl_stage": ALL | GLU | NORM | ROPE | {"matmul_decode.pdl": 1,
                                                      "matmul_decode.stage": 1},
    "mmvw_all_stage": ALL | {"matmul_decode.stage": 1},
    "mmvw_all_pdl_stage": ALL | {"matmul_decode.pdl": 1, "matmul_decode.stage": 1},
    "mmvw_all_wl1": ALL | {"matmul_decode.wload": 1},
    "mmvw_all_wl2": ALL | {"matmul_decode.wload": 2},
    "mmvw_all_u8_t16": ALL | {"matmul_decode.unroll": 8, "matmul_decode.threads_per_row": 16},
}  # fmt: skip
# issue 14, helper dec8: the best validated config (ptc_tc_mmvw_all) + mmvw's split-K of the
# long down-projection rows, and the never-timed PDL / prefetch / stage knobs on it
BEST = VARIANTS["ptc_tc_mmvw_all"]
_D = "matmul_decode."
VARIANTS |= {
    "dec8_split2": BEST | {_D + "split_k": 2},
    "dec8_split4": BEST | {_D + "split_k": 4},
    "dec8_split4_w8": BEST | {_D + "split_k": 4, _D + "warps": 8},
    "dec8_r2": BEST | {_D + "rows_per_thread": 2},
    "dec8_pdl": BEST | {_D + "pdl": 1},
    "dec8_pdl_pf": BEST | {_D + "pdl": 1, _D + "prefetch": 1},
    "dec8_pdl_stage": BEST | {_D + "pdl": 1, _D + "stage": 1},
    "dec8_split2_pdl_pf": BEST | {_D + "split_k": 2, _D + "pdl": 1, _D + "prefetch": 1},
    "dec8_split4_pdl_pf": BEST | {_D + "split_k": 4, _D + "pdl": 1, _D + "prefetch": 1},
    "dec8_split4_all": BEST | {_D + "split_k": 4, _D + "split_min_k": 256},
    "dec8_qt512": BEST | {"quantize_act.threads": 512},
}
# second round (after the checkpoint: split_k 2 was +3% on the 1.5B, PDL / stage / r2 lost; the
# decode attention is ~15 us a layer on the 1.5B, the largest non-GEMV cost): split_kw's kv_early
# (V rows loaded with K rows) and more key ranges, with and without split_k 2 (7B: without)
_A = "attention_decode."
S2 = BEST | {_D + "split_k": 2}
VARIANTS |= {
    "dec8_ke": BEST | {_A + "kv_early": 1},
    "dec8_ke_s16": BEST | {_A + "kv_early": 1, _A + "splits": 16},
    "dec8_s16": BEST | {_A + "splits": 16},
    "dec8_s32": BEST | {_A + "splits": 32},
    "dec8_s2_ke": S2 | {_A + "kv_early": 1},
    "dec8_s2_ke_s16": S2 | {_A + "kv_early": 1, _A + "splits": 16},
    "dec8_s2_ke_s32": S2 | {_A + "kv_early": 1, _A + "splits": 32},
    "dec8_s2_s16": S2 | {_A + "splits": 16},
    "dec8_s2_ke_s16_w8": S2 | {_A + "kv_early": 1, _A + "splits": 16, _A + "warps": 8},
    "dec8_s2_ke_s16_g4": S2 | {_A + "kv_early": 1, _A + "splits": 16, _A + "lanes_per_key": 4},
    # + q/k/v, biases, RoPE and the KV write in one launch (mmvw_qkv; never timed on its own)
    "dec8_s2_fr": S2 | {_D + "fuse_rope": 1},
    "dec8_s2_ke_s16_fr": S2 | {_A + "kv_early": 1, _A + "splits": 16, _D + "fuse_rope": 1},
    # 64-weight Q4_K slots (the kernel runs at ~130 G slots/s whatever the type: Q4_K at 2.4
    # TB/s, Q6_K at 3.5 on the 7B's shapes)
    "dec8_w4": BEST | {_D + "q4k_wide": 1},
    "dec8_w": BEST | {_D + "q4k_wide": 1, _D + "q6k_wide": 1},
    "dec8_w_ke_s16": BEST | {_D + "q4k_wide": 1, _D + "q6k_wide": 1, _A + "kv_early": 1,
                             _A + "splits": 16},
    "dec8_s2_w": S2 | {_D + "q4k_wide": 1, _D + "q6k_wide": 1},
    "dec8_s2_w_ke_s16": S2 | {_D + "q4k_wide": 1, _D + "q6k_wide": 1, _A + "kv_early": 1,
                              _A + "splits": 16},
}  # fmt: skip
# helper dec15 (issue 14): the grouped decode attention (attention_decode.gqa: a block per key
# range and KV head for the group's q heads, K/V staged once, fused combine), the one-block
# register RMSNorm (rms_norm.block) and PDL on the float path (matmul_decode.mmvf pdl)
_GQA = {_A + "variant": "gqa"}
_NB = {"rms_norm.variant": "block"}
F15 = _GQA | _NB | FUSE
VARIANTS |= {
    "f15_gqa": _GQA,
    "f15_norm": _NB,
    "f15_fkv": FUSE,
    "f15_all": F15,
    "f15_all_pdl": F15 | {_D + "pdl": 1},
    "f15_all_pdl_ne": F15 | {_D + "pdl": 1, _A + "early": 0},
    "f15_all_s8": F15 | {_A + "splits": 8},
    "f15_all_s32": F15 | {_A + "splits": 32},
    "f15_all_w2": F15 | {_A + "warps": 2},
    "d15": S2 | _GQA | _NB,
    "d15_gqa": S2 | _GQA,
    "d15_norm": S2 | _NB,
    "d15_pdl": S2 | _GQA | _NB | {_D + "pdl": 1},
    "d15_s8": S2 | _GQA | _NB | {_A + "splits": 8},
    "d15_s32": S2 | _GQA | _NB | {_A + "splits": 32},
    # + q/k RoPE and the KV write inside the attention kernel (no rope_kv launch)
    "f15_all_fr": F15 | {_A + "fuse_rope": 1},
    "f15_all_fr_pdl": F15 | {_A + "fuse_rope": 1, _D + "pdl": 1},
    "d15_fr": S2 | _GQA | _NB | {_A + "fuse_rope": 1},
    "d15_fr_pdl": S2 | _GQA | _NB | {_A + "fuse_rope": 1, _D + "pdl": 1},
    # + gate, up and SwiGLU in one mmvf launch (mmvf_glu)
    "f15_glu": {_D + "fuse_swiglu": 1},
    "f15_all_fr_glu": F15 | {_A + "fuse_rope": 1, _D + "fuse_swiglu": 1},
    "f15_all_fr_glu_pdl": F15 | {_A + "fuse_rope": 1, _D + "fuse_swiglu": 1, _D + "pdl": 1},
    "d15_fr_glu": S2 | _GQA | _NB | {_A + "fuse_rope": 1, _D + "fuse_swiglu": 1},
    # the warp norm named (the default), for comparison with rms_norm.block
    "warp_norm": {"rms_norm.variant": "warp"},
    "dec8_split2_warp": S2 | {"rms_norm.variant": "warp"},
    "f15_all_fr_s8": F15 | {_A + "fuse_rope": 1, _A + "splits": 8},
    "d15_fr_s8": S2 | _GQA | _NB | {_A + "fuse_rope": 1, _A + "splits": 8},
    "norm_t128": _NB | {"rms_norm.threads": 128},
    "norm_t512": _NB | {"rms_norm.threads": 512},
}
# helper gemv (issue 14): mmvw's Q4_K / Q6_K launches as mmvw_stream (matmul_decode.stream =
# the ring's stages: persistent blocks, bulk-copied shared-memory stages; same arithmetic)
VARIANTS |= {
    "gemv_s2": S2 | {_D + "stream": 2},
    "gemv_s3": S2 | {_D + "stream": 3},
    "gemv_s4": S2 | {_D + "stream": 4},
    "gemv_s4_k1": BEST | {_D + "stream": 4},  # without split_k
    "gemv_s3_w8": S2 | {_D + "stream": 3, _D + "warps": 8},
    "gemv_s4_b2": S2 | {_D + "stream": 4, _D + "stream_blocks": 2},
    "gemv_s3x": S2 | {_D + "stream": 3, _D + "stream_x": 1},
    "gemv_s4x": S2 | {_D + "stream": 4, _D + "stream_x": 1},
    # Q4_K decoded branch-free (q4k_lean) in a kernel built for Q4_K alone (q4k_kernel)
    "gemv_lk": S2 | {_D + "q4k_lean": 1, _D + "q4k_kernel": 1},
    "gemv_lk_mb12": S2 | {_D + "q4k_lean": 1, _D + "q4k_kernel": 1, _D + "q4k_min_blocks": 12},
    "gemv_lk_mb16": S2 | {_D + "q4k_lean": 1, _D + "q4k_kernel": 1, _D + "q4k_min_blocks": 16},
    "gemv_lean": S2 | {_D + "q4k_lean": 1},
    "gemv_k4": S2 | {_D + "q4k_kernel": 1},
    # + the LM head (only) staged in shared memory by bulk copies
    "gemv_lk_stage_lm": S2 | {_D + "q4k_lean": 1, _D + "q4k_kernel": 1, _D + "stage": 1,
                              _D + "stage_min_rows": 65536},
    "gemv_stage_lm": S2 | {_D + "stage": 1, _D + "stage_min_rows": 65536},
    "gemv_lk_mb16_stage_lm": S2 | {_D + "q4k_lean": 1, _D + "q4k_kernel": 1,
                                   _D + "q4k_min_blocks": 16, _D + "stage": 1,
                                   _D + "stage_min_rows": 65536},
}  # fmt: skip
# helper attn (issue 14): attention_decode.tile (a block per KV head and key range cut from the
# position, cp.async K/V tiles, fused combine) on dec8_split2, and its knobs
_TILE = {_A + "variant": "tile"}
VARIANTS |= {
    "d16_attn": S2 | _TILE,  # warps 8 since the checkpoint (4: 528.5, 8: 565.1 tok/s)
    "d16_attn_m32": S2 | _TILE | {_A + "min_keys": 32},
    "d16_attn_w8": S2 | _TILE | {_A + "warps": 8},
    "d16_attn_w4": S2 | _TILE | {_A + "warps": 4},
    "d16_attn_s64_m32": S2 | _TILE | {_A + "splits": 64, _A + "min_keys": 32},
    # one shared-memory stage (36 KiB, no opt-in beyond 48): is the 71 KiB block the cost?
    "d16_attn_st1": S2 | _TILE | {_A + "stages": 1},
    "d16_attn_m32_st1": S2 | _TILE | {_A + "min_keys": 32, _A + "stages": 1},
    "f16_attn": _TILE,  # on the float defaults
    "d16_attn_nofc": S2 | _TILE | {_A + "fuse_combine": 0},
    # + q/k/v, biases, RoPE and the KV write in one mmvw launch (mmvw_qkv): no rope_kv launch
    "d16_attn_fr": S2 | _TILE | {_D + "fuse_rope": 1},
    # + q/k RoPE and the KV write inside attn_tile (while its tiles load): no rope_kv launch
    "d16_attn_rope": S2 | _TILE | {_A + "fuse_rope": 1},
    "f16_attn_rope": _TILE | {_A + "fuse_rope": 1},
}
# helper attn (issue 14, second round): attention_decode.vec (registers only: a warp's 8-key
# round of K / V in flight at once, the KV group scored together, 4 KiB of shared memory)
_VEC = {_A + "variant": "vec"}
VARIANTS |= {
    "d17_vec": S2 | _VEC,  # splits 64, min_keys 32, warps 4, fused combine
    "d17_vec_w2": S2 | _VEC | {_A + "warps": 2},
    "d17_vec_w8": S2 | _VEC | {_A + "warps": 8},
    "d17_vec_w1_m8": S2 | _VEC | {_A + "warps": 1, _A + "min_keys": 8},
    "d17_vec_m64": S2 | _VEC | {_A + "min_keys": 64},
    "d17_vec_s32": S2 | _VEC | {_A + "splits": 32},
    "d17_vec_nofc": S2 | _VEC | {_A + "fuse_combine": 0},
    "f17_vec": _VEC,  # on the float defaults
    # + q/k RoPE and the KV write inside attn_vec (each lane its own dims' angles): no rope_kv
    "d17_vec_rope": S2 | _VEC | {_A + "fuse_rope": 1},
    "d17_vec_w2_rope": S2 | _VEC | {_A + "warps": 2, _A + "fuse_rope": 1},
    "f17_vec_rope": _VEC | {_A + "fuse_rope": 1},
    # a cluster of 8 ranges a KV head, merged in distributed shared memory (no fence / ticket)
    "d17_vec_cl": S2 | _VEC | {_A + "cluster": 1},
    "d17_vec_cl_w8": S2 | _VEC | {_A + "cluster": 1, _A + "warps": 8},
    "d17_vec_cl_rope": S2 | _VEC | {_A + "cluster": 1, _A + "fuse_rope": 1},
    "d17_vec_cl_w8_rope": S2 | _VEC | {_A + "cluster": 1, _A + "warps": 8, _A + "fuse_rope": 1},
    # + the later rounds' rows prefetched into L2 at the start
    "d17_vec_cl_w8_pf": S2 | _VEC | {_A + "cluster": 1, _A + "warps": 8, _A + "prefetch": 1},
    "d17_vec_cl_w8_pf_rope": S2
    | _VEC
    | {_A + "cluster": 1, _A + "warps": 8, _A + "prefetch": 1, _A + "fuse_rope": 1},
}
# --sweep: coordinate descent over these knobs, in this order, from the --sweep variant
SWEEP_KNOBS = (
    "q4k_lean",
    "q4k_kernel",
    "stream",
    "stream_x",
    "split_k",
    "wload",
    "stage",
    "glu_threads_per_row",
    "glu_unroll",
    "threads_per_row",
    "rows_per_thread",
    "unroll",
    "warps",
    "min_blocks",
)


def config(name: str, backend: str = "cuda") -> TuningConfig:
    return TuningConfig.from_flat(backend, VARIANTS[name])


def sweep_param(base: dict, knob: str):  # noqa: ANN201 - a registry Param
    """(flat key, registry Param) of a sweep knob: a bare name is matmul_decode's, 'op.knob'
    any op's, of the variant base chooses (else the op's default variant)."""
    from engine.tuning import REGISTRY

    op, name = knob.split(".", 1) if "." in knob else ("matmul_decode", knob)
    entry = REGISTRY.op("cuda", op)
    variant = entry.variant(str(base.get(f"{op}.variant", entry.default.name)))
    names = [p.name for p in variant.params]
    if name not in names:
        raise ValueError(f"{op}.{variant.name} has no knob {name!r}; knobs: {', '.join(names)}")
    return f"{op}.{name}", variant.param(name)


def sweep_order(base: dict, knob: str) -> list[dict]:
    """The settings of one coordinate step: base with the knob at each value the registry
    allows (the base's own value first)."""
    key, p = sweep_param(base, knob)
    cur = base.get(key, p.default)
    return [base | {key: v} for v in [cur, *(c for c in p.choices if c != cur)]]


def decode_profile(eng, n_prompt: int = 512, steps: int = 8) -> dict:  # noqa: ANN001
    """Per-kernel ms per decode token and launches per token, eager (CUDA events)."""
    m, be = eng.model, eng.model.backend
    cache = m.new_cache(n_prompt + steps + 1)
    m.prefill(bench_prompt(n_prompt, m.spec.n_vocab), cache)
    tok = be.upload(np.array([1], np.int32))
    be.set_profiling(True)
    be.profile(reset=True)  # drop what the prefill put there
    for i in range(steps):
        tok = be.argmax(m.forward(tok, 1, n_prompt + i, cache))
    rep = be.profile(reset=True)
    be.set_profiling(False)
    ms = {k: t.total_ms / steps for k, t in rep.kernels.items()}
    return {
        "launches_per_token": sum(t.calls for t in rep.kernels.values()) / steps,
        "kernel_ms_per_token": sum(ms.values()),
        "ms_per_token": dict(sorted(ms.items(), key=lambda kv: -kv[1])),
        "calls_per_token": {k: t.calls / steps for k, t in rep.kernels.items()},
    }


def prefill_profile(eng, n_prompt: int = 512) -> dict:  # noqa: ANN001
    """Per-kernel ms of one prefill of n_prompt tokens (eager, CUDA events; cuBLAS GEMMs as
    cublas_gemm_f16), after an unprofiled one (first-use copies and compiles out of it)."""
    m, be = eng.model, eng.model.backend
    prompt = bench_prompt(n_prompt, m.spec.n_vocab)
    m.prefill(prompt, m.new_cache(n_prompt + 1))
    be.synchronize()
    t0 = time.perf_counter()  # unprofiled: against kernel_ms, how much is host-side
    m.prefill(prompt, m.new_cache(n_prompt + 1))
    be.synchronize()
    wall_plain = (time.perf_counter() - t0) * 1e3
    be.set_profiling(True)
    be.profile(reset=True)
    t0 = time.perf_counter()
    m.prefill(prompt, m.new_cache(n_prompt + 1))
    be.synchronize()
    wall = (time.perf_counter() - t0) * 1e3
    rep = be.profile(reset=True)
    be.set_profiling(False)
    ms = {k: t.total_ms for k, t in rep.kernels.items()}
    return {
        "wall_ms": wall_plain,
        "wall_ms_profiled": wall,
        "kernel_ms": sum(ms.values()),
        "ms": dict(sorted(ms.items(), key=lambda kv: -kv[1])),
        "calls": {k: t.calls for k, t in rep.kernels.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--bench", default="default,mmvq,all_dmmv,mmvw_fused,mmvw_all")
    ap.add_argument("--validate", default="all_dmmv,mmvw_all")
    ap.add_argument("--profile", default="default,mmvw_all")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--validate-after", type=int, default=5, help="benches before validating")
    ap.add_argument(
        "--profile-early", action="store_true", help="profiles before the benches after the first"
    )
    ap.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--tag", default="", help="suffix of the JSON's name (speed_<model><tag>)")
    ap.add_argument("--json", action="store_true", help="print the result JSON at the end")
    ap.add_argument("--backend", default="cuda", help="cuda; numpy runs 'default' (a dry run)")
    ap.add_argument(
        "--sweep",
        default="",
        help="a variant: coordinate descent over matmul_decode's "
        f"{', '.join(SWEEP_KNOBS)} from it, tg128 of each setting (runs after the benches); "
        "the best setting is benched, validated and profiled as variant 'swept'",
    )
    ap.add_argument(
        "--sweep-knobs",
        default=",".join(SWEEP_KNOBS),
        help="knobs, in order: a bare name is matmul_decode's, op.knob any op's "
        "(e.g. attention_decode.splits)",
    )
    ap.add_argument("--sweep-repeats", type=int, default=1, help="tg128 runs per setting")
    args = ap.parse_args()
    lists = {k: [v for v in getattr(args, k).split(",") if v] for k in ("bench", "validate")}
    lists["profile"] = [v for v in args.profile.split(",") if v]
    knobs = [k for k in args.sweep_knobs.split(",") if k]
    if args.sweep and args.sweep not in VARIANTS:
        print(f"unknown --sweep variant {args.sweep}; known: {', '.join(VARIANTS)}")
        return 2
    for knob in knobs if args.sweep else ():
        try:
            sweep_param(VARIANTS[args.sweep], knob)
        except Exception as e:  # noqa: BLE001 - the registry's message names what is allowed
            print(f"--sweep-knobs {knob}: {e}")
            return 2
    bad = sorted({v for vs in lists.values() for v in vs} - set(VARIANTS))
    if bad:
        print(f"unknown variant(s) {', '.join(bad)}; known: {', '.join(VARIANTS)}")
        return 2
    name = Path(args.model).stem
    out = Path(args.out) / f"speed_{name}{args.tag}.json"
    variants = {k: VARIANTS[k] for vs in lists.values() for k in vs}
    rec = SpeedRecord(args.model, out, variants, args.deadline)
    res, save, late = rec.res, rec.save, rec.late

    eng = rec.load(args.backend)
    be = eng.model.backend

    prompts = tokenize_prompts(eng.tokenizer())
    ref_cache: dict = {}  # the per-token reference, computed once for every candidate

    def run_bench(v: str) -> None:
        def body(v: str) -> None:
            be.set_config(config(v, args.backend))
            rep = bench(eng.model, [512], 128, args.repeats, 1)
            r = rep.results[0]
            res["bench"][v] = {
                "pp512": r.prefill_tok_s.median,
                "pp512_range": [r.prefill_tok_s.min, r.prefill_tok_s.max],
                "tg128": r.decode_tok_s.median if r.decode_tok_s else None,
                "tg128_range": [r.decode_tok_s.min, r.decode_tok_s.max] if r.decode_tok_s else None,
            }
            print(f"{name} bench {v:16s} pp512 {r.prefill_tok_s.median:9.1f}  tg128 "
                  f"{res['bench'][v]['tg128'] or 0:7.1f} tok/s", flush=True)  # fmt: skip

        rec.step("bench", v, body)

    def run_validate(v: str) -> None:
        def body(v: str) -> None:
            t1 = time.time()
            rep = validate(
                eng.model, config(v, args.backend), prompts, steps=8, ref_cache=ref_cache
            )
            res["validate"][v] = rep.to_dict() | {"seconds": time.time() - t1}
            print(f"{name} validate {v:16s} {'PASS' if rep.passed else 'FAIL'}  "
                  f"KLD={rep.kld_max:.3g} nmse={rep.nmse:.3g} mad={rep.max_abs_diff:.3g}  "
                  f"classes {rep.numeric_classes}  blame {rep.blame}", flush=True)  # fmt: skip

        rec.step("validate", v, body)

    # the first --validate-after benches, every validate, the other benches: the verdicts come
    # before the knob sweep when the deadline cuts the run short
    def run_profile(v: str) -> None:
        def body(v: str) -> None:
            be.set_config(config(v, args.backend))
            p = decode_profile(eng)
            pp = prefill_profile(eng)
            p["prefill"] = pp
            res["profile"][v] = p
            top = ", ".join(f"{k}={t:.2f}" for k, t in list(pp["ms"].items())[:9])
            print(f"{name} prefill profile {v:16s} kernels {pp['kernel_ms']:.2f} ms "
                  f"(wall {pp['wall_ms']:.1f}, profiled {pp['wall_ms_profiled']:.1f}): {top}",
                  flush=True)  # fmt: skip
            top = ", ".join(f"{k}={t:.3f}" for k, t in list(p["ms_per_token"].items())[:8])
            print(f"{name} profile {v:16s} {p['launches_per_token']:.0f} launches/token, "
                  f"kernels {p['kernel_ms_per_token']:.3f} ms/token: {top}",
                  flush=True)  # fmt: skip

        rec.step("profile", v, body)

    for v in lists["bench"][: args.validate_after]:
        run_bench(v)
    for v in lists["validate"]:
        run_validate(v)
    if args.profile_early:  # the per-kernel split before the knob sweep's benches
        for v in lists["profile"]:
            run_profile(v)
    for v in lists["bench"][args.validate_after :]:
        run_bench(v)

    if args.sweep:
        best, best_tg = dict(VARIANTS[args.sweep]), -1.0
        res["sweep"] = {"from": args.sweep, "settings": []}
        seen: dict[str, float] = {}
        for knob in knobs:
            for flat in sweep_order(best, knob):
                key = json.dumps(flat, sort_keys=True)
                if key in seen:
                    continue
                if late(f"sweep {knob}"):
                    break
                short = {k: flat[k] for k in sorted(flat) if flat[k] != VARIANTS[args.sweep].get(k)}
                try:
                    be.set_config(TuningConfig.from_flat(args.backend, flat))
                    r = bench(eng.model, [512], 128, args.sweep_repeats, 1).results[0]
                    tg = r.decode_tok_s.median if r.decode_tok_s else 0.0
                except Exception as e:  # noqa: BLE001 - a setting's failure is its result
                    tg = 0.0
                    print(f"{name} sweep {short}: ERROR {e!r}", flush=True)
                seen[key] = tg
                res["sweep"]["settings"].append({"knobs": short, "tg128": tg})
                print(f"{name} sweep {json.dumps(short):90s} tg128 {tg:7.1f}", flush=True)
                if tg > best_tg:
                    best, best_tg = flat, tg
                save()
        res["sweep"]["best"] = {"flat": best, "tg128": best_tg}
        VARIANTS["swept"] = best
        res["variants"]["swept"] = best
        print(f"{name} sweep best {best_tg:.1f}: {json.dumps(best)}", flush=True)
        save()
        run_bench("swept")
        run_validate("swept")
        if args.profile_early:
            run_profile("swept")
        elif "swept" not in lists["profile"]:
            lists["profile"].append("swept")

    if not args.profile_early:
        for v in lists["profile"]:
            run_profile(v)
    if args.json:
        print(json.dumps(res, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
