"""docs/figures.toml's records: the Figure each one is, and ``load``, which checks every field.
tools/figures.py renders them into docs/FIGURES.md; tools/figures_add.py appends new ones."""

from __future__ import annotations

import datetime as dt
import tomllib
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from engine.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs" / "figures.toml"
PAGE = ROOT / "docs" / "FIGURES.md"
COMMAND = "python -m tools.figures --write"
SOURCES = (
    "agent trial",
    "promoted bench",
    "hand bench",
    "defaults bench",
    "table measure",
    "tool",
)
COUNTING = ("agent trial", "promoted bench")


@dataclass(frozen=True)
class Figure:
    table: str
    date: str
    device: str
    model: str
    metric: str
    figure: str
    source: str
    command: str
    config: str = ""
    reference: str = ""
    memory: str = ""
    validate: str = ""
    throughput: bool = False

    def counts(self) -> str:
        """The house rule's verdict, with what the row lacks."""
        if self.throughput:
            return "n/a"
        lacks = []
        if self.source not in COUNTING:
            lacks.append(self.source)
        if not self.validate.startswith("PASS"):
            lacks.append("no validate pass")
        if not self.memory:
            lacks.append("no footprint")
        return "yes" if not lacks else "no: " + ", ".join(lacks)


def load(path: Path = DATA) -> tuple[list[dict], dict[str, str], list[Figure]]:
    """The tables, commands and figures of ``path``; ConfigError names the first bad record."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: {e}") from None
    tables, commands = data.get("table", []), data.get("commands", {})
    for i, t in enumerate(tables, 1):
        if not isinstance(t.get("key"), str) or not isinstance(t.get("title"), str):
            raise ConfigError(f"{path}: table {i} needs a key and a title (strings)")
    keys = {t["key"] for t in tables}
    if len(keys) != len(tables):
        raise ConfigError(f"{path}: two [[table]] records share a key")
    known = {f.name for f in fields(Figure)}
    required = {f.name for f in fields(Figure) if f.default is MISSING}
    figures = []
    for i, rec in enumerate(data.get("figure", []), 1):
        where = f"{path}: figure {i}"
        if unknown := sorted(set(rec) - known):
            raise ConfigError(f"{where}: unknown field {unknown[0]!r}; fields: {sorted(known)}")
        if missing := sorted(required - set(rec)):
            raise ConfigError(f"{where}: missing field {missing[0]!r}")
        for name, value in rec.items():
            want = bool if name == "throughput" else str
            if not isinstance(value, want):
                raise ConfigError(f"{where}: {name} = {value!r} is not a {want.__name__}")
        fig = Figure(**rec)
        if fig.table not in keys:
            raise ConfigError(f"{where}: table {fig.table!r} is not a [[table]] key")
        if fig.command not in commands:
            raise ConfigError(f"{where}: command {fig.command!r} is not in [commands]")
        if fig.source not in SOURCES:
            raise ConfigError(f"{where}: source {fig.source!r}; one of {', '.join(SOURCES)}")
        try:
            dt.date.fromisoformat(fig.date)
        except ValueError:
            raise ConfigError(f"{where}: date {fig.date!r} is not YYYY-MM-DD") from None
        figures.append(fig)
    return tables, commands, figures
