"""One number for a win, said the same way everywhere: a promoted best has two speedups, and
every place that shows one names it and shows the other.

- **vs previous best**: the trial's own paired ratio against the best it was measured with
  (trial ``paired_against``): what acceptance decided on. Its lower bound is what cleared the
  threshold.
- **vs baseline**: the product of the paired ratios along the chain baseline -> each accepted
  best -> this one, with an interval (each link's [lower, upper] read as a normal interval on the
  log ratio, the links' variances added: independent measurements).

    x1.20 [1.05] vs previous best (trial 2); x1.64 [1.26, 2.14] vs baseline

The summary, the commit message, the evidence, /promotions and the study pages use ``win_line``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from agent.records import TrialRecord

DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Link:
    trial: int
    against: int | None
    ratio: float
    lower: float
    upper: float


def z_of(confidence: float) -> float:
    return NormalDist().inv_cdf(min(max(confidence, 0.5 + 1e-9), 1 - 1e-9))


def cumulative(links: Sequence[Link], confidence: float) -> list[tuple[float, float, float]]:
    """(ratio, lower, upper) vs the baseline after each link (links baseline first)."""
    z = z_of(confidence)
    log_sum = var = 0.0
    out = []
    for link in links:
        log_sum += math.log(link.ratio)
        se = (math.log(link.upper) - math.log(link.lower)) / (2 * z)
        var += se * se
        half = z * math.sqrt(var)
        out.append((math.exp(log_sum), math.exp(log_sum - half), math.exp(log_sum + half)))
    return out


def chain_to_baseline(
    record: Callable[[int], TrialRecord | None], best: int, target: str
) -> dict[str, Any] | None:
    """The best's speedup over the baseline from the agent's trial records: {"ratio", "lower",
    "upper", "links" (the accepted trials, baseline first), "baseline" (its trial)}; None when
    the chain does not reach a baseline trial. A confirmation that re-paired the trial against a
    newer best is the link followed (as on the dashboard)."""
    links: list[Link] = []
    seen: set[int] = set()
    confidence = DEFAULT_CONFIDENCE
    n: int | None = best
    while True:
        rec = record(n) if n is not None and n not in seen else None
        if rec is None:
            return None
        seen.add(rec.trial)
        if rec.role == "baseline":
            break
        against, est = rec.paired_against, rec.estimates.get(target)
        conf = rec.confirmation
        if conf is not None and conf.paired_against not in (None, against):
            against, est = conf.paired_against, conf.estimates.get(target)
        if est is None or not (est.ratio and est.lower and est.upper):
            return None
        confidence = float(est.confidence or confidence)
        links.append(Link(rec.trial, against, est.ratio, est.lower, est.upper))
        n = against
    links.reverse()
    base = rec.trial
    if not links:
        return {"ratio": 1.0, "lower": 1.0, "upper": 1.0, "links": [], "baseline": base}
    ratio, lower, upper = cumulative(links, confidence)[-1]
    trials = [x.trial for x in links]
    return {"ratio": ratio, "lower": lower, "upper": upper, "links": trials, "baseline": base}


def step_text(ratio: float, lower: float, against: int | None, baseline: int | None = None) -> str:
    who = "previous best" if against is None else f"previous best (trial {against}"
    if against is not None:
        who += ", the baseline)" if against == baseline else ")"
    return f"x{ratio:.2f} [{lower:.2f}] vs {who}"


def total_text(total: dict[str, Any] | None) -> str:
    if not total:
        return "vs baseline: unknown (its chain of accepted trials is incomplete)"
    return f"x{total['ratio']:.2f} [{total['lower']:.2f}, {total['upper']:.2f}] vs baseline"


def win_line(
    ratio: float | None,
    lower: float | None,
    against: int | None,
    total: dict[str, Any] | None,
    baseline: int | None = None,
) -> str:
    """Both figures, named: "x1.20 [1.05] vs previous best (trial 2); x1.64 [1.26, 2.14] vs
    baseline" ("" when there is no measured step)."""
    if ratio is None or lower is None:
        return ""
    if baseline is None and total:
        baseline = total.get("baseline")
    return f"{step_text(ratio, lower, against, baseline)}; {total_text(total)}"


def evidence_line(evidence: dict[str, Any]) -> str:
    """``win_line`` from a promotion's evidence (its "vs_baseline" table, when recorded)."""
    against = evidence.get("paired_against")
    against = against if isinstance(against, int) and against >= 0 else None
    ratio, lower = evidence.get("ratio"), evidence.get("lower_bound")
    if not isinstance(ratio, int | float) or not isinstance(lower, int | float) or not ratio:
        return ""
    total = evidence.get("vs_baseline") or None
    return win_line(float(ratio), float(lower), against, total if total else None)
