"""matmul_prefill.resident on Vulkan (shaders/vulkan/matmul_f16.comp, engine/backends/vulkan/
resident.py): fp16 weight copies made once, a cooperative-matrix GEMM with no dequant in its
k-loop.

Host tests (no device): the three programs build with the pinned glslang and validate; the
registry admits the variant only on a cooperative-matrix device and with one subgroup tile per
subgroup; lavapipe refuses it through the constraint path; the fp16 copy counts in a weight's
bytes. GPU tests (marked gpu): every knob sample x weight type on ragged shapes against NumPy,
row ranges, memory_report, the backend contract, and the planted W16_GROUP bug that validate
must reject.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from engine.backends.vulkan import spirv
from engine.backends.vulkan.kernels import all_builds
from engine.backends.vulkan.resident import kpad
from engine.errors import ConfigError
from engine.tuning import TuningConfig
from engine.tuning.variants.vulkan import QUANT_TYPES
from tests.backend_contract import ConfiguredContract
from tests.engine.backends.vulkan.test_vulkan_coopmat import (
    CAPS,
    COOPMAT_SHAPE,
    capabilities,
    h200_like,
)
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    allowed_config,
    assert_matmuls_on_the_default_config,
    coopmat_fixture,
    half_ref,
    make_backend,
    nmse,
    qtensor,
)
from tests.op_cases import dense, k_for

RESIDENT = {"matmul_prefill.variant": "resident"}
MP_SPLIT = "matmul_prefill.split_k"


# --- host -----------------------------------------------------------------------------------------
def test_resident_programs_build_and_validate(tmp_path):
    builds = [b for b in all_builds() if b[0] == "matmul_f16"]
    passes = {next((d for d in ds if d.startswith("PASS_")), "") for _, ds in builds}
    assert passes == {"", "PASS_W16", "PASS_X16", "PASS_KSUM"}
    assert spirv.compiler_for("matmul_f16")[0] == "glslangValidator"
    tools = Path(sys.executable).parent
    # one GEMM build per define-knob combination (bk 3 x buffers 2 x shared element type 3 x
    # threads 3 x mma_n 2 x prefetch 2, and direct: bk 3 x threads 3 x mma_n 2; each x
    # store_unrolled 2; no weight type), one PASS_W16 per type, one PASS_X16, one PASS_KSUM
    assert len(builds) == 2 * (3 * 2 * 3 * 3 * 2 * 2 + 3 * 3 * 2) + len(QUANT_TYPES) + 2
    for defines in (
        ("BK=32", "MMA_N=16", "BUFFERS=2", "PREFETCH=1", "THREADS=256"),
        ("BK=32", "MMA_N=16", "BUFFERS=2", "PREFETCH=2", "STORE_UNROLLED", "THREADS=256"),
        ("BK=64", "MMA_N=16", "BUFFERS=1", "SMEM_PAIRS", "PREFETCH=1", "THREADS=256"),
        ("BK=16", "MMA_N=8", "BUFFERS=2", "PREFETCH=1", "THREADS=128"),
        ("BK=32", "MMA_N=16", "BUFFERS=2", "PREFETCH=1", "THREADS=512"),
        ("BK=32", "MMA_N=16", "BUFFERS=2", "SMEM_HALVES", "PREFETCH=1", "THREADS=256"),
        ("BK=32", "DIRECT", "MMA_N=16", "THREADS=128"),
        ("BK=32", "MMA_N=16", "BUFFERS=2", "STORE_UNROLLED", "PREFETCH=1", "THREADS=256"),
        ("BK=32", "DIRECT", "MMA_N=16", "STORE_UNROLLED", "THREADS=128"),
        ("QTYPE_Q4_K", "PASS_W16"),
        ("PASS_X16",),
    ):
        assert ("matmul_f16", tuple(sorted(defines))) in {(s, tuple(sorted(d))) for s, d in builds}
        code = spirv.compile_spirv("matmul_f16", defines, tmp_path)
        if "PASS_" not in " ".join(defines):
            assert set(CAPS.values()) <= capabilities(code)
        path = tmp_path / "m.spv"
        path.write_bytes(code)
        val = subprocess.run(
            [tools / "spirv-val", "--target-env", "vulkan1.3", path], capture_output=True, text=True
        )
        assert val.returncode == 0, (defines, val.stderr)


def resident_problems(dev, **knobs: object) -> list[str]:  # noqa: ANN001
    flat = RESIDENT | {f"matmul_prefill.{k}": v for k, v in knobs.items()}
    cfg = TuningConfig.default("vulkan").replace(**flat)
    return [p for p in cfg.problems(dev) if p.startswith("matmul_prefill.")]


def test_registry_resident_needs_coopmat_and_one_tile_per_subgroup():
    assert TuningConfig.default("vulkan").replace(**RESIDENT).problems(None) == []
    assert resident_problems(h200_like()) == []  # 2 x 4 tiles x 32 lanes
    (p,) = resident_problems(h200_like(cooperative_matrix=False, coopmat_shapes=[]))
    assert "VK_KHR_cooperative_matrix" in p
    assert resident_problems(h200_like(), warp_n=64)  # 4 tiles x 32 lanes: half the threads idle
    assert resident_problems(h200_like(), tile_n=256, warp_n=64, buffers=1) == []
    wave64 = h200_like(min_subgroup_size=32, max_subgroup_size=64)
    assert resident_problems(wave64)  # the device picks 32 or 64: it must be told
    assert resident_problems(wave64, subgroup_size=32) == []
    assert resident_problems(wave64, subgroup_size=64) != []  # 8 tiles x 64 lanes
    assert resident_problems(wave64, subgroup_size=64, warp_n=64) == []
    # shared memory: 2 x (64 + 8) x (256 + 128) halves = 108 KiB > 48 KiB
    assert resident_problems(h200_like(), bk=64, tile_m=256, warp_m=64, warp_n=64)
    assert resident_problems(h200_like(), bk=64, buffers=1) == []


def test_registry_resident_threads_and_bk16():
    """threads: one subgroup tile per subgroup of that many threads, and every thread loads
    whole 16-byte runs of both tiles; the result slots (1 KiB per wave32 subgroup) count in
    shared memory."""
    h = h200_like()
    # llama.cpp's coopmat shape: 128 threads, four 64 x 64 tiles
    assert resident_problems(h, threads=128, warp_m=64, warp_n=64) == []
    assert resident_problems(h, threads=128)  # 8 tiles of 32 lanes need 256 threads
    # 256 x 128 double-buffered fits 48 KiB only at bk 16 (2 x 24 x 384 halves = 36 KiB)
    big = {"tile_m": 256, "warp_m": 64, "warp_n": 64}
    assert resident_problems(h, **big) != []
    assert resident_problems(h, bk=16, **big) == []
    # 512 threads: 16 tiles; bk 16 leaves 64-row tiles 128 runs for 512 threads: refused
    assert resident_problems(h, threads=512, warp_m=32, warp_n=32) == []
    assert resident_problems(h, threads=512, tile_m=64, tile_n=64, warp_m=16, warp_n=16, bk=16)
    wave64 = h200_like(min_subgroup_size=32, max_subgroup_size=64)
    assert resident_problems(wave64, subgroup_size=64, threads=128, tile_n=64, warp_n=64) == []
    assert resident_problems(None, threads=128, warp_m=64, warp_n=64) == []
    assert resident_problems(None, threads=128, warp_m=16, warp_n=16)  # 64 tiles of 2 lanes
    assert resident_problems(h, smem_pairs=True, smem_halves=True)
    # direct: no shared tiles, so 256 x 128 at bk 64 fits (only the result slots count)
    assert resident_problems(h, direct=True, tile_m=256, warp_m=64, warp_n=64, bk=64) == []
    # mma_n 8 (16x8x16) only where the device lists that shape
    assert resident_problems(h, mma_n=8) == []  # h200_like lists it
    (p,) = resident_problems(h200_like(coopmat_shapes=[COOPMAT_SHAPE]), mma_n=8)
    assert "16x8x16" in p


def test_lavapipe_refuses_resident_through_the_constraint():
    be = make_backend()
    try:
        dev = be.device_info()
        if dev.extra.get("cooperative_matrix"):
            pytest.skip(f"{dev.name} has cooperative matrices (the GPU tests cover it)")
        with pytest.raises(ConfigError, match="VK_KHR_cooperative_matrix"):
            be.set_config(TuningConfig.default("vulkan").replace(**RESIDENT))
        assert_matmuls_on_the_default_config(be)
    finally:
        be.close()


def test_fp16_copy_counts_in_the_weight_bytes():
    from engine.backends.vulkan.backend import VkWeight

    def lease(n: int) -> SimpleNamespace:
        return SimpleNamespace(buf=SimpleNamespace(size=n))

    w = VkWeight("w", "Q4_K", (70, 300), 100, parts=[(lease(7000), 0, 70)])
    assert w.nbytes == 7000
    w.f16 = [(lease(2 * 40 * kpad(300)), 0, 40), (lease(2 * 30 * kpad(300)), 40, 30)]
    assert w.nbytes == 7000 + 2 * 70 * 320
    assert (kpad(1), kpad(64), kpad(65), kpad(3584)) == (64, 64, 128, 3584)


def test_memory_report_counts_and_drops_the_fp16_copy():
    """On any Vulkan device (lavapipe in CI): an fp16 copy attached to a weight counts in
    memory_report's weight bytes, and setting a config without resident drops it."""
    be = make_backend()
    try:
        w = qtensor(np.random.default_rng(0), (40, 256), "Q4_K")
        wt = be.load_weight(w)
        before = be.memory_report().weight_bytes
        lease = be.alloc.new(2 * 40 * kpad(256), pooled=False)  # what resident_f16 makes
        wt.f16 = [(lease, 0, 40)]
        del lease
        assert be.memory_report().weight_bytes == before + wt.f16[0][0].buf.size
        be.set_config(TuningConfig.default("vulkan"))
        assert wt.f16 is None and be.memory_report().weight_bytes == before
    finally:
        be.close()


# --- GPU ------------------------------------------------------------------------------------------
rb = coopmat_fixture("rb")


KNOBS = [
    {},
    {"buffers": 1},
    {"bk": 64, "buffers": 1},
    {"tile_m": 64, "tile_n": 128, "warp_m": 32, "warp_n": 32},
    {"tile_m": 128, "tile_n": 64, "warp_m": 32, "warp_n": 32},
    {"tile_m": 256, "tile_n": 128, "warp_m": 64, "warp_n": 64, "buffers": 1},
    {"tile_m": 64, "tile_n": 64, "warp_m": 16, "warp_n": 32},
    {"tile_m": 128, "tile_n": 256, "warp_m": 64, "warp_n": 64, "buffers": 1},
    {"subgroup_size": 32},
    {"fill_groups": 512},  # every ragged case below runs the 64 x 64 pipeline
    {"smem_pairs": True},
    {"smem_pairs": True, "bk": 64, "buffers": 1, "tile_m": 64, "warp_m": 32, "warp_n": 32},
    {"subgroup_size": 64, "warp_n": 64},  # wave64 (RDNA): 4 tiles x 64 lanes
    {"subgroup_size": 64, "tile_m": 64, "tile_n": 64, "warp_m": 32, "warp_n": 32},
    {"threads": 128, "warp_m": 64, "warp_n": 64},  # llama.cpp's coopmat shape
    {"threads": 128, "warp_m": 64, "warp_n": 64, "bk": 16},
    {"tile_m": 256, "warp_m": 64, "warp_n": 64, "bk": 16},  # double-buffered in 36 KiB
    {"threads": 512, "warp_m": 32, "warp_n": 32},
    {"smem_halves": True},
    {"direct": True, "threads": 128, "warp_n": 64},  # pad rows read, never stored
    {"direct": True, "tile_m": 64, "tile_n": 64, "warp_m": 32, "warp_n": 32, "threads": 128},
    {"mma_n": 8},  # 16x8x16: half-row result slots on the bounded path
    {"mma_n": 8, "threads": 128, "warp_m": 64, "warp_n": 64, "bk": 16},
    {"threads": 128, "subgroup_size": 64, "tile_n": 64, "warp_n": 64},  # wave64: 2 tiles
    # the bounded store with a fixed trip count (the default): wave32, wave64 (one round),
    # direct, 16x8x16; and the lane loop bounded by the subgroup size
    {"store_unrolled": False},
    {"store_unrolled": True, "subgroup_size": 32},
    {"store_unrolled": True, "subgroup_size": 64, "warp_n": 64},
    {"store_unrolled": True, "direct": True, "threads": 128, "warp_n": 64},
    {"store_unrolled": True, "mma_n": 8},
    {"store_unrolled": True, "threads": 128, "warp_m": 64, "warp_n": 64},
]


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "F16", "Q8_0", "F32"])
def test_resident_knobs_on_ragged_shapes(rb, knobs, qtype):
    # fill_groups 0: the tile knobs themselves (these small grids would all take 64 x 64)
    flat = RESIDENT | {"matmul_prefill.fill_groups": 0}
    flat |= {f"matmul_prefill.{k}": v for k, v in knobs.items()}
    rb.set_config(allowed_config(rb, flat))
    rng = np.random.default_rng(len(qtype))
    for T, n, blocks in ((2, 33, 1), (41, 19, 2), (130, 300, 3), (513, 70, 1), (128, 256, 2)):
        w = qtensor(rng, (n, k_for(qtype, blocks)), qtype)
        x = rng.standard_normal((T + 1, w.shape[1])).astype(np.float32)
        xt = rb.ops.rows(rb.upload(x), 1, T + 1)  # x at an offset
        out = rb.download(rb.ops.matmul(xt, rb.load_weight(w)))
        assert out.shape == (T, n) and np.isfinite(out).all()
        wd = dense(w)
        assert nmse(x[1:].astype(np.float64) @ wd.T, out) < 5e-4
        assert nmse(half_ref(x[1:], wd), out) < 1e-9, "beyond fp16 input rounding"


@pytest.mark.gpu
def test_projections_of_one_input_share_its_fp16_form(rb):
    """q, k, v (or gate, up) of one x convert it to fp16 once (one PASS_X16 for three GEMMs),
    with the bits of GEMMs on separate copies of x; a view of other rows is converted anew."""
    rng = np.random.default_rng(11)
    ws = [qtensor(rng, (n, 512), "Q4_K") for n in (256, 64, 64)]
    x = rng.standard_normal((41, 512)).astype(np.float32)
    # no split_k: its k-range sums would add dispatches to the count
    rb.set_config(TuningConfig.default("vulkan").replace(**RESIDENT, **{MP_SPLIT: 1}))
    wt = [rb.load_weight(w) for w in ws]
    for w in wt:  # the one-time fp16 weight copies, before counting
        rb.ops.matmul(rb.upload(x), w)
    rb.synchronize()
    xt = rb.upload(x)
    rb.synchronize()
    before = rb.stats()["dispatches"]
    shared = [rb.download(rb.ops.matmul(xt, w)) for w in wt]
    assert rb.stats()["dispatches"] - before == 1 + 3
    apart = [rb.download(rb.ops.matmul(rb.upload(x), w)) for w in wt]
    for a, b in zip(shared, apart, strict=True):
        assert np.array_equal(a, b)
    view = rb.download(rb.ops.matmul(rb.ops.rows(xt, 1, 41), wt[0]))
    assert np.array_equal(view, shared[0][1:])


@pytest.mark.gpu
def test_fill_groups_small_tiles_give_the_same_bits(rb):
    """A grid under fill_groups runs the 64 x 64 pipeline: the profile shows it, and the result
    is bit-identical to the 128 x 128 tiles' (each element's k order is the same); a grid over
    it keeps the tile knobs."""
    rng = np.random.default_rng(5)
    w = qtensor(rng, (300, 512), "Q4_K")
    x = rng.standard_normal((130, 512)).astype(np.float32)
    outs, kernels = {}, {}
    for fill in (0, 512):
        rb.set_config(
            TuningConfig.default("vulkan").replace(
                **RESIDENT, **{"matmul_prefill.fill_groups": fill}
            )
        )
        wt, xt = rb.load_weight(w), rb.upload(x)
        rb.set_profiling(True)
        outs[fill] = rb.download(rb.ops.matmul(xt, wt))
        kernels[fill] = set(rb.profile().kernels)
        rb.set_profiling(False)
    assert not any(".small" in k for k in kernels[0])
    assert any(".small" in k for k in kernels[512])
    assert np.array_equal(outs[0], outs[512])
    assert nmse(half_ref(x, dense(w)), outs[512]) < 1e-9


@pytest.mark.gpu
@pytest.mark.parametrize(
    "knobs",
    [
        {"bk": 64, "tile_m": 64, "tile_n": 64, "warp_m": 32, "warp_n": 32, "threads": 128},
        {},
        {"threads": 128, "warp_n": 64, "bk": 16},
        {"subgroup_size": 64, "warp_n": 64},  # wave64 (skipped on a device fixed at 32)
    ],
    ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()) or "default",
)
def test_prefetch_two_gives_the_same_bits(rb, knobs):
    """matmul_prefill.prefetch 2 (two register sets, the step loop unrolled by two) against 1:
    bit-identical on k-step counts 1 to 5 (odd ones end in the loop's first half; bk 64 makes
    them) and ragged T, N, and within fp16 rounding of NumPy."""
    flat = RESIDENT | {"matmul_prefill.fill_groups": 0}
    flat |= {f"matmul_prefill.{k}": v for k, v in knobs.items()}
    cfgs = [TuningConfig.default("vulkan").replace(**flat, **{"matmul_prefill.prefetch": p})
            for p in (1, 2)]  # fmt: skip
    bad = cfgs[1].problems(rb.device_info())
    if bad:
        pytest.skip(f"not allowed on this device: {bad}")
    rng = np.random.default_rng(9)
    for T, n, K in ((70, 45, 37), (3, 130, 150), (129, 67, 300), (41, 200, 256)):
        w = qtensor(rng, (n, K), "F32")
        x = rng.standard_normal((T, K)).astype(np.float32)
        outs = []
        for cfg in cfgs:
            rb.set_config(cfg)
            outs.append(rb.download(rb.ops.matmul(rb.upload(x), rb.load_weight(w))))
        assert np.array_equal(outs[0], outs[1]), (T, n, K)
        assert nmse(half_ref(x, dense(w)), outs[1]) < 1e-9


@pytest.mark.gpu
@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("knobs", [{}, {"prefetch": 1}, {"bk": 64, "buffers": 1},
                                   {"direct": True, "threads": 128, "warp_n": 64}])  # fmt: skip
def test_split_k_sums_the_ranges(rb, split, knobs):
    """matmul_prefill.split_k: a grid still under fill_groups after the 64 x 64 tiles runs
    them over k-ranges (the profile shows the ksum pass), within fp16 input rounding of NumPy
    on k of 1 to 10 steps (ranges of unequal length, a one-step k not split), ragged T and N,
    x at an offset, and a weight in row ranges (each range's sum lands in its own columns)."""
    flat = RESIDENT | {"matmul_prefill.fill_groups": 512, "matmul_prefill.split_k": split}
    flat |= {f"matmul_prefill.{k}": v for k, v in knobs.items()}
    rb.set_config(allowed_config(rb, flat))
    rng = np.random.default_rng(split)
    for T, n, K, ranges in ((70, 45, 20, False), (3, 130, 150, False), (129, 67, 300, True),
                            (41, 200, 256, False)):  # fmt: skip
        w = qtensor(rng, (n, K), "F32")
        x = rng.standard_normal((T + 1, K)).astype(np.float32)
        old = rb.max_weight_bytes
        if ranges:
            rb.max_weight_bytes = 4 * K * 29 + 3  # 29 raw rows a range
        try:
            wt = rb.load_weight(w)
            rb.set_profiling(True)
            out = rb.download(rb.ops.matmul(rb.ops.rows(rb.upload(x), 1, T + 1), wt))
            kernels = set(rb.profile().kernels)
            rb.set_profiling(False)
        finally:
            rb.max_weight_bytes = old
        assert out.shape == (T, n) and np.isfinite(out).all()
        assert nmse(half_ref(x[1:], dense(w)), out) < 1e-9, (T, n, K)
        steps = kpad(K) // knobs.get("bk", 32)  # one k-step (bk 64, K 20): not split
        assert any(".ksum" in k for k in kernels) == (steps > 1), (K, kernels)


def test_prefetch_two_is_the_default_and_applies_to_double_buffers_only():
    """prefetch 2 is the measured default; with one buffer or direct loads the shader runs the
    one-ahead loop (allowed, the same program text), so older configs stay valid."""
    from engine.backends.vulkan.kernels import programs

    assert TuningConfig.default("vulkan").replace(**RESIDENT).op("matmul_prefill")["prefetch"] == 2
    assert resident_problems(h200_like(), buffers=1) == []
    assert resident_problems(h200_like(), direct=True, threads=128, warp_n=64) == []
    src = Path(spirv.__file__).resolve().parents[3] / "shaders/vulkan/matmul_f16.comp"
    assert "#if PREFETCH == 2 && BUFFERS == 2" in src.read_text()
    direct = TuningConfig.default("vulkan").replace(
        **RESIDENT, **{"matmul_prefill.direct": True, "matmul_prefill.threads": 128,
                       "matmul_prefill.warp_n": 64})  # fmt: skip
    (gemm, *_) = programs("matmul_prefill", direct.op("matmul_prefill"), "Q4_K")
    assert not any(d.startswith("PREFETCH") for d in gemm.defines)


@pytest.mark.gpu
def test_resident_row_ranges_and_memory_report(rb):
    """A weight over maxStorageBufferRange: its fp16 copy is in ranges too, each range's stores
    stay in its rows; the copy is counted in memory_report's weights and dropped with the
    variant."""
    rb.set_config(TuningConfig.default("vulkan").replace(**RESIDENT))
    rng = np.random.default_rng(3)
    w = qtensor(rng, (150, 512), "Q4_K")
    old = rb.max_weight_bytes
    rb.max_weight_bytes = 2 * kpad(512) * 7 + 5  # 7 fp16 rows per range: ragged against 16
    try:
        wt = rb.load_weight(w)
        before = rb.memory_report().weight_bytes
        x = rng.standard_normal((37, 512)).astype(np.float32)
        out = rb.download(rb.ops.matmul(rb.upload(x), wt))
    finally:
        rb.max_weight_bytes = old
    assert wt.f16 is not None and len(wt.f16) > len(wt.parts)
    assert nmse(half_ref(x, dense(w)), out) < 1e-9
    assert rb.memory_report().weight_bytes - before >= 2 * 150 * 512
    rb.set_config(TuningConfig.default("vulkan"))
    assert wt.f16 is None and rb.memory_report().weight_bytes == before


@pytest.mark.gpu
class TestResidentContract(ConfiguredContract):
    """The whole backend contract with matmul_prefill = resident (ragged T, N, K; every type)."""

    backend, fixture, flat = "vulkan", "rb", RESIDENT


W16_GROUP = "W16_GROUP"  # matmul_f16.comp: PASS_W16 stores each group of 8 halves swapped


@pytest.mark.gpu
def test_planted_w16_bug_is_rejected_by_validate(tiny_model_factory):
    """The mutation suite's check on the planted bug (its SPIR-V precompiled where no compiler
    is: tests/spirv_mutant.py); the correct variant passes the same check."""
    from tests.engine.verify.test_mutants import RAGGED
    from tests.mutants import Mutant, assert_validate_catches

    probe = make_backend()
    has = probe.device_info().extra.get("cooperative_matrix")
    probe.close()
    if not has:
        pytest.skip("no cooperative matrices: the variant is refused (tested above)")

    path = tiny_model_factory(RAGGED[0], RAGGED[1], preset=RAGGED[2])
    m = Mutant(W16_GROUP, "vulkan", "matmul_prefill", "fp16 weight copy swaps halves", RESIDENT)
    assert_validate_catches(m, path, make_backend=make_backend)
    from engine.gguf_model import open_model
    from engine.models import build_model
    from engine.verify.validate import validate
    from tests.mutants import prompts

    be = make_backend()
    try:
        model = build_model(open_model(path), be)
        cand = TuningConfig.default("vulkan").replace(**RESIDENT)
        rep = validate(model, cand, prompts(model.spec.n_vocab), steps=4)
        assert rep.passed, rep.reasons
    finally:
        be.close()


def test_experiment_searches_the_resident_knobs():
    """experiments/vulkan-prefill-tc.toml searches resident with every knob of the registry (one
    knob name from experiment file to shader)."""
    from agent.experiment import load_experiment
    from agent.space import build_space

    root = Path(__file__).resolve().parents[4]
    exp = load_experiment(root / "experiments" / "vulkan-prefill-tc.toml")
    grid = build_space("vulkan", exp.space_for("vulkan")).grid()
    assert grid["matmul_prefill.variant"] == ["tiled", "coopmat", "resident"]
    knobs = ("tile_m", "tile_n", "warp_m", "warp_n", "bk", "buffers", "fill_groups", "threads")
    for knob in (*knobs, "mma_n", "smem_halves", "direct"):
        assert len(grid[f"matmul_prefill.resident.{knob}"]) > 1, knob
