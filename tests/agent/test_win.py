"""One number for a win (issue 30): the same promotion read x1.202 (lower bound 1.051) in the
summary, the commit and /promotions (trial 14 against trial 2) and x1.642 [1.260, 2.140] on the
study pages (against the baseline), with nothing saying which. Every place now shows both,
named, computed by one function (agent.win)."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import quote

import optuna
from fastapi.testclient import TestClient

from agent.dashboard import create_app
from agent.dashboard.synthetic import OBJECTIVES, write_study
from agent.promote import commit_subject
from agent.records import Outcome, TrialRecord
from agent.stats import RatioEstimate
from agent.storage import parse_storage
from agent.summary import Overhead, RunSummary, StudySummary
from agent.win import Link, chain_to_baseline, cumulative, win_line

TARGET = "prefill_tok_s@24"


def _rec(n: int, against: int | None, est: tuple[float, float, float] | None) -> TrialRecord:
    role = "baseline" if against is None else "candidate"
    estimates = {TARGET: RatioEstimate(*est, pairs=6, confidence=0.95)} if est else {}
    return TrialRecord("s", n, role, Outcome.OK, paired_against=against, estimates=estimates)


RECORDS = {
    0: _rec(0, None, None),
    2: _rec(2, 0, (1.366, 1.199, 1.556)),
    14: _rec(14, 2, (1.202, 1.051, 1.375)),
}


def test_both_figures_named_from_one_chain() -> None:
    total = chain_to_baseline(RECORDS.get, 14, TARGET)
    assert total is not None and total["links"] == [2, 14]
    expect = cumulative([Link(2, 0, 1.366, 1.199, 1.556), Link(14, 2, 1.202, 1.051, 1.375)], 0.95)
    assert (total["ratio"], total["lower"], total["upper"]) == expect[-1]
    line = win_line(1.202, 1.051, 2, total, baseline=0)
    r, lo, hi = expect[-1]
    assert line == (
        f"x1.20 [1.05] vs previous best (trial 2); x{r:.2f} [{lo:.2f}, {hi:.2f}] vs baseline"
    )
    assert abs(r - 1.366 * 1.202) < 1e-9
    # measured straight against the baseline: said so
    assert win_line(1.366, 1.199, 0, total, baseline=0).startswith(
        "x1.37 [1.20] vs previous best (trial 0, the baseline); "
    )
    # a chain that does not reach a baseline is not a number
    assert chain_to_baseline({14: RECORDS[14]}.get, 14, TARGET) is None
    assert "vs baseline: unknown" in win_line(1.202, 1.051, 2, None)


def test_the_summary_and_the_commit_name_both() -> None:
    total = chain_to_baseline(RECORDS.get, 14, TARGET)
    win = win_line(1.202, 1.051, 2, total, 0)
    s = StudySummary(
        "e/c/m", "c", "numpy", "m", "qwen2", 14, 20, {"ok": 14}, "default", 14, False,
        {"prefill.chunk_tokens": [8, 32]}, {}, TARGET, 1.202, 1.051, None,
        paired_against=2, vs_baseline=total, win=win,
    )  # fmt: skip
    run = RunSummary("e", "journal:///x", "x.json", "local", 1.0, (s,), (), Overhead(0, 0, 0))
    assert f"best: trial 14 (prefill.chunk_tokens: 8 -> 32); {TARGET} {win}" in run.text()
    evidence = {
        "study": "e/c/m",
        "trial": 14,
        "target": TARGET,
        "ratio": 1.202,
        "lower_bound": 1.051,
        "paired_against": 2,
        "vs_baseline": total,
    }
    assert (
        commit_subject("c/qwen2/k ctx64", evidence)
        == f"promote c/qwen2/k ctx64: {TARGET} {win}, e/c/m trial 14"
    )


def test_promotions_and_study_pages_show_the_same_two_figures(tmp_path: Path) -> None:
    ref = parse_storage(str(tmp_path / "s.journal"))
    name = write_study(ref.open(), "r9700", 30, seed=5, running=0)
    client = TestClient(create_app(ref.url, refresh_s=0.0))
    s = client.get(f"/api/studies/{quote(name)}").json()
    assert s["best_trial"] not in (None, s["baseline_trial"])
    study = optuna.load_study(study_name=name, storage=ref.open())

    def record(n: int) -> TrialRecord:
        return TrialRecord.from_attrs(name, n, study.trials[n].user_attrs)

    best = record(s["best_trial"])
    total = chain_to_baseline(record, best.trial, OBJECTIVES[0])
    assert total is not None
    est = best.estimates[OBJECTIVES[0]]
    win = win_line(est.ratio, est.lower, best.paired_against, total, s["baseline_trial"])
    assert s["win"] == win and re.search(r"vs previous best \(trial \d+.*\); x[\d.]+ \[", win)
    assert abs(s["speedup"] - total["ratio"]) < 1e-9  # the pages' speedup is the same chain
    assert win in client.get(f"/studies/{quote(name)}").text
    (p,) = client.get("/api/promotions").json()["promotions"]
    assert p["win"] == win
    assert win in client.get("/promotions").text
