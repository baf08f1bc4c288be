#!/usr/bin/env bash
# Vulkan prefill / decode per kernel on the H200 (issue 14, helper vkspd), ~100 s. Carry .gl and
# .spv-cache (scripts/device_vulkan_env.sh). Writes under $OUT:
#   the resident and coopmat GEMMs' store_unrolled GPU tests (wave32 here; wave64 samples
#   skip) and rms_norm.fuse_add's, run while
#   the 1.5B synth is written; then scripts/vulkan_profile.py on 1.5B: GPU us per kernel and
#   dispatch grid per pass (prefill 512, decode per token), the prefill GEMMs' TFLOP/s, and each
#   pipeline's registers / local memory (--stats), for CONFIGS (vulkan_decode_speed.py names).
# Env: CONFIGS, TESTS_K (pytest -k of the GPU tests), TEST_TIMEOUT, END (seconds after the
# start at which the profile starts no new config), and the optional benches below.
T0=$(date +%s)
export MODELS=${MODELS-1.5b}
source scripts/device_vulkan_env.sh || exit $?
nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate,power.draw,clocks_throttle_reasons.active \
    --format=csv > "$OUT/smi_before.txt" 2>&1
K=${TESTS_K-(store_unrolled and (Q4_K or Q6_K or F16)) or fuse or bit_for_bit or fp16_form or kick}
timeout ${TEST_TIMEOUT:-40} python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    -m "gpu or not gpu" -k "$K" tests/test_vulkan_resident.py tests/test_vulkan_coopmat.py \
    tests/test_vulkan_fused_norm.py 2>&1 | tee "$OUT/pytest.log" | tail -6
echo "tests done at $(( $(date +%s) - T0 )) s"
wait_model 1.5b
C=${CONFIGS-default,res_su_fa_k64,res_su_epi_fa_k64,res_su_int8_fa_k64,fa_k64,res_su_fa,res_su}
timeout $(( T0 + ${END:-97} - $(date +%s) )) python3 scripts/vulkan_profile.py \
    --model /tmp/models/1.5b.gguf --grid --stats --gen-tokens 16 --repeats 2 --top 14 \
    $(for c in ${C//,/ }; do printf -- '--config %s ' "$c"; done) --out "$OUT" \
    --deadline $(( T0 + ${END:-97} - 12 )) 2>&1 | grep -v '%|' | tee "$OUT/profile_1.5b.log"
# Optional (a longer call): tg128 / pp512 benches and validate per model through
# scripts/vulkan_decode_speed.py (BENCH, VALIDATE: variant lists; BENCH_MODELS: presets, each in
# MODELS; END_BENCH: seconds after the start at which it stops).
for m in ${BENCH:+${BENCH_MODELS:-1.5b}}; do
  wait_model $m
  timeout $(( T0 + ${END_BENCH:-200} - $(date +%s) )) python3 scripts/vulkan_decode_speed.py \
      /tmp/models/$m.gguf --out "$OUT" --profile '' --bench "$BENCH" --validate "${VALIDATE-}" \
      --repeats ${REPEATS:-3} --deadline $(( T0 + ${END_BENCH:-200} - 5 )) 2>&1 | grep -v '%|' \
      | tee "$OUT/bench_$m.log"
done
nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate,power.draw,clocks_throttle_reasons.active \
    --format=csv > "$OUT/smi_after.txt" 2>&1
echo "done in $(( $(date +%s) - T0 )) s"
