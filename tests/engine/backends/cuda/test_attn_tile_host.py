"""attention_decode.tile (shaders/cuda/attn_tile.cu) without a GPU: the host launches attn_tile
once a decode layer (grid SPLITS x Hkv, the kernel's signature checked by tests/cuda_fake.py) and
no combine, leaves the Q8_1 form under int8 decode, sends the shapes it cannot take to
attn_split; the kernel's range cutting covers every key once; and a NumPy model of the kernel's
arithmetic (ranges, 32-key tiles, the online softmax, the combine 16 ranges at a time) equals the
reference on ragged shapes, so a wrong merge formula shows here before it reaches a device. The
kernel itself runs in tests/engine/backends/cuda/test_cuda_attn_decode.py (-m gpu)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine.backends.cuda.attn_tile import KT, ranges, smem_bytes, tile_fits
from tests.attention_configs import attention_flat
from tests.attn_split_emul import assert_equals_reference, split_attention
from tests.cuda_fake import (
    assert_attention_falls_back_to_split,
    assert_attention_fusion_bypassed,
    decode_step,
    fused_rope_launches,
)

PROMPT = list(range(5, 5 + 12))
TILE = {"attention_decode.variant": "tile"}


def _decode_launches(tiny_model_factory, flat: dict) -> tuple[list, object]:
    return decode_step(tiny_model_factory("qwen2", "q4_k_m"), flat, PROMPT)


@pytest.mark.parametrize("dec", ["mmvf", "mmvw"])
@pytest.mark.parametrize("splits,min_keys,warps,fc,stages", [
    (32, 64, 4, 1, 2), (8, 32, 2, 1, 1), (128, 256, 8, 1, 2), (32, 64, 4, 0, 1), (1, 32, 1, 1, 2),
])  # fmt: skip
def test_tile_launches(tiny_model_factory, dec, splits, min_keys, warps, fc, stages):
    """One attn_tile a layer; fuse_combine 0: out and the Q8_1 buffers null, then a combine."""
    flat = attention_flat(
        "tile", dec, splits=splits, min_keys=min_keys, warps=warps, fuse_combine=fc, stages=stages
    )
    launches, m = _decode_launches(tiny_model_factory, flat)
    n, hkv, hd = m.spec.n_layers, m.spec.n_head_kv, m.spec.head_dim
    tiles = [launch for launch in launches if launch.kernel == "attn_tile"]
    assert len(tiles) == n
    assert all(t.grid == (splits, hkv, 1) and t.block == (32 * warps, 1, 1) for t in tiles)
    assert all(int(t.args[11]) == min_keys and int(t.args[12]) == stages for t in tiles)
    assert all(t.smem == smem_bytes(m.spec.n_head // hkv, hd, stages) for t in tiles)
    assert smem_bytes(6, 128, 1) < 48 * 1024 < smem_bytes(6, 128, 2)
    q8 = [not isinstance(t.args[14], np.uint64) for t in tiles]  # xq; null: np.uint64(0)
    assert all(q8) if dec == "mmvw" and fc else not any(q8)
    assert all(isinstance(t.args[13], np.uint64) != bool(fc) for t in tiles)  # out
    count = Counter(launch.kernel for launch in launches)
    combine = "attn_combine_q8" if dec == "mmvw" else "attn_combine"
    assert count[combine] == (0 if fc else n)
    assert count["attn_split"] == count["attn_split_kw"] == count["attn_gqa"] == 0
    skip = 1 if fc else 2  # the o projection after the kernel (and its combine)
    after = [launches[i + skip].kernel for i, x in enumerate(launches) if x.kernel == "attn_tile"]
    assert all(a.startswith(dec) for a in after)  # the o projection: no quantize (Q8_1 form)


@pytest.mark.parametrize("H,Hkv,D,warps,ok", [
    (12, 2, 128, 4, True), (28, 4, 128, 2, True), (28, 4, 128, 1, False), (16, 2, 256, 2, True),
    (4, 2, 288, 4, False), (4, 2, 80, 4, False), (2, 2, 32, 2, True), (32, 1, 64, 8, True),
    (64, 1, 64, 8, False), (6, 4, 64, 4, False), (4, 1, 128, 1, True), (5, 1, 128, 1, False),
])  # fmt: skip
def test_tile_limits(H, Hkv, D, warps, ok):
    assert tile_fits(H, Hkv, D, warps, 4096) is ok


def test_tile_falls_back_to_split():
    assert_attention_falls_back_to_split(TILE, 80)


@pytest.mark.parametrize("splits", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("min_keys", [32, 64, 128, 256])
def test_ranges_cover_every_key_once(splits, min_keys):
    """Every active range is non-empty (the combine's max is finite), they tile [0, L), and
    there are at most splits of them; chunks are whole tiles."""
    for L in [*range(1, 300), 511, 512, 513, 2047, 2048, 8191, 8192, 8193, 40_000]:
        chunk, nact = ranges(L, splits, min_keys)
        assert 1 <= nact <= splits and chunk % KT == 0
        assert (nact - 1) * chunk < L <= nact * chunk


def _tile_model(q, k, v, pos0: int, splits: int, min_keys: int) -> np.ndarray:
    """attn_tile's arithmetic in float32 NumPy: q [H, D], k, v [S, Hkv, D] -> out [H, D]."""

    def part(qh, kk, vv, kb: int, ke: int, scale):  # noqa: ANN001, ANN202 - one range, KT a tile
        m, lsum, acc = -np.inf, np.float32(0), np.zeros(q.shape[1], np.float32)
        for t0 in range(kb, ke, KT):
            t1 = min(t0 + KT, ke)
            sc = (kk[t0:t1] @ qh) * scale
            mn = max(m, sc.max())
            corr, p = np.float32(np.exp(m - mn)), np.exp(sc - mn).astype(np.float32)
            lsum = lsum * corr + p.sum()
            acc = acc * corr + p @ vv[t0:t1]
            m = mn
        return m, lsum, acc

    chunk, nact = ranges(pos0 + 1, splits, min_keys)
    return split_attention(q, k, v, pos0, chunk, nact, part)


@pytest.mark.parametrize("H,Hkv,D", [(12, 2, 128), (28, 4, 64), (4, 4, 32), (8, 2, 32), (7, 1, 64)])
@pytest.mark.parametrize("pos0", [0, 31, 32, 100, 517, 1300])
@pytest.mark.parametrize("splits,min_keys", [(32, 64), (8, 32), (128, 32), (16, 256)])
def test_tile_arithmetic_equals_the_reference(H, Hkv, D, pos0, splits, min_keys):
    assert_equals_reference(
        lambda q, k, v: _tile_model(q, k, v, pos0, splits, min_keys), H, Hkv, D, pos0
    )


@pytest.mark.parametrize("dec", ["mmvf", "mmvw"])
def test_tile_fuse_rope_launches(tiny_model_factory, dec):
    """attention_decode.tile fuse_rope: no rope / rope_kv / kv_write launch at decode; attn_tile
    gets the k and v projections (non-null), theta and the neox flag; a bypassed fusion."""
    flat = TILE | {"matmul_decode.variant": dec, "attention_decode.fuse_rope": 1,
                   "rope.fuse_kv": 1}  # fmt: skip
    launches, m = _decode_launches(tiny_model_factory, flat)
    fused_rope_launches(launches, m, "attn_tile", knew=-4, vnew=-3, neox=-1)
    assert_attention_fusion_bypassed(flat, TILE | {"matmul_decode.variant": dec})


def test_tile_without_fuse_rope_passes_null_projections(tiny_model_factory):
    launches, _ = _decode_launches(tiny_model_factory, TILE | {"rope.fuse_kv": 1})
    tiles = [launch for launch in launches if launch.kernel == "attn_tile"]
    assert tiles and all(isinstance(t.args[-4], np.uint64) for t in tiles)
    assert Counter(launch.kernel for launch in launches)["rope_kv"] == len(tiles)
