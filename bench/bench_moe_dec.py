"""MoE decode FFN microbenchmark on the GPU (issue 15): one token's MoE FFN of a 35B-A3B-like
layer (256 experts of 512 x 2048, 8 routed, a shared expert, F32 router; Q4_K experts, the routed
down Q6_K with --down-q6k) through Backend._moe_ffn, per config: the fused decode (moe_dec.cu, three
launches) with its knobs, and the op-by-op schedule (fifteen).

Each config is timed as a CUDA graph of LAYERS back-to-back moe_ffn calls, each on its own
random activation (so its own routing: the experts read do not all sit in the L2), best of 5
replays; us per call. Prints one line per config; --json prints the rows as JSON.

  python3 bench/bench_moe_dec.py [--configs fused,unfused,...] [--down-q6k] [--check] [--kernels]
      [--json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import harness
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

E, K_USED, F, C = 256, 8, 512, 2048
LAYERS = 40
RV_TK = {"moe_experts.route_vec": 1, "moe_experts.topk_regs": 1}
ALL6 = {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1, "moe_experts.down_split": 1,
        "moe_experts.gate_up_pair": 1}  # fmt: skip
PRE1 = {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1, "moe_experts.down_split": 1,
        "moe_experts.fuse_pre_norm": 1}  # fmt: skip
WPF = {"moe_experts.dec_wide": 1, "moe_experts.l2_prefetch": 1}
W2PFFC = {"moe_experts.dec_wide": 2, "moe_experts.l2_prefetch": 1, "moe_experts.dec_fcvt": 1}
CONFIGS: dict[str, dict] = {
    "fused": {},  # the registry defaults (route_vec and down_wsum on since the sixth session)
    "fused_plain": {"moe_experts.route_vec": 0, "moe_experts.down_wsum": 0},
    "fused_notk": {"moe_experts.topk_regs": 0},  # the default's top-k reading L2 each round
    "fused_pre6": {"moe_experts.route_vec": 0, "moe_experts.down_wsum": 0,
                   "moe_experts.topk_regs": 0},  # the default before the sixth session
    "unfused": {"moe_experts.fuse_decode": 0},
    "fused_rv": {"moe_experts.route_vec": 1},
    "fused_t16": {"moe_experts.threads_per_row": 16, "moe_experts.rows_per_block": 8},
    "fused_t64": {"moe_experts.threads_per_row": 64, "moe_experts.rows_per_block": 2,
                  "moe_experts.vec": 1},
    "fused_v1": {"moe_experts.vec": 1},
    "fused_dv1": {"moe_experts.down_vec1": 1},
    "fused_rv_dv1": {"moe_experts.route_vec": 1, "moe_experts.down_vec1": 1},
    # helper hdec: the down kernel as one weighted sum per lane (moe_dec_down_w)
    "fused_ws": {"moe_experts.down_wsum": 1},
    "fused_rv_ws": {"moe_experts.route_vec": 1, "moe_experts.down_wsum": 1},
    "fused_rv_ws_t16": {"moe_experts.route_vec": 1, "moe_experts.down_wsum": 1,
                        "moe_experts.threads_per_row": 16, "moe_experts.rows_per_block": 8},
    # helper moedec (sixth session): the route's top-k from registers, the down kernel with a
    # warp per expert slot (rows_per_block outputs a block), and the launch shapes of the
    # route and gate_up kernels that the split down kernel leaves to threads_per_row / vec
    "fused_tk": {"moe_experts.topk_regs": 1},
    "fused_rv_tk": RV_TK,
    "fused_rv_tk_ws": RV_TK | {"moe_experts.down_wsum": 1},
    "fused_split": {"moe_experts.down_split": 1},
    "fused_rv_tk_split": RV_TK | {"moe_experts.down_split": 1},
    "fused_rv_tk_split_r2": RV_TK | {"moe_experts.down_split": 1,
                                     "moe_experts.rows_per_block": 2},
    "fused_rv_tk_split_r8": RV_TK | {"moe_experts.down_split": 1,
                                     "moe_experts.rows_per_block": 8},
    "fused_rv_tk_split_t64": RV_TK | {"moe_experts.down_split": 1,
                                      "moe_experts.threads_per_row": 64, "moe_experts.vec": 1},
    "fused_rv_tk_split_t64v2": RV_TK | {"moe_experts.down_split": 1,
                                        "moe_experts.threads_per_row": 64},
    "fused_rv_tk_split_t128": RV_TK | {"moe_experts.down_split": 1,
                                       "moe_experts.threads_per_row": 128,
                                       "moe_experts.rows_per_block": 2, "moe_experts.vec": 1},
    "fused_rb128_tk": {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1},
    "fused_rb256_tk": {"moe_experts.route_block": 256, "moe_experts.topk_regs": 1},
    "fused_rb128_tk_split": {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                             "moe_experts.down_split": 1},
    "fused_rb128_tk_split_t64v2": {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                                   "moe_experts.down_split": 1,
                                   "moe_experts.threads_per_row": 64},
    # gate and up sharing x's loads (gate_up_pair), with the other knobs
    "fused_gp": {"moe_experts.gate_up_pair": 1},
    "fused_gp_t64": {"moe_experts.gate_up_pair": 1, "moe_experts.threads_per_row": 64},
    "rb128_tk_split_gp": ALL6,
    "rb128_tk_split_gp_t64": ALL6 | {"moe_experts.threads_per_row": 64},
    # the post-attention norm then the FFN (moe_ffn_prenorm: names ending in _pre*): its own
    # rms_norm launch (pre0) or folded into the route (pre1, moe_experts.fuse_pre_norm)
    "rb128_tk_split_pre0": {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                            "moe_experts.down_split": 1},
    "rb128_tk_split_pre1": {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                            "moe_experts.down_split": 1, "moe_experts.fuse_pre_norm": 1},
    "rb128_tk_split_pre1_pdl": {"moe_experts.route_block": 128, "moe_experts.topk_regs": 1,
                                "moe_experts.down_split": 1, "moe_experts.fuse_pre_norm": 1,
                                "matmul_decode.pdl": 1},
    "rb128_tk_split_gp_pre1": ALL6 | {"moe_experts.fuse_pre_norm": 1},
    "rb128_tk_split_gp_pre1_t64": ALL6 | {"moe_experts.fuse_pre_norm": 1,
                                          "moe_experts.threads_per_row": 64},
    "rb256_tk_split_pre1": {"moe_experts.route_block": 256, "moe_experts.topk_regs": 1,
                            "moe_experts.down_split": 1, "moe_experts.fuse_pre_norm": 1},
    # helper moe35 (seventh session): Q4_K / Q6_K groups from 16-byte loads (dec_wide), gate_up
    # prefetching the down matrices into L2 (l2_prefetch), down_s built for 3 blocks an SM
    # (split_occupancy 3), on rb128_tk_split_pre1 (the experiment's rb_tk_split_pre)
    "w_pre1": PRE1 | {"moe_experts.dec_wide": 1},
    "pf_pre1": PRE1 | {"moe_experts.l2_prefetch": 1},
    "o3_pre1": PRE1 | {"moe_experts.split_occupancy": 3},
    "wpf_pre1": PRE1 | WPF,
    "wpfo_pre1": PRE1 | WPF | {"moe_experts.split_occupancy": 3},
    "wpfo_gp_pre1": PRE1 | WPF | {"moe_experts.split_occupancy": 3,
                                  "moe_experts.gate_up_pair": 1},
    "wpfo_gp_pre1_pdl": PRE1 | WPF | {"moe_experts.split_occupancy": 3,
                                      "moe_experts.gate_up_pair": 1, "matmul_decode.pdl": 1},
    "wpfo_pre1_pdl": PRE1 | WPF | {"moe_experts.split_occupancy": 3, "matmul_decode.pdl": 1},
    # after the checkpoint (dec_wide 1 slowed gate_up, sped the down; l2_prefetch won alone):
    # the wide groups in the down kernels only (dec_wide 2), bytes to floats without I2F
    "w2_pre1": PRE1 | {"moe_experts.dec_wide": 2},
    "fc_pre1": PRE1 | {"moe_experts.dec_fcvt": 1},
    "w2pf_pre1": PRE1 | {"moe_experts.dec_wide": 2, "moe_experts.l2_prefetch": 1},
    "w2pffc_pre1": PRE1 | W2PFFC,
    "w2pffc_gp_pre1": PRE1 | W2PFFC | {"moe_experts.gate_up_pair": 1},
    "w2pffc_o2_pre1": PRE1 | W2PFFC | {"moe_experts.split_occupancy": 2},
    # the split down at 8 outputs a block, 2 blocks an SM (moe_dec_down_s9r8: one wave)
    "o2_pre1": PRE1 | {"moe_experts.split_occupancy": 2},
    "wpfo2_pre1": PRE1 | WPF | {"moe_experts.split_occupancy": 2},
    "wpfo2_gp_pre1": PRE1 | WPF | {"moe_experts.split_occupancy": 2,
                                   "moe_experts.gate_up_pair": 1},
}  # fmt: skip


def _weights(rng: np.random.Generator, down_q6k: bool) -> tuple:
    """Router, experts (gate, up, down) and shared expert as QTensors of random valid blocks."""
    from engine.gguf_model import QTensor
    from engine.quantize import random_quantized

    def q(name: str, shape: tuple[int, ...], qtype: str) -> QTensor:
        rows, k = int(np.prod(shape[:-1])), shape[-1]
        m = min(rows, 4096)  # drawn once, repeated: the bytes, not their values, are timed
        raw = random_quantized(rng, (m, k), qtype, 0.02)
        raw = np.resize(raw, (rows, raw.shape[1])) if rows > m else raw
        return QTensor(name, qtype, shape, raw)

    def f32(name: str, a: np.ndarray) -> QTensor:
        a = np.ascontiguousarray(a, np.float32)
        return QTensor(name, "F32", a.shape, a.view(np.uint8).reshape(a.shape[0], -1))

    router = f32("router", rng.standard_normal((E, C)) * 0.05)
    experts = (q("gate", (E, F, C), "Q4_K"), q("up", (E, F, C), "Q4_K"),
               q("down", (E, C, F), "Q6_K" if down_q6k else "Q4_K"))  # fmt: skip
    shared = (f32("sg", rng.standard_normal((1, C)) * 0.05), q("sgate", (F, C), "Q4_K"),
              q("sup", (F, C), "Q4_K"), q("sdown", (C, F), "Q4_K"))  # fmt: skip
    return router, experts, shared


def _norm_weight(rng: np.random.Generator) -> Any:
    from engine.gguf_model import QTensor

    a = rng.uniform(0.5, 1.5, C).astype(np.float32)
    return QTensor("post_attention_norm", "F32", a.shape, a.view(np.uint8).reshape(1, -1))


def _graph_us(be: Any, cp: Any, call: Any) -> float:
    """us per call of LAYERS calls captured as one graph (allocations kept by the graph)."""
    keep: list = []
    pool = cp.get_default_memory_pool()

    def alloc(size: int) -> Any:
        mem = pool.malloc(size)
        keep.append(mem)
        return mem

    stream = be._stream
    for i in range(2):  # warm: kernels built, tickets allocated
        call(i)
    be.synchronize()
    cp.cuda.set_allocator(alloc)
    stream.begin_capture()
    try:
        for i in range(LAYERS):
            call(i)
    finally:
        graph = stream.end_capture()
        cp.cuda.set_allocator(pool.malloc)
    best = float("inf")
    for _ in range(5):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(stream)
        graph.launch(stream)
        e1.record(stream)
        e1.synchronize()
        best = min(best, cp.cuda.get_elapsed_time(e0, e1) * 1e3 / LAYERS)
    return best


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {}
}
"""


def _kernel_us(be: Any, cp: Any, call: Any) -> dict[str, float]:
    """us per call of each kernel: LAYERS eager calls queued behind a spin kernel (so the host's
    launches are all enqueued before the GPU reaches them; the method of scripts/decode_times.py,
    in git history), an event pair around each launch: a kernel's time plus the GPU's gap before
    it."""
    spin = cp.RawKernel(_SPIN, "spin")
    be.set_profiling(True)
    try:
        be.profile(reset=True)
        # on the current stream, the backend's (CudaBackend made it current): a `with
        # be._stream:` block would leave another stream current after it, and every later
        # launch (and graph capture) off the backend's stream
        spin((1,), (1,), (np.int64(40_000_000),))  # ~20 ms: the host enqueues meanwhile
        for i in range(LAYERS):
            call(i)
        rep = be.profile(reset=True)
    finally:
        be.set_profiling(False)
    return {k: round(t.total_ms * 1e3 / LAYERS, 2) for k, t in rep.kernels.items()}


def main(argv: list[str] | None = None) -> int:
    ap = harness.parser(__doc__, repeats=None, out=False)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--down-q6k", action="store_true", help="the routed down projection as Q6_K")
    ap.add_argument(
        "--check",
        action="store_true",
        help="also each config's NMSE against the NumPy reference on the first layer's input",
    )
    ap.add_argument(
        "--kernels",
        action="store_true",
        help="also each kernel's us per call (queued eager launches, events)",
    )
    args = ap.parse_args(argv)
    names = [c for c in args.configs.split(",") if c]
    bad = [c for c in names if c not in CONFIGS]
    if bad or not names:
        print(f"error: unknown config(s) {', '.join(bad) or '(none)'}; known: {', '.join(CONFIGS)}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.list:
        return harness.list_cases({n: CONFIGS[n] for n in names})
    from engine import backends
    from engine.backends.plan import Moe
    from engine.errors import BackendUnavailable
    from engine.tuning import TuningConfig

    try:
        be = backends.create("cuda")
    except BackendUnavailable as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cp = be._cp
    rng = np.random.default_rng(0)
    router, experts, shared = _weights(rng, args.down_q6k)
    wr = be.load_weight(router)
    we = tuple(be.load_weight(t) for t in experts)
    ws = tuple(be.load_weight(t) for t in shared)
    hs = [be.upload(rng.standard_normal((1, C)).astype(np.float32)) for _ in range(LAYERS)]
    r = be.upload(rng.standard_normal((1, C)).astype(np.float32))
    pre = be.load_weight(_norm_weight(rng))
    want = None
    if args.check:  # NumPy reads only the chosen experts' rows: about a second
        from engine.backends.numpy_ref import NumpyBackend

        ref = NumpyBackend()
        h0 = be.download(hs[0]).astype(np.float32)
        moe = Moe(ref.load_weight(router), K_USED, tuple(ref.load_weight(t) for t in experts),
                  tuple(ref.load_weight(t) for t in shared))  # fmt: skip
        out = ref._moe_ffn(h0, be.download(r), moe)
        want = np.asarray(out, np.float64)

    def call_of(name: str) -> Any:
        if "_pre" in name:  # x = hs[i] the residual row, normed by pre (in the route or apart)
            return lambda i: be._moe_ffn_prenorm(hs[i], pre, Moe(wr, K_USED, we, ws), None, 1e-6)
        return lambda i: be._moe_ffn(hs[i], r, Moe(wr, K_USED, we, ws))

    rows = []
    for name in names:
        be.set_config(TuningConfig.from_flat("cuda", CONFIGS[name]))
        try:
            us = _graph_us(be, cp, call_of(name))
        except Exception as e:  # noqa: BLE001 - a failing config is its row; the others go on
            rows.append({"config": name, "error": f"{type(e).__name__}: {e}"[:300]})
            print(f"{name}: {rows[-1]['error']}", flush=True)
            continue
        rows.append({"config": name, "us_per_ffn": us, "flat": CONFIGS[name]})
        if want is not None and "_pre" not in name:  # (want: moe_ffn of hs[0] and r)
            be.set_config(TuningConfig.from_flat("cuda", CONFIGS[name]))
            got = be.download(call_of(name)(0)).astype(np.float64)
            rows[-1]["nmse"] = float(np.sum((got - want) ** 2) / max(np.sum(want**2), 1e-30))
        if args.kernels:
            rows[-1]["kernel_us"] = _kernel_us(be, cp, call_of(name))
        if not args.json:
            per = "".join(f"  {k} {v:.1f}" for k, v in rows[-1].get("kernel_us", {}).items())
            if "nmse" in rows[-1]:
                per = f"  nmse {rows[-1]['nmse']:.2g}" + per
            print(f"moe ffn {name:10s} {us:8.2f} us/layer  x{LAYERS} = {us * LAYERS / 1e3:.3f} ms"
                  f"{per}", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps({"E": E, "k": K_USED, "F": F, "C": C, "down_q6k": args.down_q6k,
                          "rows": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
