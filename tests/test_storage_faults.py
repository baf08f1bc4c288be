"""Storage faults: a journal whose last write was cut short (a full disk, a killed process), the
fleet status file's temp files, and a storage that fails mid-run."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import optuna
import pytest

from agent import fleet, journal
from agent.journal import JournalDamaged
from agent.storage import parse_storage


def _journal_with_a_study(path: Path) -> None:
    study = optuna.create_study(study_name="s", storage=parse_storage(str(path)).open())
    study.set_user_attr("kept", 1)
    study.enqueue_trial({"x": 1})


def _reread(path: Path) -> optuna.Study:
    return optuna.load_study(study_name="s", storage=parse_storage(str(path)).open())


def test_a_torn_last_line_is_dropped_and_the_next_run_appends_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's repro without a tmpfs: the journal ends in half a record. Optuna's own backend
    appended the next run's first record onto it and every read after raised JSONDecodeError."""
    path = tmp_path / "f.journal"
    _journal_with_a_study(path)
    with path.open("ab") as f:
        f.write(b'{"op_code":9,"worker_id":"w","study_id":0,"user_at')  # cut by ENOSPC
    with caplog.at_level(logging.WARNING, "agent.storage"):
        study = _reread(path)
    assert any("torn last record" in r.getMessage() for r in caplog.records)
    study.set_user_attr("after", 2)  # the next run's first write
    assert path.read_bytes().endswith(b"\n")
    assert _reread(path).user_attrs == {"kept": 1, "after": 2}


def test_a_journal_damaged_before_the_repair_is_salvaged(tmp_path: Path) -> None:
    """A journal already hit by the bug: a torn record with the next run's record glued to it."""
    path = tmp_path / "f.journal"
    _journal_with_a_study(path)
    good = b'{"op_code":2,"worker_id":"w","study_id":0,"user_attr":{"after":2}}\n'
    more = b'{"op_code":2,"worker_id":"w","study_id":0,"user_attr":{"more":3}}\n'
    with path.open("ab") as f:
        f.write(b'{"op_code":2,"worker_id":"w","study_id":0,"user_at' + good + more)
    with pytest.raises(ValueError):  # what Optuna's own backend does with it
        optuna.load_study(
            study_name="s",
            storage=optuna.storages.JournalStorage(
                optuna.storages.journal.JournalFileBackend(str(path))
            ),
        )
    assert _reread(path).user_attrs == {"kept": 1, "after": 2, "more": 3}
    path.write_bytes(path.read_bytes() + b"garbage\n")
    with pytest.raises(JournalDamaged, match="line 6 is not an Optuna record"):
        _reread(path)


def test_an_append_that_hits_a_full_disk_leaves_no_torn_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC half way through a record: the write fails, the file is cut back to where it was,
    and once space is free the storage is whole."""
    path = tmp_path / "f.journal"
    _journal_with_a_study(path)
    before = path.read_bytes()
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:
        n = real_write(fd, bytes(data[: len(data) // 2]))
        monkeypatch.setattr(journal.os, "write", full)
        return n

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    storage = parse_storage(str(path)).open()
    study = optuna.load_study(study_name="s", storage=storage)
    monkeypatch.setattr(journal.os, "write", half_then_full)
    with pytest.raises(OSError, match="No space"):
        study.set_user_attr("lost", "x" * 200)
    assert path.read_bytes() == before
    monkeypatch.setattr(journal.os, "write", real_write)
    study.set_user_attr("after", 2)
    assert _reread(path).user_attrs == {"kept": 1, "after": 2}


def test_status_writes_leave_no_temp_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A status write cut short removes its temp file; one left by a dead writer is removed."""
    status = tmp_path / "f.fleet.json"

    def full(self: Path, text: str) -> int:
        Path.write_bytes(self, text.encode()[:10])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError):
        fleet.write_status(status, {"agent": {}})
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []
    dead = tmp_path / f".{status.name}.999999999.tmp"
    mine = tmp_path / f".{status.name}.{os.getpid()}.tmp"
    dead.write_text("{")
    mine.write_text("{")
    assert fleet.remove_stale_temps(status) == [dead]
    assert not dead.exists() and mine.exists()
