"""The Vulkan backend's kernels: ops, variants, parameters, constraints (plain data).

Imports nothing from the Vulkan binding: the agent reads this on head nodes without Vulkan.
Each knob's binding says how it reaches the shader; VulkanBackend builds pipelines by a loop over
them. Most are specialization constants of a shader in shaders/vulkan (a new value is a new
pipeline, not a new SPIR-V build; the shader's default for each equals the registry's, checked
by tests/engine/tuning/test_knob_bindings.py); ``matmul_prefill.vec4`` and ``.bk`` are defines (new
SPIR-V
builds); ``subgroup_size`` is set at pipeline creation; ``submit.*`` shapes command recording;
the grid sizes ``attention.splits``/``splits_prefill`` and ``argmax.slices`` are push constants.
Constraints read the device from DeviceInfo (``subgroup_size`` and ``extra``: limits and
subgroup-size-control ranges, filled by engine.backends.vulkan.device); with no device they only
check what does not depend on one.
"""

from __future__ import annotations

from engine.tuning.variants.vulkan.common import (
    COOPMAT_SHAPE,
    DELTA_NET_CHUNKS,
    MAX_COLS,
    QUANT_TYPES,
    SUBGROUP_FEATURE_SHUFFLE,
    SUBGROUP_SIZES,
    WG_SIZES,
)

# Importing registers the ops; REGISTRY keeps this order (docs, tests).
# isort: off
from engine.tuning.variants.vulkan import schedule  # noqa: F401
from engine.tuning.variants.vulkan import matmul_decode  # noqa: F401
from engine.tuning.variants.vulkan import matmul_prefill  # noqa: F401
from engine.tuning.variants.vulkan import elementwise  # noqa: F401
from engine.tuning.variants.vulkan import attention  # noqa: F401
from engine.tuning.variants.vulkan import argmax  # noqa: F401
from engine.tuning.variants.vulkan import submit  # noqa: F401
from engine.tuning.variants.vulkan import delta_net  # noqa: F401
from engine.tuning.variants.vulkan import moe  # noqa: F401
# isort: on

__all__ = [
    "COOPMAT_SHAPE",
    "DELTA_NET_CHUNKS",
    "MAX_COLS",
    "QUANT_TYPES",
    "SUBGROUP_FEATURE_SHUFFLE",
    "SUBGROUP_SIZES",
    "WG_SIZES",
]
