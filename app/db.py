"""Database engine, sessions and the declarative base shared by every domain."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TypeVar

from sqlalchemy import ColumnElement, DateTime, MetaData, String, create_engine, event, func, select
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker
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
    type_annotation_map = {datetime: UTCDateTime(), str: String(255)}


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite gets WAL, foreign keys and serialized writers."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

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
        def _sqlite_begin_immediate(conn: Any) -> None:
            # Take the write lock up front: read-then-write transactions (the audit
            # chain, quotas) are serialized instead of failing on lock upgrade.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """A session factory whose objects stay readable after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)


def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One session per unit of work; whatever was not committed is rolled back."""
    db = factory()
    try:
        yield db
    finally:
        db.rollback()
        db.close()


ModelT = TypeVar("ModelT", bound=Base)


def newest_first(
    db: Session,
    model: type[ModelT],
    where: ColumnElement[bool] | None = None,
    *,
    limit: int,
    offset: int,
) -> tuple[list[ModelT], int]:
    """One page of `model` rows matching `where`, newest first, and how many match in all."""
    table = model.__table__
    stmt, count = select(model), select(func.count()).select_from(table)
    if where is not None:
        stmt, count = stmt.where(where), count.where(where)
    order = [table.c.created_at.desc(), *model.__mapper__.primary_key]
    items = db.scalars(stmt.order_by(*order).limit(limit).offset(offset)).all()
    return list(items), db.scalar(count) or 0
