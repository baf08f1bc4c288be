"""matmul_prefill.fuse_x16 (rms_norm.comp ADD_RES OUT_F16, eltwise.comp OUT_F16): the prefill's
add + RMSNorm and SwiGLU store the next resident GEMMs' padded fp16 input as they store their
rows, so those GEMMs run without a PASS_X16 dispatch.

Host tests (no device): the two passes build with the pinned compiler. GPU tests (marked gpu;
the resident GEMM needs cooperative matrices, so lavapipe skips them): norm -> GEMM and
SwiGLU -> GEMM on ragged rows and widths (K not a multiple of 64: the zero pad is read) against
the unfused ops (the same fp32 rows, the same GEMM bits) and NumPy, no x16 dispatch; the tiny
model's logits with and without the knob; a planted bug (the fp16 rows written at a wrong
stride) that the op check rejects.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.backends.vulkan import resident, spirv
from engine.backends.vulkan.kernels import all_builds
from engine.tuning import TuningConfig
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    coopmat_fixture,
    half_ref,
    make_backend,
    nmse,
    qtensor,
)
from tests.op_cases import dense

MP = "matmul_prefill."
RES = {MP + "variant": "resident", "rms_norm.fuse_add": 1}


def test_fused_passes_build_and_validate(tmp_path):
    want = {("rms_norm", ("ADD_RES", "OUT_F16")), ("eltwise", ("OP_SWIGLU", "OUT_F16"))}
    assert want <= set(all_builds())
    tools = Path(sys.executable).parent
    for shader, defines in want:
        path = tmp_path / f"{shader}.spv"
        path.write_bytes(spirv.compile_spirv(shader, defines, tmp_path))
        subprocess.run([tools / "spirv-val", "--target-env", "vulkan1.3", path], check=True)


def test_blame_can_turn_it_off():
    """The hooked replay bypasses the fused norm's fp16 rows: validate's blame lists the
    resident GEMM's op and turns fuse_x16 off like any fuse_* knob (an int for that)."""
    from engine.verify.validate import _fusions_off

    be = make_backend()
    try:
        on = TuningConfig.default("vulkan").replace(**RES, **{MP + "fuse_x16": 1})
        assert "matmul_prefill" in be.hook_bypassed_fusions(on)
        assert "matmul_prefill" not in be.hook_bypassed_fusions(
            TuningConfig.default("vulkan").replace(**RES)
        )
        assert _fusions_off(on, "matmul_prefill").op("matmul_prefill")["fuse_x16"] == 0
    finally:
        be.close()


rb = coopmat_fixture("rb")


def _run(rb, fuse: bool, T: int, D: int, seed: int):  # noqa: ANN001, ANN202
    """(normed rows, GEMM on them, swiglu rows, GEMM on them, x16 dispatches, the inputs)."""
    rb.set_config(TuningConfig.default("vulkan").replace(**RES, **{MP + "fuse_x16": int(fuse)}))
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((T, D)).astype(np.float32)
    x = rng.standard_normal((T, D)).astype(np.float32)
    nw = qtensor(rng, (D,), "F32")
    w1 = qtensor(rng, (45, D), "F32")
    g = rng.standard_normal((T, D)).astype(np.float32)
    u = rng.standard_normal((T, D)).astype(np.float32)
    w2 = qtensor(rng, (70, D), "F32")
    nwt, w1t, w2t = rb.load_weight(nw), rb.load_weight(w1), rb.load_weight(w2)
    for wt in (w1t, w2t):  # the one-time fp16 weight copies, before counting
        rb.ops.matmul(rb.upload(np.ones((2, D), np.float32)), wt)
    rb.synchronize()
    rb.set_profiling(True)
    _, y = rb.add_rms_norm(rb.upload(r), rb.upload(x), nwt, 1e-6)
    o1 = rb.ops.matmul(y, w1t)
    h = rb.ops.swiglu(rb.upload(g), rb.upload(u))
    o2 = rb.ops.matmul(h, w2t)
    outs = [rb.download(t) for t in (y, o1, h, o2)]
    kernels = rb.profile().kernels
    x16 = sum(t.calls for k, t in kernels.items() if k.startswith("matmul_prefill") and ".x16" in k)
    rb.set_profiling(False)
    return (*outs, x16, (dense(w1), dense(w2)))


@pytest.mark.gpu
@pytest.mark.parametrize("T,D", [(2, 96), (41, 200), (130, 256), (513, 37)])
def test_fused_x16_rows_feed_the_gemms(rb, T, D):
    y0, o10, h0, o20, x16_0, _ = _run(rb, False, T, D, T + D)
    y1, o11, h1, o21, x16_1, (w1, w2) = _run(rb, True, T, D, T + D)
    assert x16_0 == 2 and x16_1 == 0
    assert np.array_equal(y0, y1) and np.array_equal(h0, h1)
    assert nmse(o10, o11) < 1e-12 and nmse(o20, o21) < 1e-12
    assert nmse(half_ref(y1, w1), o11) < 1e-9
    assert nmse(half_ref(h1, w2), o21) < 1e-9


@pytest.mark.gpu
def test_planted_wrong_stride_is_rejected(rb, monkeypatch):
    """The check above rejects fp16 rows written at a stride one 64-column block short (within
    the buffer: the GEMM reads them at the right one)."""
    real = resident.ResidentPrefill.x16_for

    def wide(self, y):  # noqa: ANN001, ANN202
        xh, kp = real(self, y)
        return xh, kp - 64

    monkeypatch.setattr(resident.ResidentPrefill, "x16_for", wide)
    y, o1, h, o2, _, (w1, w2) = _run(rb, True, 41, 200, 3)
    assert not (nmse(half_ref(y, w1), o1) < 1e-9 and nmse(half_ref(h, w2), o2) < 1e-9)


@pytest.mark.gpu
def test_model_logits_with_fused_x16(rb, tiny_model_path):
    from engine.bench import bench_prompt
    from engine.gguf_model import open_model
    from engine.models import build_model

    m = build_model(open_model(tiny_model_path), rb)
    outs = []
    for fuse in (False, True):
        m.set_config(TuningConfig.default("vulkan").replace(**RES, **{MP + "fuse_x16": int(fuse)}))
        prompt = bench_prompt(45, m.spec.n_vocab)
        outs.append(rb.download(m.prefill(prompt, m.new_cache(64))))
    assert nmse(outs[0], outs[1]) < 1e-10
