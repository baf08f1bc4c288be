"""Promotion history from git: every commit of a promoted config file, read-only.

A study records only its latest promotion; the config file's git history holds all of them.
For each commit that touched a promoted file (``configs/<class>/<family>/<key>.ctx<N>.toml``)
this reads the file as it was (``git show``), its ``[evidence]`` table and its tuning keys, and
diffs the keys against the version before. A repository that is not reachable from here gives
no history, not an error.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

MAX_COMMITS = 50


def _git(repo: Path, *args: str) -> str | None:
    try:
        r = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout if r.returncode == 0 else None


def flat_config(data: dict[str, Any]) -> dict[str, Any]:
    """``{"op.key": value}`` of a promoted config's ``[ops.<op>]`` tables."""
    out: dict[str, Any] = {}
    for op, table in (data.get("ops") or {}).items():
        if isinstance(table, dict):
            for k, v in table.items():
                out[f"{op}.{k}"] = v
    return out


def diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, list[Any]]:
    return {
        k: [old.get(k), new.get(k)] for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)
    }


def head(repo: Path, rel: str) -> str | None:
    """The last commit that touched ``rel`` (a cache key), None when git cannot tell."""
    out = _git(repo, "log", "-1", "--format=%H", "--", rel)
    return out.strip() if out else None


def history(repo: Path, rel: str) -> list[dict[str, Any]]:
    """Commits of ``rel`` in ``repo``, newest first: commit, at, message, evidence, config, diff
    (against the version before; the first version's diff is against nothing)."""
    out = _git(repo, "log", f"-n{MAX_COMMITS}", "--format=%H%x09%at%x09%s", "--", rel)
    if not out:
        return []
    entries = []
    for line in out.strip().splitlines():
        commit, at, message = line.split("\t", 2)
        text = _git(repo, "show", f"{commit}:{rel}")
        if text is None:  # the commit deleted the file
            continue
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            continue
        entries.append(
            {
                "commit": commit,
                "at": float(at),
                "message": message,
                "evidence": dict(data.get("evidence") or {}),
                "config": flat_config(data),
            }
        )
    for i, e in enumerate(entries):
        before = entries[i + 1]["config"] if i + 1 < len(entries) else None
        e["previous"] = entries[i + 1]["commit"] if before is not None else ""
        e["diff"] = diff(before, e["config"]) if before is not None else None
    return entries


def locate(path: str, repo: str) -> tuple[Path, str] | None:
    """(repository root, path inside it) of a promoted file, when the repository is here."""
    if not path or not repo:
        return None
    root = Path(repo)
    p = Path(path)
    try:
        rel = p.relative_to(root) if p.is_absolute() else p
    except ValueError:
        return None
    if not (root / ".git").exists():
        return None
    return root, rel.as_posix()
