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
from agent.lease import KEY
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


def _experiment_file(tmp_path: Path, model: Path) -> Path:
    import tomli_w

    data = {
        "name": "down",
        "models": [str(model)],
        "backends": ["numpy"],
        "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 12}],
        "validate": {"random_prompts": [1, 9], "steps": 1},
        "bench": {"pairs": 2, "warmup": 1},
        "budget": {"trials": 1, "trial_timeout_s": 120},
        "sampler": {"name": "grid", "seed": 0},
        "space": {"numpy": {"prefill": {"chunk_tokens": [8, 16]}}},
    }
    path = tmp_path / "down.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def test_a_storage_that_fails_mid_run_is_retried_then_one_line_and_the_result_kept(
    tiny_model_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    """The journal's disk fills once the baseline trial is measured: the agent tries again with
    backoff, then ends with one line naming the storage (exit 2, no traceback); the measured
    trial is kept aside and the next run, with space free, records it instead of running it
    again as interrupted."""
    from agent import storage_retry
    from agent.cli import main
    from agent.study import StudyState

    monkeypatch.setattr(storage_retry, "RETRY_DELAYS_S", (0.01, 0.02))
    journal_path = tmp_path / "s.journal"
    real_append = journal.RepairingJournalBackend.append_logs
    full: list[bool] = []

    def append(self: journal.RepairingJournalBackend, logs: list) -> None:
        if full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_append(self, logs)

    real_finish = StudyState.finish

    def finish(self: StudyState, trial: optuna.Trial, record, values) -> None:  # noqa: ANN001
        real_finish(self, trial, record, values)
        full.append(True)  # the disk fills as the first measured trial is to be written

    monkeypatch.setattr(journal.RepairingJournalBackend, "append_logs", append)
    monkeypatch.setattr(StudyState, "finish", finish)
    exp = _experiment_file(tmp_path, tiny_model_path)
    argv = ["run", str(exp), "--local", "--storage", str(journal_path), "--no-promote"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: storage journal://{journal_path} failed 3 times"), err
    assert "No space left on device" in last and "kept in" in last

    monkeypatch.setattr(StudyState, "finish", real_finish)
    full.clear()
    storage = parse_storage(str(journal_path)).open()
    (name,) = optuna.get_all_study_names(storage)
    # The lease the first run could not release: a new process finds its holder dead; this one
    # (same pid) would not, so it is cleared as that finding would.
    storage.set_study_system_attr(storage.get_study_id_from_name(name), KEY, None)
    assert main(argv) == 0
    study = optuna.load_study(study_name=name, storage=parse_storage(str(journal_path)).open())
    first = study.trials[0]
    assert first.state is optuna.trial.TrialState.COMPLETE
    assert first.user_attrs["outcome"] == "ok" and first.user_attrs["role"] == "baseline"
    assert all(t.user_attrs.get("outcome") != "interrupted" for t in study.trials)


def test_postgres_stopped_mid_run_is_retried_through_a_restart_then_one_line() -> None:
    """``pg_ctl stop -m immediate`` under the agent's storage: a restart within the backoff
    costs nothing; a server that stays down is one StorageDown naming the storage (password
    masked), and every later call fails at once instead of waiting out the backoff again."""
    import threading
    import time

    from agent.storage_retry import StorageDown, retrying
    from tests.pg import PostgresServer

    server = PostgresServer().start()  # its own: the session's server must stay up
    try:
        url = server.create_database().replace("postgres@", "postgres:s3cr3t@")
        ref = parse_storage(url)
        storage = ref.open()
        study = optuna.create_study(study_name="s", storage=storage)
        retrier = retrying(storage, ref.display, delays=(0.3, 0.6, 1.2, 2.4, 4.8))
        server.pause()
        threading.Timer(0.5, server.resume).start()
        study.set_user_attr("after", 1)  # tried again until the server is back
        assert study.user_attrs == {"after": 1} and retrier.down is None

        retrier.delays = (0.05, 0.05)
        server.pause()
        with pytest.raises(StorageDown) as e:
            study.set_user_attr("lost", 2)
        line = str(e.value)
        assert line.startswith("storage postgresql+psycopg://postgres:***@127.0.0.1:")
        assert "failed 3 times" in line and "s3cr3t" not in line and "\n" not in line
        t0 = time.monotonic()
        with pytest.raises(StorageDown):
            study.user_attrs  # noqa: B018 - a read, down at once
        assert time.monotonic() - t0 < 0.05
    finally:
        server.stop()


def test_what_counts_as_a_storage_outage() -> None:
    """A full disk, a journal made immutable (chattr +i: EPERM) or read-only, a server gone
    (Optuna wraps SQLAlchemy's OperationalError in StorageInternalError) are outages, retried;
    a bug or bad data is not."""
    import sqlalchemy.exc

    from agent.storage_retry import outage

    assert outage(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device"
    assert outage(PermissionError(errno.EPERM, "Operation not permitted"))
    assert outage(OSError(errno.EROFS, "Read-only file system"))
    refused = sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))
    try:
        try:
            raise refused
        except sqlalchemy.exc.OperationalError as e:
            raise optuna.exceptions.StorageInternalError("commit failed") from e
    except optuna.exceptions.StorageInternalError as wrapped:
        assert outage(wrapped) == "connection refused"
    assert outage(ValueError("bad value")) is None
    assert outage(FileNotFoundError(errno.ENOENT, "gone")) is None
