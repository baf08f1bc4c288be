#!/usr/bin/env bash
# The GPU suites on the GPU machine (device tool `run`, carry [".whl", ".gl", ".spv-cache"]):
# CUDA (tests/test_cuda_ops.py, the shared op suite's cuda cases, tests/test_cuda_backend.py)
# and Vulkan through the NVIDIA driver, each file in its own process with device faults
# confined (scripts/gpu_suite.py). Prints both tallies; JSON under $OUT.
# usage: bash scripts/device_suites.sh [cuda] [vulkan]     (default: both)
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rc=0
for suite in ${@:-cuda vulkan}; do
  if [ "$suite" = vulkan ]; then
    MODELS="" source scripts/device_vulkan_env.sh || exit $?
  else
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
  fi
  python3 scripts/gpu_suite.py "$suite" --json > "$OUT/suite_$suite.json" 2> "$OUT/suite_$suite.log"
  [ $? = 0 ] || rc=1
  python3 - "$OUT/suite_$suite.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(d["suite"], "total", d["total"])
for f in d["files"]:
    print(" ", f["file"], {k: f[k] for k in ("passed", "failed", "errors", "skipped", "processes")})
    for x in f["faults"]:
        print("    fault:", x["test"], x["error"])
PY
  grep -E "^(FAILED|ERROR)" "$OUT/suite_$suite.log" | head -20
done
exit $rc
