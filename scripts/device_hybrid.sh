#!/usr/bin/env bash
# Issue 15 on the GPU machine, Vulkan through the NVIDIA driver, in stages that each fit one
# device command (10 min); the synthetic files stay in /tmp/models while the machine is warm.
#   bash scripts/device_hybrid.sh tests      hybrid Vulkan tests + delta_net at the real shape
#   bash scripts/device_hybrid.sh 9b         Qwen3.5-9B-like dense hybrid: synth, validate, bench
#   bash scripts/device_hybrid.sh 35b-a3b    Qwen3.5-35B-A3B-like MoE: synth, validate, bench
#   bash scripts/device_hybrid.sh scan       delta_net kernels at the 9b shape: sequential (S, S^T
#                                            x wg) against chunked (chunk x scan_wg), pp512 + decode
#   bash scripts/device_hybrid.sh 9b-chunked the 9b model with delta_net.chunked (chunk 64):
#                                            validate + bench, beside the 9b stage's sequential
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
run_model() {  # ARCH PRESET [FLAT_CONFIG_JSON TAG]: registry defaults unless a config is given
  local f=/tmp/models/$1-$2.gguf tag=$2${4:+-$4} cfg=()
  synth $1 $2
  if [ -n "${3:-}" ]; then
    python3 -c "import json, sys; from engine.tuning import TuningConfig as C
print(C.default('vulkan').replace(**json.loads(sys.argv[1])).to_toml())" "$3" > /tmp/$tag.toml
    cfg=(--config /tmp/$tag.toml)
  fi
  timeout 150 python3 -m engine validate --backend vulkan --no-promoted "${cfg[@]}" --steps 4 \
      --model $f --json > "$OUT/validate_$tag.json" 2>"$OUT/validate_$tag.err"
  echo "validate $tag rc=$?"
  timeout 240 python3 -m engine bench --backend vulkan --no-promoted "${cfg[@]}" --model $f \
      --prompt-tokens 512 --gen-tokens 128 --repeats 2 --profile > "$OUT/bench_$tag.txt" \
      2>"$OUT/bench_$tag.err"
  echo "bench $tag rc=$?"; cat "$OUT/bench_$tag.txt"
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
9b-chunked) run_model qwen35 9b '{"delta_net.variant": "chunked", "delta_net.chunk": 64}' chunked ;;
scan)
  timeout 500 python3 scripts/bench_delta_net.py --preset 9b --tokens 512 --repeats 10 --json \
      > "$OUT/delta_net_scan.json" 2>"$OUT/delta_net_scan.err"
  echo "bench_delta_net rc=$?"; cat "$OUT/delta_net_scan.json" ;;
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
*) sed -n 2,13p "$0"; exit 2 ;;
esac
(cd "$OUT" && tar czf /tmp/hybrid_run.tgz ./* && rm -rf ./* && mv /tmp/hybrid_run.tgz .)
