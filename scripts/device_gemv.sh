#!/usr/bin/env bash
# helper gemv (issue 14) on the GPU machine, < 100 s, from the repo root (.whl carried if gguf is
# missing). Writes $OUT/gemv/:
#   gemv.log / gemv_bench.json  mmvw us and weight GB/s per 7B / 1.5B decode shape: the defaults
#                               and split2 against q4k_lean / q4k_kernel / stream settings
#   pytest.log                  tests/test_cuda_mmvw_q4k.py, then test_cuda_mmvw_stream.py
#                               (against mmvw and the NumPy int8 class, tiny model graph = eager
#                               + validate, planted bugs)
#   times.log                   tg64 of dec8_split2 against gemv_* on the 1.5B, if time is left
# The benchmark's NVRTC builds run in the background (CPU) first.
set -u -o pipefail
. scripts/device_common.sh
device_begin gemv
gpu_txt
SETTINGS=${GEMV_SETTINGS:-base,split2,lean,k4,lk,lk_mb12,lk_mb16,lk_split2,lk_mb16_split2,lk_u4,lk_w8,lk_wide,lk_wide_split2,lk_stage_lm,stage,s3x,s3x_r2}
CONFIGS=${GEMV_CONFIGS:-dec8_split2,gemv_lk,gemv_lk_mb16,gemv_lk_stage_lm}
python3 - > /tmp/gemv_cfgs.json <<PY
import json
from scripts.gemv_bench import SETTINGS
from scripts.device_speed import VARIANTS
from tests.test_cuda_mmvw_q4k import CONFIGS, Q4K_MODEL, knobs
tests = [knobs(**k, **e) for _, k in CONFIGS for e in ({}, {"q4k_lean": 1})]
tests += [Q4K_MODEL, {"matmul_decode.variant": "mmvq"}]
print(json.dumps(tests + [SETTINGS[n] for n in "$SETTINGS".split(",")] + [VARIANTS[n] for n in "$CONFIGS".split(",")]))
PY
PIDS=()
for i in 0 1 2 3 4 5 6 7; do
  python3 scripts/cuda_precompile.py /tmp/gemv_cfgs.json --part $i/8 >> "$D/precompile.log" 2>&1 &
  PIDS+=($!)
done
# 1) GEMV bandwidth per shape and setting (both presets, one process; it builds what the
#    background builds have not reached yet)
timeout 40 python3 scripts/gemv_bench.py --out "$D" --preset 7b,1.5b --calls 30 --repeats 3 \
  --settings $SETTINGS --deadline $(( $(date +%s) + 34 )) > "$D/gemv.log" 2>&1
echo "gemv rc=$? at $(el) s" | tee "$D/summary.txt"
for p in "${PIDS[@]}"; do while kill -0 $p 2> /dev/null && [ $(el) -lt 48 ]; do sleep 1; done; done
echo "precompile: $(grep -c modules "$D/precompile.log")/8 parts done at $(el) s" | tee -a "$D/summary.txt"
# 2) GPU tests of the stream kernel (the planted bug last in the file)
LEFT=$((92 - $(el))); [ $LEFT -gt 40 ] && LEFT=40
timeout $LEFT python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/test_cuda_mmvw_q4k.py tests/test_cuda_mmvw_stream.py > "$D/pytest.log" 2>&1
echo "pytest rc=$? $(tail -1 "$D/pytest.log") at $(el) s" | tee -a "$D/summary.txt"
# 3) tg64 on the 1.5B when another script left its model and time is left
M=/tmp/models/1.5b.gguf; [ -f $M ] || M=/tmp/dec8_m15.gguf; [ -f $M ] || M=/tmp/attn_1.5b.gguf
LEFT=$((95 - $(el)))
if [ -f $M ] && [ $LEFT -gt 15 ]; then
  timeout $LEFT python3 scripts/decode_times.py $M --out "$D" --configs "$CONFIGS" --profile gemv_lk --gen 64 \
    --repeats 1 --steps 2 --deadline $(( $(date +%s) + LEFT - 4 )) > "$D/times.log" 2>&1
  echo "times rc=$? at $(el) s" | tee -a "$D/summary.txt"
else echo "no 1.5B model or time ($LEFT s)" | tee -a "$D/summary.txt"; fi
grep -hE "^(FAILED|ERROR)" "$D"/pytest.log | head -20 | cut -c1-300 >> "$D/summary.txt"
cat "$D/gemv.log" | cut -c1-900
tail -25 "$D/pytest.log"; tail -12 "$D/times.log" 2>/dev/null
echo "done at $(el) s"
