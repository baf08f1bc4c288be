"""Compile the CUDA modules of a list of configs into CuPy's on-disk kernel cache, so a later
process (a benchmark, a test) loads cubins instead of spending its time budget in NVRTC. Run it
in the background while the GPU does something else; --part i/n takes every n-th module from
the i-th, so n processes share the list.

usage: python tools/cuda_precompile.py CONFIGS.json [--part 0/1]
CONFIGS.json: a JSON list of flat configs ({"matmul_decode.variant": "mmvw", ...}).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def module_list(flats: list[dict]) -> list[tuple[str, tuple]]:
    """Distinct (file, sorted defines) over every module the configs build."""
    from engine.backends.cuda import kernels
    from engine.tuning import TuningConfig

    seen: dict[tuple[str, tuple], None] = {}
    for flat in flats:
        for fname, defines in kernels.modules_for(TuningConfig.from_flat("cuda", flat)).values():
            seen[(fname, tuple(sorted(defines.items())))] = None
    return list(seen)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("configs", type=Path)
    ap.add_argument("--part", default="0/1", help="i/n: this process's share")
    a = ap.parse_args(argv)
    try:
        flats = json.loads(a.configs.read_text())
        i, n = (int(v) for v in a.part.split("/"))
        mods = module_list(flats)
    except (OSError, ValueError) as e:
        print(f"cuda_precompile: {e}")
        return 2
    import cupy as cp

    from engine.backends.cuda import kernels

    dev = cp.cuda.Device()
    cc = int(dev.compute_capability)
    t0 = time.time()
    for fname, defines in mods[i::n]:
        kernels.module(cp, cc, fname, dict(defines))
    print(f"part {i}/{n}: {len(mods[i::n])} modules in {time.time() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
