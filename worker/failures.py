"""How a candidate's own failure is worded: a config that exhausts device memory says so.

The engine raises out-of-memory in several forms: CuPy's ``OutOfMemoryError`` ("Out of memory
allocating ..."), a CUDA ``cudaErrorMemoryAllocation``, the Vulkan binding's
``VkErrorOutOfDeviceMemory`` (engine.backends.vulkan wraps it: "cannot allocate ... MiB ...
(VkErrorOutOfDeviceMemory)"), Python's ``MemoryError`` for host buffers. Raised inside the
engine while a candidate runs, they are that config's failure (a crash charged to it); a worker
killed from outside for memory is the agent's infrastructure case (agent.infra), not this one.
"""

from __future__ import annotations

MEMORY_WORDS = (
    "outofdevicememory",
    "out_of_device_memory",
    "outofhostmemory",
    "out_of_host_memory",
    "out of memory",
    "cudaerrormemoryallocation",
    "cuda_error_out_of_memory",
)


def exhausted_memory(e: BaseException) -> bool:
    """Whether ``e`` (or what it was raised from) is an allocation the device or host refused."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, MemoryError) or type(cur).__name__ == "OutOfMemoryError":
            return True
        text = f"{type(cur).__name__} {cur}".lower()
        if any(w in text for w in MEMORY_WORDS):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def crash_reason(e: BaseException, tb: str) -> str:
    """The recorded reason of a candidate that raised ``e``: one that exhausted memory says so
    first (the config's own footprint, not a fault of the node)."""
    what = f"{type(e).__name__}: {e}"
    if exhausted_memory(e):
        what = f"out of memory: this config exhausted the device's memory ({what})"
    return f"{what}\n{tb}"
