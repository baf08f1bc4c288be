"""The standing mutation suite (tests/mutants.py): every planted bug is rejected and blamed on
the op it lives in; every correct variant passes on the ragged synthetic model (no false
rejection). NumPy and Vulkan (lavapipe) run in CI; CUDA is gpu-marked."""

from __future__ import annotations

import pytest

from tests.mutants import MUTANTS, Mutant, judge

RAGGED = ("qwen2", "q4_k_m", "ragged")


@pytest.fixture(scope="module")
def ragged(tiny_model_factory):
    return tiny_model_factory(RAGGED[0], RAGGED[1], preset=RAGGED[2])


def _ids(ms: list[Mutant]) -> list[str]:
    return [m.id for m in ms]


def _assert_caught(m: Mutant, path, **kw) -> None:  # noqa: ANN001
    v = judge(m, path, **kw)
    assert v.rejected, f"{m.id} ({m.what}) passed {m.check}: KLD {v.kld:.3g} NMSE {v.nmse:.3g}"
    assert v.caught_by == m.check
    assert v.blamed == m.blamed, f"{m.id}: blame named {v.blame!r}, the bug is in {m.blamed}"
    if m.check == "validate" and m.op_level:  # on the reference's inputs, under its own class
        assert v.replay_failed, f"{m.id}: op-level replay passed it (worst {v.replay_worst})"


def test_suite_has_at_least_25_mutants_over_three_backends():
    assert len(MUTANTS) >= 25
    assert {m.backend for m in MUTANTS} == {"numpy", "vulkan", "cuda"}
    assert len({m.id for m in MUTANTS}) == len(MUTANTS)


NUMPY = [m for m in MUTANTS if m.backend == "numpy"]


@pytest.mark.parametrize("m", NUMPY, ids=_ids(NUMPY))
def test_numpy_mutant_is_rejected_and_blamed(m, ragged):
    _assert_caught(m, ragged)


@pytest.mark.parametrize(
    "flat",
    [
        {},
        {"prefill.chunk_tokens": 1},
        {"prefill.chunk_tokens": 128},
        {"prefill.chunk_tokens": 24, "matmul_decode.variant": "ondemand"},
        {"matmul_prefill.variant": "ondemand"},
    ],
)
def test_numpy_correct_variants_pass(flat, ragged):
    from engine.backends.numpy_ref import NumpyBackend
    from engine.gguf_model import open_model
    from engine.models import build_model
    from engine.tuning import TuningConfig
    from engine.verify.validate import validate
    from tests.mutants import prompts

    m = build_model(open_model(ragged), NumpyBackend())
    rep = validate(m, TuningConfig.default("numpy").replace(**flat), prompts(509), steps=4)
    assert rep.passed, rep.reasons


VULKAN = [m for m in MUTANTS if m.backend == "vulkan"]


@pytest.fixture(scope="module")
def vulkan_factory():
    from tests.engine.backends.vulkan.test_vulkan_helpers import make_backend

    return make_backend


@pytest.mark.parametrize("m", VULKAN, ids=_ids(VULKAN))
def test_vulkan_mutant_is_rejected_and_blamed(m, ragged, vulkan_factory):
    _assert_caught(m, ragged, make_backend=vulkan_factory)


@pytest.mark.parametrize(
    "flat",
    [
        {},
        {"matmul_prefill.variant": "kpar", "matmul_prefill.max_cols": 24},
        {
            "matmul_prefill.variant": "serial",
            "prefill.chunk_tokens": 16,
            "matmul_prefill.max_cols": 16,
        },
        {"matmul_prefill.tile_m": 32, "matmul_prefill.tile_n": 16},
        {"matmul_decode.variant": "subgroup", "attention.variant": "online"},
        {"matmul_decode.variant": "shmem", "argmax.variant": "default"},
        {"matmul_decode.variant": "mmvw", "rope.fuse_kv": 1, "attention.fuse_combine": 1},
        {
            "matmul_decode.variant": "mmvw",
            "matmul_decode.threads_per_row": 4,
            "matmul_decode.fuse_rope": 1,
        },
        {"attention.splits": 1, "attention.splits_prefill": 8, "argmax.slices": 1024},
        {"rms_norm.fuse_add": 1, "rope.fuse_kv": 1, "rope.fuse_bias": 1},
    ],
)
def test_vulkan_correct_variants_pass(flat, ragged, vulkan_factory):
    from engine.gguf_model import open_model
    from engine.models import build_model
    from engine.tuning import TuningConfig
    from engine.verify.validate import validate
    from tests.mutants import prompts

    be = vulkan_factory()
    try:
        cand = TuningConfig.default("vulkan").replace(**flat)
        if cand.problems(be.device_info()):
            pytest.skip(f"not allowed on this device: {cand.problems(be.device_info())}")
        m = build_model(open_model(ragged), be)
        rep = validate(m, cand, prompts(509), steps=4)
        assert rep.passed, rep.reasons
    finally:
        be.close()


CUDA = [m for m in MUTANTS if m.backend == "cuda"]


@pytest.mark.gpu
@pytest.mark.parametrize("m", CUDA, ids=_ids(CUDA))
def test_cuda_mutant_is_rejected_and_blamed(m, ragged):
    pytest.importorskip("cupy")
    _assert_caught(m, ragged)


@pytest.mark.parametrize("backend", ["cuda", "vulkan"])
def test_op_level_flag_agrees_with_the_backends_hook_bypassed_fusions(backend):
    """A mutant whose op runs fused only unhooked (the backend's hook_bypassed_fusions names it)
    cannot fail op-level replay, so it must say op_level=False; one in an op the hook sees must
    not (the GPU suite asserts replay fails it). Checked here without a device."""
    from types import SimpleNamespace

    from engine.tuning import TuningConfig

    if backend == "cuda":
        from engine.backends.cuda.backend import CudaBackend as cls
    else:
        from engine.backends.vulkan.backend import VulkanBackend as cls
    for m in MUTANTS:
        if m.backend != backend or m.check != "validate" or m.blamed == "argmax":
            continue  # the argmax is not a hooked op at all (the device-argmax check sees it)
        cand = TuningConfig.default(backend).replace(**m.candidate)
        bypassed = cls.hook_bypassed_fusions(SimpleNamespace(), cand)  # a fresh backend
        assert (m.blamed in bypassed) == (not m.op_level), (m.id, bypassed)
