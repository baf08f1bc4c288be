"""Paired statistics for acceptance: the ratio candidate/best and its bootstrap confidence bounds.

Each pair i gives a ratio r_i = candidate_i / best_i measured back to back on the same device.
The estimate is the geometric mean of the r_i. Its bounds are the more cautious of two: a
Student-t interval on the mean log ratio (right for few pairs when log ratios are roughly normal)
and a percentile bootstrap over pairs (no normality assumed, but over-confident for few pairs:
with 5 pairs it alone accepts a no-op candidate a few times in a hundred). A/A noise is the same
computation with the best config on both sides: how far from 1 the ratio lands when nothing
changed.
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


def paired_ratio(
    candidate: Sequence[float],
    best: Sequence[float],
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> RatioEstimate:
    """Geometric-mean ratio candidate/best with one-sided ``confidence`` bounds (lower bound at
    1 - confidence, upper at confidence) from a seeded percentile bootstrap over pairs."""
    c = np.asarray(candidate, dtype=np.float64)
    b = np.asarray(best, dtype=np.float64)
    if c.shape != b.shape or c.size == 0:
        raise ValueError(f"paired samples must have the same non-zero length: {c.size}, {b.size}")
    logs = np.log(np.maximum(c, 1e-300)) - np.log(np.maximum(b, 1e-300))  # [n]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, logs.size, size=(resamples, logs.size))  # [R, n]
    means = logs[idx].mean(axis=1)  # [R]
    lo, hi = np.quantile(means, [1.0 - confidence, confidence])
    n = logs.size
    if n > 1:
        half = t_quantile(confidence, n - 1) * float(logs.std(ddof=1)) / np.sqrt(n)
        lo, hi = min(lo, logs.mean() - half), max(hi, logs.mean() + half)
    return RatioEstimate(
        float(np.exp(logs.mean())), float(np.exp(lo)), float(np.exp(hi)), int(n), confidence
    )


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile (Abramowitz & Stegun 26.7.5 expansion around the normal quantile;
    within 1% of the exact value for df >= 3, and conservative below)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(p)
    if df <= 2:  # exact for df 1 and 2
        q = 2 * p - 1 if p >= 0.5 else 1 - 2 * p
        t = np.tan(np.pi * q / 2) if df == 1 else q * np.sqrt(2 / (1 - q * q))
        return float(t if p >= 0.5 else -t)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    g4 = (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160
    return float(z + g1 / df + g2 / df**2 + g3 / df**3 + g4 / df**4)


def aa_noise(estimate: RatioEstimate) -> float:
    """A worker's A/A bias: how far the ratio of the best against itself lands from 1 (a
    fraction, e.g. 0.01 = 1%). Pair-to-pair scatter is already in each candidate's own bounds;
    what the A/A run adds is what pairing does not cancel (order, warm-up, a drifting clock)."""
    return abs(estimate.ratio - 1.0)
