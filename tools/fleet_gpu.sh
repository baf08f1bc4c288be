#!/usr/bin/env bash
# The fleet on one GPU machine of two H200s (device kind nvidia-h200-x2): a Ray head, one node per
# card (CUDA on card 0, Vulkan through the NVIDIA driver on card 1: two device classes, h200 and
# nvidia-h200), the agent as a driver on the head, promotions committed into a clone of this
# repository; then a fresh process re-measures the promoted configs against the registry
# defaults and validates them. Nothing downloads there and a call carries at most 64 MiB, so the
# Python packages travel pre-installed for Python 3.12 in one tarball (Ray without its Java jars
# and its libraries: 48 MB).
#
#   bash tools/fleet_gpu.sh prepare          # here: .fleet/site.txz, .fleet/main.bundle
#   bash tools/fleet_gpu.sh run MODEL EXP... # there (carry .fleet .gl .spv-cache)
#   bash tools/fleet_gpu.sh scaling MODEL EXP TRIALS   # there: 1 then 2 CUDA workers
#   bash tools/fleet_gpu.sh unpack           # there: only the site into /tmp/site
#   bash tools/fleet_gpu.sh gpu-tests [SUITE [ARGS...]]  # there (carry .fleet): tools/gpu_suite.py
#                       # SUITE (default cuda) ARGS (e.g. --skip cuda_ops,test_mutants), tally in $OUT/gpu_suite.json
#   bash tools/fleet_gpu.sh proof EXP PRESET...  # there (carry .fleet .llcpp.tgz): issue 28's
#                                               # proof on one GPU, llama.cpp beside it
#
# run: NODES (default "cuda:0 vulkan:1") says which backend serves which card;
# AGENT_ARGS: more `agent run` flags (e.g. "--budget 6 --wall-time 300", so the agent ends
# itself, decides and promotes inside the call; AGENT_TIMEOUT's SIGTERM, if it comes first,
# records the trials in flight interrupted and still promotes an accepted best); VALIDATE_PROMOTED=0 skips the fresh-process
# validate (minutes for a 9B's NumPy reference). MODEL is an agent model reference (e.g. synthetic:1.5b) resolved once before the workers
# start; each EXP an experiment file (its budget.wall_time_s should end it inside the call).
# $OUT gets studies.db (the Optuna storage: `python -m agent dashboard --storage
# sqlite:///.device/N/studies.db`), promo.bundle (the agent's promotion commits:
# `git fetch .device/N/promo.bundle main:fleet-promo`) and fleet_logs.tgz (agent summaries,
# the fresh-process bench and validate JSON), each written as soon as it exists.
# scaling: the same experiment (its CUDA studies) for TRIALS trials with one CUDA worker (card 0),
# then a fresh study with two (cards 0 and 1, one device class): trials per hour of each, in
# $OUT/scaling.txt and $OUT/scaling_logs.tgz; only the two-worker run promotes.
# proof: on one GPU, in one call: `engine synth` each PRESET (1.5b, 7b), one `agent run --local`
# of EXP per model from the registry defaults (the clone it promotes into has its configs/
# emptied first, so the baseline is the defaults, not an earlier promotion); then fresh-process `engine bench`
# (pp512 / tg128, 3 repeats) of the promoted file, of each [[start]] named in PROOF_STARTS (default
# d17_vec_cl_w8: the best hand-found config) and of the defaults, and llama.cpp's
# llama-bench on the same files (built in the background from .llcpp.tgz while the agent runs:
# ../shared/device/llama-bench.sh prepare), one run at a time, each with its GPU memory
# (nvidia-smi's peak above idle) beside it: $OUT/proof.txt, $OUT/proof_logs.tgz, promo.bundle,
# and $OUT/figures.toml: docs/figures.toml with `python -m tools.figures add`'s records of each
# bench and accepted trial (copy it to docs/ and run `python -m tools.figures --write`).
# PROOF_WALL: each agent run's --wall-time (default 130 s; no trial starts after it, and the one in
# flight gets 150 s more to finish before SIGTERM: the H100 proof's trials took 50-120 s).
set -u -o pipefail
# .fleet/site.txz into /tmp/site: tar through xz where the machine has it, else Python's lzma
unxz_site() {
    if command -v xz > /dev/null; then tar xJf .fleet/site.txz -C /tmp/site
    else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
        .fleet/site.txz /tmp/site; fi
}
OUT=${OUT:-/tmp/out}
case "${1:-}" in
unpack)  # the site into /tmp/site (for a device call that runs its own commands)
    mkdir -p /tmp/site && unxz_site ;;
gpu-tests)  # the GPU test suite, a file per process; the tally is rewritten after each file
    mkdir -p /tmp/site "$OUT" && unxz_site || exit 1
    PYTHONPATH=/tmp/site:$PWD python3 tools/gpu_suite.py "${2:-cuda}" "${@:3}" --json \
        --out "$OUT/gpu_suite.json" ;;
prepare)
    P="--platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64"
    P="$P --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
    rm -rf .fleet/dl /tmp/fleet-site && mkdir -p .fleet/dl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp $P -d .fleet/dl ray==2.60.0 optuna==5.0.0 sqlalchemy==2.1.9 \
        alembic==1.20.1 colorlog==6.12.0 cmaes==0.13.1 jsonschema==4.26.0 referencing==0.37.0 \
        rpds-py==2026.9.1 jsonschema-specifications==2025.9.1 mako==1.4.3 greenlet==3.5.6 \
        tomli-w==1.2.0 gguf==0.19.0 requests || exit 1
    python3 -m pip install -q --no-deps --no-compile --target /tmp/fleet-site --python-version 3.12 \
        --implementation cp --only-binary=:all: $P .fleet/dl/*.whl || exit 1
    rm -rf /tmp/fleet-site/ray/{jars,rllib,data,serve,train,tune,llm}
    for f in /tmp/fleet-site/bin/*; do sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$f"; done
    # xz, not gzip: 34 MB instead of 47, which leaves room for .llcpp.tgz in the same 64 MiB carry
    tar cf - -C /tmp/fleet-site . | xz -T0 -6 > .fleet/site.txz && rm -rf .fleet/dl
    git bundle create .fleet/main.bundle main
    [ -f ../shared/device/llama-bench.sh ] && cp ../shared/device/llama-bench.sh .fleet/
    du -sh .fleet ;;
proof)
    shift; EXP=${1:?experiment}; shift
    mkdir -p "$OUT" /tmp/site /tmp/models /root/fleet/logs /root/fleet/configs
    L=/root/fleet/logs; T0=$(date +%s); P=$OUT/proof.txt
    [ -d /tmp/site/ray ] || unxz_site || exit 1
    export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
    export FLEETTUNE_CACHE=/root/fleet/cache
    LB=$PWD/.fleet/llama-bench.sh  # prepare copies ../shared/device/llama-bench.sh here
    if [ -f .llcpp.tgz ] && [ -f "$LB" ]; then
        (nice -n 10 bash "$LB" build > $L/llama_build.log 2>&1; echo "llama build rc=$?" >> $L/llama_build.log) &
    fi
    rm -rf /root/promo && git clone -q .fleet/main.bundle /root/promo -b main \
        && git -C /root/promo config user.name "fleettune agent" \
        && git -C /root/promo config user.email agent@fleettune.invalid \
        && git -C /root/promo rm -rq --ignore-unmatch 'configs/*/*' \
        && git -C /root/promo commit -qm "proof: start from the registry defaults" || exit 1
    # measured NAME CMD...: CMD's stdout to $L/NAME.json, the GPU's memory sampled every 250 ms
    measured() {
        local name=$1; shift
        local idle; idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 250 > $L/mem_$name.csv &
        local smi=$!
        "$@" > $L/$name.json 2> $L/$name.err; local rc=$?
        kill $smi 2> /dev/null; wait $smi 2> /dev/null
        local peak; peak=$(sort -n $L/mem_$name.csv | tail -1)
        echo "$(( ${peak:-0} - idle ))" > $L/mem_$name.mib  # add_figures' --memory-mib
        echo "$name rc=$rc gpu_mib_held=$(( ${peak:-0} - idle )) (idle $idle, peak $peak)" | tee -a $P
    }
    # add_figures: each bench of the call (and the agent's accepted trials) as [[figure]] records
    # in $OUT/figures.toml (docs/figures.toml plus them): the lead copies it back and runs
    # `python -m tools.figures --write`
    add_figures() {
        cp docs/figures.toml "$OUT/figures.toml" || return
        local how="tools/fleet_gpu.sh proof $EXP $* ($(date -u +%F)): fresh-process"
        how="$how \`engine bench --backend cuda --prompt-tokens 512 --gen-tokens 128 --repeats 3"
        how="$how --json\`, one run at a time; llama.cpp: \`llama-bench -p 512 -n 128\` on the"
        how="$how same file; memory: the engine's footprint and nvidia-smi's peak above idle"
        local p st name extra
        for p in "$@"; do
            local names="ours_promoted_$p"
            for st in ${PROOF_STARTS-d17_vec_cl_w8}; do names="$names ours_${st}_$p"; done
            for name in $names ours_default_$p; do
                extra=""
                [ -s $L/llama_$p.json ] && extra="--llama $L/llama_$p.json"
                [ -s $L/mem_$name.mib ] && extra="$extra --memory-mib $(cat $L/mem_$name.mib)"
                python3 -m tools.figures add --data "$OUT/figures.toml" --bench $L/$name.json \
                    $extra --command "$how" 2>&1 | tail -1 | tee -a $P
            done
        done
        how="tools/fleet_gpu.sh proof $EXP $* ($(date -u +%F)): \`agent run $EXP --local"
        how="$how --wall-time ${PROOF_WALL:-130}\` from the registry defaults, each study's best"
        how="$how accepted trial"
        python3 -m tools.figures add --data "$OUT/figures.toml" --study \
            sqlite:////root/fleet/studies.db --command "$how" 2>&1 | tail -1 | tee -a $P
    }
    figures() {  # one line of an engine bench JSON: pp / tg medians and the footprint it reports
        python3 - "$1" "$2" <<'PY' | tee -a $P
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print(sys.argv[2], "no JSON:", e); sys.exit()
r = d["results"][0]
mem = d.get("memory") or {}
tot = (mem.get("measured") or mem).get("total_bytes") if isinstance(mem, dict) else None
src = (d.get("config_source") or {}).get("path") or (d.get("config_source") or {}).get("kind")
print(f"{sys.argv[2]}: pp512 {r['prefill_tok_s']['median']:.1f} tg128 "
      f"{r['decode_tok_s']['median']:.1f} engine_total_bytes {tot} source {src}")
PY
    }
    for p in "$@"; do  # written into the cache, where the agent's synthetic:PRESET finds it
        python3 -c "import sys; from worker.models import resolve_model; print(resolve_model(sys.argv[1]))" \
            synthetic:$p > $L/synth_$p.log 2>&1 && ln -sf "$(tail -1 $L/synth_$p.log)" /tmp/models/$p.gguf
    done
    echo "synth done $(( $(date +%s) - T0 ))s" | tee -a $P
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $P
    for p in "$@"; do
        echo "== agent run $EXP on $p $(( $(date +%s) - T0 ))s" | tee -a $P
        timeout $(( ${PROOF_WALL:-130} + 150 )) python3 -m agent run "$EXP" --local \
            --model synthetic:$p --wall-time ${PROOF_WALL:-130} \
            --storage sqlite:////root/fleet/studies.db --promote-repo /root/promo \
            > $L/agent_$p.txt 2> $L/agent_$p.log
        echo "agent rc=$?" | tee -a $P; tail -15 $L/agent_$p.txt | tee -a $P
    done
    git -C /root/promo log --format='%h %s' main -4 | tee -a $P
    git -C /root/promo bundle create "$OUT/promo.bundle" main 2> /dev/null
    cp /root/fleet/studies.db "$OUT/"
    for p in "$@"; do
        M=/tmp/models/$p.gguf
        measured ours_promoted_$p env FLEETTUNE_CONFIGS=/root/promo/configs timeout 90 python3 -m \
            engine bench --backend cuda --model $M --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json
        figures $L/ours_promoted_$p.json "ours promoted $p"
        for st in ${PROOF_STARTS-d17_vec_cl_w8}; do
            python3 -c "
import sys; from agent.experiment import load_experiment; from engine.tuning import TuningConfig
s = {x.name: x.config for x in load_experiment(sys.argv[1]).start}[sys.argv[2]]
open(sys.argv[3], 'w').write(TuningConfig.default('cuda').replace(**s).to_toml())" \
                "$EXP" $st /root/fleet/configs/$st.toml
            measured ours_${st}_$p timeout 90 python3 -m engine bench --backend cuda --model $M \
                --config /root/fleet/configs/$st.toml --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json
            figures $L/ours_${st}_$p.json "ours $st $p"
        done
        measured ours_default_$p timeout 90 python3 -m engine bench --backend cuda --model $M \
            --no-promoted --prompt-tokens 512 --gen-tokens 128 --repeats 3 --json
        figures $L/ours_default_$p.json "ours default $p"
        tar czf "$OUT/proof_logs.tgz" -C /root/fleet logs
    done
    if [ -f .llcpp.tgz ]; then
        wait; tail -1 $L/llama_build.log | tee -a $P
        for p in "$@"; do
            measured llama_$p timeout 100 bash "$LB" run /tmp/models/$p.gguf
            python3 -c "import json, sys; [print('llama', sys.argv[2], r['n_prompt'], r['n_gen'], round(r['avg_ts'], 1), '+-', round(r['stddev_ts'], 1)) for r in json.load(open(sys.argv[1]))]" $L/llama_$p.json $p | tee -a $P
        done
    fi
    add_figures "$@"
    echo "proof done $(( $(date +%s) - T0 ))s" | tee -a $P
    tar czf "$OUT/proof_logs.tgz" -C /root/fleet logs ;;
run|scaling)
    mode=$1; shift
    MODEL=${1:?model}; shift
    mkdir -p "$OUT" /root/fleet/logs /tmp/site
    L=/root/fleet/logs
    [ -d /tmp/site/ray ] || unxz_site || exit 1  # once per machine
    MODELS="" source tools/device_vulkan_env.sh || exit 1
    export PYTHONPATH=/tmp/site:/tmp/vk:$PWD PATH=/tmp/site/bin:$PATH RAY_AUTH_MODE=disabled
    export FLEETTUNE_CACHE=/root/fleet/cache
    PROMOTE="--promote-repo /root/promo"
    if command -v git > /dev/null; then
        rm -rf /root/promo && git clone -q .fleet/main.bundle /root/promo -b main
        git -C /root/promo config user.name "fleettune agent"
        git -C /root/promo config user.email agent@fleettune.invalid
        # this checkout's .git is whatever the machine was given (a stale commit: promotions'
        # engine_commit read aa9087f+dirty); point its HEAD at the bundle's main without
        # touching the files, so engine_commit is main's commit, '+dirty' only if they differ
        [ -d .git ] && git fetch -q .fleet/main.bundle main 2> /dev/null \
            && git reset -q FETCH_HEAD && echo "engine checkout: $(git rev-parse --short HEAD)$(
                git status --porcelain -- engine shaders | grep -q . && echo ' +dirty')"
    else
        echo "no git on this machine: the agent runs with --no-promote"; PROMOTE=--no-promote
    fi
    M=$(python3 -c "import sys; from worker.models import resolve_model; print(resolve_model(sys.argv[1]))" "$MODEL") || exit 1
    echo "model $MODEL -> $M"
    # fleet BACKEND:CARD...: a Ray head without devices and one worker node per card.
    fleet() {
        ray start --head --port 6379 --num-gpus 0 --include-dashboard=false > $L/head.log 2>&1 \
            || { tail -20 $L/head.log; return 1; }
        for node in "$@"; do
            be=${node%%:*}; card=${node##*:}
            FLEETTUNE_VK_DEVICE=$card CUDA_VISIBLE_DEVICES=$card python3 -m worker start \
                --address 127.0.0.1:6379 --backends $be --auth-mode disabled \
                > $L/node_${be}_$card.log 2>&1 || { tail -20 $L/node_${be}_$card.log; return 1; }
        done
    }
    if [ $mode = scaling ]; then
        EXP=${1:?experiment}; TRIALS=${2:?trials}; name=$(basename "$EXP" .toml)
        for n in 1 2; do
            nodes="cuda:0"; promote=--no-promote
            [ $n = 2 ] && { nodes="cuda:0 cuda:1"; promote=$PROMOTE; }
            fleet $nodes || exit 1
            timeout ${AGENT_TIMEOUT:-300} python3 -m agent run "$EXP" --address 127.0.0.1:6379 \
                --storage sqlite:////root/fleet/scaling_${n}w.db --budget $TRIALS $promote \
                > $L/scaling_${n}w.txt 2> $L/scaling_${n}w.log
            echo "$n worker(s): agent rc=$?" | tee -a "$OUT/scaling.txt"
            grep -E "studies in|trials;|best:|nothing accepted|overhead|promoted" $L/scaling_${n}w.txt \
                | tee -a "$OUT/scaling.txt"
            ray stop --force > /dev/null 2>&1; sleep 2
            cp /root/fleet/scaling_${n}w.db "$OUT/"
            tar czf "$OUT/scaling_logs.tgz" -C /root/fleet logs
        done
        if [ -d /root/promo ]; then
            git -C /root/promo log --format='%h %s' main -3 | tee -a "$OUT/scaling.txt"
            git -C /root/promo bundle create "$OUT/promo.bundle" main 2>/dev/null
        fi
        exit 0
    fi
    NODES=${NODES:-cuda:0 vulkan:1}
    fleet $NODES || exit 1
    ray status 2>&1 | tee $L/ray_status.txt | grep -E "device:|backend:|GPU"
    for exp in "$@"; do
        name=$(basename "$exp" .toml)
        echo "== agent run $exp"
        timeout ${AGENT_TIMEOUT:-240} python3 -m agent run "$exp" --address 127.0.0.1:6379 \
            --storage sqlite:////root/fleet/studies.db $PROMOTE ${AGENT_ARGS:-} \
            > $L/agent_$name.txt 2> $L/agent_$name.log
        echo "agent rc=$?"; tail -25 $L/agent_$name.txt
        cp /root/fleet/studies.db "$OUT/"
    done
    ray stop --force > /dev/null 2>&1
    if [ -d /root/promo ]; then
        git -C /root/promo log --format='%h %s' main -6 | tee $L/promotions.txt
        git -C /root/promo bundle create "$OUT/promo.bundle" main 2>/dev/null
        cp -r /root/promo/configs/. configs/ && find configs -name '*.toml' | tee $L/promoted.txt
    fi
    tar czf "$OUT/fleet_logs.tgz" -C /root/fleet logs
    for node in ${BENCH_NODES-$NODES}; do  # BENCH_NODES="": no fresh-process benches
        be=${node%%:*}; card=${node##*:}
        for tag in default promoted; do
            flag=""; [ $tag = default ] && flag=--no-promoted
            FLEETTUNE_VK_DEVICE=$card CUDA_VISIBLE_DEVICES=$card timeout 60 python3 -m engine bench \
                --backend $be --model $M $flag --prompt-tokens 512 --gen-tokens 128 --repeats 3 \
                --json > $L/bench_${be}_$tag.json 2> $L/bench_${be}_$tag.err
            echo "bench $be $tag rc=$? $(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['results'][0]; print({k: round(r[k]['median'], 1) for k in ('prefill_tok_s', 'decode_tok_s')})" $L/bench_${be}_$tag.json 2>/dev/null)"
        done
        tar czf "$OUT/fleet_logs.tgz" -C /root/fleet logs
    done
    if [ "${VALIDATE_PROMOTED:-1}" = 1 ]; then  # 0: the agent's own validate of it is the record
        FLEETTUNE_VK_DEVICE=0 CUDA_VISIBLE_DEVICES=0 timeout 90 python3 -m engine validate \
            --backend cuda --model $M --json > $L/validate_cuda_promoted.json \
            2> $L/validate_cuda_promoted.err
        echo "validate cuda promoted rc=$?"
    fi
    tar czf "$OUT/fleet_logs.tgz" -C /root/fleet logs ;;
*)
    sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 2 ;;
esac
