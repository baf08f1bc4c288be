"""Per-phase profile of a hybrid model (qwen35 / qwen35moe / qwen3next), like the seed's: ms per
phase at prefill (one batched prefill of --prompt tokens) and per decode token (--gen eager
steps), from the backend's profile(): CUDA events per kernel on CUDA, each kernel charged to the
phase whose op launched it; on other backends, wall clock per op with a synchronize around it.

Phases: delta-net layers dn.proj (qkv / gate / beta / alpha projections, gates), dn.conv,
dn.scan (with delta_net.fuse_decode: also the gates and the gated norm; with fuse_conv also the
conv), dn.norm+out (norm, silu gate, ssm_out, the post-attention norm); attention layers
attn.proj, attn.core (q/k
norm, RoPE, cache, attention, gate), attn.out; FFN ffn (dense), moe.router, moe.experts,
moe.shared (moe.fused: moe_experts.fuse_decode's three kernels, all of a decode token's MoE FFN);
other (embedding, layer norms, residual adds, LM head, argmax).

    python tools/profile_hybrid.py --model M.gguf [--backend cuda] [--config C.toml]
        [--set op.knob=value ...] [--prompt 512] [--gen 16] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# op called inside a layer of a kind -> phase (the outermost op decides; ops inside it, like
# matmul_add's matmul, are charged to it)
_DN = {"matmuls": "proj", "matmul": "norm+out", "ssm_gates": "proj", "ssm_conv": "conv",
       "delta_net": "scan", "delta_net_gated": "scan", "rms_norm": "norm+out", "swiglu": "norm+out",
       "matmul_add": "norm+out", "matmul_add_norm": "norm+out", "ssm_in": "proj",
       "delta_net_conv_gated": "scan"}  # fmt: skip
# (matmul_add_norm: the output projection and the post-attention norm after it)
_THROUGH = ("delta_net_conv_gated",)  # op by op (no fusion) its inner ops keep their phases
_ATTN = {"matmuls": "proj", "matmul": "out", "matmul_add": "out", "matmul_add_norm": "out"}
_MOE = {"router_topk": "router", "moe_experts": "experts"}  # else shared (first matmul: router)
# the backend's ops (backend.ops) and (underscored) its fusion pass's steps, named without the
# underscore
OPS = ("embedding", "rms_norm", "matmul", "matmuls", "_matmul_add", "_ffn", "add", "swiglu",
       "argmax", "rope_partial", "sigmoid_mul", "ssm_conv", "ssm_gates", "delta_net",
       "router_topk", "moe_experts", "kv_write", "attention", "cols", "reshape",
       "rows", "_delta_net_gated", "_attn_qk_prep", "ssm_in", "_delta_net_conv_gated",
       "_matmul_add_norm", "_ffn_norm")  # fmt: skip
MOE_STEPS = ("_moe_ffn", "_moe_ffn_norm", "_moe_ffn_prenorm")  # the MoE FFN as one step


class PhaseTracker:
    """Wraps a model's layer methods and its backend's ops so the current phase is known at
    every launch; CUDA's kernel events get the phase as a name prefix, other backends are
    timed per op here."""

    def __init__(self, model: Any) -> None:
        self.model, self.be = model, model.backend
        self.kind = ""  # dn / attn / ffn / moe while in such a layer part
        self.depth = 0
        self.moe_matmuls = 0
        self.phase = "other"
        self.cuda = self.be.name == "cuda"
        self.wall: dict[str, list[float]] = {}
        for name, kind in (("_delta_net", "dn"), ("_attention", "attn"), ("_ffn", "ffn")):
            setattr(model, name, self._layer(kind, getattr(model, name)))
        # the fusion pass's mixer step (no hook: the model's _delta_net / _attention don't run)
        self.be._mixer = self._mixer(self.be._mixer)
        for op in OPS:  # an op on the backend's op set, a fusion step on the backend
            on = self.be if op.startswith("_") else self.be.ops
            if hasattr(on, op):
                setattr(on, op, self._op(op.lstrip("_"), getattr(on, op)))
        for op in MOE_STEPS:
            if hasattr(self.be, op):
                setattr(self.be, op, self._moe_ffn(getattr(self.be, op)))
        if self.cuda:
            timed = self.be._timed
            self.be._timed = lambda name: timed(f"{self.phase}|{name}")

    def restore(self) -> None:
        """Drop the wrappers: the model and backend run as before."""
        for name in ("_delta_net", "_attention", "_ffn"):
            self.model.__dict__.pop(name, None)
        for op in (*OPS, *MOE_STEPS, "_mixer"):
            self.be.__dict__.pop(op, None)
            self.be.ops.__dict__.pop(op, None)
        self.be.__dict__.pop("_timed", None)

    def _layer(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            if kind == "ffn" and self.model.spec.moe is not None:
                self.kind, self.moe_matmuls = "moe", 0
            else:
                self.kind = kind
            try:
                return fn(*args, **kw)
            finally:
                self.kind = ""

        return call

    def _mixer(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Backend.trunk's mixer step: a delta-net or an attention layer by its plan."""
        from engine.backends.plan import DeltaNet

        def call(mixer: Any, *args: Any, **kw: Any) -> Any:
            return self._layer("dn" if isinstance(mixer, DeltaNet) else "attn", fn)(
                mixer, *args, **kw
            )

        return call

    def _moe_ffn(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """Inside moe_ffn the ops of its op-by-op form are charged as in _ffn; the fused
        kernels, launched by no op, to moe.fused."""

        def call(*args: Any, **kw: Any) -> Any:
            self.kind, self.moe_matmuls, self.phase = "moe", 0, "moe.fused"
            try:
                return fn(*args, **kw)
            finally:
                self.kind, self.phase = "", "other"

        return call

    def _phase_of(self, op: str) -> str:
        if op in ("ffn", "ffn_norm"):
            return "ffn"
        if self.kind == "dn":
            return "dn." + _DN.get(op, "proj" if op in ("cols",) else "norm+out")
        if self.kind == "attn":
            return "attn." + _ATTN.get(op, "core")
        if self.kind == "moe":
            if op == "matmul" and self.moe_matmuls == 0:
                self.moe_matmuls += 1
                return "moe.router"
            return "moe." + _MOE.get(op, "shared")
        if self.kind == "ffn":
            return "ffn"
        return "other"

    def _after_op(self) -> str:
        """The phase of launches made by no op: the fused MoE FFN's inside moe_ffn."""
        return "moe.fused" if self.kind == "moe" else "other"

    def _op(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            if self.depth:
                return fn(*args, **kw)
            if op in _THROUGH:  # its own launches to its phase, its inner ops to theirs
                self.phase = self._phase_of(op)
                try:
                    return fn(*args, **kw)
                finally:
                    self.phase = self._after_op()
            self.phase = self._phase_of(op)
            self.depth += 1
            t0 = 0.0
            if not self.cuda:
                self.be.synchronize()
                t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                self.depth -= 1
                if not self.cuda:
                    self.be.synchronize()
                    e = self.wall.setdefault(self.phase, [0, 0.0])
                    e[0] += 1
                    e[1] += 1e3 * (time.perf_counter() - t0)
                self.phase = self._after_op()

        return call

    @contextlib.contextmanager
    def measure(self) -> Iterator[dict[str, Any]]:
        """Phase -> ms and kernel -> ms of what runs inside the block."""
        out: dict[str, Any] = {}
        self.wall = {}
        rep = None
        if self.cuda:  # (the base class's wall-clock profiling would replace the op wrappers)
            self.be.set_profiling(True)
            self.be.profile(reset=True)
        try:
            yield out
        finally:
            if self.cuda:
                rep = self.be.profile(reset=True)
                self.be.set_profiling(False)
        phases: dict[str, float] = {}
        kernels: dict[str, float] = {}
        if self.cuda:
            for name, entry in _entries(rep):
                phase, _, kernel = name.partition("|")
                phases[phase] = phases.get(phase, 0.0) + entry
                kernels[name] = kernels.get(name, 0.0) + entry
        else:
            phases = {k: v[1] for k, v in self.wall.items()}
        out["phases"], out["kernels"] = phases, kernels


def _entries(rep: Any) -> Iterator[tuple[str, float]]:
    """(name, total ms) of a ProfileReport."""
    for name, k in rep.kernels.items():
        yield name, float(k.total_ms)


def phase_profile(model: Any, n_prompt: int, n_gen: int) -> dict[str, Any]:
    """One batched prefill of n_prompt tokens, then n_gen single-token forwards (eager: what a
    decode step's graph replays), each split by phase (and by kernel on CUDA)."""
    import numpy as np

    be = model.backend
    V = model.spec.n_vocab
    prompt = [(7 + 31 * i) % V for i in range(n_prompt)]
    model.generate(prompt, 2)  # warm up (lazy allocations, GEMM paths) at the measured length
    tr = PhaseTracker(model)
    cache = model.new_cache(n_prompt + n_gen + 1)
    with tr.measure() as pre:
        model.prefill(prompt, cache)
    with tr.measure() as dec:
        for t in range(n_gen):
            ids = be.upload(np.array([prompt[t % n_prompt]], np.int32))
            model.forward(ids, 1, n_prompt + t, cache)
    tr.restore()
    return {
        "backend": be.name,
        "config": be.config.flat(),
        "prompt_tokens": n_prompt,
        "gen_tokens": n_gen,
        "prefill_ms": pre["phases"],
        "decode_ms_per_token": {k: v / n_gen for k, v in dec["phases"].items()},
        "prefill_kernels_ms": pre["kernels"],
        "decode_kernels_ms_per_token": {k: v / n_gen for k, v in dec["kernels"].items()},
    }


def _config(backend: str, path: Path | None, sets: list[str]) -> Any:
    from engine.tuning import TuningConfig

    cfg = TuningConfig.from_toml(path, backend) if path else TuningConfig.default(backend)
    flat = {}
    for s in sets:
        key, _, val = s.partition("=")
        flat[key] = json.loads(val) if val[:1].isdigit() or val in ("true", "false") else val
    return cfg.replace(**flat) if flat else cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--config", type=Path)
    ap.add_argument("--set", action="append", default=[], help="op.knob=value (repeatable)")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if not args.model.is_file():
        print(f"error: {args.model}: no such file", file=sys.stderr)
        return 2
    if args.prompt < 1 or args.gen < 1:
        print("error: --prompt and --gen must be >= 1", file=sys.stderr)
        return 2
    from engine.backends import create
    from engine.gguf_model import open_model
    from engine.models import build_model

    be = create(args.backend, _config(args.backend, args.config, args.set))
    model = build_model(open_model(args.model), be)
    if not model.spec.hybrid:
        print(
            f"error: {args.model.name} is not a hybrid model ({model.spec.arch})", file=sys.stderr
        )
        return 2
    report = {"model": args.model.name} | phase_profile(model, args.prompt, args.gen)
    pre, dec_tok = report["prefill_ms"], report["decode_ms_per_token"]
    rows = sorted(set(pre) | set(dec_tok))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    tp, td = sum(pre.values()), sum(dec_tok.values())
    print(f"{args.model.name} on {be.name}: prefill {args.prompt} tokens, decode ms per token")
    print(f"{'phase':<16}{'prefill ms':>12}{'%':>7}{'decode ms/tok':>15}{'%':>7}")
    for r in rows:
        p, d = pre.get(r, 0.0), dec_tok.get(r, 0.0)
        pp, dp = 100 * p / max(tp, 1e-9), 100 * d / max(td, 1e-9)
        print(f"{r:<16}{p:>12.2f}{pp:>7.1f}{d:>15.3f}{dp:>7.1f}")
    print(f"{'total':<16}{tp:>12.2f}{'':>7}{td:>15.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
