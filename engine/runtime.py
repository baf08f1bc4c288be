"""Loading an engine instance: model file (path or known checkpoint name) + backend + config.

Config precedence: an explicit config (``--config``) > the promoted config nearest to the model's
shape and the served context for the device class and family (configs/, engine/tuning/promoted.py)
> the registry defaults. ``Engine.source`` says which and why.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine import backends
from engine.gguf_model import GGUFModel, open_model
from engine.model import Model
from engine.models import build_model
from engine.tuning import TuningConfig
from engine.tuning.promoted import DEFAULT_CONTEXT, configs_dir, find_promoted
from engine.tuning.shape import ModelShape, shape_of

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConfigSource:
    """Where the loaded config came from and why: kind "default", "promoted", "file" (--config)
    or "given" (a TuningConfig passed in)."""

    kind: str
    path: str = ""
    reason: str = ""
    shape_key: str = ""  # the model's shape (engine/tuning/shape.py)
    context_tokens: int = 0  # the context served, which chose among promoted files

    def __str__(self) -> str:  # default, promoted:<path>, file:<path> or given
        return f"{self.kind}:{self.path}" if self.path else self.kind

    def to_dict(self) -> dict[str, Any]:
        return {"source": str(self), **asdict(self)}


@dataclass
class Engine:
    model: Model
    gguf: GGUFModel
    source: ConfigSource

    @property
    def config_source(self) -> str:
        """The source in one word: default, promoted:<path>, file:<path> or given."""
        return str(self.source)

    @property
    def shape(self) -> ModelShape:
        return shape_of(self.gguf)

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
    context_tokens: int = DEFAULT_CONTEXT,
    progress: Callable[[int, int], None] | None = None,
) -> Engine:
    """``device``: an index of the backend's ``list_devices()`` (None: its default choice).
    ``context_tokens``: the context this engine serves, which picks among promoted configs.
    ``progress(done, total)``: called after each weight is on the device, in bytes of the file's
    tensors (engine run's loading bar)."""
    path = resolve_model_path(model)
    gguf = open_model(path)
    be = backends.create(backend, device=device)
    device = be.device_info()
    shape = shape_of(gguf)
    if isinstance(config, TuningConfig):
        cfg, source = config, ConfigSource("given", reason="passed in")
    elif config is not None:
        cfg = TuningConfig.from_toml(config, backend)
        source = ConfigSource("file", str(config), "--config")
    else:
        cfg = TuningConfig.default(backend)
        source = ConfigSource("default", reason="--no-promoted")
        if use_promoted:
            found = find_promoted(backend, device.device_class, shape, context_tokens)
            if found:
                cfg = found.config
                source = ConfigSource("promoted", str(found.path), found.reason)
            else:
                where = configs_dir() / device.device_class / gguf.spec.family
                source = ConfigSource(
                    "default", reason=f"no promoted config for backend {backend} in {where}"
                )
    source = replace(source, shape_key=shape.key, context_tokens=context_tokens)
    cfg.check(device)
    be.set_config(cfg)
    log.info(
        "loading %s on %s (%s), config: %s (%s)",
        path.name,
        device.name,
        device.device_class,
        source,
        source.reason,
    )
    if progress is None:
        return Engine(build_model(gguf, be), gguf, source)
    with _reporting_weights(be, gguf, progress):
        return Engine(build_model(gguf, be), gguf, source)


@contextmanager
def _reporting_weights(
    be: Backend, gguf: GGUFModel, progress: Callable[[int, int], None]
) -> Iterator[None]:
    """Count the bytes each ``load_weight`` puts on the device, for the models' own loading
    loops (the dense and the hybrid one) to report without a parameter of their own."""
    total = sum(gguf.tensor(n).nbytes for n in gguf.model_tensor_names())
    done = 0
    upload = be.load_weight

    def counted(qt: Any) -> Any:
        nonlocal done
        w = upload(qt)
        done += qt.nbytes
        progress(done, total)
        return w

    be.load_weight = counted  # type: ignore[method-assign]
    try:
        yield
    finally:
        del be.load_weight  # the class's method again
