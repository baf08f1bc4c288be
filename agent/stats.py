"""Paired statistics for acceptance: the ratio candidate/best and its bootstrap confidence bounds.

Each pair i gives a ratio r_i = candidate_i / best_i measured back to back on the same device.
The estimate is the geometric mean of the r_i. Its bounds are the most cautious of three, all from
scipy.stats: a Student-t interval on the mean log ratio (right for few pairs when log ratios are
roughly normal), a percentile bootstrap over pairs (no normality assumed, but over-confident
for few pairs: with 5 pairs it alone accepts a no-op candidate a few times in a hundred), and the
sign test's order-statistic interval for the median ratio (distribution-free: a lower bound of
the k-th smallest r_i, the smallest for 7 pairs or fewer). The third is there for contended
devices, where runs are slowed in bursts: CI's 2-core machine accepted an A/A run of 5 pairs at
x1.36 (t/bootstrap lower bound 1.05); its reproduction beside CPU hogs read
r = [1.48, 1.83, 1.48, 1.01, 1.03], x1.33 with a lower bound of 1.04, whose smallest pair says no.
A/A noise is the same computation with the best config on both sides: how far from 1 the ratio
lands when nothing changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class RatioEstimate:
    ratio: float  # geometric mean of candidate/best over the pairs
    lower: float  # lower confidence bound
    upper: float  # upper confidence bound
    pairs: int
    confidence: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _log_ratios(candidate: Sequence[float], best: Sequence[float]) -> np.ndarray:
    """Per-pair log(candidate_i / best_i), float64; ValueError unless the pairs line up."""
    c = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(best, dtype=np.float64)
    if c.shape != b.shape or c.size == 0:
        raise ValueError(f"paired samples must have the same non-zero length: {c.size}, {b.size}")
    return np.log(np.maximum(c, 1e-300)) - np.log(np.maximum(b, 1e-300))


def paired_ratio(
    candidate: Sequence[float],
    best: Sequence[float],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> RatioEstimate:
    """Geometric-mean ratio candidate/best with one-sided ``confidence`` bounds (lower bound at
    1 - confidence, upper at confidence): the widest of a seeded percentile bootstrap over pairs
    (scipy.stats.bootstrap), the Student-t interval and the sign test's interval (order_bounds)."""
    from scipy import stats  # ~1 s to import: only where an estimate is made

    logs = _log_ratios(candidate, best)  # [n]
    n = logs.size
    mean = float(logs.mean())
    lo = hi = mean
    if n > 1:
        # Two-sided at 2c - 1: its ends are the one-sided quantiles 1 - c and c.
        boot = stats.bootstrap(
            (logs,),
            np.mean,
            confidence_level=2 * confidence - 1,
            n_resamples=resamples,
            method="percentile",
            rng=np.random.default_rng(seed),
        ).confidence_interval
        half = stats.t.ppf(confidence, n - 1) * float(logs.std(ddof=1)) / np.sqrt(n)
        o_lo, o_hi = order_bounds(logs, confidence)
        lo, hi = min(boot.low, mean - half, o_lo), max(boot.high, mean + half, o_hi)
    return RatioEstimate(float(np.exp(mean)), float(np.exp(lo)), float(np.exp(hi)), n, confidence)


def order_bounds(values: np.ndarray, confidence: float) -> tuple[float, float]:
    """The sign test's one-sided bounds on the median of ``values``: the k-th smallest and k-th
    largest, k the largest order with P(Binomial(n, 1/2) < k) <= 1 - confidence (at 95%: k = 1
    up to 7 values, 2 at 8-10, 3 at 11-12, 5 at 16), so that the median lies below the k-th
    smallest with at most that chance, whatever the distribution. Below 5 values no order
    reaches 95%; k is then 1, the extremes, which asks every pair to agree."""
    from scipy import stats

    n = values.size
    k = 1
    while k < n and stats.binom.cdf(k, n, 0.5) <= 1.0 - confidence:
        k += 1
    ordered = np.sort(values)
    return float(ordered[k - 1]), float(ordered[n - k])


def aa_noise(candidate: Sequence[float], best: Sequence[float]) -> float:
    """A worker's A/A bias from an A/A run (the best config on both sides): how far the median
    per-pair ratio lands from 1 (a fraction, e.g. 0.01 = 1%). Pair-to-pair scatter is already in
    each candidate's own bounds; what the A/A run adds is what pairing does not cancel (order, a
    drifting clock), which shows in every pair. The median, not the mean: one cold pair (a GPU
    still ramping its clocks on the worker's first run) measured x0.3 on an H200 and, averaged
    into 5 pairs, set a 29% threshold that turned down a real x1.27 (docs/BENCHMARKS.md)."""
    logs = _log_ratios(candidate, best)
    return abs(float(np.exp(np.median(logs))) - 1.0)
