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

from tests.dn_conv_cases import ConvGatedCase
from tests.engine.backends.cuda.test_cuda_ops import cfg
from tests.op_cases import check

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
    knobs = {"delta_net.max_dk": max_dk, "delta_net.state_transposed": transposed,
             "delta_net.step_lanes": lanes}  # fmt: skip
    case = ConvGatedCase(be, rng, (K, dk, dv, Hk, Hv), transposed, ("cluster", "tickets"))
    configs = {}
    for name, clu in (("cluster", n), ("tickets", 0)):
        configs[name] = cfg(**knobs, **{"delta_net.step_cluster": clu})
        launch = be._dn_clu_launch(configs[name].knobs("delta_net"), Hk, Hv, dk, dv)
        assert (launch is None) == (not clu), name
    for step, ins, outs in case.steps(be, configs, v_order):
        want = case.reference(ins, v_order)
        assert np.isfinite(outs["cluster"]).all(), f"step {step}"
        check(outs["cluster"], np.asarray(want, np.float64), 1e-10)
        check(outs["cluster"], outs["tickets"].astype(np.float64), 1e-11)
        got_s = be.download(case.states["cluster"][0])
        got_s = got_s.transpose(0, 2, 1) if transposed else got_s
        check(got_s, case.s_ref.astype(np.float64), 1e-10)
        np.testing.assert_array_equal(be.download(case.states["cluster"][1]), case.c_ref)
        np.testing.assert_array_equal(
            be.download(case.states["cluster"][1]), be.download(case.states["tickets"][1])
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
    from tests.mutants import Mutant, assert_validate_catches

    m = Mutant("DN_CLU_LOCAL_NORM", "cuda", "delta_net",
               "the cluster step's norm leaves out the other blocks' columns",
               {"delta_net.step_cluster": 2})  # fmt: skip
    assert_validate_catches(m, tiny_model_factory("qwen35", "q4_k_m"))
