"""Helpers shared by the Vulkan test files (no tests here): one backend per module, and the
validation-layer check (FLEETTUNE_VK_VALIDATION=1 makes every Vulkan test fail on a layer error)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.gguf_model import QTensor
from engine.tuning import TuningConfig
from tests import op_cases
from tests.backend_params import open_backend, usable


def require_vulkan() -> None:
    why = usable().get("vulkan")
    if why is not None:
        pytest.skip(f"vulkan backend not usable here: {why}")


def make_backend():  # noqa: ANN201 - VulkanBackend, imported lazily
    require_vulkan()
    return open_backend("vulkan")


def allowed_config(be, flat: dict) -> TuningConfig:  # noqa: ANN001
    """The default Vulkan config with flat; skips the test where be's device does not allow it
    (e.g. a required subgroup size of 8 on a device fixed at 32)."""
    cfg = TuningConfig.default("vulkan").replace(**flat)
    bad = cfg.problems(be.device_info())
    if bad:
        pytest.skip(f"not allowed on this device: {bad}")
    return cfg


def prefill_and_decode(m, be, prompt: list[int], steps: int) -> tuple[list[np.ndarray], int]:  # noqa: ANN001
    """The logits of m's prefill of prompt into a fresh 64-position cache and of steps decode
    steps after it (graph-captured and replayed, token 5 first), and the prefill's submits."""
    cache = m.new_cache(64)
    be.synchronize()
    s0 = be.stats()["submits"]
    out = [be.download(m.prefill(prompt, cache))]
    submits = be.stats()["submits"] - s0
    tok = be.upload(np.array([5], np.int32))

    def step(t, p):  # noqa: ANN001, ANN202
        lg = m.forward(t, 1, p, cache)
        return lg, be.ops.argmax(lg)

    for i in range(steps):
        lg, tok = be.decode_step(step, tok, len(prompt) + i, cache)
        out.append(be.download(lg))
    return out, submits


def assert_no_validation_errors(be) -> None:  # noqa: ANN001
    msgs = list(be.validation_messages)
    be.validation_messages.clear()
    assert not msgs, "Vulkan validation layer errors:\n" + "\n".join(m[:500] for m in msgs)


def qtensor(
    rng: np.random.Generator, shape: tuple[int, ...], qtype: str, std: float = 0.05, name: str = "w"
) -> QTensor:
    """op_cases.qtensor with the Vulkan suites' small default scale (activations stay O(1))."""
    return op_cases.qtensor(rng, shape, qtype, std, name)


nmse = op_cases.nmse


def coopmat_fixture(name: str):  # noqa: ANN201 - a pytest fixture
    """A module-scoped fixture NAME: a Vulkan backend on a device with cooperative matrices (the
    GPU tests of the fp16 GEMMs and flash attention), the module's tests skipped, with the
    device's reason, where it has none (lavapipe)."""

    def backend():  # noqa: ANN202
        be = make_backend()
        dev = be.device_info()
        if not dev.extra.get("cooperative_matrix"):
            be.close()
            pytest.skip(f"{dev.name}: no cooperative matrices ({dev.extra.get('coopmat_missing')})")
        yield be
        be.close()

    return pytest.fixture(scope="module", name=name)(backend)


def half_ref(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x @ w.T of the fp16-rounded operands in float64: what an fp16 GEMM computes up to its
    fp32 accumulation order."""
    return x.astype(np.float16).astype(np.float64) @ w.astype(np.float16).astype(np.float64).T


def assert_matmuls_on_the_default_config(be) -> None:  # noqa: ANN001
    """After a refused set_config: the backend still multiplies, on the default (tiled) GEMM."""
    w = qtensor(np.random.default_rng(0), (9, 256), "Q4_K")  # the suites' scale
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    out = be.download(be.ops.matmul(be.upload(x), be.load_weight(w)))
    assert be.config.op("matmul_prefill").variant == "tiled"
    assert op_cases.nmse(x.astype(np.float64) @ op_cases.dense(w).T, out) < 1e-8
