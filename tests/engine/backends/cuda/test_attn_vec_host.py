"""attention_decode.vec (shaders/cuda/attn_vec.cu) without a GPU: the host launches attn_vec4 /
attn_vec8 once a decode layer (grid SPLITS x Hkv, the kernel's signature checked by
tests/cuda_fake.py) and no combine, leaves the Q8_1 form under int8 decode, sends the shapes it
cannot take to attn_split; the kernel's range cutting covers every key once; and a NumPy model of
the kernel's arithmetic (ranges of whole 8-key rounds, warps taking interleaved rounds with their
own online softmax, the block's merge in warp order, the combine 16 ranges at a time) equals the
reference on ragged shapes (groups 1-8, contexts that end a round or a range short), so a wrong
merge formula shows here before it reaches a device. The kernel itself runs in
tests/engine/backends/cuda/test_cuda_attn_vec.py (-m gpu)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from engine.backends.cuda.attn_vec import KU, VCL, kernel_name, ranges, vec_fits
from engine.tuning import TuningConfig
from tests.attention_configs import attention_flat
from tests.attn_split_emul import assert_equals_reference, split_attention
from tests.cuda_fake import (
    FakeCuda,
    assert_attention_falls_back_to_split,
    assert_attention_fusion_bypassed,
    decode_step,
    fused_rope_launches,
)

PROMPT = list(range(5, 5 + 12))
VEC = {"attention_decode.variant": "vec"}


@pytest.mark.parametrize("dec", ["mmvf", "mmvw"])
@pytest.mark.parametrize("splits,min_keys,warps,fc", [
    (64, 32, 4, 1), (8, 8, 1, 1), (256, 128, 8, 1), (16, 32, 2, 0), (8, 16, 4, 0),
])  # fmt: skip
def test_vec_launches(tiny_model_factory, dec, splits, min_keys, warps, fc):
    """One attn_vec a layer; fuse_combine 0: out and the Q8_1 buffers null, then a combine."""
    flat = attention_flat(
        "vec",
        dec,
        splits=splits,
        min_keys=min_keys,
        warps=warps,
        fuse_combine=fc,
        prefetch=int(warps == 1),
    )
    launches, m = decode_step(tiny_model_factory("qwen2", "q4_k_m"), flat, PROMPT)
    n, hkv = m.spec.n_layers, m.spec.n_head_kv
    name = kernel_name(m.spec.n_head // hkv)
    assert not any(x.kernel.startswith("attn_vec") and x.kernel != name for x in launches)
    vecs = [launch for launch in launches if launch.kernel == name]
    assert len(vecs) == n
    assert all(t.grid == (splits, hkv, 1) and t.block == (32 * warps, 1, 1) for t in vecs)
    assert all(int(t.args[11]) == min_keys and t.smem == 0 for t in vecs)
    assert all(int(t.args[-1]) == int(warps == 1) for t in vecs)  # prefetch
    q8 = [not isinstance(t.args[13], np.uint64) for t in vecs]  # xq; null: np.uint64(0)
    assert all(q8) if dec == "mmvw" and fc else not any(q8)
    assert all(isinstance(t.args[12], np.uint64) != bool(fc) for t in vecs)  # out
    count = Counter(launch.kernel for launch in launches)
    combine = "attn_combine_q8" if dec == "mmvw" else "attn_combine"
    assert count[combine] == (0 if fc else n)
    assert count["attn_split"] == count["attn_split_kw"] == count["attn_tile"] == 0
    skip = 1 if fc else 2  # the o projection after the kernel (and its combine)
    after = [launches[i + skip].kernel for i, x in enumerate(launches) if x.kernel == name]
    assert all(a.startswith(dec) for a in after)  # the o projection: no quantize (Q8_1 form)


@pytest.mark.parametrize("H,Hkv,D,ok", [
    (12, 2, 128, True), (28, 4, 128, True), (14, 2, 64, True), (16, 2, 128, True),
    (18, 2, 128, False), (4, 2, 256, False), (4, 2, 132, False), (4, 2, 66, False),
    (1, 1, 32, True), (6, 4, 64, False), (40, 8, 128, True), (64, 8, 128, True),
])  # fmt: skip
def test_vec_limits(H, Hkv, D, ok):
    assert vec_fits(H, Hkv, D, 4096) is ok


@pytest.mark.parametrize("G", range(1, 9))
def test_vec_kernel_per_group(G):
    assert kernel_name(G) == ("attn_vec4" if G <= 4 else "attn_vec8")


def test_vec_falls_back_to_split():
    assert_attention_falls_back_to_split(VEC, 160)


@pytest.mark.parametrize("H,Hkv,name", [(12, 2, "attn_vec8"), (28, 4, "attn_vec8"),
                                        (8, 2, "attn_vec4")])  # fmt: skip
def test_vec_launch_on_the_model_shapes(H, Hkv, name):
    """The 1.5B / 7B head shapes take attn_vec8 with the registry's defaults."""
    be = FakeCuda(TuningConfig.from_flat("cuda", VEC))
    q = be.upload(np.zeros((1, H, 128), np.float32))
    cache = be.new_kv_cache(1, 700, Hkv, 128)
    be.launches.clear()
    be.ops.attention(q, cache, 0, 600)
    assert [(x.kernel, x.grid) for x in be.launches] == [(name, (64, Hkv, 1))]


@pytest.mark.parametrize("splits", [8, 16, 64, 256])
@pytest.mark.parametrize("min_keys", [8, 32, 128])
@pytest.mark.parametrize("warps", [1, 4, 8])
def test_ranges_cover_every_key_once(splits, min_keys, warps):
    """Every active range is non-empty (the combine's max is finite), they tile [0, L), there
    are at most splits of them, and chunks are whole rounds of the block's warps."""
    for L in [*range(1, 200), 511, 512, 513, 2047, 2048, 8191, 8193, 40_000]:
        chunk, nact = ranges(L, splits, min_keys, warps)
        assert 1 <= nact <= splits and chunk % (warps * KU) == 0
        assert (nact - 1) * chunk < L <= nact * chunk


def _online(m, lsum, acc, sc, vv):  # noqa: ANN001, ANN202
    """One online-softmax step of scores sc [n] and values vv [n, D] (n may be 0)."""
    if len(sc) == 0:
        return m, lsum, acc
    mn = max(m, sc.max())
    corr = np.float32(np.exp(m - mn)) if m != -np.inf else np.float32(0)
    p = np.exp(sc - mn).astype(np.float32)
    return mn, lsum * corr + p.sum(), acc * corr + p @ vv


def _vec_model(q, k, v, pos0: int, splits: int, min_keys: int, warps: int) -> np.ndarray:
    """attn_vec's arithmetic in float32 NumPy: q [H, D], k, v [S, Hkv, D] -> out [H, D]."""
    D = q.shape[1]

    def part(qh, kk, vv, kb: int, ke: int, scale):  # noqa: ANN001, ANN202 - one range
        qs = qh * scale
        ws = []  # each warp's (max, sum, acc) over its interleaved rounds
        for w in range(warps):
            m, lsum, acc = -np.inf, np.float32(0), np.zeros(D, np.float32)
            for j0 in range(kb + w * KU, ke, warps * KU):
                j1 = min(j0 + KU, ke)
                m, lsum, acc = _online(m, lsum, acc, kk[j0:j1] @ qs, vv[j0:j1])
            ws.append((m, lsum, acc))
        M = max(x[0] for x in ws)  # the block's merge, in warp order
        wsc = [np.float32(0) if x[0] == -np.inf else np.float32(np.exp(x[0] - M)) for x in ws]
        acc = sum((x[2] * c for x, c in zip(ws, wsc, strict=True)), np.zeros(D, np.float32))
        return M, sum(x[1] * c for x, c in zip(ws, wsc, strict=True)), acc

    chunk, nact = ranges(pos0 + 1, splits, min_keys, warps)
    return split_attention(q, k, v, pos0, chunk, nact, part)


@pytest.mark.parametrize("H,Hkv,D", [(12, 2, 128), (28, 4, 64), (4, 4, 32), (8, 2, 32), (7, 1, 64)])
@pytest.mark.parametrize("pos0", [0, 7, 8, 100, 517, 1300])
@pytest.mark.parametrize(
    "splits,min_keys,warps", [(64, 32, 4), (8, 8, 1), (256, 8, 8), (16, 128, 2)]
)
def test_vec_arithmetic_equals_the_reference(H, Hkv, D, pos0, splits, min_keys, warps):
    assert_equals_reference(
        lambda q, k, v: _vec_model(q, k, v, pos0, splits, min_keys, warps), H, Hkv, D, pos0
    )


@pytest.mark.parametrize("dec", ["mmvf", "mmvw"])
@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_vec_fuse_rope_launches(tiny_model_factory, dec, arch):
    """attention_decode.vec fuse_rope: no rope / rope_kv / kv_write launch at decode; the _rope
    build gets the k and v projections (non-null), theta and the neox flag; a bypassed fusion."""
    flat = VEC | {"matmul_decode.variant": dec, "attention_decode.fuse_rope": 1,
                  "rope.fuse_kv": 1}  # fmt: skip
    launches, m = decode_step(tiny_model_factory(arch, "q4_k_m"), flat, PROMPT)
    name = kernel_name(m.spec.n_head // m.spec.n_head_kv, rope=True)
    vecs = fused_rope_launches(launches, m, name, knew=-5, vnew=-4, neox=-2)
    assert all(int(t.args[-1]) == 0 for t in vecs)  # prefetch
    assert_attention_fusion_bypassed(flat, VEC | {"matmul_decode.variant": dec})


def test_vec_without_fuse_rope_passes_null_projections(tiny_model_factory):
    launches, m = decode_step(tiny_model_factory("qwen2", "q4_k_m"), VEC | {"rope.fuse_kv": 1},
                              PROMPT)  # fmt: skip
    name = kernel_name(m.spec.n_head // m.spec.n_head_kv)
    vecs = [launch for launch in launches if launch.kernel == name]
    assert vecs and all(isinstance(t.args[-5], np.uint64) for t in vecs)
    assert Counter(launch.kernel for launch in launches)["rope_kv"] == len(vecs)


@pytest.mark.parametrize("D,ok", [(128, True), (64, True), (96, True), (100, False), (36, False)])
def test_vec_fuse_rope_limits(D, ok):
    """fuse_rope with a head dim it cannot take: the unfused path (rope_kv) runs instead."""
    from engine.backends.cuda.attn_vec import rope_fits

    assert rope_fits(D) is ok
    be = FakeCuda(TuningConfig.from_flat("cuda", VEC | {"attention_decode.fuse_rope": 1}))
    assert be._gqa_rope((4, 2, D)) is (ok and vec_fits(4, 2, D, 4096))


@pytest.mark.parametrize("dec", ["mmvf", "mmvw"])
@pytest.mark.parametrize("warps,fc,rope", [(4, 1, 0), (1, 0, 0), (8, 1, 1), (2, 0, 1)])
def test_vec_cluster_launches(tiny_model_factory, dec, warps, fc, rope):
    """cluster: one attn_vec*_c(_rope) a layer on a grid of VCL x Hkv (the cluster's size,
    whatever splits says), no partial buffers, out and (int8) the Q8_1 form always written,
    no combine launch, whatever fuse_combine says."""
    knobs = {"cluster": 1, "splits": 64, "warps": warps, "fuse_combine": fc, "fuse_rope": rope}
    flat = attention_flat("vec", dec, **knobs) | {"rope.fuse_kv": 1}
    launches, m = decode_step(tiny_model_factory("qwen2", "q4_k_m"), flat, PROMPT)
    n, hkv = m.spec.n_layers, m.spec.n_head_kv
    name = kernel_name(m.spec.n_head // hkv, rope=bool(rope), cluster=True)
    vecs = [x for x in launches if x.kernel == name]
    assert len(vecs) == n
    assert all(t.grid == (VCL, hkv, 1) and t.block == (32 * warps, 1, 1) for t in vecs)
    assert all(isinstance(t.args[3], np.uint64) and isinstance(t.args[4], np.uint64) for t in vecs)
    assert not any(isinstance(t.args[12], np.uint64) for t in vecs)  # out
    q8 = [not isinstance(t.args[13], np.uint64) for t in vecs]
    assert all(q8) if dec == "mmvw" else not any(q8)
    count = Counter(x.kernel for x in launches)
    assert count["attn_combine"] == count["attn_combine_q8"] == 0
    assert count["rope_kv"] == (0 if rope else n)


def test_vec_cluster_needs_sm90():
    """Thread-block clusters are an sm_90 feature: refused on an A100, allowed on an H200; the
    knob at 0 asks nothing of the device."""
    from engine.backends.base import DeviceInfo

    a100 = DeviceInfo("cuda", "A100", "nvidia", "a100", extra={"cc": 80})
    h200 = DeviceInfo("cuda", "H200", "nvidia", "h200", extra={"cc": 90})
    on = TuningConfig.from_flat("cuda", VEC | {"attention_decode.cluster": 1})
    assert any("attention_decode.cluster != 0 needs compute capability >= 9.0" in p
               for p in on.problems(a100))  # fmt: skip
    assert on.problems(h200) == []
    assert TuningConfig.from_flat("cuda", VEC).problems(a100) == []


def _warp_rounds(q, k, v, scale, G: int, GP: int, rounds: list[tuple[int, int]]):  # noqa: ANN001, ANN202
    """attn_vec's warp, lane by lane in NumPy (shaders/cuda/attn_vec.cu's index arithmetic):
    32 lanes of 4 dims, each round's KU keys scored against GP padded heads, the reduce-scatter
    butterfly, the per-head max over the head's lanes, p broadcast from the holding lane.
    rounds: (j0, ke) per round. Returns (m [GP], l [GP], acc [GP, D])."""
    D = q.shape[1]
    N, NV = GP * KU, GP * KU // 32
    LPH = KU // NV
    lanes = np.arange(32)
    qv = np.zeros((32, GP, 4), np.float32)  # lane, head, its 4 dims (0 past D)
    for g in range(G):
        qv[: D // 4, g] = (q[g] * scale).reshape(-1, 4)
    m = np.full(GP, -np.inf, np.float32)
    mo = np.full(32, -np.inf, np.float32)
    lown = np.zeros(32, np.float32)
    acc = np.zeros((32, GP, 4), np.float32)
    for j0, ke in rounds:
        kr = np.zeros((32, KU, 4), np.float32)
        vr = np.zeros((32, KU, 4), np.float32)
        for u in range(KU):
            if j0 + u < ke:
                kr[: D // 4, u] = k[j0 + u].reshape(-1, 4)
                vr[: D // 4, u] = v[j0 + u].reshape(-1, 4)
        sv = np.einsum("lgd,lud->lgu", qv, kr).reshape(32, N)  # head-major g * KU + u
        for st in range(5):  # rs_step<16 >> st, N >> (st + 1)>
            o, h = 16 >> st, N >> (st + 1)
            up = (lanes & o) != 0
            send = np.where(up[:, None], sv[:, :h], sv[:, h : 2 * h])
            keep = np.where(up[:, None], sv[:, h : 2 * h], sv[:, :h])
            sv = keep + send[lanes ^ o]
        sv = sv[:, :NV].copy()
        e0 = NV * lanes
        u0 = e0 % KU
        for i in range(NV):
            sv[j0 + u0 + i >= ke, i] = -np.inf
        rmax = sv.max(axis=1)
        o = 1
        while o < LPH:
            rmax = np.maximum(rmax, rmax[lanes ^ o])
            o <<= 1
        mnew = np.maximum(m, rmax[np.arange(GP) * LPH])
        with np.errstate(invalid="ignore"):
            corr = np.where(mnew == -np.inf, 1, np.exp(m - mnew)).astype(np.float32)
        mown = np.maximum(mo, rmax)
        with np.errstate(invalid="ignore"):
            cown = np.where(mown == -np.inf, 1, np.exp(mo - mown)).astype(np.float32)
        mo = mown
        p = np.where(sv == -np.inf, 0, np.exp(sv - mown[:, None])).astype(np.float32)
        lown = lown * cown + p.sum(axis=1)
        for g in range(GP):
            a = acc[:, g] * corr[g]
            for u in range(KU):
                e = g * KU + u
                a = a + p[e // NV, e % NV] * vr[:, u]
            acc[:, g] = a
        m = mnew
    lsum = lown.copy()
    o = 1
    while o < LPH:
        lsum = lsum + lsum[lanes ^ o]
        o <<= 1
    lg = lsum[np.arange(GP) * LPH]
    return m, lg, acc[: D // 4].transpose(1, 0, 2).reshape(GP, D)


@pytest.mark.parametrize("G,D", [(6, 128), (7, 128), (8, 64), (3, 96), (1, 32), (4, 128)])
@pytest.mark.parametrize("rounds", [[(0, 8)], [(0, 5)], [(0, 8), (32, 40)], [(3, 9), (40, 41)]])
def test_vec_warp_lane_arithmetic(G, D, rounds):
    """The kernel's lane-level index arithmetic (which lane holds which (head, key) score after
    the butterfly, which lanes share a head's max and sum, where p is broadcast from) gives each
    head's online-softmax state over the warp's keys: max, sum and unnormalized P.V."""
    GP = 4 if G <= 4 else 8
    rng = np.random.default_rng(G * D + len(rounds))
    q = rng.standard_normal((G, D)).astype(np.float32)
    k = (2 * rng.standard_normal((64, D))).astype(np.float32)
    v = rng.standard_normal((64, D)).astype(np.float32)
    scale = np.float32(1 / np.sqrt(D))
    m, lsum, acc = _warp_rounds(q, k, v, scale, G, GP, rounds)
    keys = [j for j0, ke in rounds for j in range(j0, min(ke, j0 + KU))]
    s = (k[keys].astype(np.float64) @ q.T.astype(np.float64)) * float(scale)  # [keys, G]
    ref_m = s.max(axis=0)
    p = np.exp(s - ref_m)
    np.testing.assert_allclose(m[:G], ref_m, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(lsum[:G], p.sum(axis=0), rtol=1e-5)
    np.testing.assert_allclose(acc[:G], p.T @ v[keys], rtol=1e-4, atol=1e-4)


def _rope_ref(x: np.ndarray, p: int, theta: float, neox: bool) -> np.ndarray:
    """rope_pair (shaders/cuda/common.cuh) over a row x [D], in float64 then float32."""
    D = x.shape[0]
    out = np.zeros(D, np.float32)
    for j in range(D // 2):
        ang = p * theta ** (-2.0 * j / D)
        c, s = np.cos(ang), np.sin(ang)
        ia, ib = (j, j + D // 2) if neox else (2 * j, 2 * j + 1)
        a, b = float(x[ia]), float(x[ib])
        out[ia], out[ib] = np.float32(a * c - b * s), np.float32(a * s + b * c)
    return out


def _rope_lanes(x: np.ndarray, p: int, theta: float, neox: bool) -> np.ndarray:
    """attn_vec's rope_cs + rope4 lane by lane: lane l holds dims 4 l .. 4 l + 3; its angles
    (normal: pairs 2 l, 2 l + 1; neox: dims mod D / 2); a neox partner D4 / 2 lanes away."""
    D = x.shape[0]
    D4, half = D // 4, D // 2
    hl = D4 // 2
    xs = np.zeros((32, 4), np.float32)
    xs[:D4] = x.reshape(D4, 4)
    out = np.zeros((32, 4), np.float32)
    for lane in range(D4):
        c, s = np.zeros(4), np.zeros(4)
        for t in range(4):
            j = (4 * lane + t) % half if neox else 2 * lane + t // 2
            ang = p * theta ** (-2.0 * j / D)
            c[t], s[t] = np.cos(ang), np.sin(ang)
        src = lane + hl if lane < hl else lane - hl
        y = xs[src]
        for t in range(4):
            if not neox:
                a, b = float(xs[lane, t & 2]), float(xs[lane, (t & 2) + 1])
                o = a * c[t] - b * s[t] if t % 2 == 0 else a * s[t] + b * c[t]
            elif lane < hl:
                o = float(xs[lane, t]) * c[t] - float(y[t]) * s[t]
            else:
                o = float(y[t]) * s[t] + float(xs[lane, t]) * c[t]
            out[lane, t] = np.float32(o)
    return out[:D4].reshape(D)


@pytest.mark.parametrize("D", [32, 64, 96, 128])
@pytest.mark.parametrize("neox", [False, True])
@pytest.mark.parametrize("p", [0, 1, 37, 4095])
def test_vec_rope_lane_arithmetic(D, neox, p):
    """fuse_rope's per-lane RoPE (angles of the lane's own dims, the neox partner lane) equals
    rope_pair's over the whole row, to the bit (the same float64 arithmetic)."""
    x = np.random.default_rng(D + p).standard_normal(D).astype(np.float32)
    got = _rope_lanes(x, p, 1_000_000.0, neox)
    assert np.array_equal(got, _rope_ref(x, p, 1_000_000.0, neox))


@pytest.mark.parametrize("n4", [8, 96, 192, 224, 256, 448, 1024])
@pytest.mark.parametrize("threads", [32, 64, 128, 256])
def test_vec_cluster_outputs_split_over_ranks(n4, threads):
    """The cluster's merge: rank r takes float4s r x threads + i, stepping VCL x threads (whole
    warps, Q8_1 blocks of 8 float4 inside one warp): every output exactly once."""
    seen = Counter()
    for r in range(VCL):
        for e00 in range(r * threads, n4, VCL * threads):
            assert e00 % 32 == 0
            seen.update(e for e in range(e00, e00 + threads) if e < n4)
    assert sorted(seen) == list(range(n4)) and set(seen.values()) == {1}


def test_fleet_decode_searches_vec():
    """experiments/fleet-decode.toml offers attention_decode.vec with its knobs (a knob renamed
    in the registry fails here rather than as a study that never tries it)."""
    from pathlib import Path

    from agent.experiment import load_experiment
    from agent.space import build_space

    exp = load_experiment(Path(__file__).resolve().parents[4] / "experiments/fleet-decode.toml")
    grid = build_space("cuda", exp.space_for("cuda")).grid()
    assert "vec" in grid["attention_decode.variant"]
    for knob, values in [("cluster", [0, 1]), ("warps", [2, 4, 8]), ("prefetch", [0, 1]),
                         ("fuse_rope", [0, 1])]:  # fmt: skip
        assert grid[f"attention_decode.vec.{knob}"] == values, knob
