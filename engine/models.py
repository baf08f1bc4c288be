"""The forward schedule a GGUF file gets: engine.model.Model for dense files, its subclass
engine.hybrid.HybridModel for hybrid ones (qwen35, qwen35moe, qwen3next). Models are built here
so that the dense schedule does not import the hybrid one that extends it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.hybrid import HybridModel
from engine.model import Model

if TYPE_CHECKING:
    from engine.backends.base import Backend
    from engine.gguf_model import GGUFModel


def build_model(gguf: GGUFModel, backend: Backend) -> Model:
    """The model of gguf on backend, with the schedule its architecture needs."""
    cls = HybridModel if gguf.spec.hybrid else Model
    return cls(gguf, backend)
