"""The search space of a study: the part of the tuning registry an experiment opens, as Optuna
parameters conditional on the variant.

Optuna parameter names: ``<op>.variant`` for the variant of an op, ``<op>.<variant>.<param>`` for
a knob of that variant (a knob is suggested only in trials that chose its variant, so two
variants' knobs of the same name never share a distribution). Ops the experiment does not open
stay at the baseline. Everything is read from the registry: the agent names no kernel's knob.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import product
from typing import Any

import optuna

from agent.space_rules import BackendSpace, ExperimentError, OpRule, ParamRule
from engine.tuning import REGISTRY, Op, Param, Variant


@dataclass(frozen=True)
class Dim:
    """One Optuna parameter: its name, the flat config key it sets, and its choices."""

    name: str
    key: str
    choices: tuple[Any, ...]
    ordinal: bool = False  # numeric: suggested as an index into the sorted choices (CMA-ES)

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.ordinal:
            return self.choices[trial.suggest_int(self.name, 0, len(self.choices) - 1)]
        return trial.suggest_categorical(self.name, list(self.choices))

    def encode(self, value: Any) -> Any:
        return self.choices.index(value) if self.ordinal else value


@dataclass(frozen=True)
class OpSpace:
    op: str
    variant_dim: Dim  # may have a single choice (then it is fixed, never suggested)
    params: tuple[tuple[str, tuple[Dim, ...]], ...]  # per variant name

    def dims_of(self, variant: str) -> tuple[Dim, ...]:
        for v, dims in self.params:
            if v == variant:
                return dims
        return ()


@dataclass(frozen=True)
class SearchSpace:
    backend: str
    ops: tuple[OpSpace, ...]

    @property
    def size(self) -> int:
        """Number of distinct configs in the space."""
        total = 1
        for o in self.ops:
            n = 0
            for _, dims in o.params:
                k = 1
                for d in dims:
                    k *= len(d.choices)
                n += k
            total *= max(n, 1)
        return total

    def suggest(self, trial: optuna.Trial, baseline: Mapping[str, Any]) -> dict[str, Any]:
        """A flat config: the baseline with every opened op suggested by the trial."""
        opened = {o.op for o in self.ops}
        flat = {k: v for k, v in baseline.items() if k.partition(".")[0] not in opened}
        for o in self.ops:
            v = _pick(o.variant_dim, trial)
            flat[o.variant_dim.key] = v
            for d in o.dims_of(v):
                flat[d.key] = _pick(d, trial)
        return flat

    def random_config(self, rng: random.Random, baseline: Mapping[str, Any]) -> dict[str, Any]:
        """A config drawn at random (each op's variant, then that variant's knobs)."""
        opened = {o.op for o in self.ops}
        flat = {k: v for k, v in baseline.items() if k.partition(".")[0] not in opened}
        for o in self.ops:
            v = rng.choice(o.variant_dim.choices)
            flat[o.variant_dim.key] = v
            for d in o.dims_of(str(v)):
                flat[d.key] = rng.choice(d.choices)
        return flat

    def params_of(self, flat: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Optuna params that make ``suggest`` return this config, or None when the config
        is outside the space (then it cannot be enqueued)."""
        out: dict[str, Any] = {}
        for o in self.ops:
            v = flat.get(o.variant_dim.key)
            if v not in o.variant_dim.choices:
                return None
            if len(o.variant_dim.choices) > 1:
                out[o.variant_dim.name] = v
            for d in o.dims_of(str(v)):
                value = flat.get(d.key)
                if value not in d.choices:
                    return None
                if len(d.choices) > 1:
                    out[d.name] = d.encode(value)
        return out

    def grid(self) -> dict[str, list[Any]]:
        """Every suggested dimension with its choices, for optuna's GridSampler."""
        out: dict[str, list[Any]] = {}
        for o in self.ops:
            if len(o.variant_dim.choices) > 1:
                out[o.variant_dim.name] = list(o.variant_dim.choices)
            for _, dims in o.params:
                for d in dims:
                    if len(d.choices) > 1:
                        out[d.name] = [d.encode(c) for c in d.choices]
        return out


def _pick(d: Dim, trial: optuna.Trial) -> Any:
    return d.choices[0] if len(d.choices) == 1 else d.suggest(trial)


def config_key(flat: Mapping[str, Any]) -> str:
    """Canonical text of a flat config: equal configs, equal keys (deduplication)."""
    return json.dumps(dict(sorted(flat.items())), sort_keys=True)


def _allowed(op: Op, variant: Variant, p: Param, rules: tuple[ParamRule, ...]) -> tuple:
    where = f"space.{op.backend}.{op.name}"
    choices = tuple(p.choices)
    for r in rules:
        if r.name != p.name or r.variant not in (None, variant.name):
            continue
        if r.choices is not None:
            bad = [c for c in r.choices if c not in p.choices or type(c) is not type(p.default)]
            if bad:
                raise ExperimentError(
                    f"{where}.{p.name}: {bad} not allowed for variant {variant.name!r}; "
                    f"allowed: {list(p.choices)}"
                )
            choices = tuple(c for c in p.choices if c in r.choices)
        if r.min is not None or r.max is not None:
            if not p.is_numeric:
                raise ExperimentError(
                    f"{where}.{p.name}: min/max need numeric choices; allowed: {list(p.choices)}"
                )
            lo = r.min if r.min is not None else min(p.choices)
            hi = r.max if r.max is not None else max(p.choices)
            choices = tuple(c for c in choices if lo <= c <= hi)
            if not choices:
                raise ExperimentError(
                    f"{where}.{p.name}: no registry choice in [{lo}, {hi}]; "
                    f"allowed: {list(p.choices)}"
                )
    return choices


def _op_space(op: Op, rule: OpRule, ordinal: bool) -> OpSpace:
    names = [v.name for v in op.variants]
    chosen = names if rule.variants is None else list(rule.variants)
    for v in chosen:
        if v not in names:
            raise ExperimentError(
                f"space.{op.backend}.{op.name}.variants: {v!r} is not a variant; allowed: {names}"
            )
    for r in rule.params:
        owners = [v for v in op.variants if v.name in chosen and r.variant in (None, v.name)]
        if r.variant is not None and r.variant not in names:
            raise ExperimentError(
                f"space.{op.backend}.{op.name}.{r.variant}.{r.name}: no variant {r.variant!r}; "
                f"allowed: {names}"
            )
        if not any(r.name in [p.name for p in v.params] for v in owners):
            known = sorted({p.name for v in op.variants if v.name in chosen for p in v.params})
            raise ExperimentError(
                f"space.{op.backend}.{op.name}.{r.name}: no searched variant has this knob; "
                f"knobs: {known or ['(none)']}"
            )
    params = []
    for v in op.variants:
        if v.name not in chosen:
            continue
        dims = tuple(
            Dim(
                f"{op.name}.{v.name}.{p.name}",
                f"{op.name}.{p.name}",
                _allowed(op, v, p, rule.params),
                ordinal=ordinal and p.is_numeric,
            )
            for p in v.params
        )
        params.append((v.name, dims))
    ordered = tuple(n for n in names if n in chosen)  # registry order: the default first
    return OpSpace(op.name, Dim(f"{op.name}.variant", f"{op.name}.variant", ordered), tuple(params))


def build_space(backend: str, space: BackendSpace, ordinal: bool = False) -> SearchSpace:
    """Resolve an experiment's space for one backend against the registry."""
    from engine.errors import ConfigError

    try:
        ops = {o.name: o for o in REGISTRY.ops(backend)}
    except ConfigError as e:
        raise ExperimentError(str(e)) from None
    if space.everything:
        rules = [OpRule(name) for name in sorted(ops)]
    else:
        rules = list(space.ops)
        for r in rules:
            if r.op not in ops:
                raise ExperimentError(
                    f"space.{backend}.{r.op}: backend {backend!r} has no such op; "
                    f"allowed: {sorted(ops)}"
                )
    out = [_op_space(ops[r.op], r, ordinal) for r in rules]
    # Ops with a single variant and no knobs are not a search dimension.
    out = [o for o in out if len(o.variant_dim.choices) > 1 or any(d for _, d in o.params)]
    return SearchSpace(backend, tuple(out))


def space_configs(space: SearchSpace, baseline: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every config of the space, in registry order (the baseline's other knobs kept)."""
    per_op = []
    for o in space.ops:
        options = []
        for v in o.variant_dim.choices:
            dims = o.dims_of(v)
            for values in product(*(d.choices for d in dims)):
                options.append(
                    {o.variant_dim.key: v, **{d.key: x for d, x in zip(dims, values, strict=True)}}
                )
        per_op.append(options)
    opened = {o.op for o in space.ops}
    rest = {k: v for k, v in baseline.items() if k.partition(".")[0] not in opened}
    for combo in product(*per_op):
        flat = dict(rest)
        for part in combo:
            flat.update(part)
        yield flat
