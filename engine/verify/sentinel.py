"""The drift sentinel: is this backend's reference path still computing the model?

validate compares a candidate with the same backend's reference path (per-token, default
kernels), so a bug in a kernel both share (the default rms_norm, RoPE, a dequant) or a driver
regression passes it. The sentinel runs that reference path against the NumPy backend on a
small synthetic model of the same architecture (``engine.synth`` preset ``ragged``: row counts
that are no multiple of any tile), teacher forced, with REFERENCE_BUDGET (the recurrent hybrid
families: REFERENCE_BUDGET_RECURRENT). The verdict is cached
per (backend, device class, driver, engine version, model family): a new driver or engine build
is a new key and runs it again. A worker whose sentinel fails refuses to tune (worker.evaluator).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SENTINEL_PRESET = "ragged"
SENTINEL_PROMPTS = (5, 37)  # a short prompt and one past the 32-token chunk edge
SENTINEL_STEPS = 4


@dataclass
class SentinelResult:
    passed: bool
    key: dict[str, str]
    kld: float
    nmse: float
    max_abs_diff: float
    reasons: list[str] = field(default_factory=list)
    blame: dict[str, Any] | None = None
    cached: bool = False

    def why(self) -> str:
        where = ", ".join(f"{k} {v}" for k, v in self.key.items())
        first = f"; first divergence: {self.blame['text']}" if self.blame else ""
        return (
            f"reference path disagrees with the NumPy backend ({where}): "
            + "; ".join(self.reasons[:2])
            + first
        )


def cache_key(backend: str, device_class: str, driver: str, engine: str, family: str) -> dict:
    return {
        "backend": backend,
        "device_class": device_class,
        "driver": driver,
        "engine": engine,
        "family": family,
    }


def _cache_file(key: dict[str, str], root: Path) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return root / f"{key['backend']}-{key['family']}-{digest}.json"


def default_root() -> Path:
    from engine.checkpoints import cache_dir

    return cache_dir() / "sentinel"


def check(
    backend: Any,
    family: str,
    engine_version: str,
    root: Path | None = None,
    refresh: bool = False,
) -> SentinelResult:
    """The sentinel's verdict for this backend instance and model family, from the cache when
    the key was judged before (``refresh`` runs it again). Leaves the backend on its default
    config."""
    from engine.gguf_model import open_model
    from engine.models import build_model
    from engine.synth import ARCHS, write_synthetic
    from engine.synth_hybrid import HYBRID_ARCHS
    from engine.verify.budgets import REFERENCE_BUDGET, REFERENCE_BUDGET_RECURRENT
    from engine.verify.cross_check import cross_check_numpy

    dev = backend.device_info()
    key = cache_key(backend.name, dev.device_class, dev.driver, engine_version, family)
    if family not in ARCHS:  # no synthetic model of this family yet: say so, do not block
        return SentinelResult(True, key, 0.0, 0.0, 0.0, [f"no sentinel model for {family}"])
    root = root or default_root()
    path = _cache_file(key, root)
    if path.exists() and not refresh and "+dirty" not in engine_version:
        data = json.loads(path.read_text())
        if data.get("key") == key:
            return SentinelResult(**{**data, "cached": True})
    model_path = root / f"{family}-{SENTINEL_PRESET}-q4_k_m.gguf"
    if not model_path.exists():
        root.mkdir(parents=True, exist_ok=True)
        tmp = model_path.with_suffix(".tmp")
        write_synthetic(
            tmp, arch=family, preset=SENTINEL_PRESET, quant_mix="q4_k_m", progress=False
        )
        tmp.replace(model_path)  # whole or absent: a killed worker leaves no half file
    from engine.bench import bench_prompt

    model = build_model(open_model(model_path), backend)
    prompts = [bench_prompt(n, model.spec.n_vocab, seed=11) for n in SENTINEL_PROMPTS]
    budget = REFERENCE_BUDGET_RECURRENT if family in HYBRID_ARCHS else REFERENCE_BUDGET
    cc = cross_check_numpy(model, prompts, steps=SENTINEL_STEPS, budget=budget)
    res = SentinelResult(
        cc["passed"], key, cc["kld"], cc["nmse"], cc["max_abs_diff"], cc["reasons"], cc["blame"]
    )
    root.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({k: v for k, v in asdict(res).items() if k != "cached"}, indent=1))
    tmp.replace(path)
    return res
