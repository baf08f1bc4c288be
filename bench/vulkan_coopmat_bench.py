"""Time the Vulkan prefill GEMM variants on a model's matmul shapes (GPU time of the matmul
alone, weights made by tiling a few properly quantized rows): TFLOP/s of matmul_prefill.tiled
against .coopmat at its knob samples, and the coopmat result's NMSE against tiled.

usage: python bench/vulkan_coopmat_bench.py [--shapes 7b|1.5b] [--tokens 512] [--json]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import harness
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import backends  # noqa: E402
from engine.gguf_model import QTensor  # noqa: E402
from engine.quantize import quantize  # noqa: E402
from engine.tuning import TuningConfig  # noqa: E402

# (N, K, weight type) of one layer's matmuls (qwen2 Q4_K_M: ffn_down is Q6_K in half the layers)
SHAPES = {
    "7b": [
        (37888, 3584, "Q4_K"),
        (18944, 3584, "F16"),  # no block decode: the multiply-adds and tile staging alone
        (3584, 18944, "Q6_K"),
        (4608, 3584, "Q4_K"),
        (3584, 3584, "Q4_K"),
    ],
    "tiny": [(70, 256, "Q4_K")],  # a smoke run on lavapipe
    "1.5b": [
        (2048, 1536, "Q4_K"),
        (1536, 1536, "Q4_K"),
        (17920, 1536, "Q4_K"),
        (1536, 8960, "Q6_K"),
    ],
}
CONFIGS = {
    "tiled": {},
    "coopmat": {"matmul_prefill.variant": "coopmat"},
    "coopmat-one": {"matmul_prefill.variant": "coopmat", "matmul_prefill.one_tile": True},
    "coopmat-one-dbuf": {
        "matmul_prefill.variant": "coopmat",
        "matmul_prefill.one_tile": True,
        "matmul_prefill.buffers": 2,
    },
    "coopmat-one-128x128-w32x64": {
        "matmul_prefill.variant": "coopmat",
        "matmul_prefill.one_tile": True,
        "matmul_prefill.tile_n": 128,
        "matmul_prefill.warp_n": 64,
    },
    "coopmat-one-256x64-w64x32-bk64": {
        "matmul_prefill.variant": "coopmat",
        "matmul_prefill.one_tile": True,
        "matmul_prefill.tile_m": 256,
        "matmul_prefill.warp_m": 64,
        "matmul_prefill.bk": 64,
    },
    "coopmat-128x128-w32x64": {
        "matmul_prefill.variant": "coopmat",
        "matmul_prefill.tile_n": 128,
        "matmul_prefill.warp_n": 64,
    },
    "coopmat-64x64": {
        "matmul_prefill.variant": "coopmat",
        "matmul_prefill.tile_m": 64,
        "matmul_prefill.tile_n": 64,
    },
    "coopmat-bk64": {"matmul_prefill.variant": "coopmat", "matmul_prefill.bk": 64},
    "coopmat-dbuf": {"matmul_prefill.variant": "coopmat", "matmul_prefill.buffers": 2},
    "coopmat-128x128-w32x64-dbuf": {
        "matmul_prefill.variant": "coopmat",
        "matmul_prefill.tile_n": 128,
        "matmul_prefill.warp_n": 64,
        "matmul_prefill.buffers": 2,
    },
    "coopmat-256x64-w64x32-bk64": {
        "matmul_prefill.variant": "coopmat",
        "matmul_prefill.tile_m": 256,
        "matmul_prefill.warp_m": 64,
        "matmul_prefill.bk": 64,
    },
    "coopmat-256x64-w64x32": {
        "matmul_prefill.variant": "coopmat",
        "matmul_prefill.tile_m": 256,
        "matmul_prefill.warp_m": 64,
    },
}


def weight(n: int, k: int, qtype: str, rng: np.random.Generator) -> QTensor:
    rows = (rng.standard_normal((64, k)) * 0.05).astype(np.float32)
    raw = quantize(rows, qtype).view(np.uint8).reshape(64, -1)
    return QTensor("w", qtype, (n, k), np.ascontiguousarray(np.tile(raw, (-(-n // 64), 1))[:n]))


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__.split("\n\n")[0], out=False, listing=False)
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--tokens", type=int, default=512)
    args = ap.parse_args(argv)
    if args.tokens < 2:
        print("--tokens: at least 2 (one token is decode)", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    be = backends.create("vulkan", device=backends.default_device("vulkan"))
    dev = be.device_info()
    rows = []
    for n, k, q in SHAPES[args.shapes]:
        wt = be.load_weight(weight(n, k, q, rng))  # raw blocks: the same for every variant
        x = be.upload(rng.standard_normal((args.tokens, k)).astype(np.float32))
        ref = None
        for name, flat in CONFIGS.items():
            cfg = TuningConfig.default("vulkan").replace(**flat)
            bad = cfg.problems(dev)
            if bad:
                harness.keep_row(
                    rows, {"config": name, "N": n, "K": k, "qtype": q, "refused": bad}, args
                )
                continue
            be.set_config(cfg)
            out = be.download(be.ops.matmul(x, wt))  # warm: pipelines built
            t0 = time.perf_counter()
            for _ in range(args.repeats):
                be.ops.matmul(x, wt)
            be.synchronize()
            dt = (time.perf_counter() - t0) / args.repeats
            ref = out if ref is None else ref
            err = float(np.sum((out - ref) ** 2) / max(float(np.sum(ref**2)), 1e-30))
            row = {
                "config": name,
                "N": n,
                "K": k,
                "qtype": q,
                "ms": round(dt * 1e3, 3),
                "tflops": round(2 * args.tokens * n * k / dt / 1e12, 1),
                "nmse_vs_tiled": err,
            }
            harness.keep_row(rows, row, args)
        del wt
    return harness.close_and_print(be, dev.name, args, rows)


if __name__ == "__main__":
    raise SystemExit(main())
