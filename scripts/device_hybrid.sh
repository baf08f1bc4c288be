#!/usr/bin/env bash
# Issue 15 on the GPU machine, Vulkan through the NVIDIA driver, in stages that each fit one
# device command (10 min); the synthetic files stay in /tmp/models while the machine is warm.
#   bash scripts/device_hybrid.sh tests      hybrid Vulkan tests + delta_net at the real shape
#   bash scripts/device_hybrid.sh 9b         Qwen3.5-9B-like dense hybrid: synth, validate, bench
#   bash scripts/device_hybrid.sh 35b-a3b    Qwen3.5-35B-A3B-like MoE: synth, validate, bench
#   bash scripts/device_hybrid.sh llama      llama-bench on both files (after
#                                            bash ../shared/device/llama-bench.sh build)
# Carry .gl and .spv-cache (see scripts/device_vulkan_env.sh). Logs and JSON under $OUT, packed.
STAGE=${1:-}
MODELS="" source scripts/device_vulkan_env.sh || exit $?
synth() {  # ARCH PRESET -> /tmp/models/ARCH-PRESET.gguf, once per warm machine
  local f=/tmp/models/$1-$2.gguf
  [ -f "$f" ] || timeout 400 python3 -m engine synth --arch $1 --preset $2 --out $f --json \
      > "$OUT/synth_$1-$2.log" 2>&1
  echo "synth $1-$2 rc=$? $(du -h $f 2>/dev/null | cut -f1)"
}
run_model() {  # ARCH PRESET
  local f=/tmp/models/$1-$2.gguf
  synth $1 $2
  timeout 150 python3 -m engine validate --backend vulkan --no-promoted --steps 4 --model $f \
      --json > "$OUT/validate_$2.json" 2>"$OUT/validate_$2.err"
  echo "validate $2 rc=$?"
  timeout 240 python3 -m engine bench --backend vulkan --no-promoted --model $f \
      --prompt-tokens 512 --gen-tokens 128 --repeats 2 --profile > "$OUT/bench_$2.txt" \
      2>"$OUT/bench_$2.err"
  echo "bench $2 rc=$?"; cat "$OUT/bench_$2.txt"
}
case "$STAGE" in
tests)
  timeout 200 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
      tests/test_vulkan_delta_net.py tests/test_vulkan_hybrid.py 2>&1 \
      | tee "$OUT/pytest_hybrid.log" | tail -5
  timeout 150 python3 scripts/bench_delta_net.py --tokens 512 --repeats 10 \
      > "$OUT/delta_net.txt" 2>&1
  echo "bench_delta_net rc=$?"; cat "$OUT/delta_net.txt" ;;
9b) run_model qwen35 9b ;;
35b-a3b) run_model qwen35moe 35b-a3b ;;
llama)
  LB=${LLAMA_BENCH_BUILD:-/root/llama-bench}/bin/llama-bench  # as ../shared/device/llama-bench.sh
  [ -x "$LB" ] || { echo "no $LB: run ../shared/device/llama-bench.sh build first"; exit 2; }
  for m in "qwen35 9b" "qwen35moe 35b-a3b"; do
    set -- $m
    synth $1 $2
    timeout 200 "$LB" -m /tmp/models/$1-$2.gguf -p 512 -n 128 -fa 1 -r 5 -o json \
        > "$OUT/llama_bench_$2.json" 2>"$OUT/llama_bench_$2.err"
    echo "llama-bench $2 rc=$?"; cat "$OUT/llama_bench_$2.json"
  done ;;
*) sed -n 2,9p "$0"; exit 2 ;;
esac
(cd "$OUT" && tar czf /tmp/hybrid_run.tgz ./* && rm -rf ./* && mv /tmp/hybrid_run.tgz .)
