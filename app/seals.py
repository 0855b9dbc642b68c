"""Seals on the rows that confer access: a MAC under a key the database does not hold.

Who owns a dataset, which workspace's key opens it, who holds a grant on it and whether a
derived dataset was released are all rows in the database. Someone who can write the
database but not read the platform secret could otherwise change an owner, or insert an
approved grant or release, and read data in clear. So each such row carries `row_mac`, an
HMAC-SHA256 (key derived from the platform secret, app/keyring.py) over the table's name
and the fields below. The application seals a row whenever it writes one (a flush hook),
and checks the seal whenever it loads one (a load hook): a row whose seal fails raises
`TamperedRow` (a NotFound, so the caller is told nothing more), and the HTTP layer audits
it as `integrity.tampered`.

A row is sealed as the ORM flushes it. An UPDATE or INSERT statement run through a session
(`db.execute(update(Dataset)...)`, ORM-enabled or not) would write rows without their seals:
such a statement on a sealed table raises `UnsealedWrite` before it runs, and the tests scan
the code for the legacy `Session.bulk_*` methods, which no event sees. Change sealed rows
by loading them and setting attributes.

SEALED_FIELDS is the one list to change. Adding a column that confers or restricts access
(say, the clusters a grant allows) means: add it here, and write a migration that re-seals
the existing rows with `row_mac(...)` over the list as it stands at that revision (the
migration keeps its own copy of the list: a later change must not move an old migration).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any
from weakref import WeakKeyDictionary

from sqlalchemy import Engine, event, inspect
from sqlalchemy.orm import ORMExecuteState, Session

from app.db import Base
from app.errors import NotFound
from app.grants.models import AccessRequest
from app.keyring import Purpose, subkey
from app.releases.models import DatasetSource, ReleaseApproval, ReleaseRequest
from app.settings import Settings
from app.workspaces.models import Dataset, Workspace

MAC_COLUMN = "row_mac"
MAC_VERSION = 1

# Per table, every field that decides who may use, see or take out data. Not here: names,
# purposes, sizes used for quota accounting, timestamps that only inform (created_at).
SEALED_FIELDS: dict[str, tuple[str, ...]] = {
    # the owner, and so who may read each dataset in it (there is no membership table)
    "workspaces": ("id", "owner_id", "data_key_wrapped"),
    # owner_id: who may download; workspace_id: whose data key opens it; sha256: which bytes;
    # deleted_at: a deleted dataset must stay deleted; discoverable: who may ask for it;
    # default_clusters: where an approval lets it go when its owner names no clusters;
    # sources_digest: its whole list of dataset_sources rows, so that none can go unnoticed
    "datasets": (
        "id",
        "workspace_id",
        "owner_id",
        "kind",
        "sha256",
        "discoverable",
        "deleted_at",
        "default_clusters",
        "sources_digest",
    ),
    # a grant: who may use which dataset, decided by whom, until when, on which clusters
    "access_requests": (
        "id",
        "dataset_id",
        "requester_id",
        "owner_id",
        "status",
        "decided_at",
        "expires_at",
        "ended_at",
        "clusters",
    ),
    # an approved release makes a derived dataset downloadable
    "release_requests": ("id", "dataset_id", "requester_id", "status"),
    "release_approvals": ("id", "request_id", "owner_id", "status"),
    # provenance: whose terms keep a derived dataset use-only
    "dataset_sources": (
        "dataset_id",
        "source_id",
        "source_owner_id",
        "direct",
        "job_id",
        "grant_id",
    ),
}

SEALED_MODELS: tuple[type[Base], ...] = (
    Workspace,
    Dataset,
    AccessRequest,
    ReleaseRequest,
    ReleaseApproval,
    DatasetSource,
)


class TamperedRow(NotFound):
    """A row whose seal does not hold: refused as if it did not exist."""

    def __init__(self, table: str, row_id: str) -> None:
        super().__init__()
        self.table = table
        self.row_id = row_id


def _canonical(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        if value.tzinfo is None:  # a naive value read by a raw select: stored as UTC
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat(timespec="microseconds")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    return value


def _normalized(table: str, values: Mapping[str, Any]) -> dict[str, Any]:
    fields = {name: _canonical(values.get(name)) for name in SEALED_FIELDS[table]}
    if table == "datasets" and fields["deleted_at"] is not None:
        # a deleted dataset's workspace may go, and the database sets workspace_id to NULL
        # (ON DELETE SET NULL): once deleted, the seal binds the deletion, not the workspace
        fields["workspace_id"] = None
    return fields


def row_mac(
    key: bytes, table: str, values: Mapping[str, Any], fields: Iterable[str] | None = None
) -> str:
    """The seal of a `table` row with these column values (hex HMAC-SHA256).

    `fields` overrides SEALED_FIELDS (migrations pass the list of their own revision).
    """
    if fields is None:
        normalized = _normalized(table, values)
    else:
        normalized = {name: _canonical(values.get(name)) for name in fields}
        if table == "datasets" and normalized.get("deleted_at") is not None:
            normalized["workspace_id"] = None
    message = json.dumps(
        {"v": MAC_VERSION, "table": table, "fields": normalized},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def seal_holds(key: bytes, table: str, values: Mapping[str, Any]) -> bool:
    """Whether the row's stored `row_mac` is its seal."""
    stored = values.get(MAC_COLUMN)
    if not isinstance(stored, str):
        return False
    return hmac.compare_digest(stored, row_mac(key, table, values))


_keys: WeakKeyDictionary[Engine, bytes] = WeakKeyDictionary()


def use_seal_key(engine: Engine, settings: Settings) -> Engine:
    """Seal and check the rows of every session on `engine` with this platform's key."""
    _keys[engine] = subkey(settings, Purpose.row_seal)
    return engine


def key_for(db: Session) -> bytes:
    """The seal key of the session's engine (fails closed when none was given)."""
    key = _keys.get(db.get_bind().engine)
    if key is None:
        raise RuntimeError("no row seal key for this engine: call seals.use_seal_key first")
    return key


def _identity(table: str, values: Mapping[str, Any]) -> str:
    if table == "dataset_sources":
        return f"{values.get('dataset_id')}/{values.get('source_id')}"
    return str(values.get("id"))


def check_values(db: Session, table: str, values: Mapping[str, Any]) -> None:
    """Raise TamperedRow unless the row (column values with its row_mac) is sealed."""
    if not seal_holds(key_for(db), table, values):
        raise TamperedRow(table, _identity(table, values))


class UnsealedWrite(RuntimeError):
    """An UPDATE or INSERT statement on a sealed table, which would skip the seals."""

    def __init__(self, table: str) -> None:
        super().__init__(
            f"a bulk UPDATE or INSERT statement on {table} would write rows without their "
            "seals (app/seals.py): load the rows and set their attributes instead"
        )
        self.table = table


def _refuse_unsealed_writes(state: ORMExecuteState) -> None:
    if not (state.is_update or state.is_insert):
        return
    name = getattr(getattr(state.statement, "table", None), "name", None)
    if name in SEALED_FIELDS:
        raise UnsealedWrite(str(name))


def _table_name(row: Base) -> str:
    return str(inspect(row).mapper.local_table.name)  # type: ignore[attr-defined]


def _column_values(row: Base) -> dict[str, Any]:
    state = inspect(row)
    return {attr.key: state.dict.get(attr.key) for attr in state.mapper.column_attrs}


def _fill_defaults(row: Base) -> None:
    """Apply the Python-side defaults of sealed columns now: the seal is computed before INSERT."""
    columns = inspect(row).mapper.local_table.c
    for name in SEALED_FIELDS[_table_name(row)]:
        if getattr(row, name) is not None:
            continue
        default = columns[name].default
        if default is None or not (default.is_scalar or default.is_callable):
            continue
        value = default.arg(None) if default.is_callable else default.arg
        setattr(row, name, value)


def _seal_before_flush(db: Session, _context: Any, _instances: Any) -> None:
    for row in list(db.new) + list(db.dirty):
        if not isinstance(row, SEALED_MODELS):
            continue
        if row in db.dirty and not db.is_modified(row, include_collections=False):
            continue
        _fill_defaults(row)
        setattr(row, MAC_COLUMN, row_mac(key_for(db), _table_name(row), _column_values(row)))


def _check_on_load(row: Base, context: Any) -> None:
    values = _column_values(row)
    if MAC_COLUMN not in inspect(row).dict:
        return  # a partial load without the seal (never done by the application)
    check_values(context.session, _table_name(row), values)


def _check_on_refresh(row: Base, context: Any, _attrs: Any) -> None:
    _check_on_load(row, context)


event.listen(Session, "before_flush", _seal_before_flush)
event.listen(Session, "do_orm_execute", _refuse_unsealed_writes)
for _model in SEALED_MODELS:
    event.listen(_model, "load", _check_on_load)
    event.listen(_model, "refresh", _check_on_refresh)
