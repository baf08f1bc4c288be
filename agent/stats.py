"""Paired statistics for acceptance: the ratio candidate/best and its bootstrap confidence bounds.

Each pair i gives a ratio r_i = candidate_i / best_i measured back to back on the same device.
The estimate is the geometric mean of the r_i. Its bounds are the more cautious of two, both from
scipy.stats: a Student-t interval on the mean log ratio (right for few pairs when log ratios are
roughly normal) and a percentile bootstrap over pairs (no normality assumed, but over-confident
for few pairs: with 5 pairs it alone accepts a no-op candidate a few times in a hundred). A/A
noise is the same computation with the best config on both sides: how far from 1 the ratio lands
when nothing changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RatioEstimate:
    ratio: float  # geometric mean of candidate/best over the pairs
    lower: float  # lower confidence bound
    upper: float  # upper confidence bound
    pairs: int
    confidence: float

    def to_dict(self) -> dict[str, float]:
        return {
            "ratio": self.ratio,
            "lower": self.lower,
            "upper": self.upper,
            "pairs": self.pairs,
            "confidence": self.confidence,
        }


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
    1 - confidence, upper at confidence) from a seeded percentile bootstrap over pairs
    (scipy.stats.bootstrap), widened to the Student-t interval where that is wider."""
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
        lo, hi = min(boot.low, mean - half), max(boot.high, mean + half)
    return RatioEstimate(float(np.exp(mean)), float(np.exp(lo)), float(np.exp(hi)), n, confidence)


def aa_noise(candidate: Sequence[float], best: Sequence[float]) -> float:
    """A worker's A/A bias from an A/A run (the best config on both sides): how far the median
    per-pair ratio lands from 1 (a fraction, e.g. 0.01 = 1%). Pair-to-pair scatter is already in
    each candidate's own bounds; what the A/A run adds is what pairing does not cancel (order, a
    drifting clock), which shows in every pair. The median, not the mean: one cold pair (a GPU
    still ramping its clocks on the worker's first run) measured x0.3 on an H200 and, averaged
    into 5 pairs, set a 29% threshold that turned down a real x1.27 (docs/BENCHMARKS.md)."""
    logs = _log_ratios(candidate, best)
    return abs(float(np.exp(np.median(logs))) - 1.0)
