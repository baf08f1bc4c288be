"""moe_experts.tc of the CUDA backend (shaders/cuda/moe_tc.cu), mixed into CudaHybridOps: the
routed experts of a prefill chunk as a grouped GEMM on fp16 tensor cores. The pairs are sorted
by expert on the device (moe_route.cuh's moe_sort, as moe_experts.grouped does), then one launch
computes gate, up and SwiGLU per tile of one expert's pairs into fp16 H (sorted rows) and one
computes down into the pairs' own rows for moe_combine. Nothing is read back to the host and no
weight exists in device memory as fp16: the kernels decode the quantized blocks in shared memory.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.backends.cuda.kernels import QTYPE_SUFFIX
from engine.tuning.variants.cuda import CUDA_BLOCK_TYPES

MAX_TILES = 65535  # grid y
SORT_THREADS = 1024  # moe_route.cuh moe_sort: one block
MAX_EXPERTS = 1024  # moe_route.cuh MOE_MAX_E


def tc_tiles(pairs: int, experts: int, tile_pairs: int) -> int:
    """moe_sort's tiles of P pairs at most: each expert's last tile may be partial."""
    return math.ceil(pairs / tile_pairs) + min(experts, pairs)


def tc_ok(gate: Any, up: Any, down: Any) -> bool:
    """Whether moe_tc.cu runs these experts: stacked block-type weights, gate and up of one
    type and shape (one kernel decodes both), down [E, C, F]."""
    ws = (gate, up, down)
    if any(len(w.shape) != 3 or w.raw is None or w.qtype not in CUDA_BLOCK_TYPES for w in ws):
        return False
    E, F, C = (int(s) for s in gate.shape)
    return (
        tuple(up.shape) == (E, F, C)
        and up.qtype == gate.qtype
        and up.row_bytes == gate.row_bytes
        and tuple(down.shape) == (E, C, F)
        and E <= MAX_EXPERTS
    )


class CudaMoeTcOps:
    """moe_experts.tc (needs CudaBackend's _launch, _empty, _aligned16, config)."""

    config: Any

    def _moe_tc(self, x: Any, ids: Any, gate: Any, up: Any, down: Any) -> Any:
        """x [T, C], ids [T, k] -> d [T * k, C] (pair order) for moe_combine."""
        T, C = (int(s) for s in x.shape)
        k = int(ids.shape[1])
        E, F = int(gate.shape[0]), int(gate.shape[1])
        c = self.config.knobs("moe_experts")
        P, tp, br = T * k, int(c.tile_pairs), int(c.block_rows)
        max_tiles = tc_tiles(P, E, tp)
        route = self._empty((1 + 3 * max_tiles + P,), np.int32)
        self._launch(
            "moe_tc", "moe_sort", (1,), (SORT_THREADS,),
            (ids, np.int32(P), np.int32(E), np.int32(max_tiles), route),
        )  # fmt: skip
        h = self._empty((P, F), np.uint16)  # SwiGLU output, fp16, sorted rows
        self._launch(
            "moe_tc", f"moe_tc_gu_{QTYPE_SUFFIX[gate.qtype]}", (math.ceil(F / br), max_tiles),
            (128,),
            (gate.raw, up.raw, np.int32(gate.row_bytes), np.int32(F), np.int32(C),
             self._aligned16(x), np.int32(k), route, np.int32(max_tiles), np.int32(E), h),
        )  # fmt: skip
        d = self._empty((P, C))
        self._launch(
            "moe_tc", f"moe_tc_down_{QTYPE_SUFFIX[down.qtype]}", (math.ceil(C / br), max_tiles),
            (128,),
            (down.raw, np.int32(down.row_bytes), np.int32(C), np.int32(F), h, route,
             np.int32(max_tiles), np.int32(E), d),
        )  # fmt: skip
        return d
