"""matmul_decode.mmvf, the CUDA default decode matmul (float32 activations, shaders/cuda/mmvf.cu),
against float64 NumPy (`pytest -m gpu`): every block type and float fallback at every value of
every knob on ragged row counts, up to three matrices per launch with their adds, the fused ops
that group its launches (matmuls, matmul_add, ffn, attn_in) bit-equal to the unfused schedule,
and whole tiny models (dense and hybrid): graph replay equals eager and the hooked schedule.
Output canaries around every result; inputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Backend
from engine.backends.plan import AttnIn
from tests.cuda_decode_cases import matrices_with_adds
from tests.engine.backends.cuda.test_cuda_ops import (
    PROMPT,
    _model,
    assert_ragged_matmul_into,
    cfg,
)
from tests.op_cases import (
    assert_graph_equals_eager,
    assert_hooked_matches,
    check_dot,
    qtensor,
    seed_of,
)

pytestmark = pytest.mark.gpu
# float32 products and sums, error normalised by sum_k x_k^2 w_k^2 (check_dot): ~1e-13
# expected; a wrong scale, slot or row gives 1e-3 and up.
FLOAT_ERR = 1e-9

BLOCK_QTYPES = ["Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
MMVF = {"matmul_decode.variant": "mmvf"}
# Each value of each knob at least once (registry: engine/tuning/variants/cuda/).
MMVF_CONFIGS = [
    ("defaults", {}),
    ("t8-r4-u4-w2-wl1-mb4", {"threads_per_row": 8, "rows_per_thread": 4, "unroll": 4,
                             "warps": 2, "wload": 1, "min_blocks": 4}),
    ("t32-r1-u1-w1-wl2-mb12", {"threads_per_row": 32, "rows_per_thread": 1, "unroll": 1,
                               "warps": 1, "wload": 2, "min_blocks": 12}),
    ("r2-u4-w8-mb8", {"warps": 8, "unroll": 4, "min_blocks": 8}),
    ("t8-r1-u2-w4-mb16", {"threads_per_row": 8, "rows_per_thread": 1, "min_blocks": 16}),
    ("t32-r4-u1-w4", {"threads_per_row": 32, "rows_per_thread": 4, "unroll": 1}),
    ("r8-u1", {"rows_per_thread": 8, "unroll": 1}),
    # a row over 2 / 4 warps, their sums met in shared memory
    ("t64-r4-u1", {"threads_per_row": 64, "rows_per_thread": 4, "unroll": 1}),
    ("t128-r2-w8", {"threads_per_row": 128, "warps": 8}),
    ("xs-t16-r2", {"threads_per_row": 16, "xsmem": 1}),  # x from shared memory
    ("xs-t8-r4-u1-w8", {"xsmem": 1, "threads_per_row": 8, "rows_per_thread": 4, "unroll": 1,
                        "warps": 8}),
    # a Q4_K slot of 64 weights (a sub-block pair)
    ("q4p", {"q4k_pair": 1}),
    ("q4p-t16-r4-u1-xs", {"q4k_pair": 1, "threads_per_row": 16, "rows_per_thread": 4,
                          "unroll": 1, "xsmem": 1}),
]  # fmt: skip


def mmvf(**knobs) -> dict:
    return MMVF | {f"matmul_decode.{k}": v for k, v in knobs.items()}


def test_mmvf_is_the_default_and_float_exact():
    from engine.tuning import REGISTRY, TuningConfig

    assert TuningConfig.default("cuda").op("matmul_decode").variant == "mmvf"
    assert REGISTRY.op("cuda", "matmul_decode").variant("mmvf").numeric == "order_only"


@pytest.mark.parametrize("cid,knobs", MMVF_CONFIGS, ids=[c[0] for c in MMVF_CONFIGS])
@pytest.mark.parametrize("qtype", [*BLOCK_QTYPES, "F16", "F32"])
def test_mmvf_matmul(cp, be, cid, knobs, qtype):
    """Ragged row counts (1, 67, 130, 257 rows: no multiple of a block's rows) and K of 1 to 9
    blocks (a lane's slots run out mid-iteration); float weights go through dmmv."""
    be.set_config(cfg(**mmvf(**knobs)))
    rng = np.random.default_rng(seed_of("mmvf", cid, qtype))
    sizes = [(1, 1), (67, 3), (130, 2), (257, 9)]
    assert_ragged_matmul_into(cp, be, rng, qtype, sizes, FLOAT_ERR)


@pytest.mark.parametrize("cid,knobs", MMVF_CONFIGS, ids=[c[0] for c in MMVF_CONFIGS])
@pytest.mark.parametrize("n_mats", [1, 2, 3])
def test_mmvf_several_matrices_with_adds(cp, be, cid, knobs, n_mats):
    """One launch, matrices of different types and row counts, each with its own add (a bias,
    none, a residual row), each output between canaries."""
    be.set_config(cfg(**mmvf(**knobs)))
    rng = np.random.default_rng(n_mats * 7 + len(cid))
    x, mats, checks = matrices_with_adds(cp, be, rng, 768, ("Q4_K", "Q6_K", "Q5_0")[:n_mats])
    be._mmvf(be.upload(x), mats)
    for y, wd, add_ref, intact in checks:
        check_dot(y.get() - add_ref, x, wd, FLOAT_ERR)
        intact()


def _pick(*ids: str) -> list:
    return [c for c in MMVF_CONFIGS if c[0] in ids]


FUSED = _pick("defaults", "t8-r4-u4-w2-wl1-mb4", "t32-r1-u1-w1-wl2-mb12", "xs-t16-r2",
              "t128-r2-w8", "q4p")  # fmt: skip


@pytest.mark.parametrize("cid,knobs", FUSED, ids=[c[0] for c in FUSED])
def test_mmvf_fused_ops_equal_the_unfused_schedule(cp, be, cid, knobs):
    """matmuls (three to a launch), matmul_add (the residual added as it stores), ffn (gate and
    up in one launch) and attn_in (q/k/v + biases in one launch): bit-equal to the base class's
    op-by-op sequence on the same kernels (each output row is the same sum; the epilogue add is
    add's one float add)."""
    be.set_config(cfg(**mmvf(**knobs)))
    rng = np.random.default_rng(seed_of("mmvf-fused", cid))
    C, F = 512, 768
    types = ["Q4_K", "Q6_K", "Q8_0", "F16", "Q4_K"]  # F16: the dmmv fallback inside matmuls
    ws = [be.load_weight(qtensor(rng, (n, C), t, std=0.05))
          for t, n in zip(types, (131, 64, 33, 40, 7), strict=True)]  # fmt: skip
    h = be.upload(rng.standard_normal((1, C)).astype(np.float32))
    got = be.ops.matmuls(h, tuple(ws))
    for w, y in zip(ws, got, strict=True):
        assert np.array_equal(be.download(y), be.download(be.ops.matmul(h, w)))
    wg, wu = (be.load_weight(qtensor(rng, (F, C), "Q4_K", std=0.05)) for _ in range(2))
    wd = be.load_weight(qtensor(rng, (C, F), "Q6_K", std=0.05))
    r = be.upload(rng.standard_normal((1, C)).astype(np.float32))
    fused = be.download(be._ffn(h, wg, wu, wd, r))
    assert np.array_equal(fused, be.download(Backend._ffn(be, h, wg, wu, wd, r)))
    g = be.upload(rng.standard_normal((1, F)).astype(np.float32))
    ma = be.download(be._matmul_add(g, wd, r))
    assert np.array_equal(ma, be.download(Backend._matmul_add(be, g, wd, r)))
    H, Hkv, D = 4, 2, 64
    wqkv = tuple(be.load_weight(qtensor(rng, (n, C), t, std=0.05))
                 for n, t in ((H * D, "Q4_K"), (Hkv * D, "Q4_K"), (Hkv * D, "Q6_K")))  # fmt: skip
    bias = tuple(be.load_weight(qtensor(rng, (n,), "F32")) for n in (H * D, Hkv * D, Hkv * D))
    c1, c2 = be.new_kv_cache(1, 8, Hkv, D), be.new_kv_cache(1, 8, Hkv, D)
    q1 = be.download(be._attn_in(AttnIn(h, wqkv, bias, c1, 0, 3, (H, Hkv, D), 1e6, True)))
    q2 = be.download(Backend._attn_in(be, AttnIn(h, wqkv, bias, c2, 0, 3, (H, Hkv, D), 1e6, True)))
    assert np.array_equal(q1, q2)
    assert np.array_equal(be.download(c1.k[0]), be.download(c2.k[0]))
    assert np.array_equal(be.download(c1.v[0]), be.download(c2.v[0]))


MODEL = _pick("defaults", "t8-r4-u4-w2-wl1-mb4", "xs-t8-r4-u1-w8", "t64-r4-u1", "q4p-t16-r4-u1-xs")


@pytest.mark.parametrize("arch", ["qwen2", "qwen35", "qwen3next"])
@pytest.mark.parametrize("cid,knobs", MODEL, ids=[c[0] for c in MODEL])
def test_mmvf_model_graph_equals_eager_and_hooked(be, tiny_model_factory, arch, cid, knobs):
    """A tiny dense and hybrid model decoding under mmvf: graph replay bit-equal to eager, and
    the hooked (unfused, one launch per matmul) schedule the same tokens and logits."""
    be.set_config(cfg(**mmvf(**knobs), **{"prefill.gemm_min_t": 1 << 20}))
    m = _model(tiny_model_factory(arch, "q4_k_m"), be)
    eager = assert_graph_equals_eager(be, m, PROMPT, 8)
    assert_hooked_matches(be, m, eager, PROMPT, 8)


def test_mmvf_default_passes_the_cross_check_with_numpy(be, tiny_model_path):
    """The default (mmvf) per-token path against the NumPy backend at the reference budget:
    what the drift sentinel holds the default to."""
    from engine.verify.cross_check import cross_check_numpy

    be.set_config(cfg())
    m = _model(tiny_model_path, be)
    out = cross_check_numpy(m, [PROMPT[:5], PROMPT], steps=4)
    assert out["passed"], out["reasons"]
