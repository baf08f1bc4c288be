"""VK_KHR_cooperative_matrix: what the device offers, and the features a cooperative-matrix
shader needs enabled at device creation.

A shader compiled from GL_KHR_cooperative_matrix GLSL (shaders/vulkan/matmul_coopmat.comp)
declares the CooperativeMatrixKHR, Float16 and VulkanMemoryModel capabilities, so the device must
enable ``cooperativeMatrix``, ``shaderFloat16`` and ``vulkanMemoryModel``. ``query`` reads them and
the subgroup-scope shapes of vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR; the registry's
constraint (engine.tuning.variants.vulkan) reads the result from DeviceInfo.extra:

    cooperative_matrix   True when the extension and all three features are present (enabled)
    coopmat_shapes       "MxNxK:A*B+C=R" per subgroup-scope shape, e.g. "16x16x16:f16*f16+f32=f32"

Lavapipe (Mesa 22) has no such extension: both stay False / empty and the variant is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.backends.vulkan._vk import ffi, vk

EXTENSION = "VK_KHR_cooperative_matrix"
_COMPONENT = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64", 7: "u8"}
_COMPONENT |= {8: "u16", 9: "u32", 10: "u64"}
SCOPE_SUBGROUP = 3  # VK_SCOPE_SUBGROUP_KHR


@dataclass
class CoopmatSupport:
    enabled: bool = False
    shapes: list[str] = field(default_factory=list)
    why: str = ""  # why not enabled ("" when enabled)
    _structs: list[Any] = field(default_factory=list)  # cffi structs alive until vkCreateDevice

    def extra(self) -> dict[str, Any]:
        return {"cooperative_matrix": self.enabled, "coopmat_shapes": list(self.shapes)}


def shape_name(p: Any) -> str:
    t = [_COMPONENT.get(int(x), str(int(x))) for x in (p.AType, p.BType, p.CType, p.ResultType)]
    return f"{p.MSize}x{p.NSize}x{p.KSize}:{t[0]}*{t[1]}+{t[2]}={t[3]}"


def _properties(instance: Any, physical: Any) -> list[str]:
    name = b"vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"
    ptr = vk.lib.vkGetInstanceProcAddr(instance, name)
    if ptr == ffi.NULL:
        return []
    fn = ffi.cast("PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR", ptr)
    count = ffi.new("uint32_t*")
    if fn(physical, count, ffi.NULL) != vk.VK_SUCCESS or count[0] == 0:
        return []
    props = ffi.new("VkCooperativeMatrixPropertiesKHR[]", count[0])
    for i in range(count[0]):  # each output struct needs its sType set
        props[i].sType = vk.VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR
    if fn(physical, count, props) != vk.VK_SUCCESS:
        return []
    return sorted(
        {shape_name(props[i]) for i in range(count[0]) if props[i].scope == SCOPE_SUBGROUP}
    )


def query(instance: Any, physical: Any, exts: set[str]) -> CoopmatSupport:
    """The device's cooperative-matrix support; when usable, the feature structs to chain into
    VkDeviceCreateInfo (``chain``)."""
    if EXTENSION not in exts:
        return CoopmatSupport(why=f"the device reports no {EXTENSION}")
    cm = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR
    )
    f16 = vk.VkPhysicalDeviceShaderFloat16Int8Features(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES, pNext=cm
    )
    mm = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES, pNext=f16
    )
    f2 = vk.VkPhysicalDeviceFeatures2(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, pNext=mm
    )
    vk.vkGetPhysicalDeviceFeatures2(physical, f2)
    missing = [
        n
        for n, ok in (
            ("cooperativeMatrix", cm.cooperativeMatrix),
            ("shaderFloat16", f16.shaderFloat16),
            ("vulkanMemoryModel", mm.vulkanMemoryModel),
        )
        if not ok
    ]
    shapes = _properties(instance, physical)
    if missing:
        return CoopmatSupport(shapes=shapes, why=f"the device lacks {', '.join(missing)}")
    return CoopmatSupport(enabled=True, shapes=shapes)


def chain(support: CoopmatSupport, pnext: Any) -> Any:
    """``pnext`` with the three features enabled in front of it (unchanged when unusable)."""
    if not support.enabled:
        return pnext
    cm = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR,
        pNext=pnext,
        cooperativeMatrix=vk.VK_TRUE,
    )
    f16 = vk.VkPhysicalDeviceShaderFloat16Int8Features(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_FLOAT16_INT8_FEATURES,
        pNext=cm,
        shaderFloat16=vk.VK_TRUE,
    )
    mm = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(
        sType=vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES,
        pNext=f16,
        vulkanMemoryModel=vk.VK_TRUE,
    )
    support._structs += [cm, f16, mm]
    return mm
