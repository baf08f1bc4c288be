# Sourced (not run) by the helpers' scripts/device_<name>.sh on the GPU machine, from the repo
# root with .whl carried; the start they all share:
#   device_begin NAME [COMMIT_FILE]  D=$OUT/NAME made (OUT defaults to /tmp/out), T0 = now,
#                                    PYTHONPATH=/tmp/site:$PWD, gguf installed from .whl into
#                                    /tmp/site where the machine lacks it, the commit in
#                                    $D/COMMIT_FILE (commit.txt)
#   el                               seconds since device_begin
#   gpu_txt [FIELDS]                 nvidia-smi's FIELDS (index,name,clocks.sm,clocks.mem) into
#                                    $D/gpu.txt
device_begin() {
  OUT=${OUT:-/tmp/out}; D="$OUT/$1"; mkdir -p "$D"
  T0=$(date +%s)
  export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
  python3 -c "import gguf" 2> /dev/null || python3 -m pip install -q --no-index --no-deps \
      --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  git log --oneline -1 > "$D/${2:-commit.txt}" 2>/dev/null
}
el() { echo $(( $(date +%s) - T0 )); }
gpu_txt() {
  nvidia-smi --query-gpu="${1:-index,name,clocks.sm,clocks.mem}" --format=csv > "$D/gpu.txt" 2>&1
}
