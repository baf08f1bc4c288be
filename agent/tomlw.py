"""A small TOML writer for promotion evidence: nested tables, scalars and lists of scalars.

``tomllib`` reads TOML but the standard library cannot write it; the evidence table is plain data
(str, int, float, bool, lists, dicts), so a few lines cover it. Round-trips through tomllib.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def key(k: str) -> str:
    return k if _BARE.match(k) else value(k)


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        escaped = (
            v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
        )
        return f'"{escaped}"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{" + ", ".join(f"{key(str(k))} = {value(x)}" for k, x in v.items()) + "}"
    if v is None:
        return '""'
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> str:
    """Tables as ``[a.b]`` sections: scalars of a table first, then its sub-tables."""
    lines: list[str] = []
    subtables = []
    for k, v in data.items():
        if isinstance(v, Mapping):
            subtables.append((k, v))
        elif isinstance(v, list) and any(isinstance(x, Mapping) for x in v):
            lines.append(f"{key(k)} = [" + ", ".join(value(x) for x in v) + "]")
        else:
            lines.append(f"{key(k)} = {value(v)}")
    out = ""
    if prefix and (lines or not subtables):
        out += "\n[" + ".".join(key(p) for p in prefix) + "]\n"
    if lines:
        out += "\n".join(lines) + "\n"
    for k, v in subtables:
        out += dumps(v, (*prefix, str(k)))
    return out
