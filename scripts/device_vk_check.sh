#!/usr/bin/env bash
# helper vk's second device run (issue 14), ~100 s: the 1.5B numbers the checkpoint lost (its
# pytest printed nothing in 40 s and the 1.5B profile after it nothing in 18 s: a GPU hang in
# the first test is the suspect), so the 1.5B profile and bench come first, then each test file
# on its own timeout, verbose, with pytest's faulthandler dumping the stacks of a test stuck
# for 12 s. SPIR-V: .dev/vk-spv.txz (from branch vk) or .spv-cache rebuilt from branch vk.
# Writes under $OUT/vk: profile_1.5b.log, bench_1.5b.log, pytest_<file>.log.
T0=$(date +%s)
export OUT=${OUT:-/tmp/out}/vk MODELS=${MODELS-1.5b}
mkdir -p "$OUT"
if [ -f .dev/vk-spv.txz ]; then
  rm -rf .spv-cache; mkdir .spv-cache; tar xJf .dev/vk-spv.txz -C .spv-cache || exit 4
fi
source scripts/device_vulkan_env.sh || exit $?
left() { echo $(( T0 + $1 - $(date +%s) )); }
wait_model 1.5b
B=res_su_int8_fa_k64_fl_ms
C="$B best fl_ms_f32_sg128 fl_ms_f32_sg128_ah32 fl_ms_f32_sg128_kc128_ah32_x16 $B"
timeout $(left 36) python3 scripts/vulkan_profile.py --model /tmp/models/1.5b.gguf --grid \
    --gen-tokens 4 --repeats 3 --top 12 $(for c in $C; do printf -- '--config %s ' $c; done) \
    --out "$OUT/p15" --deadline $(( T0 + 31 )) > "$OUT/profile_1.5b.log" 2>&1
grep -E "^== .* prefill" "$OUT/profile_1.5b.log"
echo "1.5b profile done at $(( $(date +%s) - T0 )) s"
timeout $(left 46) python3 scripts/vulkan_decode_speed.py /tmp/models/1.5b.gguf --profile "" \
    --validate "" --bench best,$B --out "$OUT" --deadline $(( T0 + 44 )) \
    > "$OUT/bench_1.5b.log" 2>&1
grep bench "$OUT/bench_1.5b.log"
t() {  # t SECONDS FILE [-k EXPR]: one test file, verbose, stacks of a test stuck for 12 s
  local s=$1 f=$2; shift 2
  timeout $s python3 -m pytest -v -p no:cacheprovider -rfE --tb=short -m "gpu or not gpu" \
      -o faulthandler_timeout=12 "$f" "$@" > "$OUT/pytest_$(basename $f .py).log" 2>&1
  echo "$f rc=$? at $(( $(date +%s) - T0 )) s: $(grep -cE 'PASSED' "$OUT/pytest_$(basename $f .py).log") passed, $(grep -cE 'FAILED|ERROR' "$OUT/pytest_$(basename $f .py).log") failed"
}
t 12 tests/test_vulkan_stream_ahead.py
t 10 tests/test_vulkan_fuse_x16.py -k "not build"
t 12 tests/test_vulkan_resident_split.py
t 10 tests/test_vulkan_model.py -k cfg13
t $(left 98) tests/test_vulkan_flash.py -k "key_split or planted"
echo "done in $(( $(date +%s) - T0 )) s"
