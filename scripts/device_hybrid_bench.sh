#!/usr/bin/env bash
# Issue 15 on the H200 (CUDA): the Qwen3.5-9B-like (qwen35 9b) and Qwen3.5-35B-A3B-like
# (qwen35moe 35b-a3b) synthetic files, llama.cpp's llama-bench and `engine bench` on the same
# files, one benchmark at a time, then the per-phase profile and (time left) validate.
# Run from the repository root on the GPU machine (tool `run`, carry [".whl", ".llcpp.tgz"]):
#   bash scripts/device_hybrid_bench.sh synth &     # optional: write the files meanwhile
#   bash ../shared/device/llama-bench.sh build      # ~5-6 min, kept while the machine is warm
#   BUDGET_S=240 bash scripts/device_hybrid_bench.sh
# Order (the deadline cuts from the end): per shape (9b, then 35b-a3b) llama-bench pp512/tg128,
# then ours in one process: bench default, mmvw (projections three to an int8 launch), mmvw_pdl,
# scan_pf4 (the scan's token prefetch), fast (mmvw + prefetch 4 + tc experts at prefill),
# fast_q8 (fast with moe_experts.mmvq's int8 experts), then the per-phase profiles (default,
# fast); last, validate of default and fast on the 9b (a NumPy reference of a 9B: minutes). All
# lands in $OUT as it comes: llama_<shape>.json, hybrid_<file>[_validate].json (rewritten per step),
# ours_<shape>.log, summary.txt.
#   VARIANTS=default,mmvw,mmvw_pdl,scan_pf4,fast,fast_q8 PROFILE=default,fast VALIDATE=default,fast SHAPES="9b 35b-a3b"
#   BACKEND=numpy SHAPES=tiny: a dry run of the flow on a CPU (tiny: the qwen35moe tiny preset)
#   TESTS=1 first runs the hybrid GPU tests of issue 15's speed work (TESTS_S, default 150 s):
#   int8 decode against its emulation, validate of the fast configs, prefetch, moe mmvq, PDL;
#   TESTS_ONLY=1 stops after them
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/models
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-240}))
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
LB=${LLAMA_BENCH_BUILD:-/root/llama-bench}/bin/llama-bench
SHAPES=${SHAPES:-9b 35b-a3b}
left() { echo $((END - $(date +%s))); }
arch() { [ "$1" = 9b ] && echo qwen35 || echo qwen35moe; }
file() { echo /tmp/models/$(arch $1)-$1.gguf; }
synth() {  # SHAPE: once per warm machine; a .part file renamed when whole
    local f; f=$(file $1)
    [ -f "$f" ] && return 0
    local t=$(date +%s)
    python3 -m engine synth --arch $(arch $1) --preset $1 --out ${f%.gguf}.part.gguf --json \
        > "$OUT/synth_$1.log" 2>&1 && mv ${f%.gguf}.part.gguf "$f"
    echo "synth $1 rc=$? $(( $(date +%s) - t )) s $(du -h "$f" 2>/dev/null | cut -f1)" \
        | tee -a "$OUT/summary.txt"
}
if [ "${1:-}" = synth ]; then for s in $SHAPES; do synth $s; done; exit 0; fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
git log --oneline -1 > "$OUT/commit.txt" 2>/dev/null
if [ "${TESTS:-0}" = 1 ]; then  # (the files' synth, if started with `synth &`, runs meanwhile)
    timeout ${TESTS_S:-150} python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short \
        tests/test_cuda_hybrid.py -k "int8_decode or prefetch or moe_q8 or mmvw_fused or ssm_conv or \
        pdl_chains or (validate_passes_hybrid_knobs and (11 or 12 or 13 or 14 or 15))" \
        > "$OUT/pytest_hybrid.log" 2>&1
    echo "pytest rc=$? $(tail -1 "$OUT/pytest_hybrid.log")" | tee -a "$OUT/summary.txt"
    grep -E "^(FAILED|ERROR)" "$OUT/pytest_hybrid.log" | cut -c1-600 | tee -a "$OUT/summary.txt"
    [ "${TESTS_ONLY:-0}" = 1 ] && exit 0
fi
for s in $SHAPES; do  # a synth started by `synth &` is waited for, not repeated
    while [ ! -f "$(file $s)" ] && pgrep -f "preset $s --out" > /dev/null; do sleep 1; done
    synth $s
done
ours() {  # SHAPE ARGS...: device_hybrid_bench.py in one process, within the deadline
    local t=$(( $(left) - 5 ))
    [ $t -gt 20 ] || { echo "no time for ours $*" | tee -a "$OUT/summary.txt"; return; }
    timeout $t python3 scripts/device_hybrid_bench.py "$(file $1)" --out "$OUT" \
        ${BACKEND:+--backend $BACKEND} --deadline $((END - 10)) "${@:2}" 2>&1 | tee -a "$OUT/ours_$1.log" \
        | tee -a "$OUT/summary.txt"
}
for s in $SHAPES; do
    [ -f "$(file $s)" ] || { echo "no file for $s" | tee -a "$OUT/summary.txt"; continue; }
    if [ -x "$LB" ] && [ "$(left)" -gt 40 ]; then
        timeout $(( $(left) - 20 )) "$LB" -m "$(file $s)" -p 512 -n 128 -fa 1 -r 3 -o json \
            > "$OUT/llama_$s.json" 2> "$OUT/llama_$s.err"
        echo "llama-bench $s rc=$?" | tee -a "$OUT/summary.txt"
        python3 - "$OUT/llama_$s.json" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
try:
    for r in json.load(open(sys.argv[1])):
        kind = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
        print(f"  llama.cpp {r.get('model_type', '')}: {kind} {r['avg_ts']:.1f} tok/s")
except Exception as e:  # noqa: BLE001
    print(f"  llama-bench output unreadable: {e}")
EOF
    else
        echo "llama-bench $s skipped (no $LB or no time)" | tee -a "$OUT/summary.txt"
    fi
    ours $s --bench ${VARIANTS:-default,mmvw,mmvw_pdl,scan_pf4,fast,fast_q8} \
        --profile ${PROFILE:-default,fast} --repeats 2
done
case " $SHAPES " in *" 9b "*)
    ours 9b --bench "" --profile "" --validate ${VALIDATE:-default,fast} --tag _validate ;;
esac
echo "total $(( $(date +%s) - T0 )) s" | tee -a "$OUT/summary.txt"
