"""Where promoted configs live and how the engine picks one up: configs/<device class>/<family>.toml
(written and committed by the agent). ``--config`` on the command line overrides it."""

from __future__ import annotations

import logging
import os
import tomllib
from pathlib import Path
from typing import Any

from engine.errors import ConfigError
from engine.tuning.config import TuningConfig

log = logging.getLogger(__name__)

# engine.sentinel.cache_key's fields: the key a promoted config was validated under
KEY_FIELDS = ("backend", "device_class", "driver", "engine", "family")


def configs_dir() -> Path:
    """$FLEETTUNE_CONFIGS, else configs/ of this checkout."""
    env = os.environ.get("FLEETTUNE_CONFIGS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "configs"


def promoted_path(device_class: str, family: str, root: Path | None = None) -> Path:
    return (root or configs_dir()) / device_class / f"{family}.toml"


def find_promoted(
    backend: str, device_class: str, family: str, root: Path | None = None
) -> tuple[TuningConfig, Path] | None:
    """The promoted config for this device class and model family, if one exists for this
    backend. A promoted file for another backend of the same class is skipped, not an error."""
    path = promoted_path(device_class, family, root)
    if not path.exists():
        return None
    try:
        cfg = TuningConfig.from_toml(path)
    except ConfigError as e:
        log.warning("ignoring promoted config: %s", e)
        return None
    if cfg.backend != backend:
        log.info(
            "promoted config %s is for backend %s, not %s: not used", path, cfg.backend, backend
        )
        return None
    return cfg, path


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
        from engine.sentinel import cache_key

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
