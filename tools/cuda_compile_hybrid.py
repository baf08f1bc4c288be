#!/usr/bin/env python3
"""Compile every knob combination of every variant of the hybrids' CUDA modules (delta_net.cu,
delta_net_chunked.cu, moe.cu, moe_grouped.cu, moe_tc.cu, hybrid.cu) with nvcc to PTX: a compile
check on a machine without a GPU (the sources are inlined as NVRTC sees them: no include path;
the planted bugs' patched sources compile in tests/engine/verify/test_planted.py).

    python tools/cuda_compile_hybrid.py [--nvcc /usr/local/cuda/bin/nvcc] [--arch sm_90] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.backends.cuda import kernels
from engine.tuning import REGISTRY
from engine.tuning.registry import DEFINE

OPS = ("delta_net", "moe_experts")  # every variant of each, every value of its define knobs


def builds() -> list[tuple[str, dict[str, int]]]:
    out: list[tuple[str, dict[str, int]]] = [("hybrid.cu", {})]
    for op in OPS:
        for v in REGISTRY.op("cuda", op).variants:
            knobs = [p for p in v.bound(DEFINE) if v.reaches(p, v.source)]  # own build's
            for values in itertools.product(*(p.choices for p in knobs)):
                pairs = zip(knobs, values, strict=True)
                defines = {str(p.binding.target): int(c) for p, c in pairs}
                out.append((Path(v.source).name, defines))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvcc", default="/usr/local/cuda/bin/nvcc")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if not Path(args.nvcc).exists():
        print(f"cuda_compile_hybrid: no nvcc at {args.nvcc}", file=sys.stderr)
        return 2
    failed = []
    todo = builds()
    with tempfile.TemporaryDirectory() as tmp:
        for fname, defines in todo:
            src = Path(tmp) / fname
            src.write_text(kernels.source(fname))
            cmd = [args.nvcc, f"-arch={args.arch}", "--ptx", "-std=c++17", "-o", "/dev/null",
                   *(f"-D{k}={v}" for k, v in defines.items()), str(src)]  # fmt: skip
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode or "warning" in r.stderr:
                failed.append({"file": fname, "defines": defines, "log": r.stderr[-2000:]})
    doc = {"builds": len(todo), "failed": failed}
    print(json.dumps(doc) if args.json else f"{len(todo)} builds, {len(failed)} failed")
    for f in failed if not args.json else []:
        print(f["file"], f["defines"], f["log"], sep="\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
