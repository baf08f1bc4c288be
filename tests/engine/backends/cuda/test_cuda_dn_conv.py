"""delta_net.fuse_conv, delta_net.fuse_ba, moe_experts.fuse_norm and down_wsum on the GPU
(`pytest -m gpu`): a decode token's conv step, gates, scan step and gated norm in one launch
(shaders/cuda/dn_step.cu delta_net_conv_step) against the op-by-op CUDA schedule (ssm_conv_step,
the column copies, delta_net_step: outputs, delta-net state and conv state equal to the bit,
several steps on carried states) and the NumPy reference, over both state layouts and V-head
orders, conv widths and ragged head dims; qwen35's beta / alpha projections stacked into one mmvf
launch against the two-launch schedule (bit-equal) and NumPy; the MoE down kernel ending in the
next layer's input norm against moe_ffn + rms_norm, and its weighted-sum form, against NumPy."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from tests.dn_conv_cases import ConvGatedCase
from tests.engine.backends.cuda.test_cuda_ops import cfg
from tests.op_cases import check, f32_tensor, qtensor

pytestmark = pytest.mark.gpu


# (warps, max_dk, K, dk, dv, Hk, Hv): dv off the warp count, dk == max_dk, Hv == Hk, K 2..8,
# the 9b / 35b-a3b heads last
SHAPES = [
    (1, 64, 2, 16, 16, 2, 6),
    (4, 128, 4, 40, 24, 2, 6),
    (8, 128, 5, 128, 128, 2, 4),
    (2, 256, 8, 200, 96, 3, 3),
    (4, 64, 3, 64, 33, 1, 4),
    (4, 128, 4, 128, 128, 16, 32),
]


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("v_order", ["grouped", "tiled"])
@pytest.mark.parametrize("warps,max_dk,K,dk,dv,Hk,Hv", SHAPES)
def test_conv_fused_step_is_the_op_by_op_schedule_to_the_bit(
    be, transposed, v_order, warps, max_dk, K, dk, dv, Hk, Hv
):
    rng = np.random.default_rng(dk * 7 + dv + Hv + K)
    knobs = {"delta_net.warps": warps, "delta_net.max_dk": max_dk,
             "delta_net.state_transposed": transposed}  # fmt: skip
    case = ConvGatedCase(be, rng, (K, dk, dv, Hk, Hv), transposed, ("fused", "plain"))
    configs = {
        name: cfg(**knobs, **{"delta_net.fuse_conv": fuse})
        for name, fuse in (("fused", 1), ("plain", 0))
    }
    for step, ins, outs in case.steps(be, configs, v_order):
        assert np.array_equal(outs["fused"], outs["plain"]), f"step {step}"
        for i, what in enumerate(("state", "conv state")):
            got, want = (be.download(case.states[n][i]) for n in ("fused", "plain"))
            assert np.array_equal(got, want), f"{what}, step {step}"
        want = case.reference(ins, v_order)
        check(outs["fused"], np.asarray(want, np.float64), 1e-10)
        np.testing.assert_array_equal(be.download(case.states["fused"][1]), case.c_ref)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("C,N,Hv", [(256, 96, 32), (512, 40, 6), (4096, 160, 32)])
def test_stacked_beta_alpha_is_the_two_launch_schedule_to_the_bit(be, qtype, C, N, Hv):
    rng = np.random.default_rng(C + N + Hv)
    qts = [qtensor(rng, (n, C), qtype, name=f"w{i}") for i, n in enumerate((N, N // 2, Hv, Hv))]
    x = rng.standard_normal((1, C)).astype(np.float32)
    outs = {}
    for fuse in (1, 0):
        be.set_config(cfg(**{"delta_net.fuse_ba": fuse}))
        ws = tuple(be.load_weight(t) for t in qts)
        be.ops.ssm_in(be.upload(rng.standard_normal((2, C)).astype(np.float32)), ws)  # (a prefill)
        outs[fuse] = [be.download(y) for y in be.ops.ssm_in(be.upload(x), ws)]
    for got, want, qt in zip(outs[1], outs[0], qts, strict=True):
        assert np.array_equal(got, want), qt.name
        check(got, x.astype(np.float64) @ qt.dequantize().T.astype(np.float64), 1e-10)


# (E, k, C, F, routed type, down type, shared): ragged C (not a multiple of the 32 lanes), the
# 35B-A3B's k and down types, no shared expert
MOE_SHAPES = [
    (8, 2, 320, 96, "Q8_0", "Q8_0", True),
    (64, 8, 1024, 256, "Q4_K", "Q6_K", True),
    (16, 3, 256, 64, "Q4_0", "Q4_0", False),
]


DOWN_KNOBS = [{"moe_experts.down_wsum": 0},
              {"moe_experts.down_vec1": 1, "moe_experts.down_wsum": 0},
              {"moe_experts.down_wsum": 1},
              {"moe_experts.down_wsum": 1, "moe_experts.threads_per_row": 16,
               "moe_experts.rows_per_block": 8},
              {"moe_experts.down_split": 1, "moe_experts.topk_regs": 1},
              {"moe_experts.down_split": 1, "moe_experts.rows_per_block": 8}]  # fmt: skip


@pytest.mark.parametrize(
    "knobs", DOWN_KNOBS, ids=["down", "vec1", "wsum", "wsum-t16", "split", "split-r8"]
)
@pytest.mark.parametrize("E,k,C,F,qe,qd,shared", MOE_SHAPES)
def test_moe_down_norm_is_moe_ffn_then_rms_norm(be, E, k, C, F, qe, qd, shared, knobs):
    rng = np.random.default_rng(E + k + C)
    mats = [qtensor(rng, s, q, 0.1) for s, q in (((E, F, C), qe), ((E, F, C), qe),
                                                 ((E, C, F), qd))]  # fmt: skip
    router = f32_tensor("router", rng.standard_normal((E, C)) * 0.05)
    sh = None
    if shared:
        sh = (f32_tensor("sg", rng.standard_normal((1, C)) * 0.1),
              *(qtensor(rng, s, "Q8_0", 0.1) for s in ((F, C), (F, C), (C, F))))  # fmt: skip
    norm = f32_tensor("norm", rng.uniform(0.5, 1.5, C))
    ref = NumpyBackend()
    ins = rng.standard_normal((2, 2, 1, C)).astype(np.float32)  # (h, r) per step
    outs = {}
    for fuse in (1, 0):
        be.set_config(cfg(**knobs, **{"moe_experts.fuse_norm": fuse}))
        ld = be.load_weight
        for step in range(2):  # (the ticket reset: a second call on the same tickets)
            h, r = ins[step]
            y, hn = be._moe_ffn_norm(be.upload(h), be.upload(r), ld(router), k,
                                    tuple(ld(m) for m in mats),
                                    None if sh is None else tuple(ld(t) for t in sh),
                                    ld(norm), 1e-6)  # fmt: skip
            outs[fuse, step] = (be.download(y), be.download(hn))
    for step in range(2):  # y to the bit (one down kernel); its norm summed by the block
        assert np.array_equal(outs[1, step][0], outs[0, step][0]), f"step {step}"
        check(outs[1, step][1], outs[0, step][1].astype(np.float64), 1e-12)
    h, r = ins[0]
    wy, whn = ref._moe_ffn_norm(h, r, ref.load_weight(router), k,
                               tuple(ref.load_weight(m) for m in mats),
                               None if sh is None else tuple(ref.load_weight(t) for t in sh),
                               ref.load_weight(norm), 1e-6)  # fmt: skip
    check(outs[1, 0][0], np.asarray(wy, np.float64), 1e-10)
    check(outs[1, 0][1], np.asarray(whn, np.float64), 1e-10)
