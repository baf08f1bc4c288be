#!/usr/bin/env bash
# A session's closing GPU work on two H200s (device kind nvidia-h200-x2), in two calls made back
# to back (a warm machine keeps /root/llama-bench, /tmp/models and /tmp/site for the second):
#
#   bash scripts/device_closing.sh suites   carry .fleet .gl .whl .spv-cache .llcpp.tgz and
#                                           LLAMA_SH (../shared/device/llama-bench.sh, copied in)
#     CPUs:   llama.cpp's llama-bench built in the background (LLAMA_SH build)
#     models: qwen2 1.5b / 7b, qwen35 9b, qwen35moe 35b-a3b synthesised in the background
#     card 0: the fleet on FLEET_MODEL (default the hybrid 9B; CUDA worker, FLEET_EXP), promotion
#             in promo.bundle;
#             then the CUDA suite's hybrid file
#     card 1: the CUDA suite but its hybrid file (scripts/gpu_suite.py cuda --skip hybrid), then
#             the Vulkan GPU tests of the new shaders (VK_TESTS)
#   bash scripts/device_closing.sh bench    carry .gl .whl .spv-cache
#     card 0: qwen2 1.5b and 7b: llama-bench, then ours on CUDA (scripts/device_speed.py:
#             DENSE variants, validate and profile of the best), then ours on Vulkan
#     card 1: the hybrids 9b and 35b-a3b (scripts/device_hybrid_bench.sh: llama-bench, ours)
#   One benchmark at a time per card; the two cards run side by side.
#
# Everything lands under /tmp/closing and is packed into $OUT/closing_<mode>.tgz every 20 s and at
# the end (a call brings back at most 8 files). Every step is bounded by the call's DEADLINE_S.
set -u -o pipefail
MODE=${1:?suites or bench}
T0=$SECONDS
BACK=${OUT:-/tmp/out}; export OUT=/tmp/closing/$MODE; mkdir -p "$BACK" "$OUT" /tmp/site /tmp/models
export PYTHONUNBUFFERED=1
pack() { tar czf "$BACK/.c.tgz" -C "$OUT" . 2>/dev/null && mv "$BACK/.c.tgz" "$BACK/closing_$MODE.tgz"; }
( while sleep 20; do pack; done ) &
PACKER=$!
trap 'kill $PACKER 2> /dev/null; pack' EXIT
stamp() { echo "[$(( SECONDS - T0 ))s] $*" | tee -a "$OUT/lanes.txt"; }
left() { echo $(( ${DEADLINE_S:-560} - (SECONDS - T0) )); }
upto() { local t=$(( $(left) - 5 )); [ $t -gt $1 ] && t=$1; [ $t -lt 1 ] && t=1; echo $t; }
python3 -c "import gguf" 2> /dev/null || PYTHONPATH= python3 -m pip install -q --no-index \
    --no-deps --no-compile --target /tmp/site .whl/*.whl
MODELS="" source scripts/device_vulkan_env.sh || exit 1
export PYTHONPATH=/tmp/site:/tmp/vk:$PWD PATH=/tmp/site/bin:$PATH
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt"
git log --oneline -1 > "$OUT/commit.txt" 2> /dev/null
synth() {  # ARCH PRESET: /tmp/models/<preset>.gguf (qwen2) or <arch>-<preset>.gguf, once a machine
    local f=/tmp/models/$2.gguf; [ $1 = qwen2 ] || f=/tmp/models/$1-$2.gguf
    [ -f $f ] && return 0
    python3 -m engine synth --arch $1 --preset $2 --out $f.part --json > "$OUT/synth_$2.log" 2>&1 \
        && mv $f.part $f
}

suites() {
    ( [ -x /root/llama-bench/bin/llama-bench ] || nice -n 5 bash "${LLAMA_SH:-.dev/llama-bench.sh}" \
        build > "$OUT/llama_build.log" 2>&1; stamp "llama build rc=$?" ) &
    ( synth qwen2 1.5b; synth qwen2 7b; synth qwen35 9b; synth qwen35moe 35b-a3b
      stamp "models: $(ls /tmp/models | tr '\n' ' ')" ) &
    [ -d /tmp/site/ray ] || bash scripts/fleet_gpu.sh unpack || exit 1
    lane1() {
        stamp "card 1: CUDA suite but hybrid"
        CUDA_VISIBLE_DEVICES=1 timeout $(upto 480) python3 scripts/gpu_suite.py cuda --skip hybrid \
            --test-timeout 90 --out "$OUT/suite_cuda.json" > "$OUT/suite_cuda.txt" \
            2> "$OUT/suite_cuda.log"
        stamp "card 1: CUDA suite rc=$?"
        FLEETTUNE_VK_DEVICE=1 timeout $(upto 200) python3 -m pytest -q -p no:cacheprovider -rfE \
            --tb=short -m "gpu or not gpu" $VK_TESTS > "$OUT/pytest_vulkan_new.log" 2>&1
        stamp "card 1: Vulkan new-shader tests rc=$? ($(tail -1 "$OUT/pytest_vulkan_new.log"))"
    }
    lane0() {
        stamp "card 0: fleet on $FLEET_MODEL ($FLEET_EXP)"
        NODES="cuda:0" VALIDATE_PROMOTED=0 AGENT_TIMEOUT=$(upto ${FLEET_S:-200}) timeout $(upto 300) \
            bash scripts/fleet_gpu.sh run $FLEET_MODEL $FLEET_EXP > "$OUT/fleet.txt" 2>&1
        stamp "card 0: fleet rc=$?"
        CUDA_VISIBLE_DEVICES=0 timeout $(upto 240) python3 scripts/gpu_suite.py cuda --only hybrid \
            --test-timeout 90 --out "$OUT/suite_cuda_hybrid.json" > "$OUT/suite_cuda_hybrid.txt" \
            2> "$OUT/suite_cuda_hybrid.log"
        stamp "card 0: CUDA hybrid suite rc=$?"
    }
    lane0 & L0=$!
    lane1 & L1=$!
    wait $L0 $L1
    cat "$OUT/suite_cuda.txt" "$OUT/suite_cuda_hybrid.txt" 2> /dev/null
    grep -hE "^(FAILED|ERROR)" "$OUT"/suite_cuda*.log | head -30
}

bench() {
    LB=/root/llama-bench/bin/llama-bench
    [ -x $LB ] || stamp "no llama-bench build on this machine: ours only"
    dense() {
        for p in 1.5b 7b; do
            synth qwen2 $p
            [ -x $LB ] && CUDA_VISIBLE_DEVICES=0 timeout $(upto 60) $LB -m /tmp/models/$p.gguf \
                -p 512 -n 128 -fa 1 -r 5 -o json > "$OUT/llama_$p.json" 2> "$OUT/llama_$p.err"
            stamp "card 0: llama-bench $p rc=$?"
            local share=$(( ($(left) - 130) / 2 )); [ $p = 7b ] && share=$(( $(left) - 130 ))
            CUDA_VISIBLE_DEVICES=0 timeout $(upto $(( share + 10 ))) python3 scripts/device_speed.py \
                /tmp/models/$p.gguf --bench "$DENSE" --validate "$DENSE_VALIDATE" \
                --profile "$DENSE_PROFILE" --validate-after 99 --profile-early --repeats 3 \
                --deadline $(( $(date +%s) + share )) --out "$OUT" > "$OUT/speed_$p.log" 2>&1
            stamp "card 0: ours CUDA $p rc=$?"
        done
        # Vulkan on the same card: the registry default, the tensor-core prefill (coopmat GEMM +
        # flash attention) and the int8 decode with every fusion (vkdec's mmvw_epi)
        printf 'backend = "vulkan"\n' > /tmp/vk_default.toml
        printf 'backend = "vulkan"\n[ops.matmul_prefill]\nvariant = "coopmat"\n[ops.attention]\nvariant = "coopmat"\n' \
            > /tmp/vk_coopmat.toml
        printf 'backend = "vulkan"\n[ops.matmul_decode]\nvariant = "mmvw"\nfuse_rope = 1\n[ops.rope]\nfuse_kv = 1\n[ops.attention]\nvariant = "split"\nfuse_combine = 1\n' \
            > /tmp/vk_mmvw_epi.toml
        for p in 1.5b 7b; do
            for v in ${VK_DENSE:-default coopmat mmvw_epi}; do
                FLEETTUNE_VK_DEVICE=0 timeout $(upto 45) python3 -m engine bench --backend vulkan \
                    --no-promoted --model /tmp/models/$p.gguf --config /tmp/vk_$v.toml \
                    --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json \
                    > "$OUT/vk_${p}_$v.json" 2> "$OUT/vk_${p}_$v.err"
                stamp "card 0: ours Vulkan $p $v rc=$?"
            done
        done
    }
    hybrid() {
        CUDA_VISIBLE_DEVICES=1 BUDGET_S=$(upto 500) timeout $(upto 510) \
            bash scripts/device_hybrid_bench.sh > "$OUT/hybrid.log" 2>&1
        stamp "card 1: hybrid rc=$?"
    }
    dense & L0=$!
    hybrid & L1=$!
    wait $L0 $L1
    grep -hE "bench|validate|profile" "$OUT"/speed_*.log | cut -c1-200
    tail -20 "$OUT/hybrid.log"
}

case $MODE in
suites) FLEET_EXP=${FLEET_EXP:-experiments/hybrid-9b.toml} FLEET_MODEL=${FLEET_MODEL:-synthetic:9b:qwen35}
        VK_TESTS=${VK_TESTS:-tests/test_vulkan_coopmat.py tests/test_vulkan_mmvw.py}; suites ;;
bench) DENSE=${DENSE:-default,mmvw_all,ptc_tc_mmvw_all}; DENSE_VALIDATE=${DENSE_VALIDATE:-ptc_tc_mmvw_all}
       DENSE_PROFILE=${DENSE_PROFILE:-ptc_tc_mmvw_all}; bench ;;
*) sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2 ;;
esac
stamp "done"
