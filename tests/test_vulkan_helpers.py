"""Helpers shared by the Vulkan test files (no tests here): one backend per module, and the
validation-layer check (FLEETTUNE_VK_VALIDATION=1 makes every Vulkan test fail on a layer error)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.gguf_model import QTensor
from engine.quantize import quantize
from tests.backend_params import usable


def require_vulkan() -> None:
    why = usable().get("vulkan")
    if why is not None:
        pytest.skip(f"vulkan backend not usable here: {why}")


def make_backend():  # noqa: ANN201 - VulkanBackend, imported lazily
    require_vulkan()
    from engine.backends.vulkan import VulkanBackend

    return VulkanBackend()


def assert_no_validation_errors(be) -> None:  # noqa: ANN001
    msgs = list(be.validation_messages)
    be.validation_messages.clear()
    assert not msgs, "Vulkan validation layer errors:\n" + "\n".join(m[:500] for m in msgs)


def qtensor(
    rng: np.random.Generator, shape: tuple[int, ...], qtype: str, std: float = 0.05, name: str = "w"
) -> QTensor:
    a = (rng.standard_normal(shape) * std).astype(np.float32)
    a2 = a.reshape(-1, shape[-1])
    raw = quantize(a2, qtype).view(np.uint8).reshape(a2.shape[0], -1)
    return QTensor(name, qtype, tuple(shape), raw)


def nmse(ref: np.ndarray, out: np.ndarray) -> float:
    ref, out = np.asarray(ref, np.float64), np.asarray(out, np.float64)
    return float(np.sum((out - ref) ** 2) / max(np.sum(ref**2), 1e-30))
