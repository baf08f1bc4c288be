"""Typed views of a variant's knobs: ``config.knobs("matmul_decode").warps`` in place of string
lookups. Each view class is generated from the registry's declaration of one variant (its knobs
and the values derived from them), so a knob it does not declare is an AttributeError naming
the op and variant, and a derived value (Variant.derived) is computed once, here."""

from __future__ import annotations

from dataclasses import make_dataclass
from functools import cache, lru_cache
from typing import Any

from engine.tuning.registry import REGISTRY


@cache
def view_class(backend: str, op: str, variant: str) -> type:
    """The frozen view class of one variant: ``variant`` and one field per knob and derived
    value (named ``<op>.<variant>``, which Python's AttributeError then names)."""
    v = REGISTRY.op(backend, op).variant(variant)
    fields = [("variant", str)]
    fields += [(p.name, type(p.default)) for p in v.params]
    fields += [(d.name, Any) for d in v.derived]
    cls = make_dataclass(f"{op}.{variant}", fields, frozen=True, slots=True)
    cls.__doc__ = f"The knobs of {backend}.{op}.{variant} (engine.tuning.knobs)."
    return cls


@lru_cache(maxsize=1024)
def knobs(backend: str, op: str, choice: Any) -> Any:
    """The typed view of ``choice`` (an engine.tuning.config.OpChoice, which imports this
    module: a variant of ``op`` and its knob values)."""
    v = REGISTRY.op(backend, op).variant(choice.variant)
    values: dict[str, Any] = {"variant": choice.variant, **dict(choice.params)}
    for d in v.derived:  # in declaration order: a derived value may read an earlier one
        values[d.name] = d.compute(_Partial(values))
    return view_class(backend, op, choice.variant)(**values)


class _Partial:
    """Attribute access to the values known so far (what a Derived's compute reads)."""

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None
