#!/usr/bin/env bash
# helper dec15 (issue 14) on the GPU machine, ~97 s, from the repo root (.whl carried if gguf is
# missing). Writes $OUT/dec15/: pytest.log (attention_decode.gqa, rms_norm.block GPU tests),
# times.log / decode_times_1.5b.json (per-kernel decode time and tg64 of the float default,
# dec8_split2 and the dec15 configs on the 1.5B synth), pytest_glu.log (mmvf fuse_swiglu,
# float PDL), mutants.log (ATTN_GQA_Q0, ATTN_GQA_ROPE_SIN, NORM_ROW_WEIGHT, MMVF_GLU_GATE).
set -u -o pipefail
. scripts/device_common.sh
device_begin dec15
P=${PRESET:-1.5b}  # PRESET=7b: the 7B synth (~1 min to write: give it a call of its own)
M=/tmp/models/$P.gguf
if [ ! -f $M ]; then M=/tmp/dec15_$P.gguf
  [ -f $M ] || (python3 -m engine synth --preset $P --out /tmp/dec15_$P.part.gguf > "$D/synth.log" 2>&1 \
    && mv /tmp/dec15_$P.part.gguf $M) &
fi
CONFIGS=default,f15_norm,f15_fkv,f15_all,f15_all_fr,f15_all_fr_glu,dec8_split2,d15_norm,d15,d15_fr,d15_fr_glu,f15_all_s8,f15_all_s32,f15_all_fr_s8,d15_s8,d15_fr_s8,f15_glu,f15_all_fr_glu_pdl,d15_fr_pdl,f15_all_pdl_ne,norm_t128,norm_t512
python3 - > /tmp/dec15_cfgs.json <<PY
import json
from scripts.device_speed import VARIANTS
print(json.dumps([VARIANTS[n] for n in "$CONFIGS".split(",")]))
PY
for i in 0 1 2 3 4 5; do
  python3 scripts/cuda_precompile.py /tmp/dec15_cfgs.json --part $i/6 >> "$D/precompile.log" 2>&1 &
done
timeout 38 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short --maxfail=3 \
  tests/test_cuda_attn_decode.py tests/test_cuda_norm_decode.py > "$D/pytest.log" 2>&1
echo "pytest rc=$? $(tail -1 "$D/pytest.log") at $(el) s" | tee "$D/summary.txt"
for i in $(seq ${WAIT_MODEL_S:-15}); do [ -f $M ] && break; sleep 1; done
if [ -f $M ]; then
  timeout 38 python3 scripts/decode_times.py $M --out "$D" --configs "$CONFIGS" \
    --profile f15_all_fr_glu,d15_fr --gen 64 --repeats 2 --steps 3 \
    --deadline $(( $(date +%s) + 34 )) > "$D/times.log" 2>&1
  echo "times rc=$? at $(el) s" | tee -a "$D/summary.txt"
else echo "no 1.5B model at $(el) s" | tee -a "$D/summary.txt"; fi
LEFT=$((96 - $(el)))
[ $LEFT -gt 8 ] && timeout $((LEFT / 2)) python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
  --tb=short --maxfail=3 tests/test_cuda_mmvf_glu.py tests/test_cuda_pdl.py -k "glu or float" \
  > "$D/pytest_glu.log" 2>&1
echo "glu/pdl pytest rc=$? $(tail -1 "$D/pytest_glu.log") at $(el) s" | tee -a "$D/summary.txt"
LEFT=$((96 - $(el)))
[ $LEFT -gt 8 ] && timeout $LEFT python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/test_mutants.py -k "ATTN_GQA_Q0 or ATTN_GQA_ROPE_SIN or NORM_ROW_WEIGHT or MMVF_GLU_GATE" > "$D/mutants.log" 2>&1
echo "mutants rc=$? $(tail -1 "$D/mutants.log" 2>/dev/null) at $(el) s" | tee -a "$D/summary.txt"
grep -hE "^(FAILED|ERROR)" "$D"/pytest.log "$D"/pytest_glu.log "$D"/mutants.log 2>/dev/null | head -20 | cut -c1-300 >> "$D/summary.txt"
cat "$D/times.log" 2>/dev/null | cut -c1-700 | tail -30
echo "done at $(el) s"
