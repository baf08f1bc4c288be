"""Vulkan prompt matmul (T > 1): tiled, cooperative-matrix, resident and
batched-column variants and their constraints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.tuning.memory import dense_copies
from engine.tuning.registry import (
    HOST,
    REGISTRY,
    SUBGROUP_SIZE,
    Constraint,
    Param,
    define,
    spec,
    variant,
)
from engine.tuning.variants.vulkan.common import (
    _SUBGROUP,
    COOPMAT_SHAPE,
    MAX_COLS,
    QUANT_TYPES,
    B,
    _coopmat_ok,
    _device_takes_wg,
    _extra,
    _rows_per_wg,
    _selected,
    _subgroup_wg,
    _wg,
    _wg_fits,
)

if TYPE_CHECKING:
    from engine.device_info import DeviceInfo
    from engine.tuning.config import TuningConfig


def _tiles_fit(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_prefill")
    limit = _extra(dev, "max_shared_memory")
    need = 32 * (int(c.tile_m) + int(c.tile_n) + 8) * 4
    return limit is None or need <= int(limit)


def _vec4_tiles(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_prefill")
    return not c.vec4 or (int(c.tile_m) % 64 == 0 and int(c.tile_n) % 64 == 0)


def _coopmat_subgroups(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    """At most 64 lanes (the required size, else any the device may pick), and a required size
    the device can require of a 256-thread compute shader."""
    req = int(cfg.knobs("matmul_prefill").subgroup_size)
    if dev is None:
        return True
    if req == 0:
        return int(_extra(dev, "max_subgroup_size", dev.subgroup_size)) <= 64
    lo, hi = int(_extra(dev, "min_subgroup_size", 0)), int(_extra(dev, "max_subgroup_size", 0))
    max_sgs = int(_extra(dev, "max_compute_workgroup_subgroups", 0) or 0)
    return (
        bool(_extra(dev, "subgroup_size_control", False))
        and bool(_extra(dev, "subgroup_size_control_compute", False))
        and lo <= req <= hi
        and (max_sgs == 0 or 256 <= max_sgs * req)
    )


def _coopmat_tiles(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_prefill")
    tm, tn, wm, wn = int(c.tile_m), int(c.tile_n), int(c.warp_m), int(c.warp_n)
    return tm % wm == 0 and tn % wn == 0 and (tm // wm) * (tn // wn) <= 16


def _coopmat_one_tile(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_prefill")
    if not c.one_tile:
        return True
    tiles = (int(c.tile_m) // int(c.warp_m)) * (int(c.tile_n) // int(c.warp_n))
    if tiles == 0:  # a subgroup tile past the tile: _coopmat_tiles refuses it (not 256 % 0)
        return False
    sg = int(c.subgroup_size)
    if sg == 0 and dev is not None:
        lo, hi = _extra(dev, "min_subgroup_size", 0), _extra(dev, "max_subgroup_size", 0)
        sg = dev.subgroup_size if lo == hi else 0  # a device that picks 32 or 64 must be told
    if sg == 0:
        return dev is None and 256 % tiles == 0 and 256 // tiles in (32, 64)
    return tiles * sg == 256


def _coopmat_shared(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_prefill")
    limit = _extra(dev, "max_shared_memory")
    tiles = int(c.buffers) * (int(c.bk) + 8) * (int(c.tile_m) + int(c.tile_n))
    need = 2 * tiles + 8 * 1024
    return limit is None or need <= int(limit)


def _coopmat_store_unrolled(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    """STORE_UNROLLED's fixed lane rounds (matmul_coopmat.comp: 8 over a 256-float fragment,
    matmul_f16.comp: 2 over 64 uvec4) cover a fragment only with 32 lanes or more."""
    c = cfg.knobs("matmul_prefill")
    if not c.store_unrolled or dev is None:
        return True
    sg = int(c.subgroup_size) or int(_extra(dev, "min_subgroup_size", 0) or dev.subgroup_size)
    return sg >= 32


def _resident_pad(n: int, k: int) -> tuple[int, int]:
    """The shape of matmul_prefill.resident's fp16 copy of an [n, k] weight (resident.py's
    rpad and kpad; imported from there would pull in the GPU binding)."""
    return -(-n // 256) * 256, -(-k // 64) * 64


def _resident_tiles(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    """Whole subgroup tiles, and exactly one per subgroup of the 256 threads: the subgroup size
    required, or the device's only one (with no device: 32 or 64 lanes per tile)."""
    c = cfg.knobs("matmul_prefill")
    tm, tn, wm, wn = int(c.tile_m), int(c.tile_n), int(c.warp_m), int(c.warp_n)
    if tm % wm or tn % wn:
        return False
    tiles = (tm // wm) * (tn // wn)
    threads = int(c.threads)
    # every thread loads whole 16-byte runs of both tiles each k-step (no remainder)
    q = int(c.bk) // 8
    if (tm * q) % threads or (tn * q) % threads:
        return False
    sg = int(c.subgroup_size)
    if sg == 0 and dev is not None:
        lo, hi = _extra(dev, "min_subgroup_size", 0), _extra(dev, "max_subgroup_size", 0)
        sg = dev.subgroup_size if lo == hi else 0
    if sg == 0:
        return dev is None and threads % tiles == 0 and threads // tiles in (32, 64)
    return tiles * sg == threads


COOPMAT_SHAPE_N8 = "16x8x16:f16*f16+f32=f32"


def _resident_mma_shape(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    if int(cfg.knobs("matmul_prefill").mma_n) == 16 or dev is None:
        return True
    return COOPMAT_SHAPE_N8 in _extra(dev, "coopmat_shapes", [])


def _resident_one_smem_type(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_prefill")
    return not (c.smem_pairs and c.smem_halves)


def _resident_threads_fit(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    return _device_takes_wg(int(cfg.knobs("matmul_prefill").threads), dev)


def _resident_shared(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_prefill")
    limit = _extra(dev, "max_shared_memory")
    tiles = 2 * int(c.buffers) * (int(c.bk) + 8) * (int(c.tile_m) + int(c.tile_n))
    if c.direct:
        tiles = 0  # no shared tiles
    slots = 16 * 64 * (int(c.threads) // 32)  # matmul_f16.comp's SH_LEN: result slots
    return limit is None or max(tiles, slots) <= int(limit)


_MAX_COLS = Param(
    "max_cols",
    MAX_COLS,
    32,
    "prompt columns per workgroup pass (MAX_COLS: the size of the per-thread sums[] "
    "accumulators); a chunk of prefill.chunk_tokens is ceil(chunk / max_cols) passes of one "
    "dispatch",
    spec(2),
    edge=True,
)


# What the two cooperative-matrix GEMMs (coopmat, resident) declare alike.
_COOP_TILE_M = Param("tile_m", (64, 128, 256), 128, "weight rows per workgroup", spec(0))
_COOP_WARP_N = Param("warp_n", (16, 32, 64), 32, "prompt columns per subgroup tile", spec(3))
_COOP_SUBGROUP = Param(
    "subgroup_size",
    (0, 32, 64),
    0,
    "required subgroup size (wave32 / wave64 on RDNA); 0: the device default",
    SUBGROUP_SIZE,
)
_COOPMAT_DEVICE = Constraint(
    "the device reports VK_KHR_cooperative_matrix (cooperativeMatrix, "
    f"shaderFloat16, vulkanMemoryModel) with the subgroup shape {COOPMAT_SHAPE} "
    "(lavapipe / Mesa 22 have no cooperative matrices)",
    _coopmat_ok,
)

REGISTRY.declare(
    B,
    "matmul_prefill",
    [
        # First, so the default: on the H200 it runs a 7B pp512 prefill 7.5x faster than kpar
        # (0.42 s of kernels against 3.36 s) and on llvmpipe 1.5x; kpar and serial stay for the
        # agent to compare per device class (the seed's RDNA4 shipped kpar).
        variant(
            "tiled",
            params=(
                Param(
                    "tile_m",
                    (32, 64, 128),
                    64,
                    "output rows per workgroup (weight rows)",
                    spec(0),
                ),
                Param(
                    "tile_n",
                    (16, 32, 64, 128),
                    64,
                    "prompt columns per workgroup",
                    spec(1),
                    edge=True,
                ),
                Param(
                    "vec4",
                    (False, True),
                    False,
                    "each thread owns contiguous rows/columns read as vec4 from shared memory "
                    "(a quarter of the load instructions); tiles multiples of 64",
                    define(),
                ),
            ),
            constraints=(
                _wg_fits("matmul_prefill", fixed=256),  # matmul_tiled.comp's local size
                Constraint(
                    "32 x (tile_m + tile_n + 8) floats of shared memory <= "
                    "maxComputeSharedMemorySize",
                    _tiles_fit,
                ),
                Constraint("vec4 needs tile_m and tile_n multiples of 64", _vec4_tiles),
            ),
            quant_types=QUANT_TYPES,
            source="vulkan/matmul_tiled.comp",
            numeric="order_only",
            doc="shared-memory tiled GEMM with fused dequant: a 256-thread workgroup owns a "
            "tile_m x tile_n block of y, weights decoded once per tile_n columns",
        ),
        # Tensor cores: GL_KHR_cooperative_matrix, fp16 tiles into fp32 (fp16 numeric class).
        # Not the default: only devices with the extension can run it (see _coopmat_ok).
        variant(
            "coopmat",
            params=(
                _COOP_TILE_M,
                Param(
                    "tile_n", (32, 64, 128), 64, "prompt columns per workgroup", spec(1), edge=True
                ),
                Param("warp_m", (16, 32, 64), 32, "weight rows per subgroup tile", spec(2)),
                _COOP_WARP_N,
                Param(
                    "bk",
                    (32, 64),
                    32,
                    "k per shared-memory step (fewer barriers against more shared memory)",
                    define(),
                ),
                Param(
                    "one_tile",
                    (False, True),
                    False,
                    "each subgroup owns exactly one subgroup tile (tiles x subgroup size = 256): "
                    "no pass loop or idle accumulators",
                    define(),
                ),
                Param(
                    "buffers",
                    (1, 2),
                    1,
                    "tile buffers: 2 decodes the next k-step while this one's multiply-adds "
                    "run, one barrier per step, twice the tiles' shared memory",
                    define(),
                ),
                Param(
                    "store_unrolled",
                    (False, True),
                    False,
                    "the bounded result store's lane loop with a compile-time trip count "
                    "(subgroups of at least 32 lanes), so the driver can unroll the accumulator "
                    "loops around it; the same bits (H200: still 256 B of local memory and 18.7 "
                    "TFLOP/s, the pass loop keeps the accumulators indexed at run time)",
                    define(),
                ),
                _COOP_SUBGROUP,
            ),
            constraints=(
                _wg_fits("matmul_prefill", fixed=256),  # matmul_coopmat.comp's local size
                _COOPMAT_DEVICE,
                Constraint(
                    "subgroup size <= 64 (a 256-thread workgroup of >= 4 subgroups covers the "
                    "block's subgroup tiles); a required subgroup_size within the device's "
                    "subgroup-size-control range",
                    _coopmat_subgroups,
                ),
                Constraint(
                    "warp_m divides tile_m, warp_n divides tile_n, and the block has at most 16 "
                    "subgroup tiles (4 per subgroup at wave64)",
                    _coopmat_tiles,
                ),
                Constraint(
                    "one_tile needs (tile_m / warp_m) x (tile_n / warp_n) x subgroup size = 256, "
                    "the subgroup size fixed (required, or the device has one size)",
                    _coopmat_one_tile,
                ),
                Constraint(
                    "buffers x (bk + 8) x (tile_m + tile_n) halves + 8 KiB of shared memory <= "
                    "maxComputeSharedMemorySize",
                    _coopmat_shared,
                ),
                Constraint(
                    "store_unrolled needs subgroups of at least 32 lanes (the required size, "
                    "else the device's smallest)",
                    _coopmat_store_unrolled,
                ),
            ),
            quant_types=QUANT_TYPES,
            source="vulkan/matmul_coopmat.comp",
            numeric="fp16",
            doc="cooperative-matrix (tensor-core) tiled GEMM with fused dequant to fp16 tiles, "
            "fp32 accumulation: 16x16x16 multiply-adds, a subgroup per warp_n x warp_m tile",
        ),
        # Tensor cores without dequant in the k-loop: fp16 copies made once (as CUDA's
        # matmul_prefill.resident). Not the default: cooperative-matrix devices only.
        variant(
            "resident",
            params=(
                _COOP_TILE_M,
                Param(
                    "tile_n",
                    (64, 128, 256),
                    128,
                    "prompt columns per workgroup",
                    spec(1),
                    edge=True,
                ),
                Param("warp_m", (16, 32, 64), 64, "weight rows per subgroup tile", spec(2)),
                _COOP_WARP_N,
                Param(
                    "bk",
                    (16, 32, 64),
                    32,
                    "k per shared-memory step (fewer barriers against more shared memory; 16: "
                    "room for double-buffered 256-row tiles in 48 KiB)",
                    define(),
                ),
                Param(
                    "smem_halves",
                    (False, True),
                    False,
                    "shared tiles as float16_t, the matrices' own element type (strides and "
                    "offsets in halves) instead of uvec4",
                    define(),
                ),
                Param(
                    "direct",
                    (False, True),
                    False,
                    "no shared tiles: each subgroup loads its matrices straight from the fp16 "
                    "copies (L1/L2 serve the reuse), no barriers; bk sets the k per loop step",
                    define(),
                ),
                Param(
                    "mma_n",
                    (16, 8),
                    16,
                    "weight rows per multiply-add: 16 (16x16x16) or 8 (16x8x16, NVIDIA's native "
                    "mma.sync shape; the device must list it)",
                    define(),
                ),
                Param(
                    "threads",
                    (128, 256, 512),
                    256,
                    "the GEMM's workgroup size: (tile_m / warp_m) x (tile_n / warp_n) subgroup "
                    "tiles of that many lanes each (128 = four 64 x 64 tiles of 16 "
                    "accumulators, llama.cpp's coopmat shape)",
                    define(),
                ),
                Param(
                    "buffers",
                    (1, 2),
                    2,
                    "tile buffers: 2 stores the next k-step's tiles (fetched into registers "
                    "before this step's multiply-adds) into the other, one barrier per step",
                    define(),
                ),
                Param(
                    "prefetch",
                    (1, 2),
                    # 2 (helper vk checkpoint, H200, 7B shapes at T = 512, GPU timestamps,
                    # bench/vulkan_resident_bench.py): 3584x3584 82 -> 96, 18944x3584 137 ->
                    # 156, 3584x18944 75 -> 90, 37888x3584 151 -> 169 TFLOP/s; the 7B pp512
                    # prefill GEMMs 70.2 -> 60.7 ms (scripts/vulkan_profile.py (git history),
                    # res_su_int8_fa_k64_fl -> _pf2); bit-identical to 1 in the GPU tests
                    2,
                    "k-steps ahead that the tile loads are issued (2: two register sets, each "
                    "load has two steps of multiply-adds to arrive instead of one, the step "
                    "loop unrolled by two; the same bits); with buffers 1 or direct it is 1",
                    define(),
                ),
                Param(
                    "fill_groups",
                    (0, 32, 64, 128, 256, 512),
                    # 256 until an end-to-end run shows better: fill_groups 64 alone took the
                    # 7B's pp512 7,501 -> 9,072 tok/s and 32 with split_groups 128, split_k 4
                    # to 8,929 (vk checkpoint, H200); the 1.5B with the latter (scripts/
                    # vulkan_decode_speed.py best) read 17,036 in the closing run, not validated
                    256,
                    "a GEMM whose tile grid has fewer workgroups than this runs 64 x 64 tiles "
                    "(4x the workgroups; the same per-element summation order, so the same "
                    "bits): the 7B q/o/down projections launch 112 workgroups of 128 x 128 on a "
                    "132-SM GPU, k/v 16; 0: always the tile knobs; 64: q/o/down on the tiles, "
                    "k/v on 64 x 64 (at bk 16 + prefetch 2 the 128 x 128 tiles ran q/o 115 and "
                    "down 98 TFLOP/s on 112 workgroups against 96 / 90 for 64 x 64 at bk 32)",
                    HOST,
                ),
                Param(
                    "split_k",
                    (1, 2, 3, 4),
                    1,
                    "a GEMM whose grid is still under fill_groups workgroups after the 64 x "
                    "64 tiles (the 7B k/v at pp512: 64 on a 132-SM GPU, 76 us each at the vk "
                    "checkpoint) splits k into up to this many ranges, as many as fill the "
                    "grid (a grid dimension; each range's fp32 partial sums, then one pass "
                    "adds them in range order); 1: no split",
                    HOST,
                ),
                Param(
                    "fuse_x16",
                    (0, 1),  # an int as every fuse_* knob (validate's blame sets them to 0)
                    0,
                    "the prefill's residual add + RMSNorm (rms_norm.fuse_add) and SwiGLU also "
                    "store their rows as the next GEMMs' padded fp16 input (PASS_X16's "
                    "layout): no conversion dispatch and barrier before q/k/v, gate/up and down "
                    "(the 1.5B at pp512: 84 of 112 x16 dispatches, ~0.4 ms of GPU time)",
                    HOST,
                ),
                Param(
                    "split_groups",
                    (0, 96, 128, 192, 256),
                    0,
                    "split_k per shape (the 1.5B's q/o/down on 48 workgroups of 128 x 128): a "
                    "grid, after the fill_groups step, of at most half this many workgroups "
                    "splits k into groups // this ranges (at most split_k), on whichever tiles "
                    "it runs, so the split grid stays within one wave of one workgroup an SM "
                    "(128: the 1.5B's q/o/down 48 -> 96, its k/v on 64 x 64 32 -> 128; the "
                    "7B's 112 unsplit); 0: split_k's own rule (grids under fill_groups, ranges "
                    "rounded up to reach it)",
                    HOST,
                ),
                Param(
                    "smem_pairs",
                    (False, True),
                    False,
                    "shared tiles as f16vec2 pairs (llama.cpp's coopmat layout) instead of "
                    "uvec4: the same bytes, another element type for the driver's matrix loads",
                    define(),
                ),
                Param(
                    "store_unrolled",
                    (False, True),
                    True,
                    "the bounded result store's lane loop with a compile-time trip count "
                    "(subgroups of 32 / 64: two rounds), so the driver can unroll the "
                    "accumulator loops around it and keep the accumulators in registers (H200: "
                    "172 registers + 256 B local memory -> 142 and none, the 1.5B prefill GEMMs "
                    "38.1 -> 18.8 ms); the same stores, the same bits",
                    define(),
                ),
                _COOP_SUBGROUP,
            ),
            constraints=(
                Constraint(
                    "at most one of smem_pairs, smem_halves (the shared element type)",
                    _resident_one_smem_type,
                ),
                Constraint(
                    f"mma_n 8 needs the device to list {COOPMAT_SHAPE_N8}",
                    _resident_mma_shape,
                ),
                Constraint(
                    "threads <= the device's maxComputeWorkGroupInvocations / size[0]",
                    _resident_threads_fit,
                ),
                _COOPMAT_DEVICE,
                Constraint(
                    "subgroup size <= 64; a required subgroup_size within the device's "
                    "subgroup-size-control range",
                    _coopmat_subgroups,
                ),
                Constraint(
                    "warp_m divides tile_m, warp_n divides tile_n, (tile_m / warp_m) x "
                    "(tile_n / warp_n) x subgroup size = threads (one subgroup tile per "
                    "subgroup; the subgroup size required, or the device has one size), and "
                    "threads divides tile_m x bk / 8 and tile_n x bk / 8",
                    _resident_tiles,
                ),
                Constraint(
                    "max(buffers x (bk + 8) x (tile_m + tile_n) halves, threads / 32 result "
                    "slots of 1 KiB) of shared memory <= maxComputeSharedMemorySize",
                    _resident_shared,
                ),
                Constraint(
                    "store_unrolled needs subgroups of at least 32 lanes (the required size, "
                    "else the device's smallest)",
                    _coopmat_store_unrolled,
                ),
            ),
            quant_types=QUANT_TYPES,
            source="vulkan/matmul_f16.comp",
            numeric="fp16",
            # each 2-D matmul weight's fp16 copy, rows to 256 and k to 64 (vulkan/resident.py)
            memory=dense_copies(2, "f16", stacked=False, pad=_resident_pad),
            doc="each 2-D weight dequantized once to an fp16 copy [N, Kp] kept on the device "
            "(counted in memory_report's weights; 7B ~14 GiB more), activations converted to "
            "fp16 per GEMM, then a cooperative-matrix GEMM with no dequant in its k-loop: "
            "16-byte tile loads into double-buffered shared memory, one warp_m x warp_n tile "
            "of 16x16 fp32 accumulators per subgroup",
        ),
        _selected(
            "vulkan/matmul_prefill.comp",
            "kpar",
            params=(_wg(64), _rows_per_wg(2), _MAX_COLS, _SUBGROUP),
            constraints=_subgroup_wg("matmul_prefill"),
            doc="batched columns, one subgroup per row splits K, subgroupAdd per column",
        ),
        _selected(
            "vulkan/matmul_prefill.comp",
            "serial",
            params=(_wg(64), _MAX_COLS),
            constraints=(_wg_fits("matmul_prefill"),),
            doc="batched columns, one thread per row walks all of K",
        ),
    ],
    doc="matmul with T > 1 (a batched-prefill chunk)",
)
