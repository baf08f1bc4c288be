"""Where studies live: an Optuna storage URL, and the fleet status file next to it.

Accepted ``--storage`` values (or ``$FLEETTUNE_STORAGE`` when no ``--storage`` is given, so that
a connection string with a password stays in an env file, off command lines):
  ``journal:///path/studies.journal``  an Optuna journal file (the default, under the cache:
                                       agent/studies.journal); a bare ``*.journal`` path too
  ``sqlite:///path/studies.db``        SQLite; a bare path with another suffix too
  ``postgresql://user@host/db``        PostgreSQL, for a fleet (driver: psycopg 3; the URL is
                                       normalised to ``postgresql+psycopg://``; a password is
                                       best kept in ``PGPASSWORD`` or ~/.pgpass)
  ``mysql+pymysql://...``              any other SQLAlchemy URL whose driver is installed

The journal is the default because it is the cheapest on the agent's critical path: on a 2-core
machine, ask ~3-25 ms and a trial's record ~15 ms, against ~25-110 ms and ~100 ms for SQLite
(docs/BENCHMARKS.md, Agent).

``check_storage`` runs before Ray starts: scheme, driver, reachable, writable, "is it a
database"; a problem is one line (an ``EngineError``, exit 2) and nothing is created.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

import optuna

from engine.errors import EngineError

ENV = "FLEETTUNE_STORAGE"
# DBAPI module -> the package that provides it (what to pip install).
DRIVER_PACKAGES = {
    "psycopg": "psycopg[binary]",
    "psycopg2": "psycopg2-binary",
    "pymysql": "PyMySQL",
    "MySQLdb": "mysqlclient",
}
CONNECT_TIMEOUT_S = 10
SCHEMA_RACE_TRIES = 3  # opens of a new database racing another process on its schema
SCHEMES = "journal:///path, sqlite:///path, postgresql://user@host/db, or a file path"


class StorageError(EngineError):
    """A --storage that cannot be used: unknown scheme, missing driver, unreachable, not a
    database, not writable."""


@dataclass(frozen=True)
class StorageRef:
    url: str  # as given or normalized: sqlite:///..., journal:///..., postgresql+psycopg://...
    kind: str  # "sqlite", "journal" or "rdb"
    path: Path | None  # the file for sqlite and journal storages

    @property
    def display(self) -> str:
        """The URL with any password masked: for logs, summaries and committed evidence."""
        if self.kind != "rdb":
            return self.url
        from sqlalchemy.engine import make_url

        return make_url(self.url).render_as_string(hide_password=True)

    @property
    def status_path(self) -> Path:
        """The fleet status JSON the dashboard reads: next to a file storage, else in the cache."""
        if self.path is not None:
            return self.path.with_name(self.path.stem + ".fleet.json")
        digest = hashlib.sha1(self.url.encode()).hexdigest()[:12]
        return default_dir() / f"fleet-{digest}.json"

    def open(self) -> optuna.storages.BaseStorage:
        if self.kind == "journal":
            from optuna.storages import JournalStorage

            from agent.journal import RepairingJournalBackend

            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(RepairingJournalBackend(str(self.path)))
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        from sqlalchemy.exc import IntegrityError, ProgrammingError

        for attempt in range(SCHEMA_RACE_TRIES):
            try:
                return optuna.storages.RDBStorage(self.url, engine_kwargs=engine_kwargs(self))
            except (IntegrityError, ProgrammingError) as e:
                # Two processes creating the schema of a new database at once: one loses the
                # race on CREATE TABLE. PostgreSQL says so as a duplicate key in pg_type
                # (IntegrityError) or as DuplicateTable for alembic_version (ProgrammingError),
                # both seen in CI; the schema is there when it tries again.
                if not _lost_schema_race(e) or attempt == SCHEMA_RACE_TRIES - 1:
                    raise
                time.sleep(0.2 * (attempt + 1))
        raise AssertionError("unreachable")


# SQLSTATEs of a CREATE that another process's CREATE got to first: unique_violation,
# duplicate_table, duplicate_object.
_RACE_SQLSTATES = frozenset({"23505", "42P07", "42710"})


def _lost_schema_race(e: Exception) -> bool:
    """Whether a database error is another process's schema creation winning the race."""
    orig = getattr(e, "orig", None)
    if getattr(orig, "sqlstate", None) in _RACE_SQLSTATES:
        return True
    return "already exists" in str(orig)  # SQLite and drivers without SQLSTATE


def engine_kwargs(ref: StorageRef) -> dict:
    """SQLAlchemy engine options: SQLite waits on a locked file; a server connection is checked
    before use (a restarted database server does not fail the next write) and gives up on an
    unreachable host after CONNECT_TIMEOUT_S."""
    if ref.kind == "sqlite":
        return {"connect_args": {"timeout": 60}}
    if ref.url.startswith("postgresql"):
        return {"pool_pre_ping": True, "connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}
    return {"pool_pre_ping": True}


def default_dir() -> Path:
    """``<fleettune cache>/agent`` (the cache root is the parent of the models folder)."""
    from engine.checkpoints import cache_dir

    return cache_dir().parent / "agent"


def default_storage() -> StorageRef:
    return parse_storage(f"journal://{default_dir() / 'studies.journal'}")


def parse_storage(text: str | None) -> StorageRef:
    """A StorageRef for ``--storage`` (None: $FLEETTUNE_STORAGE, else the default journal).
    Raises StorageError for a scheme no storage serves."""
    if not text:
        text = os.environ.get(ENV, "").strip()
        if not text:
            return parse_storage(f"journal://{default_dir() / 'studies.journal'}")
    if text.startswith("journal://"):
        path = Path(text[len("journal://") :]).expanduser().resolve()
        return StorageRef(f"journal://{path}", "journal", path)
    if text.startswith("sqlite:///"):
        path = Path(text[len("sqlite:///") :]).expanduser().resolve()
        return StorageRef(f"sqlite:///{path}", "sqlite", path)
    if "://" in text:
        return StorageRef(_normalise_url(text), "rdb", None)
    path = Path(text).expanduser().resolve()
    if path.suffix in (".journal", ".log", ".jsonl"):
        return StorageRef(f"journal://{path}", "journal", path)
    return StorageRef(f"sqlite:///{path}", "sqlite", path)


def _normalise_url(text: str) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    scheme, rest = text.split("://", 1)
    if scheme == "sqlite":
        raise StorageError(f"--storage {scheme}://{rest}: a SQLite file is sqlite:///PATH")
    # SQLAlchemy's plain postgresql:// means psycopg2 before 2.1: name the driver we install.
    if scheme in ("postgresql", "postgres"):
        text = f"postgresql+psycopg://{rest}"
    try:
        make_url(text).get_dialect()
    except NoSuchModuleError:
        raise StorageError(f"--storage: unknown scheme {scheme}:// (use {SCHEMES})") from None
    except ArgumentError as e:
        raise StorageError(f"--storage: not a storage URL ({e})") from None
    except ImportError:
        pass  # the dialect exists, its driver is missing: check_storage names the package
    return text


def check_storage(ref: StorageRef, create: bool = True) -> bool:
    """Whether ``ref`` can be used, before anything else starts; creates nothing. With
    ``create`` (the agent) it must be writable or creatable; without (status) a file storage
    that does not exist is an error. Returns whether it already holds an Optuna storage."""
    if ref.kind == "rdb":
        return _check_rdb(ref, create)
    assert ref.path is not None
    path = ref.path
    if path.is_dir():
        raise StorageError(f"--storage {path} is a directory, not a {ref.kind} file")
    if not path.exists():
        if not create:
            raise StorageError(
                f"no storage at {path}: give the --storage an agent run used (nothing created)"
            )
        parent = path.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise StorageError(f"--storage {path}: cannot create it ({parent} is not writable)")
        return False
    if create and not os.access(path, os.W_OK):
        raise StorageError(f"--storage {path}: the file is not writable")
    if ref.kind == "journal":
        _check_journal(path)
    else:
        _check_sqlite(path)
    return path.stat().st_size > 0


def _check_journal(path: Path) -> None:
    try:
        with path.open("rb") as f:
            first = f.readline(1 << 20)
    except OSError as e:
        raise StorageError(f"--storage {path}: cannot read it ({e.strerror})") from None
    if not first.strip():
        return
    try:
        ok = "op_code" in json.loads(first)
    except (ValueError, TypeError):
        ok = False
    if not ok:
        raise StorageError(f"--storage {path} is not an Optuna journal (first line is not a log)")


def _check_sqlite(path: Path) -> None:
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError as e:
        raise StorageError(f"--storage {path}: cannot read it ({e.strerror})") from None
    if not head:
        return
    if head != b"SQLite format 3\x00":
        raise StorageError(f"--storage {path} is not a SQLite database")
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise StorageError(f"--storage {path}: not a usable SQLite database ({e})") from None
    finally:
        con.close()
    if tables and "studies" not in tables:
        raise StorageError(
            f"--storage {path} is a SQLite database of something else (no Optuna tables; "
            f"it has {', '.join(sorted(tables)[:5])})"
        )


def _check_rdb(ref: StorageRef, create: bool) -> bool:
    import sqlalchemy
    from sqlalchemy.engine import make_url

    url = make_url(ref.url)
    try:
        url.get_dialect().import_dbapi()
    except ImportError as e:
        module = (e.name or "").split(".")[0]
        package = DRIVER_PACKAGES.get(module, module or url.drivername)
        raise StorageError(
            f"--storage {url.drivername}://: its driver is not installed: pip install "
            f"'{package}' (for PostgreSQL: pip install -e '.[agent]')"
        ) from None
    engine = sqlalchemy.create_engine(url, **engine_kwargs(ref))
    try:
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
            names = set(sqlalchemy.inspect(conn).get_table_names())
            exists = "studies" in names
            if create and url.get_backend_name() == "postgresql":
                _check_pg_writable(conn, exists)
    except sqlalchemy.exc.DBAPIError as e:
        raise StorageError(f"--storage {ref.display}: cannot connect ({_first(e)})") from None
    finally:
        engine.dispose()
    return exists


def _check_pg_writable(conn: object, exists: bool) -> None:
    import sqlalchemy

    q = (
        "SELECT has_table_privilege('trials', 'INSERT') "
        "AND has_table_privilege('studies', 'UPDATE')"
        if exists
        else "SELECT has_schema_privilege(current_schema(), 'CREATE')"
    )
    if not conn.execute(sqlalchemy.text(q)).scalar():  # type: ignore[attr-defined]
        what = "write Optuna's tables" if exists else "create tables in its schema"
        raise StorageError(f"--storage: this database user cannot {what}")


def _first(e: BaseException) -> str:
    orig = getattr(e, "orig", None) or e
    text = str(orig).strip()
    return text.splitlines()[0][:300] if text else type(orig).__name__
