"""The hybrids' ops on Vulkan against the NumPy reference (column slices, conv1d with state,
the delta-net gates, the sigmoid gate, partial RoPE, the MoE router and experts), and whole tiny
qwen35 / qwen35moe / qwen3next models on Vulkan against NumPy on both prefill paths, with the
decode graph replayed and not."""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.numpy_ref import NumpyBackend
from engine.gguf_model import QTensor, open_model
from engine.models import build_model
from engine.tuning import TuningConfig
from engine.verify.validate import compare_logits
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    nmse,
    qtensor,
)
from tests.op_cases import assert_ssm_conv_carries_state

pytestmark = pytest.mark.usefixtures("clean_vb")


def _f32(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _vec(name, a):
    a = np.asarray(a, np.float32)
    return QTensor(
        name, "F32", a.shape, a.view(np.uint8).reshape(1 if a.ndim == 1 else a.shape[0], -1)
    )


def test_cols(vb):
    x = _f32(np.random.default_rng(0), 5, 3, 40)
    for a, b in ((0, 40), (0, 16), (16, 40), (7, 8)):
        got = vb.download(vb.ops.cols(vb.upload(x), a, b))
        assert np.array_equal(got, x[..., a:b]), (a, b)


@pytest.mark.parametrize("splits", [[9], [1, 1, 1], [4, 1, 4]])
def test_ssm_conv_carries_state(vb, splits):
    assert_ssm_conv_carries_state(vb, splits, K=4, Cc=300, seed=1)


def test_gates_sigmoid_and_partial_rope(vb):
    rng = np.random.default_rng(2)
    ref = NumpyBackend()
    a, b = _f32(rng, 7, 6) * 4, _f32(rng, 7, 6) * 4
    dt, sa = _vec("dt", _f32(rng, 6)), _vec("a", -rng.uniform(1, 8, 6))
    g_ref, beta_ref = ref.ops.ssm_gates(a, b, ref.load_weight(dt), ref.load_weight(sa))
    g, beta = vb.ops.ssm_gates(vb.upload(a), vb.upload(b), vb.load_weight(dt), vb.load_weight(sa))
    assert nmse(g_ref, vb.download(g)) < 1e-12 and nmse(beta_ref, vb.download(beta)) < 1e-12
    x, gate = _f32(rng, 3, 4, 32), _f32(rng, 3, 4, 32)
    got = vb.download(vb.ops.sigmoid_mul(vb.upload(gate), vb.upload(x)))
    assert nmse(ref.ops.sigmoid_mul(gate, x), got) < 1e-12
    for n_rot in (8, 32):
        want = ref.ops.rope_partial(x, 5, 1e7, n_rot)
        got = vb.download(vb.ops.rope_partial(vb.upload(x), 5, 1e7, n_rot))
        assert nmse(want, got) < 1e-10, n_rot
        assert np.array_equal(got[..., n_rot:], x[..., n_rot:])


def test_router_topk(vb):
    rng = np.random.default_rng(3)
    logits = _f32(rng, 9, 256) * 3
    logits[0, 17] = logits[0, 5] = 40.0  # a tie: the lower index first, as the stable sort
    ids, w = vb.ops.router_topk(vb.upload(logits), 8)
    want_ids, want_w = NumpyBackend().ops.router_topk(logits, 8)
    assert vb.download(ids).tolist() == want_ids.tolist()
    assert np.allclose(vb.download(w), want_w, atol=1e-6)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "F16"])
def test_moe_experts(vb, qtype):
    rng = np.random.default_rng(4)
    E, F, C, T, k = 8, 256, 512, 5, 3
    gate, up = qtensor(rng, (E, F, C), qtype, 0.1), qtensor(rng, (E, F, C), qtype, 0.1)
    down = qtensor(rng, (E, C, F), qtype, 0.1)
    x = _f32(rng, T, C)
    ids, w = NumpyBackend().ops.router_topk(_f32(rng, T, E), k)
    ref = NumpyBackend()
    want = ref.ops.moe_experts(x, ids, w, *(ref.load_weight(t) for t in (gate, up, down)))
    got = vb.ops.moe_experts(
        vb.upload(x), vb.upload(ids), vb.upload(w), *(vb.load_weight(t) for t in (gate, up, down))
    )
    assert nmse(want, vb.download(got)) < 1e-10


@pytest.mark.parametrize(
    "variant,tile",
    [("grouped", 4), ("grouped", 16), ("grouped", 32), ("dmmv", 16)],
)
@pytest.mark.parametrize("qtype,C,F", [("Q4_K", 256, 256), ("F16", 52, 20)])
def test_moe_experts_variants_with_skewed_routing(vb, variant, tile, qtype, C, F):
    """Both variants against NumPy with a hot expert (many tiles of tile_pairs), experts never
    chosen, F16 rows whose length is no multiple of 8, and T == 1 (decode: dmmv's kernels)."""
    vb.set_config(
        TuningConfig.from_flat(
            "vulkan", {"moe_experts.variant": variant, "moe_experts.tile_pairs": tile}
        )
        if variant == "grouped"
        else TuningConfig.from_flat("vulkan", {"moe_experts.variant": variant})
    )
    rng = np.random.default_rng(5)
    E, k = 8, 2
    gate, up = qtensor(rng, (E, F, C), qtype, 0.1), qtensor(rng, (E, F, C), qtype, 0.1)
    down = qtensor(rng, (E, C, F), qtype, 0.1)
    ref = NumpyBackend()
    wn = [ref.load_weight(t) for t in (gate, up, down)]
    wv = [vb.load_weight(t) for t in (gate, up, down)]
    for T in (23, 1):
        logits = _f32(rng, T, E)
        logits[:, 3] += 6.0  # expert 3 in every token's top-k: a run of T pairs
        logits[:, 6:] -= 20.0  # experts 6, 7 never chosen
        ids, w = ref.ops.router_topk(logits, k)
        x = _f32(rng, T, C)
        want = ref.ops.moe_experts(x, ids, w, *wn)
        got = vb.ops.moe_experts(vb.upload(x), vb.upload(ids), vb.upload(w), *wv)
        assert nmse(want, vb.download(got)) < 1e-10, T


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe", "qwen3next"])
@pytest.mark.parametrize("replay", [True, False])
def test_tiny_hybrid_matches_numpy(vb, tiny_model_factory, arch, replay):
    g = open_model(tiny_model_factory(arch, "q4_k_m"))
    vb.set_config(TuningConfig.from_flat("vulkan", {"submit.replay": replay}))
    mv, mn = build_model(g, vb), build_model(g, NumpyBackend())
    prompt = list(range(5, 5 + 37))
    for path in ("per_token", "batched"):
        a, b = mn.generate(prompt, 8, path=path), mv.generate(prompt, 8, path=path)
        assert compare_logits(a.last_logits, b.last_logits)[2] < 1e-8, path
        assert a.tokens == b.tokens, path


@pytest.mark.parametrize("arch", ["qwen35", "qwen3next"])
def test_tiny_hybrid_chunked_scan_matches_numpy(vb, tiny_model_factory, arch):
    """delta_net.chunked in a whole model: a 37-token prompt in prefill chunks of 16 (two
    passes, the second ragged) and scan chunks of 8 (ragged in every pass), then decode on the
    state it leaves, against NumPy's sequential scan."""
    g = open_model(tiny_model_factory(arch, "q4_k_m"))
    flat = {"delta_net.variant": "chunked", "delta_net.chunk": 8, "prefill.chunk_tokens": 16}
    vb.set_config(TuningConfig.from_flat("vulkan", flat))
    mv, mn = build_model(g, vb), build_model(g, NumpyBackend())
    prompt = list(range(5, 5 + 37))
    a, b = mn.generate(prompt, 8, path="per_token"), mv.generate(prompt, 8, path="batched")
    assert compare_logits(a.last_logits, b.last_logits)[2] < 1e-8
    assert a.tokens == b.tokens
