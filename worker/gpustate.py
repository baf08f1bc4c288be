"""The device's state around a trial: utilisation, memory, clocks, temperature and power, what
makes GPU timings noisy. Optional and cheap: NVIDIA through one ``nvidia-smi --query-gpu`` call
(~50 ms, after the benchmark, never inside it), AMD through the amdgpu driver's sysfs files
(a few reads); anything else, or any failure, gives None and the trial goes on without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

NVIDIA_FIELDS = (
    ("pci.bus", "pci_bus", int),
    ("utilization.gpu", "util_pct", float),
    ("memory.used", "mem_used_mib", float),
    ("memory.total", "mem_total_mib", float),
    ("clocks.sm", "sm_clock_mhz", float),
    ("clocks.mem", "mem_clock_mhz", float),
    ("clocks_throttle_reasons.active", "throttle", str),
    ("temperature.gpu", "temp_c", float),
    ("power.draw", "power_w", float),
)
DRM = Path("/sys/class/drm")


def sample(device: dict[str, Any], timeout_s: float = 2.0) -> dict[str, Any] | None:
    """The state of the device ``device`` (an engine ``DeviceInfo.to_dict()``), or None."""
    vendor = str(device.get("vendor", "")).lower()
    try:
        if "nvidia" in vendor:
            return _nvidia(device, timeout_s)
        if "amd" in vendor or "advanced micro" in vendor or "ati" in vendor:
            return _amdgpu()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None
    return None


def _value(text: str, kind: type) -> Any:
    text = text.strip()
    if kind is str:
        return text
    try:
        return kind(text, 16) if kind is int and text.startswith("0x") else kind(float(text))
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def parse_nvidia(csv: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<NVIDIA_FIELDS> --format=csv,noheader,nounits``."""
    out = []
    for line in csv.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(NVIDIA_FIELDS):
            continue
        out.append(
            {key: _value(c, kind) for (_, key, kind), c in zip(NVIDIA_FIELDS, cells, strict=True)}
        )
    return out


def _nvidia(device: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = ",".join(f for f, _, _ in NVIDIA_FIELDS)
    r = subprocess.run(
        [exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    rows = parse_nvidia(r.stdout)
    bus = (device.get("extra") or {}).get("pci_bus_id")
    mine = [g for g in rows if bus is not None and g["pci_bus"] == bus]
    if not mine and len(rows) == 1:
        mine = rows
    if not mine:  # several GPUs and no bus id: Ray's CUDA_VISIBLE_DEVICES names the index
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0]
        mine = [rows[int(visible)]] if visible.isdigit() and int(visible) < len(rows) else []
    return {"source": "nvidia-smi", **mine[0]} if mine else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _amdgpu() -> dict[str, Any] | None:
    """The node's amdgpu card from sysfs, when there is exactly one (with several, which one a
    Vulkan device is cannot be told from here without its PCI address)."""
    cards = [
        d / "device"
        for d in sorted(DRM.glob("card[0-9]*"))
        if "-" not in d.name and _read(d / "device" / "vendor") == "0x1002"
    ]
    if len(cards) != 1:
        return None
    dev = cards[0]
    out: dict[str, Any] = {"source": "amdgpu sysfs"}
    busy = _read(dev / "gpu_busy_percent")
    used, total = _read(dev / "mem_info_vram_used"), _read(dev / "mem_info_vram_total")
    out["util_pct"] = float(busy) if busy else None
    out["mem_used_mib"] = int(used) / 2**20 if used else None
    out["mem_total_mib"] = int(total) / 2**20 if total else None
    for name, key in (("pp_dpm_sclk", "sm_clock_mhz"), ("pp_dpm_mclk", "mem_clock_mhz")):
        text = _read(dev / name) or ""
        cur = [ln for ln in text.splitlines() if ln.rstrip().endswith("*")]
        out[key] = float(cur[0].split()[1].lower().removesuffix("mhz")) if cur else None
    for hwmon in sorted((dev / "hwmon").glob("hwmon*")):
        temp, power = _read(hwmon / "temp1_input"), _read(hwmon / "power1_average")
        out["temp_c"] = int(temp) / 1000 if temp else None
        out["power_w"] = int(power) / 1e6 if power else None
        break
    return out
