#!/usr/bin/env bash
# Helper dn's GPU checkpoint (issue 15: the delta-net decode step as a thread-block cluster per K
# head, delta_net.step_cluster, shaders/cuda/dn_clu.cu), ~100 s on one H200, from the repository
# root. The 35B-A3B synth and the kernels' compiles start at once (CPU), then:
#   1. scripts/bench_dn_step.py: us per call of the 35B's delta-net decode step, the ticket kernel
#      (delta_net_conv_step, the default) against the cluster configs, each checked against NumPy;
#   2. scripts/hybrid_decode_times.py on the 35B synth (16-token prompt, tg64 as the experiment's
#      objective): the queued per-kernel profile of dn_c4 (rb_tk_split_pre's: early8/h35.log)
#      and tg of rb_tk_split_pre against dn_c4 / dn_c2
#      (rb_tk_split_pre + the cluster step), interleaved rounds; during its model load
#      (GPU idle) the cluster step's GPU tests on the 35B's heads and a ragged shape.
# Output: $OUT/dn/.
set -u -o pipefail
OUT=${OUT:-/tmp/out}/dn; mkdir -p "$OUT" /tmp/models
T0=$(date +%s); END=$((T0 + ${BUDGET_S:-100}))
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
git log --oneline -1 > "$OUT/commit.txt" 2> /dev/null
F=/tmp/models/35b.gguf
# (niced: the compiles below come first, the bench waits on them)
( [ -f $F ] || { nice -n 19 python3 -m engine synth --arch qwen35moe --preset 35b-a3b \
    --out /tmp/models/35b.part.gguf > "$OUT/synth.log" 2>&1 && mv /tmp/models/35b.part.gguf $F; } ) &
SYN=$!
# every module the runs below build: rb_tk_split_pre and the cluster configs, and the tests'
python3 - > /tmp/dn_cfgs.json << 'EOF'
import json
from scripts.device_hybrid_bench import VARIANTS
fl = [VARIANTS[v] for v in ("rb_tk_split_pre", "dn_c4", "dn_c2", "dn_c4_l16")]
fl += [{"delta_net.step_cluster": 2}]
for n, lanes, mdk in ((2, 8, 128), (4, 8, 128), (4, 16, 128)):
    for t in (False, True):
        base = {"delta_net.max_dk": mdk, "delta_net.state_transposed": t, "delta_net.step_lanes": lanes}
        fl += [base | {"delta_net.step_cluster": n}, base]
print(json.dumps(fl))
EOF
for i in 0 1 2 3 4 5 6 7; do
    timeout 40 python3 scripts/cuda_precompile.py /tmp/dn_cfgs.json --part $i/8 \
        > "$OUT/precompile_$i.log" 2>&1 &
    PRE="${PRE:-} $!"
done
wait $PRE
echo "precompiled at $(( $(date +%s) - T0 )) s: $(cat "$OUT"/precompile_*.log | tr '\n' ' ')"
timeout 20 python3 scripts/bench_dn_step.py --check \
    --configs tickets,c4_l8,c2_l8,c4_l16,c4_l8_pdl 2>&1 | tee "$OUT/bench_dn_step.log"
echo "bench_dn_step at $(( $(date +%s) - T0 )) s"
while [ ! -f $F ] && kill -0 $SYN 2> /dev/null; do sleep 1; done
[ -f $F ] || { echo "no $F: $(tail -3 "$OUT/synth.log")"; }
echo "synth at $(( $(date +%s) - T0 )) s"
if [ -f $F ]; then
    timeout $((END - $(date +%s) - 2)) python3 scripts/hybrid_decode_times.py $F \
        --profile dn_c4 --bench rb_tk_split_pre,dn_c4,dn_c2 \
        --prompt 16 --gen 64 --steps 3 --rounds 2 --out "$OUT" --deadline $((END - 6)) \
        > "$OUT/h35.log" 2>&1 &
    H35=$!
    # the GPU tests while the model loads (~20 s of disk and host work)
    timeout 20 python3 -m pytest -x -q -m gpu -p no:cacheprovider -rfE --tb=short \
        tests/test_cuda_dn_clu.py -k "reference_and_the_ticket and (16-32 or 3-3)" \
        > "$OUT/pytest.log" 2>&1
    echo "pytest rc=$? $(tail -1 "$OUT/pytest.log")"
    grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/pytest.log" | head -20 | cut -c1-300
    wait $H35
    echo "h35 rc=$?"
    cat "$OUT/h35.log" | head -80
fi
kill $SYN 2> /dev/null
echo "total $(( $(date +%s) - T0 )) s"
