#!/usr/bin/env bash
# helper gemv (issue 14, seventh session) on the GPU machine, < 100 s, from the repo root (.whl
# carried if gguf is missing). Writes $OUT/gemv/:
#   gemv.log / gemv_bench.json  us and weight GB/s per 7B / 1.5B decode shape: mmvw (base,
#                               split2 = dec8_split2's GEMV) against mmvw_pipe settings (pN_sM)
#   pytest.log                  tests/test_cuda_mmvw_pipe.py (NumPy int8 class, mmvw, tiny model
#                               graph = eager + validate, the planted MMVW_PIPE_CHUNK)
#   speed_*.json / speed.log    tg128 of dec8_split2 against gemv_p* on the 1.5B (validate of
#                               gemv_p4 / gemv_p3w, per-kernel profile), as time allows
set -u -o pipefail
. scripts/device_common.sh
device_begin gemv
gpu_txt
SETTINGS=${GEMV_SETTINGS:-base,split2,p3w_s4,p4_s4,p2w_s4,p4w_s4,p3_s4,p4_s4_lean,p3w_s8,p3w_s4_w8,p4_s4_f0,p4_s4_f4,p3w_s4_r64,p4_s4_r16,lk_split2,p4_s8_w8,p4_s4_t32}
CONFIGS=${GEMV_CONFIGS:-dec8_split2,gemv_p4,gemv_p3w,gemv_p3,gemv_p2w}
M=/tmp/gemv_1.5b.gguf
( [ -f $M ] || python3 -m engine synth --preset 1.5b --out $M > "$D/synth.log" 2>&1 ) &
SYN=$!
# builds of every setting in the background (CPU) while the first settings run
python3 - > /tmp/gemv_cfgs.json <<PY
import json
from scripts.gemv_bench import SETTINGS
from scripts.device_speed import VARIANTS
from tests.test_cuda_mmvw_pipe import CONFIGS, PIPE_MODEL, knobs
tests = [knobs(**k) for _, k in CONFIGS] + [PIPE_MODEL, knobs(), {"matmul_decode.variant": "mmvq"}]
for _, k in CONFIGS:  # the mmvw each config is compared with (test_pipe_matches_reference_and_mmvw)
    plain = {n: v for n, v in k.items() if not n.startswith("pipe")}
    tests.append(knobs(**plain, threads_per_row=k.get("pipe_lanes", 16), unroll=1))
    if k.get("pipe_wide"):
        tests.append(knobs(**plain, threads_per_row=k.get("pipe_lanes", 16), unroll=1, q4k_wide=1))
print(json.dumps(tests + [SETTINGS[n] for n in "$SETTINGS".split(",")] + [VARIANTS[n] for n in "$CONFIGS".split(",")]))
PY
for i in 0 1 2 3 4 5 6 7; do
  python3 scripts/cuda_precompile.py /tmp/gemv_cfgs.json --part $i/8 >> "$D/precompile.log" 2>&1 &
done
# 1) GEMV bandwidth per shape and setting
timeout 34 python3 scripts/gemv_bench.py --out "$D" --preset 7b,1.5b --calls 20 --repeats 3 \
  --settings $SETTINGS --deadline $(( $(date +%s) + 29 )) > "$D/gemv.log" 2>&1
echo "gemv rc=$? at $(el) s" | tee "$D/summary.txt"
# 2) GPU tests of mmvw_pipe (the model and planted-bug tests last in the file)
timeout 26 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
  tests/test_cuda_mmvw_pipe.py > "$D/pytest.log" 2>&1
echo "pytest rc=$? $(tail -1 "$D/pytest.log") at $(el) s" | tee -a "$D/summary.txt"
# 3) tg128 on the 1.5B: dec8_split2 against the pipe configs, validate gemv_p4, profile
wait $SYN
LEFT=$((96 - $(el)))
if [ -f $M ] && [ $LEFT -gt 15 ]; then
  timeout $LEFT python3 scripts/device_speed.py $M --bench "$CONFIGS" --validate gemv_p4,gemv_p3w \
    --profile gemv_p3w --repeats 1 --validate-after 3 --out "$D" --tag _gemv \
    --deadline $(( $(date +%s) + LEFT - 3 )) > "$D/speed.log" 2>&1
  echo "speed rc=$? at $(el) s" | tee -a "$D/summary.txt"
else echo "no 1.5B model or time ($LEFT s)" | tee -a "$D/summary.txt"; fi
grep -hE "^(FAILED|ERROR)" "$D"/pytest.log | head -20 | cut -c1-300 >> "$D/summary.txt"
cut -c1-1200 "$D/gemv.log"
tail -25 "$D/pytest.log"; tail -30 "$D/speed.log" 2>/dev/null
echo "done at $(el) s"
