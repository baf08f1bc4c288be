"""What validate admits per numeric class, read from data: engine/verify/budgets.toml.

Each budget in the file carries its bounds and the measurements they were set from: per class the
worst correct variant of each calibration run (``[[numeric.<class>.measured]]``: date, command,
backend, model, which config, its figures) and the nearest planted bug (``nearest_bug``).
`python -m tests.calibrate --write` adds or replaces its run's entries (``record_calibration``);
the bounds stay a person's choice (about 2x the worst correct variant, far under the nearest bug)
and are edited in the file. This module is a leaf (engine.errors only): the registry reads the
classes from it, the verifier the bounds.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from engine.errors import ConfigError

BUDGETS_FILE = Path(__file__).with_name("budgets.toml")
CLASS_ORDER = ("order_only", "fp16", "bf16", "int8_activations")  # tightest first
METRICS = ("kld_max", "kld_mean", "nmse", "max_abs_diff")  # what a calibration run measures


@dataclass(frozen=True)
class Budget:
    """What validate admits for one numeric class, on the teacher-forced logits of every compared
    position (engine.verify.validate): KL(ref || cand) of the softmax in float64 (worst position
    and mean), NMSE and max |diff| of the logits, and the top-1/top-2 margin of the reference below
    which a position is a near-tie (its top-1 may differ). ``op_nmse`` is the per-op bound of an op
    whose variant has this class: op-level replay rejects an op whose output, on the reference's
    own inputs, differs by more; blame names the first op past it. ``route_tie``: a MoE router's
    k-th minus (k+1)-th logit in the reference below which its expert choice is a near-tie that the
    candidate then borrows (teacher-forced routing); 0 borrows none."""

    kld_max: float
    kld_mean: float
    nmse: float
    max_abs_diff: float
    near_tie: float
    op_nmse: float
    route_tie: float = 0.0

    def tightened(self, **caps: float) -> Budget:
        """A copy with some bounds lowered; raising one past this budget is a ConfigError naming
        the key (an experiment may tighten the registry's budget, never loosen it)."""
        values = dict(self.__dict__)
        for key, value in caps.items():
            if key not in values:
                raise ConfigError(f"budget key {key!r}; allowed: {', '.join(values)}")
            if value > values[key]:
                raise ConfigError(
                    f"budget {key} = {value:g} loosens the registry's {values[key]:g}; "
                    "an experiment may only tighten it"
                )
            values[key] = float(value)
        return Budget(**values)

    def loosest(self, other: Budget) -> Budget:
        return Budget(**{k: max(v, getattr(other, k)) for k, v in self.__dict__.items()})


BOUNDS = tuple(f.name for f in fields(Budget))
_NOTES = ("note", "measured", "nearest_bug")  # a budget's table besides its bounds


@dataclass(frozen=True)
class Budgets:
    """The file's bounds. ``numeric``: per class (a variant's ``numeric``); ``reference`` and
    ``reference_recurrent``: the drift sentinel's (a backend's reference path vs NumPy; the
    recurrent hybrid families carry float32 state, so drift further); ``recurrent_end_to_end``:
    per class, the end-to-end bounds widened on recurrent hybrids (``end_to_end``)."""

    numeric: dict[str, Budget]
    reference: Budget
    reference_recurrent: Budget
    recurrent_end_to_end: dict[str, dict[str, float]]


def _budget(where: str, table: dict[str, Any]) -> Budget:
    extra = set(table) - set(BOUNDS) - set(_NOTES)
    missing = [k for k in BOUNDS if k not in table and k != "route_tie"]
    if extra or missing:
        raise ConfigError(f"budgets [{where}]: unknown {sorted(extra)}, missing {missing}")
    return Budget(**{k: float(table[k]) for k in BOUNDS if k in table})


def parse(doc: dict[str, Any]) -> Budgets:
    """The bounds of a parsed budgets file (a ConfigError names a malformed table)."""
    wide = {}
    for cls, table in doc.get("recurrent_end_to_end", {}).items():
        if cls not in doc["numeric"] or set(table) - set(BOUNDS) - set(_NOTES):
            raise ConfigError(f"budgets [recurrent_end_to_end.{cls}]: unknown class or bound")
        wide[cls] = {k: float(v) for k, v in table.items() if k in BOUNDS}
    return Budgets(
        numeric={c: _budget(f"numeric.{c}", t) for c, t in doc["numeric"].items()},
        reference=_budget("reference", doc["reference"]),
        reference_recurrent=_budget("reference_recurrent", doc["reference_recurrent"]),
        recurrent_end_to_end=wide,
    )


def read(path: Path = BUDGETS_FILE) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)


def load(path: Path = BUDGETS_FILE) -> Budgets:
    try:
        return parse(read(path))
    except (OSError, tomllib.TOMLDecodeError, KeyError) as e:
        raise ConfigError(f"budgets file {path}: {e}") from e


_LOADED = load()
NUMERIC_BUDGETS: dict[str, Budget] = _LOADED.numeric
REFERENCE_BUDGET: Budget = _LOADED.reference
REFERENCE_BUDGET_RECURRENT: Budget = _LOADED.reference_recurrent
RECURRENT_END_TO_END: dict[str, dict[str, float]] = _LOADED.recurrent_end_to_end


def end_to_end(table: dict[str, Budget] | None, recurrent: bool) -> dict[str, Budget]:
    """The per-class table validate judges logits by: ``table`` (the registry's when None), with
    RECURRENT_END_TO_END's bounds for a recurrent model where ``table`` keeps the registry's value
    (an experiment's tightened bound stays). op_nmse is never widened: replay judges each op on
    the reference's inputs, where nothing compounds."""
    table = dict(table or NUMERIC_BUDGETS)
    if not recurrent:
        return table
    for cls, wide in RECURRENT_END_TO_END.items():
        b, reg = table[cls], NUMERIC_BUDGETS[cls]
        untouched = [k for k in wide if getattr(b, k) == getattr(reg, k)]
        table[cls] = replace(b, **{k: max(wide[k], getattr(b, k)) for k in untouched})
    return table


def loosest(
    classes: Iterable[str], budgets: dict[str, Budget] | None = None
) -> tuple[Budget, list[str]]:
    """The loosest budget over numeric ``classes`` in ``budgets`` (the registry's when None), and
    the sorted classes."""
    table = budgets or NUMERIC_BUDGETS
    names = sorted(set(classes))
    out = table[names[0]]
    for c in names[1:]:
        out = out.loosest(table[c])
    return out, names


def class_rank(cls: str) -> int:
    return CLASS_ORDER.index(cls) if cls in CLASS_ORDER else len(CLASS_ORDER)


# --- writing: the calibration script's side ---------------------------------------------------


def record_calibration(
    doc: dict[str, Any],
    rows: list[dict[str, Any]],
    run: dict[str, str],
    mutants: list[dict[str, Any]] | None = None,
) -> list[str]:
    """Record one calibration run in a parsed budgets file, in place; returns the classes it
    touched. ``rows``: the script's candidates (config, classes, passed and METRICS); ``run``: date,
    command, backend, model. Per class, the worst passing candidate whose loosest class it is
    replaces the entry of the same backend and model in ``measured`` (or is appended). With
    ``mutants`` (tests.mutants Verdict dicts), the rejected bug with the smallest NMSE above the
    class's bound becomes its ``nearest_bug``. The bounds are left as they are."""
    touched = []
    for cls, table in doc["numeric"].items():
        mine = [r for r in rows if r["passed"] and max(r["classes"], key=class_rank) == cls]
        if not mine:
            continue
        worst = max(mine, key=lambda r: r["nmse"])
        entry = {**run, "worst": json.dumps(worst["config"], sort_keys=True)}
        entry |= {m: _sig(max(r[m] for r in mine)) for m in METRICS}
        same = (run["backend"], run["model"])
        kept = [e for e in table.get("measured", []) if (e["backend"], e["model"]) != same]
        table["measured"] = [*kept, entry]
        above = [v for v in mutants or [] if v["rejected"] and v["nmse"] > table["nmse"]]
        if above:
            bug = min(above, key=lambda v: v["nmse"])
            table["nearest_bug"] = {
                **run,
                "name": bug["mutant"],
                "kld_max": _sig(bug["kld"]),
                "nmse": _sig(bug["nmse"]),
            }
        touched.append(cls)
    return touched


def _sig(x: float) -> float:
    return float(f"{x:.3g}")  # a measurement's three figures, not its float noise


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(float(v)) if isinstance(v, float) else str(v)
    if isinstance(v, str):
        if "\n" in v and "'''" not in v:
            return "'''\n" + v + "'''"
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"budgets: cannot write {type(v).__name__}")


def _tables(prefix: str, table: dict[str, Any], out: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not _nested(v)}
    if prefix and (scalars or not table):
        out += ["", f"[{prefix}]"]
    out += [f"{k} = {_value(v)}" for k, v in scalars.items()]
    for k, v in table.items():
        name = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict):
            _tables(name, v, out)
        elif _nested(v):
            for item in v:
                out += ["", f"[[{name}]]"]
                out += [f"{ik} = {_value(iv)}" for ik, iv in item.items()]


def _nested(v: Any) -> bool:
    return isinstance(v, dict) or (bool(v) and isinstance(v, list) and isinstance(v[0], dict))


def dumps(doc: dict[str, Any], header: str = "") -> str:
    """TOML text of a budgets file (tables of scalars, sub-tables and arrays of tables); tomllib
    reads it back to ``doc``."""
    out = [f"# {line}".rstrip() for line in header.splitlines()]
    _tables("", doc, out)
    return "\n".join(out).lstrip("\n") + "\n"


HEADER = """The numeric budgets of validate, read by engine/verify/budgets.py (docs/verify.md).
Bounds per class; [[...measured]]: the worst correct variant of each calibration run;
nearest_bug: the nearest planted bug above the bound. `python -m tests.calibrate --write`
rewrites this file with its run's entries; change a bound here, by hand, from what they say."""


def write(doc: dict[str, Any], path: Path = BUDGETS_FILE) -> None:
    text = dumps(doc, HEADER)
    parse(tomllib.loads(text))  # never write a file the loader refuses
    path.write_text(text)
