#!/usr/bin/env bash
# The cooperative-matrix prefill kernels on the GPU machine through NVIDIA's Vulkan, most
# important first (what does not fit the time is cut): the device's cooperative-matrix
# properties, the GEMM's GPU tests, pp512 per model in $MODELS with tiled / coopmat GEMM /
# coopmat GEMM + attention, the GEMM alone on 7B shapes (scripts/vulkan_coopmat_bench.py),
# per-kernel GPU time of pp512 (scripts/vulkan_profile.py), attention tests, validate, contract.
# Carry .gl and .spv-cache (scripts/device_vulkan_env.sh). Results under $OUT/vkcoop/.
#   MODELS="1.5b" (default) or "1.5b 7b"; S=1 (default, ~100 s) scales every timeout.
export MODELS=${MODELS-1.5b}
S=${S:-1}
source scripts/device_vulkan_env.sh || exit $?
O=$OUT/vkcoop; mkdir -p "$O"
python3 - <<'PY' 2>&1 | tee "$O/coopmat_props.txt"
from engine.backends.vulkan.device import open_device
d = open_device()
x = d.info.extra
print(d.info.name, d.info.driver, "subgroup", d.info.subgroup_size)
for k in ("cooperative_matrix", "coopmat_missing", "min_subgroup_size", "max_subgroup_size",
          "max_shared_memory"):
    print(k, x.get(k))
for s in x.get("coopmat_shapes", []):
    print("  shape", s)
d.destroy()
PY
PT="python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short -m gpu tests/test_vulkan_coopmat.py"
timeout $((16 * S)) $PT -k "knobs or row_ranges" > "$O/pytest_knobs.log" 2>&1
echo "pytest knobs rc=$?"; tail -4 "$O/pytest_knobs.log"
printf 'backend = "vulkan"\n[ops.matmul_prefill]\nvariant = "coopmat"\n' > /tmp/coopmat.toml
printf '[ops.attention]\nvariant = "coopmat"\n' | cat /tmp/coopmat.toml - > /tmp/coopmat_attn.toml
for m in $MODELS; do
  wait_model $m
  B="python3 -m engine bench --backend vulkan --no-promoted --json --model /tmp/models/$m.gguf"
  for v in tiled coopmat coopmat_attn; do
    cfg=""; [ $v != tiled ] && cfg="--config /tmp/$v.toml"
    timeout $((15 * S)) $B $cfg --prompt-tokens 512 --gen-tokens 1 --repeats 2 \
        > "$O/bench_${m}_$v.json" 2> "$O/bench_${m}_$v.err"
    echo "bench $m $v rc=$?"; python3 -c "import json; r = json.load(open('$O/bench_${m}_$v.json'))
print('$m $v pp512 tok/s', r['results'][0]['prefill_tok_s'])" 2>&1 | tee -a "$O/bench.txt"
  done
done
for sh in 1.5b 7b; do
  timeout $((12 * S)) python3 scripts/vulkan_coopmat_bench.py --shapes $sh --repeats 3 2>&1 \
      | tee "$O/gemm_$sh.txt"
done
m=${MODELS##* }  # the last (largest) model
timeout $((15 * S)) python3 scripts/vulkan_profile.py --model /tmp/models/$m.gguf \
    --out "$O/profile" --prompt-tokens 512 --gen-tokens 2 --config '{}' \
    --config '{"matmul_prefill.variant": "coopmat", "attention.variant": "coopmat"}' 2>&1 \
    | tail -30 > "$O/profile_$m.txt"; cat "$O/profile_$m.txt"
timeout $((8 * S)) $PT -k "attention and not Contract" > "$O/pytest_attention.log" 2>&1
echo "pytest attention rc=$?"; tail -3 "$O/pytest_attention.log"
# validate (teacher-forced, fp16 budget) of the tiny synthetic model with both coopmat variants
timeout $((12 * S)) python3 -m pytest -q -p no:cacheprovider -rfEs --tb=short \
    tests/test_vulkan_model.py -k "validate_passes and cfg6" > "$O/pytest_validate.log" 2>&1
echo "validate coopmat rc=$?"; tail -3 "$O/pytest_validate.log"
timeout $((8 * S)) $PT -k "Contract and matmul" > "$O/pytest_contract.log" 2>&1
echo "pytest contract rc=$?"; tail -3 "$O/pytest_contract.log"
