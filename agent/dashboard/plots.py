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


# One colour per verdict, the same as the trials table's pills (dashboard.css).
VERDICT_STYLE: dict[str, dict[str, Any]] = {
    "baseline": {"color": "#1c5fa8", "symbol": "diamond", "size": 10},
    "accepted": {"color": "#1a7f37", "symbol": "star", "size": 12},
    "rejected": {"color": "#9e9e9e", "symbol": "circle", "size": 6},
    "failed": {"color": "#d33", "symbol": "x", "size": 8},
}


def history(h: dict[str, Any]) -> dict[str, Any]:
    """One panel per objective over the trial number, each trial coloured by its verdict
    (baseline, accepted, rejected; trials that broke drawn as crosses at the panel's foot with
    their reason), and below them the chained paired speedup over the baseline with its
    interval band."""
    target = h["target"] or "target"
    objectives = list(h.get("objectives") or [target])
    groups = h.get("by_verdict") or {}
    sp = h["speedup"]
    step = {"shape": "hv", "color": "#1a7f37"}
    n = len(objectives)
    gap = 0.06
    band = (1.0 - 0.3 - gap * n) / n  # the speedup panel takes the bottom 0.3
    data: list[dict[str, Any]] = []
    layout: dict[str, Any] = {
        **LAYOUT,
        "height": 300 + 200 * n,
        "uirevision": "keep",  # live updates keep the user's zoom
        "title": {"text": f"optimization history: {', '.join(objectives)}", "x": 0.01},
    }
    for i, obj in enumerate(objectives):
        axis = "" if i == 0 else str(i + 1)
        top = 1.0 - i * (band + gap)
        layout[f"xaxis{axis}"] = {
            "anchor": f"y{axis}",
            "domain": [0, 1],
            "matches": f"x{n + 1}",
            "showticklabels": False,
        }
        layout[f"yaxis{axis}"] = {"domain": [top - band, top], "title": {"text": obj}}
        ok_values = [
            v for g in ("baseline", "accepted", "rejected") for v in _values(groups, g, obj) if v
        ]
        floor = min(ok_values) * 0.97 if ok_values else 0.0
        for verdict, style in VERDICT_STYLE.items():
            g = groups.get(verdict) or {}
            ys = (
                [floor] * len(g.get("numbers", []))
                if verdict == "failed"
                else _values(groups, verdict, obj)
            )
            data.append(
                {
                    "type": "scatter",
                    "mode": "markers",
                    "name": verdict,
                    "legendgroup": verdict,
                    "showlegend": i == 0,
                    "x": g.get("numbers", []),
                    "y": ys,
                    "text": g.get("reasons", []),
                    "hovertemplate": "#%{x}: %{y}<br>%{text}<extra>" + verdict + "</extra>",
                    "marker": style,
                    "xaxis": f"x{axis}",
                    "yaxis": f"y{axis}",
                }
            )
    sx, sy = f"x{n + 1}", f"y{n + 1}"
    layout[f"xaxis{n + 1}"] = {"anchor": sy, "domain": [0, 1], "title": {"text": "trial"}}
    layout[f"yaxis{n + 1}"] = {"domain": [0, 0.24], "title": {"text": "× baseline"}}
    data += [
        {
            "type": "scatter",
            "mode": "lines",
            "name": "interval",
            "x": sp["numbers"],
            "y": sp["upper"],
            "line": {**step, "width": 0},
            "showlegend": False,
            "hoverinfo": "skip",
            "xaxis": sx,
            "yaxis": sy,
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
            "xaxis": sx,
            "yaxis": sy,
        },
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": "speedup vs baseline (chained paired)",
            "x": sp["numbers"],
            "y": sp["ratio"],
            "line": step,
            "marker": {"size": 6},
            "xaxis": sx,
            "yaxis": sy,
        },
    ]
    return {"data": data, "layout": layout}


def _values(groups: dict[str, Any], verdict: str, obj: str) -> list[Any]:
    return list(((groups.get(verdict) or {}).get("values") or {}).get(obj) or [])


def optuna_figure(fig: Any) -> dict[str, Any]:
    """An Optuna visualization (a plotly Figure) as the plain dict the page draws."""
    import json

    out = json.loads(fig.to_json())
    layout = {**out.get("layout", {}), "template": None, "paper_bgcolor": "white"}
    out["layout"] = {**layout, "height": 460, "margin": {"l": 70, "r": 30, "t": 60, "b": 110}}
    return out


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
