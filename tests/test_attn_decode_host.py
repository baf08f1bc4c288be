"""attention_decode.gqa (shaders/cuda/attn_decode.cu) without a GPU (tests/cuda_fake.py): the
host launches attn_gqa once a decode layer with a block per (key range, KV head) and the
kernel's signature, its knobs reach the launch (fuse_combine: no separate combine; early: the
last argument), and shapes it cannot take run attn_split. The kernel itself runs in
tests/test_cuda_attn_decode.py (-m gpu)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine.tuning import TuningConfig
from tests.cuda_fake import FakeCuda

PROMPT = list(range(5, 5 + 12))
GQA = {"attention_decode.variant": "gqa"}


def _decode_launches(tiny_model_factory, flat: dict) -> tuple[list, object]:
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = FakeCuda(TuningConfig.from_flat("cuda", flat))
    m = build_model(open_model(tiny_model_factory("qwen2", "q4_k_m")), be)
    cache = m.new_cache(len(PROMPT) + 2)
    m.prefill(PROMPT, cache)
    be.launches.clear()
    m.forward(be.upload(np.array([1], np.int32)), 1, len(PROMPT), cache)
    return list(be.launches), m


@pytest.mark.parametrize("dec", ["mmvf", "mmvw"])
@pytest.mark.parametrize("fc,early,splits,warps", [(1, 1, 16, 4), (0, 0, 4, 1), (1, 0, 64, 8)])
def test_gqa_launches(tiny_model_factory, dec, fc, early, splits, warps):
    flat = GQA | {
        "matmul_decode.variant": dec,
        "attention_decode.fuse_combine": fc,
        "attention_decode.early": early,
        "attention_decode.splits": splits,
        "attention_decode.warps": warps,
    }
    launches, m = _decode_launches(tiny_model_factory, flat)
    n, hkv = m.spec.n_layers, m.spec.n_head_kv
    gqa = [launch for launch in launches if launch.kernel == "attn_gqa"]
    assert len(gqa) == n
    assert all(g.grid == (splits, hkv, 1) and g.block == (32 * warps, 1, 1) for g in gqa)
    assert all(int(g.args[-1]) == early for g in gqa)
    count = Counter(launch.kernel for launch in launches)
    combine = "attn_combine_q8" if dec == "mmvw" else "attn_combine"
    assert count[combine] == (0 if fc else n)
    assert count["attn_split"] == count["attn_split_kw"] == 0


@pytest.mark.parametrize("H,Hkv,D,warps,ok", [
    (12, 2, 128, 4, True), (28, 4, 128, 1, False), (28, 4, 128, 2, True), (4, 2, 256, 4, False),
    (3, 1, 80, 1, True), (2, 2, 66, 4, False), (64, 1, 64, 8, False), (32, 1, 64, 8, True),
])  # fmt: skip
def test_gqa_limits(H, Hkv, D, warps, ok):
    """The shapes attn_gqa takes (D % 4 == 0, D <= 128, group <= 4 x warps and <= 32); the
    host sends the others to attn_split."""
    assert FakeCuda._gqa_fits(H, Hkv, D, warps) is ok


def test_gqa_falls_back_to_split():
    be = FakeCuda(TuningConfig.from_flat("cuda", GQA))
    q = be.upload(np.zeros((1, 4, 256), np.float32))
    cache = be.new_kv_cache(1, 8, 2, 256)
    be.launches.clear()
    be.attention(q, cache, 0, 5)
    assert [launch.kernel for launch in be.launches] == ["attn_split", "attn_combine"]
