#!/usr/bin/env bash
# Install fleettune on a bare-metal node (head or worker), idempotently, from a checkout:
#   cd ~/fleettune && bash deploy/node-setup.sh
# apt: git, the Vulkan loader, Mesa (RADV for AMD), glslc, vulkaninfo. venv: .venv with the
# project, the `agent` and `vulkan` extras, `cuda` too when nvidia-smi sees a GPU, and Ray pinned
# to the cluster's version. Every node of a cluster must run the same Python minor and Ray version.
#   PYTHON=python3.11      the interpreter for the venv (default: python3)
#   RAY_VERSION=2.60.0     the Ray every node runs
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
RAY_VERSION=${RAY_VERSION:-2.60.0}
APT_PKGS="git python3-venv libvulkan1 mesa-vulkan-drivers glslc vulkan-tools"
MESA_MIN=25.0 # RDNA4 (gfx1201: RX 9070 XT, R9700) needs RADV from Mesa 25.0 or newer

sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo

missing=()
for p in $APT_PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "[node-setup] apt install ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

# An AMD GPU (PCI vendor 0x1002) needs a Mesa recent enough for RDNA4.
if grep -qs 0x1002 /sys/class/drm/card*/device/vendor; then
    mesa=$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers)
    if ! dpkg --compare-versions "$mesa" ge "$MESA_MIN"; then
        echo "[node-setup] mesa-vulkan-drivers $mesa is older than $MESA_MIN: RADV cannot" \
            "drive RDNA4. Use Debian 13 (trixie) or a Mesa PPA on Ubuntu (docs/deploy.md)." >&2
        exit 1
    fi
fi

extras=agent,vulkan
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    extras=$extras,cuda
fi

[ -x .venv/bin/python ] || "$PY" -m venv .venv
echo "[node-setup] $(.venv/bin/python --version), ray $RAY_VERSION, extras [$extras]"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e ".[$extras]" "ray[default]==$RAY_VERSION"
