"""Coordinate descent as an Optuna sampler (``sampler.name = "coordinate"``).

From the best completed trial (the baseline until a candidate beats it), vary one dimension of the
search space at a time through its choices, every other dimension at the incumbent's value; as soon
as a trial beats the incumbent it becomes the centre, and the walk goes on from the dimension that
moved it (cyclic coordinate descent: a knob's sweep is finished before the next knob, then the next
ones, wrapping around). What the hand sweeps of scripts/device_speed.py (git history) did, as a
sampler: every trial is the agent's, with its validation, pairing and record.

A dimension is an op's variant or a knob of the variant the incumbent runs; a variant switch
brings the new variant's knobs at their registry defaults (the space's first choice where the
experiment leaves the default out). Failed and infeasible trials (told PRUNED with a violated
constraint, agent/study.py) are tried, never a centre. When every neighbour of the incumbent
is tried (a local optimum), the walk continues around the next-best trials; when no completed
trial has an untried neighbour, it draws at random, and the agent calls a finite space exhausted
once its draws are all repeats.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import FrozenTrial, TrialState

from agent.space import SearchSpace

MOVED = "coordinate:dim"  # trial system attr: the dimension whose change made this trial
_INTERRUPTED = "interrupted"  # agent.records.Outcome.INTERRUPTED: its config may run again


class CoordinateSampler(optuna.samplers.BaseSampler):
    """Cyclic coordinate descent over ``space``'s dimensions, ranking completed trials by
    objective ``target`` (an index into the study's values; every direction is maximize)."""

    def __init__(self, space: SearchSpace, target: int = 0, seed: int | None = None) -> None:
        self._space = space
        self._target = target
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._plans: dict[int, dict[str, Any]] = {}  # trial id -> the params it will get

    def reseed_rng(self) -> None:
        self._random.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        plan = self._plans.get(trial._trial_id)
        if plan is None:
            plan = self._plans[trial._trial_id] = self._plan(study, trial)
        if param_name in plan:
            return plan[param_name]
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        self._plans.pop(trial._trial_id, None)

    # --- the walk -------------------------------------------------------------------------
    def _plan(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, Any]:
        """The first untried one-dimension neighbour of the best trial that has one; {} (a
        random draw) when none has."""
        trials = study.get_trials(deepcopy=False)
        tried = {
            _key(t.params)
            for t in trials
            if t.number != trial.number
            and t.state is not TrialState.WAITING
            and t.user_attrs.get("outcome") != _INTERRUPTED
        }
        for centre, last in self._centres(trials):
            for moved, params in self.neighbours(centre, last):
                if _key(params) not in tried:
                    study._storage.set_trial_system_attr(trial._trial_id, MOVED, moved)
                    return params
        return {}

    def _centres(self, trials: list[FrozenTrial]) -> list[tuple[dict[str, Any], str | None]]:
        """(params, the dimension that made them) of the completed trials, best first (ties:
        the earlier); before any completes, the first trial's (the agent's baseline) if it has
        params, else the space's origin."""
        done = [t for t in trials if t.state is TrialState.COMPLETE and t.values]
        done.sort(key=lambda t: (-t.values[self._target], t.number))
        if not done:
            done = [t for t in trials if t.params][:1]
        if not done:
            return [(self.origin(), None)]
        return [(t.params, t.system_attrs.get(MOVED)) for t in done]

    def origin(self) -> dict[str, Any]:
        """Each op's first variant (the registry default where the space opens it) with its
        knobs at their defaults: where the walk starts when the baseline is outside the space."""
        params: dict[str, Any] = {}
        for o in self._space.ops:
            params |= self._variant_params(o.op, o.variant_dim.choices[0])
        return params

    def neighbours(
        self, centre: dict[str, Any], moved: str | None = None
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """(dimension, params) for each config one dimension away from ``centre``, dimension by
        dimension (from ``moved``, the one that made the centre, wrapping around), each
        dimension's choices in the space's order."""
        dims = list(self._dims(centre))
        names = [name for name, _ in dims]
        start = names.index(moved) if moved in names else 0
        for name, choices in dims[start:] + dims[:start]:
            for c in choices:
                if c == centre.get(name):
                    continue
                yield name, self._with(centre, name, c)

    def _dims(self, centre: dict[str, Any]) -> Iterator[tuple[str, tuple[Any, ...]]]:
        for o in self._space.ops:
            vd = o.variant_dim
            if len(vd.choices) > 1:
                yield vd.name, vd.choices
            for d in o.dims_of(self._variant_of(o.op, centre)):
                if len(d.choices) > 1:
                    yield d.name, tuple(d.encode(c) for c in d.choices)

    def _with(self, centre: dict[str, Any], name: str, value: Any) -> dict[str, Any]:
        out = dict(centre)
        for o in self._space.ops:
            if name == o.variant_dim.name:  # the old variant's knobs out, the new one's in
                for d in o.dims_of(self._variant_of(o.op, centre)):
                    out.pop(d.name, None)
                out |= self._variant_params(o.op, value)
        out[name] = value
        return out

    def _variant_of(self, op: str, params: dict[str, Any]) -> str:
        for o in self._space.ops:
            if o.op == op:
                return str(params.get(o.variant_dim.name, o.variant_dim.choices[0]))
        raise KeyError(op)

    def _variant_params(self, op: str, variant: str) -> dict[str, Any]:
        """The suggested params of ``variant``: its variant dim (when suggested) and its knobs
        at their registry defaults, or the space's first choice."""
        from engine.errors import ConfigError
        from engine.tuning import REGISTRY

        out: dict[str, Any] = {}
        for o in self._space.ops:
            if o.op != op:
                continue
            if len(o.variant_dim.choices) > 1:
                out[o.variant_dim.name] = variant
            try:
                params = REGISTRY.op(self._space.backend, op).variant(variant).params
            except ConfigError:  # a backend unregistered since: the first choices
                params = ()
            defaults = {p.name: p.default for p in params}
            for d in o.dims_of(variant):
                if len(d.choices) > 1:
                    knob = d.key.partition(".")[2]
                    value = defaults.get(knob, d.choices[0])
                    out[d.name] = d.encode(value if value in d.choices else d.choices[0])
        return out


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)
