"""A throwaway PostgreSQL server for the tests: Debian's ``postgresql`` binaries (installed by
``./dev``), a fresh data directory under /tmp, loopback only, a free port, trust auth, fsync off.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` user (made by
the Debian package) or ``nobody``, with the data directory chowned to it. The tests connect over
TCP as the database superuser ``postgres``; each test gets its own database.

A server that cannot start is an error naming the reason, never a skip: CI installs it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

SUPERUSER = "postgres"


class PostgresUnavailable(RuntimeError):
    pass


def _bindir() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).parent
    # Debian keeps the server binaries out of PATH, one folder per major version.
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2]))
    for d in reversed(dirs):
        if (Path(d) / "pg_ctl").exists():
            return Path(d)
    raise PostgresUnavailable(
        "no PostgreSQL server binaries (pg_ctl) in PATH or /usr/lib/postgresql/*/bin: "
        "apt-get install postgresql (./dev setup does)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as_user() -> str | None:
    """The account the server runs as when we are root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    raise PostgresUnavailable("running as root and neither user 'postgres' nor 'nobody' exists")


class PostgresServer:
    """``start()`` initdb + pg_ctl start; ``url(db)``; ``create_database()``; ``stop()``."""

    def __init__(self) -> None:
        self.bindir = _bindir()
        self.user = _run_as_user()
        self.root = Path(tempfile.mkdtemp(prefix="fleettune-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = 0

    def _cmd(self, *args: str) -> list[str]:
        if self.user is None:
            return list(args)
        return ["runuser", "-u", self.user, "--", *args]

    def _run(self, *args: str, timeout: float = 120) -> None:
        r = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise PostgresUnavailable(
                f"{Path(args[0]).name} failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}"
                f"{log}"
            )

    def start(self) -> PostgresServer:
        if self.user is not None:
            pw = pwd.getpwnam(self.user)
            os.chown(self.root, pw.pw_uid, pw.pw_gid)
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--no-sync",
        )
        for _ in range(3):  # a port found free may be taken before the server binds it
            self.port = _free_port()
            opts = (
                f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
            )
            try:
                self._run(
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    opts,
                    "-w",
                    "-t",
                    "60",
                    "start",
                )
                return self
            except PostgresUnavailable:
                if "could not bind" not in (self.log.read_text() if self.log.exists() else ""):
                    self.stop()
                    raise
        self.stop()
        raise PostgresUnavailable(f"no free port for PostgreSQL; log: {self.log}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        name = name or f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def pause(self) -> None:
        """Stop the server as a crash would (``pg_ctl stop -m immediate``), keeping its data:
        a checkpoint first, as this server commits asynchronously (a crash loses the last
        commits, which a real server with synchronous_commit keeps)."""
        import psycopg

        dsn = f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")

    def resume(self) -> None:
        """Start a paused server again, on the same port."""
        opts = (
            f"-h 127.0.0.1 -p {self.port} -k {self.root} -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts,
            "-w", "-t", "60", "start",
        )  # fmt: skip

    def stop(self) -> None:
        if self.data.exists() and (self.data / "postmaster.pid").exists():
            subprocess.run(
                self._cmd(
                    str(self.bindir / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-m",
                    "immediate",
                    "-w",
                    "stop",
                ),
                capture_output=True,
                timeout=60,
            )
        shutil.rmtree(self.root, ignore_errors=True)
