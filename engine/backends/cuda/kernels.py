"""Compiling shaders/cuda/*.cu with NVRTC (through cupy.RawModule) and caching the modules.

A module is one .cu file compiled with one set of -D defines (its tunables). The in-process
cache key is (device compute capability, file, source hash, defines); CuPy's on-disk cache sits
underneath, keyed by source, options, architecture and NVRTC version, so a second process on the
same machine loads the cubin without compiling. ``#include "x.cuh"`` lines are inlined here, so
NVRTC needs no include path (and no CUDA headers: common.cuh uses PTX for fp16). Each file is read
through engine.backends.kernel_sources (a ``FLEETTUNE_KERNEL_SOURCES`` overlay first); both caches
key on the inlined text, so an overlaid source is its own build.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.backends import kernel_sources
from engine.errors import KernelCompileError
from engine.tuning import REGISTRY, OpChoice
from engine.tuning.knobs import knobs
from engine.tuning.registry import DEFINE, Variant

# Kernel name suffix of each weight type (dmmv_q4_k, mmvq_q6_k, ...).
QTYPE_SUFFIX = {
    "Q4_0": "q4_0",
    "Q4_1": "q4_1",
    "Q5_0": "q5_0",
    "Q8_0": "q8_0",
    "Q4_K": "q4_k",
    "Q6_K": "q6_k",
    "F32": "f32",
    "F16": "f16",
    "BF16": "bf16",
}

if TYPE_CHECKING:
    from engine.tuning import TuningConfig

SHADERS = Path(__file__).resolve().parents[3] / "shaders" / "cuda"
_INCLUDE = re.compile(r'^\s*#include\s+"([^"]+)"\s*$', re.M)

_MODULES: dict[tuple, Any] = {}


def source(name: str) -> str:
    """The text of shaders/cuda/<name> with its local includes inlined (each once)."""
    seen: set[str] = set()

    def expand(fname: str) -> str:
        if fname in seen:
            return ""
        seen.add(fname)
        text = kernel_sources.read_text(f"cuda/{fname}")
        return _INCLUDE.sub(lambda m: expand(m.group(1)), text).replace("#pragma once", "")

    return expand(name)


def module(cp: Any, cc: int, fname: str, defines: dict[str, int] | None = None) -> Any:
    """A loaded cupy.RawModule of fname with defines; KernelCompileError (with the NVRTC log)
    when it does not compile. Compiling happens here, not at first launch: RawModule is lazy,
    so one kernel is fetched to force it."""
    defines = dict(defines or {})
    defines = dict(sorted(defines.items()))
    src = source(fname)
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]
    key = (cc, fname, digest, tuple(defines.items()))
    mod = _MODULES.get(key)
    if mod is not None:
        return mod
    options = ("-std=c++17", *(f"-D{k}={v}" for k, v in defines.items()))
    first = _first_kernel(src)
    try:
        mod = cp.RawModule(code=src, options=options)
        mod.get_function(first)
    except cp.cuda.compiler.CompileException as e:
        raise KernelCompileError(
            f"shaders/cuda/{fname} with {defines or 'no defines'} failed to compile for "
            f"sm_{cc}:\n{e.get_message() if hasattr(e, 'get_message') else e}"
        ) from None
    _MODULES[key] = mod
    return mod


def _first_kernel(src: str) -> str:
    names = kernel_names(src)
    if not names:
        raise KernelCompileError('no extern "C" kernel found in the source')
    return names[0]


def kernel_names(src: str) -> list[str]:
    """Kernel names a source defines, including those made by its *_KERNEL(S) macros."""
    out = [
        n
        for n in re.findall(
            r'extern\s+"C"\s+__global__\s+void\s+'
            r"(?:(?:__launch_bounds__|__cluster_dims__)\((?:[^()]|\([^()]*\))*\)\s*)*(\w+)\s*\(",
            src,
        )
        if n != "__launch_bounds__"
    ]
    macros = {
        "DMMV_KERNEL": ["dmmv_{}"],
        "MMQ_KERNEL": ["mmq_{}"],
        "MMQ8_KERNEL": ["mmq8_{}"],
        "MMVQ_KERNEL": ["mmvq_{}"],
        "MMVF_KERNEL": ["mmvf_{}"],
        "MMVF_GLU_KERNEL": ["mmvf_glu_{}"],
        "DEQ_KERNELS": ["get_rows_{}", "dequant_f16_{}"],
        "MOE_KERNEL": ["moe_{}"],
        "MOE_GROUPED_KERNEL": ["moe_grouped_{}"],
        "MOE_TC_KERNELS": ["moe_tc_gu_{}", "moe_tc_down_{}"],
        "MOE_Q8_KERNELS": ["moe_q8_{}", "moe_q8_gu_{}"],
        "ATTN_TC_KERNEL": ["attn_tc_{}"],
        "ATTN_VEC_KERNEL": ["attn_vec{}"],
        "MOE_DEC_GATE_UP_KERNEL": ["moe_dec_{}"],
        "MOE_DEC_DOWN_KERNEL": ["moe_dec_{}"],
        "MOE_DEC_DOWN_NORM_KERNEL": ["moe_dec_{}"],
    }
    for mac, pats in macros.items():
        for arg in re.findall(rf"^{mac}\((\w+),", src, re.M):
            out += [p.format(arg) for p in pats]
    return out


# Modules every config builds, whatever its variants (no tunable defines).
FIXED_MODULES = {
    "q8": "q8.cu",
    "dequant": "dequant.cu",
    "elementwise": "elementwise.cu",
    "fused": "decode_fused.cu",
    "attn_decode": "attn_decode.cu",  # attention_decode.gqa (launch knobs only)
    "attn_tile": "attn_tile.cu",  # attention_decode.tile (launch knobs only)
    "attn_vec": "attn_vec.cu",  # attention_decode.vec (launch knobs only)
    "norm_decode": "norm_decode.cu",  # rms_norm.block (launch knobs only)
    "hybrid": "hybrid.cu",  # the hybrids' small ops (engine/backends/cuda/hybrid.py)
}
# The module key the backend launches from, per (op, source file) where it is not the file's
# stem (mmvq, mmvw, mmq, mmq8 and dequant are).
_KEYS = {
    ("matmul_decode", "dmmv.cu"): "decode",
    ("matmul_batched", "dmmv.cu"): "batched",
    ("attention_prefill", "attention.cu"): "attention",
}
MODULE_OPS = (
    "matmul_decode",
    "matmul_batched",
    "matmul_prefill",
    "attention_prefill",
    "delta_net",  # delta_net.cu
    "moe_experts",  # moe.cu (+ moe_grouped.cu, moe_tc.cu or moe_q8.cu for those variants)
)


def variant_defines(variant: Variant, choice: OpChoice, fname: str | None = None) -> dict[str, int]:
    """The -D defines of the variant's build of ``fname`` (relative to shaders/; None: its own
    source): its fixed ones in its own build, then each knob bound to DEFINE that reaches it."""
    fname = fname or variant.source
    out: dict[str, int] = {}
    for d in variant.defines if fname == variant.source else ():
        name, _, value = d.partition("=")
        out[name] = int(value or 1)
    for p in variant.bound(DEFINE):
        if variant.reaches(p, fname):
            out[str(p.binding.target)] = int(choice[p.name])
    view = None
    for d in variant.derived:  # values derived from the knobs, computed once (the typed view)
        if variant.reaches(d, fname):
            view = view or knobs("cuda", variant.op, choice)
            out[str(d.binding.target)] = int(getattr(view, d.name))
    return out


def variant_modules(op: str, variant: Variant, choice: OpChoice) -> dict[str, tuple[str, dict]]:
    """module key -> (.cu file, defines) of every build a variant's declaration names: its own
    source and each file its knobs' defines reach (a file whose _BUILT_WHEN define is 0 is not
    built)."""
    out = {}
    for build in variant.builds():
        fname = Path(build).name
        defines = variant_defines(variant, choice, build)
        gate = _BUILT_WHEN.get(fname)
        if gate is not None and not defines[gate]:
            continue
        out[_KEYS.get((op, fname), Path(fname).stem)] = (fname, defines)
    return out


# Helper modules built only when a define of theirs is on: dn_clu.cu under
# delta_net.step_cluster (its STEP_CLUSTER) needs sm_90 clusters, so step_cluster 0 builds none.
_BUILT_WHEN = {"dn_clu.cu": "STEP_CLUSTER"}


def default_choice(op: str, variant: str) -> OpChoice:
    """A variant of op at its registry defaults."""
    v = REGISTRY.op("cuda", op).variant(variant)
    return OpChoice(v.name, tuple(sorted((p.name, p.default) for p in v.params)))


# Float weights under matmul_decode.mmvq (which decodes block types only) use dmmv at its
# registry defaults.
DECODE_FALLBACK = default_choice("matmul_decode", "dmmv")
DECODE_FALLBACK_KNOBS = knobs("cuda", "matmul_decode", DECODE_FALLBACK)  # its typed view
# Float expert weights under moe_experts.mmvq (block types only) use moe.cu (and fuse_decode's
# moe_dec.cu) as the dmmv variant builds them at its defaults.
MOE_FALLBACK = default_choice("moe_experts", "dmmv")
# attention.cu (decode attention) at the flash variant's defaults when attention_prefill names
# another source file.
FLASH_DEFAULT = default_choice("attention_prefill", "flash")


def modules_for(cfg: TuningConfig) -> dict[str, tuple[str, dict[str, int]]]:
    """module key -> (.cu file, defines) of every module a config needs: a loop over the
    registry's declarations of the chosen variants, then the fallbacks where a variant leaves
    a file another path needs unbuilt."""
    mods: dict[str, tuple[str, dict[str, int]]] = {k: (f, {}) for k, f in FIXED_MODULES.items()}
    for op in MODULE_OPS:
        choice = cfg.op(op)
        mods.update(variant_modules(op, REGISTRY.op("cuda", op).variant(choice.variant), choice))
    fallbacks = [  # (module key it provides, op, variant at its defaults)
        ("moe", "moe_experts", MOE_FALLBACK),  # float experts under mmvq
        ("attention", "attention_prefill", FLASH_DEFAULT),  # decode attention's kernels
        ("decode", "matmul_decode", DECODE_FALLBACK),  # float weights under mmvq / mmvw / mmvf
    ]
    for key, op, choice in fallbacks:
        if key not in mods:
            built = variant_modules(op, REGISTRY.op("cuda", op).variant(choice.variant), choice)
            mods.update({k: m for k, m in built.items() if k not in mods})
    if cfg.op("attention_prefill").variant == "flash_tc":  # head dims it has no kernel for
        gemm = REGISTRY.op("cuda", "attention_prefill").variant("gemm")
        mods["attention_gemm"] = (Path(gemm.source).name, {})
    return mods


def clear_cache() -> None:
    _MODULES.clear()
