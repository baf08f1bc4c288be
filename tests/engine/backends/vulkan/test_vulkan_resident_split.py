"""matmul_prefill.split_groups (engine/backends/vulkan/resident.py: split_ranges): split_k per
shape, on whichever tiles the fill_groups step left a grid on (the 1.5B's q/o/down on 48
workgroups of 128 x 128, its k/v on 32 of 64 x 64).

Host tests (no device): the ranges each grid gets (the 1.5B and 7B prefill shapes at 512
tokens), split_groups 0 keeps split_k's first rule, the registry's values. GPU tests (marked gpu;
the resident GEMM needs cooperative matrices, so lavapipe skips them): the split on the 128 x 128
tiles and on the 64 x 64 ones against NumPy on ragged shapes at subgroup sizes 32 and 64 (64
skipped on a device fixed at 32), and a planted bug (the k-range sum drops the last range) that
the same check rejects.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.vulkan import resident
from engine.backends.vulkan.resident import kpad, split_ranges
from engine.tuning import TuningConfig
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    allowed_config,
    coopmat_fixture,
    half_ref,
    nmse,
    qtensor,
)
from tests.op_cases import dense

MP = "matmul_prefill."
RESIDENT = {MP + "variant": "resident"}


# --- host -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "groups,fill,split_k,split_groups,want",
    [
        (48, 32, 4, 128, 2),  # 1.5B q/o/down on 128 x 128: one wave of 96
        (32, 32, 4, 128, 4),  # 1.5B k/v on 64 x 64 (8 tiles of 128 x 128 under fill 32)
        (112, 32, 4, 128, 1),  # 7B q/o/down: 112 already fill the wave
        (64, 32, 4, 128, 2),  # 7B k/v on 64 x 64
        (48, 32, 4, 256, 4),  # capped by split_k
        (48, 32, 1, 128, 1),  # split_k 1: never split
        (65, 32, 4, 128, 1),  # over half of split_groups: one range
        (64, 256, 4, 0, 4),  # split_groups 0: split_k's first rule (ceil(256 / 64))
        (200, 256, 3, 0, 2),  # ... ceil(256 / 200)
        (448, 256, 4, 0, 1),  # ... a grid at or over fill_groups is not split
    ],
)
def test_split_ranges_per_shape(groups, fill, split_k, split_groups, want):
    assert split_ranges(groups, fill, split_k, split_groups) == want


def test_split_per_shape_is_registered_off_by_default():
    """split_groups and split_k are off (fill_groups 256) until an end-to-end run shows better
    (the registry's note); each setting is accepted where its constraint allows it."""
    cfg = TuningConfig.default("vulkan").replace(**RESIDENT).op("matmul_prefill")
    assert (cfg["fill_groups"], cfg["split_groups"], cfg["split_k"]) == (256, 0, 1)
    for fill, sg in ((32, 128), (64, 256), (0, 96)):
        c = TuningConfig.default("vulkan").replace(
            **RESIDENT, **{MP + "fill_groups": fill, MP + "split_groups": sg, MP + "split_k": 4}
        )
        assert c.op("matmul_prefill")["split_groups"] == sg
    with pytest.raises(Exception, match="split_groups"):
        TuningConfig.default("vulkan").replace(**RESIDENT, **{MP + "split_groups": 100})


# --- GPU ------------------------------------------------------------------------------------------
rb = coopmat_fixture("rb")


# (T, n, K): k of 2 to 18 steps of 32 (K padded to 64), ragged T and n; grids of 1 to 20
# workgroups
SHAPES = ((70, 45, 20), (3, 130, 150), (129, 67, 300), (41, 200, 256), (200, 300, 520))
KNOBS = [
    {"fill_groups": 0},  # the 128 x 128 tiles split
    {"fill_groups": 512},  # the 64 x 64 tiles split
    {"fill_groups": 0, "prefetch": 1},
    {"fill_groups": 0, "subgroup_size": 32},
    {"fill_groups": 0, "subgroup_size": 64, "warp_n": 64},  # wave64: 4 tiles x 64 lanes
    {"fill_groups": 512, "subgroup_size": 64, "warp_n": 64},
]


def _run(rb, flat: dict, seed: int):  # noqa: ANN001, ANN202
    """(out, reference, kernels) per shape under flat."""
    rb.set_config(allowed_config(rb, flat))
    rng = np.random.default_rng(seed)
    for T, n, K in SHAPES:
        w = qtensor(rng, (n, K), "Q4_K" if K % 256 == 0 else "F32")
        x = rng.standard_normal((T + 1, K)).astype(np.float32)
        wt = rb.load_weight(w)
        rb.set_profiling(True)
        out = rb.download(rb.ops.matmul(rb.ops.rows(rb.upload(x), 1, T + 1), wt))
        kernels = set(rb.profile().kernels)
        rb.set_profiling(False)
        yield (T, n, K), out, half_ref(x[1:], dense(w)), kernels


@pytest.mark.gpu
@pytest.mark.parametrize("split", [2, 3, 4])
@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: "-".join(f"{a}{b}" for a, b in k.items()))
def test_split_groups_on_either_tiles(rb, split, knobs):
    """split_groups 256: every grid here (at most 12 workgroups) is split into split_k ranges,
    on the 128 x 128 tiles (fill_groups 0: no .small pipeline) or the 64 x 64 ones; within fp16
    input rounding of NumPy."""
    flat = RESIDENT | {MP + "split_k": split, MP + "split_groups": 256}
    flat |= {MP + k: v for k, v in knobs.items()}
    for (T, n, K), out, ref, kernels in _run(rb, flat, split):
        assert out.shape == (T, n) and np.isfinite(out).all()
        assert nmse(ref, out) < 1e-9, (T, n, K)
        steps = kpad(K) // 32
        assert any(".ksum" in k for k in kernels) == (steps > 1), (K, kernels)
        assert any(".small" in k for k in kernels) == (knobs["fill_groups"] == 512), kernels


@pytest.mark.gpu
def test_planted_range_drop_is_rejected(rb, monkeypatch):
    """The check above catches a k-range sum that drops the last range (the ksum pass told one
    range fewer): the planted bug fails it on every split shape."""
    real = resident.ResidentPrefill._split_k

    def dropping(self, xh, lease, out, pipe, c, qtype, dims, groups, want):  # noqa: ANN001, ANN202
        dispatch = self.stream.dispatch

        def one_fewer(p, bufs, writes, push, grid):  # noqa: ANN001, ANN202
            if p is self._pipe("matmul_prefill.ksum", qtype)[0]:
                push = (push[0] - 1, *push[1:])
            return dispatch(p, bufs, writes, push, grid)

        self.stream.dispatch = one_fewer
        try:
            return real(self, xh, lease, out, pipe, c, qtype, dims, groups, want)
        finally:
            del self.stream.dispatch

    monkeypatch.setattr(resident.ResidentPrefill, "_split_k", dropping)
    flat = RESIDENT | {MP + "split_k": 2, MP + "split_groups": 256, MP + "fill_groups": 0}
    split = 0
    for (_, _, K), out, ref, _ in _run(rb, flat, 7):
        if kpad(K) // 32 > 1:
            split += 1
            assert not (np.isfinite(out).all() and nmse(ref, out) < 1e-9), K
    assert split == len(SHAPES)
