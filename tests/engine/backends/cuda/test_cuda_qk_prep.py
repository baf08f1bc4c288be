"""rope_partial.fuse_qk on the GPU (`pytest -m gpu`): a decode token's gated-attention inputs
(q / k RMSNorm, partial RoPE of both, the KV-cache write, q and the gate made contiguous) in one
launch (hybrid.cu attn_qk_prep) against the op-by-op CUDA schedule, to the bit (q, gate and the
cache), and the NumPy reference, on ragged head shapes and positions; the planted RoPE one
position ahead rejected by validate and blamed on rope_partial."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import KVCache
from engine.backends.numpy_ref import NumpyBackend
from tests.engine.backends.cuda.test_cuda_ops import cfg
from tests.op_cases import check, f32_tensor

pytestmark = pytest.mark.gpu


# (H, Hkv, D, n_rot, pos): the hybrid presets' heads (16 / 2 or 4 of 256, 64 rotated), ragged
# head counts (not a multiple of the 4 heads a block takes), a full-width RoPE, small heads
SHAPES = [(16, 2, 256, 64, 0), (16, 4, 256, 64, 37), (5, 1, 32, 8, 1000), (3, 3, 64, 64, 7),
          (7, 2, 96, 32, 4095)]  # fmt: skip


@pytest.mark.parametrize("H,Hkv,D,n_rot,pos", SHAPES)
def test_fused_qk_prep_is_the_op_by_op_schedule_to_the_bit(be, H, Hkv, D, n_rot, pos):
    rng = np.random.default_rng(H * 31 + D + pos)
    qg = rng.standard_normal((1, H, 2 * D)).astype(np.float32)
    k = rng.standard_normal((1, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((1, Hkv, D)).astype(np.float32)
    qn, kn = (f32_tensor(n, rng.uniform(0.5, 1.5, D)) for n in ("qn", "kn"))
    S = pos + 3
    got = {}
    for fuse in (1, 0):
        be.set_config(cfg(**{"rope_partial.fuse_qk": fuse}))
        cache = KVCache(k=[be.upload(np.zeros((S, Hkv, D), np.float32))],
                        v=[be.upload(np.zeros((S, Hkv, D), np.float32))], capacity=S)  # fmt: skip
        q, gate = be._attn_qk_prep(be.upload(qg), be.upload(k), be.upload(v), be.load_weight(qn),
                                  be.load_weight(kn), 1e-6, cache, 0, pos, 1e7, n_rot)  # fmt: skip
        got[fuse] = [be.download(t) for t in (q, gate, cache.k[0], cache.v[0])]
    for a, b in zip(got[1], got[0], strict=True):
        assert np.array_equal(a, b)
    ref = NumpyBackend()
    cache = KVCache(k=[np.zeros((S, Hkv, D), np.float32)], v=[np.zeros((S, Hkv, D), np.float32)],
                    capacity=S)  # fmt: skip
    q, gate = ref._attn_qk_prep(qg, k, v, ref.load_weight(qn), ref.load_weight(kn), 1e-6, cache, 0,
                               pos, 1e7, n_rot)  # fmt: skip
    for a, b in zip(got[1], (q, gate, cache.k[0], cache.v[0]), strict=True):
        check(a, np.asarray(b, np.float64), 1e-10)


def test_planted_rope_ahead_is_rejected_and_blamed(be, tiny_model_factory):
    """The fused prep's RoPE one position ahead (QK_PREP_ROPE_AHEAD, attn_qk_prep only):
    validate rejects the default config and blames rope_partial's fusion."""
    from tests.mutants import Mutant, assert_validate_catches

    m = Mutant("QK_PREP_ROPE_AHEAD", "cuda", "rope_partial",
               "the fused q/k prep ropes one position ahead", {})  # fmt: skip
    assert_validate_catches(m, tiny_model_factory("qwen35", "q4_k_m"))
