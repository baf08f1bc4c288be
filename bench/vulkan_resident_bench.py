"""The Vulkan prefill GEMM alone, by GPU timestamps: matmul_prefill.tiled and .coopmat (dequant
in the k-loop) against .resident (fp16 copies, shaders/vulkan/matmul_f16.comp) at knob samples,
on one layer's 7B shapes. TFLOP/s from the GEMM kernel's GPU time (the fastest of --repeats: a
shared GPU inflates some); resident's activation conversion (x16) and its one-time weight copy
(w16) are reported apart; NMSE against the first config run; build_s: set_config plus the first
GEMM (pipeline creation, the driver's compile). $FLEETTUNE_VK_DEVICE picks the GPU.

usage: python bench/vulkan_resident_bench.py [--shapes 7b|1.5b|tiny] [--tokens 512] [--repeats 5]
       [--only NAME ...] [--stats] [--json]

--stats: each GEMM pipeline's registers and local memory from the driver (FLEETTUNE_VK_STATS=1,
VK_KHR_pipeline_executable_properties), one row per program and specialization.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import harness
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.vulkan_coopmat_bench import weight  # noqa: E402
from engine import backends  # noqa: E402
from engine.tuning import TuningConfig  # noqa: E402

# (N, K, weight type): attn_output, ffn_up, ffn_down (Q6_K in half the layers), gate+up fused,
# attn_k / attn_v (64 workgroups of 64 x 64 at T = 512: split_k's case)
SHAPES = {
    "7b": [
        (3584, 3584, "Q4_K"),
        (18944, 3584, "Q4_K"),
        (3584, 18944, "Q6_K"),
        (37888, 3584, "Q4_K"),
        (512, 3584, "Q4_K"),
    ],
    # the 1.5B: q/o, gate (or up), down, k/v (48, 280, 48 and 8 workgroups of 128 x 128)
    "1.5b": [
        (1536, 1536, "Q4_K"),
        (8960, 1536, "Q4_K"),
        (1536, 8960, "Q6_K"),
        (256, 1536, "Q4_K"),
    ],
    "tiny": [(70, 256, "Q4_K")],  # a smoke run on lavapipe
}
R = "matmul_prefill."


def _res(**knobs: object) -> dict[str, object]:
    return {R + "variant": "resident"} | {R + k: v for k, v in knobs.items()}


CONFIGS: dict[str, dict[str, object]] = {
    "resident": _res(),
    "resident-fill0": _res(fill_groups=0),  # the 128 x 128 tiles on every shape
    "coopmat": {R + "variant": "coopmat"},
    "tiled": {},
    "resident-b1": _res(buffers=1),
    "resident-pairs": _res(smem_pairs=True),
    "resident-bk64": _res(bk=64, buffers=1),
    "resident-64x128-w32x32": _res(tile_m=64, warp_m=32),
    "resident-128x64-w32x32": _res(tile_n=64, warp_m=32),
    "resident-256x128-w64x64": _res(tile_m=256, warp_n=64, buffers=1),
    "resident-128x256-w64x64": _res(tile_n=256, warp_n=64, buffers=1),
    "coopmat-one-dbuf": {R + "variant": "coopmat", R + "one_tile": True, R + "buffers": 2},
    # vk (issue 14): the 7B shapes after store_unrolled, one hypothesis a row. Global-load
    # latency exposed with one step of prefetch and one workgroup an SM: a longer or shorter
    # k step, more subgroups or workgroups per SM (128 threads of 64 x 64 is ~2 an SM by
    # registers); the shared traffic per multiply-add (64 x 64 subgroup tiles)
    "res-bk16": _res(bk=16),
    "res-128t": _res(threads=128, warp_n=64),
    "res-128t-bk16": _res(threads=128, warp_n=64, bk=16),
    "res-128t-bk64-b1": _res(threads=128, warp_n=64, bk=64, buffers=1),
    "res-512t": _res(threads=512, warp_m=32, warp_n=32),
    "res-256x128-bk16": _res(tile_m=256, warp_n=64, bk=16),
    "res-128x256-bk16": _res(tile_n=256, warp_n=64, bk=16),
    "res-128x64-128t": _res(tile_n=64, threads=128),
    "res-n8": _res(mma_n=8),
    "res-direct-128t": _res(threads=128, warp_n=64, direct=True),
    # matmul_prefill.prefetch 2: the tile loads issued two k-steps ahead
    "res-pf2": _res(prefetch=2),
    "res-128t-pf2": _res(threads=128, warp_n=64, prefetch=2),
    "res-pf2-bk16": _res(prefetch=2, bk=16),
    "res-128x256-bk16-pf2": _res(tile_n=256, warp_n=64, bk=16, prefetch=2),
    # matmul_prefill.split_k: grids under fill_groups (the 7B q/o/down) keep the 128 x 128
    # tiles over 2-4 k-ranges instead of the 64 x 64 tiles
    "res-sk2": _res(split_k=2),
    "res-sk3": _res(split_k=3),
    "res-sk4": _res(split_k=4),
    "res-pf2-sk3": _res(prefetch=2, split_k=3),
    # after the checkpoint (prefetch 2 the default): q/o/down (112 workgroups) on the 128 x 128
    # tiles, k/v (16) on 64 x 64, at bk 32 and 16 (no 64 x 64 tiling fits bk 16 at 256 threads:
    # k/v there stay on 16 workgroups unless split_k)
    "res-fill64": _res(fill_groups=64),
    "res-fill64-sk4": _res(fill_groups=64, split_k=4),
    "res-bk16-fill64-sk4": _res(fill_groups=64, bk=16, split_k=4),
    # vk (issue 14): split_k per shape (split_groups): the 1.5B's q/o/down on 48 workgroups
    # of 128 x 128 split 2 (one wave), its k/v on 64 x 64 split 4; the 7B's q/o/down unsplit
    "res-fill32": _res(fill_groups=32),
    "res-fill32-sg96-sk4": _res(fill_groups=32, split_groups=96, split_k=4),
    "res-fill32-sg128-sk4": _res(fill_groups=32, split_groups=128, split_k=4),
    "res-fill32-sg256-sk4": _res(fill_groups=32, split_groups=256, split_k=4),
    "res-fill32-sg256-sk3": _res(fill_groups=32, split_groups=256, split_k=3),
}


def gemm_stats(be: object, seen: set) -> list[dict[str, object]]:
    """Registers and local memory of each GEMM pipeline built since (not the fp16 conversions;
    ``seen`` collects the keys reported)."""
    from engine.backends.vulkan.pipelines import executable_statistics

    out: list[dict[str, object]] = []
    for key, p in be.pipes.pipelines.items():  # type: ignore[attr-defined]
        program, spec, sg = key
        if not p.name.startswith("matmul_prefill") or ".x16" in p.name or ".w16" in p.name:
            continue
        if key in seen:
            continue
        seen.add(key)
        st = executable_statistics(be.dev.device, p.handle)  # type: ignore[attr-defined]
        keep = {k: v for k, v in st.items() if "Register" in k or "Local" in k}
        out.append(
            {"kernel": p.name, "defines": list(program.defines), "spec": dict(spec), "sg": sg}
            | {"stats": keep or st}
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__.split("\n\n")[0], out=False, listing=False)
    ap.add_argument("--shapes", choices=sorted(SHAPES), default="7b")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--only", action="append", default=None, help="config names (repeatable)")
    ap.add_argument("--stats", action="store_true", help="registers / local memory per GEMM")
    args = ap.parse_args(argv)
    if args.tokens < 2 or args.repeats < 1:
        print("--tokens: at least 2, --repeats: at least 1", file=sys.stderr)
        return 2
    names = args.only or list(CONFIGS)
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"--only: unknown config {unknown[0]!r}; known: {list(CONFIGS)}", file=sys.stderr)
        return 2
    if args.stats:  # read by device.py when the device opens
        os.environ["FLEETTUNE_VK_STATS"] = "1"
    rng = np.random.default_rng(0)
    be = backends.create("vulkan", device=backends.default_device("vulkan"))
    dev = be.device_info()
    # Configs outer (the important ones first: NVIDIA's driver may compile a large tile for a
    # long time), the weights loaded once; resident configs share the fp16 copies.
    shapes = SHAPES[args.shapes]
    wts = [be.load_weight(weight(n, k, q, rng)) for n, k, q in shapes]
    xs = {
        k: be.upload(rng.standard_normal((args.tokens, k)).astype(np.float32)) for _, k, _ in shapes
    }
    refs: dict[int, np.ndarray] = {}
    seen: set = set()
    rows = []
    for name in names:
        cfg = TuningConfig.default("vulkan").replace(**CONFIGS[name])
        bad = cfg.problems(dev)
        if bad:
            harness.keep_row(rows, {"config": name, "refused": bad}, args)
            continue
        t0 = time.perf_counter()
        try:
            be.set_config(cfg)
        except Exception as e:  # noqa: BLE001 - a broken config is a row, not the end
            harness.keep_row(
                rows, {"config": name, "error": f"{type(e).__name__}: {e}"[:300]}, args
            )
            continue
        for i, ((n, k, q), wt) in enumerate(zip(shapes, wts, strict=True)):
            row: dict[str, object] = {"config": name, "N": n, "K": k, "qtype": q}
            x, flop = xs[k], 2 * args.tokens * n * k
            try:
                be.set_profiling(True)
                out = be.download(be.ops.matmul(x, wt))  # pipelines built; resident: the fp16 copy
            except Exception as e:  # noqa: BLE001
                harness.keep_row(rows, row | {"error": f"{type(e).__name__}: {e}"[:300]}, args)
                continue
            first = {kn: kt.total_ms for kn, kt in be.profile().kernels.items()}
            if i == 0:
                row["build_s"] = round(time.perf_counter() - t0, 2)
            # the fastest of the repeats: a GPU shared with other work inflates some of them
            gemm = x16 = float("inf")
            for _ in range(args.repeats):
                be.ops.matmul(x, wt)
                be.synchronize()
                per = {kname: kt.total_ms for kname, kt in be.profile().kernels.items()}
                gemm = min(gemm, sum(v for kname, v in per.items() if ".x16" not in kname))
                x16 = min(x16, sum(v for kname, v in per.items() if ".x16" in kname))
            be.set_profiling(False)
            w16 = sum(ms for kname, ms in first.items() if ".w16" in kname)
            ref = refs.setdefault(i, out)
            err = float(np.sum((out - ref) ** 2) / max(float(np.sum(ref**2)), 1e-30))
            row |= {
                "gemm_ms": round(gemm, 4),
                "tflops": round(flop / (gemm * 1e-3) / 1e12, 1),
                "x16_ms": round(x16, 4),
                "tflops_with_x16": round(flop / ((gemm + x16) * 1e-3) / 1e12, 1),
                "w16_once_ms": round(w16, 3),
                "nmse_vs_first": err,
            }
            harness.keep_row(rows, row, args)
        if args.stats:  # this config's pipelines (printed now: a timeout may end the run)
            for r in gemm_stats(be, seen):
                harness.keep_row(rows, {"config": name} | r, args)
    return harness.close_and_print(be, dev.name, args, rows)


if __name__ == "__main__":
    raise SystemExit(main())
