"""Precompile the SPIR-V of a planted bug (tests/planted: its patched shaders in a
FLEETTUNE_KERNEL_SOURCES overlay) for the programs some configs use, so a GPU machine with no
shader compiler can run that mutant's test from a carried cache (the cache keys on the sources'
content: the planted builds sit beside the shipped ones).

usage: python tests/spirv_mutant.py --mutant NAME --out DIR [--config JSON ...]
       (the default config is always included)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backends.vulkan import kernels as K  # noqa: E402
from engine.backends.vulkan.spirv import compile_spirv  # noqa: E402
from engine.tuning import REGISTRY, TuningConfig  # noqa: E402
from engine.tuning.variants.vulkan import QUANT_TYPES  # noqa: E402
from tests.planted import patches, planted  # noqa: E402


def builds(cfg: TuningConfig) -> set[tuple[str, tuple[str, ...]]]:
    """(shader, defines) of every program cfg's chosen variants may dispatch, any weight type."""
    out = set()
    for op in REGISTRY.ops("vulkan"):
        c = cfg.op(op.name)
        if op.name not in K.IO and (op.name, c.variant) not in K.PASSES:
            continue  # host-only ops
        v = op.variant(c.variant)
        for q in sorted(QUANT_TYPES) if v.quant_types is not None else [""]:
            out |= {(p.shader, p.defines) for p in K.programs(op.name, c, q)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mutant", required=True, help="NAME of a tests/planted patch")
    ap.add_argument("--out", type=Path, required=True, help="SPIR-V cache directory")
    ap.add_argument("--config", action="append", default=[], help="flat config as JSON")
    args = ap.parse_args(argv)
    if args.mutant not in patches():
        print(f"--mutant {args.mutant!r}: not in tests/planted/*.patches", file=sys.stderr)
        return 2
    try:
        cfgs = [TuningConfig.default("vulkan")]
        cfgs += [TuningConfig.default("vulkan").replace(**json.loads(c)) for c in args.config]
    except (ValueError, KeyError) as e:
        print(f"--config: {e}", file=sys.stderr)
        return 2
    todo = sorted(set().union(*(builds(c) for c in cfgs)))
    with planted(args.mutant):
        for shader, defines in todo:
            compile_spirv(shader, defines, args.out)
    print(f"{len(todo)} SPIR-V builds with {args.mutant} planted in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
