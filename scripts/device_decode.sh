#!/usr/bin/env bash
# CUDA decode, second round of issue 14 (mmvw's fused epilogues and load knobs), on the GPU
# machine in one call (tool `run`, carry [".whl"]), inside BUDGET_S seconds (default 95):
#   1. GPU tests of mmvw_glu / mmvw_norm / mmvw_qkv and of them under PDL with the weights' L2
#      prefetch (tests/test_cuda_decode_fused.py, test_cuda_pdl.py -k PYTEST_K), and with
#      MUTANTS=1 the planted bugs in them (tests/test_mutants.py, slow: every module rebuilt);
#   2. per model in MODELS (default 1.5b; synthetic qwen2 Q4_K_M written here): bench
#      mmvw_all against the fused variants, validate fused_all, a knob sweep from fused_all
#      (SWEEP_KNOBS) and the per-kernel profile of the best setting (scripts/device_speed.py);
#      the shared-memory staging (stage) comes last in each list: new PTX (bulk copy, mbarrier)
#      whose fault would end the process's later steps
#   3. PDL with the weights' L2 prefetch or staging, a process per model (PDL_MODELS, default
#      the first model; PDL_RESERVE seconds kept for it).
# Output under $OUT/decode/: pytest.log, speed_<preset>.log / .json (rewritten after every step),
# speed_<preset>_pdl.*; PACK=1 packs the folder into $OUT/decode.tgz.
#   BUDGET_S=400 MODELS="1.5b 7b" MUTANTS=1 bash scripts/device_decode.sh     (a full call)
set -u -o pipefail
OUT=${OUT:-/tmp/out}; D="$OUT/decode"; mkdir -p "$D"
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-95}))
left() { echo $((END - $(date +%s))); }
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$D/gpu.txt"
git log --oneline -1 > "$D/commit.txt" 2> /dev/null
MODELS=${MODELS:-1.5b}
mkdir -p /tmp/models
for p in $MODELS; do  # our own .part name, renamed when whole: a present .gguf is complete
  [ -f /tmp/models/$p.gguf ] || (python3 -m engine synth --preset $p \
      --out /tmp/models/$p.decode.part.gguf --json > "$D/synth_$p.log" 2>&1 \
      && mv /tmp/models/$p.decode.part.gguf /tmp/models/$p.gguf) &
done
K=${PYTEST_K:-"glu or norm or attn_in or fused_prefetch or fused_all"}
TESTS="tests/test_cuda_decode_fused.py tests/test_cuda_pdl.py"  # PDL last: a fault ends the run
if [ "${MUTANTS:-0}" = 1 ]; then
  TESTS="$TESTS tests/test_mutants.py"; K="$K or MMVW_GLU or MMVW_NORM or MMVW_QKV or MMVW_STAGE"
fi
timeout $(( $(left) * ${TEST_SHARE:-40} / 100 )) python3 -m pytest -v -rfE -m gpu \
    -p no:cacheprovider $TESTS -k "$K" > "$D/pytest.log" 2>&1
echo "pytest rc $? ($(tail -1 "$D/pytest.log"))"
grep -E "^(FAILED|ERROR)" "$D/pytest.log" | head -20
n=$(echo $MODELS | wc -w)
PDL_S=0; [ "${PDL:-1}" = 1 ] && PDL_S=${PDL_RESERVE:-18}  # seconds kept for the PDL processes
for p in $MODELS; do
  DL=$(( $(date +%s) + ($(left) - PDL_S) / n )); n=$((n - 1))  # this model's share
  while [ ! -f /tmp/models/$p.gguf ] && [ "$(left)" -gt 20 ]; do sleep 1; done
  [ -f /tmp/models/$p.gguf ] || { echo "$p: no model in time"; continue; }
  timeout $(( DL - $(date +%s) )) python3 scripts/device_speed.py /tmp/models/$p.gguf \
      --bench "${BENCH:-mmvw_all,fused_all,fused_glu,fused_norm,fused_rope,fused_all_stage}" \
      --validate "${VALIDATE:-fused_all}" --profile "${PROFILE:-}" --repeats "${REPEATS:-2}" \
      --validate-after 2 --sweep "${SWEEP:-fused_all}" \
      --sweep-knobs "${SWEEP_KNOBS:-wload,glu_threads_per_row,glu_unroll,unroll,stage}" \
      --deadline $((DL - 8)) --out "$D" 2>&1 | grep -v "it/s\]" | tee "$D/speed_$p.log"
done
# programmatic dependent launch with the weights' L2 prefetch or staging, a process per model
# (PDL=0: skip) for PDL_MODELS (default: the first of MODELS), sharing what time is left
PM=${PDL_MODELS:-${MODELS%% *}}; n=$(echo $PM | wc -w)
for p in $PM; do
  DL=$(( $(date +%s) + $(left) / n )); n=$((n - 1))
  if [ "${PDL:-1}" = 1 ] && [ -f /tmp/models/$p.gguf ] && [ $(( DL - $(date +%s) )) -gt 15 ]; then
    timeout $(( DL - $(date +%s) )) python3 scripts/device_speed.py /tmp/models/$p.gguf \
        --bench "${PDL_BENCH:-mmvw_all_pdl,mmvw_all_pdl_pf,mmvw_all_pdl_stage,fused_all_pdl_pf}" \
        --validate "${PDL_VALIDATE:-mmvw_all_pdl_pf}" --profile "" --repeats "${REPEATS:-2}" \
        --deadline $((DL - 4)) --tag _pdl --out "$D" 2>&1 | grep -v "it/s\]" \
        | tee "$D/speed_${p}_pdl.log"
  fi
done
echo "decode done in $(( $(date +%s) - T0 )) s"
# PACK=1: one $OUT/decode.tgz instead of the folder (a device call returns at most 8 files)
if [ "${PACK:-0}" = 1 ]; then tar czf "$OUT/decode.tgz" -C "$OUT" decode && rm -rf "$D"; fi
