"""rms_norm.fuse_add on Vulkan (engine/backends/vulkan/fused_norm.py, rms_norm.comp ADD_RES): the
residual add before an RMSNorm in the norm's dispatch; rope.fuse_bias (rope.comp FUSE_BIAS): the
q/k/v bias adds in the RoPE + KV-write dispatch. Same arithmetic as add + rms_norm, so the
fused results are compared bit for bit with the unfused ops, on ragged shapes (rows not a
multiple of the workgroup, row views at odd offsets), at workgroup sizes from 32 to 512, with a
canary after the outputs; plus NumPy, the dispatch count, the int8 decode path left alone, the
model end to end, and the planted ADD_NORM_NO_RES bug that validate must reject.

No subgroup operations: the row's sum of squares is a shared-memory tree, so no subgroup size
can change the result (the 8-lane lavapipe, the H200's 32 and RDNA's 64 run the same code).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.plan import AttnIn
from engine.tuning import TuningConfig
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    assert_no_validation_errors,
    make_backend,
    prefill_and_decode,
    qtensor,
)
from tests.engine.backends.vulkan.test_vulkan_ops import assert_canary_after, poison_free_buffers
from tests.op_cases import dense, nmse

FUSE = {"rms_norm.fuse_add": 1}


@pytest.fixture(scope="module")
def vb():
    be = make_backend()
    yield be
    assert_no_validation_errors(be)
    be.close()


def _cfg(flat: dict) -> TuningConfig:
    return TuningConfig.default("vulkan").replace(**flat)


def _ref(r: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, ...]:
    s = r.astype(np.float64) + x
    return s, s / np.sqrt((s * s).mean(-1, keepdims=True) + eps) * w


@pytest.mark.parametrize("wg", [32, 256, 512])
@pytest.mark.parametrize("T,D", [(1, 256), (3, 96), (37, 200), (130, 1000)])
def test_add_rms_norm_is_add_then_norm_bit_for_bit(vb, T, D, wg):
    rng = np.random.default_rng(T * 7 + D)
    x = rng.standard_normal((T + 2, D)).astype(np.float32)
    r = rng.standard_normal((T + 1, D)).astype(np.float32) * 3
    wq = qtensor(rng, (D,), "F32", std=1.0)
    w = vb.load_weight(wq)
    xt = vb.ops.rows(vb.upload(x), 2, T + 2)  # views at an offset
    rt = vb.ops.rows(vb.upload(r), 1, T + 1)
    vb.set_config(_cfg({"rms_norm.wg_size": wg}))
    s0 = vb.ops.add(rt, xt)
    y0 = vb.ops.rms_norm(s0, w, 1e-6)
    plain = vb.download(s0), vb.download(y0)
    vb.set_config(_cfg(FUSE | {"rms_norm.wg_size": wg}))
    poison_free_buffers(vb, T * D)
    s1, y1 = vb.add_rms_norm(rt, xt, w, 1e-6)
    fused = vb.download(s1), vb.download(y1)
    assert_canary_after(vb, y1)
    for a, b in zip(plain, fused, strict=True):
        assert a.shape == (T, D) and np.array_equal(a, b)
    s, y = _ref(r[1:], x[2:], dense(wq), 1e-6)
    assert nmse(s, fused[0]) < 1e-12 and nmse(y, fused[1]) < 1e-10


def _block(rng: np.random.Generator, C: int = 256, F: int = 512) -> tuple:
    ws = (qtensor(rng, (C, C), "Q4_K"), qtensor(rng, (F, C), "Q4_K"), qtensor(rng, (F, C), "Q4_K"),
          qtensor(rng, (C, F), "Q6_K"), qtensor(rng, (C,), "F32", std=1.0))  # fmt: skip
    return ws


@pytest.mark.parametrize("T", [1, 5, 70])
def test_matmul_add_norm_and_ffn_norm_fused_equal_unfused(vb, T):
    """The model's two fused residual ops give the same bits with fuse_add, with one dispatch
    fewer each; under the int8 decode path (mmvw) a decode row keeps mmvw's schedule."""
    rng = np.random.default_rng(T)
    wo, wg, wu, wd, nw = _block(rng)
    C = 256
    a = rng.standard_normal((T, C)).astype(np.float32)
    r = rng.standard_normal((T, C)).astype(np.float32)
    runs, counts = {}, {}
    for name, flat in (("plain", {}), ("fused", FUSE)):
        vb.set_config(_cfg(flat))
        o, g, u, d, n = (vb.load_weight(w) for w in (wo, wg, wu, wd, nw))
        at, rt = vb.upload(a), vb.upload(r)
        vb.synchronize()
        before = vb.stats()["dispatches"]
        x1, h1 = vb._matmul_add_norm(at, o, rt, n, 1e-6)
        x2, h2 = vb._ffn_norm(h1, g, u, d, x1, n, 1e-6)
        vb.synchronize()
        counts[name] = vb.stats()["dispatches"] - before
        runs[name] = [vb.download(t) for t in (x1, h1, x2, h2)]
    assert counts["plain"] - counts["fused"] == 2
    for p, f in zip(runs["plain"], runs["fused"], strict=True):
        assert np.array_equal(p, f)
    a64 = a.astype(np.float64)
    x1, h1 = _ref(r, a64 @ dense(wo).T, dense(nw), 1e-6)
    assert nmse(x1, runs["fused"][0]) < 1e-9 and nmse(h1, runs["fused"][1]) < 1e-9
    if T == 1:  # mmvw's decode schedule (residual on store, norm + Q8_1) is left as it is
        mm = {"matmul_decode.variant": "mmvw"}
        outs = {}
        for name, flat in (("mmvw", mm), ("mmvw_fuse", mm | FUSE)):
            vb.set_config(_cfg(flat))
            o, n = vb.load_weight(wo), vb.load_weight(nw)
            outs[name] = [
                vb.download(t) for t in vb._matmul_add_norm(vb.upload(a), o, vb.upload(r), n, 1e-6)
            ]
        for p, f in zip(outs["mmvw"], outs["mmvw_fuse"], strict=True):
            assert np.array_equal(p, f)


@pytest.mark.parametrize("wg", [32, 256])
@pytest.mark.parametrize("T,pos0,heads", [(1, 0, (4, 2, 64)), (1, 37, (6, 2, 32)),
                                          (5, 9, (4, 4, 64)), (70, 3, (6, 2, 32))])  # fmt: skip
def test_rope_fuse_bias_equals_adds_then_rope_kv(vb, T, pos0, heads, wg):
    """rope.fuse_bias: the q/k/v bias adds inside the RoPE + KV-write dispatch give the bits
    of three add dispatches and the plain fused RoPE + KV write (normal and neox pairing, GQA,
    decode rows and chunks), three dispatches fewer; no other cache slot changes."""
    H, Hkv, D = heads
    C = 128
    rng = np.random.default_rng(T + pos0 + H)
    wq = [qtensor(rng, (n, C), "Q8_0") for n in (H * D, Hkv * D, Hkv * D)]
    bq = [qtensor(rng, (w.shape[0],), "F32", std=1.0) for w in wq]
    h = rng.standard_normal((T, C)).astype(np.float32)
    for neox in (False, True):
        runs, counts = {}, {}
        for name, flat in (("kv", {"rope.fuse_kv": 1}),
                           ("bias", {"rope.fuse_kv": 1, "rope.fuse_bias": 1})):  # fmt: skip
            vb.set_config(_cfg(flat | {"rope.wg_size": wg}))
            ws = tuple(vb.load_weight(w) for w in wq)
            bs = tuple(vb.load_weight(b) for b in bq)
            cache = vb.new_kv_cache(1, pos0 + T + 2, Hkv, D)
            ht = vb.upload(h)
            vb.synchronize()
            before = vb.stats()["dispatches"]
            q = vb._attn_in(AttnIn(ht, ws, bs, cache, 0, pos0, (H, Hkv, D), 1e4, neox))
            vb.synchronize()
            counts[name] = vb.stats()["dispatches"] - before
            runs[name] = (vb.download(q), vb.download(cache.k[0]), vb.download(cache.v[0]))
        assert counts["kv"] - counts["bias"] == 3
        for a, b in zip(runs["kv"], runs["bias"], strict=True):
            assert np.array_equal(a, b)
        _, k, v = runs["bias"]
        assert not k[:pos0].any() and not k[pos0 + T :].any()
        v_ref = h.astype(np.float64) @ dense(wq[2]).T + dense(bq[2])
        assert nmse(v_ref.reshape(T, Hkv, D), v[pos0 : pos0 + T]) < 1e-9


def test_rope_fuse_bias_needs_fuse_kv(vb):
    bad = _cfg({"rope.fuse_bias": 1}).problems(vb.device_info())
    assert len(bad) == 1 and "fuse_bias needs fuse_kv" in bad[0]


def test_prefill_kick_submits_early_with_the_same_bits(tiny_model_path):
    """submit.prefill_kick: the prefill is submitted in pieces as the host records it (never
    waiting for the device), with the logits of one submission per forward; decode steps are
    untouched (their graph is still captured and replayed)."""
    from engine.bench import bench_prompt
    from engine.runtime import load

    eng = load(tiny_model_path, "vulkan", _cfg({}), use_promoted=False)
    m, be = eng.model, eng.backend
    prompt = bench_prompt(45, m.spec.n_vocab)
    outs, submits = {}, {}
    for kick in (0, 32):
        m.set_config(_cfg({"submit.prefill_kick": kick}))
        outs[kick], submits[kick] = prefill_and_decode(m, be, prompt, 4)
    assert submits[0] == 1 and submits[32] > 1
    for a, b in zip(outs[0], outs[32], strict=True):
        assert np.array_equal(a, b)
    eng.backend.close()


def test_stream_kick_submits_pieces_in_order(vb):
    """Stream.kick: below min_nodes nothing happens; at min_nodes the nodes go to the device
    without waiting for them, recorded while the previous piece may still run and submitted
    after it (dependent pieces: each reads the one before); idle() polls the fence."""
    import time

    vb.set_config(_cfg({}))
    x = vb.upload(np.ones(1 << 16, np.float32))
    assert not vb.stream.kick(1) and vb.stream.idle()
    y = x
    for _ in range(3):  # three pieces of a chain y = y + x
        y = vb.ops.add(y, x)
        assert not vb.stream.kick(3)
        y = vb.ops.add(y, x)
        y = vb.ops.add(y, x)
        assert vb.stream.kick(3) and not vb.stream.nodes
    for _ in range(500):
        if vb.stream.idle():
            break
        time.sleep(0.01)
    else:
        raise AssertionError("the fence never signalled")
    assert np.array_equal(vb.download(y), np.full(1 << 16, 10, np.float32))


def test_registry_knob_and_pass(vb):
    from engine.backends.vulkan.kernels import all_builds, pass_keys

    assert pass_keys("rms_norm", "default") == ("rms_norm", "rms_norm.add", "rms_norm.add_x16")
    assert ("rms_norm", ("ADD_RES",)) in all_builds()
    p = TuningConfig.default("vulkan").op("rms_norm")
    assert p["fuse_add"] == 0  # off by default until the device run decides
    assert _cfg(FUSE).problems(vb.device_info()) == []


def test_model_with_fuse_add_matches_default(tiny_model_path):
    """The whole model (the fused schedule runs when no hook watches) gives the default's logits
    bit for bit: prefill of a ragged prompt and decode steps."""
    from engine.bench import bench_prompt
    from engine.runtime import load

    eng = load(tiny_model_path, "vulkan", _cfg({}), use_promoted=False)
    m = eng.model
    prompt = bench_prompt(37, m.spec.n_vocab)
    outs = {}
    for name, flat in (("plain", {}), ("fused", FUSE)):
        m.set_config(_cfg(flat))
        cache = m.new_cache(48)
        logits = [m.backend.download(m.prefill(prompt, cache))]
        tok = m.backend.upload(np.array([3], np.int32))
        for i in range(3):
            logits.append(m.backend.download(m.forward(tok, 1, len(prompt) + i, cache)))
        outs[name] = logits
    for a, b in zip(outs["plain"], outs["fused"], strict=True):
        assert np.array_equal(a, b)
    eng.backend.close()
