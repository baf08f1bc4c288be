"""Where a result came from: the engine build that produced it (``engine_commit``), for bench
reports, trial records and promotion evidence."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from functools import cache
from pathlib import Path

# The engine commit a submitter resolved from its own checkout, for a process whose copy of the
# code has no .git (``ray job submit --working-dir`` leaves .git out of the upload).
COMMIT_ENV = "FLEETTUNE_ENGINE_COMMIT"
_COMMIT = re.compile(r"[0-9a-f]{40}(\+dirty)?")


@cache
def engine_commit() -> str:
    """The git commit of the engine checkout this process imports, '+dirty' when its engine/ or
    shaders/ have uncommitted or untracked files. Without a git checkout of its own (an installed
    wheel, a Ray working_dir upload): $FLEETTUNE_ENGINE_COMMIT when it holds a commit, else
    'unknown'."""
    import engine

    return commit_of(Path(next(iter(engine.__path__))).resolve().parent, os.environ)


def commit_of(root: Path, env: Mapping[str, str]) -> str:
    """engine_commit() for the code under root: its own git first (a commit handed down in env
    never overrides the checkout that actually runs), then env's COMMIT_ENV if well-formed."""
    git = _git_commit(root)
    if git is not None:
        return git
    given = env.get(COMMIT_ENV, "").strip().lower()
    return given if _COMMIT.fullmatch(given) else "unknown"


def _git_commit(root: Path) -> str | None:
    """root's commit when root is the top of a git checkout (not some repository around an
    unpacked copy), None when it is not or git is missing."""

    def git(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", "-C", str(root), *argv], capture_output=True, text=True, timeout=10
        )

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        rev = git("rev-parse", "HEAD")
        if rev.returncode != 0:
            return None
        # uncommitted or untracked engine code or shaders
        dirty = git("status", "--porcelain", "--", "engine", "shaders").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return rev.stdout.strip() + ("+dirty" if dirty else "")


def submit_env() -> dict[str, str]:
    """The runtime env entry that carries this checkout's engine commit into a Ray job whose
    working dir is uploaded without .git (``python -m agent runtime-env`` prints it)."""
    commit = engine_commit()
    return {} if commit == "unknown" else {COMMIT_ENV: commit}


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
