"""Refuse to start a Ray worker on a node whose devices are not the ones its group declares.

    python deploy/expect_devices.py --backend vulkan backend:vulkan/r9700=1 device:r9700=1

A KubeRay worker group declares its Ray resources statically (rayStartParams); this runs the
same device detection as ``python -m worker start`` (``worker.device.detect``) and exits 1, naming
both sides, when the custom resources it would advertise (``device:<class>``,
``backend:<backend>/<class>``) differ from the declared ones: a pod
scheduled onto another GPU model, or given no GPU at all (Vulkan then finds only lavapipe), must
not join the cluster under a device class it does not have. Exit 0 and one line when they match.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

# Run as a script from the checkout (deploy/ is not a package): import the project beside it.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.device import BACKEND_PREFIX, RESOURCE_PREFIX, detect  # noqa: E402


def parse_expected(items: Sequence[str]) -> dict[str, float]:
    """``["device:r9700=1"]`` -> ``{"device:r9700": 1.0}``."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, count = item.partition("=")
        if not sep or not name.startswith((RESOURCE_PREFIX, BACKEND_PREFIX)):
            raise ValueError(
                f"{item!r}: expected {RESOURCE_PREFIX}<class>=<count> or "
                f"{BACKEND_PREFIX}<backend>/<class>=<count>"
            )
        out[name] = out.get(name, 0.0) + float(count)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="expect_devices.py", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "expected", nargs="+", help="each custom resource the group declares, as NAME=COUNT"
    )
    p.add_argument(
        "--backend",
        action="append",
        choices=("cuda", "vulkan"),
        help="backends to probe (repeatable; default: cuda and vulkan)",
    )
    args = p.parse_args(argv)
    try:
        expected = parse_expected(args.expected)
    except ValueError as e:
        p.error(str(e))
    found = detect(tuple(args.backend or ("cuda", "vulkan")), with_cpu=False).resources()
    if found != expected:
        print(
            f"expect_devices: this node advertises {found or 'no device'}, its worker group "
            f"declares {expected}: wrong node pool, or the GPU is not visible in the container "
            "(device plugin, /dev/dri, NVIDIA runtime)",
            file=sys.stderr,
        )
        return 1
    print(f"expect_devices: {found}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
