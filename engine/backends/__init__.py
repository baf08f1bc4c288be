"""Backends behind one op contract (engine.backends.base.Backend). Imported lazily so that a
machine without CuPy or Vulkan can still use the others."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from engine.errors import BackendUnavailable, ConfigError

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.tuning import TuningConfig

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


def create(name: str, config: TuningConfig | None = None) -> Backend:
    """A ready backend; raises BackendUnavailable when its library or device is missing."""
    return backend_class(name)(config)


def available() -> list[str]:
    """Backends that import and find a device on this machine."""
    out = []
    for name in BACKENDS:
        try:
            b = create(name)
            b.device_info()
            out.append(name)
        except Exception:  # noqa: BLE001 - any failure means "not usable here"
            continue
    return out
