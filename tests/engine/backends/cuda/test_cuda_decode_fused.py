"""The CUDA decode fusions against the NumPy reference (`pytest -m gpu`): matmul_decode.mmvw
(every block type, each knob's extremes, ragged N, up to three matrices per launch with bias or
residual added), rope_kv (rope.fuse_kv) against the unfused ops, attn_combine_q8, the fused ops
attn_in / matmul_add / ffn, mmvw_glu (fuse_swiglu) and mmvw_norm (fuse_norm) with the fused
ops ffn_norm / matmul_add_norm, and whole tiny models: graph replay equals eager decode and
validate passes. Output canaries around every result; inputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.base import Backend
from engine.backends.numpy_ref import NumpyBackend
from engine.backends.plan import AttnIn
from tests.cuda_decode_cases import MMVW, matrices_with_adds, mmvw_model
from tests.cuda_decode_cases import mmvw_knobs as mmvw
from tests.engine.backends.cuda.test_cuda_attn_decode import _case
from tests.engine.backends.cuda.test_cuda_ops import (
    INT8_NMSE,
    PROMPT,
    _check_q8,
    _model,
    assert_ragged_matmul_into,
    cfg,
    k_for,
)
from tests.op_cases import (
    assert_graph_equals_eager,
    assert_hooked_matches,
    check,
    dense,
    qtensor,
    seed_of,
)

pytestmark = pytest.mark.gpu


BLOCK_QTYPES = ["Q8_0", "Q5_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K"]
MMVW_CONFIGS = [
    ("defaults", {}),
    ("t8-r4-w8-u4", {"threads_per_row": 8, "rows_per_thread": 4, "warps": 8, "unroll": 4}),
    ("t16-r2-w1-u1", {"threads_per_row": 16, "rows_per_thread": 2, "warps": 1, "unroll": 1}),
    ("t32-r4-w2-u1", {"threads_per_row": 32, "rows_per_thread": 4, "warps": 2, "unroll": 1}),
    ("t8-r1-w4-u2", {"threads_per_row": 8, "rows_per_thread": 1, "warps": 4, "unroll": 2}),
    # the load-hint / occupancy / deep-unroll knobs (issue 14): same arithmetic, other loads
    (
        "t16-r2-u8-wl2-mb8",
        {"threads_per_row": 16, "rows_per_thread": 2, "unroll": 8, "wload": 2, "min_blocks": 8},
    ),  # fmt: skip
    ("t32-r1-u8-wl1-mb12", {"unroll": 8, "wload": 1, "min_blocks": 12}),
    # weights staged in shared memory by a bulk copy (stage), with and without the L2 prefetch
    ("stage", {"stage": 1}),
    (
        "t8-r4-w8-stage-pf",
        {"threads_per_row": 8, "rows_per_thread": 4, "warps": 8, "stage": 1, "prefetch": 1},
    ),  # fmt: skip
    # wide Q4_K slots (64 weights a lane), alone and with split-K / stage / 8 lanes a row
    ("wide", {"q4k_wide": 1, "q6k_wide": 1}),
    (
        "wide-t8-r2-u1-split2-stage",
        {
            "q4k_wide": 1,
            "q6k_wide": 1,
            "threads_per_row": 8,
            "rows_per_thread": 2,
            "unroll": 1,
            "split_k": 2,
            "split_min_k": 256,
            "stage": 1,
        },
    ),  # fmt: skip
    # split-K of long rows (split_min_k 256: every K type's row here splits), parts of 1-3 slots
    ("split2", {"split_k": 2, "split_min_k": 256}),
    (
        "t8-r2-split4-stage",
        {"threads_per_row": 8, "rows_per_thread": 2, "split_k": 4, "split_min_k": 256, "stage": 1},
    ),  # fmt: skip
]


@pytest.mark.parametrize("cid,knobs", MMVW_CONFIGS, ids=[c[0] for c in MMVW_CONFIGS])
@pytest.mark.parametrize("qtype", BLOCK_QTYPES + ["F16"])
def test_mmvw_matmul(cp, be, cid, knobs, qtype):
    be.set_config(cfg(**mmvw(**knobs)))
    rng = np.random.default_rng(seed_of(cid, qtype))
    sizes = [(1, 1), (67, 3), (130, 2), (257, 5), (33, 10)]  # 10: the 32-value types split
    assert_ragged_matmul_into(cp, be, rng, qtype, sizes, INT8_NMSE)


@pytest.mark.parametrize("cid,knobs", MMVW_CONFIGS[:3], ids=[c[0] for c in MMVW_CONFIGS[:3]])
@pytest.mark.parametrize("n_mats", [1, 2, 3])
def test_mmvw_several_matrices_with_adds(cp, be, cid, knobs, n_mats):
    """One launch, matrices of different types and row counts, each with its own add (a bias,
    none, a residual row), each output between canaries."""
    be.set_config(cfg(**mmvw(**knobs)))
    rng = np.random.default_rng(n_mats * 7 + len(cid))
    qtypes = ("Q4_K", "Q6_K", "Q8_0")[:n_mats]
    x, mats, checks = matrices_with_adds(cp, be, rng, 512, qtypes)
    be._mmvw(be.upload(x), mats)
    for y, wd, add_ref, intact in checks:
        check(y.get(), x.astype(np.float64) @ wd.T + add_ref, INT8_NMSE)
        intact()


ROPE_CASES = [  # T, H, Hkv, D, pos0, neox, bias
    (1, 12, 2, 128, 0, True, True),
    (1, 28, 4, 128, 611, True, True),
    (1, 4, 4, 64, 37, False, False),
    (3, 6, 2, 80, 17, True, True),
    (5, 2, 1, 32, 1000, False, True),
    (1, 6, 2, 80, 17, True, True),  # heads of 80 rows straddle mmvw_qkv's blocks
    (1, 5, 1, 16, 3, False, False),  # a block holds several heads
]
# decode -> (base config, the knob that fuses): mmvw_qkv is mmvw + rope_kv in one launch
ATTN_IN_DECODES = {
    "dmmv": ({"matmul_decode.variant": "dmmv"}, "rope.fuse_kv"),
    "mmvw": (MMVW, "rope.fuse_kv"),
    "mmvw_qkv": (MMVW, "matmul_decode.fuse_rope"),
    "mmvw_qkv_t8r4": (mmvw(threads_per_row=8, rows_per_thread=4), "matmul_decode.fuse_rope"),
    "mmvw_qkv_stage": (mmvw(stage=1, prefetch=1), "matmul_decode.fuse_rope"),
}


def _attn_in_inputs(be, rng, T, H, Hkv, D, bias, qtype="Q4_K"):  # noqa: ANN001, ANN202
    C = 256
    ws = tuple(qtensor(rng, (n, C), qtype, std=0.05) for n in (H * D, Hkv * D, Hkv * D))
    bs = tuple(qtensor(rng, (n,), "F32") for n in (H * D, Hkv * D, Hkv * D)) if bias else None
    h = rng.standard_normal((T, C)).astype(np.float32)
    wts = tuple(be.load_weight(w) for w in ws)
    bts = tuple(be.load_weight(b) for b in bs) if bias else None
    return ws, bs, h, wts, bts


@pytest.mark.parametrize("T,H,Hkv,D,pos0,neox,bias", ROPE_CASES)
@pytest.mark.parametrize("decode", list(ATTN_IN_DECODES))
def test_attn_in_fused_equals_unfused(be, T, H, Hkv, D, pos0, neox, bias, decode):
    """rope.fuse_kv = 1 (one rope_kv launch) and matmul_decode.fuse_rope = 1 (mmvw_qkv: the
    matmuls and rope_kv in one launch, at T = 1) give the unfused ops' q and cache (same
    arithmetic), write only the new cache rows, and refuse a full cache; twice in a row (the
    per-head tickets reset)."""
    rng = np.random.default_rng(T * 1000 + D + pos0)
    base, knob = ATTN_IN_DECODES[decode]
    be.set_config(cfg(**base))
    ws, bs, h, wts, bts = _attn_in_inputs(be, rng, T, H, Hkv, D, bias)
    theta = 1e6 if neox else 1e4
    out = {}
    for fuse in (0, 1, 1):
        be.set_config(cfg(**base, **{knob: fuse}))
        cache = be.new_kv_cache(1, pos0 + T + 3, Hkv, D)
        q = be._attn_in(AttnIn(be.upload(h), wts, bts, cache, 0, pos0, (H, Hkv, D), theta, neox))
        out[fuse] = (be.download(q), be.download(cache.k[0]), be.download(cache.v[0]))
        kc, vc = out[fuse][1], out[fuse][2]
        assert not kc[:pos0].any() and not kc[pos0 + T :].any(), "k written outside its rows"
        assert not vc[:pos0].any() and not vc[pos0 + T :].any(), "v written outside its rows"
        with pytest.raises(ValueError, match="KV cache full"):
            be._attn_in(
                AttnIn(be.upload(h), wts, bts, cache, 0, pos0 + 4, (H, Hkv, D), theta, neox)
            )
    for a, b in zip(out[0], out[1], strict=True):
        check(b, a.astype(np.float64), 1e-12)
    # and against NumPy: matmul in float64, bias, rope
    nb = NumpyBackend()
    qkv = [h.astype(np.float64) @ dense(w).T for w in ws]
    if bias:
        qkv = [t + dense(b) for t, b in zip(qkv, bs, strict=True)]
    ref_q = nb.ops.rope(qkv[0].astype(np.float32).reshape(T, H, D), pos0, theta, neox)
    ref_k = nb.ops.rope(qkv[1].astype(np.float32).reshape(T, Hkv, D), pos0, theta, neox)
    limit = INT8_NMSE if decode == "mmvw" and T == 1 else 5e-4
    check(out[1][0], ref_q, limit)
    check(out[1][1][pos0 : pos0 + T], ref_k, limit)
    check(out[1][2][pos0 : pos0 + T], qkv[2].reshape(T, Hkv, D), limit)


@pytest.mark.parametrize("variant", ["mmvq", "mmvw", "mmvw+split_kw", "mmvw+split_kw+fc"])
@pytest.mark.parametrize("H,Hkv,D,pos0", [(12, 2, 128, 0), (28, 4, 128, 600), (4, 2, 64, 37)])
def test_attention_combine_leaves_the_q8_form(be, variant, H, Hkv, D, pos0):
    """Under an int8 decode path the decode attention's combine (its own launch, or the last
    key range's under split_kw with fuse_combine) writes the output's Q8_1 form, which the
    attention-output projection then uses; the float output is the default one's."""
    rng = np.random.default_rng(H + pos0)
    q = rng.standard_normal((1, H, D)).astype(np.float32)
    k = rng.standard_normal((pos0 + 1, Hkv, D)).astype(np.float32)
    v = rng.standard_normal((pos0 + 1, Hkv, D)).astype(np.float32)
    dec, *att = variant.split("+")
    flat_v = {"matmul_decode.variant": dec}
    if att:
        flat_v |= {"attention_decode.variant": "split_kw",
                   "attention_decode.fuse_combine": int("fc" in att)}  # fmt: skip
    outs = []
    for flat in ({}, flat_v):
        be.set_config(cfg(**flat))
        cache = be.new_kv_cache(1, pos0 + 2, Hkv, D)
        be.ops.kv_write(cache, 0, be.upload(k), be.upload(v), 0)
        outs.append(be.ops.attention(be.upload(q), cache, 0, pos0))
    check(be.download(outs[1]), be.download(outs[0]).astype(np.float64), 1e-12 if not att else 1e-9)
    a = be.ops.reshape(outs[1], (1, H * D))
    hit = be._q8_lookup(a)
    assert hit is not None, "attention under int8 decode left no Q8_1 form"
    _check_q8(be.download(a), *hit)
    w = qtensor(rng, (67, H * D), "Q4_K", std=0.05)
    y = be.download(be.ops.matmul(a, be.load_weight(w)))
    check(y, be.download(a).astype(np.float64) @ dense(w).T, INT8_NMSE)


KW_SHAPES = [  # H, Hkv, D, pos0; (D, G) pairs split_kw cannot take fall back to attn_split
    (2, 1, 64, 0), (4, 2, 64, 37), (28, 4, 128, 600), (12, 2, 128, 5), (2, 2, 256, 33),
    (3, 1, 80, 9), (1, 1, 32, 0),
]  # fmt: skip


@pytest.mark.parametrize("fc", [0, 1])
@pytest.mark.parametrize("G", [4, 8, 16])
@pytest.mark.parametrize("splits,warps", [(8, 4), (1, 1), (32, 8), (16, 2)])
@pytest.mark.parametrize("H,Hkv,D,pos0", KW_SHAPES)
def test_attention_decode_split_kw(be, G, splits, warps, H, Hkv, D, pos0, fc):
    """attention_decode.split_kw (several keys per warp step; fc: the last range of a head
    combines) against float64, with key ranges that are empty (splits > positions) and ragged;
    twice, as the per-head tickets must reset."""
    be.set_config(cfg(**{"attention_decode.variant": "split_kw",
                         "attention_decode.lanes_per_key": G,
                         "attention_decode.splits": splits,
                         "attention_decode.warps": warps,
                         "attention_decode.fuse_combine": fc}))  # fmt: skip
    q, cache, ref = _case(be, H, Hkv, D, pos0, seed=G * 100 + splits + D + pos0)
    for _ in range(2):
        check(be.download(be.ops.attention(be.upload(q), cache, 0, pos0)), ref, 1e-9)
    be.set_config(cfg())


@pytest.mark.parametrize("fc", [0, 1])
@pytest.mark.parametrize("G", [4, 8, 16])
@pytest.mark.parametrize("splits,warps", [(8, 4), (32, 8), (1, 1)])
@pytest.mark.parametrize("H,Hkv,D,pos0", KW_SHAPES)
def test_attention_decode_split_kw_kv_early(be, G, splits, warps, H, Hkv, D, pos0, fc):
    """split_kw's kv_early (dec8: V rows loaded with the K rows) computes exactly what the
    late loads compute, and both match float64; twice (the tickets reset)."""
    q, cache, ref = _case(be, H, Hkv, D, pos0, seed=G * 31 + splits + D + pos0)
    outs = []
    for ke in (0, 1):
        be.set_config(cfg(**{"attention_decode.variant": "split_kw",
                             "attention_decode.lanes_per_key": G,
                             "attention_decode.splits": splits,
                             "attention_decode.warps": warps,
                             "attention_decode.fuse_combine": fc,
                             "attention_decode.kv_early": ke}))  # fmt: skip
        for _ in range(2):
            outs.append(be.download(be.ops.attention(be.upload(q), cache, 0, pos0)))
            check(outs[-1], ref, 1e-9)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    be.set_config(cfg())


@pytest.mark.parametrize("blocks,threads", [(64, 256), (8, 1024), (256, 128)])
@pytest.mark.parametrize("T,V", [(1, 1), (1, 151936), (3, 1000), (2, 33), (1, 152064)])
def test_argmax_multi_first_maximum(be, blocks, threads, T, V):
    """argmax.multi: the first maximum over block boundaries, ties across blocks, NaN never
    wins, all -inf gives 0; run twice (the tickets reset, as a graph replay needs)."""
    be.set_config(cfg(**{"argmax.variant": "multi", "argmax.blocks": blocks,
                         "argmax.threads": threads}))  # fmt: skip
    rng = np.random.default_rng(V + blocks)
    logits = rng.standard_normal((T, V)).astype(np.float32)
    if V > 10:
        logits[0, [V - 3, 7]] = 50.0  # a tie in different blocks: the first index wins
        logits[-1, [V - 1, 3]] = 60.0
        logits[-1, 5] = np.nan
    if T > 1:
        logits[1] = -np.inf
    for _ in range(2):
        out = be.download(be.ops.argmax(be.upload(logits)))
        want = np.argmax(np.nan_to_num(logits, nan=-np.inf), axis=-1)
        assert out.tolist() == want.tolist()
    be.set_config(cfg())


@pytest.mark.parametrize("cid,knobs", MMVW_CONFIGS[:2], ids=[c[0] for c in MMVW_CONFIGS[:2]])
@pytest.mark.parametrize("T", [1, 2])
def test_matmul_add_and_ffn(cp, be, cid, knobs, T):
    """matmul_add and ffn under mmvw (T == 1: one launch for gate and up, the residual added by
    the down projection) and their base composition (T == 2) against float64."""
    be.set_config(cfg(**mmvw(**knobs)))
    rng = np.random.default_rng(T + len(cid))
    C, F = 512, 768
    wg, wu = (qtensor(rng, (F, C), "Q4_K", std=0.05) for _ in range(2))
    wd = qtensor(rng, (C, F), "Q6_K", std=0.05)
    h = rng.standard_normal((T, C)).astype(np.float32)
    r = rng.standard_normal((T, C)).astype(np.float32)
    hd, rd = be.upload(h), be.upload(r)
    limit = INT8_NMSE if T == 1 else 5e-4
    out = be.download(be._ffn(hd, *(be.load_weight(w) for w in (wg, wu, wd)), rd))
    h64 = h.astype(np.float64)
    g, u = h64 @ dense(wg).T, h64 @ dense(wu).T
    ref = r + (g / (1 + np.exp(-g)) * u) @ dense(wd).T
    check(out, ref, limit)
    assert np.array_equal(be.download(hd), h) and np.array_equal(be.download(rd), r)
    x = rng.standard_normal((T, F)).astype(np.float32)
    ma = be.download(be._matmul_add(be.upload(x), be.load_weight(wd), rd))
    check(ma, r + x.astype(np.float64) @ dense(wd).T, limit)


# --- mmvw_glu (fuse_swiglu) and mmvw_norm (fuse_norm) ----------------------------------------
GLU_CONFIGS = [
    MMVW_CONFIGS[0],
    ("t8-r4-w8-u4-g4-gu8", MMVW_CONFIGS[1][1] | {"glu_threads_per_row": 4, "glu_unroll": 8}),
    ("t16-r2-w1-u1-g16-gu1", MMVW_CONFIGS[2][1] | {"glu_threads_per_row": 16, "glu_unroll": 1}),
    MMVW_CONFIGS[5],
    ("g2-gu8", {"glu_threads_per_row": 2, "glu_unroll": 8}),
    MMVW_CONFIGS[8],  # staged weights (mmvw_norm; mmvw_glu reads global)
    MMVW_CONFIGS[9],  # wide Q4_K slots (mmvw_glu's dots too)
    MMVW_CONFIGS[11],  # split-K (mmvw_norm's rows per block halve)
    MMVW_CONFIGS[12],
]


@pytest.mark.parametrize("cid,knobs", GLU_CONFIGS, ids=[c[0] for c in GLU_CONFIGS])
@pytest.mark.parametrize(
    "qg,qu,N,kb",
    [("Q4_K", "Q4_K", 96, 2), ("Q6_K", "Q4_K", 32, 1), ("Q8_0", "Q5_0", 160, 9),
     ("Q4_K", "Q6_K", 688, 1)],  # 688: the ragged model's F, no Q8_1 form
)  # fmt: skip
def test_mmvw_glu(cp, be, cid, knobs, qg, qu, N, kb):
    """silu(h gate^T) * (h up^T) and its Q8_1 blocks from one mmvw_glu launch (a block owns 32
    rows of each matrix, whatever the rows per group pass) against float64."""
    be.set_config(cfg(**mmvw(fuse_swiglu=1, **knobs)))
    rng = np.random.default_rng(seed_of(cid, qg, qu, N))
    K = k_for(qg, kb)
    wg, wu = qtensor(rng, (N, K), qg, std=0.05), qtensor(rng, (N, K), qu, std=0.05)
    h = rng.standard_normal((1, K)).astype(np.float32)
    hd = be.upload(h)
    be.set_profiling(True)
    for _ in range(2):  # the second call reuses h's Q8_1 form
        y = be._decode_gate_up(hd, be.load_weight(wg), be.load_weight(wu))
        g, u = h.astype(np.float64) @ dense(wg).T, h.astype(np.float64) @ dense(wu).T
        check(y.get(), g / (1 + np.exp(-g)) * u, INT8_NMSE)
        if N % 32:
            assert be._q8_lookup(y) is None
            continue
        assert be._q8_lookup(y) is not None  # the kernel left y's Q8_1 form
        yq, yds = be.quantize_q8(y)
        _check_q8(y.get(), yq, yds)
    assert np.array_equal(be.download(hd), h), "input changed"
    ran = be.profile().kernels
    be.set_profiling(False)
    assert "mmvw_glu" in ran and "swiglu_q8" not in ran, sorted(ran)
    be.set_config(cfg())


@pytest.mark.parametrize("cid,knobs", GLU_CONFIGS, ids=[c[0] for c in GLU_CONFIGS])
@pytest.mark.parametrize("qtype,N,kb", [("Q6_K", 96, 2), ("Q4_K", 1056, 1), ("Q8_0", 32, 3)])
def test_mmvw_norm(cp, be, cid, knobs, qtype, N, kb):
    """matmul_add_norm in one mmvw_norm launch: y = r + x w^T, h = rms_norm(y) * nw and h's
    Q8_1 form, against float64; three calls in a row (the ticket resets)."""
    be.set_config(cfg(**mmvw(fuse_norm=1, **knobs)))
    rng = np.random.default_rng(seed_of(cid, qtype, N))
    K = k_for(qtype, kb)
    w = qtensor(rng, (N, K), qtype, std=0.05)
    nw = qtensor(rng, (N,), "F32")
    wt, nwt = be.load_weight(w), be.load_weight(nw)
    be.set_profiling(True)
    for i in range(3):
        x = rng.standard_normal((1, K)).astype(np.float32)
        r = rng.standard_normal((1, N)).astype(np.float32) * (1 + i)
        y, h = be._matmul_add_norm(be.upload(x), wt, be.upload(r), nwt, 1e-6)
        ref = r + x.astype(np.float64) @ dense(w).T
        check(y.get(), ref, INT8_NMSE)
        yh = y.get().astype(np.float64)  # the norm of what the kernel stored: float32 close
        want = yh / np.sqrt((yh**2).mean() + 1e-6) * dense(nw)
        check(h.get(), want, 1e-10)
        assert be._q8_lookup(h) is not None  # the kernel left h's Q8_1 form
        hq, hds = be.quantize_q8(h)
        _check_q8(h.get(), hq, hds)
    assert int(be._norm_ticket.get()[0]) == 0
    ran = be.profile().kernels
    be.set_profiling(False)
    assert ran["mmvw_norm"].calls == 3 and "rms_norm_q8" not in ran, sorted(ran)
    be.set_config(cfg())


def test_ffn_norm_fused_equals_composed(cp, be):
    """ffn_norm with both fusions is bit-equal to ffn then rms_norm without them where the
    arithmetic order is the same: warps 8 (the norm's block is quantize_act's 256 threads) and
    8 lanes a row and 2 slots an iteration in both mmvw and mmvw_glu."""
    rng = np.random.default_rng(11)
    C, F = 512, 768
    wg, wu = (qtensor(rng, (F, C), "Q4_K", std=0.05) for _ in range(2))
    wd = qtensor(rng, (C, F), "Q6_K", std=0.05)
    nw = qtensor(rng, (C,), "F32")
    h = rng.standard_normal((1, C)).astype(np.float32)
    r = rng.standard_normal((1, C)).astype(np.float32)
    out = {}
    for fuse in (0, 1):
        knobs = {"warps": 8, "threads_per_row": 8, "glu_threads_per_row": 8, "glu_unroll": 2}
        be.set_config(cfg(**mmvw(fuse_swiglu=fuse, fuse_norm=fuse, **knobs)))
        ws = [be.load_weight(w) for w in (wg, wu, wd, nw)]
        y, hn = be._ffn_norm(be.upload(h), *ws[:3], be.upload(r), ws[3], 1e-6)
        out[fuse] = (y.get(), hn.get())
    assert np.array_equal(out[0][0], out[1][0])
    assert np.array_equal(out[0][1], out[1][1])
    be.set_config(cfg())


# --- whole models ---------------------------------------------------------------------------
ALL_FUSED = mmvw_model(fuse_swiglu=1, fuse_norm=1, fuse_rope=1)
FUSED_MODEL_CONFIGS = [
    {"rope.fuse_kv": 1},
    {"attention_decode.variant": "split_kw"},
    MMVW,
    mmvw_model(),
    MMVW | {"attention_decode.variant": "split_kw", "attention_decode.fuse_combine": 0},
    mmvw(threads_per_row=16, rows_per_thread=2, unroll=1) | {"rope.fuse_kv": 1},
    # hooked (unfused) equals fused where the sums run in the same order: warps 8 (mmvw_norm's
    # block is rms_norm_q8's 256 threads) and mmvw's lanes per row and unroll = mmvw_glu's
    ALL_FUSED | mmvw(warps=8, threads_per_row=8, glu_threads_per_row=8, glu_unroll=2),
    ALL_FUSED
    | mmvw(
        warps=8,
        threads_per_row=16,
        glu_threads_per_row=16,
        unroll=8,
        glu_unroll=8,
        stage=1,
        wload=2,
        min_blocks=4,
    ),
    # split-K (dec8): every mmvw row of the tiny model splits; the fused norm with warps 8 (its
    # hooked form sums in the same order), no fuse_swiglu / fuse_rope (mmvw_glu and mmvw_qkv do
    # not split, their hooked forms would)
    mmvw_model(
        fuse_norm=1,
        warps=8,
        split_k=4,
        split_min_k=256,
        stage=1,
        prefetch=1,
        q4k_wide=1,
        q6k_wide=1,
    )
    | {"attention_decode.kv_early": 1},
]
FUSED_MODEL_IDS = [*(str(i) for i in range(6)), "fused_all_w8", "fused_all_t16_wl2", "split4"]


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("flat", FUSED_MODEL_CONFIGS, ids=FUSED_MODEL_IDS)
def test_fused_decode_graph_equals_eager_and_hooked(be, tiny_model_factory, arch, flat):
    """Graph replay of the fused schedule is bit-equal to eager; the hooked (unfused) schedule
    on the same config gives the same tokens and logits."""
    path = tiny_model_factory(arch, "q4_k_m")
    be.set_config(cfg(**flat))
    m = _model(path, be)
    eager = assert_graph_equals_eager(be, m, PROMPT, 10)
    # Same kernels and arithmetic per row (mmvw's epilogue add is add's one float add), so
    # only a different FMA contraction between kernels could show; a wrong wiring shows more.
    assert_hooked_matches(be, m, eager, PROMPT, 10)
    be.set_config(cfg())


@pytest.mark.parametrize("flat", FUSED_MODEL_CONFIGS, ids=FUSED_MODEL_IDS)
def test_validate_fused_configs(be, tiny_model_path, flat):
    """rope.fuse_kv and split_kw alone against the default reference with the registry's
    budget; the mmvw configs against per-token mmvq decode with the int8 tolerances of
    test_cuda_ops."""
    from engine.verify.validate import Tolerances, validate

    be.set_config(cfg())
    m = _model(tiny_model_path, be)
    prompts = [PROMPT, PROMPT[:1], list(range(40, 40 + 70))]
    if "matmul_decode.variant" in flat:
        tol = Tolerances(max_abs_diff=0.2, nmse=1e-3)
        ref = cfg(**{"matmul_decode.variant": "mmvq"})
        rep = validate(m, cfg(**flat), prompts, steps=6, tol=tol, reference=ref)
    else:
        rep = validate(m, cfg(**flat), prompts, steps=6)
    assert rep.passed, [p.reasons for p in rep.prompts]
    be.set_config(cfg())


def test_base_composition_is_used_where_nothing_fuses(be):
    """Default config (mmvf: q/k/v with their biases in one launch): CudaBackend's attn_in is
    bit-equal to the base class's sequence."""
    assert type(be)._attn_in is not Backend._attn_in  # it overrides, and falls back when not fused
    be.set_config(cfg())
    rng = np.random.default_rng(3)
    ws, bs, h, wts, bts = _attn_in_inputs(be, rng, 1, 4, 2, 64, True)
    c1, c2 = be.new_kv_cache(1, 4, 2, 64), be.new_kv_cache(1, 4, 2, 64)
    q1 = be.download(be._attn_in(AttnIn(be.upload(h), wts, bts, c1, 0, 1, (4, 2, 64), 1e4, False)))
    q2 = be.download(
        Backend._attn_in(be, AttnIn(be.upload(h), wts, bts, c2, 0, 1, (4, 2, 64), 1e4, False))
    )
    assert np.array_equal(q1, q2)
    assert np.array_equal(be.download(c1.k[0]), be.download(c2.k[0]))
