"""Delta-net decode step microbenchmark on the GPU (issue 15, helper dn): one token's conv step,
gates, scan step and gated norm of a hybrid preset's delta-net layer (35b-a3b / 9b: Hk 16, Hv 32,
dk = dv = 128, K 4) through Backend._delta_net_conv_gated, per config: dn_step.cu's
delta_net_conv_step (tickets) and dn_clu.cu's cluster step (delta_net.step_cluster).

Each config is timed as a CUDA graph of LAYERS back-to-back calls, each on its own layer's state,
conv state and weights (60 MB of state: past the L2, as between a model's layers), best of 5
replays; us per call. --check: each config's output and state NMSE against NumPy on layer 0.

  python3 bench/bench_dn_step.py [--configs tickets,c4_l8,...] [--preset 35b-a3b] [--check]
      [--floor] [--json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import harness
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_moe_dec import _graph_us  # noqa: E402

LAYERS = 30
PDL = {"matmul_decode.pdl": 1}
CONFIGS: dict[str, dict] = {
    "tickets": {},  # the default: delta_net_conv_step (warps 4)
    "tickets_w8": {"delta_net.warps": 8},
    "tickets_pdl": PDL,
    "c2_l8": {"delta_net.step_cluster": 2, "delta_net.step_lanes": 8},
    "c4_l8": {"delta_net.step_cluster": 4, "delta_net.step_lanes": 8},
    "c4_l16": {"delta_net.step_cluster": 4, "delta_net.step_lanes": 16},
    "c2_l8_pdl": {"delta_net.step_cluster": 2, "delta_net.step_lanes": 8} | PDL,
    "c4_l8_pdl": {"delta_net.step_cluster": 4, "delta_net.step_lanes": 8} | PDL,
    "c4_l16_pdl": {"delta_net.step_cluster": 4, "delta_net.step_lanes": 16} | PDL,
}


def _f32(name: str, a: np.ndarray) -> Any:
    from engine.gguf_model import QTensor

    a = np.ascontiguousarray(a, np.float32)
    return QTensor(name, "F32", a.shape, a.view(np.uint8).reshape(-1, 4 * a.shape[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, repeats=None, out=False, listing=False)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--preset", default="35b-a3b")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--floor", action="store_true", help="also an empty kernel's us a launch")
    a = ap.parse_args(argv)
    from engine.synth_hybrid import HYBRID_PRESETS

    names = [c for c in a.configs.split(",") if c]
    bad = [c for c in names if c not in CONFIGS]
    if bad or a.preset not in HYBRID_PRESETS:
        print(f"bench_dn_step: unknown config(s) {bad} or preset {a.preset!r}; configs: "
              f"{', '.join(CONFIGS)}; presets: {', '.join(HYBRID_PRESETS)}")  # fmt: skip
        return 2
    import cupy as cp

    from engine import backends
    from engine.backends.numpy_ref import NumpyBackend
    from engine.backends.plan import DnGatedIn
    from engine.tuning import TuningConfig

    p = HYBRID_PRESETS[a.preset]
    Hk, Hv, dk, dv, K = p.n_k_heads, p.n_v_heads, p.head_k_dim, p.head_v_dim, p.d_conv
    Cc = 2 * Hk * dk + Hv * dv
    rng = np.random.default_rng(0)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    layers = [
        (_f32("conv", f(Cc, K) * 0.5), _f32("dt", rng.uniform(-1, 1, Hv)),
         _f32("a", -np.exp(rng.uniform(-1, 1, Hv))), _f32("n", rng.uniform(0.5, 1.5, dv)),
         f(Hv, dk, dv) * 0.1, f(K - 1, Cc), f(1, Cc), f(1, Hv), f(1, Hv), f(1, Hv * dv))
        for _ in range(LAYERS)
    ]  # fmt: skip
    be = backends.create("cuda")
    p_order = "tiled"  # (qwen35's V-head order)
    rows = []
    for name in names:
        be.set_config(TuningConfig.from_flat("cuda", CONFIGS[name]))
        ws = [[be.load_weight(t) for t in lay[:4]] for lay in layers]
        ins = [[be.upload(t) for t in lay[4:]] for lay in layers]
        # state_transposed (the default): S^T on the device; random either way for timing

        def call(i: int, ws: list = ws, ins: list = ins) -> Any:
            w, (s, c, qkv, al, bt, z) = ws[i % LAYERS], ins[i % LAYERS]
            gated = DnGatedIn(al, bt, w[1], w[2], s, p_order, 1e-6, w[3], z)
            return be._delta_net_conv_gated(qkv, c, w[0], Hk, dk, gated)

        clu = be._dn_clu_launch(be.config.op("delta_net"), Hk, Hv, dk, dv)
        row: dict[str, Any] = {"config": name, "kernel": clu[0] if clu else "delta_net_conv_step"}
        if a.check:
            lay = layers[0]
            s0 = np.ascontiguousarray(lay[4].transpose(0, 2, 1))  # S^T on the device
            s, c = be.upload(s0), be.upload(lay[5])
            w = ws[0]
            gated = DnGatedIn(be.upload(lay[7]), be.upload(lay[8]), w[1], w[2], s, p_order,
                              1e-6, w[3], be.upload(lay[9]))  # fmt: skip
            got = be.download(be._delta_net_conv_gated(be.upload(lay[6]), c, w[0], Hk, dk, gated))
            ref = NumpyBackend()
            rs, rc = lay[4].copy(), lay[5].copy()
            gated = DnGatedIn(lay[7], lay[8], ref.load_weight(lay[1]), ref.load_weight(lay[2]), rs,
                              p_order, 1e-6, ref.load_weight(lay[3]), lay[9])  # fmt: skip
            want = ref._delta_net_conv_gated(lay[6], rc, ref.load_weight(lay[0]), Hk, dk, gated)
            want = np.asarray(want, np.float64)
            row["nmse"] = float(np.sum((got - want) ** 2) / max(np.sum(want**2), 1e-30))
            gs = be.download(s).transpose(0, 2, 1)
            row["state_nmse"] = float(np.sum((gs - rs) ** 2) / np.sum(rs**2))
            row["conv_state_equal"] = bool(np.array_equal(be.download(c), rc))
        row["us"] = round(_graph_us(be, cp, call), 2)
        rows.append(row)
        if not a.json:
            print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if a.floor:  # an empty kernel on the cluster step's grid: the graph's per-launch floor
        empty = cp.RawKernel('extern "C" __global__ void dn_empty() {}', "dn_empty")
        grid = (4, Hv)

        def nop(i: int) -> None:
            empty(grid, (256,), ())

        rows.append(
            {"config": "floor", "kernel": "dn_empty", "us": round(_graph_us(be, cp, nop), 2)}
        )
        if not a.json:
            print(" ".join(f"{k}={v}" for k, v in rows[-1].items()), flush=True)
    if a.json:
        print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
