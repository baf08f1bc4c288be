"""The whole model on the Vulkan backend: validate (batched candidate vs per-token reference)
passes for every registered variant and a sample of parameter values, on the synthetic models of
each architecture; greedy tokens match the NumPy backend; a config that cannot be used is
reported and the next one runs. The real Qwen 0.5B run is @slow."""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import ConfigError
from engine.models import build_model
from engine.tuning import REGISTRY, TuningConfig
from engine.verify.cross_check import cross_check_numpy
from engine.verify.validate import PROMPTS, validate
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    assert_no_validation_errors,
)

# One config per registered variant of every op with more than one, plus parameter samples
# that stress chunking (the seed's one-forward-per-tile schedule with ragged chunks via
# chunk_tokens == max_cols == 8; ragged column tiles inside one forward via 40 and 1), workgroup
# shapes and the command-buffer knobs (tiny submits, no replay); split attention with one range
# (no merge), with more ranges than keys and with several ranges per prefill query; argmax with
# one slice and with more slices than the vocabulary has elements per thread. matmul_decode's
# default (block) runs at its defaults, with a required subgroup size of 8, with 4-lane clusters
# of 4 rows each and with one row per workgroup; subgroup and shmem once each.
CONFIGS = [
    {},
    {
        "attention.variant": "online",
        "argmax.variant": "default",
        "matmul_prefill.variant": "serial",
        "matmul_prefill.max_cols": 8,
        "prefill.chunk_tokens": 8,
        "matmul_decode.variant": "shmem",
        "matmul_decode.threads_per_row": 8,
        "matmul_decode.rows_per_wg": 4,
        # the hybrids' other variants (this model has no delta-net or MoE layer: they are
        # sampled here, and run in tests/engine/backends/vulkan/test_vulkan_hybrid.py)
        "delta_net.variant": "chunked",
        "moe_experts.variant": "dmmv",
    },
    {
        "matmul_prefill.max_cols": 40,
        "matmul_prefill.variant": "kpar",
        "matmul_prefill.wg_size": 32,
        "matmul_prefill.rows_per_wg": 1,
        "matmul_decode.wg_size": 128,
        "matmul_decode.rows_per_wg": 16,
        "matmul_decode.threads_per_row": 4,
        "matmul_decode.rows_per_thread": 4,
        "attention.wg_size": 32,
        "attention.splits": 64,
        "attention.splits_prefill": 4,
        "rms_norm.wg_size": 32,
        "argmax.wg_size": 512,
        "argmax.slices": 1024,
    },
    {
        "matmul_prefill.variant": "kpar",
        "matmul_prefill.max_cols": 1,
        "submit.max_nodes": 64,
        "submit.replay": False,
        "matmul_decode.variant": "subgroup",
    },
    {
        "matmul_prefill.variant": "kpar",
        "matmul_prefill.max_cols": 4,
        "prefill.chunk_tokens": 4,
        "submit.max_nodes": 64,
        "matmul_decode.wg_size": 32,
        "matmul_decode.rows_per_wg": 1,
        "matmul_decode.rows_per_thread": 1,
    },
    # the int8 decode path with every fusion (norm/SwiGLU/merge Q8_1, q/k/v in one dispatch,
    # rope + KV write, attention in one dispatch), 4-lane clusters, byte-wise dots
    {
        "matmul_decode.variant": "mmvw",
        "rope.fuse_kv": 1,
        "attention.fuse_combine": 1,
        "matmul_decode.threads_per_row": 4,
        "matmul_decode.rows_per_thread": 1,
        "matmul_decode.pair_mul": False,
    },
    {"matmul_prefill.tile_n": 16},
    # tensor cores (fp16 numeric class): skipped where the device has no cooperative matrices
    {
        "matmul_prefill.variant": "coopmat",
        "attention.variant": "coopmat",
        "prefill.chunk_tokens": 64,
    },
    {"matmul_prefill.variant": "resident", "prefill.chunk_tokens": 64},  # fp16 weight copies
    {  # helper vk: flash attention, GEMM loads two steps ahead, small grids split over k
        "matmul_prefill.variant": "resident",
        "attention.variant": "flash",
        "matmul_prefill.prefetch": 2,
        "matmul_prefill.split_k": 3,
        "attention.matrix_scale": True,
        "prefill.chunk_tokens": 64,
    },
    {"matmul_prefill.vec4": True, "prefill.chunk_tokens": 64},
    {"matmul_prefill.variant": "tiled", "prefill.chunk_tokens": 64, "matmul_prefill.tile_m": 128},
    {
        "matmul_prefill.max_cols": 16,
        "matmul_prefill.variant": "kpar",
        "matmul_prefill.subgroup_size": 8,
        "matmul_decode.subgroup_size": 8,
        "attention.wg_size": 256,
        "attention.splits": 1,
        "attention.key_threads": 32,
        "argmax.slices": 1,
        "embedding.wg_size": 32,
    },
    {  # helper vk (issue 14): flash's keys over ranges of 32 (the 45-token prompt: 2), split_k
        # per shape on the 128 x 128 tiles (every tiny grid under split_groups / 2), fuse_x16,
        # prefill_ahead
        "matmul_prefill.variant": "resident",
        "attention.variant": "flash",
        "attention.key_chunk": 32,
        "attention.matrix_scale": True,
        "matmul_prefill.fill_groups": 32,
        "matmul_prefill.split_groups": 256,
        "matmul_prefill.split_k": 4,
        "matmul_prefill.fuse_x16": 1,  # the norm and SwiGLU store the GEMMs' fp16 input
        "rms_norm.fuse_add": 1,
        "submit.prefill_kick": 16,  # pieces queued ahead
        "submit.prefill_ahead": True,
    },
]


def _prompts(tok) -> list[list[int]]:  # noqa: ANN001
    """Short validate prompts: one token, a sentence, 45 tokens (several chunks, ragged tail)."""
    return [tok.encode("A")[:1], tok.encode(PROMPTS[0]), tok.encode(PROMPTS[1])[:45]]


@pytest.fixture(autouse=True)
def _clean(vb):
    yield
    assert_no_validation_errors(vb)


def _model(path, be):  # noqa: ANN001, ANN202
    from engine.gguf_model import open_model
    from engine.tokenizer import Tokenizer

    g = open_model(path)
    be.set_config(TuningConfig.default("vulkan"))
    return build_model(g, be), Tokenizer.from_metadata(g.metadata)


def test_every_variant_is_sampled():
    ops = [o for o in REGISTRY.ops("vulkan") if len(o.variants) > 1]
    assert {"matmul_decode", "matmul_prefill", "attention", "argmax"} <= {o.name for o in ops}
    seen = {
        (o.name, TuningConfig.default("vulkan").replace(**c).op(o.name).variant)
        for c in CONFIGS
        for o in ops
    }
    for o in ops:
        for v in o.variants:
            assert (o.name, v.name) in seen


@pytest.mark.parametrize("flat", CONFIGS, ids=[f"cfg{i}" for i in range(len(CONFIGS))])
def test_validate_passes(vb, tiny_model_path, flat):
    model, tok = _model(tiny_model_path, vb)
    cand = TuningConfig.default("vulkan").replace(**flat)
    if cand.problems(vb.device_info()):
        pytest.skip(f"not allowed on this device: {cand.problems(vb.device_info())}")
    rep = validate(model, cand, _prompts(tok), steps=4)
    assert rep.passed, [p.reasons for p in rep.prompts]
    # float32 variants agree to 1e-3; an fp16 (coopmat) or int8 (mmvw) class to its budget
    assert rep.max_abs_diff < max(1e-3, REGISTRY.budget(cand)[0].max_abs_diff)


@pytest.mark.parametrize(
    "arch,quant",
    [
        ("qwen2", "q4_k_m"),
        ("qwen3", "q4_k_m"),
        ("llama", "q4_k_m"),
        ("llama", "q8_0"),
        ("qwen3", "f16"),
        ("qwen2", "q5_1"),
    ],
)
def test_architectures_match_numpy(vb, tiny_model_factory, arch, quant):
    from engine.backends.numpy_ref import NumpyBackend

    model, tok = _model(tiny_model_factory(arch, quant), vb)
    prompts = _prompts(tok)
    cross = cross_check_numpy(model, prompts[1:])
    assert cross["nmse"] < 1e-8, cross
    ref = build_model(model.gguf, NumpyBackend())
    for p in prompts:
        a = ref.generate(p, 6, path="batched")
        b = model.generate(p, 6, path="batched")
        assert a.tokens == b.tokens, "greedy tokens differ from the NumPy backend"
        assert np.abs(a.last_logits - b.last_logits).max() < 1e-3
    assert validate(model, TuningConfig.default("vulkan"), prompts, steps=4).passed


def test_unusable_config_is_reported_and_next_runs(vb, tiny_model_path):
    model, tok = _model(tiny_model_path, vb)
    dev = vb.device_info()
    bad_size = next(
        s
        for s in (8, 16, 32, 64, 128)
        if not dev.extra["min_subgroup_size"] <= s <= dev.extra["max_subgroup_size"]
    )
    bad = TuningConfig.default("vulkan").replace(
        **{"matmul_prefill.variant": "kpar", "matmul_prefill.subgroup_size": bad_size}
    )
    with pytest.raises(ConfigError):
        validate(model, bad, _prompts(tok)[:2], steps=2)
    good = TuningConfig.default("vulkan").replace(**{"prefill.chunk_tokens": 4})
    assert validate(model, good, _prompts(tok)[:2], steps=2).passed


def test_real_qwen_paris(vb, real_qwen_path):
    """The real Qwen2.5-Coder 0.5B Q4_K_M: its 145 MB Q8_0 LM head is over lavapipe's 128 MiB
    maxStorageBufferRange, so this also runs the row-range split on a real weight."""
    model, _ = _model(real_qwen_path, vb)
    head = model.lm_head
    if head.nbytes > vb.device_info().extra["max_storage_buffer_range"]:
        assert len(head.parts) > 1
    g = model.generate([785, 6722, 315, 9625, 374], 2, path="batched")
    assert g.tokens[0] == 12095  # " Paris"
    g2 = model.generate([785, 6722, 315, 9625, 374], 2, path="per_token")
    assert g2.tokens == g.tokens


def test_decode_graph_matches_plain_decode(vb, tiny_model_factory):
    """Model.generate's decode steps go through decode_step: captured once, then replayed
    without the Python ops, with the same logits as plain steps (submit.replay = false)."""
    model, _ = _model(tiny_model_factory("qwen3", "q4_k_m"), vb)
    calls = []
    real = type(vb)._embedding

    def counting(self, *a):  # noqa: ANN001, ANN202
        calls.append(1)
        return real(self, *a)

    prompt = list(range(5, 25))
    type(vb)._embedding = counting
    try:
        g = model.generate(prompt, 24, keep_logits=True)
    finally:
        type(vb)._embedding = real
    assert len(calls) <= 3, f"{len(calls)} embedding calls: decode steps were not replayed"
    vb.set_config(TuningConfig.default("vulkan").replace(**{"submit.replay": False}))
    p = model.generate(prompt, 24, keep_logits=True)
    vb.set_config(TuningConfig.default("vulkan"))
    assert g.tokens == p.tokens
    for a, b in zip(g.step_logits, p.step_logits, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("chunk,forwards", [(8, 6), (64, 1), (512, 1)])
def test_prefill_chunk_sets_the_forward_passes(vb, tiny_model_path, chunk, forwards):
    """chunk_tokens is the forward chunk, apart from the column tile: 45 tokens at max_cols 8
    take six forwards on the seed's schedule (chunk 8) and one otherwise, same logits."""
    model, tok = _model(tiny_model_path, vb)
    prompt = tok.encode(PROMPTS[1])[:45]
    assert len(prompt) == 45
    base = TuningConfig.default("vulkan").replace(
        **{"matmul_prefill.variant": "kpar", "matmul_prefill.max_cols": 8}
    )
    model.set_config(base.replace(**{"prefill.chunk_tokens": chunk}))
    calls = []
    real = model.forward
    model.forward = lambda ids, n, *a, **k: calls.append(n) or real(ids, n, *a, **k)
    try:
        got = model.generate(prompt, 1).last_logits
    finally:
        del model.forward
    assert len(calls) == forwards and sum(calls) == 45
    from engine.backends.numpy_ref import NumpyBackend

    want = build_model(model.gguf, NumpyBackend()).generate(prompt, 1).last_logits
    assert np.abs(got - want).max() < 1e-3
