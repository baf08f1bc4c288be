#!/usr/bin/env python3
"""One MoE layer's routed experts at prefill on the CUDA backend, per moe_experts config (issue
15): the Qwen3.5-35B-A3B shapes by default (256 experts, 8 used, width 2048, expert width 512,
gate / up Q4_K and down Q6_K as Q4_K_M's larger layers have them, --down Q4_K the others), T
prompt tokens routed by a random router, median time of CUDA events around `moe_experts` over
the repeats (a row printed as each config is done), then each config's NMSE against dmmv's
output (float32 throughout; else the first config's). Weights are random blocks with sane
scales (no quantizer run: a 35B layer is 0.45 GB), so the figures are timings, not a model. x40
layers is the expert share of a 35b-a3b pp512.

usage: python bench/moe_tc_bench.py [--tokens 512] [--configs dmmv,tc,...] [--repeats 10]
       [--experts 256] [--used 8] [--width 2048] [--ff 512] [--down Q6_K|Q4_K] [--kernels] [--json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import harness
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.gguf_model import QTensor  # noqa: E402
from engine.tuning import TuningConfig  # noqa: E402

CONFIGS: dict[str, dict] = {
    "dmmv": {"moe_experts.variant": "dmmv"},
    "grouped16": {"moe_experts.variant": "grouped", "moe_experts.tile_pairs": 16},
    "grouped32": {"moe_experts.variant": "grouped", "moe_experts.tile_pairs": 32},
    "mmvq": {"moe_experts.variant": "mmvq"},
    **{  # _w: q4k_window, _L: wide_loads, _D: direct
        f"tc{tp}_r{br}{'_w' if win else ''}{'_L' if wide else ''}{'_D' if direct else ''}": {
            "moe_experts.variant": "tc",
            "moe_experts.tile_pairs": tp,
            "moe_experts.block_rows": br,
            "moe_experts.q4k_window": win,
            "moe_experts.wide_loads": wide,
            "moe_experts.direct": direct,
        }
        for tp in (16, 32, 64)
        for br in (64, 128)
        for win in (0, 1)
        for wide in (0, 1)
        for direct in (0, 1)
    },
}
_BLOCK = {"Q4_K": (256, 144, (0, 2)), "Q6_K": (256, 210, (208,))}  # elems, bytes, fp16 scales


def random_blocks(rng: np.random.Generator, shape: tuple[int, ...], qtype: str) -> QTensor:
    """Random quants with every fp16 super-block scale 1e-3 (finite sums, fp16-safe SwiGLU)."""
    elems, nbytes, scales = _BLOCK[qtype]
    rows, K = int(np.prod(shape[:-1])), shape[-1]
    raw = rng.integers(0, 256, (rows * (K // elems), nbytes), dtype=np.uint8)
    d = np.frombuffer(np.float16(1e-3).tobytes(), np.uint8)
    for off in scales:
        raw[:, off : off + 2] = d
    if qtype == "Q6_K":  # int8 sub-block scales: small and positive
        raw[:, 192:208] = rng.integers(1, 16, (raw.shape[0], 16), dtype=np.uint8)
    return QTensor("w", qtype, tuple(shape), raw.reshape(rows, -1))


def main() -> int:
    ap = harness.parser(__doc__.split("\n\n")[0], repeats=10, out=False, listing=False)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=512)
    ap.add_argument("--down", default="Q6_K", choices=sorted(_BLOCK), help="down's type")
    ap.add_argument("--kernels", action="store_true", help="and ms per kernel (one call)")
    a = ap.parse_args()
    names = [n for n in a.configs.split(",") if n]
    bad = [n for n in names if n not in CONFIGS]
    if bad or a.tokens < 1 or a.repeats < 1:
        print(f"moe_tc_bench: unknown config {bad} (known: {', '.join(CONFIGS)}) or a count < 1",
              file=sys.stderr)  # fmt: skip
        return 2
    from engine import backends
    from engine.backends.numpy_ref import NumpyBackend

    be = backends.create("cuda")
    cp = be._cp
    rng = np.random.default_rng(0)
    T, E, k, C, F = a.tokens, a.experts, a.used, a.width, a.ff
    ws = [
        be.load_weight(random_blocks(rng, (E, F, C), "Q4_K")),
        be.load_weight(random_blocks(rng, (E, F, C), "Q4_K")),
        be.load_weight(random_blocks(rng, (E, C, F), a.down)),
    ]
    ids, w = NumpyBackend().ops.router_topk(rng.standard_normal((T, E)).astype(np.float32), k)
    x = be.upload(rng.standard_normal((T, C)).astype(np.float32))
    ids_d, w_d = be.upload(ids), be.upload(w)
    rows, outs = [], {}
    for name in names:
        try:
            be.set_config(TuningConfig.from_flat("cuda", CONFIGS[name]))
            for _ in range(2):
                out = be.ops.moe_experts(x, ids_d, w_d, *ws)
            ms = harness.median_ms(  # warmed up above; events on the current stream
                lambda: harness.cuda_events_ms(
                    cp, None, lambda: be.ops.moe_experts(x, ids_d, w_d, *ws)
                ),
                a.repeats,
                warmup=0,
            )
            outs[name] = be.download(out).astype(np.float64)
            rows.append({"config": name, "ms": ms, "x40_ms": 40 * ms,
                         "finite": bool(np.isfinite(outs[name]).all())})  # fmt: skip
            if a.kernels:  # one more call with an event pair around each launch
                be.set_profiling(True)
                try:
                    be.ops.moe_experts(x, ids_d, w_d, *ws)
                    rep = be.profile()
                finally:
                    be.set_profiling(False)
                rows[-1]["kernels_ms"] = {k: round(v.total_ms, 4) for k, v in rep.kernels.items()}
        except Exception as e:  # noqa: BLE001 - one config's failure is its row
            rows.append({"config": name, "error": f"{type(e).__name__}: {e}"[:300]})
        if not a.json:
            print(rows[-1], flush=True)
    ref = outs.get("dmmv", next(iter(outs.values()), None))
    for row in rows:
        if row["config"] in outs and ref is not None:
            got = outs[row["config"]]
            row["nmse_vs_dmmv"] = float(np.sum((got - ref) ** 2) / max(np.sum(ref**2), 1e-30))
            if not a.json:
                print(f"{row['config']}: NMSE vs reference {row['nmse_vs_dmmv']:.3g}")
    if a.json:
        print(json.dumps({"tokens": T, "experts": E, "used": k, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
