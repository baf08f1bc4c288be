#!/usr/bin/env bash
# dec8 second round (issue 14) on the GPU machine, ~97 s, from the repo root with .whl carried.
# Writes $OUT/dec8/: pytest2.log (split_kw kv_early, q4k_wide and split_k GPU tests), gemv2.log
# (mmvw GB/s per shape of the q4k_wide settings), times2.log /
# decode_times_*.json (per-kernel decode time and tg64 of the second-round configs on the 1.5B
# synth), pytest2_mutants.log (the planted ATTN_KV_EARLY_K and MMVW_SPLIT_PART).
set -u -o pipefail
. scripts/device_common.sh
device_begin dec8 commit2.txt
M=/tmp/models/1.5b.gguf
if [ ! -f $M ]; then M=/tmp/dec8_m15.gguf
  [ -f $M ] || (python3 -m engine synth --preset 1.5b --out /tmp/dec8_m15.part.gguf > "$D/synth2.log" 2>&1 \
    && mv /tmp/dec8_m15.part.gguf $M) &
fi
CONFIGS=ptc_tc_mmvw_all,dec8_s2_w_ke_s16,dec8_s2_ke_s16,dec8_s2_w,dec8_split2,dec8_s2_ke,dec8_s2_s16,dec8_s2_ke_s32,dec8_s2_ke_s16_fr,dec8_w,dec8_w4,dec8_s2_fr,dec8_s2_ke_s16_w8,dec8_s2_ke_s16_g4,dec8_ke,dec8_s16,dec8_s32,dec8_ke_s16
SETTINGS=base,wide,wide4,wide_u1,wide_t16,wide_t16u1,wide_split2,wide_t8,wide_u4,split2
python3 - > /tmp/dec8_cfgs2.json <<PY
import json
from scripts.device_speed import VARIANTS
from scripts.gemv_bench import SETTINGS
print(json.dumps([SETTINGS[n] for n in "$SETTINGS".split(",")] + [VARIANTS[n] for n in "$CONFIGS".split(",")]))
PY
for i in 0 1 2 3 4 5; do
  python3 scripts/cuda_precompile.py /tmp/dec8_cfgs2.json --part $i/6 >> "$D/precompile2.log" 2>&1 &
done
timeout 28 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/test_cuda_decode_fused.py -k "kv_early or split4 or wide" > "$D/pytest2.log" 2>&1
echo "pytest rc=$? $(tail -1 "$D/pytest2.log") at $(el) s" | tee "$D/summary2.txt"
timeout 17 python3 scripts/gemv_bench.py --out "$D" --preset 7b,1.5b --calls 30 --repeats 3 \
  --settings $SETTINGS --deadline $(( $(date +%s) + 13 )) > "$D/gemv2.log" 2>&1
rc=$?; mv "$D/gemv_bench.json" "$D/gemv_bench2.json" 2> /dev/null
echo "gemv rc=$rc at $(el) s" | tee -a "$D/summary2.txt"
for i in $(seq 20); do [ -f $M ] && break; sleep 1; done
if [ -f $M ]; then
  timeout 36 python3 scripts/decode_times.py $M --out "$D" --configs "$CONFIGS" \
    --profile dec8_s2_w_ke_s16 --gen 64 --repeats 3 --steps 3 \
    --deadline $(( $(date +%s) + 32 )) > "$D/times2.log" 2>&1
  echo "times rc=$? at $(el) s" | tee -a "$D/summary2.txt"
else echo "no 1.5B model at $(el) s" | tee -a "$D/summary2.txt"; fi
LEFT=$((97 - $(el)))
[ $LEFT -gt 8 ] && timeout $LEFT python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/test_mutants.py -k "ATTN_KV_EARLY_K or MMVW_SPLIT_PART or Q4K_WIDE_HIGH or Q6K_WIDE_SCALE" > "$D/pytest2_mutants.log" 2>&1
echo "mutants rc=$? $(tail -1 "$D/pytest2_mutants.log" 2>/dev/null) at $(el) s" | tee -a "$D/summary2.txt"
grep -hE "^(FAILED|ERROR)" "$D"/pytest2*.log | head -20 | cut -c1-300 >> "$D/summary2.txt"
cat "$D/gemv2.log" "$D/times2.log" 2>/dev/null | cut -c1-700 | tail -30
echo "done at $(el) s"
