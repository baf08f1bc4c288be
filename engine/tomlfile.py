"""Reading a user's TOML file (a tuning config, an experiment) with one clear line per way it can
be wrong: a folder, a missing file, bytes that are not text, text that is not TOML."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from engine.errors import ConfigError


def read_toml(
    path: str | Path, what: str, error: type[ConfigError] = ConfigError
) -> dict[str, Any]:
    """The table of ``path``, or ``error`` naming the path and the problem. ``what`` is the
    file's kind with its article ("a config", "an experiment")."""
    path = Path(path)
    noun = what.split(" ", 1)[-1]
    if path.is_dir():
        raise error(f"{path}: is a directory; give {what} .toml file")
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{path}: no such {noun} file") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file ({what} TOML file was expected)") from None
    except tomllib.TOMLDecodeError as e:
        raise error(f"{path}: not valid TOML: {e}") from None
