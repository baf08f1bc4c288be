"""The shader programs of the Vulkan backend: which .comp file, which defines, how many storage
buffers, and the push-constant layout. Plain data (no Vulkan import), shared by the backend and
by the SPIR-V precompiler, so the precompiled set is exactly what the backend asks for.

The file and the variant's fixed defines come from the registry (Variant.source, .defines); the
knobs bound to a define (engine.tuning.registry.DEFINE) add theirs; this module adds what the
registry does not say: the buffers and push constants of each op, and the passes of the two-pass
variants."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from engine.tuning import REGISTRY, OpChoice
from engine.tuning.registry import DEFINE, SPEC, SUBGROUP, Variant

MAX_GROUPS = 65535  # guaranteed maxComputeWorkGroupCount per dimension


def fold_groups(n: int) -> tuple[int, int, int]:
    """n workgroups as an x * y grid (shaders unfold it with wg_linear())."""
    n = max(int(n), 1)
    if n <= MAX_GROUPS:
        return (n, 1, 1)
    y = -(-n // MAX_GROUPS)
    return (-(-n // y), y, 1)


@dataclass(frozen=True)
class Program:
    shader: str  # shaders/vulkan/<shader>.comp
    defines: tuple[str, ...]
    n_bindings: int  # storage buffers at bindings 0 .. n-1 of set 0
    push: str  # struct format of the push constants (4-byte fields: I uint, f float)

    @property
    def push_size(self) -> int:
        return 4 * len(self.push)


DN_PUSH = "IIIIIIIIIIIIIf"  # delta_net.comp's push constants
ROPE_KV_PUSH = "IIIIIIIIIIII"  # rope.comp FUSE_KV
MMVW_PUSH = "IIII" + "IIIII" * 3 + "III"  # mmvw.comp: K, x_off, wg1, wg2, per matrix, RoPE
# Weight types mmvw.comp decodes against Q8_1; the variant runs the others as the block DMMV.
MMVW_TYPES = frozenset({"Q4_K", "Q6_K"})

# op -> (storage buffers, push-constant format) of its single-pass programs
IO = {
    "matmul_decode": (3, "IIIII"),
    "matmul_prefill": (3, "IIIIIII"),
    "embedding": (3, "IIIIIII"),
    "rms_norm": (3, "IIIIIf"),
    "add": (3, "IIIII"),
    "swiglu": (3, "IIIII"),
    "rope": (4, "IIIIIIII"),
    "kv_write": (5, "IIIIIII"),
    # hybrid models
    "delta_net": (7, DN_PUSH),
    "sigmoid_mul": (3, "IIIII"),
    "cols": (2, "IIIIII"),
    "ssm_conv": (4, "IIIIIII"),
    "ssm_gates": (6, "IIIIIIII"),
    "router_topk": (3, "IIIIII"),
}


class Pass(NamedTuple):
    """A program of a multi-pass variant."""

    define: str  # "" for none; several separated by spaces
    n_bindings: int
    push: str
    shader: str = ""  # another shader than the variant's source ("" for its own)
    key: str = ""  # the pipeline key's suffix; default: none for the first pass, merge after


# The passes of the variants that dispatch more than one program, in dispatch order:
# (pass define, storage buffers, push-constant format[, shader, key]); unless a key is given,
# the first pass is keyed op, the second op.merge.
PASSES = {
    ("attention", "online"): (("", 5, "IIIIIIIIf"),),
    ("attention", "split"): (
        ("PASS_PARTIAL", 5, "IIIIIIIIIf"),
        ("PASS_MERGE", 2, "IIIII"),
        ("MERGE_Q8", 3, "IIIIII", "", "merge_q8"),  # under matmul_decode.mmvw
        # fuse_combine: the last range of a head merges (and, under mmvw, stores Q8_1)
        ("FUSED_MERGE", 8, "IIIIIIIIIfIII", "", "fused"),
        ("FUSED_MERGE_Q8", 8, "IIIIIIIIIfIII", "", "fused_q8"),
    ),
    ("argmax", "default"): (("", 2, "IIII"),),
    ("argmax", "two_stage"): (("STAGE_SLICES", 2, "IIIII"), ("STAGE_MERGE", 2, "IIII")),
    ("moe_experts", "dmmv"): (("", 4, "IIIIIIII"), ("PASS_COMBINE", 3, "IIIIII")),
    # decode as dmmv (moe_matvec.comp); prefill: sort the pairs by expert, then grouped GEMMs
    ("moe_experts", "grouped"): (
        ("", 4, "IIIIIIII", "moe_matvec"),
        ("PASS_COMBINE", 3, "IIIIII", "moe_matvec"),
        ("PASS_SORT", 2, "IIIII", "", "sort"),
        ("PASS_GEMM", 4, "IIIIIIII", "", "gemm"),
    ),
    # Q8_1 for matmul_decode.mmvw: a plain quantize, and rms_norm / SwiGLU that also store it
    ("quantize_act", "q8_1"): (
        ("", 2, "III"),
        ("OUT_Q8", 4, "IIIIIfI", "rms_norm", "norm"),
        ("SWIGLU_Q8", 4, "IIIIII", "eltwise", "swiglu"),
    ),
    ("rope", "table"): (
        ("", 4, "IIIIIIII"),
        ("FUSE_KV", 8, ROPE_KV_PUSH, "", "kv"),
        ("FUSE_KV FUSE_BIAS", 11, ROPE_KV_PUSH + "III", "", "kv_bias"),  # rope.fuse_bias
    ),
    # decode (T == 1) with the sequential kernel, prefill with the two chunked passes
    ("delta_net", "chunked"): (
        ("", 7, DN_PUSH, "delta_net"),
        ("PASS_PREP", 6, "IIIIIIIIIIIIf", "", "prep"),
        ("PASS_SCAN", 3, "IIIIIII", "", "scan"),
    ),
}


# rms_norm: the plain norm, and with rms_norm.fuse_add the residual add before it (ADD_RES: r and
# the sum's buffer as bindings 3 and 4, their offsets after eps)
PASSES[("rms_norm", "default")] = (
    ("", *IO["rms_norm"]),
    ("ADD_RES", 5, "IIIIIfII", "", "add"),
    # matmul_prefill.fuse_x16: and the normed rows as the resident GEMM's fp16 input (binding 5)
    ("ADD_RES OUT_F16", 6, "IIIIIfIIII", "", "add_x16"),
)
# swiglu; with matmul_prefill.fuse_x16 its prefill rows also as the resident GEMM's fp16 input
PASSES[("swiglu", "default")] = (("", *IO["swiglu"]), ("OUT_F16", 4, "IIIIIIII", "", "x16"))

# matmul_prefill.resident (matmul_f16.comp): the GEMM, the one-time fp16 copy of a weight, the
# activations' fp16 form; one layout of three buffers and matmul_prefill's push constants.
PASSES[("matmul_prefill", "resident")] = (
    ("", 3, IO["matmul_prefill"][1]),
    ("PASS_W16", 3, IO["matmul_prefill"][1], "", "w16"),
    ("PASS_X16", 3, IO["matmul_prefill"][1], "", "x16"),
    ("PASS_KSUM", 3, IO["matmul_prefill"][1], "", "ksum"),  # split_k's sum of the k-ranges
)

# attention.coopmat: decode with the split variant's passes (whatever they are, from
# attention_split.comp), prefill with the cooperative-matrix flash pass.
PASSES[("attention", "coopmat")] = (
    *(
        Pass(*p)._replace(shader=Pass(*p).shader or "attention_split")
        for p in PASSES[("attention", "split")]
    ),
    Pass("", 5, "IIIIIIIIIf", "", "flash"),
)

# attention.flash: the same, with attention_flash.comp's pass for T > 1 (64 queries a
# workgroup, softmax across a subgroup's lanes, the output in registers)
PASSES[("attention", "flash")] = (
    *PASSES[("attention", "coopmat")][:-1],
    Pass("", 5, "IIIIIIIIIf", "", "flash"),
    # attention.key_chunk: the keys over NS ranges into the split kernel's partials (its merge)
    Pass("KEY_SPLIT", 5, "IIIIIIIIIfI", "", "flash_split"),
)


# The ops whose pipelines set_config builds (VulkanBackend._build; engine.precompile compiles
# their SPIR-V ahead), and those built once per weight type of the model.
BUILT_OPS = (
    "rms_norm",
    "add",
    "swiglu",
    "rope",
    "kv_write",
    "attention",
    "argmax",
    "quantize_act",
    "embedding",
    "matmul_decode",
    "matmul_prefill",
    "delta_net",
    "sigmoid_mul",
    "cols",
    "ssm_conv",
    "ssm_gates",
    "router_topk",
    "moe_experts",
)
WEIGHTED_OPS = ("embedding", "matmul_decode", "matmul_prefill", "moe_experts")


def pass_keys(op: str, variant: str) -> tuple[str, ...]:
    """The pipeline key of each pass of a variant, in the order programs() returns them."""
    passes = PASSES.get((op, variant))
    if passes is None:
        return (op,)
    out = []
    for i, p in enumerate(Pass(*p) for p in passes):
        suffix = p.key or ("merge" if i else "")
        out.append(f"{op}.{suffix}" if suffix else op)
    return tuple(out)


def knob_defines(variant: Variant, choice: OpChoice) -> tuple[str, ...]:
    """Defines of the knobs bound to DEFINE (a bool knob adds its macro when true)."""
    out = []
    for p in variant.bound(DEFINE):
        value = choice[p.name]
        if isinstance(value, bool):
            if value:
                out.append(str(p.binding.target))
        else:
            out.append(f"{p.binding.target}={value}")
    return tuple(out)


def specialization(op: str, choice: OpChoice) -> tuple[tuple[tuple[int, int], ...], int]:
    """((constant_id, value) of each knob bound to SPEC, required subgroup size or 0) of op's
    chosen variant: what its pipelines are created with (a constant not given keeps the
    shader's default, which a variant that does not bind it does not read)."""
    v = REGISTRY.op("vulkan", op).variant(choice.variant)
    spec = tuple(sorted((int(p.binding.target), int(choice[p.name])) for p in v.bound(SPEC)))
    return spec, next((int(choice[p.name]) for p in v.bound(SUBGROUP)), 0)


def programs(op: str, choice: OpChoice, qtype: str = "") -> tuple[Program, ...]:
    """Every pass of op's chosen variant for weight type qtype ("" for ops without weights)."""
    v = REGISTRY.op("vulkan", op).variant(choice.variant)
    if (op, v.name) == ("matmul_decode", "mmvw"):
        # one program for every int8 type (the type is a push constant per matrix); the
        # block DMMV's build for the rest (its constants 0-3 mean the same)
        if qtype in MMVW_TYPES:
            return (Program("mmvw", knob_defines(v, choice), 12, MMVW_PUSH),)
        return (Program("matmul_decode", ("VARIANT_BLOCK", f"QTYPE_{qtype}"), 3, "IIIII"),)
    shader = Path(v.source).stem
    defines = (*v.defines, *((f"QTYPE_{qtype}",) if qtype else ()), *knob_defines(v, choice))
    passes = PASSES.get((op, v.name))
    if passes is None:
        n, push = IO[op]
        return (Program(shader, defines, n, push),)
    out = []
    for p in (Pass(*p) for p in passes):
        ds = (*defines, *p.define.split())  # a pass may add several defines
        if (op, v.name) == ("matmul_prefill", "resident"):
            # each program takes only the defines it reads: the fp16 GEMM no weight type, the
            # two conversions no tile knob (fewer SPIR-V builds and driver compiles)
            keep = ("QTYPE_", "PASS_") if p.define == "PASS_W16" else ("PASS_",)
            if not p.define:
                keep = tuple(x.split("=")[0] for x in knob_defines(v, choice)) or ("-",)
            ds = tuple(d for d in ds if d.startswith(keep))
            if not p.define and "DIRECT" in ds:  # no shared tiles: their knobs do not apply
                ds = tuple(d for d in ds if not d.startswith(("BUFFERS", "SMEM_", "PREFETCH")))
            elif "SMEM_PAIRS" in ds:  # with smem_halves too: refused by the registry anyway
                ds = tuple(d for d in ds if d != "SMEM_HALVES")
        if (op, v.name) == ("attention", "flash") and p.shader:
            ds = tuple(d for d in ds if d != "MATRIX_SCALE")  # the split passes' own builds
        out.append(Program(p.shader or shader, ds, p.n_bindings, p.push))
    return tuple(out)


def all_programs() -> list[Program]:
    """Every program any config may ask for: each variant of each op, each weight type it
    decodes, each combination of its define-bound knobs."""
    out = []
    for op in REGISTRY.ops("vulkan"):
        if op.name not in IO and not any((op.name, v.name) in PASSES for v in op.variants):
            continue  # host-only ops (prefill schedule, submit)
        for v in op.variants:
            qtypes = sorted(v.quant_types) if v.quant_types is not None else [""]
            knobs = v.bound(DEFINE)
            for values in itertools.product(*(p.choices for p in knobs)):
                given = {f"{op.name}.variant": v.name}
                given |= {f"{op.name}.{p.name}": x for p, x in zip(knobs, values, strict=True)}
                choice = _choice(op.name, v, given)
                for q in qtypes:
                    out += programs(op.name, choice, q)
    return out


def _choice(op: str, v: Variant, flat: dict) -> OpChoice:
    params = {p.name: flat.get(f"{op}.{p.name}", p.default) for p in v.params}
    return OpChoice(v.name, tuple(sorted(params.items())))


def all_builds() -> list[tuple[str, tuple[str, ...]]]:
    """Every (shader, defines) SPIR-V build the backend may request."""
    return sorted({(p.shader, p.defines) for p in all_programs()})
