"""The Vulkan backend (GLSL compute through the `vulkan` cffi binding; see docs/vulkan.md).

Imported lazily: ``engine.backends.vulkan.spirv`` and ``.kernels`` work on a machine without the
binding or a Vulkan loader (to precompile SPIR-V for a GPU node that has no glslc)."""

from __future__ import annotations

from typing import Any

__all__ = ["VulkanBackend"]


def __getattr__(name: str) -> Any:
    if name == "VulkanBackend":
        from engine.backends.vulkan.backend import VulkanBackend

        return VulkanBackend
    raise AttributeError(name)
