#!/usr/bin/env bash
# helper attn (issue 14) on the GPU machine, ~97 s, from the repo root (.whl carried if gguf is
# missing). Writes $OUT/attn/: bench.log / bench.json (scripts/attn_decode_bench.py: every
# attention_decode variant alone, us a call at contexts 128-8192, 1.5B and 7B shapes),
# times.log / decode_times_*.json (per-kernel decode time and tg64 of dec8_split2 against the
# d16_attn configs, 1.5B), pytest.log (attention_decode.tile GPU tests, with the time left; the
# planted ATTN_TILE_SWIZZLE last). CONFIGS (scripts/device_speed.py names) and PRECOMPILE_S
# (how long the bench waits for the parallel precompile) may be set; the checkpoint of commit
# d70a48d ran the configs of its BENCHMARKS.md section, with the bench cut by a compile.
set -u -o pipefail
. scripts/device_common.sh
device_begin attn
gpu_txt
M=/tmp/models/1.5b.gguf
if [ ! -f $M ]; then M=/tmp/attn_1.5b.gguf
  [ -f $M ] || (python3 -m engine synth --preset 1.5b --out /tmp/attn_1.5b.part.gguf > "$D/synth.log" 2>&1 \
    && mv /tmp/attn_1.5b.part.gguf $M) &
fi
CONFIGS=${CONFIGS:-dec8_split2,d16_attn,d16_attn_m32,d16_attn_st1,d16_attn_m32_st1,d16_attn_s64_m32}
python3 - > /tmp/attn_cfgs.json <<PY
import json
from scripts.device_speed import VARIANTS
extra = [{}, {"attention_decode.variant": "tile"},
         {"attention_decode.variant": "tile", "matmul_decode.variant": "mmvw"}]
print(json.dumps([VARIANTS[n] for n in "$CONFIGS".split(",")] + extra))
PY
PIDS=""
for i in 0 1 2 3 4 5; do
  python3 scripts/cuda_precompile.py /tmp/attn_cfgs.json --part $i/6 >> "$D/precompile.log" 2>&1 &
  PIDS="$PIDS $!"
done
echo '[{"attention_decode.variant": "tile"}]' > /tmp/attn_mut.json
for i in 0 1 2 3; do
  FLEETTUNE_MUTANT=ATTN_TILE_SWIZZLE python3 scripts/cuda_precompile.py /tmp/attn_mut.json \
    --part $i/4 >> "$D/precompile_mutant.log" 2>&1 &
done
# the bench's first config would compile every module in turn: let the parts finish first
for i in $(seq ${PRECOMPILE_S:-25}); do
  ALIVE=0; for p in $PIDS; do kill -0 $p 2> /dev/null && ALIVE=1; done
  [ $ALIVE = 0 ] && break
  sleep 1
done
echo "precompiled at $(el) s" | tee "$D/summary.txt"
timeout 20 python3 scripts/attn_decode_bench.py --contexts 512,2048,128,8192 --deadline 13 \
  --out "$D/bench.json" > "$D/bench.log" 2>&1
echo "bench rc=$? at $(el) s" | tee -a "$D/summary.txt"
for i in $(seq 10); do [ -f $M ] && break; sleep 1; done
if [ -f $M ]; then
  timeout 32 python3 scripts/decode_times.py $M --out "$D" \
    --configs "$CONFIGS" --profile dec8_split2,d16_attn --gen 64 --repeats 2 --steps 3 \
    --deadline $(( $(date +%s) + 27 )) > "$D/times.log" 2>&1
  echo "times rc=$? at $(el) s" | tee -a "$D/summary.txt"
else echo "no 1.5B model at $(el) s" | tee -a "$D/summary.txt"; fi
LEFT=$((97 - $(el))); [ $LEFT -lt 5 ] && LEFT=5
timeout $LEFT python3 -m pytest -v -m gpu -p no:cacheprovider -rfE --tb=short --maxfail=5 \
  tests/test_cuda_attn_decode.py -k "tile" > "$D/pytest.log" 2>&1
echo "pytest rc=$? $(tail -1 "$D/pytest.log") at $(el) s" | tee -a "$D/summary.txt"
grep -hE "^(FAILED|ERROR)" "$D"/pytest.log 2>/dev/null | head -20 | cut -c1-300 >> "$D/summary.txt"
cat "$D/bench.log" | cut -c1-200 | tail -90
cat "$D/times.log" 2>/dev/null | cut -c1-700 | tail -12
echo "done at $(el) s"
