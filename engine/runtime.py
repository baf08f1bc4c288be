"""Loading an engine instance: model file (path or known checkpoint name) + backend + config.

Config precedence: an explicit config (``--config``) > the promoted config for the device class
and model family (configs/) > the registry defaults.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from engine import backends
from engine.gguf_model import GGUFModel, open_model
from engine.model import Model
from engine.models import build_model
from engine.tuning import TuningConfig
from engine.tuning.promoted import find_promoted

if TYPE_CHECKING:
    from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class Engine:
    model: Model
    gguf: GGUFModel
    config_source: str  # "default", "promoted:<path>" or "file:<path>" / "given"

    @property
    def backend(self):  # noqa: ANN201 - engine.backends.base.Backend
        return self.model.backend

    def tokenizer(self) -> Tokenizer:
        from engine.tokenizer import Tokenizer

        if not hasattr(self, "_tok"):
            self._tok = Tokenizer.from_metadata(self.gguf.metadata)
        return self._tok


def resolve_model_path(model: str | Path) -> Path:
    p = Path(model)
    if p.exists():
        return p
    from engine.checkpoints import resolve

    return resolve(str(model))


def load(
    model: str | Path,
    backend: str = "numpy",
    config: TuningConfig | str | Path | None = None,
    use_promoted: bool = True,
    device: int | None = None,
) -> Engine:
    """``device``: an index of the backend's ``list_devices()`` (None: its default choice)."""
    path = resolve_model_path(model)
    gguf = open_model(path)
    be = backends.create(backend, device=device)
    device = be.device_info()
    source = "default"
    if isinstance(config, TuningConfig):
        cfg, source = config, "given"
    elif config is not None:
        cfg, source = TuningConfig.from_toml(config, backend), f"file:{config}"
    else:
        cfg = TuningConfig.default(backend)
        found = (
            find_promoted(backend, device.device_class, gguf.spec.family) if use_promoted else None
        )
        if found:
            cfg, p = found
            source = f"promoted:{p}"
    cfg.check(device)
    be.set_config(cfg)
    log.info(
        "loading %s on %s (%s), config: %s", path.name, device.name, device.device_class, source
    )
    return Engine(build_model(gguf, be), gguf, source)
