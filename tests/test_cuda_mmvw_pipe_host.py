"""matmul_decode.pipe (mmvw_pipe) without a GPU (tests/cuda_fake.py: every launch checked
against the kernel's signature): which kernel a launch of Q4_K / Q6_K / other matrices gets, its
grid, rows per block and K-parts (pipe_rows, pipe_split from split_min_k on), that a whole tiny
model's decode step routes its quantized GEMVs through it, that the define knobs build mmvw.cu
with them, the registry's lane-group constraint, and that mmvw.cu compiles for sm_90 at the
knobs' extremes (nvcc, when present). The kernels run in tests/test_cuda_mmvw_pipe.py (-m gpu)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.backends.cuda import kernels
from engine.backends.cuda.backend import CudaWeight
from engine.errors import ConfigError
from engine.tuning import TuningConfig
from tests.cuda_fake import FakeCuda

MMVW = {"matmul_decode.variant": "mmvw"}
ROW = {"Q4_K": 144, "Q6_K": 224, "Q8_0": 34 * 8}  # bytes per 256 weights
_PIPE = {"Q4_K": "mmvw_pipe_q4k", "Q6_K": "mmvw_pipe_q6k"}


def cfg(**knobs: int) -> TuningConfig:
    return TuningConfig.from_flat(
        "cuda", MMVW | {f"matmul_decode.{k}": v for k, v in knobs.items()}
    )


def weight(qtype: str, n: int, k: int) -> CudaWeight:
    return CudaWeight("w", qtype, (n, k), raw=np.zeros((n, k // 256 * ROW[qtype]), np.uint8))


def launch(be: FakeCuda, ws: list[CudaWeight]):  # noqa: ANN201 - a cuda_fake Launch
    k = ws[0].k
    be.launches.clear()
    x = be.upload(np.ones((1, k), np.float32))
    be._mmvw(x, [(w, be._cp.zeros((1, w.n), np.float32), None) for w in ws])
    (mm,) = [la for la in be.launches if la.kernel.startswith("mmvw")]
    return mm


@pytest.mark.parametrize(
    "types,kernel",
    [(("Q4_K",), "mmvw_pipe_q4k"), (("Q6_K",), "mmvw_pipe_q6k"),
     (("Q4_K", "Q4_K", "Q6_K"), "mmvw_pipe"), (("Q6_K", "Q4_K"), "mmvw_pipe"),
     (("Q4_K", "Q8_0"), "mmvw")],
)  # fmt: skip
def test_pipe_kernel_follows_the_launchs_types(types, kernel):
    be = FakeCuda(cfg(pipe=4, pipe_fill=0))
    ns = (100, 7, 33)[: len(types)]
    mm = launch(be, [weight(t, n, 512) for t, n in zip(types, ns, strict=True)])
    assert mm.kernel == kernel
    if kernel == "mmvw":
        return
    assert mm.block[0] == 128 and int(mm.args[5]) == 32 and int(mm.args[6]) == 1
    assert mm.grid[0] == sum(-(-n // 32) for n in ns)
    assert int(mm.args[3]) == -(-ns[0] // 32)
    assert int(mm.args[4]) == (-(-ns[1] // 32) if len(ns) > 1 else 0)
    be.set_config(cfg())  # pipe = 0: mmvw as before
    assert launch(be, [weight(t, 40, 512) for t in types]).kernel == "mmvw"


@pytest.mark.parametrize(
    "rows,split,min_k,k",
    [(32, 4, 8192, 8960), (16, 8, 256, 512), (32, 4, 8192, 1536), (4, 8, 256, 512)],
)
def test_pipe_split_divides_rows_per_block(rows, split, min_k, k):
    """Rows of K >= split_min_k: pipe_split parts over pipe_rows / pipe_split rows a block (at
    least one); shorter rows keep pipe_rows and one part (pipe_fill 0: no shrinking)."""
    be = FakeCuda(
        cfg(pipe=3, pipe_rows=rows, pipe_split=split, split_min_k=min_k, warps=8, pipe_fill=0)
    )
    mm = launch(be, [weight("Q4_K", 1536, k)])
    ks = split if k >= min_k else 1
    rpb = max(1, rows // ks)
    assert (int(mm.args[5]), int(mm.args[6])) == (rpb, ks)
    assert mm.grid[0] == -(-1536 // rpb)
    assert mm.smem == 4 * rpb * ks * 16 <= 48 * 1024  # a float per lane, part and row


@pytest.mark.parametrize(
    "fill,n,rpb",
    [(2, 2048, 7), (1, 2048, 15), (0, 2048, 32), (2, 17920, 32), (8, 1536, 1), (2, 100, 1)],
)
def test_pipe_fill_shrinks_the_rows_of_small_launches(fill, n, rpb):
    """A launch pipe_rows (32) would give fewer than pipe_fill blocks an SM (the fake H200:
    132) gets rows // (pipe_fill * SMs) rows a block (at least one); larger ones keep
    pipe_rows."""
    be = FakeCuda(cfg(pipe=4, pipe_fill=fill))
    mm = launch(be, [weight("Q4_K", n, 1536)])
    assert int(mm.args[5]) == rpb and mm.grid[0] == -(-n // rpb)
    assert fill == 0 or mm.grid[0] >= min(n, fill * 132)


def test_tiny_model_decode_routes_its_gemvs_through_pipe(tiny_model_factory, monkeypatch):
    """Every decode GEMV launch of Q4_K / Q6_K matrices (q/k/v, o, gate/up, the LM head) is an
    mmvw_pipe* launch; one with another type (the tiny model's Q5_0 / Q8_0 down) stays mmvw."""
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = FakeCuda(cfg(pipe=4, pipe_split=2, split_min_k=256))
    m = build_model(open_model(tiny_model_factory("qwen2", "q4_k_m")), be)
    prompt = list(range(5, 17))
    cache = m.new_cache(len(prompt) + 2)
    m.prefill(prompt, cache)
    seen: list[tuple[set, str]] = []
    mmvw = be._mmvw

    def spy(x, mats):  # noqa: ANN001, ANN202
        n = len(be.launches)
        mmvw(x, mats)
        (k,) = [la.kernel for la in be.launches[n:] if la.kernel.startswith("mmvw")]
        seen.append(({w.qtype for w, _, _ in mats}, k))

    monkeypatch.setattr(be, "_mmvw", spy)
    m.forward(be.upload(np.array([1], np.int32)), 1, len(prompt), cache)
    assert len(seen) == 4 * m.spec.n_layers + 1
    for types, k in seen:
        assert k == ("mmvw_pipe" if len(types) > 1 else _PIPE.get(min(types), "mmvw")), (types, k)
    assert {k for _, k in seen} >= {"mmvw_pipe_q4k", "mmvw_pipe_q6k", "mmvw_pipe", "mmvw"}


@pytest.mark.parametrize(
    "knob,macro,values",
    [
        ("pipe", "PIPE_D", (2, 6)),
        ("pipe_lanes", "PIPE_TPR", (8, 32)),
        ("pipe_wide", "PIPE_WIDE", (1,)),
    ],
)
def test_define_knobs_build_mmvw_with_them(knob, macro, values):
    assert kernels.modules_for(cfg())["mmvw"][1][macro] == cfg().op("matmul_decode")[knob]
    for v in values:
        assert kernels.modules_for(cfg(**{knob: v}))["mmvw"][1][macro] == v


def test_pipe_split_needs_a_lane_group_per_part():
    cfg(pipe=4, pipe_split=8, pipe_lanes=16, warps=4).check()  # 8 groups of 16: fits
    with pytest.raises(ConfigError, match="violates constraints"):
        cfg(pipe=4, pipe_split=8, pipe_lanes=32, warps=4).check()
    cfg(pipe=0, pipe_split=8, pipe_lanes=32, warps=4).check()  # pipe off: not read


NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" * Path("/usr/local/cuda/bin/nvcc").exists()
)


@pytest.mark.skipif(not NVCC, reason="no nvcc")
@pytest.mark.parametrize(
    "defines",
    [{"PIPE_D": 2}, {"PIPE_D": 6, "PIPE_TPR": 32, "Q4K_LEAN": 1},
     {"PIPE_D": 3, "PIPE_TPR": 8, "PIPE_WIDE": 1, "NW": 8, "MINB": 4},
     {"PIPE_D": 4, "PIPE_WIDE": 1, "Q4K_WIDE": 1, "Q6K_WIDE": 1, "MUTANT_MMVW_PIPE_CHUNK": 1}],
)  # fmt: skip
def test_mmvw_compiles_for_sm90_with_pipe(tmp_path, defines):
    src = tmp_path / "mmvw.cu"
    src.write_text(kernels.source("mmvw.cu"))
    cmd = [NVCC, "-arch=sm_90", "--ptx", "-std=c++17", "-o", str(tmp_path / "m.ptx"), str(src)]
    cmd += [f"-D{k}={v}" for k, v in defines.items()]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    ptx = (tmp_path / "m.ptx").read_text()
    assert all(f".entry {k}(" in ptx for k in ("mmvw_pipe", "mmvw_pipe_q4k", "mmvw_pipe_q6k"))


# --- the kernels themselves on the CPU (tests/cuda_emul.py: g++ behind a CUDA shim) ----------
EMUL_BUILDS = {
    "p4": {"NW": 4, "PIPE_D": 4, "PIPE_TPR": 16},
    "p3-wide-lean-t8": {"NW": 4, "PIPE_D": 3, "PIPE_TPR": 8, "PIPE_WIDE": 1, "Q4K_LEAN": 1},
    "p2-t32-w8": {"NW": 8, "PIPE_D": 2, "PIPE_TPR": 32},
    "p6-lean": {"NW": 4, "PIPE_D": 6, "PIPE_TPR": 16, "Q4K_LEAN": 1},
}
EMUL_SHAPES = [(1, 1), (67, 3), (130, 14), (9, 35), (3, 74)]  # (N, K in 256-weight blocks)


@pytest.fixture(scope="module")
def emul_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pipe_emul")


def _xq(x: np.ndarray) -> np.ndarray:
    """x as the kernel reads it (the emulator's Q8_1, float32 as q8.cu rounds), in float64."""
    from tests.cuda_emul import q8_1

    q, ds = q8_1(x.reshape(-1))
    return (q.reshape(-1, 32) * ds[:, :1].astype(np.float64)).reshape(-1)


def _emul_case(rng, qtype: str, n: int, kb: int):  # noqa: ANN202
    from tests.op_cases import dense, qtensor

    w = qtensor(rng, (n, 256 * kb), qtype, std=0.05)
    x = rng.standard_normal((1, 256 * kb)).astype(np.float32)
    return w, np.asarray(FakeCuda().load_weight(w).raw), x, dense(w)  # Q6_K padded as loaded


@pytest.mark.parametrize(
    "build,rpb,ks",
    [("p4", 8, 1), ("p4", 32, 1), ("p3-wide-lean-t8", 4, 4), ("p3-wide-lean-t8", 7, 2),
     ("p2-t32-w8", 3, 8), ("p6-lean", 16, 2), ("p6-lean", 1, 8)],
)  # fmt: skip
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_emulated_pipe_matches_the_int8_reference(emul_dir, build, rpb, ks, qtype):
    """The real kernel (every row of ragged shapes: rows not a multiple of the block's, K of one
    to 74 blocks, parts with no slots) equals x's Q8_1 form times the dequantized weights to
    float32 rounding (the reference rounds x as q8.cu does: float64 rounding of x / d would
    move a few values across a .5); shared memory starts as NaN, so an unwritten partial
    shows."""
    from tests import cuda_emul

    exe = cuda_emul.build(EMUL_BUILDS[build], emul_dir)
    rng = np.random.default_rng(len(build) * 31 + rpb * 7 + ks)
    for n, kb in EMUL_SHAPES:
        _, raw, x, wd = _emul_case(rng, qtype, n, kb)
        (y,) = cuda_emul.run(exe, _PIPE[qtype], x, [(qtype, raw, None)], rpb, ks, emul_dir)
        ref = _xq(x) @ wd.T
        assert np.isfinite(y).all(), f"{n}x{256 * kb}: rows not written"
        err = np.abs(y - ref).max() / np.abs(ref).max()
        assert err < 2e-6, f"{qtype} {n}x{256 * kb}: relative error {err:.3g}"


def test_emulated_mixed_launch_with_adds(emul_dir):
    """mmvw_pipe (mixed types) on three matrices, a bias on the first, a residual on the last."""
    from tests import cuda_emul

    exe = cuda_emul.build(EMUL_BUILDS["p4"], emul_dir)
    rng = np.random.default_rng(21)
    cases = [_emul_case(rng, t, n, 6) for t, n in (("Q4_K", 131), ("Q6_K", 1), ("Q4_K", 66))]
    x = cases[0][2]
    adds = [rng.standard_normal(131).astype(np.float32), None, rng.standard_normal(66)]
    mats = [(c[0].qtype, c[1], a) for c, a in zip(cases, adds, strict=True)]
    outs = cuda_emul.run(exe, "mmvw_pipe", x, mats, 16, 1, emul_dir)
    for (_, _, _, wd), a, y in zip(cases, adds, outs, strict=True):
        ref = _xq(x) @ wd.T + (0 if a is None else a)
        assert np.abs(y - ref).max() <= 2e-6 * np.abs(ref).max()


def test_emulated_planted_chunk_bug_is_caught(emul_dir):
    from tests import cuda_emul

    exe = cuda_emul.build(EMUL_BUILDS["p4"] | {"MUTANT_MMVW_PIPE_CHUNK": 1}, emul_dir)
    _, raw, x, wd = _emul_case(np.random.default_rng(4), "Q4_K", 40, 14)
    (y,) = cuda_emul.run(exe, "mmvw_pipe_q4k", x, [("Q4_K", raw, None)], 8, 2, emul_dir)
    ref = _xq(x) @ wd.T
    assert np.abs(y - ref).max() > 1e-2 * np.abs(ref).max(), "MMVW_PIPE_CHUNK went unnoticed"
