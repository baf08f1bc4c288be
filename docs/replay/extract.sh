#!/usr/bin/env bash
# Rebuild the replay tables of docs/replay.md from the fleet's recorded H200 studies. The
# SQLite storages left the tree after this extraction (issue 29): check out the commit that
# still has docs/fleet-gpu/*.db (see docs/replay.md) and run this from the repository root.
set -euo pipefail
PY=${PY:-python}
ex() {  # db, study, experiment, table name
  "$PY" -m agent table from-study --storage "sqlite:///docs/fleet-gpu/$1" --study "$2" \
    --experiment "experiments/$3.toml" --out "docs/replay/$4.json"
}
H=h200/synthetic-qwen2-1.5b-q4_k_m
V=nvidia-h200/synthetic-qwen2-1.5b-q4_k_m
ex studies-2026-11-30.db fleet-decode/$H fleet-decode run1-decode-cuda
ex studies-2026-11-30.db fleet-decode/$V fleet-decode run1-decode-vulkan
ex studies-2026-11-30-run2.db fleet-decode/$H fleet-decode run2-decode-cuda
ex studies-2026-11-30-run2.db fleet-decode/$V fleet-decode run2-decode-vulkan
ex studies-2026-11-30-run3.db fleet-decode/$H fleet-decode run3-decode-cuda
ex studies-2026-11-30-run3.db aa-decode/$H aa-decode run3-aa-decode-cuda
ex studies-2026-11-30-run4-prefill-tc.db fleet-prefill/$H fleet-prefill run4-prefill-cuda
ex scaling-1w-2026-11-30.db fleet-prefill/$H fleet-prefill scaling-1w-prefill-cuda
ex scaling-2w-2026-11-30.db fleet-prefill/$H fleet-prefill scaling-2w-prefill-cuda
