"""Where promoted configs live and how the engine picks one up: configs/<device class>/<family>.toml
(written and committed by the agent). ``--config`` on the command line overrides it."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from engine.errors import ConfigError
from engine.tuning.config import TuningConfig

log = logging.getLogger(__name__)


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
