"""Backends behind one op and device contract (engine.backends.base.Backend). Imported lazily
so that a machine without CuPy or Vulkan can still use the others.

Which device a backend opens is an argument (``create(name, device=i)``, ``Backend.open(i)``),
never read from the environment inside a backend. ``default_device`` is the one place that
reads ``FLEETTUNE_VK_DEVICE``: entry points (the engine CLI's ``--device`` default, the worker's
device claim) call it so an operator can pin a node's Vulkan card."""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING

from engine.errors import BackendUnavailable, ConfigError

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.tuning import TuningConfig

# backend -> the environment variable an operator sets to pin its device (an index of
# Backend.list_devices()); CUDA devices are chosen with CUDA_VISIBLE_DEVICES (Ray sets it).
DEVICE_ENV = {"vulkan": "FLEETTUNE_VK_DEVICE"}

# name -> "module:Class"
BACKENDS = {
    "numpy": "engine.backends.numpy_ref:NumpyBackend",
    "vulkan": "engine.backends.vulkan:VulkanBackend",
    "cuda": "engine.backends.cuda:CudaBackend",
}


def backend_class(name: str) -> type[Backend]:
    try:
        spec = BACKENDS[name]
    except KeyError:
        raise ConfigError(f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}") from None
    module, cls = spec.split(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise BackendUnavailable(
            f"backend {name!r} cannot be used here: {e}. Install its extra "
            f"(pip install -e '.[{name}]') on a machine with that device."
        ) from None


def create(name: str, config: TuningConfig | None = None, device: int | None = None) -> Backend:
    """A ready backend on device ``device`` (an index of its ``list_devices()``; None: the
    backend's default choice); raises BackendUnavailable when its library or device is
    missing, ConfigError when there is no such device."""
    return backend_class(name).open(device, config)


def default_device(name: str) -> int | None:
    """The device an entry point opens when the user names none: ``$FLEETTUNE_VK_DEVICE`` for
    vulkan (the only place it is read), else None (the backend's own choice)."""
    var = DEVICE_ENV.get(name)
    raw = os.environ.get(var, "").strip() if var else ""
    if not raw:
        return None
    try:
        index = int(raw)
    except ValueError:
        raise ConfigError(
            f"{var}={raw!r}: give a device index (python -m engine devices)"
        ) from None
    if index < 0:
        raise ConfigError(f"{var}={raw!r}: a device index is >= 0")
    return index


def available() -> list[str]:
    """Backends that open their default device on this machine (and build its kernels)."""
    out = []
    for name in BACKENDS:
        try:
            with create(name) as b:
                b.device_info()
            out.append(name)
        except Exception:  # noqa: BLE001 - any failure means "not usable here"
            continue
    return out
