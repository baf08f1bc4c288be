#!/usr/bin/env bash
# Helper hdec's GPU checkpoint (issue 15, hybrid decode launches), ~100 s on one H200, from the
# repository root: the two synthetic hybrids written in the background while the GPU tests of the
# new kernels run, then per model (35b-a3b qwen35moe, 9b qwen35) one process of
# scripts/hybrid_decode_times.py: the queued per-kernel decode profile of default and of the new
# knobs, and tg128 (64-token prompt) of default against them (interleaved rounds).
# Output: $OUT/hdec/.
set -u -o pipefail
OUT=${OUT:-/tmp/out}/hdec; mkdir -p "$OUT" /tmp/models
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-100}))
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
git log --oneline -1 > "$OUT/commit.txt" 2> /dev/null
synth() {  # ARCH PRESET
    local f=/tmp/models/$1-$2.gguf
    [ -f "$f" ] || { python3 -m engine synth --arch $1 --preset $2 --out ${f%.gguf}.part.gguf \
        > "$OUT/synth_$2.log" 2>&1 && mv ${f%.gguf}.part.gguf "$f"; }
}
(synth qwen35moe 35b-a3b; synth qwen35 9b) &
SYN=$!
# the new kernels' GPU tests first, at most 15 s (18 of them took 6 s in the first call), while
# the files are written; validate config 18 passed on the tiny qwen35 / qwen35moe in the second
timeout 15 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
    tests/test_cuda_dn_conv.py -k "moe_down or (conv_fused and True)" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$? $(tail -1 "$OUT/pytest.log")"
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/pytest.log" | head -20 | cut -c1-300
run() {  # FILE DEADLINE (epoch s; no step starts after it); $PROF, $BENCH: the configs
    local f=$1 dl=$2
    while [ ! -f "$f" ] && kill -0 $SYN 2> /dev/null; do sleep 1; done
    [ -f "$f" ] || { echo "no $f"; return; }
    local t=$((dl - $(date +%s) + 12))  # (a load of the 35B alone is ~21 s)
    [ $t -gt 25 ] || { echo "no time for $f"; return; }
    timeout $t python3 scripts/hybrid_decode_times.py "$f" \
        --profile "$PROF" --bench "$BENCH" --prompt 64 --steps 3 --out "$OUT" --deadline $dl \
        2>&1 | tee "$OUT/$(basename $f .gguf).log" | head -150
}
PROF=default,hdec_all_rv_ws BENCH=default,hdec_all,hdec_all_rv_ws,hdec_all_rv_ws_t16 \
    run /tmp/models/qwen35moe-35b-a3b.gguf $((T0 + 55))
PROF=hdec_all BENCH=default,dn_nofba,dn_fconv,hdec_all \
    run /tmp/models/qwen35-9b.gguf $((END - 10))
wait $SYN 2> /dev/null
echo "total $(( $(date +%s) - T0 )) s"
