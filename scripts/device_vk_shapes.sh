#!/usr/bin/env bash
# Vulkan prefill per shape on the H200 (issue 14, helper vk), ~100 s: split_k per shape
# (matmul_prefill.split_groups, fill_groups 32), flash attention's keys over ranges
# (attention.key_chunk), prefill pieces queued ahead (submit.prefill_ahead), the norm and SwiGLU
# storing the GEMMs' fp16 input (matmul_prefill.fuse_x16). SPIR-V: built from branch vk, carried as .dev/vk-spv.txz (unpacked over
# .spv-cache here) or .spv-cache rebuilt from THIS branch:
#   python -m engine.backends.vulkan.spirv --out .spv-cache
# (main's cache lacks attention_flash's KEY_SPLIT builds). Carry .gl as the other Vulkan scripts.
# Writes under $OUT/vk:
#   pytest.log         GPU tests: flash key split (+ its planted bug), split_groups on either
#                      tile size (+ planted bug), validate of the tiny model with both (cfg13),
#                      prefill_ahead against one submission (+ planted bug), fuse_x16 against
#                      the x16 pass and NumPy (+ planted bug)
#   profile_1.5b.log / profile_7b.log (+ .json): scripts/vulkan_profile.py, prefill 512 wall
#                      and GPU us per kernel and grid, per config (vulkan_decode_speed.py names;
#                      the first config of a run pays the warm-up: it is repeated last)
#   gemm_1.5b.log      scripts/vulkan_resident_bench.py on the 1.5B shapes per tiling
#   bench_1.5b.log     pp512 / tg128 as engine bench measures them (vulkan_decode_speed.py)
# Env: CONFIGS15, CONFIGS7, TEST_TIMEOUT.
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}/vk MODELS=${MODELS-1.5b 7b}
mkdir -p "$OUT"
if [ -f .dev/vk-spv.txz ]; then
  rm -rf .spv-cache; mkdir .spv-cache; tar xJf .dev/vk-spv.txz -C .spv-cache || exit 4
fi
source scripts/device_vulkan_env.sh || exit $?
left() { echo $(( T0 + $1 - $(date +%s) )); }
cfgs() { for c in ${1//,/ }; do printf -- '--config %s ' "$c"; done; }
timeout ${TEST_TIMEOUT:-40} python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    -m "gpu or not gpu" -k "key_split or planted or split_groups or cfg13 or ahead or x16" \
    tests/test_vulkan_flash.py tests/test_vulkan_resident_split.py tests/test_vulkan_model.py \
    tests/test_vulkan_stream_ahead.py tests/test_vulkan_fuse_x16.py \
    2>&1 | tee "$OUT/pytest.log" | tail -8
echo "tests done at $(( $(date +%s) - T0 )) s"
wait_model 1.5b
B=res_su_int8_fa_k64_fl_ms
F=fl_ms_f32_sg128
C=${CONFIGS15-$B,fl_ms_f32,$F,fl_ms_f32_sg256,fl_ms_kc128,fl_ms_ah32,fl_ms_x16,${F}_kc128,${F}_kc64,${F}_kc256,${F}_kc128_ah32,${F}_kc128_ah16,${F}_kc128_x16,${F}_kc128_ah32_x16,$B}
timeout $(left 62) python3 scripts/vulkan_profile.py --model /tmp/models/1.5b.gguf --grid \
    --gen-tokens 4 --repeats 3 --top 12 $(cfgs "$C") --out "$OUT/p15" \
    --deadline $(( T0 + 57 )) 2>&1 | grep -v '%|' | tee "$OUT/profile_1.5b.log" \
    | grep -E "^== .* prefill"
echo "1.5b profile done at $(( $(date +%s) - T0 )) s"
timeout $(left 69) python3 scripts/vulkan_resident_bench.py --shapes 1.5b --repeats 3 \
    --only resident --only res-fill32 --only res-fill32-sg96-sk4 --only res-fill32-sg128-sk4 \
    --only res-fill32-sg256-sk4 --only res-fill32-sg256-sk3 2>&1 | tee "$OUT/gemm_1.5b.log" \
    | grep -v "Register"
wait_model 7b
C=${CONFIGS7-$B,fl_ms_f64,$F,${F}_kc128,${F}_kc256,${F}_kc128_ah32,${F}_kc128_ah32_x16,$B}
timeout $(left 90) python3 scripts/vulkan_profile.py --model /tmp/models/7b.gguf --grid \
    --gen-tokens 4 --repeats 2 --top 12 $(cfgs "$C") --out "$OUT/p7" \
    --deadline $(( T0 + 84 )) 2>&1 | grep -v '%|' | tee "$OUT/profile_7b.log" \
    | grep -E "^== .* prefill"
echo "7b profile done at $(( $(date +%s) - T0 )) s"
timeout $(left 99) python3 scripts/vulkan_decode_speed.py /tmp/models/1.5b.gguf --profile "" \
    --validate "" --bench ${F}_kc128_ah32_x16,${F}_kc128_ah32,$B --out "$OUT" \
    --deadline $(( T0 + 97 )) \
    2>&1 | tee "$OUT/bench_1.5b.log" | grep bench
echo "done in $(( $(date +%s) - T0 )) s"
