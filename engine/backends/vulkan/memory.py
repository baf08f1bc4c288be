"""Device buffers: one VkBuffer + VkDeviceMemory each, pooled by size class.

Activations are allocated per op and dropped by Python's refcounting; a dropped buffer goes back
to its size-class free list and is handed to the next op of that size. That keeps the number of
allocations bounded (drivers cap it near 4096). The free list hands out the lowest buffer id
first (not LIFO): then which buffer an op gets depends only on the set of free buffers, not on
the order Python happened to drop them, so decode steps settle into a short cycle of identical
graphs whose command buffers are replayed. Reuse inside one
recording is safe because the stream's hazard tracking works on buffer ids: writing a buffer that
an earlier, not yet barriered dispatch reads puts a barrier in between.

Every buffer has an ``id`` that is never reused (Vulkan handles can be): descriptor sets and
recorded command buffers are keyed by it.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from engine.backends.vulkan._vk import ffi, vk
from engine.errors import EngineError

if TYPE_CHECKING:
    from engine.backends.vulkan.device import Device

_ids = itertools.count(1)

USAGE = (
    vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
    | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
    | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
)


def size_class(n: int) -> int:
    """Round up to 256 B, then to one of 4 steps per power of two (<= 25% waste)."""
    n = max(256, (n + 255) & ~255)
    top = 1 << (n - 1).bit_length()
    step = top // 8  # steps at 5/8, 6/8, 7/8, 8/8 of top
    return min(top, ((n + step - 1) // step) * step)


class Buffer:
    """A storage buffer owned by the Allocator. ``host`` is a uint8 NumPy view of its memory
    when host-visible. Users hold a Lease, never the Buffer alone."""

    __slots__ = ("id", "handle", "memory", "size", "host", "host_visible", "near", "epoch")

    def __init__(self, dev: Device, size: int, host_visible: bool, near: bool = False) -> None:
        self.id = next(_ids)
        self.size = size
        self.host_visible = host_visible
        self.near = near and host_visible and dev.mem.near is not None
        self.epoch = -1  # last recording that used it (see Stream)
        self.handle = vk.vkCreateBuffer(
            dev.device,
            vk.VkBufferCreateInfo(size=size, usage=USAGE, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE),
            None,
        )
        req = vk.vkGetBufferMemoryRequirements(dev.device, self.handle)
        type_index = dev.mem.device
        if host_visible:
            type_index = dev.mem.near if self.near else dev.mem.host
        if not req.memoryTypeBits & (1 << type_index):
            vk.vkDestroyBuffer(dev.device, self.handle, None)
            raise EngineError(f"vulkan: memory type {type_index} cannot back a storage buffer")
        try:
            self.memory = vk.vkAllocateMemory(
                dev.device,
                vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=type_index),
                None,
            )
        except vk.VkError as e:
            vk.vkDestroyBuffer(dev.device, self.handle, None)
            raise EngineError(
                f"vulkan: cannot allocate {size / 2**20:.1f} MiB on {dev.info.name} "
                f"({type(e).__name__})"
            ) from None
        vk.vkBindBufferMemory(dev.device, self.handle, self.memory, 0)
        self.host = None
        if host_visible or dev.mem.unified:
            mapped = vk.vkMapMemory(dev.device, self.memory, 0, size, 0)
            self.host = np.frombuffer(mapped, dtype=np.uint8, count=size)


class Lease:
    """A user's hold on a Buffer: when the last reference goes, a pooled buffer returns to its
    free list and any other buffer is destroyed. (A separate object because CPython finalizes an
    object once: a Buffer resurrected into a free list would never be finalized again.)"""

    __slots__ = ("buf", "_alloc", "pooled", "__weakref__")

    def __init__(self, alloc: Allocator, buf: Buffer, pooled: bool) -> None:
        self.buf = buf
        self._alloc = alloc
        self.pooled = pooled

    def __del__(self) -> None:
        alloc = self._alloc
        if alloc is None or alloc.closed:
            return
        if self.pooled:
            alloc.release(self.buf)
        else:
            alloc.destroy(self.buf)


class Allocator:
    def __init__(self, dev: Device) -> None:
        self.dev = dev
        self.closed = False
        self.free: dict[tuple[int, bool, bool], list[tuple[int, Buffer]]] = {}  # heaps by id
        self.all: dict[int, Buffer] = {}
        self.bytes_allocated = 0
        self.on_destroy: list[Any] = []  # callbacks(buffer): caches keyed by buffer ids
        self.capture: list[Lease] | None = None  # while set, every new lease is also kept here

    def new(
        self, nbytes: int, host_visible: bool = False, pooled: bool = True, near: bool = False
    ) -> Lease:
        """A buffer of at least nbytes: device memory, or host-visible memory (staging and
        downloads; ``near``: device-local host-visible where the device has it, for small
        buffers the CPU writes and the GPU reads every submit)."""
        size = size_class(nbytes) if pooled else max(256, (nbytes + 255) & ~255)
        near = near and host_visible and self.dev.mem.near is not None
        if pooled:
            heap = self.free.get((size, host_visible, near))
            if heap:
                return self._hand_out(Lease(self, heapq.heappop(heap)[1], True))
        try:
            b = Buffer(self.dev, size, host_visible, near)
        except EngineError:
            self.trim()  # give pooled memory back, then try once more
            b = Buffer(self.dev, size, host_visible, near)
        self.bytes_allocated += size
        self.all[b.id] = b
        return self._hand_out(Lease(self, b, pooled))

    def _hand_out(self, lease: Lease) -> Lease:
        if self.capture is not None and lease.pooled:  # unpooled ones have their own owners
            self.capture.append(lease)
        return lease

    def release(self, b: Buffer) -> None:
        heapq.heappush(self.free.setdefault((b.size, b.host_visible, b.near), []), (b.id, b))

    def destroy(self, b: Buffer) -> None:
        if self.all.pop(b.id, None) is None:
            return
        for cb in self.on_destroy:
            cb(b)
        self.bytes_allocated -= b.size
        b.host = None
        vk.vkDestroyBuffer(self.dev.device, b.handle, None)
        vk.vkFreeMemory(self.dev.device, b.memory, None)

    def trim(self) -> None:
        """Free every pooled buffer nobody holds."""
        stacks, self.free = self.free, {}
        for heap in stacks.values():
            for _, b in heap:
                self.destroy(b)

    def close(self) -> None:
        self.free = {}
        for b in list(self.all.values()):
            self.destroy(b)
        self.closed = True


def write_host(b: Buffer, offset: int, data: np.ndarray) -> None:
    raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    b.host[offset : offset + raw.size] = raw


def read_host(b: Buffer, offset: int, nbytes: int) -> np.ndarray:
    return b.host[offset : offset + nbytes].copy()


__all__ = ["Allocator", "Buffer", "Lease", "ffi", "read_host", "size_class", "write_host"]


BUDGET_EXT = "VK_EXT_memory_budget"


def driver_usage(physical: Any) -> tuple[int | None, str]:
    """The driver's figure of this process's use of the device-local heaps (VK_EXT_memory_budget's
    heapUsage), or (None, why not): lavapipe and older drivers do not report the extension."""
    names = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical, None)}
    if BUDGET_EXT not in names:
        return None, f"vulkan: the device reports no {BUDGET_EXT} (no driver figure)"
    budget = vk.VkPhysicalDeviceMemoryBudgetPropertiesEXT(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT
    )
    props = vk.VkPhysicalDeviceMemoryProperties2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2, pNext=budget
    )
    vk.vkGetPhysicalDeviceMemoryProperties2(physical, props)
    mp = props.memoryProperties
    local = vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT
    used = sum(
        int(budget.heapUsage[i])
        for i in range(mp.memoryHeapCount)
        if int(mp.memoryHeaps[i].flags) & local
    )
    return used, f"{BUDGET_EXT} heapUsage of the device-local heaps (this process)"
