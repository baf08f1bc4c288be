"""The registry binds knobs to kernels: every knob says how it reaches its kernel, the shaders'
defaults are the registry's, and the backends' mapping (a loop over the bindings) builds what
the hand-written mapping it replaced built, for every value of every knob, and each knob at its
extremes changes exactly the build (macro, constant, subgroup size) its binding names and
nothing else, so a define made by hand for a launch or host knob fails here. No GPU: the Vulkan
mapping is engine.backends.vulkan.kernels, the CUDA one engine.backends.cuda.kernels."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.backends.cuda import kernels as cuda_k
from engine.backends.vulkan import kernels as vk_k
from engine.tuning import REGISTRY, TuningConfig
from engine.tuning.registry import DEFINE, HOST, PUSH, SCHEDULE, SPEC, SUBGROUP

SHADERS = Path(__file__).resolve().parents[3] / "shaders"
KINDS_OF = {  # which bindings each backend has a mechanism for
    "numpy": {SCHEDULE},
    "vulkan": {SPEC, DEFINE, PUSH, SUBGROUP, SCHEDULE},
    "cuda": {DEFINE, PUSH, SCHEDULE},
}


def each_knob_value(backend: str) -> Iterator[TuningConfig]:
    """Every variant at its defaults, and every value of every knob of it, one at a time."""
    base = TuningConfig.default(backend)
    for op in REGISTRY.ops(backend):
        for v in op.variants:
            at = base.replace(**{f"{op.name}.variant": v.name})
            yield at
            for p in v.params:
                for c in p.choices:
                    if c != p.default:
                        yield at.replace(**{f"{op.name}.{p.name}": c})


@pytest.mark.parametrize("backend", sorted(KINDS_OF))
def test_every_knob_declares_how_it_reaches_its_kernel(backend):
    for op in REGISTRY.ops(backend):
        for v in op.variants:
            where = f"{backend}.{op.name}.{v.name}"
            for p in v.params:
                assert p.binding is not None, f"{where}.{p.name} has no binding"
                assert p.binding.kind in KINDS_OF[backend], f"{where}.{p.name}: {p.binding}"
            for kind in (SPEC, DEFINE):
                targets = [p.binding.target for p in v.bound(kind)]
                assert len(targets) == len(set(targets)), f"{where}: two knobs on one {kind}"
    assert REGISTRY.op(backend, "prefill").default.param("chunk_tokens").binding == HOST


def define_names(backend: str) -> list[tuple[str, str]]:
    """(where, macro) of every knob and derived value of backend bound to a DEFINE whose macro
    is not its name upper-cased."""
    return [
        (f"{backend}.{op.name}.{v.name}.{p.name}", str(p.binding.target))
        for op in REGISTRY.ops(backend)
        for v in op.variants
        for p in (*v.params, *v.derived)
        if p.binding is not None and p.binding.kind == DEFINE
        and p.binding.target != p.name.upper()
    ]  # fmt: skip


@pytest.mark.parametrize("backend", sorted(KINDS_OF))
def test_every_define_is_its_knobs_name(backend):
    """One name from experiment file to shader (issue 29): matmul_decode.split_k is SPLIT_K in
    the kernel, a derived rows_per_block ROWS_PER_BLOCK."""
    assert define_names(backend) == []


# --- Vulkan ---------------------------------------------------------------------------------
_CONST = re.compile(r"layout\s*\(\s*constant_id\s*=\s*(\d+)\s*\)\s*const\s+\w+\s+(\w+)\s*=\s*(\w+)")


def spec_defaults(program: vk_k.Program) -> dict[int, int]:
    """constant_id -> default of a program's specialization constants, read from its shader as
    glslc preprocesses it with the program's defines (defaults may differ per variant)."""
    src = SHADERS / "vulkan" / f"{program.shader}.comp"
    cmd = ["glslc", "-E", f"-I{src.parent}", *(f"-D{d}" for d in program.defines), str(src)]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return {int(i): int(v) for i, _, v in _CONST.findall(text)}


def _vulkan_variants() -> list:
    return [
        pytest.param(op.name, v, id=f"{op.name}.{v.name}")
        for op in REGISTRY.ops("vulkan")
        for v in op.variants
        if v.bound(SPEC)
    ]


@pytest.mark.parametrize("op,variant", _vulkan_variants())
def test_vulkan_shader_defaults_are_the_registry_defaults(op, variant):
    choice = TuningConfig.default("vulkan").replace(**{f"{op}.variant": variant.name}).op(op)
    own = Path(variant.source).stem
    # every distinct program over the weight types: matmul_decode.mmvw runs the types it has no
    # int8 decoder for through the block DMMV's build, which reads constants 0-3 only
    programs = {
        (p.shader, p.defines): p
        for q in (sorted(variant.quant_types) if variant.quant_types else [""])
        for p in vk_k.programs(op, choice, q)
    }
    for program in programs.values():
        found = spec_defaults(program)
        for p in variant.bound(SPEC):
            cid = int(p.binding.target)
            if program.shader != own and cid not in found:
                continue
            assert cid in found, f"{program.shader} has no constant_id {cid} for {p.name}"
            assert found[cid] == p.default, (
                f"{program.shader} {list(program.defines)}: constant {cid} defaults to "
                f"{found[cid]}, the registry's {op}.{variant.name}.{p.name} to {p.default}"
            )


def _old_vulkan_spec(cfg: TuningConfig, op: str) -> tuple[tuple[int, ...], int]:
    """The hand-written mapping VulkanBackend._programs had before the bindings (HEAD 03e9fcf),
    with prefill.max_cols now matmul_prefill.max_cols."""
    c = cfg.op(op)
    wg = int(c.as_dict().get("wg_size", 0))
    if op == "matmul_decode":
        # mmvw (added with the bindings) maps its knobs as block does
        tpr = int(c["threads_per_row"]) if c.variant in ("shmem", "block", "mmvw") else 1
        rpt = int(c["rows_per_thread"]) if c.variant in ("block", "mmvw") else 1
        sg = int(c["subgroup_size"]) if c.variant in ("subgroup", "block", "mmvw") else 0
        if c.variant == "mmvw":
            return (wg, int(c["rows_per_wg"]), tpr, rpt, int(c["unroll"])), sg
        return (wg, int(c["rows_per_wg"]), tpr, rpt), sg
    if op == "matmul_prefill":
        if c.variant == "tiled":
            return (int(c["tile_m"]), int(c["tile_n"])), 0
        # coopmat and resident: added after the bindings, tile and subgroup-tile sizes
        if c.variant in ("coopmat", "resident"):
            tiles = tuple(int(c[k]) for k in ("tile_m", "tile_n", "warp_m", "warp_n"))
            return tiles, int(c["subgroup_size"])
        rows = int(c["rows_per_wg"]) if c.variant == "kpar" else 1
        sg = int(c["subgroup_size"]) if c.variant == "kpar" else 0
        return (wg, rows, int(c["max_cols"])), sg
    if op == "attention" and c.variant in ("split", "coopmat", "flash"):  # split's knobs
        return (wg, int(c["key_threads"])), 0
    if op == "delta_net":  # the hybrids' kernels (issue 15) mapped the same way by hand
        base = (wg, int(c["state_transposed"]), int(c["max_dk"]))
        if c.variant == "chunked":
            return (*base, int(c["chunk"]), int(c["scan_wg"])), 0
        return base, 0
    if op == "moe_experts":
        base = (wg, int(c["rows_per_wg"]), int(c["threads_per_row"]))
        return (*base, int(c["tile_pairs"])) if c.variant == "grouped" else base, 0
    return (wg,), 0


# Constants the old mapping set that the variant's code does not read (the new mapping leaves
# them at the shader default): subgroup ignores THREADS_PER_ROW and ROWS_PER_THREAD, shmem
# ROWS_PER_THREAD, serial ROWS_PER_WG.
UNREAD = {
    ("matmul_decode", "subgroup"): {2, 3},
    ("matmul_decode", "shmem"): {3},
    ("matmul_prefill", "serial"): {1},
}


def test_vulkan_mapping_is_the_old_one_for_every_knob_value():
    ops = [o.name for o in REGISTRY.ops("vulkan") if o.name not in ("prefill", "submit")]
    n = 0
    for cfg in each_knob_value("vulkan"):
        for op in ops:
            c = cfg.op(op)
            spec, sg = vk_k.specialization(op, c)
            old, old_sg = _old_vulkan_spec(cfg, op)
            unread = UNREAD.get((op, c.variant), set())
            want = {i: x for i, x in enumerate(old) if i not in unread}
            assert dict(spec) == want and sg == old_sg, (op, c)
            n += 1
    assert n > 1000


def test_vulkan_unread_constants_are_unread():
    """UNREAD above is true of the shaders: the constant's name does not occur in the code the
    variant's defines select."""
    names = {"matmul_decode": ("WG_SIZE", "ROWS_PER_WG", "THREADS_PER_ROW", "ROWS_PER_THREAD")}
    names["matmul_prefill"] = ("WG_SIZE", "ROWS_PER_WG", "MAX_COLS")
    for (op, variant), ids in UNREAD.items():
        choice = TuningConfig.default("vulkan").replace(**{f"{op}.variant": variant}).op(op)
        (program,) = vk_k.programs(op, choice, "Q4_K")
        src = SHADERS / "vulkan" / f"{program.shader}.comp"
        cmd = ["glslc", "-E", f"-I{src.parent}", *(f"-D{d}" for d in program.defines), str(src)]
        text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        body = _CONST.sub("", text)
        for i in ids:
            assert not re.search(rf"\b{names[op][i]}\b", body), (op, variant, names[op][i])


# --- CUDA -----------------------------------------------------------------------------------
_DEFAULT = re.compile(r"^#ifndef (\w+)\n#define \1 (\w+)\n#endif", re.M)
_REQUIRED = re.compile(r"^#if (!defined\(\w+\)(?:\s*\|\|\s*!defined\(\w+\))*)\n#error", re.M)


def cuda_defaults(fname: str) -> dict[str, int]:
    return {k: int(v) for k, v in _DEFAULT.findall((SHADERS / "cuda" / fname).read_text())}


def cuda_required(fname: str) -> set[str]:
    text = (SHADERS / "cuda" / fname).read_text()
    return {n for m in _REQUIRED.findall(text) for n in re.findall(r"defined\((\w+)\)", m)}


# the decode GEMVs' shared shape knobs (mmvf and mmvw): each a define of its upper-case name
_GEMV_SHAPE = ("threads_per_row", "rows_per_thread", "warps", "unroll", "wload", "min_blocks")


def _upper(op, *knobs: str) -> dict[str, int]:  # noqa: ANN001 - a config's OpConfig
    return {k.upper(): op[k] for k in knobs}


def _old_cuda_modules(cfg: TuningConfig) -> dict[str, tuple[str, dict]]:
    """CudaBackend._build before the bindings (HEAD 03e9fcf), matmul_batched.cols now
    matmul_batched.max_cols; the mmvq variant's float-weight fallback is compared apart."""
    k: dict[str, tuple[str, dict]] = {}
    dec = cfg.op("matmul_decode")
    if dec.variant == "mmvq":
        k["mmvq"] = ("mmvq.cu", {"WARPS": dec["warps"], "ROWS_PER_BLOCK": dec["rows_per_block"]})
    elif dec.variant == "mmvf":  # issue 14's float decode GEMV: its knobs map one to one
        k["mmvf"] = ("mmvf.cu", _upper(dec, *_GEMV_SHAPE, "xsmem", "q4k_pair"))
    elif dec.variant == "mmvw":  # added with the bindings: its knobs map one to one
        k["mmvw"] = (
            "mmvw.cu",
            _upper(dec, *_GEMV_SHAPE, "glu_threads_per_row", "glu_unroll", "prefetch", "stage")
            | _upper(dec, "split_k", "split_min_k")  # issue 14, dec8: split-K of long rows
            | _upper(dec, "q4k_wide", "q6k_wide")  # dec8: 64-weight Q4_K / Q6_K slots
            | _upper(dec, "q4k_lean", "q4k_min_blocks")  # gemv: branch-free Q4_K scales
            | {
                # rows per block, derived once on the host since: mmvw.cu had
                # #define ROWS_PER_BLOCK (MMVW_GROUPS * ROWS_PER_THREAD),
                # MMVW_GROUPS (WARPS * 32 / THREADS_PER_ROW)
                "ROWS_PER_BLOCK": dec["warps"]
                * 32
                // dec["threads_per_row"]
                * dec["rows_per_thread"],
            },
        )
    else:
        k["decode"] = (
            "dmmv.cu",
            {
                "ROWS_PER_BLOCK": dec["rows_per_block"],
                "THREADS_PER_ROW": dec["threads_per_row"],
                "ROWS_PER_THREAD": dec["rows_per_thread"],
                "MAX_COLS": 1,
                "VEC": dec["vec"],
            },
        )
    k["q8"] = ("q8.cu", {})
    bat = cfg.op("matmul_batched")
    serial = bat.variant == "dmmv_serial"
    k["batched"] = (
        "dmmv.cu",
        {
            "ROWS_PER_BLOCK": bat["rows_per_block"],
            "THREADS_PER_ROW": 1 if serial else bat["threads_per_row"],
            "MAX_COLS": bat["max_cols"],
            "VEC": 1,
        },
    )
    pre = cfg.op("matmul_prefill")
    if pre.variant in ("mmq", "mmq8"):
        k[pre.variant] = (
            f"{pre.variant}.cu",
            {
                "TILE_M": pre["tile_m"],
                "TILE_N": pre["tile_n"],
                "WARPS_M": pre["warps_m"],
                "WARPS_N": pre["warps_n"],
            },
        )
    if pre.variant == "resident":
        k["prefill_f16"] = ("prefill_f16.cu", {})
    k["dequant"] = ("dequant.cu", {})
    k["elementwise"] = ("elementwise.cu", {})
    k["fused"] = ("decode_fused.cu", {})
    k["attn_decode"] = ("attn_decode.cu", {})  # attention_decode.gqa: launch knobs only
    k["attn_tile"] = ("attn_tile.cu", {})  # attention_decode.tile: launch knobs only
    k["attn_vec"] = ("attn_vec.cu", {})  # attention_decode.vec: launch knobs only
    k["norm_decode"] = ("norm_decode.cu", {})  # rms_norm.block: launch knobs only
    ap = cfg.op("attention_prefill")
    flash = (
        {"BLOCK_Q": ap["block_q"], "ROWS_PER_WARP": ap["rows_per_warp"]}
        if ap.variant == "flash"
        else {}
    )
    k["attention"] = ("attention.cu", flash)
    if ap.variant == "gemm":  # issue 14: its own file; attention.cu still serves decode
        k["attention_gemm"] = ("attention_gemm.cu", {})
    if ap.variant == "flash_tc":
        k["attention_tc"] = (
            "attention_tc.cu",
            {"BLOCK_Q": ap["block_q"], "BLOCK_K": ap["block_k"]},
        )
        k["attention_gemm"] = ("attention_gemm.cu", {})
    # the hybrids' kernels (issue 15), mapped by hand the same way
    k["hybrid"] = ("hybrid.cu", {})
    dn = cfg.op("delta_net")
    scan = {"WARPS": dn["warps"], "MAX_DK": dn["max_dk"],
            "STATE_TRANSPOSED": int(dn["state_transposed"]),
            "PREFETCH": dn["prefetch"]}  # fmt: skip
    if dn.variant == "chunked":  # its module holds the sequential kernel too (decode)
        k["delta_net_chunked"] = ("delta_net_chunked.cu", {**scan, "CHUNK": dn["chunk"]})
    else:
        k["delta_net"] = ("delta_net.cu", scan)
    k["dn_step"] = ("dn_step.cu", {d: scan[d] for d in ("WARPS", "MAX_DK", "STATE_TRANSPOSED")})
    if dn["step_cluster"]:  # helper dn's cluster step
        clu = {"STEP_CLUSTER": dn["step_cluster"], "STEP_LANES": dn["step_lanes"]}
        k["dn_clu"] = (
            "dn_clu.cu",
            {"MAX_DK": dn["max_dk"], "STATE_TRANSPOSED": scan["STATE_TRANSPOSED"], **clu},
        )
    me = cfg.op("moe_experts")
    if me.variant == "mmvq":  # int8 experts; float ones on moe.cu at its defaults
        k["moe_q8"] = (
            "moe_q8.cu",
            {"THREADS_PER_ROW": me["threads_per_row"], "WARPS": me["warps"]},
        )
        k["moe"] = ("moe.cu", {"ROWS_PER_BLOCK": 4, "THREADS_PER_ROW": 32, "VEC": 2})
        k["moe_dec"] = ("moe_dec.cu", k["moe"][1])  # fuse_decode's kernels: moe.cu's knobs
        return k
    dmmv = {
        "ROWS_PER_BLOCK": me["rows_per_block"],
        "THREADS_PER_ROW": me["threads_per_row"],
        "VEC": me["vec"],
    }
    k["moe"] = ("moe.cu", dmmv)  # grouped decodes (T = 1) with it
    k["moe_dec"] = ("moe_dec.cu", {**dmmv, "DEC_WIDE": me["dec_wide"], "DEC_FCVT": me["dec_fcvt"]})
    if me.variant == "grouped":
        k["moe_grouped"] = ("moe_grouped.cu", {**dmmv, "TILE_PAIRS": me["tile_pairs"]})
    if me.variant == "tc":  # its dmmv knobs reach moe.cu only (host-bound)
        k["moe_tc"] = ("moe_tc.cu", {"TILE_PAIRS": me["tile_pairs"], "BLOCK_ROWS": me["block_rows"],
                                     "Q4K_WINDOW": me["q4k_window"],
                                     "WIDE_LOADS": me["wide_loads"],
                                     "DIRECT": me["direct"]})  # fmt: skip
    return k


# What the sources defaulted to before the bindings: the value a build without the define got.
OLD_SOURCE_DEFAULTS = {
    "dmmv.cu": {
        "ROWS_PER_BLOCK": 4,
        "THREADS_PER_ROW": 32,
        "MAX_COLS": 1,
        "VEC": 1,
        "ROWS_PER_THREAD": 1,
    },
    "mmvq.cu": {"WARPS": 4, "ROWS_PER_BLOCK": 2},
    "mmq.cu": {"TILE_M": 128, "TILE_N": 128, "WARPS_M": 2, "WARPS_N": 4},
    "mmq8.cu": {"TILE_M": 128, "TILE_N": 128, "WARPS_M": 2, "WARPS_N": 4},
    "attention.cu": {"BLOCK_Q": 16, "ROWS_PER_WARP": 4},
    "moe_dec.cu": {"DEC_WIDE": 0, "DEC_FCVT": 0},
}


def test_cuda_defines_are_the_old_ones_for_every_knob_value():
    """Each module's effective defines (given ones over the source's defaults) equal the old
    mapping's for every value of every knob; the one intended change: float weights under
    matmul_decode.mmvq use dmmv at the registry's defaults, not a fixed copy of them."""
    n = 0
    for cfg in each_knob_value("cuda"):
        new = cuda_k.modules_for(cfg)
        old = _old_cuda_modules(cfg)
        if cfg.op("matmul_decode").variant in ("mmvq", "mmvw", "mmvf"):
            fname, defines = new.pop("decode")
            dmmv = REGISTRY.op("cuda", "matmul_decode").variant("dmmv")
            assert fname == "dmmv.cu" and defines == {
                "MAX_COLS": 1,
                **{str(p.binding.target): p.default for p in dmmv.bound(DEFINE)},
            }
        new.pop("matmul_prefill", None)
        if cfg.op("matmul_prefill").variant == "staged":
            assert new.get("dequant") == ("dequant.cu", {})
        assert set(new) == set(old), cfg.diff(TuningConfig.default("cuda"))
        for key, (fname, defines) in new.items():
            assert fname == old[key][0]
            src = {**OLD_SOURCE_DEFAULTS.get(fname, {}), **cuda_defaults(fname)}
            assert {**src, **defines} == {**OLD_SOURCE_DEFAULTS.get(fname, {}), **old[key][1]}, (
                key,
                cfg.diff(TuningConfig.default("cuda")),
            )
            n += 1
    assert n > 500


def test_cuda_builds_give_every_required_define_and_sources_default_to_the_registry():
    """A source either requires a define (#error without it) or defaults it to the registry's
    default of every variant that builds it; every define a build passes is read."""
    texts: dict[str, str] = {}  # headers inlined: DEC_FCVT is read in qwide.cuh
    for cfg in each_knob_value("cuda"):
        for fname, defines in cuda_k.modules_for(cfg).values():
            assert cuda_required(fname) <= set(defines), (fname, defines)
            text = texts.get(fname) or texts.setdefault(fname, cuda_k.source(fname))
            for name in defines:
                assert len(re.findall(rf"\b{name}\b", text)) >= 3, f"{fname} does not read {name}"
    for op in REGISTRY.ops("cuda"):
        for v in op.variants:
            if not v.source.endswith(".cu"):
                continue  # host code: the schedule
            for build in v.builds():  # its own source and each helper its knobs shape
                fname = Path(build).name
                defaults = cuda_defaults(fname)
                for p in v.bound(DEFINE):
                    if not v.reaches(p, build):
                        continue
                    name = str(p.binding.target)
                    assert name in defaults or name in cuda_required(fname), (fname, name)
                    if name in defaults:
                        assert defaults[name] == p.default, (fname, name, op.name, v.name)


# --- each knob at its extremes changes exactly what its binding declares --------------------
def _extremes(p) -> tuple:  # noqa: ANN001 - registry Param
    return (min(p.choices), max(p.choices)) if p.is_numeric else tuple(p.choices)


def _at(backend: str, op: str, variant: str, **knobs) -> TuningConfig:  # noqa: ANN003
    flat = {f"{op}.variant": variant, **{f"{op}.{k}": v for k, v in knobs.items()}}
    return TuningConfig.default(backend).replace(**flat)


def _cuda_base(op: str, v) -> dict:  # noqa: ANN001 - registry Variant
    """Knob values that build every helper module the variant's knobs reach: a gated file
    (kernels._BUILT_WHEN) has its gate knob at its largest value."""
    out = {}
    for p in v.bound(DEFINE):
        if str(p.binding.target) in cuda_k._BUILT_WHEN.values():
            out[p.name] = max(p.choices)
    return out


def _cuda_expected(base: dict, op: str, v, p, value, cfg: TuningConfig) -> dict:  # noqa: ANN001
    """modules_for(base config) with p at value, as its declaration says: p's macro set in
    each build it reaches (a gated build appears or goes with its gate), the variant's derived
    defines recomputed; nothing else."""
    out = {k: (f, dict(d)) for k, (f, d) in base.items()}
    if p.binding.kind != DEFINE:
        return out
    view = cfg.knobs(op)
    for build in v.builds():
        fname = Path(build).name
        if not v.reaches(p, build):
            continue
        key = cuda_k._KEYS.get((op, fname), Path(fname).stem)
        gate = cuda_k._BUILT_WHEN.get(fname)
        if gate == p.binding.target and not int(value):
            out.pop(key, None)
            continue
        defines = out[key][1] if key in out else cuda_k.variant_defines(v, cfg.op(op), build)
        defines[str(p.binding.target)] = int(value)
        for d in v.derived:
            if d.binding is not None and v.reaches(d, build):
                defines[str(d.binding.target)] = int(getattr(view, d.name))
        out[key] = (fname, defines)
    return out


def _cuda_cases() -> list:
    return [
        pytest.param(op.name, v, id=f"{op.name}.{v.name}")
        for op in REGISTRY.ops("cuda")
        for v in op.variants
        if v.params
    ]


@pytest.mark.parametrize("op,variant", _cuda_cases())
def test_cuda_knob_extremes_change_only_their_declared_build(op, variant):
    """Each knob of the variant at its smallest and largest value (each value of a non-numeric
    one): a DEFINE knob changes its macro in the builds it names and nothing else; a launch or
    host knob changes no build (a hand-made define of one would)."""
    fixed = _cuda_base(op, variant)
    base_cfg = _at("cuda", op, variant.name, **fixed)
    base = cuda_k.modules_for(base_cfg)
    for p in variant.params:
        for value in _extremes(p):
            cfg = _at("cuda", op, variant.name, **{**fixed, p.name: value})
            got = cuda_k.modules_for(cfg)
            want = _cuda_expected(base, op, variant, p, value, cfg)
            assert got == want, f"cuda.{op}.{variant.name}.{p.name}={value!r} ({p.binding})"


def _vk_builds(op: str, cfg: TuningConfig, qtypes: list[str]) -> dict:
    """(weight type, pass index) -> (shader, defines) of op's programs, and the spec constants
    and required subgroup size its pipelines get."""
    c = cfg.op(op)
    progs = {
        (q, i): (p.shader, frozenset(p.defines))
        for q in qtypes
        for i, p in enumerate(vk_k.programs(op, c, q))
    }
    spec, sg = vk_k.specialization(op, c)
    return {"programs": progs, "spec": dict(spec), "subgroup": sg}


def _macro(d: str) -> str:
    return d.partition("=")[0]


# A knob that turns others' defines off where they do not apply (kernels.programs: the resident
# GEMM's direct fragments have no shared tiles; smem_pairs wins over smem_halves).
VK_DROPS = {
    ("matmul_prefill", "resident", "direct"): {"BUFFERS", "SMEM_PAIRS", "SMEM_HALVES", "PREFETCH"},
    ("matmul_prefill", "resident", "smem_pairs"): {"SMEM_HALVES"},
}


def _vulkan_cases() -> list:
    return [
        pytest.param(op.name, v, id=f"{op.name}.{v.name}")
        for op in REGISTRY.ops("vulkan")
        if op.name in vk_k.BUILT_OPS
        for v in op.variants
        if v.params
    ]


@pytest.mark.parametrize("op,variant", _vulkan_cases())
def test_vulkan_knob_extremes_change_only_their_declared_build(op, variant):
    """Each knob at its extremes: a SPEC knob changes only its constant, a SUBGROUP knob only
    the required subgroup size, a DEFINE knob only its macro in the programs (VK_DROPS: the
    defines it turns off), a launch or host knob none of them."""
    qtypes = sorted(variant.quant_types) if variant.quant_types else [""]
    base_cfg = _at("vulkan", op, variant.name)
    base = _vk_builds(op, base_cfg, qtypes)
    for p in variant.params:
        kind, where = p.binding.kind, f"vulkan.{op}.{variant.name}.{p.name}"
        for value in _extremes(p):
            got = _vk_builds(op, _at("vulkan", op, variant.name, **{p.name: value}), qtypes)
            want_spec = dict(base["spec"])
            if kind == SPEC:
                want_spec[int(p.binding.target)] = int(value)
            assert got["spec"] == want_spec, f"{where}={value!r}: spec constants"
            want_sg = int(value) if kind == SUBGROUP else base["subgroup"]
            assert got["subgroup"] == want_sg, f"{where}={value!r}: subgroup size"
            if kind != DEFINE:
                assert got["programs"] == base["programs"], f"{where}={value!r}: programs"
                continue
            allowed = {str(p.binding.target)} | VK_DROPS.get((op, variant.name, p.name), set())
            assert got["programs"].keys() == base["programs"].keys(), where
            seen = set()
            for key, (shader, defines) in got["programs"].items():
                b_shader, b_defines = base["programs"][key]
                changed = {_macro(d) for d in defines ^ b_defines}
                assert shader == b_shader and changed <= allowed, (where, value, key, changed)
                seen |= changed
            if value != p.default:  # and it does reach a program
                assert str(p.binding.target) in seen, f"{where}={value!r} changes no program"


def test_edge_knobs_are_declared_and_match_by_name():
    """validate's edge prompts read every knob whose name the registry declares edge: the old
    hand list (less 'cols', which no knob is named), and no knob of such a name undeclared."""
    old = {"max_cols", "chunk_tokens", "gemm_min_t", "cols", "tile_n", "block_q"}
    named = {
        p.name
        for b in REGISTRY.backends()
        for op in REGISTRY.ops(b)
        for v in op.variants
        for p in v.params
    }
    assert set(REGISTRY.edge_knobs()) == old & named
    for b in REGISTRY.backends():
        for op in REGISTRY.ops(b):
            for v in op.variants:
                for p in v.params:
                    if p.name in REGISTRY.edge_knobs():
                        assert p.edge and p.is_numeric, f"{b}.{op.name}.{v.name}.{p.name}"
