"""delta_net.fuse_decode on the GPU (`pytest -m gpu`): a decode token's gates, scan step and
gated norm in one launch (shaders/cuda/dn_step.cu delta_net_step) against the op-by-op CUDA
schedule (bit-identical outputs and state, several steps on a carried state) and the NumPy
reference, over every scan knob, both state layouts and V-head orders, ragged head dims; and
the planted ungated output rejected by validate and blamed on delta_net."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.backends.plan import DnGatedIn
from tests.engine.backends.cuda.test_cuda_ops import cfg
from tests.op_cases import check, f32_tensor

pytestmark = pytest.mark.gpu


# (warps, max_dk, prefetch, dk, dv, Hk, Hv): every warps / max_dk value, dv off the warp count,
# dk == max_dk, Hv == Hk, the 9b / 35b-a3b heads
SHAPES = [
    (1, 64, 1, 16, 16, 2, 6),
    (4, 128, 4, 40, 24, 2, 6),
    (8, 128, 1, 128, 128, 2, 4),
    (2, 256, 8, 200, 96, 3, 3),
    (4, 64, 2, 64, 33, 1, 4),
    (4, 128, 1, 128, 128, 16, 32),
]


def _inputs(rng, Hk, Hv, dk, dv):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    return f(1, Hk, dk), f(1, Hk, dk), f(1, Hv, dv), f(1, Hv), f(1, Hv), f(1, Hv * dv)


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("v_order", ["grouped", "tiled"])
@pytest.mark.parametrize("warps,max_dk,prefetch,dk,dv,Hk,Hv", SHAPES)
def test_fused_step_is_the_four_launches_to_the_bit(
    be, transposed, v_order, warps, max_dk, prefetch, dk, dv, Hk, Hv
):
    rng = np.random.default_rng(dk * 3 + dv + Hv)
    knobs = {"delta_net.warps": warps, "delta_net.max_dk": max_dk,
             "delta_net.prefetch": prefetch, "delta_net.state_transposed": transposed}  # fmt: skip
    dt = f32_tensor("dt", rng.uniform(-1, 1, Hv))
    sa = f32_tensor("a", -np.exp(rng.uniform(-1, 1, Hv)))
    nw = f32_tensor("n", rng.uniform(0.5, 1.5, dv))
    s0 = rng.standard_normal((Hv, dk, dv)).astype(np.float32) * 0.1
    ref = NumpyBackend()
    s_ref = s0.copy()  # NumPy's state as S; CUDA's holds S^T under state_transposed
    init = np.ascontiguousarray(s0.transpose(0, 2, 1)) if transposed else s0
    states = {name: be.upload(init) for name in ("fused", "plain")}
    for step in range(3):
        ins = _inputs(rng, Hk, Hv, dk, dv)
        outs = {}
        for name, fuse in (("fused", 1), ("plain", 0)):
            be.set_config(cfg(**knobs, **{"delta_net.fuse_decode": fuse}))
            args = [be.upload(t) for t in ins]
            w = [be.load_weight(t) for t in (dt, sa, nw)]
            gated = DnGatedIn(*args[3:5], w[0], w[1], states[name], v_order, 1e-6, w[2], args[5])
            outs[name] = be.download(be._delta_net_gated(*args[:3], gated))
        assert np.array_equal(outs["fused"], outs["plain"]), f"step {step}"
        assert np.array_equal(be.download(states["fused"]), be.download(states["plain"]))
        gated = DnGatedIn(*ins[3:5], ref.load_weight(dt), ref.load_weight(sa), s_ref, v_order,
                          1e-6, ref.load_weight(nw), ins[5])  # fmt: skip
        want = ref._delta_net_gated(*ins[:3], gated)
        check(outs["fused"], np.asarray(want, np.float64), 1e-10)


def test_planted_ungated_step_is_rejected_and_blamed(be, tiny_model_factory):
    """The fused step's output without its silu(z) gate (DN_STEP_UNGATED, dn_step.cu
    only): validate rejects the default config and blames delta_net's fusion."""
    from tests.mutants import Mutant, assert_validate_catches

    m = Mutant("DN_STEP_UNGATED", "cuda", "delta_net",
               "the fused delta-net step leaves out the output gate", {})  # fmt: skip
    assert_validate_catches(m, tiny_model_factory("qwen35", "q4_k_m"))
