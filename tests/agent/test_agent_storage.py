"""--storage checks (scheme, driver, reachable, writable, is it a database) and the per-study
lease, on a journal file, SQLite and a real PostgreSQL server (tests/pg.py)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import optuna
import pytest

from agent.cli import main
from agent.lease import (
    KEY,
    TAKE_OVER,
    WAIT,
    Holder,
    LeaseHeld,
    Leases,
    holder_of,
    pid_namespace,
)
from agent.storage import StorageError, check_storage, parse_storage

ROOT = Path(__file__).resolve().parents[2]
EXP = ROOT / "experiments" / "quickstart.toml"


@pytest.fixture(params=["journal", "sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "journal":
        return str(tmp_path / "s.journal")
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 's.db'}"
    return request.getfixturevalue("pg_url")


# --- --storage checks -------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text, words",
    [
        ("mongodb://h/db", "unknown scheme mongodb://"),
        ("sqlite://rel.db", "sqlite:///PATH"),
    ],
)
def test_unknown_schemes_are_one_line(text: str, words: str) -> None:
    with pytest.raises(StorageError, match=words):
        parse_storage(text)


def test_postgresql_urls_name_the_driver_we_install() -> None:
    assert parse_storage("postgresql://u@h/db").url == "postgresql+psycopg://u@h/db"
    assert parse_storage("postgres://u@h/db").url == "postgresql+psycopg://u@h/db"
    ref = parse_storage("postgresql+psycopg2://u:secret@h/db")
    assert "secret" not in ref.display and ref.url.endswith("u:secret@h/db")


def test_env_var_names_the_default_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETTUNE_STORAGE", "postgresql://fleet@db/tune")
    assert parse_storage(None).url == "postgresql+psycopg://fleet@db/tune"


def test_missing_driver_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg2", None)  # import psycopg2 -> ImportError
    with pytest.raises(StorageError, match=r"pip install 'psycopg2-binary'"):
        check_storage(parse_storage("postgresql+psycopg2://u@127.0.0.1:1/db"))


def test_unreachable_server_is_one_line() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StorageError, match="cannot connect") as e:
        check_storage(parse_storage(f"postgresql://u:pw@127.0.0.1:{port}/db"))
    assert "pw" not in str(e.value) and "\n" not in str(e.value)


def test_files_that_are_not_storages(tmp_path: Path) -> None:
    text = tmp_path / "notes.db"
    text.write_text("hello\n")
    with pytest.raises(StorageError, match="not a SQLite database"):
        check_storage(parse_storage(str(text)))
    other = tmp_path / "other.db"
    subprocess.run(
        [
            "python3",
            "-c",
            f"import sqlite3; sqlite3.connect('{other}').execute('create table x (a)')",
        ],
        check=True,
    )
    with pytest.raises(StorageError, match="database of something else"):
        check_storage(parse_storage(str(other)))
    journal = tmp_path / "j.journal"
    journal.write_text("not json\n")
    with pytest.raises(StorageError, match="not an Optuna journal"):
        check_storage(parse_storage(str(journal)))
    with pytest.raises(StorageError, match="is a directory"):
        check_storage(parse_storage(str(tmp_path)))
    with pytest.raises(StorageError, match="cannot create it"):
        check_storage(parse_storage(str(text / "under-a-file.db")))


def test_storage_kinds_check_and_report_whether_they_exist(storage_url: str) -> None:
    ref = parse_storage(storage_url)
    assert check_storage(ref) is False
    if ref.path is not None:  # status of a storage that does not exist yet: an error
        with pytest.raises(StorageError, match="no storage at"):
            check_storage(ref, create=False)
    optuna.create_study(study_name="s", storage=ref.open())
    assert check_storage(ref) is True and check_storage(ref, create=False) is True


def test_postgres_user_without_rights_is_refused(pg_server, pg_url: str) -> None:  # noqa: ANN001
    import psycopg

    db = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(
        f"host=127.0.0.1 port={pg_server.port} user=postgres dbname={db}", autocommit=True
    ) as c:
        c.execute("CREATE ROLE reader LOGIN")
        c.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    with pytest.raises(StorageError, match="cannot create tables"):
        check_storage(parse_storage(f"postgresql://reader@127.0.0.1:{pg_server.port}/{db}"))


def test_cli_rejects_a_bad_storage_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import ray

    bad = tmp_path / "notes.db"
    bad.write_text("hello\n")
    assert main(["run", str(EXP), "--storage", str(bad), "--no-promote"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "not a SQLite database" in err and "\n" not in err
    assert not ray.is_initialized()
    assert bad.read_text() == "hello\n"


def test_status_of_a_typo_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_url: str
) -> None:
    typo = tmp_path / "sudies.db"
    assert main(["status", "--storage", str(typo)]) == 2
    assert "no storage at" in capsys.readouterr().err and not typo.exists()
    assert main(["status", "--storage", pg_url]) == 0  # reachable, empty: no tables made
    assert "no studies" in capsys.readouterr().out
    assert check_storage(parse_storage(pg_url), create=False) is False


# --- the lease ----------------------------------------------------------------------------------
def test_second_agent_is_refused_naming_the_holder(storage_url: str) -> None:
    storage = parse_storage(storage_url).open()
    a = Leases(storage, "expA", ttl_s=30)
    a.acquire(["s1", "s2"], ["maximize"])
    b = Leases(parse_storage(storage_url).open(), "expB", ttl_s=30)
    with pytest.raises(LeaseHeld) as e:
        b.acquire(["s2"], ["maximize"])
    import os
    import socket

    msg = str(e.value)
    assert f"host {socket.gethostname()} pid {os.getpid()} since" in msg and "expA" in msg
    b.acquire(["s3"], ["maximize"])  # another study of the same storage: free
    from agent.status import study_rows

    rows = {r.study: r for r in study_rows(parse_storage(storage_url))}
    assert "in use by host" in rows["s2"].text() and rows["s2"].lease["experiment"] == "expA"
    a.release()
    b.acquire(["s2"], ["maximize"])  # released on exit: taken at once
    sid = storage.get_study_id_from_name("s1")
    assert holder_of(storage, sid) is None
    b.release()


def test_expired_or_dead_holder_is_taken_over(storage_url: str) -> None:
    storage = parse_storage(storage_url).open()
    sid = optuna.create_study(study_name="s", storage=storage)._study_id
    now = time.time()
    # agent, host, pid, experiment, since, heartbeat, expires (pidns unknown)
    stale = asdict(Holder("x", "elsewhere", 1, "e", now - 99, now - 99, now - 1))
    storage.set_study_system_attr(sid, KEY, stale)
    a = Leases(storage, "e", ttl_s=30)
    a.acquire(["s"], ["maximize"])
    assert holder_of(storage, sid).agent == a.agent
    assert holder_of(storage, sid).pidns == pid_namespace() != ""
    a.release()
    gone = subprocess.Popen(["true"])
    gone.wait()
    import socket

    here = {**stale, "host": socket.gethostname(), "pid": gone.pid, "expires": now + 999}
    # The same hostname in another PID namespace (a container sharing it): the pid says nothing.
    storage.set_study_system_attr(sid, KEY, {**here, "pidns": "other-boot:1"})
    with pytest.raises(LeaseHeld):
        Leases(storage, "e", ttl_s=30).acquire(["s"], ["maximize"])
    storage.set_study_system_attr(sid, KEY, {**here, "pidns": pid_namespace()})
    b = Leases(storage, "e", ttl_s=30)
    b.acquire(["s"], ["maximize"])
    assert holder_of(storage, sid).agent == b.agent
    b.release()


@pytest.mark.parametrize("storage_url", ["journal", "postgresql"], indirect=True)
def test_take_over_stops_the_live_holder_and_wait_waits(storage_url: str) -> None:
    storage = parse_storage(storage_url).open()
    a = Leases(storage, "e", ttl_s=3)
    a.acquire(["s"], ["maximize"])
    a.start()
    b = Leases(parse_storage(storage_url).open(), "e", ttl_s=3, mode=TAKE_OVER)
    b.acquire(["s"], ["maximize"])
    assert "taken over by host" in a.lost  # noticed before b went on
    a.release()
    sid = storage.get_study_id_from_name("s")
    assert holder_of(storage, sid).agent == b.agent  # a's release left b's lease alone
    c = Leases(parse_storage(storage_url).open(), "e", ttl_s=3, mode=WAIT)
    b.start()
    threading.Timer(4.0, b.release).start()
    t0 = time.monotonic()
    c.acquire(["s"], ["maximize"])  # b renews past its ttl: only its release frees it
    assert time.monotonic() - t0 >= 3.9 and holder_of(storage, sid).agent == c.agent
    c.release()


def test_agent_whose_lease_is_taken_over_stops_without_writing(
    tiny_model_path: Path, pg_url: str
) -> None:
    """The agent loop itself: once another agent takes its study over, it stops with LeaseLost
    (exit 2 from the CLI) and writes no trial after that; the new holder owns the study."""
    import ray

    from agent.experiment import parse_experiment
    from agent.lease import LeaseLost
    from agent.loop import RunOptions, run_experiment

    exp = parse_experiment(
        {
            "name": "lease",
            "models": [str(tiny_model_path)],
            "backends": ["numpy"],
            "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 24}],
            "validate": {"random_prompts": [1], "steps": 1},
            "bench": {"pairs": 200, "warmup": 0},
            "budget": {"trials": 8, "trial_timeout_s": 60},
            "sampler": {"name": "random", "seed": 1},
        }
    )
    storage = parse_storage(pg_url).open()
    taken: dict[str, object] = {}

    def take_over() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
            done = names and any(
                t.state.is_finished()
                for t in optuna.load_study(study_name=names[0], storage=storage).trials
            )
            if done:
                new = Leases(storage, "lease", ttl_s=2, mode=TAKE_OVER)
                new.acquire(names, ["maximize"])
                taken["at"] = time.time()
                taken["name"] = names[0]
                taken["agent"] = new.agent  # held without heartbeat: never released
                return
            time.sleep(0.2)

    thread = threading.Thread(target=take_over)
    thread.start()
    try:
        with pytest.raises(LeaseLost, match="taken over by host"):
            run_experiment(exp, RunOptions(parse_storage(pg_url), promote=False, lease_ttl_s=2))
    finally:
        thread.join()
        if ray.is_initialized():
            ray.shutdown()
    study = optuna.load_study(study_name=str(taken["name"]), storage=storage)
    at = float(taken["at"])  # type: ignore[arg-type]
    late = [t for t in study.trials if t.datetime_complete and t.datetime_complete.timestamp() > at]
    assert late == []  # nothing written by the old holder after the take-over settled
    assert holder_of(storage, study._study_id).agent == taken["agent"]
    assert sum(t.user_attrs.get("outcome") == "ok" for t in study.trials) < 8


class _PgError(Exception):
    """A DBAPI error as psycopg raises it: the SQLSTATE on the exception."""

    def __init__(self, sqlstate: str, text: str) -> None:
        super().__init__(text)
        self.sqlstate = sqlstate


@pytest.mark.parametrize(
    "error, orig",
    [
        ("IntegrityError", _PgError("23505", 'duplicate key value violates "pg_type_typname"')),
        ("ProgrammingError", _PgError("42P07", 'relation "alembic_version" already exists')),
        ("IntegrityError", Exception("table alembic_version already exists")),  # no SQLSTATE
    ],
)
def test_open_tries_again_after_losing_the_schema_race(tmp_path, monkeypatch, error, orig) -> None:
    """A new database whose schema another process is creating at the same moment: the loser's
    CREATE TABLE fails (PostgreSQL, both seen in CI: a duplicate key in pg_type, or
    DuplicateTable for alembic_version); open tries again. Any other error is raised at once."""
    import optuna
    import sqlalchemy.exc

    from agent import storage as S

    cls = getattr(sqlalchemy.exc, error)
    real, calls = optuna.storages.RDBStorage, []

    def racing(url, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(url)
        if len(calls) == 1:
            raise cls("CREATE TABLE alembic_version", {}, orig)
        return real(url, **kw)

    monkeypatch.setattr(optuna.storages, "RDBStorage", racing)
    ref = S.parse_storage(f"sqlite:///{tmp_path}/s.db")
    assert ref.open() is not None and len(calls) == 2
    calls.clear()
    monkeypatch.setattr(S, "SCHEMA_RACE_TRIES", 1)
    with pytest.raises(cls):
        ref.open()


def test_open_raises_a_schema_error_that_is_no_race_at_once(tmp_path, monkeypatch) -> None:
    import optuna
    from sqlalchemy.exc import ProgrammingError

    from agent import storage as S

    calls = []

    def denied(url, **kw):  # noqa: ANN001, ANN003, ANN202
        calls.append(url)
        raise ProgrammingError("CREATE TABLE studies", {}, _PgError("42501", "permission denied"))

    monkeypatch.setattr(optuna.storages, "RDBStorage", denied)
    with pytest.raises(ProgrammingError):
        S.parse_storage(f"sqlite:///{tmp_path}/s.db").open()
    assert len(calls) == 1
