"""delta_net.step_cluster on the GPU (`pytest -m gpu`): a decode token's conv step, gates, scan
step and gated norm in one thread-block cluster per K head (shaders/cuda/dn_clu.cu) against the
NumPy reference and against delta_net_conv_step (dn_step.cu), several steps on carried states:
the output and the delta-net state to float32 rounding (the sums of squares run in another
order), the conv state to the bit; over both state layouts and V-head orders, 1, 2 and 4 V heads
per K head, conv widths 2..8, ragged head dims (dv off the blocks and lanes, dk off max_dk);
and its planted bug (a block normalising by its own columns) rejected end to end."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from tests.engine.backends.cuda.test_cuda_ops import cfg
from tests.op_cases import check, f32_tensor

pytestmark = pytest.mark.gpu


# (step_cluster, step_lanes, max_dk, K, dk, dv, Hk, Hv): dv off the blocks and lanes, dk below
# max_dk, rv 1 / 2 / 4, K 2..8; the 9b / 35b-a3b heads last
SHAPES = [
    (1, 8, 64, 2, 16, 16, 2, 4),
    (2, 16, 128, 4, 40, 24, 2, 4),
    (4, 8, 128, 5, 128, 33, 3, 3),
    (2, 32, 256, 8, 200, 19, 1, 4),
    (1, 16, 64, 3, 64, 30, 4, 8),
    (4, 16, 128, 4, 128, 128, 2, 4),
    (2, 8, 128, 4, 128, 128, 16, 32),
    (4, 8, 128, 4, 128, 128, 16, 32),
]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("v_order", ["grouped", "tiled"])
@pytest.mark.parametrize("n,lanes,max_dk,K,dk,dv,Hk,Hv", SHAPES)
def test_cluster_step_is_the_reference_and_the_ticket_kernel(
    be, transposed, v_order, n, lanes, max_dk, K, dk, dv, Hk, Hv
):
    rng = np.random.default_rng(dk * 7 + dv + Hv + K + n)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    Cc = 2 * Hk * dk + Hv * dv
    knobs = {"delta_net.max_dk": max_dk, "delta_net.state_transposed": transposed,
             "delta_net.step_lanes": lanes}  # fmt: skip
    conv_w = f32_tensor("conv", f(Cc, K) * 0.5)
    dt = f32_tensor("dt", rng.uniform(-1, 1, Hv))
    sa = f32_tensor("a", -np.exp(rng.uniform(-1, 1, Hv)))
    nw = f32_tensor("n", rng.uniform(0.5, 1.5, dv))
    s0 = f(Hv, dk, dv) * 0.1
    c0 = f(K - 1, Cc)
    ref = NumpyBackend()
    rw = [ref.load_weight(t) for t in (conv_w, dt, sa, nw)]
    s_ref, c_ref = s0.copy(), c0.copy()
    init = np.ascontiguousarray(s0.transpose(0, 2, 1)) if transposed else s0
    states = {m: (be.upload(init), be.upload(c0)) for m in ("cluster", "tickets")}
    for step in range(3):
        qkv, a, b, z = f(1, Cc), f(1, Hv), f(1, Hv), f(1, Hv * dv)
        outs = {}
        for name, clu in (("cluster", n), ("tickets", 0)):
            be.set_config(cfg(**knobs, **{"delta_net.step_cluster": clu}))
            assert (be._dn_clu_launch(be.config.knobs("delta_net"), Hk, Hv, dk, dv) is None) == (
                not clu
            )
            w = [be.load_weight(t) for t in (conv_w, dt, sa, nw)]
            s, c = states[name]
            outs[name] = be.download(be.delta_net_conv_gated(
                be.upload(qkv), c, w[0], Hk, dk, be.upload(a), be.upload(b), w[1], w[2], s,
                v_order, 1e-6, w[3], be.upload(z)))  # fmt: skip
        want = ref.delta_net_conv_gated(qkv, c_ref, rw[0], Hk, dk, a, b, rw[1], rw[2], s_ref,
                                        v_order, 1e-6, rw[3], z)  # fmt: skip
        assert np.isfinite(outs["cluster"]).all(), f"step {step}"
        check(outs["cluster"], np.asarray(want, np.float64), 1e-10)
        check(outs["cluster"], outs["tickets"].astype(np.float64), 1e-11)
        got_s = be.download(states["cluster"][0])
        got_s = got_s.transpose(0, 2, 1) if transposed else got_s
        check(got_s, s_ref.astype(np.float64), 1e-10)
        np.testing.assert_array_equal(be.download(states["cluster"][1]), c_ref)
        np.testing.assert_array_equal(
            be.download(states["cluster"][1]), be.download(states["tickets"][1])
        )


def test_cluster_step_runs_the_tiny_hybrids_like_the_default(be, tiny_model_factory):
    """Whole tiny models, greedy decode: the cluster step's tokens are the default's."""
    from engine.gguf_model import open_model
    from engine.models import build_model

    prompt = list(range(5, 30))
    for arch in ("qwen35", "qwen35moe", "qwen3next"):
        toks = {}
        for n in (0, 2):
            be.set_config(cfg(**{"delta_net.step_cluster": n}))
            m = build_model(open_model(tiny_model_factory(arch, "q4_k_m")), be)
            toks[n] = m.generate(prompt, 12).tokens
        assert toks[2] == toks[0], arch


def test_planted_local_norm_is_rejected_and_blamed(be, tiny_model_factory):
    """The cluster step normalising each block's columns by its own sum of squares
    (DN_CLU_LOCAL_NORM, dn_clu.cu only; two blocks a head at the tiny dv of 32):
    validate rejects the candidate and blames delta_net."""
    from tests.mutants import Mutant, judge

    m = Mutant("DN_CLU_LOCAL_NORM", "cuda", "delta_net",
               "the cluster step's norm leaves out the other blocks' columns",
               {"delta_net.step_cluster": 2})  # fmt: skip
    v = judge(m, tiny_model_factory("qwen35", "q4_k_m"))
    assert v.rejected and v.caught_by == "validate", v
    assert v.blamed == "delta_net", v.blame
