"""attention_decode.gqa (shaders/cuda/attn_decode.cu) without a GPU (tests/cuda_fake.py): the
host launches attn_gqa once a decode layer with a block per (key range, KV head) and the
kernel's signature, its knobs reach the launch (fuse_combine: no separate combine; early: the
last argument), and shapes it cannot take run attn_split. The kernel itself runs in
tests/engine/backends/cuda/test_cuda_attn_decode.py (-m gpu)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine.tuning import TuningConfig
from tests import cuda_fake
from tests.attention_configs import attention_flat
from tests.cuda_fake import FakeCuda, decode_step, fused_rope_launches

PROMPT = list(range(5, 5 + 12))
GQA = {"attention_decode.variant": "gqa"}


def _decode_launches(tiny_model_factory, flat: dict) -> tuple[list, object]:
    return decode_step(tiny_model_factory("qwen2", "q4_k_m"), flat, PROMPT)


@pytest.mark.parametrize("dec", ["mmvf", "mmvw"])
@pytest.mark.parametrize("fc,early,splits,warps", [(1, 1, 16, 4), (0, 0, 4, 1), (1, 0, 64, 8)])
def test_gqa_launches(tiny_model_factory, dec, fc, early, splits, warps):
    flat = attention_flat("gqa", dec, fuse_combine=fc, early=early, splits=splits, warps=warps)
    launches, m = _decode_launches(tiny_model_factory, flat)
    n, hkv = m.spec.n_layers, m.spec.n_head_kv
    gqa = [launch for launch in launches if launch.kernel == "attn_gqa"]
    assert len(gqa) == n
    assert all(g.grid == (splits, hkv, 1) and g.block == (32 * warps, 1, 1) for g in gqa)
    assert all(int(g.args[-5]) == early for g in gqa)  # then knew, vnew, theta, neox
    count = Counter(launch.kernel for launch in launches)
    combine = "attn_combine_q8" if dec == "mmvw" else "attn_combine"
    assert count[combine] == (0 if fc else n)
    assert count["attn_split"] == count["attn_split_kw"] == 0


@pytest.mark.parametrize("H,Hkv,D,warps,ok", [
    (12, 2, 128, 4, True), (28, 4, 128, 1, False), (28, 4, 128, 2, True), (4, 2, 256, 4, True),
    (4, 2, 264, 4, False),
    (3, 1, 80, 1, True), (2, 2, 66, 4, False), (64, 1, 64, 8, False), (32, 1, 64, 8, True),
])  # fmt: skip
def test_gqa_limits(H, Hkv, D, warps, ok):
    """The shapes attn_gqa takes (D % 4 == 0, D <= 256, group <= 4 x warps and <= 32); the
    host sends the others to attn_split."""
    assert FakeCuda._gqa_fits(H, Hkv, D, warps) is ok


def test_gqa_falls_back_to_split():
    cuda_fake.assert_attention_falls_back_to_split(GQA, 264)


# --- rms_norm.block (shaders/cuda/norm_decode.cu) ---------------------------------------------
@pytest.mark.parametrize("dec", ["mmvf", "mmvw"])
@pytest.mark.parametrize("threads", [128, 512])
def test_norm_block_launches(tiny_model_factory, dec, threads):
    """rms_norm.block: every decode norm is one rms_norm_row launch (under int8 decode with the
    Q8_1 buffers, else null), none of the warp / rms_norm_q8 kernels."""
    flat = {"matmul_decode.variant": dec, "rms_norm.variant": "block",
            "rms_norm.threads": threads}  # fmt: skip
    launches, m = _decode_launches(tiny_model_factory, flat)
    rows = [launch for launch in launches if launch.kernel == "rms_norm_row"]
    assert len(rows) == 2 * m.spec.n_layers + 1  # two a layer and the output norm
    assert all(r.grid == (1, 1, 1) and r.block == (threads, 1, 1) for r in rows)
    q8 = [not isinstance(r.args[3], np.uint64) for r in rows]  # null: np.uint64(0)
    assert all(q8) if dec == "mmvw" else not any(q8)
    kernels = {launch.kernel for launch in launches}
    assert not kernels & {"rms_norm", "rms_norm_q8"}


def test_norm_block_long_rows_take_the_warp_kernel():
    be = FakeCuda(TuningConfig.from_flat("cuda", {"rms_norm.variant": "block",
                                                  "rms_norm.threads": 128}))  # fmt: skip
    w = be.load_weight(_norm_weight(8192))
    be.launches.clear()
    be.ops.rms_norm(be.upload(np.ones((1, 8192), np.float32)), w, 1e-6)
    be.ops.rms_norm(
        be.upload(np.ones((3, 4096), np.float32)), be.load_weight(_norm_weight(4096)), 1e-6
    )
    assert [launch.kernel for launch in be.launches] == ["rms_norm", "rms_norm_row"]
    assert be.launches[1].grid == (3, 1, 1)


def _norm_weight(n: int):
    from tests.op_cases import qtensor

    return qtensor(np.random.default_rng(n), (n,), "F32")


def test_float_pdl_launches(tiny_model_factory):
    """matmul_decode.mmvf's pdl: the float decode's kernels that start with pdl_start are the
    ones launched with pdl=True (the fake checks each launch's signature as CudaBackend's)."""
    flat = {"matmul_decode.pdl": 1, "rms_norm.variant": "block", "rope.fuse_kv": 1,
            "attention_decode.variant": "gqa"}  # fmt: skip
    launches, m = _decode_launches(tiny_model_factory, flat)
    kinds = Counter(launch.kernel for launch in launches)
    n = m.spec.n_layers
    assert kinds["rms_norm_row"] == 2 * n + 1 and kinds["attn_gqa"] == n
    assert kinds["rope_kv"] == n and kinds["swiglu"] == n


@pytest.mark.parametrize("dec", ["mmvf", "mmvw"])
def test_gqa_fuse_rope_launches(tiny_model_factory, dec):
    """attention_decode.fuse_rope: no rope / rope_kv / kv_write launch at decode; attn_gqa gets
    the k and v projections (non-null) and the rope arguments."""
    flat = GQA | {"matmul_decode.variant": dec, "attention_decode.fuse_rope": 1,
                  "rope.fuse_kv": 1}  # fmt: skip
    launches, m = _decode_launches(tiny_model_factory, flat)
    fused_rope_launches(launches, m, "attn_gqa", knew=-4, neox=-1)


def test_gqa_fuse_rope_is_a_bypassed_fusion():
    be = FakeCuda(TuningConfig.from_flat("cuda", GQA))
    on = TuningConfig.from_flat("cuda", GQA | {"attention_decode.fuse_rope": 1})
    assert "attention_decode" in be.hook_bypassed_fusions(on)
    assert "attention_decode" not in be.hook_bypassed_fusions(be.config)


# --- matmul_decode.mmvf fuse_swiglu (mmvf_glu) ------------------------------------------------
@pytest.mark.parametrize("rpt,fused", [(2, True), (4, True), (1, False)])
def test_mmvf_glu_launches(tiny_model_factory, rpt, fused):
    """fuse_swiglu: one mmvf_glu launch a layer instead of the gate/up launch and swiglu (odd
    rows_per_thread: the two launches); a bypassed fusion for blame."""
    flat = {"matmul_decode.fuse_swiglu": 1, "matmul_decode.rows_per_thread": rpt}
    launches, m = _decode_launches(tiny_model_factory, flat)
    count = Counter(launch.kernel for launch in launches)
    glu = [launch for launch in launches if launch.kernel.startswith("mmvf_glu_")]
    n = m.spec.n_layers
    assert len(glu) == (n if fused else 0)
    assert count["swiglu"] == (0 if fused else n)
    per = 4 * 32 // 32 * rpt // 2  # warps 4, threads_per_row 32
    assert all(g.grid[0] == -(-m.spec.n_ff // per) for g in glu)
    be = FakeCuda(TuningConfig.from_flat("cuda", flat))
    assert "matmul_decode" in be.hook_bypassed_fusions(be.config)
