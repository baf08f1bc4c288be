"""The parts of an experiment file that agent.space resolves against the registry: which
variants and knob values of each op to search. A leaf below both agent.experiment (which parses
them) and agent.space (which builds Optuna parameters from them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import ConfigError


class ExperimentError(ConfigError):
    """An experiment file that cannot be used; the message names the key and the allowed values."""


SHOW_CHARS = 80


def show(value: Any) -> str:
    """A value as an error message echoes it: repr (control characters escaped), cut to
    SHOW_CHARS (a 2 MB value was echoed in full)."""
    s = repr(value)
    return s if len(s) <= SHOW_CHARS else f"{s[:SHOW_CHARS]}... ({len(s):,} characters)"


@dataclass(frozen=True)
class ParamRule:
    """Allowed values of one knob: ``choices`` (a subset of the registry's), a ``[min, max]``
    range over the registry's numeric choices, or all of them. ``variant`` limits the rule to
    one variant (key ``"<variant>.<param>"``); None applies it to every variant with that knob."""

    name: str
    variant: str | None = None
    choices: tuple[Any, ...] | None = None
    min: int | None = None
    max: int | None = None


@dataclass(frozen=True)
class OpRule:
    """Which variants of one op to search (None: all registered) and rules for their knobs;
    knobs with no rule take all their registry choices."""

    op: str
    variants: tuple[str, ...] | None = None
    params: tuple[ParamRule, ...] = ()


@dataclass(frozen=True)
class BackendSpace:
    """The searched part of one backend's registry. ``everything``: all ops, variants, knobs;
    otherwise only the listed ops are searched and the rest stay at the baseline."""

    backend: str
    everything: bool = False
    ops: tuple[OpRule, ...] = ()
