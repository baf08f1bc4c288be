"""rms_norm.block (shaders/cuda/norm_decode.cu) against float64 NumPy (`pytest -m gpu`): ragged
rows and widths (per-head [T, H, D] too), each thread count; rows past 32 x threads values take
the warp kernel; under int8 decode the Q8_1 form it leaves is rms_norm_q8's to the bit (same
threads: the same sum order) and what the next matmul reads; whole tiny models: graph replay
equals eager and validate passes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_decode_cases import assert_config_graph_equals_eager, assert_validates
from tests.engine.backends.cuda.test_cuda_ops import INT8_NMSE, _check_q8, cfg
from tests.op_cases import check, dense, qtensor

pytestmark = pytest.mark.gpu

BLOCK = {"rms_norm.variant": "block"}


def _ref(x: np.ndarray, w) -> np.ndarray:  # noqa: ANN001
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * dense(w)


@pytest.mark.parametrize("threads", [128, 256, 512])
@pytest.mark.parametrize(
    "shape", [(1, 4), (1, 1536), (1, 3584), (3, 896), (5, 4, 64), (2, 4100), (1, 16384)]
)
def test_rms_norm_block(be, shape, threads):
    be.set_config(cfg(**BLOCK | {"rms_norm.threads": threads}))
    rng = np.random.default_rng(shape[-1] + threads)
    x = rng.standard_normal(shape).astype(np.float32) * 3
    w = qtensor(rng, (shape[-1],), "F32")
    for _ in range(2):
        out = be.download(be.ops.rms_norm(be.upload(x), be.load_weight(w), 1e-6))
        check(out, _ref(x, w), 1e-12)
    be.set_config(cfg())


@pytest.mark.parametrize("D", [32, 96, 1536, 3584])
@pytest.mark.parametrize("dec", ["mmvq", "mmvw"])
def test_rms_norm_block_q8_is_rms_norm_q8(be, D, dec):
    rng = np.random.default_rng(D)
    x = rng.standard_normal((1, D)).astype(np.float32)
    w = qtensor(rng, (D,), "F32")
    outs = []
    for flat in ({}, BLOCK):
        be.set_config(cfg(**flat | {"matmul_decode.variant": dec, "quantize_act.threads": 256}))
        out = be.ops.rms_norm(be.upload(x), be.load_weight(w), 1e-6)
        hit = be._q8_lookup(out)
        assert hit is not None, "the decode norm left no Q8_1 form"
        outs.append((be.download(out), hit[0].get(), hit[1].get()))
    check(outs[1][0], _ref(x, w), 1e-12)
    for a, b in zip(outs[0], outs[1], strict=True):
        assert np.array_equal(a, b), "rms_norm_row differs from rms_norm_q8 at equal threads"
    be.set_config(cfg(**BLOCK | {"matmul_decode.variant": dec}))
    out = be.ops.rms_norm(be.upload(x), be.load_weight(w), 1e-6)
    _check_q8(be.download(out), *be._q8_lookup(out))
    wq = qtensor(rng, (67, D), "Q4_K" if D % 256 == 0 else "Q8_0", std=0.05)
    y = be.download(be.ops.matmul(out, be.load_weight(wq)))
    check(y, be.download(out).astype(np.float64) @ dense(wq).T, INT8_NMSE)
    be.set_config(cfg())


CONFIGS = [
    BLOCK,
    BLOCK | {"rms_norm.threads": 128, "attention_decode.variant": "gqa", "rope.fuse_kv": 1},
    BLOCK | {"matmul_decode.variant": "mmvw", "rope.fuse_kv": 1},
]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("flat", CONFIGS, ids=["block", "block_gqa_fkv", "block_mmvw"])
def test_norm_block_model_graph_equals_eager(be, tiny_model_factory, arch, flat):
    assert_config_graph_equals_eager(be, tiny_model_factory(arch, "q4_k_m"), flat)


@pytest.mark.parametrize("flat", CONFIGS[:2], ids=["block", "block_gqa_fkv"])
def test_validate_norm_block(be, tiny_model_path, flat):
    assert_validates(be, tiny_model_path, flat)
