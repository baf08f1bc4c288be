"""The CUDA backend's kernels (engine/backends/cuda, shaders/cuda/*.cu): variants, parameters,
allowed values and constraints. Plain data: this module imports nothing from CuPy, so the agent
reads the search space on a head node without a GPU.

Matmul dispatch (engine/backends/cuda/backend.py): T == 1 -> matmul_decode; 1 < T <
prefill.gemm_min_t -> matmul_batched (DMMV over max_cols columns per launch); T >= gemm_min_t ->
matmul_prefill (a GEMM). A weight type a chosen GEMM variant does not decode falls back to
matmul_batched; the declared quant_types say which types each variant decodes itself.

Each knob's binding says how it reaches the kernel: a -D define of the variant's source or of a
helper module it launches (Binding.builds; built by engine.backends.cuda.kernels.modules_for),
a launch argument, or host scheduling. A value derived from knobs (Variant.derived: mmvw's rows
per block) is computed once, in its declaration, and read by the host and the kernel alike.
Constraints read DeviceInfo.extra: ``cc`` (compute capability as major*10+minor), ``sms``,
``smem_per_block`` and ``smem_per_block_optin`` (bytes).
"""

from __future__ import annotations

from engine.tuning.variants.cuda.common import ALL_TYPES, CUDA_BLOCK_TYPES, FLOAT_TYPES

# Importing registers the ops; REGISTRY keeps this order (docs, tests).
# isort: off
from engine.tuning.variants.cuda import schedule  # noqa: F401
from engine.tuning.variants.cuda import matmul_decode  # noqa: F401
from engine.tuning.variants.cuda import matmul_prefill  # noqa: F401
from engine.tuning.variants.cuda import elementwise  # noqa: F401
from engine.tuning.variants.cuda import attention  # noqa: F401
# isort: on

__all__ = ["ALL_TYPES", "CUDA_BLOCK_TYPES", "FLOAT_TYPES"]
