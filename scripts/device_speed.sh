#!/usr/bin/env bash
# CUDA decode speed (issue 14) on the GPU machine in one call (tool `run`, carry [".whl"]):
#   1. GPU tests of the new kernels (tests/test_cuda_decode_fused.py) and the CUDA op tests
#      they touch (the shared contract's decode variants, Q8_1, whole models, validate);
#   2. per model (synthetic qwen2 1.5B and 7B Q4_K_M, written here while the tests run):
#      bench pp512/tg128 of the registry default against each new variant, validate of each
#      new variant, and a per-kernel decode profile (scripts/device_speed.py).
# Everything lands in $OUT as it comes: pytest_speed.log, speed_<preset>.json (rewritten after
# every step) and speed_<preset>.log (speed_<preset>_pdl.*: programmatic dependent launch, in
# a process of its own; PDL=0 skips it). The run ends inside BUDGET_S (default 450 s): each phase
# has a timeout and the drivers a deadline. With two or more GPUs the 7B runs on card 0 while
# the tests and then the 1.5B run on card 1.
#   bash scripts/device_speed.sh            BENCH=..., VALIDATE=..., PROFILE=... (variant lists
#                                           of scripts/device_speed.py), TESTS=0 skips step 1
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-450}))
export PYTHONUNBUFFERED=1
# (not over a caller's /tmp/site: device_all.sh's Ray processes import from it meanwhile)
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 > "$OUT/commit.txt" 2>/dev/null
mkdir -p /tmp/models
for p in 1.5b 7b; do  # written to a .part file and renamed: a present .gguf is a whole one
  [ -f /tmp/models/$p.gguf ] || (python3 -m engine synth --preset $p --out /tmp/models/$p.part.gguf \
      --json > "$OUT/synth_$p.log" 2>&1 && mv /tmp/models/$p.part.gguf /tmp/models/$p.gguf &)
done
left() { echo $((END - $(date +%s))); }
# a model is there when its file is and no synth of it (ours or a caller's, same $OUT) is writing
writing() { [ -f "$OUT/synth_$1.log" ] && ! grep -q '"path"' "$OUT/synth_$1.log"; }
wait_model() {
  while { [ ! -f /tmp/models/$1.gguf ] || writing $1; } && [ "$(left)" -gt 30 ]; do sleep 1; done
}
# the cards this call may use: CUDA_VISIBLE_DEVICES when the caller set it (device_all.sh gives
# one card of two), else every card nvidia-smi lists; "card i" below is the i-th of them
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then CARDS=(${CUDA_VISIBLE_DEVICES//,/ })
else CARDS=($(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 )))); fi
ncards=${#CARDS[@]}
TCARD=0; [ "$ncards" -gt 1 ] && TCARD=1

BENCH=${BENCH:-default,mmvw_all,mmvq,all_dmmv,mmvw_fused,mmvw_kw,mmvw_kw_nofc,fuse_kv,kw,mmvw,mmvw_s32,mmvw_kw_s16,mmvw_kw_g4,mmvw_t16_r2,mmvw_t8_r2,mmvw_u4}
VALIDATE=${VALIDATE:-all_dmmv,mmvw_all}
PROFILE=${PROFILE:-default,mmvw_all}
RESERVE=0; [ "${PDL:-1}" = 0 ] || RESERVE=${PDL_RESERVE:-55}  # seconds kept for the PDL runs
speed() {  # card preset seconds: bench, validate and profile the variants
  wait_model $2
  { [ -f /tmp/models/$2.gguf ] && ! writing $2; } || {
    echo "$2: model not written in time" | tee -a "$OUT/speed_$2.log"; return; }
  local dl=$(( $(date +%s) + $3 )); [ $dl -gt $((END - 10 - RESERVE)) ] && dl=$((END - 10 - RESERVE))
  local t=$(( dl - $(date +%s) + 8 )); [ $t -lt 20 ] && t=20  # the last step may overrun a bit
  CUDA_VISIBLE_DEVICES=${CARDS[$1]} timeout $t python3 scripts/device_speed.py \
      /tmp/models/$2.gguf --bench "$BENCH" --validate "$VALIDATE" --profile "$PROFILE" \
      --repeats ${REPEATS:-3} --validate-after 4 --deadline $dl --out "$OUT" \
      > "$OUT/speed_$2.log" 2>&1
  echo "speed $2 rc=$? after $(( $(date +%s) - T0 ))s" | tee -a "$OUT/speed_$2.log"
}
speed_pdl() {  # card preset seconds: programmatic dependent launch, in a process of its own
  [ "${PDL:-1}" = 0 ] || [ ! -f /tmp/models/$2.gguf ] && return
  local dl=$(( $(date +%s) + $3 )); [ $dl -gt $((END - 10)) ] && dl=$((END - 10))
  local t=$(( dl - $(date +%s) + 8 )); [ $t -lt 25 ] && { echo "$2: no time left for pdl"; return; }
  CUDA_VISIBLE_DEVICES=${CARDS[$1]} timeout $t python3 scripts/device_speed.py \
      /tmp/models/$2.gguf --bench mmvw_all,mmvw_all_pdl,mmvw_kw_pdl --validate "" --profile "" --tag _pdl \
      --repeats ${REPEATS:-3} --deadline $dl --out "$OUT" > "$OUT/speed_$2_pdl.log" 2>&1
  echo "speed $2 pdl rc=$? after $(( $(date +%s) - T0 ))s" | tee -a "$OUT/speed_$2_pdl.log"
}

if [ "$ncards" -gt 1 ]; then (speed 0 7b 400; speed_pdl 0 7b 120) & fi
# one card: the tests get less time, the 7B more (TEST_TIMEOUT / TEST_TIMEOUT2 override)
T1=130; T2=70; [ "$ncards" -gt 1 ] || { T1=100; T2=45; }
if [ "${TESTS:-1}" != 0 ]; then
  CUDA_VISIBLE_DEVICES=${CARDS[$TCARD]} timeout ${TEST_TIMEOUT:-$T1} python3 -m pytest -m gpu -q -rfE \
      --tb=short -p no:cacheprovider tests/test_cuda_decode_fused.py > "$OUT/pytest_speed.log" 2>&1
  echo "pytest decode_fused rc=$? after $(( $(date +%s) - T0 ))s" | tee -a "$OUT/pytest_speed.log"
  CUDA_VISIBLE_DEVICES=${CARDS[$TCARD]} timeout ${TEST_TIMEOUT2:-$T2} python3 -m pytest -m gpu -q -rfE \
      --tb=short -p no:cacheprovider tests/test_cuda_ops.py -k "matmul_decode_every_variant or \
      q8 or mmvq or model_matches or validate_passes" >> "$OUT/pytest_speed.log" 2>&1
  echo "pytest cuda_ops subset rc=$? after $(( $(date +%s) - T0 ))s" | tee -a "$OUT/pytest_speed.log"
  CUDA_VISIBLE_DEVICES=${CARDS[$TCARD]} timeout 40 python3 -m pytest -m gpu -q -rfE --tb=short \
      -p no:cacheprovider tests/test_cuda_pdl.py >> "$OUT/pytest_speed.log" 2>&1
  echo "pytest pdl rc=$? after $(( $(date +%s) - T0 ))s" | tee -a "$OUT/pytest_speed.log"
  grep -E "passed|failed|error" "$OUT/pytest_speed.log" | tail -6
fi
if [ "$ncards" -gt 1 ]; then speed $TCARD 1.5b 300; speed_pdl $TCARD 1.5b 60; wait
else  # one card: the 1.5B gets 40% of what is left, the 7B the rest, then the PDL runs
  R=$(( END - $(date +%s) - 10 - RESERVE )); speed 0 1.5b $(( R * 2 / 5 ))
  speed 0 7b 400; speed_pdl 0 1.5b 25; speed_pdl 0 7b 60; fi
cat "$OUT"/speed_*.log | grep -v "^\s*$" | tail -60
echo "done after $(( $(date +%s) - T0 ))s"
