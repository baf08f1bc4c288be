"""The shader programs of the Vulkan backend: which .comp file, which defines, how many storage
buffers, and the push-constant layout. Plain data (no Vulkan import), shared by the backend and
by the SPIR-V precompiler, so the precompiled set is exactly what the backend asks for."""

from __future__ import annotations

from dataclasses import dataclass

from engine.tuning.kernels.vulkan import QUANT_TYPES


@dataclass(frozen=True)
class Program:
    shader: str  # shaders/vulkan/<shader>.comp
    defines: tuple[str, ...]
    n_bindings: int  # storage buffers at bindings 0 .. n-1 of set 0
    push: str  # struct format of the push constants (4-byte fields: I uint, f float)

    @property
    def push_size(self) -> int:
        return 4 * len(self.push)


MATMUL_DECODE_VARIANTS = {
    "block": "VARIANT_BLOCK",
    "subgroup": "VARIANT_SUBGROUP",
    "shmem": "VARIANT_SHMEM",
}
MATMUL_PREFILL_VARIANTS = {"kpar": "VARIANT_KPAR", "serial": "VARIANT_SERIAL"}


def matmul_decode(variant: str, qtype: str) -> Program:
    return Program("matmul_decode", (MATMUL_DECODE_VARIANTS[variant], f"QTYPE_{qtype}"), 3, "IIIII")


def matmul_prefill(variant: str, qtype: str, vec4: bool = False) -> Program:
    if variant == "tiled":  # its own shader: a GEMM, not a batched DMMV
        defines = (f"QTYPE_{qtype}", "VEC4") if vec4 else (f"QTYPE_{qtype}",)
        return Program("matmul_tiled", defines, 3, "IIIIIII")
    return Program(
        "matmul_prefill", (MATMUL_PREFILL_VARIANTS[variant], f"QTYPE_{qtype}"), 3, "IIIIIII"
    )


def embedding(qtype: str) -> Program:
    return Program("embedding", (f"QTYPE_{qtype}",), 3, "IIIIIII")


RMS_NORM = Program("rms_norm", (), 3, "IIIIIf")
ADD = Program("eltwise", ("OP_ADD",), 3, "IIIII")
SWIGLU = Program("eltwise", ("OP_SWIGLU",), 3, "IIIII")
ROPE = Program("rope", (), 4, "IIIIIIII")
KV_WRITE = Program("kv_write", (), 5, "IIIIIII")
ATTENTION = Program("attention", (), 5, "IIIIIIIIf")
ATTENTION_SPLIT = Program("attention_split", ("PASS_PARTIAL",), 5, "IIIIIIIIIf")
ATTENTION_MERGE = Program("attention_split", ("PASS_MERGE",), 2, "IIIII")
ARGMAX = Program("argmax", (), 2, "IIII")
DELTA_NET = Program("delta_net", (), 7, "IIIIIIIIIIIIIf")
SIGMOID_MUL = Program("eltwise", ("OP_SIGMOID_MUL",), 3, "IIIII")
SLICE = Program("slice", (), 2, "IIIIII")
SSM_CONV = Program("ssm_conv", (), 4, "IIIIIII")
SSM_GATES = Program("ssm_gates", (), 6, "IIIIIIII")
ROUTER_TOPK = Program("router_topk", (), 3, "IIIIII")
MOE_COMBINE = Program("moe_combine", (), 3, "IIIIII")


def moe_matvec(qtype: str) -> Program:
    return Program("moe_matvec", (f"QTYPE_{qtype}",), 4, "IIIIIIII")


ARGMAX_SLICES = Program("argmax", ("STAGE_SLICES",), 2, "IIIII")
ARGMAX_MERGE = Program("argmax", ("STAGE_MERGE",), 2, "IIII")

# The passes of the ops whose variants differ in programs, in dispatch order.
STAGES = {
    ("attention", "online"): (ATTENTION,),
    ("attention", "split"): (ATTENTION_SPLIT, ATTENTION_MERGE),
    ("argmax", "default"): (ARGMAX,),
    ("argmax", "two_stage"): (ARGMAX_SLICES, ARGMAX_MERGE),
}


def all_programs() -> list[Program]:
    out = [RMS_NORM, ADD, SWIGLU, ROPE, KV_WRITE]
    out += [DELTA_NET, SIGMOID_MUL, SLICE, SSM_CONV, SSM_GATES, ROUTER_TOPK, MOE_COMBINE]
    out += [p for stages in STAGES.values() for p in stages]
    for q in sorted(QUANT_TYPES):
        out += [matmul_decode(v, q) for v in MATMUL_DECODE_VARIANTS]
        out += [matmul_prefill(v, q) for v in MATMUL_PREFILL_VARIANTS]
        out += [matmul_prefill("tiled", q, vec4) for vec4 in (False, True)]
        out.append(embedding(q))
        out.append(moe_matvec(q))
    return out


def all_builds() -> list[tuple[str, tuple[str, ...]]]:
    """Every (shader, defines) SPIR-V build the backend may request."""
    return sorted({(p.shader, p.defines) for p in all_programs()})
