#!/usr/bin/env bash
# Op-level replay on the H200 (the replay helper's checkpoint; docs/verify.md): the 9B-like qwen35
# synth's int8 decode (mmvw) validated with replay, per-op results and timing; on the tiny
# hybrids the configs the H200 rejected before replay (tests/test_cuda_hybrid.py, configs 12/13)
# and the seed's S^T k bug planted beside int8 (DELTA_NET_SK), which replay must reject naming
# delta_net. Writes $OUT/replay/. BUDGET_S (default 98) bounds the whole run.
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/replay" /tmp/models
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-98}))
left() { echo $((END - $(date +%s))); }
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
git log --oneline -1 > "$OUT/replay/commit.txt" 2>/dev/null
M9=/tmp/models/qwen35-9b.gguf
if [ ! -f "$M9" ]; then  # CPU work beside the GPU tests below
    ( timeout 80 python3 -m engine synth --arch qwen35 --preset 9b --out /tmp/models/replay9b.part.gguf \
        --json > "$OUT/replay/synth.log" 2>&1 && mv /tmp/models/replay9b.part.gguf "$M9" ) &
fi
# tiny hybrids: the formerly rejected int8 configs now pass; S^T k beside int8 fails replay
timeout 42 python3 -m pytest -q -m gpu -p no:cacheprovider -rfE --tb=short tests/test_cuda_hybrid.py \
    -k "(validate_passes_hybrid_knobs and (12 or 13)) or planted_sk" > "$OUT/replay/pytest.log" 2>&1
echo "pytest rc=$? $(tail -1 "$OUT/replay/pytest.log") ($(( $(date +%s) - T0 )) s)"
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/replay/pytest.log" | cut -c1-400 | head -20
python3 -m engine synth --arch qwen35 --preset tiny --out /tmp/replay_tiny.gguf > /dev/null 2>&1
INT8="matmul_decode.variant=mmvw,matmul_prefill.variant=mmq8,prefill.gemm_min_t=2,prefill.chunk_tokens=8"
timeout 20 python3 scripts/device_replay.py /tmp/replay_tiny.gguf --flat "$INT8" --mutant DELTA_NET_SK \
    --prompts 3 --no-edges --name tiny_sk_int8 2>&1 | tail -12
timeout 15 python3 scripts/device_replay.py /tmp/replay_tiny.gguf --flat "$INT8" --prompts 3 \
    --no-edges --name tiny_int8 2>&1 | tail -6
while [ ! -f "$M9" ] && [ "$(left)" -gt 30 ] && jobs %1 > /dev/null 2>&1; do sleep 1; done
[ -f "$M9" ] || { echo "no 9B file in time ($(cat "$OUT/replay/synth.log" 2>/dev/null | tail -2))"; exit 0; }
echo "9B ready at $(( $(date +%s) - T0 )) s"
timeout $(( $(left) - 2 )) python3 scripts/device_replay.py "$M9" --flat matmul_decode.variant=mmvw \
    --prompts 2 --no-edges --steps 4 --name 9b_mmvw 2>&1 | tail -14
echo "done at $(( $(date +%s) - T0 )) s"
