"""Compute pipelines and descriptor sets.

Shader modules are cached per SPIR-V build, pipelines per (program, specialization constants,
required subgroup size): a new tile size is a new pipeline from the same SPIR-V. Descriptor sets
are cached per (binding count, buffer ids) and freed when one of their buffers is destroyed, so a
replayed command buffer keeps pointing at live sets.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.backends.vulkan._vk import ffi, vk
from engine.backends.vulkan.kernels import Program
from engine.backends.vulkan.spirv import build_key, compile_spirv
from engine.errors import KernelCompileError

if TYPE_CHECKING:
    from engine.backends.vulkan.device import Device
    from engine.backends.vulkan.memory import Buffer

log = logging.getLogger(__name__)

CAPTURE_STATISTICS = 0x40  # VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR
REQUIRE_FULL_SUBGROUPS = 0x2  # VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT
SETS_PER_POOL = 256


@dataclass(eq=False)
class Pipeline:
    id: int
    name: str  # for profiles: "matmul_decode.subgroup[Q4_K]"
    program: Program
    handle: Any
    layout: Any
    n_bindings: int
    push_struct: struct.Struct


def create_layout(device: Any, n_bindings: int, push_size: int) -> tuple[Any, Any]:
    """(descriptor set layout, pipeline layout) of a compute shader with n_bindings storage
    buffers and push_size bytes of push constants; the caller destroys both."""
    dsl = vk.vkCreateDescriptorSetLayout(
        device,
        vk.VkDescriptorSetLayoutCreateInfo(
            pBindings=[
                vk.VkDescriptorSetLayoutBinding(
                    binding=i,
                    descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                    descriptorCount=1,
                    stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT,
                )
                for i in range(n_bindings)
            ]
        ),
        None,
    )
    pl = vk.vkCreatePipelineLayout(
        device,
        vk.VkPipelineLayoutCreateInfo(
            pSetLayouts=[dsl],
            pPushConstantRanges=[
                vk.VkPushConstantRange(
                    stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=push_size
                )
            ],
        ),
        None,
    )
    return dsl, pl


def write_storage_set(device: Any, ds: Any, bufs: Sequence[Any], max_range: int | None) -> None:
    """Point binding i of the descriptor set ds at the whole of bufs[i] (a storage buffer with
    .handle and .size), its range clamped to max_range where one is given."""
    vk.vkUpdateDescriptorSets(
        device,
        len(bufs),
        [
            vk.VkWriteDescriptorSet(
                dstSet=ds,
                dstBinding=i,
                descriptorCount=1,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                pBufferInfo=[
                    vk.VkDescriptorBufferInfo(
                        buffer=b.handle,
                        offset=0,
                        range=b.size if max_range is None else min(b.size, max_range),
                    )
                ],
            )
            for i, b in enumerate(bufs)
        ],
        0,
        None,
    )


class Pipelines:
    def __init__(self, dev: Device) -> None:
        self.dev = dev
        self.modules: dict[tuple[str, tuple[str, ...], str], Any] = {}
        self.layouts: dict[tuple[int, int], tuple[Any, Any]] = {}  # (bindings, push) -> dsl, pl
        self.pipelines: dict[tuple[Any, ...], Pipeline] = {}
        self.pools: list[Any] = []
        self.pool_left = 0
        self.sets: dict[tuple[int, tuple[int, ...]], Any] = {}
        self.sets_of: dict[int, list[tuple[int, tuple[int, ...]]]] = {}  # buffer id -> set keys
        self.set_pool: dict[tuple[int, tuple[int, ...]], Any] = {}

    # --- pipelines ----------------------------------------------------------------------
    def _module(self, program: Program) -> Any:
        defines = program.defines
        # the sources' content is in the key, as in the SPIR-V cache: a module is never reused
        # for other sources (a FLEETTUNE_KERNEL_SOURCES overlay)
        key = (program.shader, defines, build_key(program.shader, defines))
        if key not in self.modules:
            code = compile_spirv(program.shader, defines)
            try:
                self.modules[key] = vk.vkCreateShaderModule(
                    self.dev.device,
                    vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code),
                    None,
                )
            except vk.VkError as e:
                raise KernelCompileError(
                    f"vulkan: {program.shader} {list(program.defines)}: vkCreateShaderModule "
                    f"failed ({type(e).__name__})"
                ) from None
        return self.modules[key]

    def _layout(self, n_bindings: int, push_size: int) -> tuple[Any, Any]:
        key = (n_bindings, push_size)
        if key not in self.layouts:
            self.layouts[key] = create_layout(self.dev.device, n_bindings, push_size)
        return self.layouts[key]

    def get(
        self,
        program: Program,
        spec: tuple[tuple[int, int], ...],
        name: str,
        subgroup_size: int = 0,
    ) -> Pipeline:
        """The pipeline of ``program`` with the specialization constants (constant_id, value)
        in spec; a constant not given keeps the shader's default."""
        key = (program, spec, subgroup_size)
        p = self.pipelines.get(key)
        if p is not None:
            return p
        module = self._module(program)
        _, layout = self._layout(program.n_bindings, program.push_size)
        data = struct.pack(f"<{len(spec)}I", *(v for _, v in spec))
        spec_info = vk.VkSpecializationInfo(
            pMapEntries=[
                vk.VkSpecializationMapEntry(constantID=cid, offset=4 * i, size=4)
                for i, (cid, _) in enumerate(spec)
            ],
            dataSize=len(data),
            pData=ffi.from_buffer(data),
        )
        pnext, flags = None, 0
        # FLEETTUNE_VK_STATS=1 (device.py): registers / local memory per pipeline, for profiles
        capture = CAPTURE_STATISTICS if self.dev.info.extra.get("pipeline_statistics") else 0
        if subgroup_size:
            if not self.dev.subgroup_control:
                raise KernelCompileError(
                    f"vulkan: {name}: subgroup_size={subgroup_size} needs "
                    "VK_EXT_subgroup_size_control, which this device lacks"
                )
            pnext = vk.VkPipelineShaderStageRequiredSubgroupSizeCreateInfo(
                requiredSubgroupSize=subgroup_size
            )
            if self.dev.full_subgroups:
                flags = REQUIRE_FULL_SUBGROUPS
        stage = vk.VkPipelineShaderStageCreateInfo(
            pNext=pnext,
            flags=flags,
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            module=module,
            pName="main",
            pSpecializationInfo=spec_info,
        )
        try:
            handle = vk.vkCreateComputePipelines(
                self.dev.device,
                vk.VK_NULL_HANDLE,
                1,
                [vk.VkComputePipelineCreateInfo(stage=stage, layout=layout, flags=capture)],
                None,
            )[0]
        except vk.VkError as e:
            raise KernelCompileError(
                f"vulkan: {name} {list(program.defines)} spec={dict(spec)} "
                f"subgroup_size={subgroup_size}: vkCreateComputePipelines failed "
                f"({type(e).__name__})"
            ) from None
        p = Pipeline(
            len(self.pipelines) + 1,
            name,
            program,
            handle,
            layout,
            program.n_bindings,
            struct.Struct("<" + program.push),
        )
        self.pipelines[key] = p
        log.debug("pipeline %s spec=%s sg=%s", name, dict(spec), subgroup_size)
        return p

    # --- descriptor sets ----------------------------------------------------------------
    def descriptor_set(self, n_bindings: int, bufs: tuple[Buffer, ...]) -> Any:
        key = (n_bindings, tuple(b.id for b in bufs))
        ds = self.sets.get(key)
        if ds is not None:
            return ds
        if self.pool_left == 0:
            pool = vk.vkCreateDescriptorPool(
                self.dev.device,
                vk.VkDescriptorPoolCreateInfo(
                    flags=vk.VK_DESCRIPTOR_POOL_CREATE_FREE_DESCRIPTOR_SET_BIT,
                    maxSets=SETS_PER_POOL,
                    pPoolSizes=[
                        vk.VkDescriptorPoolSize(
                            type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                            descriptorCount=SETS_PER_POOL * 5,
                        )
                    ],
                ),
                None,
            )
            self.pools.append(pool)
            self.pool_left = SETS_PER_POOL
        pool = self.pools[-1]
        dsl = next(v[0] for k, v in self.layouts.items() if k[0] == n_bindings)
        ds = vk.vkAllocateDescriptorSets(
            self.dev.device,
            vk.VkDescriptorSetAllocateInfo(descriptorPool=pool, pSetLayouts=[dsl]),
        )[0]
        self.pool_left -= 1
        write_storage_set(self.dev.device, ds, bufs, self.dev.max_range)
        self.sets[key] = ds
        self.set_pool[key] = pool
        for b in bufs:
            self.sets_of.setdefault(b.id, []).append(key)
        return ds

    def forget_buffer(self, buffer_id: int) -> None:
        """A buffer is being destroyed: free the descriptor sets that point at it."""
        for key in self.sets_of.pop(buffer_id, ()):
            ds = self.sets.pop(key, None)
            if ds is not None:
                pool = self.set_pool.pop(key)
                vk.vkFreeDescriptorSets(self.dev.device, pool, 1, [ds])

    def destroy(self) -> None:
        d = self.dev.device
        for p in self.pipelines.values():
            vk.vkDestroyPipeline(d, p.handle, None)
        for dsl, pl in self.layouts.values():
            vk.vkDestroyPipelineLayout(d, pl, None)
            vk.vkDestroyDescriptorSetLayout(d, dsl, None)
        for m in self.modules.values():
            vk.vkDestroyShaderModule(d, m, None)
        for pool in self.pools:
            vk.vkDestroyDescriptorPool(d, pool, None)
        self.pipelines, self.layouts, self.modules, self.pools = {}, {}, {}, []
        self.sets, self.sets_of, self.set_pool = {}, {}, {}


def executable_statistics(d: Any, pipeline: Any) -> dict[str, Any]:
    """The driver's statistics of a pipeline created with CAPTURE_STATISTICS (NVIDIA: register
    count, local memory = spills, shared memory), by executable; {} where not offered."""
    fp = vk.lib.vkGetDeviceProcAddr(d, b"vkGetPipelineExecutablePropertiesKHR")
    fs = vk.lib.vkGetDeviceProcAddr(d, b"vkGetPipelineExecutableStatisticsKHR")
    if fp == ffi.NULL or fs == ffi.NULL:
        return {}
    fprops = ffi.cast("PFN_vkGetPipelineExecutablePropertiesKHR", fp)
    fstats = ffi.cast("PFN_vkGetPipelineExecutableStatisticsKHR", fs)
    info = ffi.new("VkPipelineInfoKHR*")
    info.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR
    info.pipeline = pipeline
    n = ffi.new("uint32_t*")
    if fprops(d, info, n, ffi.NULL) != vk.VK_SUCCESS:
        return {}
    out: dict[str, Any] = {}
    for e in range(n[0]):
        ei = ffi.new("VkPipelineExecutableInfoKHR*")
        ei.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR
        ei.pipeline = pipeline
        ei.executableIndex = e
        m = ffi.new("uint32_t*")
        if fstats(d, ei, m, ffi.NULL) != vk.VK_SUCCESS or m[0] == 0:
            continue
        arr = ffi.new("VkPipelineExecutableStatisticKHR[]", m[0])
        for i in range(m[0]):
            arr[i].sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR
        fstats(d, ei, m, arr)
        for i in range(m[0]):
            st = arr[i]
            v = st.value
            fmt = int(st.format)  # 0 bool32, 1 int64, 2 uint64, 3 float64
            val = (bool(v.b32), int(v.i64), int(v.u64), float(v.f64))[min(fmt, 3)]
            name = ffi.string(st.name)
            name = name.decode() if isinstance(name, bytes) else str(name)
            out[f"{e}:{name}" if n[0] > 1 else name] = val
    return out
