#!/usr/bin/env bash
# The Vulkan backend's device run on the GPU machine through the NVIDIA driver's Vulkan.
# Carry: .gl (wheels in .gl/whl, Debian's libvulkan1 + libglvnd debs, libvulkan.so.1 in
# .gl/loader) and .spv-cache
# (SPIR-V compiled here by glslc: `python -m engine.backends.vulkan.spirv --out .spv-cache`).
# usage: bash scripts/device_vulkan.sh     (logs and JSON under $OUT)
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/vk --find-links .gl/whl \
    vulkan cffi pycparser gguf || exit 1
export PYTHONPATH=/tmp/vk:$PWD LD_LIBRARY_PATH=$PWD/.gl/loader:${LD_LIBRARY_PATH:-}
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export VK_ICD_FILENAMES=$VK_DRIVER_FILES FLEETTUNE_SPIRV_CACHE=$PWD/.spv-cache
export FLEETTUNE_GLSLC=/nonexistent
# The NVIDIA ICD (libGLX_nvidia) needs libglvnd; Debian's debs, unpacked (carried in .gl).
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
python3 -m engine devices | tee "$OUT/devices.txt"
grep -q "^vulkan  unavailable" "$OUT/devices.txt" && { ls /usr/local/nvidia/share/vulkan/icd.d/; \
  cat /usr/local/nvidia/share/vulkan/icd.d/*.json; VK_LOADER_DEBUG=error,warn python3 -m engine \
  devices 2>&1 | tail -20; exit 3; }
mkdir -p /tmp/models
for p in 1.5b 7b; do
  (python3 -m engine synth --preset $p --out /tmp/models/$p.gguf --json > "$OUT/synth_$p.log" 2>&1 &)
done
timeout ${TEST_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/test_backend_ops.py tests/test_vulkan_ops.py -k vulkan -m "not slow" 2>&1 \
    | tee "$OUT/pytest_vulkan.log" | tail -15
wait_model() { for i in $(seq 120); do grep -q '"path"' "$OUT/synth_$1.log" 2>/dev/null && return; sleep 1; done; }
B="python3 -m engine bench --backend vulkan --no-promoted --json"
for p in 7b 1.5b; do
  wait_model $p
  timeout 90 python3 -m engine validate --backend vulkan --no-promoted --steps 4 \
      --model /tmp/models/$p.gguf --json > "$OUT/validate_$p.json" 2>"$OUT/validate_$p.err"
  echo "validate $p rc=$?"
  timeout 120 $B --model /tmp/models/$p.gguf --prompt-tokens 105,512 --gen-tokens 128 \
      --repeats 2 > "$OUT/bench_${p}_batched.json" 2>"$OUT/bench_${p}_batched.err"
  echo "bench batched $p rc=$?"
  timeout 100 $B --model /tmp/models/$p.gguf --prompt-tokens 105,512 --gen-tokens 2 \
      --repeats 1 --prefill per_token > "$OUT/bench_${p}_pertoken.json" 2>"$OUT/bench_${p}_pertoken.err"
  echo "bench per_token $p rc=$?"
done
timeout ${SWEEP_TIMEOUT:-150} python3 -m engine.backends.vulkan.sweep --model /tmp/models/1.5b.gguf \
    --out "$OUT" --budget-s $(( ${SWEEP_TIMEOUT:-150} - 20 )) > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"
# The device tool returns at most 8 files: pack everything into one.
(cd "$OUT" && tar czf /tmp/vulkan_run.tgz ./* && rm -rf ./* && mv /tmp/vulkan_run.tgz .)
