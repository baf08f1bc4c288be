"""matmul_decode.mmvf (the CUDA default decode matmul) without a GPU (tests/cuda_fake.py): a
decode step's block-type matmuls all go through mmvf launches checked against the kernel's
signature, grouped as the fused ops promise (q/k/v with their biases in one launch, gate and
up in one, each residual added by the projection before it), with the grid of the knobs' rows
per block and the per-type kernel where a launch has one type. The kernels run in
tests/engine/backends/cuda/test_cuda_mmvf.py (-m gpu)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine.tuning import TuningConfig
from tests.cuda_fake import FakeCuda

PROMPT = list(range(5, 5 + 12))


def _decode(tiny_model_factory, arch: str, flat: dict):  # noqa: ANN202
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = FakeCuda(TuningConfig.from_flat("cuda", flat))
    m = build_model(open_model(tiny_model_factory(arch, "q4_k_m")), be)
    cache = m.new_cache(len(PROMPT) + 2)
    m.prefill(PROMPT, cache)
    be.launches.clear()
    m.forward(be.upload(np.array([1], np.int32)), 1, len(PROMPT), cache)
    return be, list(be.launches), m


@pytest.mark.parametrize(
    "knobs",
    [{}, {"matmul_decode.threads_per_row": 8, "matmul_decode.rows_per_thread": 4,
          "matmul_decode.warps": 2},
     {"matmul_decode.threads_per_row": 128, "matmul_decode.warps": 8,
      "matmul_decode.xsmem": 1}],
    ids=["defaults", "t8-r4-w2", "t128-w8-xs"],
)  # fmt: skip
def test_dense_decode_step_is_four_mmvf_launches_a_layer(tiny_model_factory, knobs):
    be, launches, m = _decode(tiny_model_factory, "qwen2", knobs)
    assert be.config.op("matmul_decode").variant == "mmvf"
    n = m.spec.n_layers
    mm = [x for x in launches if x.kernel.startswith("mmvf")]
    # q/k/v (+ biases), o (+ residual), gate and up, down (+ residual); then the LM head
    assert len(mm) == 4 * n + 1, Counter(x.kernel for x in launches)
    assert not any(x.kernel.startswith("dmmv") for x in launches)  # every weight a block type
    assert Counter(x.kernel for x in launches)["add"] == 0  # residuals added as they store
    c = be.config.op("matmul_decode")
    rpb = int(c["warps"]) * 32 // int(c["threads_per_row"]) * int(c["rows_per_thread"])
    for x in mm:
        assert x.block == (int(c["warps"]) * 32, 1, 1)
        Ns = [int(x.args[6 + 6 * i]) for i in range(3)]  # N of each matrix
        nbs = [-(-N // rpb) for N in Ns]
        assert x.grid[0] == sum(nbs) and int(x.args[2]) == nbs[0] and int(x.args[3]) == nbs[1]
        types = {int(x.args[7 + 6 * i]) for i in range(3) if Ns[i]}
        assert (x.kernel == "mmvf") == (len(types) > 1), (x.kernel, types)
        assert x.fname == "mmvf.cu" and x.defines["THREADS_PER_ROW"] == int(c["threads_per_row"])
        K = int(x.args[1])  # xsmem: the block's copy of x in dynamic shared memory
        assert x.smem == (4 * K if int(c["xsmem"]) else 0)


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_hybrid_projections_go_three_to_a_launch(tiny_model_factory, arch):
    """A hybrid decode step: its projections of one row share launches (Backend.matmuls)."""
    mmvf_be, mmvf_launches, _ = _decode(tiny_model_factory, arch, {})
    dmmv_be, dmmv_launches, _ = _decode(tiny_model_factory, arch, {"matmul_decode.variant": "dmmv"})
    n_mmvf = sum(x.kernel.startswith("mmvf") for x in mmvf_launches)
    n_dmmv = sum(x.kernel.startswith("dmmv") for x in dmmv_launches)
    assert 0 < n_mmvf < n_dmmv
    # what remains on dmmv: float weights (a qwen3next shared-expert gate is F32)
    assert {x.kernel for x in mmvf_launches if x.kernel.startswith("dmmv")} <= {
        "dmmv_f32",
        "dmmv_f16",
        "dmmv_bf16",
    }
    assert len(mmvf_launches) < len(dmmv_launches)


def test_xsmem_row_longer_than_shared_memory_takes_dmmv():
    """Under xsmem a block holds x in shared memory: a row past what a block may opt in to
    (the fake H200: 232,448 bytes, 58k floats) goes to dmmv, a shorter one to mmvf."""
    from engine.gguf_model import QTensor
    from engine.quantize import random_quantized

    be = FakeCuda(TuningConfig.from_flat("cuda", {"matmul_decode.xsmem": 1}))
    rng = np.random.default_rng(0)
    for K, kernel in ((61440, "dmmv_q8_0"), (4096, "mmvf_q8_0")):
        w = be.load_weight(QTensor("w", "Q8_0", (3, K), random_quantized(rng, (3, K), "Q8_0", 0.1)))
        be.launches.clear()
        be.ops.matmul(be.upload(np.ones((1, K), np.float32)), w)
        assert [x.kernel for x in be.launches] == [kernel]
