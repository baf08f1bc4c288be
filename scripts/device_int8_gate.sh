#!/usr/bin/env bash
# The int8-activation decode and prefill paths (mmvq, mmvw, mmq8) against the verifier's gate on the
# realistic shapes, on the GPU machine in one call (nvidia-h200-x2: 1.5B on card 1 while 7B on
# card 0). Carry [".whl", ".gl", ".spv-cache"]. Each calibration rewrites its JSON after every
# candidate, so a call that runs out of time still returns what it measured.
#   bash scripts/device_int8_gate.sh   -> $OUT/cal_1.5b.json, $OUT/cal_7b.json, $OUT/int8_gate.log
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
MODELS="1.5b 7b" source scripts/device_vulkan_env.sh || exit 1
V=${VARIANTS:-matmul_decode.mmvq,matmul_decode.mmvw,matmul_prefill.mmq8}
cal() {  # card preset
    wait_model $2
    CUDA_VISIBLE_DEVICES=$1 timeout ${CAL_TIMEOUT:-400} python3 scripts/verify_calibrate.py \
        --backend cuda --model /tmp/models/$2.gguf --prompt-lengths 1,5,37,70 --variants $V \
        --out "$OUT/cal_$2.json" > "$OUT/cal_$2.txt" 2>&1
    echo "calibrate $2 rc=$?"
}
ncards=$(nvidia-smi -L | wc -l)
if [ "$ncards" -gt 1 ]; then cal 1 1.5b & cal 0 7b; wait; else cal 0 1.5b; cal 0 7b; fi
cat "$OUT"/cal_*.txt
