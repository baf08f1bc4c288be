#!/usr/bin/env bash
# A session's closing GPU call on two H200s (device kind nvidia-h200-x2), in two lanes so it
# fits one 10-minute command. Carry [".fleet", ".gl", ".whl", ".spv-cache"].
#   card 0: the fleet's decode study again (CUDA worker only; its promotion comes back in
#           promo.bundle) and the real A/A study (experiments/aa-decode.toml), then the
#           verifier on the 7B shape (mmvq and every CUDA planted bug).
#   card 1: the decode speed variants (scripts/device_speed.sh: bench, validate, profile), then
#           the CUDA suite (scripts/gpu_suite.py cuda: ops, mutants, device contract, fused
#           decode, hybrid kernels, PDL, backend) in the time left.
#   Then, on the card of the lane done first and if time is left: the hybrid 9b shape on CUDA
#   (validate, bench with a per-kernel profile).
# Everything is written under /tmp/all and packed into $OUT/all.tgz every 20 s and at the end (the
# call brings back at most 8 files): lane logs, fleet_logs.tgz, studies.db, promo.bundle,
# cal7b.json, hybrid.tgz, suite_cuda.json, the speed files.
#   bash scripts/device_all.sh
set -u -o pipefail
T0=$SECONDS
BACK=${OUT:-/tmp/out}; export OUT=/tmp/all; mkdir -p "$BACK" "$OUT" /tmp/site /tmp/models
export PYTHONUNBUFFERED=1
pack() { tar czf "$BACK/.all.tgz" -C "$OUT" . 2>/dev/null && mv "$BACK/.all.tgz" "$BACK/all.tgz"; }
( while sleep 20; do pack; done ) &
PACKER=$!
trap 'kill $PACKER 2> /dev/null; pack' EXIT  # an early exit must not leave the loop running
[ -d /tmp/site/ray ] || bash scripts/fleet_gpu.sh unpack || exit 1
MODELS="7b" source scripts/device_vulkan_env.sh || exit 1
export PYTHONPATH=/tmp/site:/tmp/vk:$PWD PATH=/tmp/site/bin:$PATH
( timeout 400 python3 -m engine synth --arch qwen35 --preset 9b --out /tmp/models/qwen35-9b.gguf \
    --json > "$OUT/synth_qwen35-9b.log" 2>&1 & )
stamp() { echo "[$(( SECONDS - T0 ))s] $*"; }
left() { echo $(( ${DEADLINE_S:-580} - (SECONDS - T0) )); }
upto() { local t=$(( $(left) - 5 )); [ $t -gt $1 ] && t=$1; [ $t -lt 1 ] && t=1; echo $t; }

# The hybrid 9b shape on CUDA, on the card of whichever lane is done first, in the time left.
hybrid() {
    mkdir /tmp/hybrid.lock 2> /dev/null || return 0
    local H=/tmp/hybrid f=/tmp/models/qwen35-9b.gguf card=$1
    mkdir -p $H
    for i in $(seq 120); do grep -q '"path"' "$OUT/synth_qwen35-9b.log" 2>/dev/null && break; sleep 1; done
    [ "$(left)" -gt 60 ] || { stamp "no time left for the hybrid 9b"; return 0; }
    CUDA_VISIBLE_DEVICES=$card timeout $(upto $(( $(left) / 2 ))) python3 -m engine validate --backend cuda \
        --no-promoted --model $f --steps 4 --json > $H/validate_cuda_9b.json 2> $H/validate_cuda_9b.err
    stamp "hybrid 9b validate (card $card) rc=$?"
    CUDA_VISIBLE_DEVICES=$card timeout $(upto 300) python3 -m engine bench --backend cuda \
        --no-promoted --model $f --prompt-tokens 512 --gen-tokens 128 --repeats 2 --profile \
        > $H/bench_cuda_9b.txt 2> $H/bench_cuda_9b.err
    stamp "hybrid 9b bench rc=$?"
    tar czf "$OUT/hybrid.tgz" -C $H .
}

lane0() {
    stamp "fleet (CUDA on card 0)"
    NODES=cuda:0 AGENT_TIMEOUT=200 bash scripts/fleet_gpu.sh run synthetic:1.5b \
        experiments/fleet-decode.toml experiments/aa-decode.toml > "$OUT/lane0_fleet.txt" 2>&1
    stamp "fleet rc=$?"
    wait_model 7b
    CUDA_VISIBLE_DEVICES=0 timeout $(upto 150) python3 scripts/verify_calibrate.py --backend cuda \
        --model /tmp/models/7b.gguf --prompt-lengths 1,5,37,70 --variants matmul_decode.mmvq \
        --mutants --out "$OUT/cal7b.json" > "$OUT/cal7b.txt" 2>&1
    stamp "7b verifier rc=$?"
    hybrid 0
}

lane1() {
    if [ -f scripts/device_speed.sh ]; then  # its GPU tests run in the suite below
        stamp "decode speed variants (card 1)"
        CUDA_VISIBLE_DEVICES=1 TESTS=0 BUDGET_S=190 timeout 200 bash scripts/device_speed.sh \
            > "$OUT/lane1_speed.txt" 2>&1
        stamp "speed rc=$?"
    fi
    stamp "CUDA suite (card 1)"
    CUDA_VISIBLE_DEVICES=1 timeout $(upto 400) python3 scripts/gpu_suite.py cuda \
        --test-timeout 90 --out "$OUT/suite_cuda.json" > "$OUT/suite_cuda.txt" \
        2> "$OUT/suite_cuda.log"
    stamp "CUDA suite rc=$?"
    hybrid 1
}

lane0 > "$OUT/lane0.txt" 2>&1 &
LANE0=$!
lane1 > "$OUT/lane1.txt" 2>&1
wait $LANE0  # not a bare wait: the packer loop never ends
cat "$OUT/lane0.txt" "$OUT/lane1.txt"
grep -E "experiment|trials;|best:|nothing accepted|promoted|overhead|^bench|^validate" \
    "$OUT/lane0_fleet.txt"
tail -12 "$OUT/cal7b.txt"
cat "$OUT/suite_cuda.txt"  # the per-file tally (the JSON of it: suite_cuda.json)
grep -hE "^(FAILED|ERROR)" "$OUT/suite_cuda.log" | head -20
[ -f "$OUT/lane1_speed.txt" ] && tail -30 "$OUT/lane1_speed.txt"
