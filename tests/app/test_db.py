"""Read-only and writing transactions on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from app.accounts.models import LoginFailure
from app.db import _WriterQueue, begin_reading, begin_writing, make_engine, make_sessionmaker


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_engine(database_url, pool_size=4)
    yield engine
    engine.dispose()


def failures(engine: Engine) -> int:
    with make_sessionmaker(engine)() as db:
        return db.scalar(select(func.count()).select_from(LoginFailure)) or 0


def test_read_only_sessions_refuse_writes(engine: Engine) -> None:
    with make_sessionmaker(engine, writes=False)() as db:
        db.add(LoginFailure(email="reader@example.org"))
        with pytest.raises(DBAPIError):
            db.flush()
    assert failures(engine) == 0


def test_begin_writing_turns_a_read_into_a_write(engine: Engine) -> None:
    with make_sessionmaker(engine, writes=False)() as db:
        assert db.scalar(select(func.count()).select_from(LoginFailure)) == 0
        begin_writing(db)
        db.add(LoginFailure(email="writer@example.org"))
        db.commit()
    assert failures(engine) == 1


def test_begin_reading_makes_one_transaction_read_only(engine: Engine) -> None:
    with make_sessionmaker(engine)() as db:
        begin_reading(db)
        db.add(LoginFailure(email="reader@example.org"))
        with pytest.raises(DBAPIError):
            db.flush()
        db.rollback()
        db.add(LoginFailure(email="writer@example.org"))  # the next one writes again
        db.commit()
    assert failures(engine) == 1


def test_sqlite_readers_do_not_wait_for_the_writer(sqlite_template: Path, tmp_path: Path) -> None:
    # SQLite's single write lock: PostgreSQL has no such thing to wait for
    path = str(tmp_path / "nebula.db")
    Path(path).write_bytes(sqlite_template.read_bytes())
    engine = make_engine(f"sqlite:///{path}", pool_size=4)
    writer = sqlite3.connect(path, isolation_level=None, timeout=0)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO login_failures (id, email, at) VALUES ('x', 'w@example.org', 0)")
    try:
        # a reader that asked for the write lock would wait out busy_timeout and fail
        with make_sessionmaker(engine, writes=False)() as db:
            assert db.scalar(select(func.count()).select_from(LoginFailure)) == 0
    finally:
        writer.execute("ROLLBACK")
        writer.close()
        engine.dispose()


def test_sqlite_writers_queue_across_processes(tmp_path: Path) -> None:
    # two queues on one database stand for two processes: flock excludes open files
    first, second = (
        _WriterQueue(str(tmp_path / "nebula.db")),
        _WriterQueue(str(tmp_path / "nebula.db")),
    )
    assert first.acquire(1.0)
    assert not second.acquire(0.05)
    first.release()
    assert second.acquire(1.0)
    second.release()
