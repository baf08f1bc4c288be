"""The Vulkan int8 decode path (matmul_decode.mmvw, quantize_act, rope.fuse_kv) against NumPy:
lavapipe in CI (subgroup 8), the H200 (subgroup 32) and any device that can require 32 or 64.

mmvw's integer dot products are exact, so it is checked tightly against the float64 product of
the weights with the Q8_1-rounded activations (computed here), and loosely against the float
activations; shapes are ragged (rows not a multiple of any rows-per-workgroup or cluster), x is
a view at every offset mod 4, weights come in row ranges, and canaries sit after every output.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.plan import AttnIn
from engine.tuning import REGISTRY, TuningConfig
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    allowed_config,
    qtensor,
)
from tests.engine.backends.vulkan.test_vulkan_ops import assert_canary_after, poison_free_buffers
from tests.op_cases import check_dot, dense, nmse

MD = "matmul_decode."
MMVW = {MD + "variant": "mmvw"}
# Knob samples: the defaults, small clusters with several rows per lane and rows_per_wg not a
# multiple of what a workgroup covers per pass, one row per workgroup, and the subgroup sizes
# of NVIDIA (32) and RDNA (64) where the device can require them.
SAMPLES = [
    ({}, "default"),
    ({MD + "pair_mul": False, "quantize_act.coalesced": False}, "bytes-q8block"),
    ({MD + "threads_per_row": 4, MD + "rows_per_thread": 4, MD + "rows_per_wg": 8}, "t4-r4-w8"),
    (
        {MD + "wg_size": 32, MD + "threads_per_row": 8, MD + "rows_per_thread": 1,
         MD + "rows_per_wg": 16},
        "wg32-t8-w16",
    ),
    ({MD + "wg_size": 128, MD + "rows_per_wg": 1, MD + "rows_per_thread": 1}, "wg128-w1"),
    ({MD + "unroll": 4}, "u4"),
    ({MD + "unroll": 1, MD + "rows_per_thread": 4, MD + "rows_per_wg": 16}, "u1-r4-w16"),
    ({MD + "subgroup_size": 32, MD + "wg_size": 64, MD + "rows_per_wg": 8}, "sg32"),
    ({MD + "subgroup_size": 64, MD + "wg_size": 128, MD + "threads_per_row": 16}, "sg64-t16"),
    ({MD + "subgroup_size": 64, MD + "wg_size": 64, MD + "pair_mul": False}, "sg64-bytes"),
]  # fmt: skip


pytestmark = pytest.mark.usefixtures("clean_vb")


def _cfg(vb, flat: dict) -> TuningConfig:  # noqa: ANN001
    return allowed_config(vb, MMVW | flat)


def q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [K] as Q8_1 blocks of 32: (rounded values x~ float64, int8 values, scales d)."""
    b = np.asarray(x, np.float32).reshape(-1, 32)
    d = np.abs(b).max(1, keepdims=True) / np.float32(127)
    inv = np.where(d > 0, 1 / np.where(d > 0, d, 1), 0).astype(np.float32)
    q = np.clip(np.round(b * inv), -127, 127)
    return (q * d.astype(np.float64)).reshape(-1), q.astype(np.int8).reshape(-1), d.reshape(-1)


QKV_SHAPE = (256, 4, 2, 64)  # C, H, Hkv, D of the attn_in tests


def _qkv(vb, rng: np.random.Generator, types: tuple[str, str, str]) -> tuple:  # noqa: ANN001
    """(host q/k/v weights, loaded, loaded F32 biases) of QKV_SHAPE in these types."""
    C, H, Hkv, D = QKV_SHAPE
    wq = [qtensor(rng, (n, C), q) for n, q in zip((H * D, Hkv * D, Hkv * D), types, strict=True)]
    wv = tuple(vb.load_weight(w) for w in wq)
    bs = tuple(vb.load_weight(qtensor(rng, (w.shape[0],), "F32", std=1.0)) for w in wq)
    return wq, wv, bs


def _x_view(vb, x: np.ndarray, off: int):  # noqa: ANN001, ANN202
    buf = vb.upload(np.concatenate([[np.nan] * off, x, [np.nan] * 5]).astype(np.float32))
    return vb.ops.reshape(vb.ops.rows(buf, off, off + x.size), (1, x.size))


@pytest.mark.parametrize("flat", [s[0] for s in SAMPLES], ids=[s[1] for s in SAMPLES])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
def test_mmvw_dots_the_rounded_activations(vb, flat, qtype):
    vb.set_config(_cfg(vb, flat))
    rng = np.random.default_rng(len(qtype) * 7 + len(flat))
    for n, k, split in ((1, 256, 0), (37, 768, 0), (130, 512, 9)):
        w = qtensor(rng, (n, k), qtype)
        old = vb.max_weight_bytes
        if split:  # row ranges of 9 rows: each range's y offset, a short last one
            vb.max_weight_bytes = w.raw.shape[1] * split + 3
        try:
            wv = vb.load_weight(w)
        finally:
            vb.max_weight_bytes = old
        assert len(wv.parts) == (-(-n // split) if split else 1)
        ref_w = dense(w)
        for off in (0, 1, 2, 3):
            x = rng.standard_normal(k).astype(np.float32)
            poison_free_buffers(vb, n)
            y = vb.ops.matmul(_x_view(vb, x, off), wv)
            out = vb.download(y)
            xr, _, _ = q8_1(x)
            check_dot(out, xr[None], ref_w, 1e-10)  # integer dots: exact up to float sums
            check_dot(out, x[None], ref_w, 5e-3)  # and close to the float product
            if y.buf.host is not None:  # canaries need host-visible memory (not the H200's)
                assert_canary_after(vb, y)


def test_three_matrices_and_adds_in_one_dispatch(vb):
    """q/k/v-like: Q4_K, Q6_K and a Q4_K split into ranges (four jobs: two dispatches) into one
    output buffer at offsets, biases added to two of them."""
    vb.set_config(_cfg(vb, {MD + "rows_per_wg": 2}))
    rng = np.random.default_rng(11)
    K = 512
    ws = [qtensor(rng, (n, K), q) for n, q in ((45, "Q4_K"), (13, "Q6_K"), (29, "Q4_K"))]
    wv = [vb.load_weight(w) for w in ws[:2]]
    old = vb.max_weight_bytes
    vb.max_weight_bytes = ws[2].raw.shape[1] * 16
    try:
        wv.append(vb.load_weight(ws[2]))
    finally:
        vb.max_weight_bytes = old
    assert [len(w.parts) for w in wv] == [1, 1, 2]
    adds = [rng.standard_normal(45).astype(np.float32), None, rng.standard_normal(29)]
    x = rng.standard_normal(K).astype(np.float32)
    y = vb._new((45 + 13 + 29,))
    mats = [
        (w, y, o, None if a is None else vb.upload(a))
        for w, o, a in zip(wv, (0, 45, 58), adds, strict=True)
    ]
    xt = vb.upload(x[None])
    vb.synchronize()
    before = vb.stats()["dispatches"]
    vb._mmvw(xt, mats)
    out = vb.download(y)
    assert vb.stats()["dispatches"] - before == 3  # quantize + two mmvw
    xr, _, _ = q8_1(x)
    for w, o, a in zip(ws, (0, 45, 58), adds, strict=True):
        seg = out[o : o + w.shape[0]]
        want = xr @ dense(w).T + (0 if a is None else a)
        assert nmse(want, seg) < 1e-10, (w.qtype, o)


@pytest.mark.parametrize(
    "flat",
    [{}, {"quantize_act.coalesced": False}, {"quantize_act.wg_size": 32}],
    ids=["coalesced", "per-block", "coalesced-wg32"],
)
@pytest.mark.parametrize("D", [256, 96, 1056])
def test_norm_and_swiglu_store_their_q8_form(vb, D, flat):
    """Under mmvw a one-row rms_norm / swiglu stores the float row as before and its Q8_1 form,
    which the next matmul of that row reads instead of quantizing it again (rows longer than a
    workgroup: several workgroups, a ragged last one)."""
    rng = np.random.default_rng(D)
    x = rng.standard_normal((1, D)).astype(np.float32) * 3
    nw = vb.load_weight(qtensor(rng, (D,), "F32", std=1.0))
    g, u = (rng.standard_normal((1, D)).astype(np.float32) for _ in range(2))
    plain = [vb.download(vb.ops.rms_norm(vb.upload(x), nw, 1e-6))]
    plain.append(vb.download(vb.ops.swiglu(vb.upload(g), vb.upload(u))))
    vb.set_config(_cfg(vb, flat))
    for i, t in enumerate(
        (vb.ops.rms_norm(vb.upload(x), nw, 1e-6), vb.ops.swiglu(vb.upload(g), vb.upload(u)))
    ):
        out = vb.download(t)
        assert np.allclose(out, plain[i], rtol=1e-6, atol=1e-6)
        q8 = vb._q8_lookup(t)
        assert q8 is not None
        words = vb.download(q8).view(np.uint32)
        qs = words[: D // 4].view(np.int8)
        ds = words[D // 4 :].view(np.float32).reshape(-1, 2)
        _, q_ref, d_ref = q8_1(out.reshape(-1))
        assert np.abs(qs.astype(int) - q_ref).max() <= 1 and (qs != q_ref).sum() <= 2
        assert np.allclose(ds[:, 0], d_ref, rtol=1e-6)
        assert np.allclose(ds[:, 1], ds[:, 0] * qs.reshape(-1, 32).sum(1), rtol=1e-5)
        if D % 256 == 0:  # the matmul reads that form: one dispatch, no quantize
            w = qtensor(rng, (9, D), "Q4_K")
            wt = vb.load_weight(w)
            vb.synchronize()
            before = vb.stats()["dispatches"]
            y = vb.download(vb.ops.matmul(t, wt))
            assert vb.stats()["dispatches"] - before == 1
            check_dot(y, q8_1(out.reshape(-1))[0][None], dense(w), 1e-10)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("T,pos0", [(1, 0), (1, 37), (5, 9)])
def test_attn_in_fused_matches_unfused(vb, T, pos0, bias):
    """rope.fuse_kv gives what rope + rope + kv_write give (same arithmetic: bitwise on the
    default float path), at decode and for a chunk, with and without biases; under mmvw the
    whole attn_in stays within int8 error of the float path; no cache slot outside the written
    positions changes."""
    rng = np.random.default_rng(T * 100 + pos0)
    C, H, Hkv, D = QKV_SHAPE
    wq, wv, bs = _qkv(vb, rng, ("Q4_K", "Q4_K", "Q6_K"))
    h = rng.standard_normal((T, C)).astype(np.float32)
    runs = {}
    for name, flat in (("plain", {}), ("fused", {"rope.fuse_kv": 1}),
                       ("mmvw", MMVW), ("mmvw_fused", MMVW | {"rope.fuse_kv": 1})):  # fmt: skip
        vb.set_config(TuningConfig.default("vulkan").replace(**flat))
        cache = vb.new_kv_cache(1, pos0 + T + 3, Hkv, D)
        a = AttnIn(vb.upload(h), wv, bs if bias else None, cache, 0, pos0, (H, Hkv, D), 1e6, True)
        q = vb._attn_in(a)
        runs[name] = (vb.download(q), vb.download(cache.k[0]), vb.download(cache.v[0]))
    for name, (_, k, v) in runs.items():
        assert not k[:pos0].any() and not k[pos0 + T :].any(), name
        assert not v[:pos0].any() and not v[pos0 + T :].any(), name
    for a, b in zip(runs["plain"], runs["fused"], strict=True):
        assert np.array_equal(a, b)
    for name in ("mmvw", "mmvw_fused"):
        for a, b in zip(runs["plain"], runs[name], strict=True):
            assert nmse(a, b) < 5e-3, name
    for a, b in zip(runs["mmvw"], runs["mmvw_fused"], strict=True):
        assert np.array_equal(a, b)


def test_matmul_add_and_ffn_under_mmvw(vb):
    rng = np.random.default_rng(5)
    C, F = 256, 512
    wg, wu = qtensor(rng, (F, C), "Q4_K"), qtensor(rng, (F, C), "Q4_K")
    wd = qtensor(rng, (C, F), "Q6_K")
    h = rng.standard_normal((1, C)).astype(np.float32)
    r = rng.standard_normal((1, C)).astype(np.float32)
    vb.set_config(_cfg(vb, {}))
    ws = [vb.load_weight(w) for w in (wg, wu, wd)]
    ht, rt = vb.upload(h), vb.upload(r)
    vb.synchronize()
    before = vb.stats()["dispatches"]
    out = vb.download(vb._ffn(ht, *ws, rt))
    assert vb.stats()["dispatches"] - before == 4  # quantize, gate+up, swiglu+q8, down+r
    h64 = h.astype(np.float64)
    gg, uu = h64 @ dense(wg).T, h64 @ dense(wu).T
    ref = (gg / (1 + np.exp(-gg)) * uu) @ dense(wd).T + r
    assert nmse(ref, out) < 5e-3
    y = vb.download(vb._matmul_add(vb.upload(h), ws[0], vb.upload(np.ones((1, F), np.float32))))
    assert nmse(h64 @ dense(wg).T + 1, y) < 5e-3


def test_registry_classes_and_constraints(vb):
    v = REGISTRY.op("vulkan", "matmul_decode").variant("mmvw")
    assert v.numeric == "int8_activations"
    assert REGISTRY.op("vulkan", "quantize_act").variant("q8_1").numeric == "order_only"
    sg = vb.device_info().subgroup_size
    too_wide = [t for t in (4, 8, 16, 32, 64) if t > sg]
    if too_wide:
        cfg = TuningConfig.default("vulkan").replace(
            **MMVW, **{MD + "threads_per_row": too_wide[0]}
        )
        assert any("threads_per_row" in p for p in cfg.problems(vb.device_info()))


@pytest.mark.parametrize("H,Hkv,D,pos0", [(4, 2, 64, 37), (7, 1, 96, 5), (2, 2, 128, 0)])
def test_attention_merge_stores_the_q8_form(vb, H, Hkv, D, pos0):
    """Under mmvw the decode attention's merge pass also stores its output row as Q8_1 (each
    workgroup its head's blocks); the output itself is the float path's, bit for bit."""
    rng = np.random.default_rng(H * D + pos0)
    cache = vb.new_kv_cache(1, pos0 + 4, Hkv, D)
    k = rng.standard_normal((pos0 + 1, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((pos0 + 1, Hkv, D)).astype(np.float32)
    vb.ops.kv_write(cache, 0, vb.upload(k), vb.upload(v), 0)
    q = vb.upload(rng.standard_normal((1, H, D)).astype(np.float32))
    plain = vb.download(vb.ops.attention(q, cache, 0, pos0))
    vb.set_config(_cfg(vb, {}))
    out_t = vb.ops.attention(q, cache, 0, pos0)
    out = vb.download(out_t)
    assert np.array_equal(out, plain)
    q8 = vb._q8_lookup(out_t.reshape((1, H * D)))
    assert q8 is not None
    words = vb.download(q8).view(np.uint32)
    n = H * D
    qs, ds = words[: n // 4].view(np.int8), words[n // 4 :].view(np.float32).reshape(-1, 2)
    _, q_ref, d_ref = q8_1(out.reshape(-1))
    assert np.abs(qs.astype(int) - q_ref).max() <= 1 and (qs != q_ref).sum() <= 2
    assert np.allclose(ds[:, 0], d_ref, rtol=1e-6)


@pytest.mark.parametrize("mmvw", [False, True])
@pytest.mark.parametrize(
    "T,H,Hkv,D,pos0,splits",
    [(1, 4, 2, 64, 37, 8), (1, 7, 1, 96, 300, 32), (1, 2, 2, 128, 2, 64), (5, 4, 2, 64, 20, 4)],
)
def test_attention_fuse_combine(vb, T, H, Hkv, D, pos0, splits, mmvw):
    """attention.fuse_combine: the last range of a head merges, in the partial dispatch; the
    output is the two-dispatch output bit for bit (the same merge code), for decode (more ranges
    than keys included) and a prefill chunk, repeatedly (the tickets are reset each time), and
    under mmvw the Q8_1 form is stored as by merge_q8."""
    rng = np.random.default_rng(T * H + pos0)
    cache = vb.new_kv_cache(1, pos0 + T + 2, Hkv, D)
    L = pos0 + T
    k = rng.standard_normal((L, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((L, Hkv, D)).astype(np.float32)
    vb.ops.kv_write(cache, 0, vb.upload(k), vb.upload(v), 0)
    q = vb.upload(rng.standard_normal((T, H, D)).astype(np.float32))
    split = {"attention.splits": splits, "attention.splits_prefill": splits}
    base = MMVW if mmvw else {}
    vb.set_config(TuningConfig.default("vulkan").replace(**base, **split))
    want_t = vb.ops.attention(q, cache, 0, pos0)
    want = vb.download(want_t)
    want_q8 = vb._q8_lookup(want_t.reshape((T, H * D)))
    vb.set_config(TuningConfig.default("vulkan").replace(**base, **split, **{
        "attention.fuse_combine": 1}))  # fmt: skip
    for _ in range(3):
        vb.synchronize()
        before = vb.stats()["dispatches"]
        got_t = vb.ops.attention(q, cache, 0, pos0)
        assert np.array_equal(vb.download(got_t), want)
        assert vb.stats()["dispatches"] - before == 1
        got_q8 = vb._q8_lookup(got_t.reshape((T, H * D)))
        assert (got_q8 is None) == (want_q8 is None) == (not mmvw or T > 1)
        if got_q8 is not None:
            assert np.array_equal(vb.download(got_q8), vb.download(want_q8))
    assert not vb.download(vb._ticket_buf).any()


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize(
    "flat",
    [{}, {MD + "rows_per_thread": 4, MD + "rows_per_wg": 8, MD + "threads_per_row": 4}],
    ids=["default", "r4-w8-t4"],
)
@pytest.mark.parametrize("pos0,bias", [(0, True), (13, False), (40, True)])
def test_fuse_rope_is_fused_kv_bit_for_bit(vb, flat, neox, pos0, bias):
    """matmul_decode.fuse_rope: q/k/v, biases, both ropes and the KV write in the mmvw
    dispatch give exactly what mmvw + rope.fuse_kv gives (same sums, same rotation), the
    cache's other slots untouched; one dispatch after the quantize."""
    rng = np.random.default_rng(pos0 * 3 + neox)
    C, H, Hkv, D = QKV_SHAPE
    wq, wv, bs = _qkv(vb, rng, ("Q4_K", "Q6_K", "Q4_K"))
    h = rng.standard_normal((1, C)).astype(np.float32)
    runs = []
    for extra in ({"rope.fuse_kv": 1}, {MD + "fuse_rope": 1}):
        vb.set_config(_cfg(vb, flat | extra))
        cache = vb.new_kv_cache(1, pos0 + 4, Hkv, D)
        ht = vb.upload(h)
        vb.synchronize()
        before = vb.stats()["dispatches"]
        q = vb._attn_in(
            AttnIn(ht, wv, bs if bias else None, cache, 0, pos0, (H, Hkv, D), 1e4, neox)
        )
        runs.append((vb.download(q), vb.download(cache.k[0]), vb.download(cache.v[0])))
        n = vb.stats()["dispatches"] - before
    assert n == 2  # quantize + mmvw with the epilogue
    for a, b in zip(*runs, strict=True):
        assert np.array_equal(a, b)
    _, k, v = runs[1]
    assert k[pos0].any() and v[pos0].any()
    assert not np.delete(k, pos0, axis=0).any() and not np.delete(v, pos0, axis=0).any()


def test_fuse_rope_needs_row_pairs(vb):
    cfg = TuningConfig.default("vulkan").replace(
        **MMVW, **{MD + "fuse_rope": 1, MD + "rows_per_thread": 1}
    )
    assert any("fuse_rope" in p for p in cfg.problems(None))
