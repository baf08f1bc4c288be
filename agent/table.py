"""Tables of measured configs, the replay runner's input: one row per config with its target
metric and outcome, plus what the table was measured for (experiment file, backend, target).

    JSON: {"experiment": PATH, "backend": B, "target": "decode_tok_s@16", "device": ..., "source":
           ..., "rows": [{"config": {flat knobs}, "metric": 123.4 | null, "outcome": "ok"}]}
    CSV:  "# key: value" lines for the same header fields, then columns: one per flat knob,
          ``metric``, ``outcome`` (knob values are JSON: 8, true, "block").

Built from an Optuna storage of a finished study (``from_study``), from a Vulkan sweep's JSON
(``from_sweep``, engine/backends/vulkan/sweep.py), or measured here over every config of an
experiment's space (``measure``: compile, validate, paired bench, as a worker does).
"""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.experiment import ExperimentError
from agent.space import config_key

HEADER = ("experiment", "backend", "target", "device", "source")


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
        head = {k: getattr(self, k) for k in HEADER}
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
    return Table(
        str(head["experiment"]),
        str(head["backend"]),
        str(head["target"]),
        rows,
        str(head.get("device", "")),
        str(head.get("source", "")),
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
    w = csv.writer(out, lineterminator="\n")
    w.writerow([*keys, "metric", "outcome"])
    for r in t.rows:
        cells = [json.dumps(r.config[k]) if k in r.config else "" for k in keys]
        w.writerow([*cells, "" if r.metric is None else repr(r.metric), r.outcome])
    return out.getvalue()


def _from_csv(path: Path, text: str) -> Table:
    lines = text.splitlines()
    head: dict[str, str] = {}
    while lines and lines[0].startswith("#"):
        k, _, v = lines.pop(0)[1:].partition(":")
        head[k.strip()] = v.strip()
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
    for t in study.get_trials(deepcopy=False):
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
    )


def from_sweep(doc: Mapping[str, Any], experiment: str, target: str, source: str = "") -> Table:
    """A table from engine/backends/vulkan/sweep.py's JSON: each run's config (changes from the
    Vulkan default), its outcome and the bench figure that ``target`` names
    (``prefill_tok_s@105``: the prefill tok/s of the 105-token prompt)."""
    from engine.tuning import TuningConfig

    metric_name, _, n = target.partition("@")
    base = TuningConfig.default("vulkan")
    rows = []
    for run in doc.get("runs", []):
        outcome = str(run.get("outcome", ""))
        if outcome.startswith("skipped"):
            continue
        flat = base.replace(**run["config"]).flat()
        if outcome == "ok":
            hits = [b for b in run.get("bench", []) if str(b["prompt_tokens"]) == n]
            value = hits[0].get(metric_name) if hits else None
            if value is None:
                raise ExperimentError(f"sweep run {run['config']}: no {target} in its bench")
            rows.append(Row(flat, float(value), "ok"))
        else:
            rows.append(Row(flat, None, _sweep_outcome(outcome)))
    device = doc.get("device", {})
    return Table(experiment, "vulkan", target, rows, str(device.get("name", "")), source)


def _sweep_outcome(text: str) -> str:
    if text.startswith("not allowed"):
        return "infeasible"
    if text.startswith("KernelCompileError"):
        return "compile_error"
    if text == "invalid":
        return "invalid"
    return "crash"


def measure(
    exp_path: Path,
    backend: str,
    out: Path,
    progress: Callable[[str], None] = print,
) -> Table:
    """Measure every config of the experiment's space on this machine's device: the agent's
    local runner (agent.local) runs a grid over the whole space on the experiment's first
    model, each config compiled, validated and paired-benchmarked as a worker does, no
    promotion; the table is that study's trials. The study is kept beside the table
    (``OUT.journal``), so a stopped measurement resumes where it stopped."""
    from dataclasses import replace

    from agent.experiment import load_experiment
    from agent.loop import RunOptions, run_experiment
    from agent.storage import parse_storage

    exp = load_experiment(exp_path)
    if backend not in exp.backends:
        raise ExperimentError(f"--backend {backend}: not in the experiment's {list(exp.backends)}")
    size = exp.search_space(backend).size
    exp = replace(
        exp,
        name=f"{exp.name}-measure",
        models=exp.models[:1],
        backends=(backend,),
        device_classes=None,
        sampler=replace(exp.sampler, name="grid"),
        budget=replace(exp.budget, trials=size + 1),  # + the baseline, when outside the space
    )
    storage = parse_storage(str(out.with_suffix(".journal")))
    scratch = out.parent / f".{out.name}.promote"  # no promoted baseline: the registry default
    opts = RunOptions(storage, promote_repo=scratch, promote=False, local=True)
    summary = run_experiment(exp, opts)
    if not summary.studies:
        why = "; ".join(summary.warnings) or f"no {backend} device here"
        raise ExperimentError(f"nothing measured: {why}")
    s = summary.studies[0]
    table = from_study(storage.open(), s.study, relative_to(exp_path, out), storage.display)
    table.source = f"python -m agent table measure {exp_path} --backend {backend}; model {s.model}"
    table.save(out)
    progress(f"{s.study}: {s.evaluated} configs measured, outcomes {s.outcomes}")
    return table
