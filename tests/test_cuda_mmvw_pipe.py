"""matmul_decode.pipe (mmvw_pipe: a block's rows streamed by lane groups with the next items'
weight loads in flight in registers) on the GPU (`pytest -m gpu`): Q4_K and Q6_K on ragged
shapes (rows not a multiple of a block's, K of one to 74 blocks, parts with no slots when
pipe_split exceeds a row's chunks) against the NumPy reference within the int8 class and against
mmvw with the same lanes a row and slot width (pipe_wide: q4k_wide's; the same slots in the
same order: equal to float-contraction noise); several matrices of mixed types with adds in one
launch; canaries around every output; a whole tiny model's graph replay equals eager decode and
validate passes; the planted MMVW_PIPE_CHUNK is caught. Host side:
tests/test_cuda_mmvw_pipe_host.py."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_decode_cases import assert_model_runs_and_validates, run_three, three_refs
from tests.cuda_decode_cases import mmvw_knobs as knobs
from tests.cuda_decode_cases import run_matmul as _run
from tests.op_cases import check, check_dot, dense, qtensor, seed_of
from tests.test_cuda_ops import INT8_NMSE, cfg

pytestmark = pytest.mark.gpu

# pipe_fill 0 (no shrinking of small launches' blocks) except where named: the ragged shapes
# then give workers several rows each, so the load cursor runs across row ends
CONFIGS = [
    ("p4", {"pipe": 4, "pipe_fill": 0}),
    ("p3-wide-t8", {"pipe": 3, "pipe_wide": 1, "pipe_lanes": 8, "pipe_fill": 0}),
    ("p2-split4-all", {"pipe": 2, "pipe_split": 4, "split_min_k": 256, "pipe_fill": 0}),
    ("p4-fill", {"pipe": 4}),  # pipe_fill at its default
    ("p3-split8-r16-all", {"pipe": 3, "pipe_split": 8, "pipe_rows": 16, "split_min_k": 256,
                           "pipe_fill": 0}),
    ("p6-r4-lean", {"pipe": 6, "pipe_rows": 4, "q4k_lean": 1, "pipe_fill": 0}),
    ("p2-wide-lean-split4", {"pipe": 2, "pipe_wide": 1, "q4k_lean": 1, "pipe_split": 4,
                             "split_min_k": 256, "pipe_rows": 8, "pipe_fill": 0}),
    ("p4-t32-w8-split2", {"pipe": 4, "pipe_lanes": 32, "warps": 8, "pipe_split": 2,
                          "split_min_k": 256, "pipe_fill": 0}),
    ("p4-t8-r128-split4", {"pipe": 4, "pipe_lanes": 8, "pipe_rows": 128, "pipe_split": 4,
                           "split_min_k": 256, "pipe_fill": 0}),
    ("p4-wide-t32-split8-w8", {"pipe": 4, "pipe_wide": 1, "pipe_lanes": 32, "pipe_split": 8,
                               "warps": 8, "split_min_k": 256, "pipe_fill": 0}),
]  # fmt: skip
SHAPES = [(1, 1), (67, 3), (130, 14), (257, 74), (1031, 2)]  # (N, K in 256-weight blocks)


@pytest.fixture(scope="module")
def be(cuda_be):
    yield cuda_be
    cuda_be.set_config(cfg())


@pytest.fixture(scope="module")
def cases():
    """qtype -> [(w, x, dense w)] on SHAPES, made once (quantizing is the slow part)."""
    out = {}
    for qtype in ("Q4_K", "Q6_K"):
        rng = np.random.default_rng(seed_of("pipe", qtype))
        out[qtype] = []
        for N, kb in SHAPES:
            w = qtensor(rng, (N, 256 * kb), qtype, std=0.05)
            x = rng.standard_normal((1, 256 * kb)).astype(np.float32)
            out[qtype].append((w, x, dense(w)))
    return out


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("cid,kn", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_pipe_matches_reference_and_mmvw(cp, be, cases, cid, kn, qtype):
    lanes = kn.get("pipe_lanes", 16)
    plain = {k: v for k, v in kn.items() if not k.startswith("pipe")}
    if kn.get("pipe_wide") and qtype == "Q4_K":  # the pipe's slots: q4k_wide's
        plain["q4k_wide"] = 1
    for w, x, wd in cases[qtype]:
        N, K = w.shape
        got = _run(cp, be, knobs(**kn), w, x)
        check_dot(got, x, wd, INT8_NMSE)
        # mmvw with the pipe's lanes a row walks the same slots: one part sums in its order
        ref = _run(cp, be, knobs(**plain, threads_per_row=lanes, unroll=1), w, x)
        scale = np.abs(ref).max() + 1e-6
        tol = 1e-5 if kn.get("pipe_split", 1) == 1 or K < kn.get("split_min_k", 8192) else 1e-4
        err = np.abs(got - ref).max()
        assert err <= tol * scale, f"{qtype} {N}x{K}: pipe differs from mmvw by {err:.3g}"


def test_pipe_several_matrices_with_adds(cp, be):
    """One mmvw_pipe launch of three matrices (131, 1, 66 rows): a bias, none, a residual; all
    Q4_K (mmvw_pipe_q4k), all Q6_K (mmvw_pipe_q6k) and mixed (mmvw_pipe); a Q8_0 among them
    keeps mmvw (and the result)."""
    rng = np.random.default_rng(5)
    K = 512
    x = rng.standard_normal((1, K)).astype(np.float32)
    bias = qtensor(rng, (131,), "F32")
    res = rng.standard_normal((1, 66)).astype(np.float32)
    kinds = (("Q4_K",) * 3, ("Q6_K",) * 3, ("Q4_K", "Q6_K", "Q4_K"), ("Q6_K", "Q8_0", "Q4_K"))
    for types in kinds:
        ws = [qtensor(rng, (N, K), t, std=0.05) for t, N in zip(types, (131, 1, 66), strict=True)]
        refs = three_refs(ws, x, bias, res)
        for flat in (
            knobs(pipe=4),
            knobs(pipe=3, pipe_split=4, split_min_k=256, pipe_rows=8, pipe_fill=0),
        ):
            outs = run_three(cp, be, flat, ws, x, bias, res)
            for out, ref in zip(outs, refs, strict=True):
                check(out, ref, INT8_NMSE)


PIPE_MODEL = knobs(pipe=4, pipe_split=4, split_k=2, split_min_k=256) | {
    "rope.fuse_kv": 1,
    "attention_decode.variant": "split_kw",
    "argmax.variant": "multi",
}


def test_pipe_model_graph_equals_eager_and_validates(be, tiny_model_factory, monkeypatch):
    path = tiny_model_factory("qwen2", "q4_k_m")
    assert_model_runs_and_validates(be, path, PIPE_MODEL, "mmvw_pipe_q4k", monkeypatch)


def test_planted_pipe_chunk_is_caught(cp, be, monkeypatch):
    from engine.backends.planted import ENV

    rng = np.random.default_rng(13)
    w = qtensor(rng, (1031, 1024), "Q4_K", std=0.05)
    x = rng.standard_normal((1, 1024)).astype(np.float32)
    want = _run(cp, be, knobs(), w, x)
    monkeypatch.setenv(ENV, "MMVW_PIPE_CHUNK")
    got = _run(cp, be, knobs(pipe=4, pipe_fill=0), w, x)
    monkeypatch.delenv(ENV)
    be.set_config(cfg())
    assert np.abs(got - want).max() > 1e-3 * np.abs(want).max(), "MMVW_PIPE_CHUNK went unnoticed"
