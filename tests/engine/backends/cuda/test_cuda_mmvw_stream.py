"""matmul_decode.stream (mmvw_stream: persistent blocks streaming their Q4_K / Q6_K row sets
through a ring of bulk-copied shared-memory stages) on the GPU (`pytest -m gpu`): bit-equal
to plain mmvw with the same knobs and within the int8 class of the NumPy reference, on ragged
shapes (rows not a multiple of a set, K from one block to past split_min_k), rings that wrap
many times (one block an SM), with the activations as shared-memory planes (stream_x), several
matrices with adds in one launch, canaries around every output; a whole tiny model's graph
replay equals eager decode and validate passes; the planted MMVW_STREAM_SHORT (each copy 16
bytes short) is caught. Host-side plan: tests/engine/backends/cuda/test_cuda_decode_host.py."""

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

STREAM_CONFIGS = [
    ("s2", {"stream": 2}),
    ("s3-b1", {"stream": 3, "stream_blocks": 1}),  # few blocks: each ring wraps many times
    ("s4-w8-split2", {"stream": 4, "warps": 8, "split_k": 2, "split_min_k": 256}),
    ("s8-t8-r4", {"stream": 8, "threads_per_row": 8, "rows_per_thread": 4}),
    ("s2-b2-t16-r2-u1-wide-x", {"stream": 2, "stream_blocks": 2, "threads_per_row": 16,
                                "rows_per_thread": 2, "unroll": 1, "q4k_wide": 1, "q6k_wide": 1,
                                "stream_x": 1}),  # wide slots: no planes
    # the activations as shared-memory planes (stream_x)
    ("s3-x", {"stream": 3, "stream_x": 1}),
    ("s4-x-w8-split2-b1", {"stream": 4, "stream_x": 1, "warps": 8, "split_k": 2,
                           "split_min_k": 256, "stream_blocks": 1}),
    ("s2-x-t8-r2-u4", {"stream": 2, "stream_x": 1, "threads_per_row": 8, "rows_per_thread": 2,
                       "unroll": 4}),
]  # fmt: skip
# (N, K blocks): one row, rows past a set's multiple, K of 1 to 37 blocks, and 4099 short rows
# (1025+ sets: every block's ring wraps)
SHAPES = [(1, 1), (67, 3), (130, 14), (257, 37), (4099, 1)]


@pytest.mark.parametrize("cid,kn", STREAM_CONFIGS, ids=[c[0] for c in STREAM_CONFIGS])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_stream_equals_mmvw_bitwise(cp, be, cid, kn, qtype):
    rng = np.random.default_rng(seed_of(cid, qtype))
    for N, kb in SHAPES:
        K = 256 * kb
        w = qtensor(rng, (N, K), qtype, std=0.05)
        x = rng.standard_normal((1, K)).astype(np.float32)
        plain = {k: v for k, v in kn.items() if not k.startswith("stream")}
        want = _run(cp, be, knobs(**plain), w, x)
        got = _run(cp, be, knobs(**kn), w, x)
        lw = be.load_weight(w)
        rpb = be._mmvw_rows_per_block(K)
        plan = be._stream_plan((lw,), rpb, -(-N // rpb))
        cap = be.device_info().extra["smem_per_block_optin"]
        # plain mmvw only where two stages of a set (and the planes) do not fit a block
        assert plan is not None or 2 * rpb * lw.row_bytes > cap - 2048 - 112 * (K // 32)
        assert np.array_equal(got, want), f"{N}x{K}: stream differs from mmvw"
        check_dot(got, x, dense(w), INT8_NMSE)


SEVERAL = [STREAM_CONFIGS[i] for i in (0, 2, 5, 6)]


@pytest.mark.parametrize("cid,kn", SEVERAL, ids=[c[0] for c in SEVERAL])
def test_stream_several_matrices_with_adds(cp, be, cid, kn):
    """One launch of Q4_K / Q6_K / Q4_K (131, 1, 66 rows) with a bias, none, a residual."""
    rng = np.random.default_rng(len(cid))
    K = 512
    specs = [("Q4_K", 131, "bias"), ("Q6_K", 1, None), ("Q4_K", 66, "residual")]
    x = rng.standard_normal((1, K)).astype(np.float32)
    ws = [qtensor(rng, (N, K), t, std=0.05) for t, N, _ in specs]
    bias = qtensor(rng, (131,), "F32")
    res = rng.standard_normal((1, 66)).astype(np.float32)
    plain = {k: v for k, v in kn.items() if "stream" not in k}
    outs = {
        name: run_three(cp, be, knobs(**flat), ws, x, bias, res)
        for name, flat in (("mmvw", plain), ("s", kn))
    }
    refs = three_refs(ws, x, bias, res)
    for a, b, ref in zip(outs["mmvw"], outs["s"], refs, strict=True):
        assert np.array_equal(a, b), "stream differs from mmvw"
        check(b, ref, INT8_NMSE)


def test_stream_falls_back_on_other_types(cp, be):
    """A Q8_0 matrix is not streamed (plain mmvw runs it) and is still right."""
    rng = np.random.default_rng(5)
    w = qtensor(rng, (67, 512), "Q8_0", std=0.05)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    got = _run(cp, be, knobs(stream=4), w, x)
    assert be._stream_plan((be.load_weight(w),), 4, 17) is None
    check_dot(got, x, dense(w), INT8_NMSE)


STREAM_MODEL = mmvw_model(stream=4, split_k=2, stream_x=1)


def test_stream_model_graph_equals_eager_and_validates(be, tiny_model_factory, monkeypatch):
    path = tiny_model_factory("qwen2", "q4_k_m")
    assert_model_runs_and_validates(be, path, STREAM_MODEL, "mmvw_stream", monkeypatch)


def test_planted_short_copy_is_caught(cp, be, plant):
    """The planted MMVW_STREAM_SHORT: every bulk copy leaves out its set's last 16 bytes."""

    rng = np.random.default_rng(11)
    w = qtensor(rng, (1031, 512), "Q4_K", std=0.05)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    want = _run(cp, be, knobs(), w, x)
    plant("MMVW_STREAM_SHORT")
    got = _run(cp, be, knobs(stream=2, stream_blocks=1), w, x)
    plant(None)
    be.set_config(cfg())
    assert not np.array_equal(got, want), "the planted short copy went unnoticed"
