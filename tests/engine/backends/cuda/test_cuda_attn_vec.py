"""attention_decode.vec (shaders/cuda/attn_vec.cu) against float64 NumPy (`pytest -m gpu`):
ragged shapes (groups 1, 3, 5, 6, 7, 8 over attn_vec4 / attn_vec8, head dims 32-128, contexts
that end an 8-key round, a block's round of warps or a range short, one range and up to 256),
every knob's extremes, twice per config (the per-KV-head tickets reset); under int8 decode the
kernel (one range, or its fused combine, or attn_combine_q8) leaves the Q8_1 form the o
projection reads; whole tiny models: graph replay equals eager, validate passes, fuse_rope
decodes to the bit what rope_kv + attn_vec decode (normal and neox RoPE, the current key in
different warps, rounds and ranges); the planted ATTN_VEC_COMBINE_W and ATTN_VEC_ROPE_K are
caught."""

from __future__ import annotations

import numpy as np
import pytest

from tests.attention_configs import MMVW, attention_flat, model_configs, rope_pair
from tests.cuda_decode_cases import (
    assert_config_graph_equals_eager,
    assert_decode_alike,
    assert_validates,
)
from tests.engine.backends.cuda.test_cuda_attn_decode import (
    _case,
    _q8_form,
    planted_attention_is_caught,
)
from tests.engine.backends.cuda.test_cuda_ops import PROMPT, _model, cfg
from tests.op_cases import check

pytestmark = pytest.mark.gpu

VEC = {"attention_decode.variant": "vec"}
SHAPES = [  # H, Hkv, D, pos0: groups 6 and 7 (the 1.5B / 7B, 0.5B) first, then 1, 3, 5, 8
    (12, 2, 128, 511), (28, 4, 128, 600), (12, 2, 128, 0), (28, 4, 128, 2500), (7, 1, 96, 639),
    (14, 2, 64, 100), (6, 1, 128, 37), (3, 1, 80, 9), (5, 1, 128, 1000), (16, 2, 128, 70),
    (8, 8, 128, 40), (1, 1, 32, 0), (4, 2, 64, 7), (4, 2, 64, 8), (40, 8, 128, 333),
]  # fmt: skip
KNOBS = [  # splits, min_keys, warps, fuse_combine, cluster, prefetch
    (64, 32, 4, 1, 0, 0), (8, 8, 1, 1, 0, 1), (256, 8, 8, 1, 0, 0), (16, 128, 2, 1, 0, 1),
    (64, 32, 4, 0, 0, 0), (8, 16, 8, 0, 0, 1), (64, 32, 4, 1, 1, 0), (8, 8, 1, 0, 1, 1),
    (64, 128, 8, 1, 1, 0), (8, 16, 2, 1, 1, 1),
]  # fmt: skip


def _vec(splits: int, min_keys: int, warps: int, fc: int = 1, cl: int = 0, pf: int = 0) -> dict:
    knobs = {"prefetch": pf, "splits": splits, "min_keys": min_keys, "warps": warps}
    return attention_flat("vec", fuse_combine=fc, cluster=cl, **knobs)


@pytest.mark.parametrize("splits,min_keys,warps,fc,cl,pf", KNOBS)
@pytest.mark.parametrize("H,Hkv,D,pos0", SHAPES)
def test_attention_decode_vec(be, H, Hkv, D, pos0, splits, min_keys, warps, fc, cl, pf):
    """Against float64, twice per config (the per-KV-head tickets reset)."""
    q, cache, ref = _case(be, H, Hkv, D, pos0)
    be.set_config(cfg(**_vec(splits, min_keys, warps, fc, cl, pf)))
    names: list[str] = []
    launch = be._launch
    be._launch = lambda mod, name, *a, **k: (names.append(name), launch(mod, name, *a, **k))
    try:
        for _ in range(2):
            check(be.download(be.ops.attention(be.upload(q), cache, 0, pos0)), ref, 1e-9)
    finally:
        del be._launch
    assert names[0] == ("attn_vec4" if H // Hkv <= 4 else "attn_vec8") + ("_c" if cl else ""), names
    be.set_config(cfg())


@pytest.mark.parametrize("fc,cl", [(1, 0), (0, 0), (1, 1)])
@pytest.mark.parametrize("H,Hkv,D,pos0", [(12, 2, 128, 0), (28, 4, 128, 600), (4, 2, 64, 37),
                                          (7, 1, 128, 300)])  # fmt: skip
def test_attention_decode_vec_leaves_the_q8_form(be, H, Hkv, D, pos0, fc, cl):
    """Under matmul_decode.mmvw the kernel (one range or the combine; fc 0: attn_combine_q8;
    cluster: the cluster's merge) writes the output's Q8_1 form, which the o projection reads."""
    flat = _vec(64, 32, 4, fc, cl) | MMVW
    _q8_form(be, flat, H, Hkv, D, pos0, "vec")
    be.set_config(cfg())


MODEL_CONFIGS = [
    *model_configs(VEC, _vec(8, 8, 1, 0)),
    _vec(64, 8, 1, 1, 1) | MMVW | {"rope.fuse_kv": 1},
]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize(
    "flat", MODEL_CONFIGS, ids=["vec", "vec_s8_m8_w1_nofc", "vec_mmvw", "vec_cluster_m8_w1"]
)
def test_vec_model_graph_equals_eager(be, tiny_model_factory, arch, flat):
    assert_config_graph_equals_eager(be, tiny_model_factory(arch, "q4_k_m"), flat)


@pytest.mark.parametrize("flat", MODEL_CONFIGS[:2], ids=["vec", "vec_s8_m8_w1_nofc"])
def test_validate_vec(be, tiny_model_path, flat):
    """The float configs against the default reference with the registry's budget."""
    assert_validates(be, tiny_model_path, flat)


def test_attention_decode_vec_planted_combine_is_caught(be, plant):
    """The kernel test above rejects the planted ATTN_VEC_COMBINE_W (the combine adds the
    ranges' partials unweighted); its output stays finite."""
    out = planted_attention_is_caught(be, plant, "ATTN_VEC_COMBINE_W", VEC)
    assert np.isfinite(out).all()


ROPE_PAIRS = [  # (fused, unfused): attn_vec's RoPE + KV write against rope_kv's
    rope_pair(VEC),
    # int8 decode, a separate combine, one warp a block: the current key in many ranges
    rope_pair(_vec(8, 8, 1, 0) | MMVW),
    # one 128-key range of 2 warps: the current key in a later round of either warp
    rope_pair(_vec(16, 128, 2)),
    # 8 warps, 64-key ranges
    rope_pair(_vec(64, 64, 8) | MMVW),
    # a cluster of one-warp blocks: the current key in the last active range of 8
    rope_pair(_vec(8, 8, 1, 1, 1, 1) | MMVW),
]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("pair", ROPE_PAIRS, ids=["vec", "mmvw_s8_m8_w1_nofc", "m128_w2",
                                                  "mmvw_m64_w8", "mmvw_cluster_w1"])  # fmt: skip
@pytest.mark.parametrize("long", [False, True], ids=["p12", "p111"])
def test_vec_fuse_rope_equals_rope_kv(be, tiny_model_factory, arch, pair, long):
    """attention_decode.vec fuse_rope (q, k RoPE and the KV write inside attn_vec) decodes to
    the bit what rope_kv + attn_vec decode (rope_pair's arithmetic), eager and replayed."""
    m = _model(tiny_model_factory(arch, "q4_k_m"), be)
    prompt = PROMPT * 9 + PROMPT[:3] if long else PROMPT
    assert_decode_alike(be, m, pair, prompt, "fused RoPE + KV write differs from rope_kv")


def test_vec_planted_rope_k_is_caught(be, tiny_model_factory, plant):
    """The fuse_rope test above rejects the planted ATTN_VEC_ROPE_K (the current key
    scored unroped, though written roped): the fused decode's logits differ from rope_kv's."""
    from engine.backends.cuda import kernels

    m = _model(tiny_model_factory("qwen2", "q4_k_m"), be)
    plant("ATTN_VEC_ROPE_K")
    kernels.clear_cache()
    try:
        with pytest.raises(AssertionError):
            assert_decode_alike(be, m, ROPE_PAIRS[0], PROMPT, "fused RoPE differs")
    finally:
        plant(None)
        kernels.clear_cache()
        be.set_config(cfg())
