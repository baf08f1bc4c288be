"""vulkan backend kernel declarations (filled in by the vulkan backend)."""
