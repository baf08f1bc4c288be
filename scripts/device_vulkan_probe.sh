#!/usr/bin/env bash
# Why Vulkan is slow on the H200 (issue 14): scripts/vulkan_probe.py (timing method, clocks,
# pure cooperative-matrix MMA, shared-fed MMA, the resident GEMM with spec vs fixed tiles, copy
# bandwidth per memory type), then the 1.5B decode profile (dispatches, barriers, submits per
# token). ~100 s. Carry .gl and .spv-cache (python -m engine.backends.vulkan.spirv --out
# .spv-cache, which includes the probe builds). Results under $OUT/vkh/.
T0=$(date +%s)
export MODELS=${MODELS-1.5b}
source scripts/device_vulkan_env.sh || exit $?
O=$OUT/vkh; mkdir -p "$O"
nvidia-smi -q -d CLOCK,PERFORMANCE 2>&1 | head -60 > "$O/smi_before.txt"
grep -iE "^\s+(SM|Memory|Graphics)\s+:|Idle|Active|Throttle|Slowdown|Power Cap" "$O/smi_before.txt" | head -20
timeout ${PROBE_TIMEOUT:-66} python3 scripts/vulkan_probe.py --budget ${PROBE_BUDGET:-52} \
    --json "$O/probe.json" 2>&1 | tee "$O/probe.log" | cut -c1-600
echo "probe rc=$? at $(( $(date +%s) - T0 )) s"
nvidia-smi -q -d CLOCK,PERFORMANCE 2>&1 | head -60 > "$O/smi_after.txt"
wait_model 1.5b
left=$(( T0 + ${END:-97} - $(date +%s) ))
if (( left > 12 )); then
  timeout $left python3 scripts/vulkan_decode_speed.py /tmp/models/1.5b.gguf --out "$O" \
      --profile default --bench "" --validate "" --sweep "" --repeats 1 \
      --deadline $(( T0 + ${END:-97} - 3 )) 2>&1 | grep -v '%|' | tail -40 | tee "$O/decode.log"
else
  echo "decode profile skipped: $left s left" | tee "$O/decode.log"
fi
echo "done in $(( $(date +%s) - T0 )) s"
