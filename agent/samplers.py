"""Optuna samplers by experiment name: coordinate (default), tpe, grid, random, cmaes, nsga2."""

from __future__ import annotations

import inspect
import warnings

import optuna

from agent.experiment import Experiment
from agent.space import SearchSpace


def make_sampler(exp: Experiment, space: SearchSpace) -> optuna.samplers.BaseSampler:
    s = exp.sampler
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    # Failed trials carry a violated constraint (agent/study.py) that only TPE reads.
    warnings.filterwarnings("ignore", message="Constraints have been set, but")
    if s.name == "tpe":
        # constant_liar: trials in flight (one per worker) count as bad guesses, so parallel
        # workers do not all get the same suggestion; group: the space is conditional on variants.
        return optuna.samplers.TPESampler(
            seed=s.seed,
            n_startup_trials=s.startup_trials,
            constant_liar=True,
            multivariate=True,
            group=True,
            **_prior_weight(),
        )
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.name == "grid":
        return _AskTellGrid(space.grid(), seed=s.seed)
    if s.name == "coordinate":
        from agent.coordinate import CoordinateSampler

        names = [o.name for o in exp.objectives]
        target = names.index(exp.acceptance.target) if exp.acceptance.target in names else 0
        return CoordinateSampler(space, target=target, seed=s.seed)
    if s.name == "nsga2":
        pop = max(4, min(50, exp.budget.trials // 3))
        return optuna.samplers.NSGAIISampler(seed=s.seed, population_size=pop)
    if s.name == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError:
            from agent.experiment import ExperimentError

            raise ExperimentError(
                "sampler.name = 'cmaes' needs the 'cmaes' package: pip install cmaes"
            ) from None
        # CMA-ES reads no constraints, and consider_pruned_trials (a penalty value for failed
        # trials) trips an assertion in Optuna 5 on a space conditional on the variant: failed
        # configs teach it nothing. The replay measures what that costs (docs/agent.md).
        return optuna.samplers.CmaEsSampler(
            seed=s.seed, n_startup_trials=s.startup_trials, warn_independent_sampling=False
        )
    raise AssertionError(s.name)


# The weight of TPE's uniform prior over each parameter's choices, against the trials (Optuna's
# default 1.0): our spaces are all categorical with 2-5 choices, where the prior flattens the
# good-trials density; 0.25 cut the replay's trials-to-best by 10-30% (docs/BENCHMARKS.md
# "Search efficiency"; 0.1-0.5 all helped). Optuna 4.9 deprecated the argument (removal in 6.0):
# while the installed Optuna takes it, it is passed; after, TPE falls back to the default.
PRIOR_WEIGHT = 0.25


def _prior_weight() -> dict[str, float]:
    if "prior_weight" not in inspect.signature(optuna.samplers.TPESampler).parameters:
        return {}
    warnings.filterwarnings("ignore", message="`prior_weight` has been deprecated")
    return {"prior_weight": PRIOR_WEIGHT}


class _AskTellGrid(optuna.samplers.GridSampler):
    """GridSampler for ask/tell: it calls ``study.stop()`` when the grid is used up, which only
    works inside ``study.optimize``; the agent notices an exhausted space by itself."""

    def after_trial(self, study, trial, state, values) -> None:  # noqa: ANN001
        return None
