"""What the Vulkan probe (engine.backends.vulkan.probe, tools/vulkan_probe.py) compiles: its
configs and ``PROBE_BUILDS``, every (shader, defines) pair. A leaf module: ``python -m
engine.backends.vulkan.spirv`` precompiles these with the backend's builds without importing the
probe (which imports spirv to compile)."""

from __future__ import annotations

# (M, N, K) of the pure multiply-add probe; the device's list decides which run.
MMA_SHAPES = ((16, 16, 16), (16, 8, 16), (16, 8, 8))
MMA_NACC = (1, 2, 4, 8, 16)
LDS_ELEMS = (1, 2, 3)  # float16_t, f16vec2, uvec4 shared arrays
# The resident GEMM (matmul_f16.comp) as the engine builds it: (name, (tile_m, tile_n, warp_m,
# warp_n), bk, buffers, threads, mma_n, extra defines, also with compile-time tiles), the
# most telling first
GEMM_CONFIGS = (
    ("default", (128, 128, 64, 32), 32, 2, 256, 16, (), True),
    ("halves", (128, 128, 64, 32), 32, 2, 256, 16, ("SMEM_HALVES",), False),
    ("pairs", (128, 128, 64, 32), 32, 2, 256, 16, ("SMEM_PAIRS",), False),
    ("direct-128t", (128, 128, 64, 64), 32, 2, 128, 16, ("DIRECT",), False),
    ("direct", (128, 128, 64, 32), 32, 2, 256, 16, ("DIRECT",), False),
    ("llama-128t", (128, 128, 64, 64), 32, 2, 128, 16, (), False),
    ("llama-128t-halves", (128, 128, 64, 64), 32, 2, 128, 16, ("SMEM_HALVES",), False),
    ("default-n8", (128, 128, 64, 32), 32, 2, 256, 8, (), False),
    ("direct-128t-n8", (128, 128, 64, 64), 32, 2, 128, 8, ("DIRECT",), False),
    ("512t-w32", (128, 128, 32, 32), 32, 2, 512, 16, (), False),
    ("256x128-bk16", (256, 128, 64, 64), 16, 2, 256, 16, (), False),
    ("default-b1", (128, 128, 64, 32), 32, 1, 256, 16, (), False),
)


def gemm_defines(
    bk: int, nbuf: int, threads: int, mma_n: int, extra: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The defines engine.backends.vulkan.kernels.programs gives the resident GEMM."""
    d = (f"BK={bk}", f"THREADS={threads}", f"MMA_N={mma_n}", *extra)
    if "DIRECT" not in extra:
        d += (f"BUFFERS={nbuf}",)
    return tuple(sorted(d))


def mma_defines(m: int, n: int, k: int, f16acc: bool, nacc: int | None, lds: int = 0) -> tuple:
    d = [f"CM_M={m}", f"CM_N={n}", f"CM_K={k}"]
    d += ["ACC_F16"] if f16acc else []
    d += [f"NACC={nacc}"] if nacc else ["NACC_SPEC"]
    d += [f"LDS={lds}"] if lds else []
    return tuple(sorted(d))


def fixed_tile_defines(
    tiles: tuple[int, int, int, int],
    bk: int,
    nbuf: int,
    threads: int,
    mma_n: int,
    extra: tuple[str, ...] = (),
) -> tuple[str, ...]:
    tm, tn, wm, wn = tiles
    fixed = ("FIXED_TILES", f"FT_M={tm}", f"FT_N={tn}", f"FT_WM={wm}", f"FT_WN={wn}")
    return tuple(sorted(fixed + gemm_defines(bk, nbuf, threads, mma_n, extra)))


def probe_builds() -> list[tuple[str, tuple[str, ...]]]:
    out = [("probe_copy", ("COPY",)), ("probe_copy", ())]
    for m, n, k in MMA_SHAPES:
        for f16 in (False, True):
            for nacc in (*MMA_NACC, None):
                out.append(("probe_mma", mma_defines(m, n, k, f16, nacc)))
    for f16 in (False, True):
        for e in LDS_ELEMS:
            out.append(("probe_mma", mma_defines(16, 16, 16, f16, 8, e)))
    for _, tiles, bk, nbuf, threads, mma_n, extra, fixed in GEMM_CONFIGS:
        if fixed:
            defs = fixed_tile_defines(tiles, bk, nbuf, threads, mma_n, extra)
            out.append(("matmul_f16", defs))
    return sorted(set(out))


PROBE_BUILDS = probe_builds()
