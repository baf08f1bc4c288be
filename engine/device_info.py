"""The device contract's plain records: DeviceInfo (what a worker reports about its open
device), DeviceEntry (a device a backend lists without opening it), MemoryReport and
ProfileReport. A leaf module (it imports nothing of ours), so the registry's constraints, the
backends, the worker and the agent can all name them without a circle through engine.backends."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def class_slug(text: str) -> str:
    """A device class safe as one path segment (configs/<class>/) and a Ray resource name:
    lower-case letters, digits and single dashes. A driver's device name is not trusted input:
    "NVIDIA ../../../evil" must not become a path that leaves configs/."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "unknown"


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

    def __post_init__(self) -> None:  # a class from a record or another backend: made safe too
        if self.device_class:
            object.__setattr__(self, "device_class", class_slug(self.device_class))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Kinds of device, best first: a node serves only the best kind it has (two R9700s, not the
# llvmpipe that Mesa installs beside them; llvmpipe alone on a CPU-only node).
KINDS = ("discrete", "integrated", "virtual", "cpu", "other")


@dataclass(frozen=True)
class DeviceEntry:
    """One device a backend can open, as ``Backend.list_devices()`` lists it without opening
    it; ``index`` is what ``Backend.open(index)`` (and ``--device``) takes."""

    backend: str
    index: int
    name: str
    device_class: str
    kind: str = "other"  # one of KINDS
    driver: str = ""
    memory_bytes: int = 0

    def __post_init__(self) -> None:
        if self.device_class:
            object.__setattr__(self, "device_class", class_slug(self.device_class))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def served(entries: list[DeviceEntry]) -> list[DeviceEntry]:
    """The devices a node serves: every device of the best kind present."""
    rank = {k: i for i, k in enumerate(KINDS)}
    best = min((rank.get(e.kind, len(KINDS)) for e in entries), default=0)
    return [e for e in entries if rank.get(e.kind, len(KINDS)) == best]


@dataclass(frozen=True)
class MemoryReport:
    """Device memory a backend holds, in bytes: ``weight_bytes`` the loaded weights (quantized
    blocks, plus dense copies where a backend keeps them), ``kv_state_bytes`` the live KV caches
    and recurrent states, ``scratch_bytes`` everything else it holds (activations, pooled free
    buffers, staging, CUDA-graph memory), ``total_bytes`` their sum."""

    weight_bytes: int
    kv_state_bytes: int
    scratch_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weight_bytes + self.kv_state_bytes + self.scratch_bytes

    def to_dict(self) -> dict[str, int]:
        return asdict(self) | {"total_bytes": self.total_bytes}


@dataclass(frozen=True)
class KernelTime:
    calls: int
    total_ms: float

    @property
    def mean_us(self) -> float:
        return 1e3 * self.total_ms / max(self.calls, 1)


@dataclass(frozen=True)
class ProfileReport:
    """Time per kernel (or per op) since profiling was switched on or last reset, slowest first.
    ``clock`` says what measured it: "gpu-timestamps" (Vulkan), "cuda-events" (CUDA),
    "wall" (NumPy: host wall clock per op, exact since its ops are synchronous)."""

    clock: str
    kernels: dict[str, KernelTime] = field(default_factory=dict)

    @classmethod
    def of(cls, clock: str, totals: dict[str, Sequence[float]]) -> ProfileReport:
        """From {name: (calls, total ms)}, sorted slowest first."""
        rows = sorted(totals.items(), key=lambda kv: -kv[1][1])
        return cls(clock, {name: KernelTime(int(n), float(ms)) for name, (n, ms) in rows})

    @property
    def total_ms(self) -> float:
        return sum(k.total_ms for k in self.kernels.values())

    def to_dict(self) -> dict[str, Any]:
        return {
            "clock": self.clock,
            "total_ms": self.total_ms,
            "kernels": {
                name: {"calls": k.calls, "total_ms": k.total_ms, "mean_us": k.mean_us}
                for name, k in self.kernels.items()
            },
        }
