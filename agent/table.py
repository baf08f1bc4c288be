"""Tables of measured configs, the replay runner's input: one row per config with its target
metric and outcome, plus what the table was measured for (experiment file, backend, target).

    JSON: {"experiment": PATH, "backend": B, "target": "decode_tok_s@16", "device": ..., "source":
           ..., "rows": [{"config": {flat knobs}, "metric": 123.4 | null, "outcome": "ok"}]}
    CSV:  "# key: value" lines for the same header fields, then columns: one per flat knob,
          ``metric``, ``outcome`` (knob values are JSON: 8, true, "block").

Built from an Optuna storage of a finished study (``from_study``: the fleet's recorded GPU
trials, docs/replay/); such a table also carries the study's own search space (``space``: its
``space`` attr, the grid it searched) and baseline, so a replay searches what the study
searched even after the experiment file or the registry moved on. Tables are never measured
here: measuring is the agent's job (``agent run --local``), a table is read from its study.
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.experiment import ExperimentError
from agent.space import config_key

HEADER = ("experiment", "backend", "target", "device", "source", "date")
# JSON-valued header fields (CSV: one "# key: JSON" line each); empty when not recorded
JSON_HEADER = ("space", "baseline")


@dataclass(frozen=True)
class Row:
    config: dict[str, Any]  # flat TuningConfig (every knob, or at least every searched one)
    metric: float | None  # the target's median; None unless outcome is ok
    outcome: str  # worker.records.Outcome value


@dataclass
class Table:
    experiment: str  # experiment file the space is read from (relative to the table or cwd)
    backend: str
    target: str  # objective name, e.g. decode_tok_s@16
    rows: list[Row] = field(default_factory=list)
    device: str = ""
    source: str = ""  # where the measurements came from
    date: str = ""  # when they were measured (the study's first trial, UTC)
    # The study's searched grid ({"op.variant": [...], "op.variant.knob": [...]}, values as
    # text, as StudyState records it) and its baseline config; empty: the experiment's space
    # and the registry defaults.
    space: dict[str, list[str]] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)

    @property
    def ok_rows(self) -> list[Row]:
        return [r for r in self.rows if r.outcome == "ok" and r.metric is not None]

    @property
    def best(self) -> float:
        ok = self.ok_rows
        if not ok:
            raise ExperimentError("the table has no row with outcome ok and a metric")
        return max(r.metric for r in ok if r.metric is not None)

    def to_dict(self) -> dict[str, Any]:
        head = {k: getattr(self, k) for k in (*HEADER, *JSON_HEADER)}
        rows = [{"config": r.config, "metric": r.metric, "outcome": r.outcome} for r in self.rows]
        return {**head, "rows": rows}

    def save(self, path: Path) -> None:
        """Write JSON or CSV (by suffix) through a temporary file: never half a table."""
        text = _to_csv(self) if path.suffix == ".csv" else json.dumps(self.to_dict(), indent=1)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text + ("" if text.endswith("\n") else "\n"))
        os.replace(tmp, path)


def load_table(path: Path) -> Table:
    """Read a JSON or CSV table; a malformed one raises ExperimentError naming the problem."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ExperimentError(f"{path}: cannot read ({e.strerror})") from None
    if path.suffix == ".csv":
        return _from_csv(path, text)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ExperimentError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
        raise ExperimentError(f"{path}: a table is a JSON object with a 'rows' list")
    rows = [_row(path, i, r) for i, r in enumerate(doc["rows"])]
    return _table(path, doc, rows)


def relative_to(experiment: Path, table: Path) -> str:
    """The experiment's path as a table at ``table`` records it: relative to the table."""
    return os.path.relpath(experiment.resolve(), table.resolve().parent)


def _table(path: Path, head: Mapping[str, Any], rows: list[Row]) -> Table:
    missing = [k for k in ("experiment", "backend", "target") if not head.get(k)]
    if missing:
        raise ExperimentError(f"{path}: missing {missing} in the table's header")
    space, baseline = head.get("space") or {}, head.get("baseline") or {}
    if not isinstance(space, dict) or not all(isinstance(v, list) for v in space.values()):
        raise ExperimentError(f"{path}: 'space' must map each dimension to a list of choices")
    if not isinstance(baseline, dict):
        raise ExperimentError(f"{path}: 'baseline' must be a flat config (an object)")
    return Table(
        str(head["experiment"]),
        str(head["backend"]),
        str(head["target"]),
        rows,
        str(head.get("device", "")),
        str(head.get("source", "")),
        str(head.get("date", "")),
        {str(k): [str(c) for c in v] for k, v in space.items()},
        dict(baseline),
    )


def _row(path: Path, i: int, r: Any) -> Row:
    if not isinstance(r, dict) or not isinstance(r.get("config"), dict) or "outcome" not in r:
        raise ExperimentError(f"{path}: row {i} needs 'config' (an object) and 'outcome'")
    metric = r.get("metric")
    if r["outcome"] == "ok" and not isinstance(metric, int | float):
        raise ExperimentError(f"{path}: row {i} is ok but its metric is {metric!r}")
    return Row(dict(r["config"]), float(metric) if r["outcome"] == "ok" else None, r["outcome"])


def _to_csv(t: Table) -> str:
    keys = sorted({k for r in t.rows for k in r.config})
    out = io.StringIO()
    for k in HEADER:
        out.write(f"# {k}: {getattr(t, k)}\n")
    for k in JSON_HEADER:
        out.write(f"# {k}: {json.dumps(getattr(t, k), sort_keys=True)}\n")
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*keys, "metric", "outcome"])
    for r in t.rows:
        cells = [json.dumps(r.config[k]) if k in r.config else "" for k in keys]
        w.writerow([*cells, "" if r.metric is None else repr(r.metric), r.outcome])
    return out.getvalue()


def _from_csv(path: Path, text: str) -> Table:
    lines = text.splitlines()
    head: dict[str, Any] = {}
    while lines and lines[0].startswith("#"):
        k, _, v = lines.pop(0)[1:].partition(":")
        head[k.strip()] = v.strip()
    for k in JSON_HEADER:
        try:
            head[k] = json.loads(head[k]) if head.get(k) else {}
        except json.JSONDecodeError as e:
            raise ExperimentError(f"{path}: the '# {k}:' line is not JSON ({e})") from None
    reader = csv.DictReader(lines)
    if not reader.fieldnames or not {"metric", "outcome"} <= set(reader.fieldnames):
        raise ExperimentError(f"{path}: the CSV needs 'metric' and 'outcome' columns")
    rows = []
    for i, rec in enumerate(reader):
        try:
            cfg = {k: json.loads(v) for k, v in rec.items() if k not in ("metric", "outcome") and v}
        except json.JSONDecodeError as e:
            raise ExperimentError(f"{path}: row {i}: a knob value is not JSON ({e})") from None
        metric = float(rec["metric"]) if rec["metric"] else None
        rows.append(_row(path, i, {"config": cfg, "metric": metric, "outcome": rec["outcome"]}))
    return _table(path, head, rows)


# --- builders -------------------------------------------------------------------------------
def from_study(storage: Any, study_name: str, experiment: str, label: str = "") -> Table:
    """A table from a finished study: every trial that ran (duplicates and interrupted trials
    left out), its config, outcome and target median, as the agent recorded them."""
    import optuna

    from agent.records import Outcome, TrialRecord

    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        raise ExperimentError(f"{label or 'the storage'}: no study {study_name!r}") from None
    ua = study.user_attrs
    target = str(ua.get("target", ""))
    rows, seen = [], set()
    trials = study.get_trials(deepcopy=False)
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    for t in trials:
        if "outcome" not in t.user_attrs or "config" not in t.user_attrs:
            continue
        rec = TrialRecord.from_attrs(study_name, t.number, t.user_attrs)
        if rec.outcome in (Outcome.DUPLICATE, Outcome.INTERRUPTED):
            continue
        key = config_key(rec.config)
        if key in seen:
            continue
        seen.add(key)
        metric = rec.metrics.get(target) if rec.outcome is Outcome.OK else None
        if rec.outcome is Outcome.OK and metric is None:
            continue
        rows.append(Row(dict(rec.config), metric, rec.outcome.value))
    return Table(
        experiment,
        str(ua.get("backend", "")),
        target,
        rows,
        str(ua.get("device_class", "")),
        f"{label} study {study_name}",
        min(starts).strftime("%Y-%m-%d %H:%M") if starts else "",
        {str(k): [str(c) for c in v] for k, v in dict(ua.get("space") or {}).items()},
        dict((ua.get("baseline") or {}).get("config") or {}),
    )
