#!/usr/bin/env bash
# Issue 15 on the GPU machine, Vulkan through the NVIDIA driver: the hybrid Vulkan tests, the
# delta_net kernel at a real layer shape, a Qwen3.5-9B-like dense hybrid and a Qwen3.5-35B-A3B-
# like MoE (synthesized here) validated and benched with a per-kernel profile, and llama.cpp's
# llama-bench on the same two files when it is built (bash ../shared/device/llama-bench.sh build,
# same machine, still warm).
# Carry .gl and .spv-cache (see scripts/device_vulkan_env.sh).
# usage: bash scripts/device_hybrid.sh     (logs and JSON under $OUT, packed into one tgz)
MODELS="" source scripts/device_vulkan_env.sh || exit $?
for m in "qwen35 9b" "qwen35moe 35b-a3b"; do
  set -- $m
  (python3 -m engine synth --arch $1 --preset $2 --out /tmp/models/$1-$2.gguf --json \
      > "$OUT/synth_$1-$2.log" 2>&1 &)
done
wait_file() { for i in $(seq "$2"); do grep -q '"path"' "$OUT/synth_$1.log" 2>/dev/null && return 0; sleep 1; done; return 1; }
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    tests/test_vulkan_delta_net.py tests/test_vulkan_hybrid.py 2>&1 | tee "$OUT/pytest_hybrid.log" | tail -5
timeout 120 python3 scripts/bench_delta_net.py --tokens 512 --repeats 10 > "$OUT/delta_net.txt" 2>&1
echo "bench_delta_net rc=$?"; cat "$OUT/delta_net.txt"
M=/tmp/models/qwen35-9b.gguf
for m in "qwen35-9b 300" "qwen35moe-35b-a3b 420"; do
  set -- $m
  wait_file $1 $2 || { echo "synth $1 not ready"; continue; }
  timeout 200 python3 -m engine validate --backend vulkan --no-promoted --steps 4 \
      --model /tmp/models/$1.gguf --json > "$OUT/validate_$1.json" 2>"$OUT/validate_$1.err"
  echo "validate $1 rc=$?"
  timeout 300 python3 -m engine bench --backend vulkan --no-promoted --model /tmp/models/$1.gguf \
      --prompt-tokens 512 --gen-tokens 128 --repeats 2 --profile > "$OUT/bench_$1.txt" \
      2>"$OUT/bench_$1.err"
  echo "bench $1 rc=$?"; cat "$OUT/bench_$1.txt"
done
LB=${LLAMA_BENCH_BUILD:-/root/llama-bench}/bin/llama-bench  # as ../shared/device/llama-bench.sh
if [ -x "$LB" ] && wait_file qwen35moe-35b-a3b 420; then
  for m in $M /tmp/models/qwen35moe-35b-a3b.gguf; do
    timeout 200 "$LB" -m $m -p 512 -n 128 -fa 1 -r 5 -o json >> "$OUT/llama_bench.json" \
        2>>"$OUT/llama_bench.err"
    echo "llama-bench $(basename $m) rc=$?"
  done
fi
(cd "$OUT" && tar czf /tmp/hybrid_run.tgz ./* && rm -rf ./* && mv /tmp/hybrid_run.tgz .)
