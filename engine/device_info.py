"""DeviceInfo: what a worker reports about its device. A leaf module (it imports nothing of
ours), so the registry's constraints, the backends and the agent can all name it without a
circle through engine.backends."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class DeviceInfo:
    """What a worker reports about its device; ``device_class`` keys studies and promoted
    configs."""

    backend: str
    name: str
    vendor: str
    device_class: str
    driver: str = ""
    memory_bytes: int = 0
    subgroup_size: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
