#!/usr/bin/env bash
# The GPU suites and the verifier's calibration on the GPU machine, in one call (device kind
# nvidia-h200-x2: the CUDA suite and calibration on card 0 while the Vulkan suite runs on card
# 1; on one card they run one after the other). Carry [".whl", ".gl", ".spv-cache"].
#   bash scripts/device_verify.sh        -> $OUT/verify_run.tgz (suite tallies, calibration JSON)
set -u -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
R=/tmp/verify_run; mkdir -p $R /tmp/models
MODELS="ragged 1.5b 7b" source scripts/device_vulkan_env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:/tmp/vk:$PWD
ncards=$(nvidia-smi -L | wc -l)
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader | tee $R/gpu.txt
vk_card=$(( ncards > 1 ? 1 : 0 ))
( FLEETTUNE_VK_DEVICE=$vk_card CUDA_VISIBLE_DEVICES=$vk_card timeout ${VK_TIMEOUT:-420} \
    python3 scripts/gpu_suite.py vulkan --json --test-timeout 60 > $R/suite_vulkan.json \
    2> $R/suite_vulkan.log ) &
vk=$!
[ "$ncards" -gt 1 ] || wait $vk
export CUDA_VISIBLE_DEVICES=0
timeout ${CUDA_TIMEOUT:-300} python3 scripts/gpu_suite.py cuda --json --test-timeout 60 \
    > $R/suite_cuda.json 2> $R/suite_cuda.log
echo "cuda suite rc=$?"
C="python3 scripts/verify_calibrate.py --backend cuda"
wait_model ragged
timeout 120 $C --model /tmp/models/ragged.gguf --cross-check --mutants --json > $R/cal_ragged.json \
    2> $R/cal_ragged.err; echo "calibrate ragged rc=$?"
for p in 1.5b 7b; do
  wait_model $p
  timeout 150 $C --model /tmp/models/$p.gguf --prompt-lengths 1,5,37,70 --json \
      --variants matmul_decode.dmmv,matmul_decode.mmvq,matmul_prefill.staged,matmul_prefill.mmq8,matmul_prefill.mmq \
      > $R/cal_$p.json 2> $R/cal_$p.err
  echo "calibrate $p rc=$?"
done
wait $vk; echo "vulkan suite done"
for s in cuda vulkan; do python3 - $R/suite_$s.json <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[1], "unreadable:", e); sys.exit()
print(d["suite"], "total", d["total"])
for f in d["files"]:
    print(" ", f["file"], {k: f[k] for k in ("passed", "failed", "errors", "skipped", "processes")})
    for x in f["faults"]:
        print("    fault:", x["test"], x["error"])
PY
done
grep -hE "^(FAILED|ERROR)" $R/suite_*.log | head -30
tar czf $OUT/verify_run.tgz -C $R .
