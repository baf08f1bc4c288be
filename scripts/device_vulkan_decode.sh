#!/usr/bin/env bash
# Vulkan decode (issue 14): the int8 / fused decode variants on the H200 through NVIDIA's Vulkan,
# within ~100 s. Carry .gl and .spv-cache (scripts/device_vulkan_env.sh). Writes under $OUT.
#   scripts/vulkan_decode_speed.py on 1.5B: GPU profile (kernels, dispatches per token) of the
#   default and mmvw_epi (every fusion), tg128 of default / mmvw_epi / mmvw_all / fuse_kv / fc,
#   validate mmvw_epi, a knob sweep; 7B if its synth is ready in time; then
#   tests/test_vulkan_mmvw.py (subgroup 32 here). Env: END_1P5B / END (seconds after start at
#   which the 1.5B / 7B parts stop), PROFILE, BENCH, VALIDATE, SWEEP (variant lists), MODELS.
T0=$(date +%s)
export MODELS=${MODELS-1.5b 7b}
source scripts/device_vulkan_env.sh || exit $?
S="python3 scripts/vulkan_decode_speed.py --out $OUT"
wait_model 1.5b
timeout $(( T0 + ${END_1P5B:-72} - $(date +%s) )) $S /tmp/models/1.5b.gguf \
    --profile "${PROFILE-default,mmvw_epi}" --bench "${BENCH-default,mmvw_epi,mmvw_all,fuse_kv,fc}" \
    --validate "${VALIDATE-mmvw_epi}" \
    --sweep "${SWEEP-mmvw,mmvw_fused,mmvw_all_s16,mmvw_u1,mmvw_u4,mmvw_bytes,mmvw_q8blk,mmvw_r1,mmvw_t16,mmvw_u4_r1,mmvw_r4_w8,mmvw_wg128_w8,mmvw_q8wg128,mmvw_t8_w16}" \
    --deadline $(( T0 + ${END_1P5B:-72} - 6 )) 2>&1 | grep -v '%|' | tee "$OUT/speed_1.5b.log"
if [[ " $MODELS " == *" 7b "* ]] && grep -q '"path"' "$OUT/synth_7b.log" 2>/dev/null; then
  timeout $(( T0 + ${END:-98} - $(date +%s) )) $S /tmp/models/7b.gguf --bench default,mmvw_epi \
      --validate "" --profile "" --repeats 1 --deadline $(( T0 + ${END:-98} - 8 )) 2>&1 \
      | grep -v '%|' | tee "$OUT/speed_7b.log"
else
  echo "7b synth not ready at $(( $(date +%s) - T0 )) s: skipped" | tee "$OUT/speed_7b.log"
fi
# the GPU op tests last (NVIDIA builds a pipeline per knob sample: tens of seconds)
timeout ${TEST_TIMEOUT:-30} python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/test_vulkan_mmvw.py 2>&1 | tee "$OUT/pytest_mmvw.log" | tail -6
echo "done in $(( $(date +%s) - T0 )) s"
