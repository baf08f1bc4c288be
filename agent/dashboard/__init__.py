"""The fleettune dashboard: fleet, studies, trials and promotions in a browser, read-only.

``python -m agent dashboard --storage URL [--host 127.0.0.1] [--port 8080] [--token T]`` (also
``python -m agent.dashboard ...``), or from Python ``serve(storage_url, host, port)``;
``agent run --dashboard`` starts ``serve_in_background``. See docs/dashboard.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["add_arguments", "create_app", "main", "serve", "serve_in_background"]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


def create_app(
    storage_url: str, token: str | None = None, refresh_s: float = 1.0, warm: bool = True
) -> FastAPI:
    """The FastAPI app over one storage (see ``agent.dashboard.app``)."""
    from agent.dashboard.app import create_app as _create

    return _create(storage_url, token=token, refresh_s=refresh_s, warm=warm)


def _server(storage_url: str, host: str, port: int, token: str | None):  # noqa: ANN202
    import optuna
    import uvicorn

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    app = create_app(storage_url, token=token)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    return uvicorn.Server(config)


def _announce(storage_url: str, host: str, port: int, token: str | None) -> None:
    shown = f"[{host}]" if ":" in host else host
    suffix = "/?token=<token>" if token else "/"
    print(f"dashboard: http://{shown}:{port}{suffix} (storage {storage_url})", file=sys.stderr)
    if host not in ("127.0.0.1", "localhost", "::1") and not token:
        print(
            "dashboard: warning: bound beyond localhost without --token; anyone who can reach "
            "this port can read every study",
            file=sys.stderr,
        )


def serve(
    storage_url: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
) -> None:
    """Serve the dashboard until interrupted (binds to 127.0.0.1 unless told otherwise)."""
    server = _server(storage_url, host, port, token)
    _announce(storage_url, host, port, token)
    server.run()


def serve_in_background(
    storage_url: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
) -> threading.Thread:
    """Serve from a daemon thread (for ``agent run --dashboard``); returns the thread. The
    storage must already exist: call it after the agent created its first study."""
    server = _server(storage_url, host, port, token)
    # A server in a thread must not install signal handlers (the agent owns Ctrl-C).
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    thread = threading.Thread(target=server.run, name="fleettune-dashboard", daemon=True)
    thread.start()
    _announce(storage_url, host, port, token)
    return thread


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The dashboard's options, for the agent CLI's ``dashboard`` subcommand."""
    parser.add_argument(
        "--storage",
        help="Optuna storage URL or path the agent used (default: the agent's default storage)",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8080)")
    parser.add_argument(
        "--token",
        default=os.environ.get("FLEETTUNE_DASHBOARD_TOKEN"),
        help="require this token on every request (env "
        "FLEETTUNE_DASHBOARD_TOKEN); use it when binding beyond localhost",
    )


def run_args(args: argparse.Namespace) -> int:
    """Run from parsed ``add_arguments`` options; returns the exit code."""
    from agent.dashboard.data import StorageMissing
    from agent.storage import parse_storage

    url = parse_storage(args.storage).url
    try:
        serve(url, args.host, args.port, args.token)
    except StorageMissing as e:
        print(f"dashboard: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m agent dashboard`` / ``python -m agent.dashboard``."""
    parser = argparse.ArgumentParser(
        prog="python -m agent dashboard",
        description="Watch the fleet, studies, trials and promotions in a browser (read-only).",
    )
    add_arguments(parser)
    logging.basicConfig(level=logging.WARNING)
    return run_args(parser.parse_args(argv))
