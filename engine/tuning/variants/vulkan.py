"""The Vulkan backend's kernels: ops, variants, parameters, constraints (plain data).

Imports nothing from the Vulkan binding: the agent reads this on head nodes without Vulkan.
Each knob's binding says how it reaches the shader; VulkanBackend builds pipelines by a loop over
them. Most are specialization constants of a shader in shaders/vulkan (a new value is a new
pipeline, not a new SPIR-V build; the shader's default for each equals the registry's, checked
by tests/test_knob_bindings.py); ``matmul_prefill.vec4`` and ``.bk`` are defines (new SPIR-V
builds); ``subgroup_size`` is set at pipeline creation; ``submit.*`` shapes command recording;
the grid sizes ``attention.splits``/``splits_prefill`` and ``argmax.slices`` are push constants.
Constraints read the device from DeviceInfo (``subgroup_size`` and ``extra``: limits and
subgroup-size-control ranges, filled by engine.backends.vulkan.device); with no device they only
check what does not depend on one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.tuning.memory import dense_copies
from engine.tuning.registry import (
    HOST,
    PUSHED,
    REGISTRY,
    SUBGROUP_SIZE,
    Constraint,
    Param,
    Variant,
    define,
    spec,
)

if TYPE_CHECKING:
    from engine.device_info import DeviceInfo
    from engine.tuning.config import TuningConfig

B = "vulkan"

# Weight types with a decoder in shaders/vulkan/dequant.glsl (Q5_K is not implemented).
QUANT_TYPES = frozenset(
    {"F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "Q4_K", "Q6_K"}
)

# Per-thread accumulators sums[MAX_COLS] of the batched matmul live in registers; beyond 64
# they spill to scratch memory on every device we know, so larger tiles are not offered.
MAX_COLS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 64)

WG_SIZES = (32, 64, 128, 256, 512)
SUBGROUP_SIZES = (0, 8, 16, 32, 64, 128)


def _extra(dev: DeviceInfo | None, key: str, default: int | bool | None = None):  # noqa: ANN202
    return default if dev is None else dev.extra.get(key, default)


def _device_takes_wg(wg: int, dev: DeviceInfo | None) -> bool:
    limit = _extra(dev, "max_workgroup_invocations")
    return limit is None or wg <= min(int(limit), int(_extra(dev, "max_workgroup_size_x", wg)))


def _wg_fits(op: str, fixed: int | None = None) -> Constraint:
    """The op's wg_size (or a shader's ``fixed`` local size) within the device's limits."""

    def check(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
        return _device_takes_wg(fixed or int(cfg.knobs(op).wg_size), dev)

    what = f"{fixed} threads" if fixed else "wg_size"
    return Constraint(f"{what} <= the device's maxComputeWorkGroupInvocations / size[0]", check)


def _effective_subgroup(cfg: TuningConfig, op: str, dev: DeviceInfo | None) -> int | None:
    req = int(cfg.knobs(op).subgroup_size)
    if req:
        return req
    return None if dev is None else dev.subgroup_size


def _subgroup_divides_wg(op: str) -> Constraint:
    def check(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
        sg = _effective_subgroup(cfg, op, dev)
        return sg is None or int(cfg.knobs(op).wg_size) % sg == 0

    return Constraint(
        "wg_size is a multiple of the subgroup size (required or device default): rows are "
        "split per subgroup, a partial subgroup would drop lanes",
        check,
    )


def _subgroup_size_supported(op: str) -> Constraint:
    def check(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
        req = int(cfg.knobs(op).subgroup_size)
        if req == 0 or dev is None:
            return True
        if not _extra(dev, "subgroup_size_control", False):
            return False
        if not _extra(dev, "subgroup_size_control_compute", False):
            return False
        lo, hi = int(_extra(dev, "min_subgroup_size", 0)), int(_extra(dev, "max_subgroup_size", 0))
        if not lo <= req <= hi:
            return False
        max_sgs = int(_extra(dev, "max_compute_workgroup_subgroups", 0) or 0)
        return max_sgs == 0 or int(cfg.knobs(op).wg_size) <= max_sgs * req

    return Constraint(
        "subgroup_size 0 (device default) or a size the device can require for compute shaders "
        "(VK_EXT_subgroup_size_control: minSubgroupSize..maxSubgroupSize)",
        check,
    )


def _shared_fits(op: str, floats_per_thread: int) -> Constraint:
    def check(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
        limit = _extra(dev, "max_shared_memory")
        need = int(cfg.knobs(op).wg_size) * floats_per_thread * 4 + 1024
        return limit is None or need <= int(limit)

    return Constraint("shared memory of the workgroup <= maxComputeSharedMemorySize", check)


def _tpr_le_wg(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_decode")
    return int(c.threads_per_row) <= int(c.wg_size)


def _block_tpr_in_subgroup(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    tpr = int(cfg.knobs("matmul_decode").threads_per_row)
    sg = _effective_subgroup(cfg, "matmul_decode", dev)
    return tpr == 0 or sg is None or tpr <= sg


def _block_rows_per_thread(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_decode")
    return int(c.rows_per_thread) <= int(c.rows_per_wg)


def _fuse_rope_rows(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_decode")
    return not int(c.fuse_rope) or int(c.rows_per_thread) >= 2


SUBGROUP_FEATURE_SHUFFLE = 0x10  # VkSubgroupFeatureFlagBits


def _has_shuffle(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    ops = _extra(dev, "subgroup_operations")
    return ops is None or bool(int(ops) & SUBGROUP_FEATURE_SHUFFLE)


def _tiles_fit(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_prefill")
    limit = _extra(dev, "max_shared_memory")
    need = 32 * (int(c.tile_m) + int(c.tile_n) + 8) * 4
    return limit is None or need <= int(limit)


def _vec4_tiles(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("matmul_prefill")
    return not c.vec4 or (int(c.tile_m) % 64 == 0 and int(c.tile_n) % 64 == 0)


# The cooperative-matrix shape matmul_coopmat.comp uses (coopmat.shape_name's spelling).
COOPMAT_SHAPE = "16x16x16:f16*f16+f32=f32"


def _coopmat_ok(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    if dev is None:
        return True
    return bool(_extra(dev, "cooperative_matrix", False)) and COOPMAT_SHAPE in _extra(
        dev, "coopmat_shapes", []
    )


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


def _wg(default: int, choices: tuple[int, ...] = WG_SIZES) -> Param:
    return Param("wg_size", choices, default, "workgroup size (local_size_x)", spec(0))


def _rows_per_wg(default: int, choices: tuple[int, ...] = (1, 2, 4, 8, 16)) -> Param:
    return Param("rows_per_wg", choices, default, "rows per workgroup", spec(1))


# block's and mmvw's row split (the same meaning in both decode variants)
_LANES_PER_ROW = Param(
    "threads_per_row",
    (0, 4, 8, 16, 32, 64),
    0,
    "lanes of one subgroup per row (0: the whole subgroup)",
    spec(2),
)

_SUBGROUP = Param(
    "subgroup_size",
    SUBGROUP_SIZES,
    0,
    "required subgroup size (VK_EXT_subgroup_size_control); 0: the device default",
    SUBGROUP_SIZE,
)

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

# The seed's schedule (one forward per MAX_COLS tokens) is chunk_tokens == max_cols.
REGISTRY.register_prefill(
    B,
    512,
    doc="prompt in chunks of chunk_tokens tokens through batched matmul, RoPE, KV write, attention",
)

REGISTRY.register(
    B,
    "matmul_decode",
    [
        # The default: decode is memory-bound, and this is the variant built to stream weight
        # bytes (wide loads, scales once per block chunk, x loaded once for several rows); the
        # 8-weights-per-lane subgroup/shmem variants reload scales every 8 weights and ran at
        # ~8-15% of the H200's bandwidth. Not yet timed on a GPU: see docs/vulkan.md.
        Variant(
            B,
            "matmul_decode",
            "block",
            params=(
                _wg(64),
                _rows_per_wg(4, (1, 2, 4, 8, 16, 32)),
                _LANES_PER_ROW,
                Param(
                    "rows_per_thread",
                    (1, 2, 4),
                    2,
                    "rows a lane accumulates at once, sharing each load of x",
                    spec(3),
                ),
                _SUBGROUP,
            ),
            constraints=(
                _wg_fits("matmul_decode"),
                _subgroup_divides_wg("matmul_decode"),
                _subgroup_size_supported("matmul_decode"),
                Constraint(
                    "threads_per_row 0 or at most the subgroup size (required or device "
                    "default): a row's lanes reduce inside one subgroup",
                    _block_tpr_in_subgroup,
                ),
                Constraint("rows_per_thread <= rows_per_wg", _block_rows_per_thread),
                Constraint("the device has subgroup shuffle operations", _has_shuffle),
            ),
            quant_types=QUANT_TYPES,
            source="vulkan/matmul_decode.comp",
            defines=("VARIANT_BLOCK",),
            numeric="order_only",
            doc="DMMV in block-sized chunks per lane: wide weight loads, scales once per chunk, "
            "vec4 x shared by rows_per_thread rows; subgroupAdd or shuffle-xor reduction",
        ),
        Variant(
            B,
            "matmul_decode",
            "subgroup",
            params=(_wg(64), _rows_per_wg(2), _SUBGROUP),
            constraints=(
                _wg_fits("matmul_decode"),
                _subgroup_divides_wg("matmul_decode"),
                _subgroup_size_supported("matmul_decode"),
            ),
            quant_types=QUANT_TYPES,
            source="vulkan/matmul_decode.comp",
            defines=("VARIANT_SUBGROUP",),
            numeric="order_only",
            doc="DMMV, one subgroup per row, lanes split K, subgroupAdd",
        ),
        Variant(
            B,
            "matmul_decode",
            "shmem",
            params=(
                _wg(64),
                _rows_per_wg(2),
                Param(
                    "threads_per_row",
                    (1, 2, 4, 8, 16, 32, 64, 128, 256),
                    32,
                    "threads cooperating on one row (reduced in shared memory)",
                    spec(2),
                ),
            ),
            constraints=(
                _wg_fits("matmul_decode"),
                Constraint("threads_per_row <= wg_size", _tpr_le_wg),
                _shared_fits("matmul_decode", 1),
            ),
            quant_types=QUANT_TYPES,
            source="vulkan/matmul_decode.comp",
            defines=("VARIANT_SHMEM",),
            numeric="order_only",
            doc="DMMV, threads_per_row threads per row, shared-memory tree reduction",
        ),
        # Not the default: int8 activations. The knobs mean what the block variant's do (and
        # threads_per_row / rows_per_thread what CUDA's mmvw's do); the defaults are block's,
        # the values measured best for it on the H200.
        Variant(
            B,
            "matmul_decode",
            "mmvw",
            params=(
                _wg(64),
                _rows_per_wg(4, (1, 2, 4, 8, 16, 32)),
                _LANES_PER_ROW,
                Param(
                    "rows_per_thread",
                    (1, 2, 4),
                    2,
                    "rows a lane accumulates at once, sharing each slot's int8 activations",
                    spec(3),
                ),
                Param(
                    "unroll",
                    (1, 2, 4),
                    2,
                    "slots per lane per iteration (weight loads in flight before use)",
                    spec(4),
                ),
                Param(
                    "fuse_rope",
                    (0, 1),
                    0,
                    "1: q, k, v with their biases in one dispatch that also ropes q and k and "
                    "writes k and v into the KV cache as it stores (a lane's rows are whole RoPE "
                    "pairs; rows_per_thread >= 2): no rope dispatch (as CUDA's fuse_rope)",
                    HOST,
                ),
                Param(
                    "pair_mul",
                    (False, True),
                    True,
                    "two int8 products per 32-bit multiply (16-bit halves, exact) instead of "
                    "byte-by-byte multiply-adds: fewer integer ops per weight",
                    define("PAIR_MUL"),
                ),
                _SUBGROUP,
            ),
            constraints=(
                _wg_fits("matmul_decode"),
                _subgroup_divides_wg("matmul_decode"),
                _subgroup_size_supported("matmul_decode"),
                Constraint(
                    "threads_per_row 0 or at most the subgroup size (required or device "
                    "default): a row's lanes reduce inside one subgroup",
                    _block_tpr_in_subgroup,
                ),
                Constraint("rows_per_thread <= rows_per_wg", _block_rows_per_thread),
                Constraint("the device has subgroup shuffle operations", _has_shuffle),
                Constraint(
                    "fuse_rope needs rows_per_thread >= 2 (a lane holds whole RoPE pairs)",
                    _fuse_rope_rows,
                ),
            ),
            quant_types=QUANT_TYPES,
            source="vulkan/mmvw.comp",
            numeric="int8_activations",
            doc="Q4_K / Q6_K rows against Q8_1 activations with integer dot products (the port "
            "of CUDA's mmvw): a row per cluster of subgroup lanes, up to three matrices per "
            "dispatch (q, k, v; gate, up) and the bias or residual added as it stores; the "
            "norm and SwiGLU before a matmul write the Q8_1 form (quantize_act). Other weight "
            "types run the block DMMV on float activations",
        ),
    ],
    doc="matmul with T == 1 (decode and per-token prefill)",
)

# The Q8_1 producers of matmul_decode.mmvw: quantize (an activation with no Q8_1 form yet), and
# the fused rms_norm and SwiGLU that write it as they store (a decode row, width % 32 == 0).
REGISTRY.register(
    B,
    "quantize_act",
    [
        Variant(
            B,
            "quantize_act",
            "q8_1",
            params=(
                _wg(256),
                Param(
                    "coalesced",
                    (False, True),
                    True,
                    "a thread per value (coalesced; block max and sum through shared memory; "
                    "the norm pass in ceil(D / wg_size) workgroups) instead of a thread per "
                    "32-block",
                    define("Q8_COALESCED"),
                ),
            ),
            constraints=(_wg_fits("quantize_act"), _shared_fits("quantize_act", 1)),
            source="vulkan/q8_quant.comp",
            # Its rounding is budgeted where it is consumed: matmul_decode.mmvw declares
            # int8_activations; a config without mmvw never dispatches it.
            numeric="order_only",
            doc="float32 activations to Q8_1 blocks (int8 + d + d * sum(q)), a thread per "
            "32-block; passes norm (rms_norm + Q8_1) and swiglu (SwiGLU + Q8_1); the split "
            "attention's merge_q8 pass stores the attention output's form the same way",
        )
    ],
    doc="activation quantization feeding matmul_decode.mmvw",
)

REGISTRY.register(
    B,
    "matmul_prefill",
    [
        # First, so the default: on the H200 it runs a 7B pp512 prefill 7.5x faster than kpar
        # (0.42 s of kernels against 3.36 s) and on llvmpipe 1.5x; kpar and serial stay for the
        # agent to compare per device class (the seed's RDNA4 shipped kpar).
        Variant(
            B,
            "matmul_prefill",
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
                    define("VEC4"),
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
        Variant(
            B,
            "matmul_prefill",
            "coopmat",
            params=(
                Param("tile_m", (64, 128, 256), 128, "weight rows per workgroup", spec(0)),
                Param(
                    "tile_n", (32, 64, 128), 64, "prompt columns per workgroup", spec(1), edge=True
                ),
                Param("warp_m", (16, 32, 64), 32, "weight rows per subgroup tile", spec(2)),
                Param("warp_n", (16, 32, 64), 32, "prompt columns per subgroup tile", spec(3)),
                Param(
                    "bk",
                    (32, 64),
                    32,
                    "k per shared-memory step (fewer barriers against more shared memory)",
                    define("BK"),
                ),
                Param(
                    "one_tile",
                    (False, True),
                    False,
                    "each subgroup owns exactly one subgroup tile (tiles x subgroup size = 256): "
                    "no pass loop or idle accumulators",
                    define("ONE_TILE_PER_SUBGROUP"),
                ),
                Param(
                    "buffers",
                    (1, 2),
                    1,
                    "tile buffers: 2 decodes the next k-step while this one's multiply-adds "
                    "run, one barrier per step, twice the tiles' shared memory",
                    define("NBUF"),
                ),
                Param(
                    "store_unrolled",
                    (False, True),
                    False,
                    "the bounded result store's lane loop with a compile-time trip count "
                    "(subgroups of at least 32 lanes), so the driver can unroll the accumulator "
                    "loops around it; the same bits (H200: still 256 B of local memory and 18.7 "
                    "TFLOP/s, the pass loop keeps the accumulators indexed at run time)",
                    define("STORE_UNROLLED"),
                ),
                Param(
                    "subgroup_size",
                    (0, 32, 64),
                    0,
                    "required subgroup size (wave32 / wave64 on RDNA); 0: the device default",
                    SUBGROUP_SIZE,
                ),
            ),
            constraints=(
                _wg_fits("matmul_prefill", fixed=256),  # matmul_coopmat.comp's local size
                Constraint(
                    "the device reports VK_KHR_cooperative_matrix (cooperativeMatrix, "
                    f"shaderFloat16, vulkanMemoryModel) with the subgroup shape {COOPMAT_SHAPE} "
                    "(lavapipe / Mesa 22 have no cooperative matrices)",
                    _coopmat_ok,
                ),
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
        Variant(
            B,
            "matmul_prefill",
            "resident",
            params=(
                Param("tile_m", (64, 128, 256), 128, "weight rows per workgroup", spec(0)),
                Param(
                    "tile_n",
                    (64, 128, 256),
                    128,
                    "prompt columns per workgroup",
                    spec(1),
                    edge=True,
                ),
                Param("warp_m", (16, 32, 64), 64, "weight rows per subgroup tile", spec(2)),
                Param("warp_n", (16, 32, 64), 32, "prompt columns per subgroup tile", spec(3)),
                Param(
                    "bk",
                    (16, 32, 64),
                    32,
                    "k per shared-memory step (fewer barriers against more shared memory; 16: "
                    "room for double-buffered 256-row tiles in 48 KiB)",
                    define("BK"),
                ),
                Param(
                    "smem_halves",
                    (False, True),
                    False,
                    "shared tiles as float16_t, the matrices' own element type (strides and "
                    "offsets in halves) instead of uvec4",
                    define("SMEM_HALVES"),
                ),
                Param(
                    "direct",
                    (False, True),
                    False,
                    "no shared tiles: each subgroup loads its matrices straight from the fp16 "
                    "copies (L1/L2 serve the reuse), no barriers; bk sets the k per loop step",
                    define("DIRECT"),
                ),
                Param(
                    "mma_n",
                    (16, 8),
                    16,
                    "weight rows per multiply-add: 16 (16x16x16) or 8 (16x8x16, NVIDIA's native "
                    "mma.sync shape; the device must list it)",
                    define("MMA_N"),
                ),
                Param(
                    "threads",
                    (128, 256, 512),
                    256,
                    "the GEMM's workgroup size: (tile_m / warp_m) x (tile_n / warp_n) subgroup "
                    "tiles of that many lanes each (128 = four 64 x 64 tiles of 16 "
                    "accumulators, llama.cpp's coopmat shape)",
                    define("WG_THREADS"),
                ),
                Param(
                    "buffers",
                    (1, 2),
                    2,
                    "tile buffers: 2 stores the next k-step's tiles (fetched into registers "
                    "before this step's multiply-adds) into the other, one barrier per step",
                    define("NBUF"),
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
                    define("PREFETCH"),
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
                    define("SMEM_PAIRS"),
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
                    define("STORE_UNROLLED"),
                ),
                Param(
                    "subgroup_size",
                    (0, 32, 64),
                    0,
                    "required subgroup size (wave32 / wave64 on RDNA); 0: the device default",
                    SUBGROUP_SIZE,
                ),
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
                Constraint(
                    "the device reports VK_KHR_cooperative_matrix (cooperativeMatrix, "
                    f"shaderFloat16, vulkanMemoryModel) with the subgroup shape {COOPMAT_SHAPE} "
                    "(lavapipe / Mesa 22 have no cooperative matrices)",
                    _coopmat_ok,
                ),
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
        Variant(
            B,
            "matmul_prefill",
            "kpar",
            params=(_wg(64), _rows_per_wg(2), _MAX_COLS, _SUBGROUP),
            constraints=(
                _wg_fits("matmul_prefill"),
                _subgroup_divides_wg("matmul_prefill"),
                _subgroup_size_supported("matmul_prefill"),
            ),
            quant_types=QUANT_TYPES,
            source="vulkan/matmul_prefill.comp",
            defines=("VARIANT_KPAR",),
            numeric="order_only",
            doc="batched columns, one subgroup per row splits K, subgroupAdd per column",
        ),
        Variant(
            B,
            "matmul_prefill",
            "serial",
            params=(_wg(64), _MAX_COLS),
            constraints=(_wg_fits("matmul_prefill"),),
            quant_types=QUANT_TYPES,
            source="vulkan/matmul_prefill.comp",
            defines=("VARIANT_SERIAL",),
            numeric="order_only",
            doc="batched columns, one thread per row walks all of K",
        ),
    ],
    doc="matmul with T > 1 (a batched-prefill chunk)",
)

_SIMPLE = [
    ("embedding", "default", "embedding.comp", (), "get_rows of a quantized table, ids on device"),
    ("rms_norm", "default", "rms_norm.comp", (), "one workgroup per row, shared-memory sum"),
    ("add", "default", "eltwise.comp", ("OP_ADD",), "residual add and broadcast bias"),
    ("rope", "table", "rope.comp", (), "normal and neox, float64-built cos/sin table"),
    ("kv_write", "default", "kv_write.comp", (), "k and v into the float32 cache"),
    ("swiglu", "default", "eltwise.comp", ("OP_SWIGLU",), "silu(gate) * up"),
    # hybrid models (engine/hybrid.py)
    ("sigmoid_mul", "default", "eltwise.comp", ("OP_SIGMOID_MUL",), "x * sigmoid(gate)"),
    ("cols", "default", "slice.comp", (), "a contiguous copy of a column range"),
    ("ssm_conv", "default", "ssm_conv.comp", (), "causal conv1d + SiLU, a thread per channel"),
    ("ssm_gates", "default", "ssm_gates.comp", (), "softplus decay and sigmoid beta"),
    ("router_topk", "default", "router_topk.comp", (), "softmax, top-k, renormalised"),
]
# Same name and meaning as CUDA's rope.fuse_kv.
_FUSE_KV = Param(
    "fuse_kv",
    (0, 1),
    0,
    "1: RoPE of q and k and the KV-cache write in one dispatch (rope.comp FUSE_KV; the q/k/v "
    "biases are added by mmvw as it stores, or by add dispatches); same arithmetic",
    HOST,
)
# With fuse_kv, the q/k/v bias adds in the same dispatch (Vulkan only).
_FUSE_BIAS = Param(
    "fuse_bias",
    (0, 1),
    0,
    "1 (with fuse_kv = 1): the q, k and v bias adds happen in the RoPE + KV-write dispatch as it "
    "reads q, k and v (rope.comp FUSE_BIAS): three add dispatches fewer per layer; same "
    "arithmetic",
    HOST,
)
# The residual add before each RMSNorm (after the o and down projections) in the norm's
# dispatch: engine.backends.vulkan.fused_norm (CUDA fuses it into its matmuls instead).
_FUSE_ADD = Param(
    "fuse_add",
    (0, 1),
    0,
    "1: the residual add before an RMSNorm (attention output and FFN residuals) in the norm's "
    "dispatch (rms_norm.comp ADD_RES): it stores the sum and the normed row; same arithmetic",
    HOST,
)
for _op, _variant, _src, _defines, _doc in _SIMPLE:
    _constraints = [_wg_fits(_op)]
    if _op == "rope":
        _constraints.append(
            Constraint(
                "fuse_bias needs fuse_kv (the bias adds ride on the RoPE + KV-write dispatch)",
                lambda cfg, dev: (
                    not int(cfg.knobs("rope").fuse_bias) or int(cfg.knobs("rope").fuse_kv) == 1
                ),
            )
        )
    if _op == "rms_norm":
        _constraints.append(_shared_fits(_op, 2))
    _params = (_wg(256), _FUSE_KV, _FUSE_BIAS) if _op == "rope" else (_wg(256),)
    _params = (_wg(256), _FUSE_ADD) if _op == "rms_norm" else _params
    REGISTRY.register(
        B,
        _op,
        [
            Variant(
                B,
                _op,
                _variant,
                params=_params,
                constraints=tuple(_constraints),
                quant_types=QUANT_TYPES if _op == "embedding" else None,
                source=f"vulkan/{_src}",
                defines=_defines,
                numeric="order_only",
                doc=_doc,
            )
        ],
    )


def _key_threads_le_wg(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("attention")
    return int(c.key_threads) <= int(c.wg_size)


_SPLITS = (1, 2, 4, 8, 16, 32, 64)  # <= MAX_SPLITS of attention_split.comp

# split first, so it is the default: decode launches H * splits workgroups instead of H (28 on a
# 7B model against 132 SMs of an H200), and it is exact for every T, GQA ratio and head dim the
# online kernel handles (tests/test_backend_ops.py runs both against NumPy).
REGISTRY.register(
    B,
    "attention",
    [
        Variant(
            B,
            "attention",
            "split",
            params=(
                _wg(128),
                Param(
                    "splits",
                    _SPLITS,
                    32,
                    "key ranges per (head, token) at decode (T == 1): the grid is H x splits, "
                    "each range ceil(L / splits) keys, merged by a second dispatch; 1: no merge",
                    PUSHED,
                ),
                Param(
                    "splits_prefill",
                    _SPLITS,
                    1,
                    "key ranges per query for T > 1 (H x T workgroups already; the partials "
                    "buffer grows with T x splits)",
                    PUSHED,
                ),
                Param(
                    "fuse_combine",
                    (0, 1),
                    0,
                    "1: a head's last key range to finish merges the ranges (an atomic ticket; "
                    "under matmul_decode.mmvw it also stores the Q8_1 form): one dispatch "
                    "instead of two (as CUDA's attention_decode.fuse_combine)",
                    HOST,
                ),
                Param(
                    "key_threads",
                    (1, 2, 4, 8, 16, 32),
                    8,
                    "threads splitting one key's dot product over D; a tile is "
                    "wg_size / key_threads keys",
                    spec(1),
                ),
            ),
            constraints=(
                _wg_fits("attention"),
                Constraint("key_threads <= wg_size", _key_threads_le_wg),
                _shared_fits("attention", 3),
            ),
            source="vulkan/attention_split.comp",
            numeric="order_only",
            doc="split-KV (flash-decoding): a workgroup per (head, key range, token) writes an "
            "online-softmax partial, a merge pass rescales and sums them",
        ),
        Variant(
            B,
            "attention",
            "online",
            params=(_wg(64),),
            constraints=(_wg_fits("attention"), _shared_fits("attention", 3)),
            source="vulkan/attention.comp",
            numeric="order_only",
            doc="causal GQA, a workgroup per (head, token), online softmax over key tiles",
        ),
    ],
    doc="causal GQA attention over the KV cache",
)


def _flash_subgroups(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    if dev is None:
        return True
    lo = int(_extra(dev, "min_subgroup_size", 0) or dev.subgroup_size)
    hi = int(_extra(dev, "max_subgroup_size", 0) or dev.subgroup_size)
    return 16 <= lo and hi <= 64


def _register_attention_coopmat() -> None:
    """attention.coopmat: the split variant at decode (its knobs and constraints, whatever they
    are), tensor-core flash attention (shaders/vulkan/attention_coopmat.comp) for T > 1."""
    op = REGISTRY.op(B, "attention")
    split = op.variant("split")
    coop = Variant(
        B,
        "attention",
        "coopmat",
        params=split.params,
        constraints=(
            *split.constraints,
            Constraint(
                f"the device reports VK_KHR_cooperative_matrix with the subgroup shape "
                f"{COOPMAT_SHAPE} (lavapipe / Mesa 22 have none)",
                _coopmat_ok,
            ),
            Constraint(
                "34 KiB of shared memory for the flash pass <= maxComputeSharedMemorySize",
                lambda cfg, dev: int(_extra(dev, "max_shared_memory", 1 << 20)) >= 34 * 1024,
            ),
        ),
        source="vulkan/attention_coopmat.comp",
        numeric="fp16",
        doc="prefill: flash attention on cooperative matrices (16 queries x 32 keys per step, "
        "fp16 Q/K/V/P, fp32 softmax and output; head dims multiples of 16 up to 128); decode "
        "and other head dims: the split kernel with these knobs",
    )
    flash = Variant(
        B,
        "attention",
        "flash",
        params=(
            *split.params,
            Param(
                "matrix_scale",
                (False, True),
                False,
                "the flash pass rescales its output accumulators by one component-wise "
                "multiply of two matrices instead of a loop over each lane's elements (the "
                "H200's driver gave the loop's pipeline 256 B of local memory); unmeasured",
                define("MATRIX_SCALE"),
            ),
            Param(
                "key_chunk",
                (0, 32, 64, 128, 256),
                0,
                "prefill keys per workgroup: the keys split into ceil(T / this) ranges (at "
                "most 64, sized from pos0 + T by the shader), each range's partial softmax "
                "written as the split kernel's and merged by its merge pass, so a long tile's "
                "key blocks run on several workgroups (the 1.5B at pp512: 96 workgroups, the "
                "last query tile 16 blocks in a row); 0: one workgroup per query tile",
                HOST,
            ),
        ),
        constraints=(
            *coop.constraints[:-1],
            Constraint(
                "44 KiB of shared memory for the flash pass <= maxComputeSharedMemorySize",
                lambda cfg, dev: int(_extra(dev, "max_shared_memory", 1 << 20)) >= 44 * 1024,
            ),
            Constraint(
                "the device's subgroups of 16 to 64 lanes (a 16-query row's keys split over "
                "lane / 16)",
                _flash_subgroups,
            ),
        ),
        source="vulkan/attention_flash.comp",
        numeric="fp16",
        doc="prefill: flash attention on cooperative matrices, 128 threads per 64 queries x "
        "32 keys per step (a 16-query fragment per subgroup), the softmax across a subgroup's "
        "lanes with shuffles, the output in fp32 accumulators rescaled by a broadcast matrix; "
        "head dims multiples of 16 up to 128; decode and other head dims: the split kernel",
    )
    REGISTRY.register(B, "attention", [*op.variants, coop, flash], op.doc)


_register_attention_coopmat()

# two_stage first, so it is the default: one workgroup per row leaves a big GPU idle over a
# 152k vocabulary; both give np.argmax's answer (first maximum, first NaN).
REGISTRY.register(
    B,
    "argmax",
    [
        Variant(
            B,
            "argmax",
            "two_stage",
            params=(
                _wg(256),
                Param(
                    "slices",
                    (1, 8, 16, 32, 64, 128, 256, 512, 1024),
                    128,
                    "workgroups per row in pass 1, each over ceil(V / slices) elements",
                    PUSHED,
                ),
            ),
            constraints=(_wg_fits("argmax"), _shared_fits("argmax", 2)),
            source="vulkan/argmax.comp",
            numeric="order_only",
            doc="slices of a row reduce to (value, index) pairs, a second pass picks the first "
            "maximum among them",
        ),
        Variant(
            B,
            "argmax",
            "default",
            params=(_wg(256),),
            constraints=(_wg_fits("argmax"), _shared_fits("argmax", 2)),
            source="vulkan/argmax.comp",
            numeric="order_only",
            doc="first maximum per row, one workgroup per row",
        ),
    ],
    doc="greedy token: first maximum per row, on the device",
)

REGISTRY.register(
    B,
    "submit",
    [
        Variant(
            B,
            "submit",
            "default",
            params=(
                Param(
                    "max_nodes",
                    (64, 256, 1024, 4096),
                    1024,
                    "dispatches recorded into one command buffer before it is submitted "
                    "(command-buffer depth; a download submits earlier)",
                    HOST,
                ),
                Param(
                    "replay",
                    (True, False),
                    True,
                    "reuse the command buffer of an identical recorded graph (decode step)",
                    HOST,
                ),
                Param(
                    "prefill_kick",
                    (0, 16, 32, 64, 128, 256),
                    0,
                    "after a prefill matmul (T > 1), submit what is recorded without waiting "
                    "once it is at least this many dispatches and the device has finished the "
                    "previous submission: the GPU starts while Python records the rest of the "
                    "forward (0: one submission per forward, at the download)",
                    HOST,
                ),
                Param(
                    "prefill_ahead",
                    (False, True),
                    False,
                    "prefill_kick's pieces queued behind the one in flight (one-time command "
                    "buffers, a fence each) instead of waiting for it before each submit: no "
                    "idle GPU between pieces (the 1.5B at pp512: 8 pieces, wall 2 ms over the "
                    "GPU's 20.8 ms)",
                    HOST,
                ),
            ),
            source="engine/backends/vulkan/stream.py",
            numeric="order_only",
            doc="command recording: dispatches batched per submit, graphs recorded once",
        )
    ],
    doc="how dispatches become command buffers",
)

# The knobs the sequential kernel and the chunked variant's decode step (the same kernel) share.
_DN_WG = _wg(128, (32, 64, 128, 256))
_DN_LAYOUT = Param(
    "state_transposed",
    (False, True),
    False,
    "the delta-net state between calls as S^T [dv, dk] (each thread's column contiguous) "
    "instead of S [dk, dv] (threads read across a row); the seed's 7x was this choice on a "
    "warp-per-column kernel",
    spec(1),
)
_DN_MAX_DK = Param(
    "max_dk",
    (64, 128, 256),
    128,
    "register array per thread for a state column (must be >= the K head dim)",
    spec(2),
)
# Same name, choices and meaning as numpy's delta_net.chunked.chunk (a CUDA chunked scan uses
# the same): prompt tokens per chunk of the WY scan; the last chunk of a call is ragged.
DELTA_NET_CHUNKS = (4, 8, 16, 32, 64)


def _chunk_a_fits(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    limit = _extra(dev, "max_shared_memory")
    ch = int(cfg.knobs("delta_net").chunk)
    return limit is None or (ch * ch + 4 * ch) * 4 <= int(limit)


def _scan_wg_fits(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    return _device_takes_wg(int(cfg.knobs("delta_net").scan_wg), dev)


REGISTRY.register(
    B,
    "delta_net",
    [
        Variant(
            B,
            "delta_net",
            "sequential",
            params=(_DN_WG, _DN_LAYOUT, _DN_MAX_DK),
            constraints=(_wg_fits("delta_net"),),
            source="vulkan/delta_net.comp",
            numeric="order_only",
            doc="one workgroup per V head, a thread per state column in registers, T tokens "
            "in sequence; q/k L2 norm in the kernel",
        ),
        Variant(
            B,
            "delta_net",
            "chunked",
            params=(
                _DN_WG,
                _DN_LAYOUT,
                _DN_MAX_DK,
                Param(
                    "chunk",
                    DELTA_NET_CHUNKS,
                    64,
                    "tokens per chunk of the WY scan (the sequential steps are T / chunk; "
                    "the solve and the intra-chunk products grow as chunk^2)",
                    spec(3),
                ),
                Param(
                    "scan_wg",
                    (16, 32, 64, 128),
                    32,
                    "state columns (threads) per workgroup of the inter-chunk pass: a head's "
                    "dv columns are independent, so it runs Hv * dv / scan_wg workgroups",
                    spec(4),
                ),
            ),
            constraints=(
                _wg_fits("delta_net"),
                Constraint("scan_wg <= the device's workgroup limits", _scan_wg_fits),
                Constraint(
                    "(chunk^2 + 4 chunk) floats of shared memory <= maxComputeSharedMemorySize",
                    _chunk_a_fits,
                ),
            ),
            source="vulkan/delta_net_chunked.comp",
            # float32 like the sequential kernel, another summation order: a triangular solve
            # per chunk and the state carried chunk to chunk
            numeric="order_only",
            doc="prefill (T > 1) in chunks: a pass per (chunk, head) solves (I + A)[W | Y] = "
            "[beta V | beta G K] and forms the masked Q K^T, then a pass per (head, column "
            "block) carries S across the T / chunk chunks; decode runs the sequential kernel",
        ),
    ],
    doc="gated delta-net scan (hybrid models); wg_size >= the V head dim, max_dk >= the K head dim",
)


def _moe_tpr_le_wg(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("moe_experts")
    return int(c.threads_per_row) <= int(c.wg_size)


_MOE_DMMV = (
    _wg(64, (32, 64, 128, 256)),
    _rows_per_wg(4),
    Param(
        "threads_per_row",
        (4, 8, 16, 32, 64),
        16,
        "threads splitting a row's K (partial sums meet in shared memory)",
        spec(2),
    ),
)
_MOE_CONSTRAINTS = (
    _wg_fits("moe_experts"),
    Constraint("threads_per_row <= wg_size", _moe_tpr_le_wg),
)

# grouped first, so it is the default: at decode (T == 1) it is dmmv (the same kernels and
# knobs); at prefill it decodes each chosen expert's rows once per tile of tile_pairs routed
# tokens instead of once per (token, slot) pair. Not yet timed on a GPU.
REGISTRY.register(
    B,
    "moe_experts",
    [
        Variant(
            B,
            "moe_experts",
            "grouped",
            params=(
                *_MOE_DMMV,
                Param(
                    "tile_pairs",
                    (4, 8, 16, 32),
                    16,
                    "routed (token, slot) pairs per tile of the grouped GEMM: each expert "
                    "row is decoded once per tile (per-thread accumulators: registers)",
                    spec(3),
                ),
            ),
            constraints=_MOE_CONSTRAINTS,
            quant_types=QUANT_TYPES,
            source="vulkan/moe_grouped.comp",
            numeric="order_only",
            doc="prefill (T > 1): a counting sort of the pairs by expert into tiles, then a "
            "grouped GEMM per (rows, tile) of the tile's expert; decode: the dmmv kernels",
        ),
        Variant(
            B,
            "moe_experts",
            "dmmv",
            params=_MOE_DMMV,
            constraints=_MOE_CONSTRAINTS,
            quant_types=QUANT_TYPES,
            source="vulkan/moe_matvec.comp",
            numeric="order_only",
            doc="a matrix-vector product per (token, chosen expert) reading only that expert's "
            "rows, then a weighted sum per token (the PASS_COMBINE pass)",
        ),
    ],
    doc="routed experts of a MoE FFN (gate, up, SwiGLU, down, combine)",
)
