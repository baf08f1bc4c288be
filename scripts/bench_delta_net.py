"""Time the Vulkan delta_net kernel at a real Qwen3.5 layer shape (Hk 16, Hv 32, dk = dv = 128)
for every registered state layout (S, S^T) x wg_size, at a prefill chunk and at decode
(T = 1), after checking each config against the NumPy reference once.

    python scripts/bench_delta_net.py [--tokens 512] [--repeats 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from engine.backends.numpy_ref import NumpyBackend
from engine.tuning import REGISTRY, TuningConfig


def _inputs(rng: np.random.Generator, T: int, Hk: int, Hv: int, d: int) -> tuple:
    return (
        rng.standard_normal((T, Hk, d)).astype(np.float32),
        rng.standard_normal((T, Hk, d)).astype(np.float32),
        rng.standard_normal((T, Hv, d)).astype(np.float32),
        -rng.uniform(0.01, 2.0, (T, Hv)).astype(np.float32),
        rng.uniform(0.0, 1.0, (T, Hv)).astype(np.float32),
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.tokens < 1 or a.repeats < 1:
        print("error: --tokens and --repeats must be >= 1", file=sys.stderr)
        return 2
    from engine.backends import default_device
    from engine.backends.vulkan import VulkanBackend

    vb = VulkanBackend(device=default_device("vulkan"))
    Hk, Hv, d = 16, 32, 128
    rng = np.random.default_rng(0)
    var = REGISTRY.op("vulkan", "delta_net").variant("sequential")
    rows = []
    for transposed in var.param("state_transposed").choices:
        for wg in var.param("wg_size").choices:
            if wg < d:
                continue
            vb.set_config(
                TuningConfig.from_flat(
                    "vulkan", {"delta_net.state_transposed": transposed, "delta_net.wg_size": wg}
                )
            )
            state = vb.upload(np.zeros((Hv, d, d), np.float32))
            chk = _inputs(rng, 8, Hk, Hv, d)
            ref = NumpyBackend().delta_net(*chk, np.zeros((Hv, d, d)), "tiled", 1e-6)
            got = vb.download(vb.delta_net(*chk, state, "tiled", 1e-6))
            err = float(np.sum((got - ref) ** 2) / np.sum(ref**2))
            row = {"state": "S^T" if transposed else "S", "wg_size": wg, "nmse": err}
            for name, T in (("prefill", a.tokens), ("decode", 1)):
                args = [vb.upload(x) for x in _inputs(rng, T, Hk, Hv, d)]
                vb.delta_net(*args, state, "tiled", 1e-6)
                vb.synchronize()
                t0 = time.perf_counter()
                for _ in range(a.repeats):
                    vb.delta_net(*args, state, "tiled", 1e-6)
                vb.synchronize()
                row[f"{name}_us"] = 1e6 * (time.perf_counter() - t0) / a.repeats
            rows.append(row)
    vb.close()
    if a.json:
        print(json.dumps({"tokens": a.tokens, "shape": [Hk, Hv, d, d], "rows": rows}))
    else:
        print(f"delta_net Hk={Hk} Hv={Hv} dk=dv={d}: prefill T={a.tokens}, decode T=1")
        for r in rows:
            print(
                f"  {r['state']:>3} wg {r['wg_size']:>3}  prefill {r['prefill_us']:9.1f} us"
                f"  decode {r['decode_us']:7.1f} us  nmse {r['nmse']:.1e}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
