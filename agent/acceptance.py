"""Acceptance: is a validated candidate really better than the current best on this device?

Accepted when the paired ratio's lower confidence bound on the target objective clears
``1 + max(min_gain, A/A noise of the worker)`` and no other objective regresses significantly
(its upper bound below ``1 - max(max_regression, its A/A noise)``). The worker's A/A noise is
measured when it starts (best against itself), so a noisy device needs a bigger win.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agent.experiment import Acceptance
from agent.records import Verdict
from agent.stats import RatioEstimate, paired_ratio
from worker.records import EvalResult


@dataclass(frozen=True)
class Decision:
    accepted: bool
    reason: str
    target: str
    threshold: float  # the target's lower bound had to exceed this
    noise: float  # the worker's A/A noise on the target
    estimates: tuple[tuple[str, RatioEstimate], ...]

    def estimate(self, objective: str) -> RatioEstimate:
        return dict(self.estimates)[objective]

    def verdict(self) -> Verdict:
        """What a trial record keeps of it (its estimates go to the record's ``estimates``)."""
        return Verdict(self.accepted, self.reason, self.target, self.threshold, self.noise)


def estimates_of(result: EvalResult, acc: Acceptance, seed: int = 0) -> dict[str, RatioEstimate]:
    return {
        s.objective: paired_ratio(s.candidate, s.best, acc.confidence, acc.resamples, seed)
        for s in result.samples
    }


def decide(
    result: EvalResult, acc: Acceptance, noise: Mapping[str, float], seed: int = 0
) -> Decision:
    """The acceptance decision for one OK result, given the worker's A/A noise per objective."""
    est = estimates_of(result, acc, seed)
    target = est[acc.target]
    target_noise = noise.get(acc.target, 0.0)
    threshold = 1.0 + max(acc.min_gain, target_noise)
    items = tuple(sorted(est.items()))
    if result.validate is not None and not result.validate.passed:
        return Decision(False, "validate failed", acc.target, threshold, target_noise, items)
    if target.lower <= threshold:
        why = (
            f"{acc.target} x{target.ratio:.3f}, lower bound {target.lower:.3f} <= "
            f"{threshold:.3f} (min gain {acc.min_gain:.3f}, A/A noise {target_noise:.3f})"
        )
        return Decision(False, why, acc.target, threshold, target_noise, items)
    for name, e in items:
        if name == acc.target:
            continue
        floor = 1.0 - max(acc.max_regression, noise.get(name, 0.0))
        if e.upper < floor:
            why = f"{name} regresses: x{e.ratio:.3f}, upper bound {e.upper:.3f} < {floor:.3f}"
            return Decision(False, why, acc.target, threshold, target_noise, items)
    why = f"{acc.target} x{target.ratio:.3f}, lower bound {target.lower:.3f} > {threshold:.3f}"
    return Decision(True, why, acc.target, threshold, target_noise, items)
