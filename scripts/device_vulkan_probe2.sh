#!/usr/bin/env bash
# Vulkan on the H200, second call (issue 14), ~100 s: the BAR finding of the first call
# (device_vulkan_probe.sh: after one CPU read through a BAR mapping, GPU writes to that buffer
# ran at ~6 GB/s) checked head-on, then the engine with tensors in device-only memory (the new
# default on discrete GPUs) against FLEETTUNE_VK_REBAR=1 (the old placement): scripts/vulkan_probe.py
# bar / gemm / copy, then 1.5B pp512 + tg128 of the default and the tensor-core prefill configs
# (scripts/vulkan_decode_speed.py), the A/B, and 7B if its synth is ready. Carry .gl and
# .spv-cache. Results under $OUT.
T0=$(date +%s)
export MODELS=${MODELS-1.5b}  # "1.5b 7b" with END=200 in a longer call: 7B res_direct vs default
source scripts/device_vulkan_env.sh || exit $?
O=$OUT
timeout ${PROBE_TIMEOUT:-32} python3 scripts/vulkan_probe.py --budget ${PROBE_BUDGET:-18} \
    --only info --only bar --only gemm --only lds --only copy --only timing --json "$O/probe.json" \
    2>&1 \
    | tee "$O/probe.log" | cut -c1-600
echo "probe rc=$? at $(( $(date +%s) - T0 )) s"
S="python3 scripts/vulkan_decode_speed.py --validate '' --sweep '' --repeats 1"
wait_model 1.5b
timeout $(( T0 + ${END_1P5B:-78} - $(date +%s) )) bash -c "$S /tmp/models/1.5b.gguf --out $O \
    --profile default --bench default,res,res_direct,res_halves,res_mmvw_epi,res_128t \
    --deadline $(( T0 + ${END_1P5B:-78} - 3 ))" 2>&1 | grep -v '%|' | tee "$O/speed_1.5b.log"
mkdir -p "$O/rebar"
FLEETTUNE_VK_REBAR=1 timeout $(( T0 + ${END_AB:-97} - $(date +%s) )) bash -c "$S \
    /tmp/models/1.5b.gguf --out $O/rebar --profile '' --bench default,res \
    --deadline $(( T0 + ${END_AB:-97} - 2 ))" 2>&1 | grep -v '%|' | tee "$O/speed_1.5b_rebar.log"
left=$(( T0 + ${END:-99} - $(date +%s) ))
if (( left > 40 )) && grep -q '"path"' "$OUT/synth_7b.log" 2>/dev/null; then
  timeout $left bash -c "$S /tmp/models/7b.gguf --out $O --profile '' --bench res_direct,default \
      --deadline $(( T0 + ${END:-99} - 2 ))" 2>&1 | grep -v '%|' | tee "$O/speed_7b.log"
else
  echo "7b skipped: $left s left" | tee "$O/speed_7b.log"
fi
echo "done in $(( $(date +%s) - T0 )) s"
