"""The fleettune dashboard: fleet, studies, trials and promotions in a browser, read-only.

``python -m agent dashboard --storage URL [--host 127.0.0.1] [--port 8080] [--token T]`` (also
``python -m agent.dashboard ...``), or from Python ``serve(storage_url, host, port)``;
``agent run --dashboard`` starts ``serve_in_background``. See docs/dashboard.md.

Bound beyond loopback it refuses to start without a token (``--insecure`` overrides), and every
request's Host header must name this machine (DNS rebinding: a page on another site whose name
resolves to this address must not read the studies).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = [
    "InsecureBind",
    "add_arguments",
    "allowed_hosts",
    "check_bind",
    "create_app",
    "main",
    "serve",
    "serve_in_background",
]

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080


class InsecureBind(ValueError):
    """Bound beyond loopback without a token, and ``insecure`` not given."""


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None, insecure: bool = False) -> None:
    """Refuse to serve every study to the network unauthenticated, unless told so."""
    if not token and not insecure and not is_loopback(host):
        raise InsecureBind(
            f"--host {host} without --token would let anyone who reaches this port read every "
            "study: give --token T (or FLEETTUNE_DASHBOARD_TOKEN), or --insecure"
        )


def allowed_hosts(host: str, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The names a request's Host header may carry when bound to ``host``: loopback names, the
    machine's own names, the bound address, and ``extra`` (a DNS alias, a proxy's name). IP
    literals are matched in ``agent.dashboard.app`` (a rebinding attack needs a name)."""
    names = {"localhost", "127.0.0.1", "[::1]", host.lower()}
    if not is_loopback(host):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    names |= {e.lower() for e in extra if e}
    return tuple(sorted(names))


def create_app(storage_url: str, **options: Any) -> FastAPI:
    """The FastAPI app over one storage; ``options`` as for ``agent.dashboard.app.create_app``
    (token, refresh_s, warm, hosts, any_ip, ray_dashboard), which is imported only here so that
    importing the package does not import FastAPI."""
    from agent.dashboard.app import create_app as _create

    return _create(storage_url, **options)


def _server(  # noqa: ANN202
    storage_url: str,
    host: str,
    port: int,
    token: str | None,
    insecure: bool = False,
    allow_hosts: Sequence[str] = (),
    ray_dashboard: str | None = None,
):
    import optuna
    import uvicorn

    check_bind(host, token, insecure)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    wildcard = host in ("0.0.0.0", "::", "")
    app = create_app(
        storage_url,
        token=token,
        hosts=allowed_hosts(host, allow_hosts),
        any_ip=wildcard,
        ray_dashboard=ray_dashboard,
    )
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    return uvicorn.Server(config)


def _announce(storage_url: str, host: str, port: int, token: str | None) -> None:
    from agent.storage import parse_storage

    shown = f"[{host}]" if ":" in host else host
    suffix = "/?token=<token>" if token else "/"
    storage = parse_storage(storage_url).display  # a password masked, as the agent prints it
    print(f"dashboard: http://{shown}:{port}{suffix} (storage {storage})", file=sys.stderr)
    if not is_loopback(host) and not token:
        print(
            "dashboard: --insecure: anyone who can reach this port can read every study",
            file=sys.stderr,
        )


def serve(
    storage_url: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    insecure: bool = False,
    allow_hosts: Sequence[str] = (),
    ray_dashboard: str | None = None,
) -> None:
    """Serve the dashboard until interrupted (binds to 127.0.0.1 unless told otherwise).
    Raises ``InsecureBind`` for a non-loopback ``host`` without ``token`` or ``insecure``."""
    server = _server(storage_url, host, port, token, insecure, allow_hosts, ray_dashboard)
    _announce(storage_url, host, port, token)
    server.run()


def serve_in_background(
    storage_url: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    insecure: bool = False,
    ray_dashboard: str | None = None,
) -> threading.Thread:
    """Serve from a daemon thread (for ``agent run --dashboard``); returns the thread. The
    storage must already exist: call it after the agent created its first study."""
    server = _server(storage_url, host, port, token, insecure, (), ray_dashboard)
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
        "FLEETTUNE_DASHBOARD_TOKEN); required when binding beyond localhost",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="serve beyond localhost without a token (anyone who reaches the port reads all)",
    )
    parser.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also accept requests addressed to this host name (a DNS alias or a proxy); the "
        "machine's own names and IP addresses are accepted already",
    )
    parser.add_argument(
        "--ray-dashboard",
        default=os.environ.get("FLEETTUNE_RAY_DASHBOARD"),
        metavar="URL",
        help="link the fleet page to this Ray dashboard (default: the one the agent recorded)",
    )


def run_args(args: argparse.Namespace) -> int:
    """Run from parsed ``add_arguments`` options; returns the exit code."""
    from agent.dashboard.rows import StorageMissing
    from agent.storage import StorageError, check_storage, parse_storage

    try:
        ref = parse_storage(args.storage)
        if ref.kind == "rdb":  # unreachable, no driver: one line naming it (password masked)
            check_storage(ref, create=False)
    except StorageError as e:
        print(f"dashboard: {e}", file=sys.stderr)
        return 2
    url = ref.url
    try:
        serve(
            url,
            args.host,
            args.port,
            args.token,
            args.insecure,
            args.allow_host,
            args.ray_dashboard,
        )
    except (StorageMissing, InsecureBind) as e:
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
