"""The `vulkan` cffi binding, imported once with an actionable message when it is missing."""

from __future__ import annotations

try:
    import vulkan as vk  # noqa: F401
except OSError as e:  # the binding is installed but the loader (libvulkan.so.1) is not
    raise ImportError(
        f"the Vulkan loader is missing ({e}); install libvulkan1 and a driver "
        "(mesa-vulkan-drivers for lavapipe), or set LD_LIBRARY_PATH to an unpacked libvulkan"
    ) from None
except ImportError as e:
    raise ImportError(f"the `vulkan` Python binding is not installed ({e})") from None

ffi = vk.ffi
lib = vk.lib

__all__ = ["ffi", "lib", "vk"]
