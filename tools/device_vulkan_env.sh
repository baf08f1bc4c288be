#!/usr/bin/env bash
# Source me on the GPU machine: the Vulkan backend's runtime from what the call carried (.gl:
# wheels in .gl/whl, Debian's libvulkan1 + libglvnd debs, libvulkan.so.1 in .gl/loader;
# .spv-cache: SPIR-V compiled here by glslc, `python -m engine.backends.vulkan.spirv --out
# .spv-cache`), the NVIDIA ICD selected, and synthetic models started in the background
# (wait_model PRESET blocks until /tmp/models/PRESET.gguf is written).
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/vk --find-links .gl/whl \
    vulkan cffi pycparser gguf || exit 1
export PYTHONPATH=/tmp/vk:$PWD LD_LIBRARY_PATH=$PWD/.gl/loader:${LD_LIBRARY_PATH:-}
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export VK_ICD_FILENAMES=$VK_DRIVER_FILES FLEETTUNE_SPIRV_CACHE=$PWD/.spv-cache
export FLEETTUNE_GLSLC=/nonexistent FLEETTUNE_GLSLANG=/nonexistent  # carried SPIR-V only
# The NVIDIA ICD (libGLX_nvidia) needs libglvnd; Debian's debs, unpacked (carried in .gl).
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
python3 -m engine devices | tee "$OUT/devices.txt"
grep -q "^vulkan  unavailable" "$OUT/devices.txt" && { ls /usr/local/nvidia/share/vulkan/icd.d/; \
  cat /usr/local/nvidia/share/vulkan/icd.d/*.json; VK_LOADER_DEBUG=error,warn python3 -m engine \
  devices 2>&1 | tail -20; exit 3; }
mkdir -p /tmp/models
for p in ${MODELS-1.5b 7b}; do
  (python3 -m engine synth --preset $p --out /tmp/models/$p.gguf --json > "$OUT/synth_$p.log" 2>&1 &)
done
wait_model() { for i in $(seq 180); do grep -q '"path"' "$OUT/synth_$1.log" 2>/dev/null && return; sleep 1; done; }
