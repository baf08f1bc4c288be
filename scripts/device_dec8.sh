#!/usr/bin/env bash
# dec8 (issue 14, CUDA int8 decode of the dense qwen2 shapes) on the GPU machine, ~96 s, from the
# repo root with .whl carried (as scripts/device_speed.sh). Writes $OUT/dec8/:
#   pytest.log                      GPU tests of split_k + the planted MMVW_SPLIT_PART
#   gemv.log / gemv_bench.json      mmvw GB/s per 7B / 1.5B decode shape and knob setting
#   times.log / decode_times_*.json per-kernel decode time (launches queued behind a spin
#                                   kernel) and tg64 of the candidate configs on the 1.5B synth
# The benchmarks' NVRTC builds run in the background (CPU) while the tests use the GPU.
set -u -o pipefail
. scripts/device_common.sh
device_begin dec8
gpu_txt name,clocks.sm,clocks.mem
M=/tmp/models/1.5b.gguf  # device_speed.sh's file when a script before us wrote it
if [ ! -f $M ]; then M=/tmp/dec8_m15.gguf
  [ -f $M ] || (python3 -m engine synth --preset 1.5b --out /tmp/dec8_m15.part.gguf > "$D/synth.log" 2>&1 \
    && mv /tmp/dec8_m15.part.gguf $M) &
fi
SETTINGS=base,split2,split4,split2_all,split4_all,r2,u4,r2_split2,t16r2u1,t16u1,t16r2u1_split4,pdl,pdl_pf,pdl_stage,stage,split2_u4,split4_w8,w8,wl1,pdl_split2,t16r2,mb8,r4
CONFIGS=ptc_tc_mmvw_all,dec8_split4,dec8_pdl_pf,dec8_split2,dec8_split4_pdl_pf,dec8_pdl,dec8_pdl_stage,dec8_split4_all,dec8_r2,dec8_qt512
python3 - > /tmp/dec8_cfgs.json <<PY
import json
from scripts.gemv_bench import SETTINGS
from scripts.device_speed import VARIANTS
print(json.dumps([SETTINGS[n] for n in "$SETTINGS".split(",")] + [VARIANTS[n] for n in "$CONFIGS".split(",")]))
PY
PIDS=()
for i in 0 1 2 3 4 5 6 7; do
  python3 scripts/cuda_precompile.py /tmp/dec8_cfgs.json --part $i/8 >> "$D/precompile.log" 2>&1 &
  PIDS+=($!)
done
# 1) GPU tests: split_k against the NumPy reference (ragged shapes, every block type), whole
#    tiny models (graph = eager, validate), then the planted bug
timeout 26 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/test_cuda_decode_fused.py -k "split2 or split4" > "$D/pytest.log" 2>&1
echo "pytest rc=$? $(tail -1 "$D/pytest.log") at $(el) s" | tee "$D/summary.txt"
timeout 11 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/test_mutants.py -k "MMVW_SPLIT_PART" > "$D/pytest_mutant.log" 2>&1
echo "mutant rc=$? $(tail -1 "$D/pytest_mutant.log") at $(el) s" | tee -a "$D/summary.txt"
for p in "${PIDS[@]}"; do while kill -0 $p 2> /dev/null && [ $(el) -lt 42 ]; do sleep 1; done; done
echo "precompile: $(grep -c modules "$D/precompile.log")/8 parts done at $(el) s" | tee -a "$D/summary.txt"
# 2) GEMV bandwidth per shape and setting (both presets, one process)
timeout 32 python3 scripts/gemv_bench.py --out "$D" --preset 7b,1.5b --calls 30 --repeats 3 \
  --settings $SETTINGS --deadline $(( $(date +%s) + 27 )) > "$D/gemv.log" 2>&1
echo "gemv rc=$? at $(el) s" | tee -a "$D/summary.txt"
# 3) the 1.5B decode: per-kernel times and tg64 of the candidates
LEFT=$((96 - $(el)))
if [ -f $M ] && [ $LEFT -gt 10 ]; then
  timeout $LEFT python3 scripts/decode_times.py $M --out "$D" --configs "$CONFIGS" \
    --profile ptc_tc_mmvw_all --gen 64 --repeats 2 --steps 3 \
    --deadline $(( $(date +%s) + LEFT - 5 )) > "$D/times.log" 2>&1
  echo "times rc=$? at $(el) s" | tee -a "$D/summary.txt"
else echo "no 1.5B model ($M) or time ($LEFT s)" | tee -a "$D/summary.txt"; fi
grep -hE "^(FAILED|ERROR)" "$D"/pytest*.log | head -20 | cut -c1-300 >> "$D/summary.txt"
cat "$D/gemv.log" "$D/times.log" 2>/dev/null | cut -c1-700 | tail -40
echo "done at $(el) s"
