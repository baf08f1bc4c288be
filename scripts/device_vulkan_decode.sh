#!/usr/bin/env bash
# Vulkan decode (issue 14): the int8 / fused decode variants on the H200 through NVIDIA's Vulkan,
# within ~100 s. Carry .gl and .spv-cache (scripts/device_vulkan_env.sh). Writes under $OUT.
#   tests/test_vulkan_mmvw.py (subgroup 32 here), then scripts/vulkan_decode_speed.py on 1.5B:
#   tg128 default vs mmvw vs mmvw + fuse_kv (+ attention.fuse_combine: mmvw_all; + the RoPE
#   epilogue: mmvw_epi), validate, GPU profile, a knob sweep; 7B if its
#   synth is ready in time.
T0=$(date +%s)
export MODELS=${MODELS-1.5b 7b}
source scripts/device_vulkan_env.sh || exit $?
timeout ${TEST_TIMEOUT:-30} python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/test_vulkan_mmvw.py 2>&1 | tee "$OUT/pytest_mmvw.log" | tail -6
S="python3 scripts/vulkan_decode_speed.py --out $OUT"
wait_model 1.5b
timeout $(( T0 + ${END_1P5B:-72} - $(date +%s) )) $S /tmp/models/1.5b.gguf \
    --bench default,mmvw,mmvw_fused,mmvw_all,mmvw_epi --validate mmvw_epi \
    --profile default,mmvw_epi \
    --sweep ${SWEEP-mmvw_all_s16,mmvw_u1,mmvw_u4,mmvw_bytes,mmvw_q8blk,mmvw_r1,mmvw_t16,mmvw_u4_r1,mmvw_r4_w8,mmvw_wg128_w8,mmvw_q8wg128,mmvw_t8_w16,fuse_kv,fc} \
    --deadline $(( T0 + ${END_1P5B:-72} - 6 )) 2>&1 | grep -v '%|' | tee "$OUT/speed_1.5b.log"
if [[ " $MODELS " == *" 7b "* ]] && grep -q '"path"' "$OUT/synth_7b.log" 2>/dev/null; then
  timeout $(( T0 + ${END:-98} - $(date +%s) )) $S /tmp/models/7b.gguf --bench default,mmvw_epi \
      --validate "" --profile "" --repeats 1 --deadline $(( T0 + ${END:-98} - 8 )) 2>&1 \
      | grep -v '%|' | tee "$OUT/speed_7b.log"
else
  echo "7b synth not ready at $(( $(date +%s) - T0 )) s: skipped" | tee "$OUT/speed_7b.log"
fi
echo "done in $(( $(date +%s) - T0 )) s"
