"""Which backends the shared suites run on: every backend that imports and finds a device here.
CI (no GPU) runs numpy and vulkan on lavapipe; `pytest -m gpu` on the GPU machine adds cuda."""

from __future__ import annotations

import functools

import pytest

from engine import backends


def open_backend(name: str):  # noqa: ANN201 - engine.backends.base.Backend
    """The backend on the device an entry point would open: the suites are entry points, so
    an operator's FLEETTUNE_VK_DEVICE (tools/gpu_suite.py's runs) picks their Vulkan card."""
    return backends.create(name, device=backends.default_device(name))


@functools.cache
def usable() -> dict[str, str | None]:
    """backend name -> None when usable, else the reason it is not."""
    out: dict[str, str | None] = {}
    for name in backends.BACKENDS:
        try:
            with open_backend(name) as be:
                be.device_info()
            out[name] = None
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {e}"
    return out


def backend_params() -> list:
    """pytest params: usable backends run; the others are skipped with the reason."""
    params = []
    for name, why in usable().items():
        marks = [pytest.mark.gpu] if name == "cuda" else []
        if why is not None:
            marks.append(pytest.mark.skip(reason=f"backend {name} not usable here: {why}"))
        params.append(pytest.param(name, marks=marks, id=name))
    return params
