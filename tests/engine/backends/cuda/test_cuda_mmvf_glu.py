"""matmul_decode.mmvf's fuse_swiglu (mmvf_glu, shaders/cuda/mmvf.cu) on a GPU (`pytest -m gpu`):
the fused FFN of a decode row is bit-equal to the two launches (gate/up mmvf, swiglu) for every
block type on ragged row counts and each knob family (lanes a row, rows a lane, shared-memory
x, Q4_K pairs), and matches float64; whole tiny models decode to the bit as without it."""

from __future__ import annotations

import numpy as np
import pytest

from tests.cuda_decode_cases import assert_decode_alike
from tests.engine.backends.cuda.test_cuda_ops import PROMPT, _model, cfg, k_for
from tests.op_cases import check, dense, qtensor

pytestmark = pytest.mark.gpu

BLOCK_QTYPES = ["Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
KNOBS = [
    {},
    {"rows_per_thread": 4, "threads_per_row": 8, "unroll": 1, "q4k_pair": 1},
    {"rows_per_thread": 8, "warps": 8, "xsmem": 1},
    {"threads_per_row": 64, "rows_per_thread": 2, "unroll": 1},
]


@pytest.mark.parametrize("knobs", KNOBS, ids=[str(i) for i in range(len(KNOBS))])
@pytest.mark.parametrize("qtype", BLOCK_QTYPES)
@pytest.mark.parametrize("F", [37, 301])
def test_mmvf_glu_equals_two_launches(be, qtype, F, knobs):
    rng = np.random.default_rng(F + len(knobs))
    C = k_for(qtype, 2)
    gate, up = (qtensor(rng, (F, C), qtype, std=0.1) for _ in range(2))
    down = qtensor(rng, (C, F), "F32", std=0.1)  # any down: the FFN's output is compared
    h = rng.standard_normal((1, C)).astype(np.float32)
    r = rng.standard_normal((1, C)).astype(np.float32)
    outs = []
    for fuse in (0, 1):
        flat = {f"matmul_decode.{k}": v for k, v in knobs.items()}
        be.set_config(cfg(**flat | {"matmul_decode.fuse_swiglu": fuse}))
        ws = [be.load_weight(w) for w in (gate, up, down)]
        outs.append(be.download(be._ffn(be.upload(h), *ws, be.upload(r))))
    assert np.array_equal(outs[0], outs[1]), "mmvf_glu differs from gate/up + swiglu"
    g, u = (h.astype(np.float64) @ dense(w).T for w in (gate, up))
    ref = r + (g / (1 + np.exp(-g)) * u) @ dense(down).T
    check(outs[1], ref, 1e-9)
    be.set_config(cfg())


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_mmvf_glu_model_bit_equal(be, tiny_model_factory, arch):
    m = _model(tiny_model_factory(arch, "q4_k_m"), be)
    flats = ({"matmul_decode.fuse_swiglu": 0}, {"matmul_decode.fuse_swiglu": 1})
    assert_decode_alike(be, m, flats, PROMPT, "fuse_swiglu changed a decode result")
