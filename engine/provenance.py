"""Where a result came from: the engine build that produced it (``engine_commit``), for bench
reports, trial records and promotion evidence."""

from __future__ import annotations

import subprocess
from functools import cache
from pathlib import Path


@cache
def engine_commit() -> str:
    """The git commit of the engine checkout this process imports, '+dirty' when its engine/ or
    shaders/ have uncommitted or untracked files;
    'unknown' outside a git checkout (an installed wheel, a Ray working_dir upload)."""
    import engine

    root = Path(next(iter(engine.__path__))).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(  # uncommitted or untracked engine code or shaders
            ["git", "-C", str(root), "status", "--porcelain", "--", "engine", "shaders"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


def config_source(source: str) -> dict[str, str | None]:
    """An engine's config source (``Engine.config_source``: "default", "given",
    "promoted:<path>", "file:<path>") as ``{"kind", "path"}``: what bench --json records and
    its header names."""
    kind, _, path = source.partition(":")
    return {"kind": kind or "default", "path": path or None}


def describe_source(source: dict[str, str | None]) -> str:
    """The config source in words, for a report's header."""
    kind, path = source.get("kind"), source.get("path")
    if kind == "promoted":
        return f"promoted {path}"
    if kind == "file":
        return f"--config {path}"
    if kind == "given":
        return "a config given by the caller"
    return "the registry's defaults (no promoted config here)"
