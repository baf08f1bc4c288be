#!/usr/bin/env bash
# Op-level replay on the H200 (the replay helper's checkpoint; docs/verify.md): the 9B-like qwen35
# synth's int8 decode (mmvw) validated with replay, per-op results and timing (validate without
# replay, with it, and again with the recordings cached); on the tiny qwen35 the seed's S^T k bug
# planted beside int8 (DELTA_NET_SK), which replay must reject naming delta_net, and the GPU tests
# of the configs rejected before replay (configs 12/13) if time is left. Writes $OUT/replay/.
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/replay" /tmp/models
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-98}))
left() { echo $((END - $(date +%s))); }
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
git log --oneline -1 > "$OUT/replay/commit.txt" 2>/dev/null
M9=/tmp/models/qwen35-9b.gguf
nine() {
    echo "9B at $(( $(date +%s) - T0 )) s"
    timeout $(( $(left) - 2 )) python3 scripts/device_replay.py "$M9" --flat matmul_decode.variant=mmvw \
        --prompts 2 --no-edges --steps 4 --again --name 9b_mmvw 2>&1 | tail -14
}
if [ -f "$M9" ]; then nine; fi
[ -f "$M9" ] || ( timeout 80 python3 -m engine synth --arch qwen35 --preset 9b \
    --out /tmp/models/replay9b.part.gguf --json > "$OUT/replay/synth.log" 2>&1 \
    && mv /tmp/models/replay9b.part.gguf "$M9" ) &
python3 -m engine synth --arch qwen35 --preset tiny --out /tmp/replay_tiny.gguf > /dev/null 2>&1
INT8="matmul_decode.variant=mmvw,matmul_prefill.variant=mmq8,prefill.gemm_min_t=2,prefill.chunk_tokens=8"
[ "$(left)" -gt 40 ] && timeout 40 python3 scripts/device_replay.py /tmp/replay_tiny.gguf --flat "$INT8" \
    --mutant DELTA_NET_SK --prompts 3 --no-edges --name tiny_sk_int8 2>&1 | tail -12
[ "$(left)" -gt 30 ] && timeout $(( $(left) - 2 )) python3 -m pytest -q -m gpu -p no:cacheprovider -rfE \
    --tb=line tests/test_cuda_hybrid.py -k "(validate_passes_hybrid_knobs and 12 and qwen35) or planted_sk" \
    > "$OUT/replay/pytest.log" 2>&1; echo "pytest $(tail -1 "$OUT/replay/pytest.log")"
grep -E "^(FAILED|ERROR)" "$OUT/replay/pytest.log" | cut -c1-300 | head -8
echo "done at $(( $(date +%s) - T0 )) s"
