#!/usr/bin/env bash
# Vulkan 7B prefill on the H200 (issue 14, helper vk), ~100 s. Carry .gl and .spv-cache (rebuilt
# with `python -m engine.backends.vulkan.spirv --out .spv-cache`; scripts/device_vulkan_env.sh).
# Writes under $OUT/vk:
#   pytest.log    the GPU tests of attention.flash, matmul_prefill.prefetch and split_k (wave32),
#                 validate of the tiny model with all three (test_vulkan_model cfg9)
#   profile_7b.log / vulkan_profile.json   scripts/vulkan_profile.py on the 7B synth: prefill 512
#                 and decode wall, GPU us per kernel and grid, the GEMMs' TFLOP/s, registers and
#                 local memory per pipeline (--stats), for CONFIGS (vulkan_decode_speed.py names)
#   gemm_7b.log   scripts/vulkan_resident_bench.py: the resident GEMM alone on the 7B shapes per
#                 tiling (GEMMS), until END
# Env: CONFIGS, GEMMS, TEST_TIMEOUT, PROFILE_END and END (seconds after the start).
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}/vk MODELS=${MODELS-7b}
mkdir -p "$OUT"
source scripts/device_vulkan_env.sh || exit $?
nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate,power.draw,clocks_throttle_reasons.active \
    --format=csv > "$OUT/smi_before.txt" 2>&1
timeout ${TEST_TIMEOUT:-30} python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    -m "gpu or not gpu" -k "flash_attention or prefetch or split_k or cfg9" tests/test_vulkan_flash.py \
    tests/test_vulkan_resident.py tests/test_vulkan_model.py 2>&1 | tee "$OUT/pytest.log" | tail -8
echo "tests done at $(( $(date +%s) - T0 )) s"
wait_model 7b
C=${CONFIGS-res_su_int8_fa_k64_fl,res_su_int8_fa_k64_fl_ms,res_su_int8_fa_k64_fl_sk4,res_su_int8_fa_k64_fl_ms_sk4}
timeout $(( T0 + ${PROFILE_END:-74} - $(date +%s) )) python3 scripts/vulkan_profile.py \
    --model /tmp/models/7b.gguf --grid --stats --gen-tokens 8 --repeats 2 --top 18 \
    $(for c in ${C//,/ }; do printf -- '--config %s ' "$c"; done) --out "$OUT" \
    --deadline $(( T0 + ${PROFILE_END:-74} - 14 )) 2>&1 | grep -v '%|' | tee "$OUT/profile_7b.log"
echo "profile done at $(( $(date +%s) - T0 )) s"
G=${GEMMS-resident,res-fill64,res-fill64-sk4,res-sk4,res-bk16-fill64-sk4,res-pf2-bk16,resident-fill0,res-128t}
timeout $(( T0 + ${END:-97} - $(date +%s) )) python3 scripts/vulkan_resident_bench.py \
    --repeats 3 --stats $(for c in ${G//,/ }; do printf -- '--only %s ' "$c"; done) 2>&1 \
    | tee "$OUT/gemm_7b.log"
nvidia-smi --query-gpu=clocks.sm,clocks.mem,pstate,power.draw,clocks_throttle_reasons.active \
    --format=csv > "$OUT/smi_after.txt" 2>&1
echo "done in $(( $(date +%s) - T0 )) s"
