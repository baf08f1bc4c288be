"""Optuna's journal file, made to survive a write cut short (a full disk, a killed process).

Optuna's ``JournalFileBackend`` (5.x) reads past a torn last line (one with no newline), but its
next append lands on the end of that line: the torn record and the new one become one line that
is not JSON, and every later read raises ``JSONDecodeError``. ``RepairingJournalBackend``:

- an append that fails (ENOSPC, EIO) truncates the file back to where it began, under the lock;
- before each append, and when opened, a torn last line is dropped, with a logged line (the write
  that tore it failed, so Optuna never applied that record);
- when opened, a line made of a torn record and a whole one glued to it (a journal written before
  this repair) keeps the whole record; a line that cannot be salvaged is one clear error.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal._file import get_lock_file

from engine.errors import EngineError

log = logging.getLogger("agent.storage")

RECORD_START = b'{"op_code":'  # how Optuna writes every record (json.dumps, compact separators)


class JournalDamaged(EngineError):
    """A journal line that is not a record and cannot be salvaged."""


class RepairingJournalBackend(JournalFileBackend):
    """A ``JournalFileBackend`` that never appends after a torn line and repairs one it finds."""

    def __init__(self, file_path: str) -> None:
        super().__init__(file_path)
        glued, torn = self._damage()
        if glued or torn:  # the lock only then: a reader of a read-only journal takes none
            with get_lock_file(self._lock):
                self._repair_glued()
                self._drop_torn_tail()

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        data = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in logs).encode()
        with get_lock_file(self._lock):
            self._drop_torn_tail()
            fd = os.open(self._file_path, os.O_WRONLY | os.O_APPEND)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                try:
                    view = memoryview(data)
                    while view:  # unbuffered: nothing is left to flush once a write fails
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                except BaseException:
                    os.ftruncate(fd, start)  # shrinking needs no free space
                    raise
            finally:
                os.close(fd)

    def _damage(self) -> tuple[bool, bool]:
        """(a line with a record glued after a torn one, a torn last line), read without lock."""
        glued = False
        with open(self._file_path, "rb") as f:
            line = b""
            for line in f:
                if line.endswith(b"\n") and _suspect(line):
                    glued = glued or not _is_record(line)
        return glued, bool(line) and not line.endswith(b"\n")

    def _drop_torn_tail(self) -> None:
        """Cut a last line that has no newline (the caller holds the lock)."""
        with open(self._file_path, "r+b") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return
            f.seek(size - 1)
            if f.read(1) == b"\n":
                return
            keep = _last_newline_end(f, size)
            f.truncate(keep)
            os.fsync(f.fileno())
        log.warning(
            "journal %s: dropped a torn last record (%d bytes, a write cut short: full disk or "
            "killed process); that write had failed, so nothing recorded is lost",
            self._file_path,
            size - keep,
        )

    def _repair_glued(self) -> None:
        """Salvage lines where a torn record has a whole one glued after it (the caller holds
        the lock). Rewrites the file only when there is such a line: no reader has an offset
        past it (Optuna's reader stops at the first line it cannot decode)."""
        with open(self._file_path, "rb") as f:
            lines = f.readlines()
        fixed, dropped = [], 0
        for number, line in enumerate(lines):
            if not line.endswith(b"\n") or not _suspect(line) or _is_record(line):
                fixed.append(line)
                continue
            at = line.rfind(RECORD_START)
            if at <= 0 or not _is_record(line[at:]):
                raise JournalDamaged(
                    f"journal {self._file_path}: line {number + 1} is not an Optuna record and "
                    "holds none to salvage; move the file aside to start over, or cut that line"
                )
            fixed.append(line[at:])
            dropped += 1
        if not dropped:
            return
        tmp = f"{self._file_path}.repair.tmp"
        try:
            with open(tmp, "wb") as f:
                f.writelines(fixed)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self._file_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        log.warning(
            "journal %s: repaired %d line(s) where a torn record had the next one glued to it "
            "(a write cut short before this repair existed); the torn records were never applied",
            self._file_path,
            dropped,
        )


def _suspect(line: bytes) -> bool:
    """Whether a line may not be one record: Optuna starts each with RECORD_START, which cannot
    occur inside a JSON string (its quotes would be escaped)."""
    return not line.startswith(RECORD_START) or line.find(RECORD_START, 1) >= 0


def _is_record(line: bytes) -> bool:
    try:
        entry = json.loads(line)
    except ValueError:
        return False
    return isinstance(entry, dict) and "op_code" in entry


def _last_newline_end(f: Any, size: int) -> int:
    """The offset just past the last newline before ``size`` (0 when there is none)."""
    pos, block = size, 1 << 16
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        chunk = f.read(pos - start)
        at = chunk.rfind(b"\n")
        if at >= 0:
            return start + at + 1
        pos = start
    return 0
