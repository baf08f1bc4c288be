"""attention_decode.gqa (shaders/cuda/attn_decode.cu) and .tile (attn_tile.cu, at the end: the
same checks, and its planted bug caught) against float64 NumPy (`pytest -m gpu`):
ragged shapes (group sizes 1-16, head dims 32-256, positions that leave key ranges empty or
end a tile short), every knob's extremes, twice per config (the per-KV-head tickets reset);
early loads equal late ones to the bit; under int8 decode the fused combine leaves the Q8_1
form the o projection reads; whole tiny models: graph replay equals eager, PDL equals plain
launches, validate passes."""

from __future__ import annotations

import numpy as np
import pytest

from tests.attention_configs import MMVW, attention_flat, model_configs, rope_pair
from tests.cuda_decode_cases import (
    assert_config_graph_equals_eager,
    assert_decode_alike,
    assert_validates,
)
from tests.engine.backends.cuda.test_cuda_ops import INT8_NMSE, PROMPT, _check_q8, _model, cfg
from tests.op_cases import attention_ref, check, dense, qtensor

pytestmark = pytest.mark.gpu

GQA = {"attention_decode.variant": "gqa"}
SHAPES = [  # H, Hkv, D, pos0
    (12, 2, 128, 511), (28, 4, 128, 600), (4, 2, 64, 37), (3, 1, 80, 9), (1, 1, 32, 0),
    (14, 2, 64, 100), (16, 1, 128, 70), (8, 8, 128, 40), (7, 1, 96, 639), (16, 2, 256, 300),
    (8, 1, 256, 33), (2, 1, 160, 64),
]  # fmt: skip
KNOBS = [  # splits, warps, fuse_combine, early
    (16, 4, 1, 1), (4, 4, 0, 0), (64, 8, 1, 0), (8, 2, 0, 1), (32, 1, 1, 1),
]  # fmt: skip


def _inputs(H: int, Hkv: int, D: int, pos0: int, seed: int | None = None):
    rng = np.random.default_rng(H * 1000 + D + pos0 if seed is None else seed)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    k = rng.standard_normal((pos0 + 1, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((pos0 + 1, Hkv, D)).astype(np.float32)
    return q, k, v


def _case(be, H: int, Hkv: int, D: int, pos0: int, room: int = 3, seed: int | None = None):  # noqa: ANN001, ANN202
    """(q, a KV cache of pos0 + room positions holding _inputs' keys and values 0..pos0,
    attention of q at pos0 over it in float64)."""
    q, k, v = _inputs(H, Hkv, D, pos0, seed)
    cache = be.new_kv_cache(1, pos0 + room, Hkv, D)
    be.ops.kv_write(cache, 0, be.upload(k), be.upload(v), 0)
    return q, cache, attention_ref(q, be.download(cache.k[0]), be.download(cache.v[0]), pos0)


def _q8_form(be, flat: dict, H: int, Hkv: int, D: int, pos0: int, what: str):  # noqa: ANN001, ANN202
    """Attention under flat (an int8 decode config) against float64; its output, as the o
    projection reads it ([1, H * D]), must have a Q8_1 form: the output."""
    be.set_config(cfg(**flat))
    q, cache, ref = _case(be, H, Hkv, D, pos0, room=2)
    out = be.ops.attention(be.upload(q), cache, 0, pos0)
    check(be.download(out), ref, 1e-9)
    a = be.ops.reshape(out, (1, H * D))
    hit = be._q8_lookup(a)
    assert hit is not None, f"{what} attention under int8 decode left no Q8_1 form"
    _check_q8(be.download(a), *hit)
    return a


def _check_twice(be, flat: dict, H: int, Hkv: int, D: int, pos0: int) -> None:  # noqa: ANN001
    """Attention under flat against float64, twice (the per-KV-head tickets reset)."""
    q, cache, ref = _case(be, H, Hkv, D, pos0)
    be.set_config(cfg(**flat))
    for _ in range(2):
        check(be.download(be.ops.attention(be.upload(q), cache, 0, pos0)), ref, 1e-9)
    be.set_config(cfg())


def _gqa(splits: int, warps: int, fc: int, early: int) -> dict:
    return attention_flat("gqa", splits=splits, warps=warps, fuse_combine=fc, early=early)


@pytest.mark.parametrize("splits,warps,fc,early", KNOBS)
@pytest.mark.parametrize("H,Hkv,D,pos0", SHAPES)
def test_attention_decode_gqa(be, H, Hkv, D, pos0, splits, warps, fc, early):
    """Against float64; G > 4 x warps (or D > 256) takes attn_split, also checked here."""
    _check_twice(be, _gqa(splits, warps, fc, early), H, Hkv, D, pos0)


@pytest.mark.parametrize("H,Hkv,D,pos0", SHAPES[:4])
def test_attention_decode_gqa_early_is_bit_equal(be, H, Hkv, D, pos0):
    q, cache, _ = _case(be, H, Hkv, D, pos0)
    outs = []
    for early in (0, 1):
        be.set_config(cfg(**_gqa(16, 4, 1, early)))
        outs.append(be.download(be.ops.attention(be.upload(q), cache, 0, pos0)))
    assert np.array_equal(outs[0], outs[1])
    be.set_config(cfg())


@pytest.mark.parametrize("fc", [0, 1])
@pytest.mark.parametrize("H,Hkv,D,pos0", [(12, 2, 128, 0), (28, 4, 128, 600), (4, 2, 64, 37)])
def test_attention_decode_gqa_leaves_the_q8_form(be, H, Hkv, D, pos0, fc):
    """Under matmul_decode.mmvw the (fused or separate) combine writes the output's Q8_1 form,
    which the o projection then reads."""
    a = _q8_form(be, _gqa(16, 4, fc, 1) | MMVW, H, Hkv, D, pos0, "gqa")
    rng = np.random.default_rng(7)
    w = qtensor(rng, (67, H * D), "Q4_K", std=0.05)
    y = be.download(be.ops.matmul(a, be.load_weight(w)))
    check(y, be.download(a).astype(np.float64) @ dense(w).T, INT8_NMSE)
    be.set_config(cfg())


MODEL_CONFIGS = model_configs(GQA, _gqa(4, 1, 0, 0))
# (fused, unfused): attn_gqa's RoPE + KV write against rope_kv's
ROPE_CONFIGS = [rope_pair(GQA), rope_pair(_gqa(4, 2, 1, 0) | MMVW)]


# --- attention_decode.tile (shaders/cuda/attn_tile.cu) ----------------------------------------
TILE = {"attention_decode.variant": "tile"}
TILE_SHAPES = [  # H, Hkv, D, pos0: groups 1, 2, 4, 6, 7 (and 8, 16); one or many tiles / ranges
    (12, 2, 128, 511), (28, 4, 128, 600), (12, 2, 128, 0), (28, 4, 128, 4000), (7, 1, 96, 639),
    (4, 2, 64, 37), (8, 8, 128, 40), (16, 1, 128, 70), (16, 2, 256, 300), (8, 2, 32, 1000),
    (6, 1, 64, 2100), (4, 1, 128, 31), (4, 1, 128, 32), (3, 1, 80, 9),
]  # fmt: skip
TILE_KNOBS = [  # splits, min_keys, warps, fuse_combine, stages
    (32, 64, 4, 1, 2), (8, 32, 2, 1, 2), (128, 32, 8, 1, 2), (16, 256, 4, 1, 2), (64, 32, 4, 0, 2),
    (1, 32, 1, 1, 2), (16, 128, 8, 1, 1), (64, 32, 8, 0, 1),
]  # fmt: skip


def _tile(splits: int, min_keys: int, warps: int, fc: int = 1, stages: int = 2) -> dict:
    knobs = {"splits": splits, "min_keys": min_keys, "warps": warps, "stages": stages}
    return attention_flat("tile", fuse_combine=fc, **knobs)


@pytest.mark.parametrize("splits,min_keys,warps,fc,stages", TILE_KNOBS)
@pytest.mark.parametrize("H,Hkv,D,pos0", TILE_SHAPES)
def test_attention_decode_tile(be, H, Hkv, D, pos0, splits, min_keys, warps, fc, stages):
    """Against float64, twice per config (the per-KV-head tickets reset); shapes the kernel
    cannot take (D % 32 != 0, group > 4 x warps) run attn_split, also checked here."""
    _check_twice(be, _tile(splits, min_keys, warps, fc, stages), H, Hkv, D, pos0)


@pytest.mark.parametrize("fc", [1, 0])
@pytest.mark.parametrize("H,Hkv,D,pos0", [(12, 2, 128, 0), (28, 4, 128, 600), (4, 2, 64, 37)])
def test_attention_decode_tile_leaves_the_q8_form(be, H, Hkv, D, pos0, fc):
    """Under matmul_decode.mmvw the kernel (one range or the combine; fc 0: attn_combine_q8)
    writes the output's Q8_1 form, which the o projection then reads."""
    _q8_form(be, _tile(32, 64, 4, fc) | MMVW, H, Hkv, D, pos0, "tile")
    be.set_config(cfg())


TILE_MODEL_CONFIGS = model_configs(TILE, _tile(8, 32, 2, 0))
TILE_ROPE_CONFIGS = [  # (fused, unfused): attn_tile's RoPE + KV write against rope_kv's
    rope_pair(TILE),
    rope_pair(_tile(8, 32, 2, 0) | MMVW),
    # one 128-key range: the current key in its fourth tile, put in by the tile loop
    rope_pair(_tile(32, 128, 4)),
    # the same with one stage: the loop's refill of stage 0 puts it in
    rope_pair(_tile(32, 128, 8, 1, 1)),
]


# --- whole tiny models under gqa and tile -----------------------------------------------------
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize(
    "flat",
    MODEL_CONFIGS + TILE_MODEL_CONFIGS,
    ids=["gqa", "gqa_s4_w1_nofc", "gqa_mmvw", "tile", "tile_nofc", "tile_mmvw"],
)
def test_gqa_tile_model_graph_equals_eager(be, tiny_model_factory, arch, flat):
    assert_config_graph_equals_eager(be, tiny_model_factory(arch, "q4_k_m"), flat)


@pytest.mark.parametrize(
    "flat",
    MODEL_CONFIGS[:2] + TILE_MODEL_CONFIGS[:2],
    ids=["gqa", "gqa_s4_w1_nofc", "tile", "tile_nofc"],
)
def test_validate_gqa_tile(be, tiny_model_path, flat):
    """The float configs against the default reference with the registry's budget."""
    assert_validates(be, tiny_model_path, flat)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize(
    "pair",
    ROPE_CONFIGS + TILE_ROPE_CONFIGS,
    ids=[
        "gqa_mmvf",
        "gqa_mmvw_s4_w2",
        "tile_mmvf",
        "tile_mmvw_s8_m32_w2_nofc",
        "tile_mmvf_m128_long",
        "tile_mmvf_m128_long_st1",
    ],
)
def test_gqa_tile_fuse_rope_equals_rope_kv(be, tiny_model_factory, arch, pair):
    """attention_decode.fuse_rope (q, k RoPE and the KV write inside attn_gqa / attn_tile)
    decodes to the bit what rope_kv + the same kernel decode (rope_pair's arithmetic), eager
    and replayed. Under tile the current key lands in a range's first or second tile (37-token
    prompt: put in before the loop) or, with min_keys 128 and a 111-token prompt, its fourth
    (put in by the loop)."""
    m = _model(tiny_model_factory(arch, "q4_k_m"), be)
    prompt = PROMPT * 3 if pair in TILE_ROPE_CONFIGS[2:] else PROMPT
    assert_decode_alike(be, m, pair, prompt, "fused RoPE + KV write differs from rope_kv")


def planted_attention_is_caught(be, plant, mutant: str, flat: dict) -> np.ndarray:  # noqa: ANN001
    """The decode-attention kernel tests' check rejects the planted mutant: their 12-head case
    at position 511, built with the bug under flat, is far from float64. Returns the output."""
    from engine.backends.cuda import kernels

    H, Hkv, D, pos0 = 12, 2, 128, 511
    q, cache, ref = _case(be, H, Hkv, D, pos0)
    plant(mutant)
    kernels.clear_cache()
    try:
        be.set_config(cfg(**flat))
        out = be.download(be.ops.attention(be.upload(q), cache, 0, pos0))
        with pytest.raises(AssertionError, match="NMSE"):
            check(out, ref, 1e-9)
    finally:
        plant(None)
        kernels.clear_cache()
        be.set_config(cfg())
    return out


def test_attention_decode_tile_planted_swizzle_is_caught(be, plant):
    """The kernel test above rejects the planted ATTN_TILE_SWIZZLE (V rows read without
    the swizzle)."""
    planted_attention_is_caught(be, plant, "ATTN_TILE_SWIZZLE", TILE)
