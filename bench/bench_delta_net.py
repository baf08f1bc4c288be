"""Time the Vulkan delta_net kernels at a hybrid preset's layer shape (9b: Hk 16, Hv 32,
dk = dv = 128): the sequential scan for every state layout (S, S^T) x wg_size, and the chunked
(WY) scan for every chunk x scan_wg, at a prefill call of --tokens and at decode (T = 1, which
the chunked variant runs on the sequential kernel), after checking each config against the
NumPy reference on a ragged length (two chunks and 3 tokens).

    python bench/bench_delta_net.py [--preset 9b] [--tokens 512] [--repeats 20]
        [--variant sequential|chunked] [--json]
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import harness
import numpy as np

from engine.backends.numpy_ref import NumpyBackend
from engine.synth_hybrid import HYBRID_PRESETS
from engine.tuning import REGISTRY, TuningConfig


def _inputs(rng: np.random.Generator, T: int, Hk: int, Hv: int, dk: int, dv: int) -> tuple:
    return (
        rng.standard_normal((T, Hk, dk)).astype(np.float32),
        rng.standard_normal((T, Hk, dk)).astype(np.float32),
        rng.standard_normal((T, Hv, dv)).astype(np.float32),
        -rng.uniform(0.01, 2.0, (T, Hv)).astype(np.float32),
        rng.uniform(0.0, 1.0, (T, Hv)).astype(np.float32),
    )


def configs(variants: list[str], dk: int, dv: int) -> Iterator[tuple[dict, dict]]:
    """(row label, flat config) of every benched point at this head shape."""
    op = REGISTRY.op("vulkan", "delta_net")
    max_dk = min(c for c in op.variant("sequential").param("max_dk").choices if c >= dk)
    base = {"delta_net.max_dk": max_dk}
    if "sequential" in variants:
        var = op.variant("sequential")
        for transposed in var.param("state_transposed").choices:
            for wg in (w for w in var.param("wg_size").choices if w >= dv):
                flat = base | {"delta_net.state_transposed": transposed, "delta_net.wg_size": wg}
                state = "S^T" if transposed else "S"
                yield {"variant": "sequential", "state": state, "wg": wg}, flat
    if "chunked" in variants:
        var = op.variant("chunked")
        wg = min(w for w in var.param("wg_size").choices if w >= dv)
        for chunk in (c for c in var.param("chunk").choices if c >= 16):
            for scan_wg in var.param("scan_wg").choices:
                flat = base | {
                    "delta_net.variant": "chunked",
                    "delta_net.wg_size": wg,
                    "delta_net.chunk": chunk,
                    "delta_net.scan_wg": scan_wg,
                }
                yield {"variant": "chunked", "chunk": chunk, "scan_wg": scan_wg}, flat


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__.splitlines()[0], repeats=20, out=False, listing=False)
    ap.add_argument("--preset", default="9b", help=f"one of {', '.join(HYBRID_PRESETS)}")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--variant", action="append", choices=["sequential", "chunked"])
    a = ap.parse_args(argv)
    if a.tokens < 1 or a.repeats < 1:
        print("error: --tokens and --repeats must be >= 1", file=sys.stderr)
        return 2
    if a.preset not in HYBRID_PRESETS:
        print(f"error: --preset {a.preset!r}; one of {', '.join(HYBRID_PRESETS)}", file=sys.stderr)
        return 2
    p = HYBRID_PRESETS[a.preset]
    Hk, Hv, dk, dv = p.n_k_heads, p.n_v_heads, p.head_k_dim, p.head_v_dim
    from engine.backends import default_device
    from engine.backends.vulkan import VulkanBackend

    vb = VulkanBackend(device=default_device("vulkan"))
    rng = np.random.default_rng(0)
    rows = []
    for row, flat in configs(a.variant or ["sequential", "chunked"], dk, dv):
        vb.set_config(TuningConfig.from_flat("vulkan", flat))
        state = vb.upload(np.zeros((Hv, dk, dv), np.float32))
        n_chk = 2 * int(flat.get("delta_net.chunk", 4)) + 3
        chk = _inputs(rng, n_chk, Hk, Hv, dk, dv)
        ref = NumpyBackend().ops.delta_net(*chk, np.zeros((Hv, dk, dv)), "tiled", 1e-6)
        got = vb.download(vb.ops.delta_net(*chk, state, "tiled", 1e-6))
        row["nmse"] = float(np.sum((got - ref) ** 2) / np.sum(ref**2))
        for name, T in (("prefill", a.tokens), ("decode", 1)):
            args = [vb.upload(x) for x in _inputs(rng, T, Hk, Hv, dk, dv)]
            vb.ops.delta_net(*args, state, "tiled", 1e-6)
            vb.synchronize()
            t0 = time.perf_counter()
            for _ in range(a.repeats):
                vb.ops.delta_net(*args, state, "tiled", 1e-6)
            vb.synchronize()
            row[f"{name}_us"] = 1e6 * (time.perf_counter() - t0) / a.repeats
        rows.append(row)
    vb.close()
    shape = {"preset": a.preset, "Hk": Hk, "Hv": Hv, "dk": dk, "dv": dv}
    if a.json:
        print(json.dumps({"tokens": a.tokens, "shape": shape, "rows": rows}))
        return 0
    print(f"delta_net {a.preset} Hk={Hk} Hv={Hv} dk={dk} dv={dv}: prefill T={a.tokens}, decode")
    for r in rows:
        what = (
            f"seq {r['state']:>3} wg {r['wg']:>3}"
            if r["variant"] == "sequential"
            else f"chunk {r['chunk']:>2} scan_wg {r['scan_wg']:>3}"
        )
        print(
            f"  {what:22s} prefill {r['prefill_us']:10.1f} us  decode {r['decode_us']:8.1f} us"
            f"  nmse {r['nmse']:.1e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
