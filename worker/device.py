"""What devices a node has, and the Ray resources that place workers on them.

Every device advertises a custom resource ``device:<device class>`` (one unit per device), Vulkan-
only AMD nodes and llvmpipe included; CUDA devices also count as Ray ``num_gpus``. The NumPy
backend's ``cpu`` class is advertised only when asked for (or when a node has no GPU), so CPU
trials never share a node's cores with GPU timing runs by accident.

Devices are found through the engine's device contract only (``Backend.list_devices``): a node
serves every device of the best kind each backend lists (two R9700s, not the llvmpipe beside
them), or the one device its operator pinned (``engine.backends.default_device``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.device_info import DeviceEntry, served
from engine.provenance import engine_commit  # noqa: F401 - where the worker's records take it

log = logging.getLogger(__name__)

RESOURCE_PREFIX = "device:"
BACKEND_PREFIX = "backend:"
GPU_BACKENDS = ("cuda", "vulkan")


def resource_name(device_class: str) -> str:
    """The custom resource one device of this class contributes: ``device:<class>``."""
    return f"{RESOURCE_PREFIX}{device_class}"


def backend_resource(backend: str, device_class: str) -> str:
    """``backend:<backend>/<class>``: this backend serves devices of this class on the node
    (so the agent knows which backend to start a worker of the class with)."""
    return f"{BACKEND_PREFIX}{backend}/{device_class}"


def backends_for(resources: dict[str, float], device_class: str) -> list[str]:
    """Backends the cluster advertises for a device class."""
    out = []
    for key in resources:
        if key.startswith(BACKEND_PREFIX):
            backend, _, cls = key[len(BACKEND_PREFIX) :].partition("/")
            if cls == device_class:
                out.append(backend)
    return out


def device_classes_in(resources: dict[str, float]) -> dict[str, int]:
    """{device class: count} from a Ray resources dict (cluster or node)."""
    out = {}
    for key, value in resources.items():
        if key.startswith(RESOURCE_PREFIX) and value >= 1:
            out[key[len(RESOURCE_PREFIX) :]] = int(value)
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class NodeDevices:
    """The devices found on this node, by backend."""

    devices: tuple[DeviceEntry, ...]
    cuda_count: int = 0

    def resources(self) -> dict[str, float]:
        """Custom Ray resources for ``ray start --resources`` / ``ray.init(resources=...)``."""
        out: dict[str, float] = {}
        for d in self.devices:
            key = resource_name(d.device_class)
            out[key] = out.get(key, 0) + 1
        for d in self.devices:  # count per class, not per backend: a device is one unit
            out[backend_resource(d.backend, d.device_class)] = out[resource_name(d.device_class)]
        return out


def served_devices(backend: str) -> list[DeviceEntry]:
    """The devices of ``backend`` this node serves: the operator's pinned one, else every
    device of the best kind the backend lists; [] when the backend is not usable here."""
    from engine import backends as engine_backends

    try:
        found = engine_backends.backend_class(backend).list_devices()
        pinned = engine_backends.default_device(backend)
    except Exception as e:  # noqa: BLE001 - any failure: not usable on this node
        log.debug("backend %s not usable here: %s", backend, e)
        return []
    if pinned is not None:
        return [d for d in found if d.index == pinned]
    return served(found)


def detect(backends: tuple[str, ...] | None = None, with_cpu: bool | None = None) -> NodeDevices:
    """Probe the backends that can run here. ``with_cpu`` None: the NumPy ``cpu`` class only
    when no GPU backend found a device."""
    from engine import backends as engine_backends

    names = backends or tuple(engine_backends.BACKENDS)
    found = [d for name in names if name != "numpy" for d in served_devices(name)]
    if "numpy" in names and (with_cpu or (with_cpu is None and not found)):
        found += served_devices("numpy")
    return NodeDevices(tuple(found), sum(d.backend == "cuda" for d in found))
