"""What the Vulkan declarations share: the backend name, weight types, workgroup
and subgroup parameters and the device-limit constraints built from them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.tuning.registry import SUBGROUP_SIZE, Constraint, Param, VariantDecl, spec, variant
from engine.tuning.variants.shared import DELTA_NET_CHUNKS  # noqa: F401 - re-exported

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


def _subgroup_wg(op: str) -> tuple[Constraint, ...]:
    """An op whose wg_size is split into subgroups: wg_size within the device's limits, a
    multiple of the subgroup size, and a required size the device supports."""
    return (_wg_fits(op), _subgroup_divides_wg(op), _subgroup_size_supported(op))


def _shared_fits(op: str, floats_per_thread: int) -> Constraint:
    def check(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
        limit = _extra(dev, "max_shared_memory")
        need = int(cfg.knobs(op).wg_size) * floats_per_thread * 4 + 1024
        return limit is None or need <= int(limit)

    return Constraint("shared memory of the workgroup <= maxComputeSharedMemorySize", check)


SUBGROUP_FEATURE_SHUFFLE = 0x10  # VkSubgroupFeatureFlagBits


# The cooperative-matrix shape matmul_coopmat.comp uses (coopmat.shape_name's spelling).
COOPMAT_SHAPE = "16x16x16:f16*f16+f32=f32"


def _coopmat_ok(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    if dev is None:
        return True
    return bool(_extra(dev, "cooperative_matrix", False)) and COOPMAT_SHAPE in _extra(
        dev, "coopmat_shapes", []
    )


def _wg(default: int, choices: tuple[int, ...] = WG_SIZES) -> Param:
    return Param("wg_size", choices, default, "workgroup size (local_size_x)", spec(0))


def _rows_per_wg(default: int, choices: tuple[int, ...] = (1, 2, 4, 8, 16)) -> Param:
    return Param("rows_per_wg", choices, default, "rows per workgroup", spec(1))


_SUBGROUP = Param(
    "subgroup_size",
    SUBGROUP_SIZES,
    0,
    "required subgroup size (VK_EXT_subgroup_size_control); 0: the device default",
    SUBGROUP_SIZE,
)


def _selected(source: str, name: str, **fields: Any) -> VariantDecl:
    """A matmul variant that shares its shader with others, selected by -DVARIANT_<NAME> (block,
    subgroup and shmem in matmul_decode.comp; kpar and serial in matmul_prefill.comp): the
    weight types QUANT_TYPES, the reference's arithmetic in another order."""
    return variant(
        name,
        quant_types=QUANT_TYPES,
        source=source,
        defines=(f"VARIANT_{name.upper()}",),
        numeric="order_only",
        **fields,
    )
