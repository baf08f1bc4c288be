"""A bare runner for Vulkan microbenchmarks (tools/vulkan_probe.py): buffers of a chosen memory
type, pipelines from the probe shaders, and command buffers timed three ways at once: GPU
timestamps around the whole batch (TOP_OF_PIPE then BOTTOM_OF_PIPE), per-dispatch timestamps
(BOTTOM_OF_PIPE pairs, as engine.backends.vulkan.stream records them), and the host's wall time
of submit + fence wait. Nothing here is used by the backend's ops.

``PROBE_BUILDS``: every (shader, defines) the probe compiles; ``python -m
engine.backends.vulkan.spirv`` precompiles them with the backend's builds, so a GPU machine
without a compiler finds them in the carried cache.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.backends.vulkan import coopmat
from engine.backends.vulkan._vk import ffi, vk
from engine.backends.vulkan.device import Device
from engine.backends.vulkan.pipelines import (
    create_layout,
    executable_statistics,
    write_storage_set,
)
from engine.backends.vulkan.probe_builds import (  # noqa: F401 - the probe's names
    GEMM_CONFIGS,
    LDS_ELEMS,
    MMA_NACC,
    MMA_SHAPES,
    PROBE_BUILDS,
    fixed_tile_defines,
    gemm_defines,
    mma_defines,
)
from engine.backends.vulkan.spirv import compile_spirv
from engine.backends.vulkan.stream import begin_commands, pool_and_fence


@dataclass
class Buf:
    handle: Any
    memory: Any
    size: int
    host: np.ndarray | None = None


@dataclass
class Timed:
    gpu_ms: float  # TOP_OF_PIPE before the first dispatch .. BOTTOM_OF_PIPE after the last
    per_dispatch_ms: list[float]  # BOTTOM_OF_PIPE pairs around each dispatch
    host_ms: float  # vkQueueSubmit until the fence wait returns


class Probe:
    def __init__(self, dev: Device) -> None:
        self.dev = dev
        d = dev.device
        self.pool, self.fence = pool_and_fence(dev)
        self.dpool = vk.vkCreateDescriptorPool(
            d,
            vk.VkDescriptorPoolCreateInfo(
                maxSets=256,
                pPoolSizes=[
                    vk.VkDescriptorPoolSize(
                        type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1024
                    )
                ],
            ),
            None,
        )
        self.objs: list[tuple[str, Any]] = []
        self.layouts: dict[tuple[int, int], tuple[Any, Any]] = {}

    def coopmat_order(self) -> list[str]:
        """The subgroup-scope shapes in the driver's enumeration order (llama.cpp takes the
        first fp16 one)."""
        fn_name = b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"
        ptr = vk.lib.vkGetInstanceProcAddr(self.dev.instance, fn_name)
        if ptr == ffi.NULL:
            return []
        fn = ffi.cast("PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", ptr)
        count = ffi.new("uint32_t*")
        if fn(self.dev.physical, count, ffi.NULL) != vk.VK_SUCCESS or count[0] == 0:
            return []
        props = ffi.new("VkCooperativeMatrixPropertiesKHR[]", count[0])
        for i in range(count[0]):
            props[i].sType = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
        fn(self.dev.physical, count, props)
        return [f"{coopmat.shape_name(props[i])}@scope{props[i].scope}" for i in range(count[0])]

    # --- memory ---------------------------------------------------------------------------
    def memory_types(self) -> list[tuple[int, int, int]]:
        """(index, property flags, heap size) of every memory type."""
        mp = vk.vkGetPhysicalDeviceMemoryProperties(self.dev.physical)
        return [
            (
                i,
                int(mp.memoryTypes[i].propertyFlags),
                int(mp.memoryHeaps[mp.memoryTypes[i].heapIndex].size),
            )
            for i in range(mp.memoryTypeCount)
        ]

    def buffer(self, size: int, type_index: int | None = None, host: bool = False) -> Buf:
        d = self.dev.device
        usage = (
            vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        )
        h = vk.vkCreateBuffer(d, vk.VkBufferCreateInfo(size=size, usage=usage), None)
        req = vk.vkGetBufferMemoryRequirements(d, h)
        if type_index is None:
            type_index = self.dev.mem.host if host else self.dev.mem.device
        if not req.memoryTypeBits & (1 << type_index):
            vk.vkDestroyBuffer(d, h, None)
            raise ValueError(f"memory type {type_index} cannot back a storage buffer")
        mem = vk.vkAllocateMemory(
            d, vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=type_index), None
        )
        vk.vkBindBufferMemory(d, h, mem, 0)
        b = Buf(h, mem, size)
        flags = dict((i, f) for i, f, _ in self.memory_types())[type_index]
        if flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT:
            mapped = vk.vkMapMemory(d, mem, 0, size, 0)
            b.host = np.frombuffer(mapped, dtype=np.uint8, count=size)
        self.objs.append(("buf", b))
        return b

    def upload(self, b: Buf, data: np.ndarray, via_map: bool = False) -> None:
        """Through a staging copy, or (via_map, b host-visible) by the CPU through b's
        mapping."""
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        if via_map and b.host is not None:
            b.host[: raw.size] = raw
            return
        st = self.buffer(raw.size, host=True)
        st.host[:] = raw
        self.run([("copy", st, b, raw.size)])
        self.free(st)

    def download(self, b: Buf, nbytes: int, via_map: bool = False) -> np.ndarray:
        if via_map and b.host is not None:
            return b.host[:nbytes].copy()
        st = self.buffer(nbytes, host=True)
        self.run([("copy", b, st, nbytes)])
        out = st.host[:nbytes].copy()
        self.free(st)
        return out

    def free(self, b: Buf) -> None:
        d = self.dev.device
        self.objs = [(k, o) for k, o in self.objs if o is not b]
        if b.host is not None:
            vk.vkUnmapMemory(d, b.memory)
            b.host = None
        vk.vkDestroyBuffer(d, b.handle, None)
        vk.vkFreeMemory(d, b.memory, None)

    # --- pipelines ------------------------------------------------------------------------
    def _layout(self, n: int, push: int) -> tuple[Any, Any]:
        if (n, push) not in self.layouts:
            self.layouts[(n, push)] = create_layout(self.dev.device, n, push)
        return self.layouts[(n, push)]

    def pipeline(
        self, shader: str, defines: tuple[str, ...], n_bind: int, push: int, spec: dict[int, int]
    ) -> tuple[Any, Any, Any, float]:
        """(pipeline, layout, set layout, seconds vkCreateComputePipelines took)."""
        d = self.dev.device
        code = compile_spirv(shader, defines)
        module = vk.vkCreateShaderModule(
            d, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None
        )
        dsl, layout = self._layout(n_bind, push)
        ids = sorted(spec)
        data = struct.pack(f"<{len(ids)}I", *(spec[i] for i in ids))
        info = vk.VkSpecializationInfo(
            pMapEntries=[
                vk.VkSpecializationMapEntry(constantID=c, offset=4 * j, size=4)
                for j, c in enumerate(ids)
            ],
            dataSize=len(data),
            pData=ffi.from_buffer(data),
        )
        stage = vk.VkPipelineShaderStageCreateInfo(
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            module=module,
            pName="main",
            pSpecializationInfo=info,
        )
        flags = self.capture_flag()
        t0 = time.perf_counter()
        p = vk.vkCreateComputePipelines(
            d,
            vk.VK_NULL_HANDLE,
            1,
            [vk.VkComputePipelineCreateInfo(flags=flags, stage=stage, layout=layout)],
            None,
        )[0]
        dt = time.perf_counter() - t0
        vk.vkDestroyShaderModule(d, module, None)
        self.objs.append(("pipe", p))
        return p, layout, dsl, dt

    def capture_flag(self) -> int:
        if self.dev.info.extra.get("pipeline_statistics"):
            return vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR
        return 0

    def statistics(self, pipeline: Any) -> dict[str, Any]:
        """The driver's statistics of the pipeline's executables (NVIDIA: registers, local
        memory / spills, shared memory...), where the device was opened with
        FLEETTUNE_VK_STATS=1 and offers them; {} otherwise."""
        if not self.capture_flag():
            return {}
        try:
            return self._statistics(pipeline)
        except Exception as e:  # noqa: BLE001 - a diagnostic must not end the section
            return {"error": f"{type(e).__name__}: {e}"[:200]}

    def _statistics(self, pipeline: Any) -> dict[str, Any]:
        return executable_statistics(self.dev.device, pipeline)

    def dset(self, dsl: Any, bufs: list[Buf]) -> Any:
        d = self.dev.device
        ds = vk.vkAllocateDescriptorSets(
            d, vk.VkDescriptorSetAllocateInfo(descriptorPool=self.dpool, pSetLayouts=[dsl])
        )[0]
        write_storage_set(d, ds, bufs, None)
        return ds

    # --- running --------------------------------------------------------------------------
    def run(
        self,
        items: list[tuple],
        barriers: bool = True,
        timestamps: bool = True,
        compute_only: bool = False,
    ) -> Timed:
        """Record, submit and wait for one command buffer of items: ("dispatch", pipeline,
        layout, dset, push bytes, (gx, gy, gz)), ("copy", src, dst, nbytes) or ("fill", dst,
        nbytes, 32-bit word). ``barriers``: a
        memory barrier between consecutive items (``compute_only``: its stages compute only)."""
        d = self.dev.device
        lib = vk.lib
        cmd = begin_commands(d, self.pool, vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT)
        nq = 2 + 2 * len(items)
        ts = timestamps and self.dev.timestamp_bits > 0
        qp = None
        if ts:
            qp = vk.vkCreateQueryPool(
                d,
                vk.VkQueryPoolCreateInfo(queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=nq),
                None,
            )
            vk.vkCmdResetQueryPool(cmd, qp, 0, nq)
        stages = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
        between = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT if compute_only else stages
        mb = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT
            | vk.VK_ACCESS_SHADER_WRITE_BIT
            | vk.VK_ACCESS_TRANSFER_READ_BIT
            | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
        )
        top = vk.VK_PIPELINE_STAGE_TOP_OF_PIPE_BIT
        bottom = vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT
        if qp is not None:
            lib.vkCmdWriteTimestamp(cmd, top, qp, 0)
        sets = ffi.new("VkDescriptorSet[1]")
        for j, it in enumerate(items):
            if j and barriers:  # the engine's (compute + transfer), or compute to compute
                vk.vkCmdPipelineBarrier(cmd, between, between, 0, 1, [mb], 0, None, 0, None)
            if qp is not None:
                lib.vkCmdWriteTimestamp(cmd, bottom, qp, 2 + 2 * j)
            if it[0] == "dispatch":
                _, p, layout, ds, push, groups = it
                lib.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p)
                sets[0] = ds
                lib.vkCmdBindDescriptorSets(
                    cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, layout, 0, 1, sets, 0, ffi.NULL
                )
                if push:
                    lib.vkCmdPushConstants(
                        cmd,
                        layout,
                        vk.VK_SHADER_STAGE_COMPUTE_BIT,
                        0,
                        len(push),
                        ffi.from_buffer(push),
                    )
                lib.vkCmdDispatch(cmd, *groups)
            elif it[0] == "fill":
                _, dst, nbytes, word = it
                lib.vkCmdFillBuffer(cmd, dst.handle, 0, nbytes, word)
            else:
                _, src, dst, nbytes = it
                region = ffi.new("VkBufferCopy*", {"srcOffset": 0, "dstOffset": 0, "size": nbytes})
                lib.vkCmdCopyBuffer(cmd, src.handle, dst.handle, 1, region)
            if qp is not None:
                lib.vkCmdWriteTimestamp(cmd, bottom, qp, 3 + 2 * j)
        if qp is not None:
            lib.vkCmdWriteTimestamp(cmd, bottom, qp, 1)
        host_mb = vk.VkMemoryBarrier(
            srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
            dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT,
        )
        vk.vkCmdPipelineBarrier(
            cmd, stages, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1, [host_mb], 0, None, 0, None
        )
        vk.vkEndCommandBuffer(cmd)
        vk.vkResetFences(d, 1, [self.fence])
        t0 = time.perf_counter()
        vk.vkQueueSubmit(self.dev.queue, 1, [vk.VkSubmitInfo(pCommandBuffers=[cmd])], self.fence)
        vk.vkWaitForFences(d, 1, [self.fence], vk.VK_TRUE, 600 * 10**9)
        host_ms = (time.perf_counter() - t0) * 1e3
        gpu_ms, per = float("nan"), []
        if qp is not None:
            data = ffi.new(f"uint64_t[{nq}]")
            vk.vkGetQueryPoolResults(
                d,
                qp,
                0,
                nq,
                8 * nq,
                data,
                8,
                vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT,
            )
            bits = self.dev.timestamp_bits
            mask = (1 << bits) - 1 if bits < 64 else (1 << 64) - 1
            tick = self.dev.timestamp_period * 1e-6
            gpu_ms = ((data[1] - data[0]) & mask) * tick
            per = [((data[3 + 2 * j] - data[2 + 2 * j]) & mask) * tick for j in range(len(items))]
            vk.vkDestroyQueryPool(d, qp, None)
        vk.vkFreeCommandBuffers(d, self.pool, 1, [cmd])
        return Timed(gpu_ms, per, host_ms)

    def destroy(self) -> None:
        d = self.dev.device
        vk.vkDeviceWaitIdle(d)
        for kind, o in reversed(self.objs):
            if kind == "pipe":
                vk.vkDestroyPipeline(d, o, None)
            else:
                if o.host is not None:
                    vk.vkUnmapMemory(d, o.memory)
                vk.vkDestroyBuffer(d, o.handle, None)
                vk.vkFreeMemory(d, o.memory, None)
        for dsl, pl in self.layouts.values():
            vk.vkDestroyPipelineLayout(d, pl, None)
            vk.vkDestroyDescriptorSetLayout(d, dsl, None)
        vk.vkDestroyDescriptorPool(d, self.dpool, None)
        vk.vkDestroyFence(d, self.fence, None)
        vk.vkDestroyCommandPool(d, self.pool, None)
