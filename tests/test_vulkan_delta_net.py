"""The Vulkan delta-net kernel (shaders/vulkan/delta_net.comp) against the NumPy reference:
outputs and the state it leaves, for both state layouts, both V-head orders, several workgroup
sizes, a prefill call followed by decode calls on the same state."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.tuning import TuningConfig
from tests.test_vulkan_helpers import assert_no_validation_errors, make_backend, nmse


@pytest.fixture(scope="module")
def vb():
    be = make_backend()
    yield be
    be.close()


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
        o_ref = ref.delta_net(*args, s_ref, v_order, 1e-6)
        o_vk = vb.download(vb.delta_net(*args, s_vk, v_order, 1e-6))
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
        vb.delta_net(*args, vb.upload(np.zeros((1, 16, 64), np.float32)), "grouped", 1e-6)


def test_rejects_a_key_head_wider_than_max_dk(vb):
    vb.set_config(TuningConfig.from_flat("vulkan", {"delta_net.max_dk": 64}))
    args = _inputs(np.random.default_rng(0), 2, 1, 1, 128, 32)
    with pytest.raises(ValueError, match="max_dk 64"):
        vb.delta_net(*args, vb.upload(np.zeros((1, 128, 32), np.float32)), "grouped", 1e-6)
