"""Vulkan attention: split, online, flash and the cooperative-matrix variants."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.tuning.registry import (
    HOST,
    PUSHED,
    REGISTRY,
    Constraint,
    Param,
    Variant,
    define,
    spec,
    variant,
)
from engine.tuning.variants.vulkan.common import (
    COOPMAT_SHAPE,
    B,
    _coopmat_ok,
    _extra,
    _shared_fits,
    _wg,
    _wg_fits,
)

if TYPE_CHECKING:
    from engine.device_info import DeviceInfo
    from engine.tuning.config import TuningConfig


def _key_threads_le_wg(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    c = cfg.knobs("attention")
    return int(c.key_threads) <= int(c.wg_size)


_SPLITS = (1, 2, 4, 8, 16, 32, 64)  # <= MAX_SPLITS of attention_split.comp

# split first, so it is the default: decode launches H * splits workgroups instead of H (28 on a
# 7B model against 132 SMs of an H200), and it is exact for every T, GQA ratio and head dim the
# online kernel handles (tests/engine/backends/test_backend_ops.py runs both against NumPy).
REGISTRY.declare(
    B,
    "attention",
    [
        variant(
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
        variant(
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
                define(),
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
