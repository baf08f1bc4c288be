"""matmul_decode.q4k_lean (branch-free Q4_K scale decode, shift-free high nibbles) and
q4k_kernel (mmvw_q4k: mmvw built for Q4_K alone) on the GPU (`pytest -m gpu`): q4k_kernel is
bit-equal to mmvw with the same knobs; q4k_lean computes the same integers, so it matches
mmvw to float-contraction noise and the NumPy reference within the int8 class; ragged shapes
(rows not a multiple of a block's, K of one to 74 Q4_K blocks, split-K, staged, wide slots),
several matrices with adds in one launch, canaries around every output; a whole tiny model's
graph replay equals eager decode and validate passes; the planted Q4K_LEAN_SCALE and
MMVW_Q4K_ROW0 are caught. Host-side launches:
tests/engine/backends/cuda/test_cuda_decode_host.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_decode_cases import (
    assert_model_runs_and_validates,
    mmvw_model,
    run_three,
    three_refs,
)
from tests.cuda_decode_cases import mmvw_knobs as knobs
from tests.cuda_decode_cases import run_matmul as _run
from tests.engine.backends.cuda.test_cuda_ops import INT8_NMSE, cfg
from tests.op_cases import check, check_dot, dense, qtensor, seed_of

pytestmark = pytest.mark.gpu

CONFIGS = [
    ("defaults", {}),
    ("split2", {"split_k": 2, "split_min_k": 256}),
    ("t16-r2-u1-q4kmb16", {"threads_per_row": 16, "rows_per_thread": 2, "unroll": 1,
                        "q4k_min_blocks": 16}),
    ("t8-r4-w8-u4-stage", {"threads_per_row": 8, "rows_per_thread": 4, "warps": 8, "unroll": 4,
                           "stage": 1}),
    ("wide-split4", {"q4k_wide": 1, "split_k": 4, "split_min_k": 256}),
    ("stream3-x", {"stream": 3, "stream_x": 1}),
]  # fmt: skip
SHAPES = [(1, 1), (67, 3), (130, 14), (257, 74), (1031, 2)]  # (N, K in Q4_K blocks)


@pytest.mark.parametrize("cid,kn", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_q4k_lean_and_kernel_match_mmvw(cp, be, cid, kn):
    rng = np.random.default_rng(seed_of(cid, "Q4_K"))
    for N, kb in SHAPES:
        K = 256 * kb
        w = qtensor(rng, (N, K), "Q4_K", std=0.05)
        x = rng.standard_normal((1, K)).astype(np.float32)
        want = _run(cp, be, knobs(**kn), w, x)
        check_dot(want, x, dense(w), INT8_NMSE)
        kern = _run(cp, be, knobs(**kn, q4k_kernel=1), w, x)
        assert np.array_equal(kern, want), f"{N}x{K}: mmvw_q4k differs from mmvw"
        lean = _run(cp, be, knobs(**kn, q4k_lean=1), w, x)
        check_dot(lean, x, dense(w), INT8_NMSE)
        # the same integers: only an FMA contraction between the float terms may differ
        scale = np.abs(want).max() + 1e-6
        assert np.abs(lean - want).max() <= 1e-5 * scale, f"{N}x{K}: lean differs from mmvw"
        both = _run(cp, be, knobs(**kn, q4k_lean=1, q4k_kernel=1), w, x)
        assert np.abs(both - want).max() <= 1e-5 * scale


def test_q4k_kernel_several_matrices_with_adds(cp, be):
    """One mmvw_q4k launch of three Q4_K matrices (131, 1, 66 rows): a bias, none, a residual;
    a Q6_K among them keeps mmvw (and the result)."""
    rng = np.random.default_rng(3)
    K = 512
    x = rng.standard_normal((1, K)).astype(np.float32)
    bias = qtensor(rng, (131,), "F32")
    res = rng.standard_normal((1, 66)).astype(np.float32)
    for types in (("Q4_K", "Q4_K", "Q4_K"), ("Q4_K", "Q6_K", "Q4_K")):
        ws = [qtensor(rng, (N, K), t, std=0.05) for t, N in zip(types, (131, 1, 66), strict=True)]
        refs = three_refs(ws, x, bias, res)
        outs = {
            name: run_three(cp, be, flat, ws, x, bias, res)
            for name, flat in (("mmvw", knobs()), ("q4k", knobs(q4k_kernel=1, q4k_lean=1)))
        }
        for a, b, ref in zip(outs["mmvw"], outs["q4k"], refs, strict=True):
            check(b, ref, INT8_NMSE)
            assert np.abs(a - b).max() <= 1e-5 * (np.abs(a).max() + 1e-6)


Q4K_MODEL = mmvw_model(q4k_lean=1, q4k_kernel=1, split_k=2)


def test_q4k_model_graph_equals_eager_and_validates(be, tiny_model_factory, monkeypatch):
    path = tiny_model_factory("qwen2", "q4_k_m")
    assert_model_runs_and_validates(be, path, Q4K_MODEL, "mmvw_q4k", monkeypatch)


@pytest.mark.parametrize(
    "mutant,flat",
    [("Q4K_LEAN_SCALE", knobs(q4k_lean=1)), ("MMVW_Q4K_ROW0", knobs(q4k_kernel=1))],
)
def test_planted_q4k_bugs_are_caught(cp, be, plant, mutant, flat):
    rng = np.random.default_rng(13)
    w = qtensor(rng, (1031, 1024), "Q4_K", std=0.05)
    x = rng.standard_normal((1, 1024)).astype(np.float32)
    want = _run(cp, be, knobs(), w, x)
    plant(mutant)
    got = _run(cp, be, flat, w, x)
    plant(None)
    be.set_config(cfg())
    assert np.abs(got - want).max() > 1e-3 * np.abs(want).max(), f"{mutant} went unnoticed"
