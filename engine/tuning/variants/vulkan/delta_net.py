"""Vulkan gated delta-net scan (hybrid models)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.tuning.registry import REGISTRY, Constraint, Param, spec, variant
from engine.tuning.variants.shared import delta_net_chunk
from engine.tuning.variants.vulkan.common import (
    B,
    _device_takes_wg,
    _extra,
    _wg,
    _wg_fits,
)

if TYPE_CHECKING:
    from engine.device_info import DeviceInfo
    from engine.tuning.config import TuningConfig

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


def _chunk_a_fits(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    limit = _extra(dev, "max_shared_memory")
    ch = int(cfg.knobs("delta_net").chunk)
    return limit is None or (ch * ch + 4 * ch) * 4 <= int(limit)


def _scan_wg_fits(cfg: TuningConfig, dev: DeviceInfo | None) -> bool:
    return _device_takes_wg(int(cfg.knobs("delta_net").scan_wg), dev)


REGISTRY.declare(
    B,
    "delta_net",
    [
        variant(
            "sequential",
            params=(_DN_WG, _DN_LAYOUT, _DN_MAX_DK),
            constraints=(_wg_fits("delta_net"),),
            source="vulkan/delta_net.comp",
            numeric="order_only",
            doc="one workgroup per V head, a thread per state column in registers, T tokens "
            "in sequence; q/k L2 norm in the kernel",
        ),
        variant(
            "chunked",
            params=(
                _DN_WG,
                _DN_LAYOUT,
                _DN_MAX_DK,
                delta_net_chunk(spec(3)),
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
