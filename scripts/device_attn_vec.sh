#!/usr/bin/env bash
# helper attn, second round (issue 14): attention_decode.vec on the GPU machine, ~97 s, from the
# repo root (.whl carried if gguf is missing). Writes $OUT/attn/:
#   pytest_kernel.log  tests/test_cuda_attn_vec.py's kernel cases (against float64)
#   bench.log / .json  scripts/attn_decode_bench.py: us a call, split_kw (dec8_split2's) / tile
#                      / vec and its knobs, contexts 512, 128, 2048, 1.5B and 7B head shapes
#   speed.log / speed_*.json  scripts/device_speed.py on the 1.5B synth: tg128 of dec8_split2
#                      against the d17_vec configs, validate of d17_vec and d17_vec_cl_w8_rope
#   pytest.log         the rest of the vec GPU tests (Q8_1 form, models, validate, fuse_rope
#                      bit-equal to rope_kv, the planted bugs)
# VARIANTS (bench) and CONFIGS (speed) may be set.
set -u -o pipefail
. scripts/device_common.sh
device_begin attn
gpu_txt
mkdir -p /tmp/models
M=/tmp/models/1.5b.gguf
if [ ! -f $M ]; then M=/tmp/attn_1.5b.gguf
  [ -f $M ] || (python3 -m engine synth --preset 1.5b --out /tmp/attn_1.5b.part.gguf > "$D/synth.log" 2>&1 \
    && mv /tmp/attn_1.5b.part.gguf $M) &
fi
VARIANTS=${VARIANTS:-split_kw,tile,vec,vec_cl,vec_cl_w8,vec_cl_w8_pf,vec_w2,vec_w1_m8,vec_nofc}
CONFIGS=${CONFIGS:-dec8_split2,d17_vec,d17_vec_cl_w8,d17_vec_cl_w8_rope,d17_vec_rope}
python3 - > /tmp/attn_cfgs.json <<PY
import json
from scripts.attn_decode_bench import BASE, BENCH
from scripts.device_speed import VARIANTS
cfgs = [VARIANTS[n] for n in "$CONFIGS".split(",")]
cfgs += [VARIANTS[BASE] | BENCH[n] for n in "$VARIANTS".split(",")]
V = {"attention_decode.variant": "vec"}
cfgs += [{}, V, {"matmul_decode.variant": "mmvq"}, V | {"matmul_decode.variant": "mmvw"},
         V | {"attention_decode.fuse_rope": 1}, V | {"rope.fuse_kv": 1},
         V | {"attention_decode.cluster": 1, "matmul_decode.variant": "mmvw", "rope.fuse_kv": 1}]
print(json.dumps(cfgs))
PY
PIDS=""
for i in 0 1 2 3 4 5; do
  python3 scripts/cuda_precompile.py /tmp/attn_cfgs.json --part $i/6 >> "$D/precompile.log" 2>&1 &
  PIDS="$PIDS $!"
done
echo '[{"attention_decode.variant": "vec"}]' > /tmp/attn_mut.json
FLEETTUNE_MUTANT=ATTN_VEC_COMBINE_W python3 scripts/cuda_precompile.py /tmp/attn_mut.json \
  >> "$D/precompile_mutant.log" 2>&1 &
echo '[{"attention_decode.variant": "vec", "attention_decode.fuse_rope": 1},
       {"attention_decode.variant": "vec", "rope.fuse_kv": 1}]' > /tmp/attn_mut2.json
for i in 0 1 2; do
  FLEETTUNE_MUTANT=ATTN_VEC_ROPE_K python3 scripts/cuda_precompile.py /tmp/attn_mut2.json \
    --part $i/3 >> "$D/precompile_mutant.log" 2>&1 &
done
for i in $(seq ${PRECOMPILE_S:-20}); do
  ALIVE=0; for p in $PIDS; do kill -0 $p 2> /dev/null && ALIVE=1; done
  [ $ALIVE = 0 ] && break
  sleep 1
done
echo "precompiled at $(el) s" | tee "$D/summary.txt"
PYT="python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short --maxfail=5"
timeout 20 $PYT tests/test_cuda_attn_vec.py -k "test_attention_decode_vec and not q8 and not planted" \
  > "$D/pytest_kernel.log" 2>&1
echo "pytest kernel rc=$? $(tail -1 "$D/pytest_kernel.log") at $(el) s" | tee -a "$D/summary.txt"
timeout 18 python3 scripts/attn_decode_bench.py --contexts 512,128,2048 --shapes 1.5b,7b \
  --variants "$VARIANTS" --calls 32 --repeats 3 --deadline 11 --out "$D/bench.json" \
  > "$D/bench.log" 2>&1
echo "bench rc=$? at $(el) s" | tee -a "$D/summary.txt"
for i in $(seq 10); do [ -f $M ] && break; sleep 1; done
if [ -f $M ]; then
  LEFT=$((85 - $(el))); [ $LEFT -lt 25 ] && LEFT=25
  timeout $LEFT python3 scripts/device_speed.py $M --bench "$CONFIGS" --validate d17_vec_cl_w8_rope,d17_vec \
    --profile "" --repeats 1 --validate-after 4 --deadline $(( $(date +%s) + LEFT - 6 )) \
    --out "$D" > "$D/speed.log" 2>&1
  echo "speed rc=$? at $(el) s" | tee -a "$D/summary.txt"
else echo "no 1.5B model at $(el) s" | tee -a "$D/summary.txt"; fi
LEFT=$((97 - $(el))); [ $LEFT -lt 10 ] && LEFT=10
timeout $LEFT $PYT tests/test_cuda_attn_vec.py -k "not test_attention_decode_vec or q8 or planted" \
  > "$D/pytest.log" 2>&1
echo "pytest rest rc=$? $(tail -1 "$D/pytest.log") at $(el) s" | tee -a "$D/summary.txt"
grep -hE "^(FAILED|ERROR)" "$D"/pytest*.log 2>/dev/null | head -20 | cut -c1-300 >> "$D/summary.txt"
cut -c1-200 "$D/bench.log" | tail -60
grep -E "bench|validate|PASS|FAIL|attn|rms|rope|swiglu" "$D/speed.log" 2>/dev/null | cut -c1-300 | tail -20
cat "$D/summary.txt"
for p in $(jobs -p); do kill $p 2> /dev/null; done  # this script's own precompiles, if any
echo "done at $(el) s"
