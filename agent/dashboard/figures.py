"""The data behind the study page's figures: the history plot (every ok trial, by verdict, and
the chained speedup step), the study as an in-memory Optuna study for Optuna's plotly
visualizations, and Optuna's parameter importances."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import optuna

from agent.dashboard.rows import FAILED, VERDICTS, StudyCache, TrialRow

if TYPE_CHECKING:
    from agent.dashboard.store import StudyStore

IMPORTANCE_MIN_TRIALS = 10  # below this, a caveat instead of a ranking of noise
IMPORTANCE_MAX_TRIALS = 2000  # importances from the most recent ok trials, so it answers in seconds


def history(reader: StudyStore, name: str) -> dict[str, Any]:
    """Target metric of every ok trial (accepted ones apart), and the chained paired speedup
    over the baseline after each acceptance, with its interval, for the history plot."""
    c = reader.study_cache(name)
    target = c.target
    xs: list[int] = []
    ys: list[float] = []
    acc_x: list[int] = []
    acc_y: list[float] = []
    for r in c.rows:
        if r is None or r.outcome != "ok" or target not in r.metrics:
            continue
        xs.append(r.number)
        ys.append(r.metrics[target])
        if r.accepted:
            acc_x.append(r.number)
            acc_y.append(r.metrics[target])
    best = (c.attrs.get("best") or {}).get("trial")
    if best is None:
        best = next((r.number for r in c.rows if r and r.role == "baseline"), None)
    chain = reader.chain(c, best)
    base = next((r.number for r in c.rows if r and r.role == "baseline"), 0)
    last = len(c.rows) - 1
    sx, sy, slo, shi = [base], [1.0], [1.0], [1.0]
    for link in chain["links"]:
        sx.append(link["trial"])
        sy.append(link["cumulative"])
        slo.append(link["cumulative_lower"])
        shi.append(link["cumulative_upper"])
    if last > sx[-1]:  # the step holds until the latest trial
        sx.append(last)
        sy.append(sy[-1])
        slo.append(slo[-1])
        shi.append(shi[-1])
    return {
        "target": target,
        "numbers": xs,
        "values": ys,
        "accepted": {"numbers": acc_x, "values": acc_y},
        "objectives": objectives_of(c),
        "by_verdict": _by_verdict(c.rows, objectives_of(c)),
        "speedup": {
            "numbers": sx,
            "ratio": sy,
            "lower": slo,
            "upper": shi,
            "complete": chain["complete"],
            "note": chain["note"],
        },
    }


def objectives_of(c: StudyCache) -> list[str]:
    """Every objective of the study, the target first (as the experiment listed them)."""
    objs = [str(o) for o in c.attrs.get("objectives") or []]
    return objs or ([c.target] if c.target else [])


def optuna_study(reader: StudyStore, name: str) -> tuple[optuna.Study, list[str]]:
    """The study's ok trials as an in-memory Optuna study with every objective's value:
    what Optuna's plotly visualizations take (parallel coordinates, Pareto front)."""
    c = reader.study_cache(name)
    objs = objectives_of(c)
    ok = [
        r
        for r in c.rows
        if r is not None and r.outcome == "ok" and all(o in r.metrics for o in objs)
    ][-IMPORTANCE_MAX_TRIALS:]
    study = optuna.create_study(directions=["maximize"] * len(objs), study_name=name)
    study.add_trials(
        [
            optuna.trial.create_trial(
                params={k: v for k, v in r.params.items() if k in c.dists[r.number]},
                distributions={k: d for k, d in c.dists[r.number].items() if k in r.params},
                values=[r.metrics[o] for o in objs],
                user_attrs={"verdict": r.verdict},
            )
            for r in ok
        ]
    )
    return study, objs


def importances(reader: StudyStore, name: str) -> dict[str, Any]:
    """Optuna's parameter importances (its default evaluator) for the target metric over
    the most recent ok trials; ``error`` says why when Optuna cannot compute them."""
    c = reader.study_cache(name)
    target = c.target
    ok = [r for r in c.rows if r is not None and r.outcome == "ok" and target in r.metrics][
        -IMPORTANCE_MAX_TRIALS:
    ]
    key = (name, len(ok))
    with reader.lock:
        if key in reader.importances_cache:
            return reader.importances_cache[key]
    out: dict[str, Any] = {
        "target": target,
        "trials": len(ok),
        "importances": {},
        "error": "",
        "caveat": "",
    }
    if len(ok) < IMPORTANCE_MIN_TRIALS:  # a ranking of noise; Optuna raises below 2
        out["caveat"] = (
            f"only {len(ok)} ok trial(s) with {target}: parameter importances need about "
            f"{IMPORTANCE_MIN_TRIALS} or more to mean anything"
        )
        return out
    try:
        study = optuna.create_study(direction="maximize", study_name=f"importances:{name}")
        study.add_trials(
            [
                optuna.trial.create_trial(
                    params=dict(r.params),
                    distributions=dict(c.dists[r.number]),
                    value=r.metrics[target],
                )
                for r in ok
            ]
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "few trials per regime": shown as is
            imp = optuna.importance.get_param_importances(study)
        out["importances"] = {k: float(v) for k, v in imp.items()}
        if not imp:
            out["error"] = "no parameter takes part in every ok trial, or none varies"
    except Exception as e:  # noqa: BLE001 - shown on the page as the reason
        out["error"] = f"{type(e).__name__}: {e}"
    with reader.lock:
        reader.importances_cache[key] = out
    return out


HISTORY_GROUPS = ("baseline", "accepted", "rejected", "failed")  # the history plot's colours


def _by_verdict(rows: list[TrialRow | None], objectives: list[str]) -> dict[str, dict[str, Any]]:
    """The history plot's points by verdict: ok trials (baseline, accepted, rejected) with each
    objective's median, and trials that broke (compile error, crash, timeout, invalid) with
    their reason, drawn apart so a rejected trial never looks like a win."""
    out = {
        g: {"numbers": [], "values": {o: [] for o in objectives}, "reasons": []}
        for g in HISTORY_GROUPS
    }
    for r in rows:
        if r is None:
            continue
        group = (
            r.verdict
            if r.verdict in VERDICTS
            else "failed"
            if r.outcome in (*FAILED, "invalid")
            else ""
        )
        if not group:
            continue
        g = out[group]
        g["numbers"].append(r.number)
        for o in objectives:
            g["values"][o].append(r.metrics.get(o))
        g["reasons"].append(r.reason or r.outcome)
    return out
