"""Tuning registry (what can be tuned) and TuningConfig (one choice of every knob)."""

from engine.tuning.config import OpChoice, TuningConfig
from engine.tuning.registry import REGISTRY, Constraint, Op, Param, Registry, Variant

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
