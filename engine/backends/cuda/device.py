"""Device naming for the CUDA backend, with no CuPy import (testable anywhere).

``device_class`` keys studies and promoted configs (configs/<device class>/<family>/...), so it
is the GPU model alone: memory size, form factor and marketing words are dropped, so that an
"NVIDIA H100 80GB HBM3" and an "NVIDIA H100 PCIe" land in one class only where that is the
intent (they do: same chip), and an RTX 4090 is "rtx4090".
"""

from __future__ import annotations

import re

_DROP = re.compile(
    r"^(nvidia|geforce|tesla|quadro|generation|graphics|\d+gb|sxm\d*|pcie|hbm\d*e?|nvl|"
    r"mig.*|\d+g\.\d+gb|laptop|gpu)$"
)


def device_class(name: str) -> str:
    """Slug of the GPU model: 'NVIDIA H200' -> 'h200', 'NVIDIA GeForce RTX 4090' -> 'rtx4090',
    'NVIDIA A100-SXM4-80GB' -> 'a100', 'NVIDIA RTX 6000 Ada Generation' -> 'rtx6000ada'."""
    words = [w for w in re.split(r"[^0-9a-z.]+", name.lower()) if w]
    kept = [w for w in words if not _DROP.match(w)]
    slug = re.sub(r"[^0-9a-z]", "", "".join(kept))
    return slug or "cuda-unknown"


def driver_string(driver: int, runtime: int, cupy_version: str, nvrtc: tuple[int, int]) -> str:
    """'CUDA driver 13.0, runtime 13.0, NVRTC 13.0, CuPy 14.2.0' from the integer versions."""

    def v(x: int) -> str:
        return f"{x // 1000}.{(x % 1000) // 10}"

    return (
        f"CUDA driver {v(driver)}, runtime {v(runtime)}, NVRTC {nvrtc[0]}.{nvrtc[1]}, "
        f"CuPy {cupy_version}"
    )
