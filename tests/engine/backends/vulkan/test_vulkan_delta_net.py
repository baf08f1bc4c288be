"""The Vulkan delta-net kernel (shaders/vulkan/delta_net.comp) against the NumPy reference:
outputs and the state it leaves, for both state layouts, both V-head orders, several workgroup
sizes, a prefill call followed by decode calls on the same state."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.tuning import TuningConfig
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    assert_no_validation_errors,
    nmse,
)


def _inputs(rng, T, Hk, Hv, dk, dv):
    return (
        rng.standard_normal((T, Hk, dk)).astype(np.float32),
        rng.standard_normal((T, Hk, dk)).astype(np.float32),
        rng.standard_normal((T, Hv, dv)).astype(np.float32),
        -rng.uniform(0.01, 2.0, (T, Hv)).astype(np.float32),
        rng.uniform(0.0, 1.0, (T, Hv)).astype(np.float32),
    )


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("v_order", ["grouped", "tiled"])
@pytest.mark.parametrize("wg,dk,dv", [(32, 16, 16), (64, 40, 24), (128, 128, 128), (256, 200, 256)])
def test_matches_numpy(vb, transposed, v_order, wg, dk, dv):
    vb.set_config(
        TuningConfig.from_flat(
            "vulkan",
            {
                "delta_net.wg_size": wg,
                "delta_net.state_transposed": transposed,
                "delta_net.max_dk": 256 if dk > 128 else 128,
            },
        )
    )
    ref = NumpyBackend()
    rng = np.random.default_rng(dk + dv)
    Hk, Hv = 2, 6
    S0 = rng.standard_normal((Hv, dk, dv)).astype(np.float32) * 0.3
    s_ref = S0.copy()
    # S^T layout: the cache holds each head's transpose
    s_vk = vb.upload(np.ascontiguousarray(S0.transpose(0, 2, 1)) if transposed else S0)
    for T in (9, 1, 1):  # a prefill chunk, then two decode steps on the carried state
        args = _inputs(rng, T, Hk, Hv, dk, dv)
        o_ref = ref.ops.delta_net(*args, s_ref, v_order, 1e-6)
        o_vk = vb.download(vb.ops.delta_net(*args, s_vk, v_order, 1e-6))
        assert nmse(o_ref, o_vk) < 1e-10, (T, nmse(o_ref, o_vk))
    got = vb.download(s_vk).reshape((Hv, dv, dk) if transposed else S0.shape)
    if transposed:
        got = got.transpose(0, 2, 1)
    assert nmse(s_ref, got) < 1e-10
    assert_no_validation_errors(vb)


def test_rejects_a_head_wider_than_the_workgroup(vb):
    vb.set_config(TuningConfig.from_flat("vulkan", {"delta_net.wg_size": 32}))
    rng = np.random.default_rng(0)
    args = _inputs(rng, 2, 1, 1, 16, 64)
    with pytest.raises(ValueError, match="wg_size 32"):
        vb.ops.delta_net(*args, vb.upload(np.zeros((1, 16, 64), np.float32)), "grouped", 1e-6)


def test_rejects_a_key_head_wider_than_max_dk(vb):
    vb.set_config(TuningConfig.from_flat("vulkan", {"delta_net.max_dk": 64}))
    args = _inputs(np.random.default_rng(0), 2, 1, 1, 128, 32)
    with pytest.raises(ValueError, match="max_dk 64"):
        vb.ops.delta_net(*args, vb.upload(np.zeros((1, 128, 32), np.float32)), "grouped", 1e-6)


def _chunked(wg: int, chunk: int, scan_wg: int, transposed: bool = False, max_dk: int = 128):
    return TuningConfig.from_flat(
        "vulkan",
        {
            "delta_net.variant": "chunked",
            "delta_net.wg_size": wg,
            "delta_net.chunk": chunk,
            "delta_net.scan_wg": scan_wg,
            "delta_net.state_transposed": transposed,
            "delta_net.max_dk": max_dk,
        },
    )


# Ragged lengths around the chunk edges: shorter than a chunk, one short, exact, one over, and
# several chunks with a ragged tail.
@pytest.mark.parametrize(
    "chunk,lengths",
    [(4, (3, 4, 5, 11)), (16, (15, 16, 17, 37)), (64, (63, 64, 65, 150))],
)
@pytest.mark.parametrize("v_order", ["grouped", "tiled"])
def test_chunked_matches_numpy_on_ragged_lengths(vb, chunk, lengths, v_order):
    Hk, Hv, dk, dv = 2, 4, 24, 40  # dv not a multiple of scan_wg: a partial column block
    vb.set_config(_chunked(64, chunk, 16))
    ref = NumpyBackend()
    rng = np.random.default_rng(chunk)
    for T in lengths:
        S0 = rng.standard_normal((Hv, dk, dv)).astype(np.float32) * 0.3
        s_ref, s_vk = S0.copy(), vb.upload(S0)
        args = _inputs(rng, T, Hk, Hv, dk, dv)
        o_ref = ref.ops.delta_net(*args, s_ref, v_order, 1e-6)
        o_vk = vb.download(vb.ops.delta_net(*args, s_vk, v_order, 1e-6))
        assert nmse(o_ref, o_vk) < 1e-10, (T, nmse(o_ref, o_vk))
        assert nmse(s_ref, vb.download(s_vk)) < 1e-10, T
    assert_no_validation_errors(vb)


@pytest.mark.parametrize("transposed", [False, True])
def test_chunked_prefill_leaves_the_sequential_state_for_decode(vb, transposed):
    """A chunked prefill then decode steps (the sequential kernel) against the sequential scan
    throughout, at the real head size: the same outputs and the same state in either layout."""
    Hk, Hv, d, T = 1, 2, 128, 70
    rng = np.random.default_rng(7)
    steps = [_inputs(rng, n, Hk, Hv, d, d) for n in (T, 1, 1)]
    runs = {}
    for cfg in (
        TuningConfig.from_flat(
            "vulkan", {"delta_net.state_transposed": transposed, "delta_net.wg_size": 128}
        ),
        _chunked(128, 32, 32, transposed),
    ):
        vb.set_config(cfg)
        state = vb.upload(np.zeros((Hv, d, d), np.float32))
        outs = [vb.download(vb.ops.delta_net(*a, state, "tiled", 1e-6)) for a in steps]
        runs[cfg.op("delta_net").variant] = (outs, vb.download(state))
    (o_seq, s_seq), (o_ch, s_ch) = runs["sequential"], runs["chunked"]
    for a, b in zip(o_seq, o_ch, strict=True):
        assert nmse(a, b) < 1e-10
    assert nmse(s_seq, s_ch) < 1e-10
    ref_state = np.zeros((Hv, d, d))
    for a in steps:
        NumpyBackend().ops.delta_net(*a, ref_state, "tiled", 1e-6)
    got = s_ch.reshape(Hv, d, d)
    assert nmse(ref_state, got.transpose(0, 2, 1) if transposed else got) < 1e-10
    assert_no_validation_errors(vb)


def test_chunk_knob_means_the_same_on_numpy_and_vulkan():
    """delta_net.chunked.chunk is one knob across backends: name, choices and default."""
    from engine.tuning import REGISTRY

    got = [
        REGISTRY.op(b, "delta_net").variant("chunked").param("chunk") for b in ("numpy", "vulkan")
    ]
    assert got[0].choices == got[1].choices and got[0].default == got[1].default
