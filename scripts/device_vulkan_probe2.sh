#!/usr/bin/env bash
# Vulkan on the H200, second call (issue 14), ~100 s: the BAR finding of the first call
# (device_vulkan_probe.sh: after one CPU read through a BAR mapping, GPU writes to that buffer
# ran at ~6 GB/s) checked head-on, then the engine with tensors in device-only memory (the new
# default on discrete GPUs) against FLEETTUNE_VK_REBAR=1 (the old placement): scripts/vulkan_probe.py
# bar / gemm / copy, then 1.5B pp512 + tg128 of the default and the tensor-core prefill configs
# (scripts/vulkan_decode_speed.py), the A/B, and 7B if its synth is ready. Carry .gl and
# .spv-cache. Results under $OUT.
T0=$(date +%s)
export MODELS=${MODELS-1.5b 7b}
source scripts/device_vulkan_env.sh || exit $?
O=$OUT
timeout ${PROBE_TIMEOUT:-40} python3 scripts/vulkan_probe.py --budget ${PROBE_BUDGET:-26} \
    --only info --only bar --only gemm --only lds --only copy --only timing --json "$O/probe.json" \
    2>&1 \
    | tee "$O/probe.log" | cut -c1-600
echo "probe rc=$? at $(( $(date +%s) - T0 )) s"
S="python3 scripts/vulkan_decode_speed.py --validate '' --sweep '' --repeats 1"
wait_model 1.5b
timeout $(( T0 + ${END_1P5B:-70} - $(date +%s) )) bash -c "$S /tmp/models/1.5b.gguf --out $O \
    --profile default --bench default,res,res_direct,res_halves,res_128t,res_mmvw_epi \
    --deadline $(( T0 + ${END_1P5B:-70} - 3 ))" 2>&1 | grep -v '%|' | tee "$O/speed_1.5b.log"
mkdir -p "$O/rebar"
FLEETTUNE_VK_REBAR=1 timeout $(( T0 + ${END_AB:-84} - $(date +%s) )) bash -c "$S \
    /tmp/models/1.5b.gguf --out $O/rebar --profile '' --bench default,res \
    --deadline $(( T0 + ${END_AB:-84} - 2 ))" 2>&1 | grep -v '%|' | tee "$O/speed_1.5b_rebar.log"
if grep -q '"path"' "$OUT/synth_7b.log" 2>/dev/null; then
  timeout $(( T0 + ${END:-99} - $(date +%s) )) bash -c "$S /tmp/models/7b.gguf --out $O \
      --profile '' --bench res,res_direct,default --deadline $(( T0 + ${END:-99} - 2 ))" 2>&1 \
      | grep -v '%|' | tee "$O/speed_7b.log"
else
  echo "7b synth not ready at $(( $(date +%s) - T0 )) s" | tee "$O/speed_7b.log"
fi
echo "done in $(( $(date +%s) - T0 )) s"
