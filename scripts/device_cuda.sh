#!/usr/bin/env bash
# The CUDA backend's device run (tool `run` on the GPU machine): carried wheels, the GPU tests,
# synthetic 1.5B and 7B Q4_K_M models written on the machine's cores, validate, bench, sweep.
# usage: bash scripts/device_cuda.sh [tests|bench|all]   (writes logs and JSON under $OUT)
# A short run: PYTEST_K selects tests (-k), SWEEP=0 drops the chunk_tokens sweep, BENCH_ARGS is
# passed to the bench (e.g. "--variants default,mmq8 --validate default --repeats 2"),
# MODELS picks the presets ("1.5b 7b").
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WHAT=${1:-all}
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
mkdir -p /tmp/models
if [ "$WHAT" != tests ]; then
  for p in ${MODELS:-1.5b 7b}; do
    [ -f /tmp/models/$p.gguf ] || (python3 -m engine synth --preset $p --out /tmp/models/$p.gguf \
        --json > "$OUT/synth_$p.log" 2>&1 &)
  done
fi
if [ "$WHAT" != bench ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -m gpu -q -rfE --tb=short -p no:cacheprovider \
      tests/test_cuda_ops.py tests/test_backend_ops.py -k "${PYTEST_K:-cuda or not backend_ops}" \
      2>&1 | tee "$OUT/pytest_gpu.log" | tail -40
fi
if [ "$WHAT" != tests ]; then
  for p in ${MODELS:-1.5b 7b}; do
    for i in $(seq 120); do [ -s /tmp/models/$p.gguf ] && grep -q path "$OUT/synth_$p.log" 2>/dev/null && break; sleep 1; done
    sweep=--sweep; [ "${SWEEP:-1}" = 0 ] && sweep=
    timeout ${BENCH_TIMEOUT:-200} python3 scripts/device_cuda_bench.py /tmp/models/$p.gguf $sweep \
        ${BENCH_ARGS:-} --out "$OUT" 2>&1 | tee "$OUT/bench_$p.log" | grep -v "^ceilings"
  done
fi
