"""Plotly figures as plain dicts (``{"data": [...], "layout": {...}}``), rendered in the browser by
the plotly.js the installed plotly package ships. Plain dicts, not ``plotly.graph_objects``: a
10,000-point history is built in milliseconds and serialized once."""

from __future__ import annotations

from typing import Any

LAYOUT: dict[str, Any] = {
    "margin": {"l": 60, "r": 20, "t": 60, "b": 50},
    "height": 360,
    "legend": {"orientation": "h", "y": -0.2},
    "template": None,
    "paper_bgcolor": "white",
    "plot_bgcolor": "#fafafa",
}


def history(h: dict[str, Any]) -> dict[str, Any]:
    """Two panels over the trial number: the target metric of each ok trial (accepted ones
    starred), and the chained paired speedup over the baseline with its interval band."""
    target = h["target"] or "target"
    sp = h["speedup"]
    step = {"shape": "hv", "color": "#1a7f37"}
    return {
        "data": [
            {
                "type": "scatter",
                "mode": "markers",
                "name": "ok trials (median)",
                "x": h["numbers"],
                "y": h["values"],
                "marker": {"size": 5, "color": "#8aa4c8"},
            },
            {
                "type": "scatter",
                "mode": "markers",
                "name": "accepted",
                "x": h["accepted"]["numbers"],
                "y": h["accepted"]["values"],
                "marker": {"size": 11, "color": "#1a7f37", "symbol": "star"},
            },
            {
                "type": "scatter",
                "mode": "lines",
                "name": "interval",
                "x": sp["numbers"],
                "y": sp["upper"],
                "line": {**step, "width": 0},
                "showlegend": False,
                "hoverinfo": "skip",
                "xaxis": "x2",
                "yaxis": "y2",
            },
            {
                "type": "scatter",
                "mode": "lines",
                "name": "speedup interval",
                "x": sp["numbers"],
                "y": sp["lower"],
                "line": {**step, "width": 0},
                "fill": "tonexty",
                "fillcolor": "rgba(26,127,55,0.15)",
                "xaxis": "x2",
                "yaxis": "y2",
            },
            {
                "type": "scatter",
                "mode": "lines+markers",
                "name": "speedup vs baseline (chained paired)",
                "x": sp["numbers"],
                "y": sp["ratio"],
                "line": step,
                "marker": {"size": 6},
                "xaxis": "x2",
                "yaxis": "y2",
            },
        ],
        "layout": {
            **LAYOUT,
            "height": 480,
            "uirevision": "keep",  # live updates keep the user's zoom
            "title": {"text": f"optimization history: {target}", "x": 0.01, "xanchor": "left"},
            "xaxis": {"anchor": "y", "domain": [0, 1], "matches": "x2", "showticklabels": False},
            "yaxis": {"domain": [0.5, 1], "title": {"text": target}},
            "xaxis2": {"anchor": "y2", "domain": [0, 1], "title": {"text": "trial"}},
            "yaxis2": {"domain": [0, 0.4], "title": {"text": "× baseline"}},
        },
    }


def importances(imp: dict[str, float], target: str) -> dict[str, Any]:
    names = list(imp)[::-1]  # most important at the top
    return {
        "data": [
            {
                "type": "bar",
                "orientation": "h",
                "x": [imp[n] for n in names],
                "y": names,
                "marker": {"color": "#4c72b0"},
            }
        ],
        "layout": {
            **LAYOUT,
            "height": max(200, 60 + 28 * len(names)),
            "margin": {**LAYOUT["margin"], "l": 260},
            "title": {"text": f"parameter importances: {target}", "x": 0.01, "xanchor": "left"},
            "xaxis": {"title": {"text": "importance"}},
        },
    }


def samples(samples: dict[str, dict[str, list[float]]]) -> dict[str, Any]:
    """Paired samples of one trial: candidate and best per pair, one subplot row per objective."""
    data: list[dict[str, Any]] = []
    title = {"text": "paired samples (candidate vs best)", "x": 0.01, "xanchor": "left"}
    layout: dict[str, Any] = {**LAYOUT, "title": title}
    names = sorted(samples)
    n = max(1, len(names))
    gap = 0.12
    height = (1.0 - gap * (n - 1)) / n
    for i, obj in enumerate(names):
        axis = "" if i == 0 else str(i + 1)
        top = 1.0 - i * (height + gap)
        layout[f"xaxis{axis}"] = {
            "domain": [0, 1],
            "anchor": f"y{axis}",
            "title": {"text": "pair"},
            "dtick": 1,
        }
        layout[f"yaxis{axis}"] = {
            "domain": [max(0.0, top - height), top],
            "anchor": f"x{axis}",
            "title": {"text": obj},
        }
        for side, color in (("candidate", "#d62728"), ("best", "#4c72b0")):
            ys = samples[obj].get(side) or []
            data.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": f"{side} ({obj})",
                    "x": list(range(len(ys))),
                    "y": ys,
                    "xaxis": f"x{axis}",
                    "yaxis": f"y{axis}",
                    "line": {"color": color},
                }
            )
    layout["height"] = 120 + 220 * n
    return {"data": data, "layout": layout}


BLUE, PALE = "#4c72b0", "#8aa4c8"


def throughput(workers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Trials per GPU-hour of each worker: this agent run (the status file) beside every run
    recorded in the storage (agent.throughput); None when no worker evaluated a trial."""
    names = [str(w.get("worker_id", "")) for w in workers]
    run = [float((w.get("throughput") or {}).get("trials_per_hour") or 0.0) for w in workers]
    every = [float((w.get("throughput_all") or {}).get("trials_per_hour") or 0.0) for w in workers]
    if not any(run) and not any(every):
        return None
    title = {"text": "trials per GPU-hour", "x": 0.01, "xanchor": "left"}
    return {
        "data": [
            {
                "type": "bar",
                "name": "this run",
                "x": names,
                "y": run,
                "marker": {"color": "#4c72b0"},
            },
            {
                "type": "bar",
                "name": "all runs",
                "x": names,
                "y": every,
                "marker": {"color": "#8aa4c8"},
            },
        ],
        "layout": {
            **LAYOUT,
            "height": 300,
            "title": title,
            "barmode": "group",
            "yaxis": {"title": {"text": "trials / h"}, "rangemode": "tozero"},
        },
    }
