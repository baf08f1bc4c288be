"""Where promoted configs live and how the engine picks one up.

A promotion is keyed by what it was tuned on, as Triton's autotune ``key=`` selects a tuned
config by shape: configs/<device class>/<family>/<shape key>.ctx<context>.toml, the shape key
from the model's dimensions and quant mix (engine/tuning/shape.py) and the context the experiment
serves (its ``[memory] context_tokens``). The file records both in ``[evidence.tuned_on]``.

The engine loads the nearest match (``find_promoted``) of its device class, family and backend:
1. the shape: the exact key, else the nearest by ``ModelShape.distance`` (ties: by key);
2. among that shape's files, the context: the smallest at or above the serving context, else
   the largest below it.
It says which file it loaded and why. ``--config`` on the command line overrides it.
"""

from __future__ import annotations

import logging
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ConfigError
from engine.tuning.config import TuningConfig
from engine.tuning.shape import ModelShape

log = logging.getLogger(__name__)

# engine.verify.sentinel.cache_key's fields: the key a promoted config was validated under
KEY_FIELDS = ("backend", "device_class", "driver", "engine", "family")
# The context the engine serves when not told (`engine run/bench/validate --context`); the same
# as an experiment's default [memory] context_tokens.
DEFAULT_CONTEXT = 4096


def configs_dir() -> Path:
    """$FLEETTUNE_CONFIGS, else configs/ of this checkout."""
    env = os.environ.get("FLEETTUNE_CONFIGS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "configs"


def promoted_path(
    device_class: str, shape: ModelShape, context_tokens: int, root: Path | None = None
) -> Path:
    """Where the promotion for this device class, shape and served context is written."""
    name = f"{shape.key}.ctx{context_tokens}.toml"
    return (root or configs_dir()) / device_class / shape.family / name


def tuned_on(shape: ModelShape, context_tokens: int) -> dict[str, Any]:
    """The ``[evidence.tuned_on]`` table: the shape (key, family, quant, dims) and context."""
    return {**shape.to_dict(), "context_tokens": int(context_tokens)}


@dataclass(frozen=True)
class Candidate:
    """A promoted file of this device class, family and backend, and what it was tuned on."""

    path: Path
    shape: ModelShape
    context_tokens: int


@dataclass(frozen=True)
class Match:
    """The promoted config the engine loads, the file and why it is the nearest."""

    config: TuningConfig
    path: Path
    shape_key: str
    context_tokens: int
    reason: str


def read_tuned_on(evidence: dict[str, Any], path: Path) -> tuple[ModelShape, int]:
    """(shape, context) a promoted file's evidence records; ConfigError naming what is not."""
    t = evidence.get("tuned_on")
    if not isinstance(t, dict):
        raise ConfigError(f"{path}: no [evidence.tuned_on] table (what was it tuned on?)")
    ctx = t.get("context_tokens")
    if not isinstance(ctx, int) or isinstance(ctx, bool) or ctx < 1:
        raise ConfigError(f"{path}: evidence.tuned_on.context_tokens = {ctx!r}: must be >= 1")
    try:
        return ModelShape.from_dict(t), ctx
    except ConfigError as e:
        raise ConfigError(f"{path}: evidence.tuned_on: {e}") from None


def candidates(
    backend: str, device_class: str, family: str, root: Path | None = None
) -> list[Candidate]:
    """Every promoted file of this class, family and backend; a file for another backend is
    skipped, one that does not say what it was tuned on is skipped with a warning."""
    folder = (root or configs_dir()) / device_class / family
    out = []
    for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
        try:
            data = tomllib.loads(path.read_text())
            if data.get("backend") != backend:
                continue
            ev = data.get("evidence")
            shape, ctx = read_tuned_on(ev if isinstance(ev, dict) else {}, path)
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError) as e:
            log.warning("ignoring promoted config %s: %s", path, e)
            continue
        out.append(Candidate(path, shape, ctx))
    return out


def nearest(
    found: list[Candidate], shape: ModelShape, context_tokens: int
) -> tuple[Candidate, str] | None:
    """The candidate to load for this shape and serving context, and why (module docstring)."""
    if not found:
        return None
    by_key = {c.shape.key: c.shape for c in found}
    if shape.key in by_key:
        key, why = shape.key, f"exact shape {shape.key}"
    else:
        dist = {k: shape.distance(s) for k, s in by_key.items()}
        key = min(sorted(dist), key=dist.__getitem__)
        why = (
            f"nearest shape {key} at distance {dist[key]:.2f} to {shape.key} "
            f"(no exact match among {len(by_key)})"
        )
    same = [c for c in found if c.shape.key == key]
    above = [c for c in same if c.context_tokens >= context_tokens]
    if above:
        pick = min(above, key=lambda c: c.context_tokens)
        rel = "=" if pick.context_tokens == context_tokens else ">="
        ctx = f"context {pick.context_tokens} {rel} serving {context_tokens}"
        if len(same) > 1 and rel != "=":
            ctx += " (the smallest at or above)"
    else:
        pick = max(same, key=lambda c: c.context_tokens)
        ctx = (
            f"context {pick.context_tokens} < serving {context_tokens} "
            "(none at or above: the largest below)"
        )
    return pick, f"{why}; {ctx}"


def find_promoted(
    backend: str,
    device_class: str,
    shape: ModelShape,
    context_tokens: int = DEFAULT_CONTEXT,
    root: Path | None = None,
) -> Match | None:
    """The promoted config nearest to this shape and serving context for this device class,
    family and backend, if any. A nearest file that no longer loads (the registry changed)
    is skipped with a warning and the next nearest tried."""
    found = candidates(backend, device_class, shape.family, root)
    while (best := nearest(found, shape, context_tokens)) is not None:
        pick, why = best
        try:
            cfg = TuningConfig.from_toml(pick.path)
        except ConfigError as e:
            log.warning("ignoring promoted config: %s", e)
            found.remove(pick)
            continue
        return Match(cfg, pick.path, pick.shape.key, pick.context_tokens, why)
    return None


def read_evidence(path: Path) -> dict[str, Any]:
    """The ``[evidence]`` table of a promoted file ({} when it has none); ConfigError when the
    file is not TOML."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the promoted config ({e})") from None
    ev = data.get("evidence", {})
    return ev if isinstance(ev, dict) else {}


def evidence_key(evidence: dict[str, Any], backend: str = "") -> dict[str, str] | None:
    """The sentinel key a promotion was validated under: its ``sentinel_key`` table, else rebuilt
    from the older evidence fields; None when the evidence does not say."""
    key = evidence.get("sentinel_key")
    if isinstance(key, dict) and all(k in key for k in KEY_FIELDS):
        return {k: str(key[k]) for k in KEY_FIELDS}
    old = (evidence.get("device_class"), evidence.get("driver"), evidence.get("engine_commit"))
    family = evidence.get("model_family")
    if backend and family and all(old):
        from engine.verify.sentinel import cache_key

        return cache_key(backend, *(str(v) for v in old), str(family))
    return None


def key_changes(then: dict[str, str] | None, now: dict[str, str]) -> list[str]:
    """What differs between the recorded key and this machine's, in words ([] = same key). An
    engine with uncommitted changes or of unknown commit is never the one that was validated."""
    if not then:
        return ["the evidence records no sentinel key"]
    out = [f"{k} {then.get(k)!r} -> {now[k]!r}" for k in KEY_FIELDS if then.get(k) != now[k]]
    engine = now["engine"]
    if not out and ("+dirty" in engine or engine == "unknown"):
        out.append(f"engine {engine!r} is not a committed build")
    return out
