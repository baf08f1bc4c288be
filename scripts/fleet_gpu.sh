#!/usr/bin/env bash
# The fleet on one GPU machine of two H200s (device kind nvidia-h200-x2): a Ray head, one node per
# card (CUDA on card 0, Vulkan through the NVIDIA driver on card 1: two device classes, h200 and
# nvidia-h200), the agent as a driver on the head, promotions committed into a clone of this
# repository; then a fresh process re-measures each promoted config against the registry
# default and validates it. Nothing downloads there, and a call carries at most 64 MiB, so Ray's
# wheel travels in two calls made back to back (the machine keeps /root for 30 s between them).
#
#   bash scripts/fleet_gpu.sh prepare            # here: .fleet/a, .fleet/b (wheels, ray split in
#                                                #   two), .fleet/a/main.bundle; plus .whl .gl .spv-cache
#   bash scripts/fleet_gpu.sh stage              # call 1 (carry .fleet/a): keeps part one in /root
#   bash scripts/fleet_gpu.sh run MODEL EXP...   # call 2 (carry .fleet/b .whl .gl .spv-cache)
#
# run: MODEL is an agent model reference (e.g. synthetic:1.5b); each EXP an experiment file run
# with BUDGET trials per study (default 12). $OUT gets studies.db (the Optuna storage: read it
# here with `python -m agent dashboard --storage sqlite:///...`), promo.bundle (the promotion
# commits: `git fetch .device/N/promo.bundle main:fleet-promo`), fleet.json (the agent's summaries
# and the fresh-process bench/validate figures) and fleet_logs.tgz.
set -u -o pipefail
OUT=${OUT:-/tmp/out}
RAYWHL=ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
case "${1:-}" in
prepare)
    P="--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    mkdir -p .fleet/dl .fleet/a .fleet/b
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp $P -d .fleet/dl ray==2.60.0 optuna==5.0.0 sqlalchemy==2.1.9 \
        alembic==1.20.1 colorlog==6.12.0 cmaes==0.13.1 jsonschema==4.26.0 referencing==0.37.0 \
        rpds-py==2026.9.1 jsonschema-specifications==2025.9.1 mako==1.4.3 greenlet==3.5.6 \
        tomli-w scipy
    rm -f .fleet/a/* .fleet/b/*
    split -n 2 -d .fleet/dl/$RAYWHL .fleet/part-
    mv .fleet/part-00 .fleet/a/ray.part-00 && mv .fleet/part-01 .fleet/b/ray.part-01
    find .fleet/dl -name '*.whl' ! -name 'ray-*' ! -name 'scipy-*' -exec cp {} .fleet/a/ \;
    git bundle create .fleet/a/main.bundle main
    du -sh .fleet/a .fleet/b ;;
stage)
    mkdir -p /root/fleet && cp .fleet/a/* /root/fleet/ && ls -la /root/fleet
    git --version ;;
run)
    shift
    MODEL=${1:?model}; shift
    mkdir -p "$OUT" /root/fleet/logs
    cat /root/fleet/ray.part-00 .fleet/b/ray.part-01 > /root/fleet/$RAYWHL
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
        /root/fleet/*.whl .whl/*.whl || exit 1
    MODELS="" source scripts/device_vulkan_env.sh || exit 1
    export PYTHONPATH=/tmp/site:/tmp/vk:$PWD PATH=/tmp/site/bin:$PATH RAY_AUTH_MODE=disabled
    export FLEETTUNE_CACHE=/root/fleet/cache
    rm -rf /root/promo && git clone -q /root/fleet/main.bundle /root/promo -b main
    git -C /root/promo config user.name "fleettune agent" && git -C /root/promo config user.email agent@fleettune
    L=/root/fleet/logs
    ray start --head --port 6379 --num-gpus 0 --include-dashboard=false > $L/head.log 2>&1 || { cat $L/head.log; exit 1; }
    CUDA_VISIBLE_DEVICES=0 python3 -m worker start --address 127.0.0.1:6379 --backends cuda \
        --auth-mode disabled > $L/node_cuda.log 2>&1 || { cat $L/node_cuda.log; exit 1; }
    FLEETTUNE_VK_DEVICE=1 CUDA_VISIBLE_DEVICES=1 python3 -m worker start --address 127.0.0.1:6379 \
        --backends vulkan --auth-mode disabled > $L/node_vulkan.log 2>&1 || { cat $L/node_vulkan.log; exit 1; }
    ray status 2>&1 | tee $L/ray_status.txt | grep -E "device:|GPU" || true
    python3 -c "import sys; from worker.models import resolve_model; print(resolve_model(sys.argv[1]))" "$MODEL"
    for exp in "$@"; do
        name=$(basename "$exp" .toml)
        echo "== agent run $exp ($MODEL, budget ${BUDGET:-12})"
        timeout ${AGENT_TIMEOUT:-300} python3 -m agent run "$exp" --address 127.0.0.1:6379 \
            --storage sqlite:////root/fleet/studies.db --promote-repo /root/promo \
            --budget ${BUDGET:-12} --json > $L/agent_$name.json 2> $L/agent_$name.log
        echo "agent rc=$?"; tail -5 $L/agent_$name.log
    done
    ray stop --force > /dev/null 2>&1
    git -C /root/promo log --format='%h %s' -5 | tee $L/promotions.txt
    cp -r /root/promo/configs/. configs/ 2>/dev/null
    M=$(python3 -c "import sys; from worker.models import resolve_model; print(resolve_model(sys.argv[1]))" "$MODEL")
    for be in cuda vulkan; do
        [ "$be" = vulkan ] && export FLEETTUNE_VK_DEVICE=1
        for promoted in --no-promoted ""; do
            tag=${promoted:+default}; tag=${tag:-promoted}
            timeout 120 python3 -m engine bench --backend $be --model $M $promoted --prompt-tokens 512 \
                --gen-tokens 128 --repeats 3 --json > $L/bench_${be}_$tag.json 2> $L/bench_${be}_$tag.err
            echo "bench $be $tag rc=$?"
        done
        timeout 120 python3 -m engine validate --backend $be --model $M --json \
            > $L/validate_${be}_promoted.json 2> $L/validate_${be}_promoted.err
        echo "validate $be promoted rc=$?"
    done
    cp /root/fleet/studies.db "$OUT/"
    git -C /root/promo bundle create "$OUT/promo.bundle" main
    tar czf "$OUT/fleet_logs.tgz" -C /root/fleet logs ;;
*)
    sed -n 2,20p "$0"; exit 2 ;;
esac
