"""Ray token authentication, handled the same way for ``ray start``, ``ray.init`` and
``ray job submit``: one switch, the ``RAY_AUTH_MODE`` environment variable.

Ray 2.60 turns token auth on by default: a cluster started by ``ray start --head`` or an embedded
``ray.init()`` generates ``~/.ray/auth_token`` and every process talking to it must present that
token (``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token``).
``RAY_AUTH_MODE=disabled`` opts out; it must then be set for the head, every worker node, the
agent and ``ray job submit`` alike. We never flip the mode inside a process (Ray caches it at
import); we pass it on to the processes we start, and check that a joining process has a token.
"""

from __future__ import annotations

import os
from pathlib import Path

MODES = ("token", "disabled")


class AuthSetupError(RuntimeError):
    """Token auth is on but no token can be found for this process."""


def token_path() -> Path:
    env = os.environ.get("RAY_AUTH_TOKEN_PATH")
    return Path(env).expanduser() if env else Path.home() / ".ray" / "auth_token"


def has_token() -> bool:
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or token_path().is_file()


def auth_mode(explicit: str | None = None) -> str | None:
    """The mode asked for (argument, else $RAY_AUTH_MODE); None: Ray's default (token)."""
    mode = explicit or os.environ.get("RAY_AUTH_MODE")
    if mode is None:
        return None
    mode = mode.lower()
    if mode not in MODES:
        raise AuthSetupError(f"RAY_AUTH_MODE={mode!r}: allowed values: {list(MODES)}")
    return mode


def auth_env(mode: str | None = None, joining: bool = False) -> dict[str, str]:
    """Environment additions for a Ray child process (``ray start``, ``ray job submit``): the
    mode always set explicitly (token unless asked otherwise), because Ray's CLI clients do not
    all apply the token default (``ray job submit`` without RAY_AUTH_MODE=token sends no token).

    ``joining``: the process connects to an existing cluster; in token mode it needs the
    cluster's token here (copy the head's ``~/.ray/auth_token``, or set RAY_AUTH_TOKEN)."""
    m = auth_mode(mode) or "token"
    if m == "token" and joining and not has_token():
        raise AuthSetupError(
            "Ray token auth is on (RAY_AUTH_MODE=token) but this machine has no token: copy the "
            f"head node's ~/.ray/auth_token to {token_path()}, or set RAY_AUTH_TOKEN or "
            "RAY_AUTH_TOKEN_PATH; or run every node with RAY_AUTH_MODE=disabled."
        )
    return {"RAY_AUTH_MODE": m}


def check(joining: bool = False) -> str:
    """Validate this process's auth setup before ``ray.init`` (which applies Ray's own default
    when RAY_AUTH_MODE is unset: token for a new cluster, token when joining with a token here);
    returns the mode."""
    explicit = auth_mode()
    if explicit == "token" and joining and not has_token():
        auth_env("token", joining=True)  # raises with the message
    return explicit or "token (Ray default)"
