"""The chained paired speedup of a study's best over its baseline: the product of the paired
ratios along baseline -> each accepted best -> the best, with an interval (agent.win chains)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agent.dashboard.rows import StudyCache, TrialRow
from agent.records import TrialRecord
from agent.win import Link, cumulative

# (the best a trial was measured against, the estimate against it): StudyStore.link
LinkOf = Callable[[StudyCache, TrialRow], tuple[int | None, dict[str, Any]]]
RecordOf = Callable[[StudyCache, int], TrialRecord]  # a finished trial's record: StudyStore.record


def chain_of(c: StudyCache, best: int | None, link: LinkOf, record: RecordOf) -> dict[str, Any]:
    """See ``StudyStore.chain``: links from ``best`` back to the baseline, then their product."""
    out: dict[str, Any] = {
        "ratio": 1.0,
        "lower": 1.0,
        "upper": 1.0,
        "links": [],
        "complete": False,
        "note": "",
    }
    rows = c.rows
    if best is None or not 0 <= best < len(rows) or rows[best] is None:
        out["note"] = "no baseline measured yet"
        return out
    confidence = 0.95
    links: list[dict[str, Any]] = []
    seen: set[int] = set()
    n: int | None = best
    while True:
        row = rows[n] if n is not None and 0 <= n < len(rows) else None
        if row is None or n in seen:
            out["note"] = f"the chain breaks at trial {n}: not in this study"
            break
        seen.add(n)
        if row.role == "baseline":
            out["complete"] = True
            break
        against, est = link(c, row)
        if not est.get("ratio") or not est.get("lower") or not est.get("upper"):
            out["note"] = f"trial {n} has no paired estimate on {c.target}"
            break
        own = record(c, n).estimates.get(c.target)
        confidence = float(own.confidence if own and own.confidence else confidence)
        links.append(
            {
                "trial": n,
                "against": against,
                "ratio": est["ratio"],
                "lower": est["lower"],
                "upper": est["upper"],
                "source": est.get("source", "trial"),
            }
        )
        n = against
    links.reverse()  # baseline first
    # the one chaining of paired ratios (agent.win): the summary and the evidence use it too
    typed = [Link(x["trial"], x["against"], x["ratio"], x["lower"], x["upper"]) for x in links]
    cum = cumulative(typed, confidence)
    for link, (r, lo, hi) in zip(links, cum, strict=True):
        link["cumulative"], link["cumulative_lower"], link["cumulative_upper"] = r, lo, hi
    if cum:
        out["ratio"], out["lower"], out["upper"] = cum[-1]
    out["links"] = links
    out["confidence"] = confidence
    return out
