#!/usr/bin/env bash
# Validate (the verifier: engine.validate on the 1.5B synth, teacher-forced logits against the
# per-token reference) of helper vk's Vulkan prefill configs on the H200 (issue 14); a Vulkan
# validate of the 1.5B needs >= 120 s, so this is apart from device_vk_shapes.sh (~250 s for
# two configs). SPIR-V and .gl as in device_vk_shapes.sh (.dev/vk-spv.txz or a .spv-cache
# rebuilt from branch vk). Env: CONFIGS (scripts/vulkan_decode_speed.py names), PRESET.
# Writes $OUT/vk/validate_$PRESET.log and vkdecode_$PRESET.json (PASS / FAIL, KLD, NMSE, blame).
T0=$(date +%s)
P=${PRESET:-1.5b}
export OUT=${OUT:-/tmp/out}/vk MODELS=$P
mkdir -p "$OUT"
if [ -f .dev/vk-spv.txz ]; then
  rm -rf .spv-cache; mkdir .spv-cache; tar xJf .dev/vk-spv.txz -C .spv-cache || exit 4
fi
source scripts/device_vulkan_env.sh || exit $?
wait_model "$P"
python3 scripts/vulkan_decode_speed.py /tmp/models/$P.gguf --profile "" --bench "" \
    --validate "${CONFIGS:-best,res_su_int8_fa_k64_fl_ms}" \
    --out "$OUT" 2>&1 | tee "$OUT/validate_$P.log" | grep validate
echo "done in $(( $(date +%s) - T0 )) s"
