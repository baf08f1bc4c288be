"""Where studies live: an Optuna storage URL, and the fleet status file next to it.

Accepted ``--storage`` values:
  ``journal:///path/studies.journal``  an Optuna journal file (the default, under the cache:
                                       agent/studies.journal); a bare ``*.journal`` path too
  ``sqlite:///path/studies.db``        SQLite; a bare path with another suffix too
  ``postgresql://user@host/db``        PostgreSQL (and any other SQLAlchemy URL), for a fleet

The journal is the default because it is the cheapest on the agent's critical path: on a 2-core
machine, ask ~3-25 ms and a trial's record ~15 ms, against ~25-110 ms and ~100 ms for SQLite
(docs/BENCHMARKS.md, Agent).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import optuna


@dataclass(frozen=True)
class StorageRef:
    url: str  # as given or normalized: sqlite:///..., journal:///..., postgresql://...
    kind: str  # "sqlite", "journal" or "rdb"
    path: Path | None  # the file for sqlite and journal storages

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
            from optuna.storages.journal import JournalFileBackend

            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(self.path)))
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.RDBStorage(
            self.url, engine_kwargs={"connect_args": {"timeout": 60}} if self.path else None
        )


def default_dir() -> Path:
    """``<fleettune cache>/agent`` (the cache root is the parent of the models folder)."""
    from engine.checkpoints import cache_dir

    return cache_dir().parent / "agent"


def default_storage() -> StorageRef:
    return parse_storage(f"journal://{default_dir() / 'studies.journal'}")


def parse_storage(text: str | None) -> StorageRef:
    if not text:
        return default_storage()
    if text.startswith("journal://"):
        path = Path(text[len("journal://") :]).expanduser().resolve()
        return StorageRef(f"journal://{path}", "journal", path)
    if text.startswith("sqlite:///"):
        path = Path(text[len("sqlite:///") :]).expanduser().resolve()
        return StorageRef(f"sqlite:///{path}", "sqlite", path)
    if "://" in text:
        return StorageRef(text, "rdb", None)
    path = Path(text).expanduser().resolve()
    if path.suffix in (".journal", ".log", ".jsonl"):
        return StorageRef(f"journal://{path}", "journal", path)
    return StorageRef(f"sqlite:///{path}", "sqlite", path)
