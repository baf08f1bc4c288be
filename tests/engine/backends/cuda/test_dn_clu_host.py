"""delta_net.step_cluster's kernel (shaders/cuda/dn_clu.cu) without a GPU (tests/dn_clu_emul.py:
g++, a cluster's blocks and a block's threads as std::threads): a decode token's conv step,
gates, scan step and gated norm against the NumPy reference (engine.backends.numpy_hybrid's
delta_net_conv_gated) over three steps on carried states, for every blocks-per-head and
lanes-per-column value, 1, 2 and 4 V heads per K head, both V-head orders and state layouts,
conv widths 2..8 and ragged head dims; and its planted bug (DN_CLU_LOCAL_NORM, tests/planted)
caught."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.backends.plan import DnGatedIn
from tests import dn_clu_emul as emul
from tests.op_cases import f32_tensor, nmse

pytestmark = pytest.mark.skipif(emul.GXX is None, reason="needs g++ (the kernel's host build)")


def _steps(tmp_path, n, lanes, max_dk, K, dk, dv, Hk, Hv, transposed, v_order):
    """(max NMSE of y, of the state; conv states all equal) over three emulated steps."""
    defines = {
        "MAX_DK": max_dk,
        "STATE_TRANSPOSED": int(transposed),
        "STEP_CLUSTER": n,
        "STEP_LANES": lanes,
    }
    exe = emul.build(defines, tmp_path)
    rng = np.random.default_rng(dk * 7 + dv + Hv + K + n + lanes)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    Cc = 2 * Hk * dk + Hv * dv
    cw, dt = f(Cc, K) * 0.5, rng.uniform(-1, 1, Hv).astype(np.float32)
    sa = (-np.exp(rng.uniform(-1, 1, Hv))).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, dv).astype(np.float32)
    ref = NumpyBackend()
    rw = [
        ref.load_weight(f32_tensor(nm, t)) for nm, t in (("c", cw), ("d", dt), ("a", sa), ("n", nw))
    ]
    s_ref, c_ref = f(Hv, dk, dv) * 0.1, f(K - 1, Cc)
    s_dev = np.ascontiguousarray(s_ref.transpose(0, 2, 1)) if transposed else s_ref.copy()
    c_dev = c_ref.copy()
    threads = math.ceil(math.ceil(dv / n) * lanes / 32) * 32
    worst_y = worst_s = 0.0
    conv_equal = True
    for _ in range(3):
        qkv, a, b, z = f(1, Cc), f(1, Hv), f(1, Hv), f(1, Hv * dv)
        y, s_out, c_out = emul.run(
            exe, (Hk, Hv, dk, dv, K), v_order == "grouped", threads, 1e-6,
            [qkv, c_dev, cw, a, b, dt, sa, s_dev, nw, z], tmp_path,
        )  # fmt: skip
        gated = DnGatedIn(a, b, rw[1], rw[2], s_ref, v_order, 1e-6, rw[3], z)
        want = ref._delta_net_conv_gated(qkv, c_ref, rw[0], Hk, dk, gated)
        s_dev = s_out.reshape(s_dev.shape)
        c_dev = c_out
        got_s = s_dev.transpose(0, 2, 1) if transposed else s_dev
        worst_y = max(worst_y, nmse(np.asarray(want, np.float64).reshape(-1), y))
        worst_s = max(worst_s, nmse(s_ref.astype(np.float64), got_s))
        conv_equal &= bool(np.array_equal(c_dev, c_ref))
    return worst_y, worst_s, conv_equal


# (blocks a head, lanes a column, max_dk, K, dk, dv, Hk, Hv): dv off the blocks and lanes, dk
# below max_dk, 1 / 2 / 4 V heads per K head, K 2..8
SHAPES = [
    (1, 8, 64, 2, 16, 16, 2, 4),
    (2, 16, 64, 4, 40, 24, 2, 4),
    (4, 8, 64, 5, 48, 33, 3, 3),
    (2, 32, 64, 8, 50, 19, 1, 4),
    (1, 16, 64, 3, 64, 30, 2, 8),
    (4, 16, 32, 4, 32, 64, 1, 2),
]


@pytest.mark.parametrize("transposed,v_order", [(True, "tiled"), (False, "grouped")])
@pytest.mark.parametrize("n,lanes,max_dk,K,dk,dv,Hk,Hv", SHAPES)
def test_cluster_step_is_the_reference(
    tmp_path, transposed, v_order, n, lanes, max_dk, K, dk, dv, Hk, Hv
):
    y, s, conv = _steps(tmp_path, n, lanes, max_dk, K, dk, dv, Hk, Hv, transposed, v_order)
    assert y < 1e-10 and s < 1e-10 and conv, (y, s, conv)


def test_planted_local_norm_is_caught(tmp_path, plant):
    # each block normalising by its own columns: wrong as soon as a head spans two blocks
    plant("DN_CLU_LOCAL_NORM")
    y, s, conv = _steps(tmp_path, 2, 8, 64, 4, 32, 32, 2, 4, True, "tiled")
    assert y > 1e-4 and s < 1e-10 and conv, (y, s, conv)
