"""Database engine, sessions and the declarative base shared by every domain."""

from __future__ import annotations

import enum
import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Generic, TypeVar

from sqlalchemy import (
    ColumnElement,
    DateTime,
    Enum,
    MetaData,
    String,
    bindparam,
    create_engine,
    event,
    func,
    inspect,
    select,
)
from sqlalchemy.engine import Dialect, Engine, make_url
from sqlalchemy.orm import DeclarativeBase, Session, mapped_column, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    """The current time, timezone-aware UTC, at microsecond precision."""
    return datetime.now(UTC)


def new_id() -> str:
    """A fresh opaque identifier."""
    return str(uuid.uuid4())


class UTCDateTime(TypeDecorator[datetime]):
    """Stores naive UTC, returns aware UTC: the same value on SQLite and PostgreSQL."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not accepted; use UTC-aware ones")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


class Base(DeclarativeBase):
    """Base of every ORM model."""

    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    # an enum column holds the member's name as a short string, not a database enum type
    type_annotation_map = {
        datetime: UTCDateTime(),
        str: String(255),
        enum.Enum: Enum(enum.Enum, native_enum=False, length=16),
    }


# The columns most tables have, declared once: `id: Mapped[NewId]`, `created_at: Mapped[CreatedAt]`.
NewId = Annotated[str, mapped_column(String(36), primary_key=True, default=new_id)]
CreatedAt = Annotated[datetime, mapped_column(default=utcnow)]


# The execution option that says whether a connection's transactions may write.
ACCESS = "nebula_access"
READ, WRITE = "read", "write"
# How long a writer waits for SQLite's write lock, in seconds (as busy_timeout does).
SQLITE_WRITE_WAIT_S = 30.0
_HOLDS_WRITE_LOCK = "nebula_holds_write_lock"
_QUERY_ONLY = "nebula_query_only"


def access_options(dialect: str, *, writes: bool) -> dict[str, Any]:
    """Execution options for transactions that may write, or that only read."""
    options: dict[str, Any] = {ACCESS: WRITE if writes else READ}
    if dialect == "postgresql":
        options["postgresql_readonly"] = not writes  # BEGIN READ ONLY: a write fails loudly
    return options


def _writes(conn: Any) -> bool:
    # Anything not marked read-only may write: the safe default for the reaper, the CLI, tasks.
    return bool(conn.get_execution_options().get(ACCESS, WRITE) == WRITE)


class _WriterQueue:
    """SQLite's writers, one at a time: threads queue on a lock, processes on a file lock.

    Waiters wake within a couple of milliseconds of the lock's release, where SQLite's
    own busy handler sleeps in steps of up to 100 ms.
    """

    def __init__(self, database: str | None) -> None:
        self._threads = threading.Lock()
        self._fd: int | None = None
        if database and database != ":memory:" and not database.startswith("file:"):
            self._fd = os.open(f"{database}-writer", os.O_RDWR | os.O_CREAT, 0o600)

    def acquire(self, timeout_s: float) -> bool:
        """Whether this thread is now the writer (False after `timeout_s`)."""
        deadline = time.monotonic() + timeout_s
        if not self._threads.acquire(timeout=timeout_s):
            return False
        if self._fd is None:
            return True
        pause = 0.0002
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() > deadline:
                    self._threads.release()
                    return False
                time.sleep(pause)  # another process writes; its transactions last milliseconds
                pause = min(pause * 2, 0.002)

    def release(self) -> None:
        """Let the next writer in."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._threads.release()


def _sqlite_engine(url: str, *, pool_size: int | None) -> Engine:
    pool: dict[str, Any] = {} if pool_size is None else {"pool_size": pool_size, "max_overflow": 0}
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, **pool)
    writers = _WriterQueue(make_url(url).database)

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        cur.close()

    @event.listens_for(engine, "begin")
    def _sqlite_begin(conn: Any) -> None:
        # straight to the driver: these run twice a request, and the statement layer
        # costs more than SQLite does
        driver = conn.connection.driver_connection
        writes = _writes(conn)
        if conn.info.get(_QUERY_ONLY) != (not writes):
            # query_only makes a stray write in a read-only transaction an error
            driver.execute(f"PRAGMA query_only={0 if writes else 1}")
            conn.info[_QUERY_ONLY] = not writes
        if not writes:
            # WAL readers see a snapshot and never wait for the writer
            driver.execute("BEGIN")
            return
        # Writers take the write lock up front: read-then-write transactions (the audit
        # chain, quotas) are serialized instead of failing on lock upgrade.
        if not writers.acquire(SQLITE_WRITE_WAIT_S):
            raise TimeoutError("the database's write lock stayed busy")
        conn.info[_HOLDS_WRITE_LOCK] = True
        try:
            driver.execute("BEGIN IMMEDIATE")
        except BaseException:
            _release(conn.info)
            raise

    def _release(info: dict[Any, Any]) -> None:
        if info.pop(_HOLDS_WRITE_LOCK, False):
            writers.release()

    @event.listens_for(engine, "commit")
    @event.listens_for(engine, "rollback")
    def _transaction_ended(conn: Any) -> None:
        _release(conn.info)

    @event.listens_for(engine, "checkin")
    def _returned(_dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        # a transaction abandoned without commit or rollback (an invalidated connection)
        _release(record.info)

    return engine


def make_engine(url: str, *, pool_size: int | None = None) -> Engine:
    """An engine for `url`; SQLite gets WAL, foreign keys and one writer at a time.

    `pool_size` connections and no overflow when given: the server sizes its pool to its
    thread pool, so that no request waits for a connection.
    """
    if url.startswith("sqlite"):
        return _sqlite_engine(url, pool_size=pool_size)
    if pool_size is None:
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)
    return create_engine(url, pool_pre_ping=True, pool_size=pool_size, max_overflow=0)


def make_sessionmaker(engine: Engine, *, writes: bool = True) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit.

    `writes=False`: every transaction is read-only (SQLite: no write lock taken, and any
    write is refused; PostgreSQL: READ ONLY) unless `begin_writing` says otherwise.
    """
    options = {} if writes else access_options(engine.dialect.name, writes=False)
    return sessionmaker(bind=engine, expire_on_commit=False, execution_options=options)


def _in_writing_transaction(db: Session) -> bool:
    return db.in_transaction() and _writes(db.connection())


def begin_reading(db: Session) -> None:
    """Begin the session's next transaction read-only (call it when none is open)."""
    if db.in_transaction():
        raise RuntimeError("a transaction is already open")
    db.connection(execution_options=access_options(db.get_bind().dialect.name, writes=False))


def begin_writing(db: Session) -> None:
    """Make the rest of the unit of work a transaction that may write.

    A read-only transaction in progress ends first: it changed nothing, and what it
    loaded stays loaded. A writing one simply continues.
    """
    if _in_writing_transaction(db):
        return
    if db.in_transaction():
        db.commit()
    db.connection(execution_options=access_options(db.get_bind().dialect.name, writes=True))


def columns(row: Base) -> dict[str, Any]:
    """The row's column values by attribute name (an answer's fields are read from them)."""
    return {attr.key: getattr(row, attr.key) for attr in inspect(row).mapper.column_attrs}


_OWNER_LOOKUPS: dict[type[Base], Any] = {}


def owner_of(db: Session, model: type[Base], key: str) -> str | None:
    """The `owner_id` of the `model` row with primary key `key` (None: no such row).

    A column read on the session's connection, by a statement built once per model: an
    ownership check that loads no ORM object, for reads that need the row no further.
    """
    stmt = _OWNER_LOOKUPS.get(model)
    if stmt is None:
        (primary_key,) = model.__mapper__.primary_key
        stmt = select(model.__table__.c.owner_id).where(primary_key == bindparam("key"))
        _OWNER_LOOKUPS[model] = stmt
    owner: str | None = db.connection().execute(stmt, {"key": key}).scalar()
    return owner


def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One session per unit of work; whatever was not committed is rolled back."""
    db = factory()
    try:
        yield db
    finally:
        db.rollback()
        db.close()


ModelT = TypeVar("ModelT", bound=Base)


@dataclass(frozen=True)
class Page:
    """One page of a list: `limit` rows from `offset` (the API's ?limit=&offset=)."""

    limit: int
    offset: int


class NewestFirst(Generic[ModelT]):
    """A list of `model` rows matching `where`, newest first, a page at a time.

    Built once, at import: `where` names what varies per call with `bindparam`s, given as
    keyword arguments on each call. Building an ORM statement anew costs more than running
    it (a quarter of a millisecond, measured, on a one-row list); a statement built once
    is compiled once and found in SQLAlchemy's cache by identity after that.
    One query per page: the total rides along on each row as a window count (evaluated
    before the page is cut); only a page past the end asks for it on its own.
    """

    def __init__(self, model: type[ModelT], where: ColumnElement[bool] | None = None) -> None:
        table = model.__table__
        page = select(model, func.count().over())
        count = select(func.count()).select_from(table)
        if where is not None:
            page, count = page.where(where), count.where(where)
        order = [table.c.created_at.desc(), *model.__mapper__.primary_key]
        self._page = page.order_by(*order).limit(bindparam("limit")).offset(bindparam("offset"))
        self._count = count

    def __call__(self, db: Session, *, page: Page, **params: Any) -> tuple[list[ModelT], int]:
        """One page of rows and how many match in all."""
        bounds = {"limit": page.limit, "offset": page.offset}
        rows = db.execute(self._page, {**params, **bounds}).all()
        if rows:
            return [row[0] for row in rows], int(rows[0][1])
        if page.offset == 0:
            return [], 0
        return [], db.scalar(self._count, params) or 0


def newest_first(
    db: Session,
    model: type[ModelT],
    where: ColumnElement[bool] | None = None,
    *,
    page: Page,
) -> tuple[list[ModelT], int]:
    """A page of `model` rows newest first, for a filter put together per call.

    A filter whose shape is fixed is cheaper as a module-level `NewestFirst`.
    """
    return NewestFirst(model, where)(db, page=page)
