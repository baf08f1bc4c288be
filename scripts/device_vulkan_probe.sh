#!/usr/bin/env bash
# Why Vulkan is slow on the H200 (issue 14), ~100 s: scripts/vulkan_probe.py (timing method,
# clocks, pure cooperative-matrix MMA, shared-fed MMA, the resident GEMM at knob samples with
# spec vs compile-time tiles, copy bandwidth per memory type), the resident GEMM's GPU tests for
# the new knobs (threads, bk 16), then the 1.5B decode profile (GPU time per kernel against the
# wall per token: what barriers and submits cost). Carry .gl and .spv-cache (python -m
# engine.backends.vulkan.spirv --out .spv-cache, which includes the probe builds). Results
# under $OUT.
T0=$(date +%s)
export MODELS=${MODELS-1.5b}
source scripts/device_vulkan_env.sh || exit $?
O=$OUT
nvidia-smi -q -d CLOCK,PERFORMANCE 2>&1 | head -70 > "$O/smi_before.txt"
grep -iE "^\s+(SM|Memory|Graphics)\s+:|Idle|Active|Slowdown|Power Cap|Performance State" \
    "$O/smi_before.txt" | head -24
timeout ${PROBE_TIMEOUT:-50} python3 scripts/vulkan_probe.py --budget ${PROBE_BUDGET:-36} \
    --json "$O/probe.json" 2>&1 | tee "$O/probe.log" | cut -c1-700
echo "probe rc=$? at $(( $(date +%s) - T0 )) s"
nvidia-smi -q -d CLOCK,PERFORMANCE 2>&1 | head -70 > "$O/smi_after.txt"
timeout ${TEST_TIMEOUT:-18} python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu \
    tests/test_vulkan_resident.py -k "knobs and (threads or bk16 or mma_n) and (Q4_K or F16)" \
    > "$O/pytest_resident.log" 2>&1
echo "pytest resident rc=$? at $(( $(date +%s) - T0 )) s"; tail -4 "$O/pytest_resident.log"
# the tiled vec4 m128 build hung NVIDIA's compiler past 90 s (early call): now unrolled 8 k-slices
# at a time above the 4 x 4 register block
timeout ${VEC4_TIMEOUT:-15} python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short \
    tests/test_vulkan_ops.py -k "matmul_prefill_variants and tiled-vec4-m128" \
    > "$O/pytest_vec4_m128.log" 2>&1
echo "pytest tiled-vec4-m128 rc=$? at $(( $(date +%s) - T0 )) s"; tail -2 "$O/pytest_vec4_m128.log"
wait_model 1.5b
left=$(( T0 + ${END:-97} - $(date +%s) ))
if (( left > 12 )); then
  timeout $left python3 scripts/vulkan_decode_speed.py /tmp/models/1.5b.gguf --out "$O" \
      --profile default --bench default --validate "" --sweep "" --repeats 1 \
      --deadline $(( T0 + ${END:-97} - 3 )) 2>&1 | grep -v '%|' | tail -40 | tee "$O/decode.log"
else
  echo "decode profile skipped: $left s left" | tee "$O/decode.log"
fi
# pp512 with the resident GEMM at llama.cpp's coopmat shape, if time is left
printf 'backend = "vulkan"\n[ops.matmul_prefill]\nvariant = "resident"\nthreads = 128\nwarp_n = 64\n[ops.attention]\nvariant = "coopmat"\n' > /tmp/vkh_res.toml
left=$(( T0 + ${END:-99} - $(date +%s) ))
if (( left > 10 )); then
  timeout $left python3 -m engine bench --backend vulkan --no-promoted --json \
      --model /tmp/models/1.5b.gguf --config /tmp/vkh_res.toml --prompt-tokens 512 \
      --gen-tokens 1 --repeats 2 > "$O/bench_res128.json" 2> "$O/bench_res128.err"
  echo "bench resident-128t rc=$?"; python3 -c "import json
r = json.load(open('$O/bench_res128.json'))['results'][0]; print('pp512', r['prefill_tok_s'])"
fi
echo "done in $(( $(date +%s) - T0 )) s"
