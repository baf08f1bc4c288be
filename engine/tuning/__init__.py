"""Tuning registry (what can be tuned) and TuningConfig (one choice of every knob).

Importing this package registers every backend's kernels (engine/tuning/variants/*: plain data,
safe on any machine), so ``REGISTRY`` is complete however it is reached."""

from engine.tuning.config import OpChoice, TuningConfig
from engine.tuning.registry import REGISTRY, Constraint, Op, Param, Registry, Variant
from engine.tuning.variants import (  # noqa: F401 - registers the kernels
    cuda,
    cuda_hybrid,
    numpy_ref,
    vulkan,
)

__all__ = [
    "REGISTRY",
    "Constraint",
    "Op",
    "OpChoice",
    "Param",
    "Registry",
    "TuningConfig",
    "Variant",
]
