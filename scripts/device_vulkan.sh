#!/usr/bin/env bash
# The Vulkan backend's device run on the GPU machine through the NVIDIA driver's Vulkan.
# Carry .gl and .spv-cache (see scripts/device_vulkan_env.sh).
# usage: bash scripts/device_vulkan.sh     (logs and JSON under $OUT)
source scripts/device_vulkan_env.sh || exit $?
timeout ${TEST_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/test_backend_ops.py tests/test_vulkan_ops.py -k vulkan -m "not slow" 2>&1 \
    | tee "$OUT/pytest_vulkan.log" | tail -15
B="python3 -m engine bench --backend vulkan --no-promoted --json"
for p in 7b 1.5b; do
  wait_model $p
  timeout 90 python3 -m engine validate --backend vulkan --no-promoted --steps 4 \
      --model /tmp/models/$p.gguf --json > "$OUT/validate_$p.json" 2>"$OUT/validate_$p.err"
  echo "validate $p rc=$?"
  timeout 120 $B --model /tmp/models/$p.gguf --prompt-tokens 105,512 --gen-tokens 128 \
      --repeats 2 > "$OUT/bench_${p}_batched.json" 2>"$OUT/bench_${p}_batched.err"
  echo "bench batched $p rc=$?"
  timeout 100 $B --model /tmp/models/$p.gguf --prompt-tokens 105,512 --gen-tokens 2 \
      --repeats 1 --prefill per_token > "$OUT/bench_${p}_pertoken.json" 2>"$OUT/bench_${p}_pertoken.err"
  echo "bench per_token $p rc=$?"
done
timeout ${SWEEP_TIMEOUT:-150} python3 -m engine.sweep --model /tmp/models/1.5b.gguf \
    --out "$OUT" --budget-s $(( ${SWEEP_TIMEOUT:-150} - 20 )) > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?"
# The device tool returns at most 8 files: pack everything into one.
(cd "$OUT" && tar czf /tmp/vulkan_run.tgz ./* && rm -rf ./* && mv /tmp/vulkan_run.tgz .)
