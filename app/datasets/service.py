"""Dataset rules: streamed encrypted upload within quota, visibility, changes, deletion, catalog.

Who sees what: the owner sees and changes a dataset; the holder of an active grant sees
its metadata and uses it in jobs (app/grants/access.open_dataset_for_job), never its
bytes; anyone else gets 404 as if it did not exist. The catalog shows metadata of the
datasets their owners made discoverable. What a job derived from other owners' data
stays use-only, neither downloadable nor shareable, until they release it
(app/releases).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from app import ownership
from app.accounts import quotas
from app.accounts.models import Identity, User, UserStatus
from app.audit import service as audit
from app.audit.service import Actor
from app.clusters.service import ANY_CLUSTER, check_cluster_set
from app.datasets.formats import Validator
from app.datasets.validators import validator_for
from app.db import NewestFirst, Page, begin_writing, new_id, utcnow
from app.errors import Conflict, InsufficientStorage, Invalid, NotFound, QuotaExceeded
from app.grants import access
from app.grants import service as grants
from app.releases import provenance
from app.settings import Settings
from app.unit_of_work import commit_before_waiting, commit_with_file
from app.workspaces import service as workspaces
from app.workspaces.models import Dataset, DatasetKind, Workspace
from app.workspaces.storage import DatasetReader, EncryptedWriter, decrypt_chunks

MAX_NAME_LENGTH = 200
# no control characters, and something besides spaces (names are stripped)
NAME_PATTERN = r"^[^\x00-\x1f\x7f]*[^\x00-\x1f\x7f\s][^\x00-\x1f\x7f]*$"
_NAME = re.compile(NAME_PATTERN)
_TRUE = frozenset({"true", "1", "yes", "on"})
_FALSE = frozenset({"false", "0", "no", "off", ""})


# ------------------------------------------------------------------------------- upload


@dataclass(frozen=True)
class UploadPlan:
    """What an upload may do, settled before its body is read."""

    workspace_id: str
    owner_id: str
    dataset_id: str
    data_key: bytes
    size_limit: int  # settings.max_upload_bytes
    quota_left: int  # at the start; checked again under the row lock at the end
    tmp_path: Path
    final_path: Path
    user_storage_limit: int  # the owner's quota over all their workspaces

    @property
    def budget(self) -> int:
        """The most bytes the file may have."""
        return min(self.size_limit, self.quota_left)

    def too_large(self, size: int) -> QuotaExceeded:
        """The 413 for a file of `size` bytes."""
        if size > self.size_limit:
            return QuotaExceeded(f"the file is larger than the limit of {self.size_limit} bytes")
        return QuotaExceeded("the storage quota (the workspace's or yours) would be exceeded")


def plan_upload(db: Session, *, workspace: Workspace, settings: Settings) -> UploadPlan:
    """The plan of a new dataset in `workspace`: key, paths, and the budget known now."""
    owner = db.get(User, workspace.owner_id)
    if owner is None:
        raise NotFound()
    user_limit = quotas.quota_of(owner, settings).storage_bytes_limit
    user_left = user_limit - quotas.storage_used(db, user_id=owner.id)
    dataset_id = new_id()
    return UploadPlan(
        workspace_id=workspace.id,
        owner_id=workspace.owner_id,
        dataset_id=dataset_id,
        data_key=workspaces.data_key(db, workspace=workspace, settings=settings),
        size_limit=settings.max_upload_bytes,
        quota_left=max(
            0, min(workspace.storage_bytes_limit - workspace.storage_bytes_used, user_left)
        ),
        tmp_path=workspaces.upload_tmp_dir(settings) / f"{new_id()}.part",
        final_path=workspaces.dataset_path(settings, dataset_id),
        user_storage_limit=user_limit,
    )


def begin_upload(
    db: Session, *, actor: Actor, user: User, workspace_id: str, settings: Settings
) -> UploadPlan:
    """Check ownership, settle the key and budget, and end the transaction before streaming."""
    workspace = ownership.get_owned(db, Workspace, workspace_id, actor=actor, user=user)
    plan = plan_upload(db, workspace=workspace, settings=settings)
    # Nothing may be held while the body streams (on SQLite every transaction holds the
    # write lock); this also commits a data key made for an older workspace.
    commit_before_waiting(db)
    return plan


_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


@contextmanager
def disk_full_is_507() -> Iterator[None]:
    """A full disk (or quota) while storing answers 507; the caller removes what it wrote."""
    try:
        yield
    except OSError as exc:
        if exc.errno in _DISK_FULL:
            raise InsufficientStorage("the server's storage is full; nothing was stored") from exc
        raise


class IncomingFile:
    """The uploaded file as it streams: size and quota, sha256, format, encryption to disk.

    Plaintext is never written anywhere; at most one chunk of it is in memory.
    """

    def __init__(self, plan: UploadPlan) -> None:
        self.plan = plan
        with disk_full_is_507():
            plan.tmp_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            # 0600 from creation on (encrypted, but still nobody else's to read or copy)
            fd = os.open(plan.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            self._file: BinaryIO = os.fdopen(fd, "wb")
            self._writer = EncryptedWriter(
                self._file, data_key=plan.data_key, dataset_id=plan.dataset_id
            )
        self._hash = hashlib.sha256()
        self._validator: Validator | None = None
        self._validated_kind: DatasetKind | None = None
        self._closed = False
        self.size = 0
        self.model_info: dict[str, Any] | None = None  # a `model`'s description, once complete

    def validate_as(self, kind: DatasetKind) -> None:
        """Validate on the fly (the form sent `kind` before the file)."""
        if self.size == 0 and self._validator is None:
            self._validator = validator_for(kind)
            self._validated_kind = kind

    def write(self, data: bytes) -> None:
        """The next bytes of the file; 413 as soon as it outgrows the limit or the quota."""
        self.size += len(data)
        if self.size > self.plan.budget:
            raise self.plan.too_large(self.size)
        self._hash.update(data)
        if self._validator is not None:
            self._validator.feed(data)
        with disk_full_is_507():
            self._writer.write(data)

    @property
    def sha256(self) -> str:
        """Hex sha256 of the plaintext received so far."""
        return self._hash.hexdigest()

    def complete(self, kind: DatasetKind) -> None:
        """Seal and flush the file to disk, then make sure it is a valid `kind` file (422)."""
        with disk_full_is_507():
            self._writer.close()
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        self._closed = True
        if self._validator is not None and self._validated_kind == kind:
            validator = self._validator
        else:
            # `kind` came after the file: a second streaming pass over what was stored
            validator = validator_for(kind)
            with self.plan.tmp_path.open("rb") as src:
                for chunk in decrypt_chunks(
                    src, data_key=self.plan.data_key, dataset_id=self.plan.dataset_id
                ):
                    validator.feed(chunk)
        validator.finish()
        self.model_info = getattr(validator, "model_info", None)

    def discard(self) -> None:
        """Remove the temporary file (a no-op once it has become the dataset's file)."""
        if not self._closed:
            with contextlib.suppress(OSError):  # a full disk may refuse the last flush
                self._file.close()
            self._closed = True
        self.plan.tmp_path.unlink(missing_ok=True)


@dataclass(frozen=True)
class UploadFields:
    """The form fields of an upload, checked."""

    name: str
    kind: DatasetKind
    discoverable: bool


def parse_kind(raw: str) -> DatasetKind:
    """A dataset kind from a form field (422 otherwise)."""
    try:
        return DatasetKind(raw.strip())
    except ValueError:
        kinds = ", ".join(k.value for k in DatasetKind)
        raise Invalid(f"kind must be one of: {kinds}") from None


def check_name(name: str) -> str:
    """A dataset name: metadata only, 1-200 characters, no control characters."""
    if not 1 <= len(name) <= MAX_NAME_LENGTH or not _NAME.match(name):
        raise Invalid(f"name must be 1-{MAX_NAME_LENGTH} characters without control characters")
    return name.strip()


def parse_fields(fields: dict[str, str]) -> UploadFields:
    """The `name`, `kind` and `discoverable` fields of the upload form (422 when wrong)."""
    if "name" not in fields or "kind" not in fields:
        raise Invalid("the form needs the fields file, name and kind")
    raw = fields.get("discoverable", "false").strip().lower()
    if raw not in _TRUE | _FALSE:
        raise Invalid("discoverable must be true or false")
    return UploadFields(
        name=check_name(fields["name"]),
        kind=parse_kind(fields["kind"]),
        discoverable=raw in _TRUE,
    )


def finish_upload(
    db: Session,
    *,
    actor: Actor,
    plan: UploadPlan,
    incoming: IncomingFile,
    fields: UploadFields,
    also: Callable[[Dataset], None] | None = None,
) -> Dataset:
    """One transaction under the owner's and the workspace's row locks: quotas, dataset row,
    audit, file in place.

    `also` writes more rows about the new dataset in the same transaction (a job output's
    provenance), so that it never exists without them.
    """
    owner = quotas.lock_user(db, user_id=plan.owner_id)
    workspace = workspaces.lock(db, workspace_id=plan.workspace_id)
    if owner is None or workspace is None or workspace.owner_id != plan.owner_id:
        db.rollback()
        raise NotFound()
    if workspace.storage_bytes_used + incoming.size > workspace.storage_bytes_limit:
        db.rollback()
        raise plan.too_large(incoming.size)
    if quotas.storage_used(db, user_id=owner.id) + incoming.size > plan.user_storage_limit:
        db.rollback()
        raise QuotaExceeded("your storage quota (over all your workspaces) would be exceeded")
    workspace.storage_bytes_used += incoming.size
    dataset = Dataset(
        id=plan.dataset_id,
        workspace_id=workspace.id,
        owner_id=workspace.owner_id,
        name=fields.name,
        kind=fields.kind,
        size_bytes=incoming.size,
        sha256=incoming.sha256,
        discoverable=fields.discoverable,
        model_info=incoming.model_info,
    )
    db.add(dataset)
    db.flush()
    if also is not None:
        also(dataset)
    audit.record(
        db,
        actor=actor,
        action="dataset.upload",
        subject=dataset,
        details={
            "workspace_id": workspace.id,
            "kind": fields.kind.value,
            "size_bytes": incoming.size,
            "sha256": dataset.sha256,
            **({"model": incoming.model_info} if incoming.model_info else {}),
        },
    )
    with disk_full_is_507():
        plan.final_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.replace(plan.tmp_path, plan.final_path)
    commit_with_file(db, plan.final_path)
    _fsync_dir(plan.final_path.parent)
    return dataset


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ----------------------------------------------------------------------- access to one


def _live(db: Session, dataset_id: str) -> Dataset | None:
    dataset = db.get(Dataset, dataset_id)
    if dataset is None or dataset.deleted_at is not None:
        return None
    return dataset


def get_visible(db: Session, *, actor: Actor, user: User, dataset_id: str) -> Dataset:
    """The dataset's metadata for its owner or an active grantee; NotFound (audited) otherwise."""
    dataset = _live(db, dataset_id)
    if dataset is None or (
        dataset.owner_id != user.id
        and not access.active_grant_ids_for(db, dataset_id=dataset.id, user_id=user.id)
    ):
        audit.deny(
            db, actor=actor, action="dataset.access", subject_type="dataset", subject_id=dataset_id
        )
    return dataset


# What only a dataset's owner may do, and what an active grantee who tries it is told.
OWNER_ONLY = {
    "dataset.download": "grants allow use in jobs, not download",
    "dataset.update": "only the owner may change a dataset",
    "dataset.delete": "only the owner may delete a dataset",
    "release.request": "only the dataset's owner may ask for its release",
}


def get_owned(db: Session, *, actor: Actor, user: User, dataset_id: str, action: str) -> Dataset:
    """The dataset if `user` owns it, for one of the `OWNER_ONLY` actions; Forbidden for an
    active grantee; NotFound otherwise."""
    dataset = get_visible(db, actor=actor, user=user, dataset_id=dataset_id)
    if dataset.owner_id != user.id:
        audit.deny(
            db,
            actor=actor,
            action=action,
            subject_type="dataset",
            subject_id=dataset_id,
            forbidden=OWNER_ONLY[action],
        )
    return dataset


_LIVE_IN_WORKSPACE = NewestFirst(
    Dataset, (Dataset.workspace_id == bindparam("workspace_id")) & Dataset.deleted_at.is_(None)
)


def list_in_workspace(
    db: Session, *, actor: Actor, user: User | Identity, workspace_id: str, page: Page
) -> tuple[list[Dataset], int]:
    """The live datasets of one of the user's workspaces, newest first."""
    ownership.check_owned(db, Workspace, workspace_id, actor=actor, user=user)
    return _LIVE_IN_WORKSPACE(db, workspace_id=workspace_id, page=page)


def update(
    db: Session,
    *,
    actor: Actor,
    dataset: Dataset,
    name: str | None,
    discoverable: bool | None,
    default_clusters: list[str] | str | None = None,
) -> Dataset:
    """Rename, switch whether the catalog lists it, or set its default clusters (a list of
    names or "any": what an approval naming none allows; existing grants keep theirs)."""
    changes: dict[str, str | bool | list[str]] = {}
    if name is not None and check_name(name) != dataset.name:
        dataset.name = changes["name"] = check_name(name)
    if discoverable is not None and discoverable != dataset.discoverable:
        if discoverable and provenance.needs_release(db, dataset):
            raise Conflict(
                "the dataset derives from other owners' data: it cannot be listed in the"
                " catalog until they release it"
            )
        dataset.discoverable = changes["discoverable"] = discoverable
    if default_clusters is not None:
        wanted = check_cluster_set(db, clusters=default_clusters)
        if wanted != dataset.default_clusters:
            dataset.default_clusters = wanted
            changes["default_clusters"] = wanted if wanted is not None else ANY_CLUSTER
    audit.record(db, actor=actor, action="dataset.update", subject=dataset, details=changes)
    return dataset


def delete(db: Session, *, actor: Actor, dataset: Dataset) -> list[grants.EndedRequest]:
    """Soft-delete: quota given back, requests on it ended (returned, for their jobs to stop).

    The caller removes the file (`remove_file`) after the commit: a crash in between
    leaves an unreadable orphan, never a dataset row without its file.
    """
    if dataset.workspace_id is not None:
        workspace = workspaces.lock(db, workspace_id=dataset.workspace_id)
        if workspace is not None:
            workspace.storage_bytes_used = max(0, workspace.storage_bytes_used - dataset.size_bytes)
    dataset.deleted_at = utcnow()
    ended = grants.end_grants_for_dataset(db, actor=actor, dataset_id=dataset.id)
    audit.record(
        db,
        actor=actor,
        action="dataset.delete",
        subject=dataset,
        details={
            "size_bytes": dataset.size_bytes,
            "requests_ended": [end.request_id for end in ended],
        },
    )
    return ended


def remove_file(settings: Settings, dataset_id: str) -> None:
    """Remove a deleted dataset's encrypted file (after the commit of its deletion)."""
    workspaces.dataset_path(settings, dataset_id).unlink(missing_ok=True)


def open_for_download(
    db: Session, *, actor: Actor, dataset: Dataset, settings: Settings
) -> DatasetReader:
    """A decrypting reader for the owner's download, audited (the caller commits that before
    streaming).

    Forbidden (audited) while the dataset derives from other owners' data they have not
    released.
    """
    if dataset.workspace_id is None:
        raise NotFound()
    if provenance.needs_release(db, dataset):
        audit.deny(
            db,
            actor=actor,
            action="dataset.download",
            subject_type="dataset",
            subject_id=dataset.id,
            forbidden=(
                "this dataset derives from other owners' data and is use-only until they"
                f" release it: ask with POST /api/v1/datasets/{dataset.id}/release-requests"
            ),
        )
    begin_writing(db)  # a GET that writes: the download is an audited use of the data
    reader = workspaces.reader_for(db, dataset=dataset, settings=settings)
    audit.record(db, actor=actor, action="dataset.download", subject=dataset)
    return reader


# ------------------------------------------------------------------------------ catalog


@dataclass(frozen=True)
class CatalogEntry:
    """A discoverable dataset as one viewer may see it."""

    dataset: Dataset
    owner_display_name: str
    # the plaintext digest confirms a guess of the content: only for owner and grantees
    sha256: str | None


def catalog(
    db: Session,
    *,
    viewer_id: str,
    q: str | None,
    kind: DatasetKind | None,
    page: Page,
) -> tuple[list[CatalogEntry], int]:
    """Discoverable live datasets of active users with their owner's display name, newest first."""
    stmt = (
        select(Dataset, User.display_name)
        .join(User, User.id == Dataset.owner_id)
        .where(
            Dataset.discoverable.is_(True),
            Dataset.deleted_at.is_(None),
            User.status == UserStatus.active,
        )
    )
    if kind is not None:
        stmt = stmt.where(Dataset.kind == kind)
    if q:
        pattern = "%" + q.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        stmt = stmt.where(func.lower(Dataset.name).like(pattern + "%", escape="\\"))
    total = db.scalar(select(func.count()).select_from(stmt.subquery())) or 0
    rows = db.execute(
        stmt.order_by(Dataset.created_at.desc(), Dataset.id).limit(page.limit).offset(page.offset)
    ).all()
    granted = access.datasets_granted_to(
        db, user_id=viewer_id, dataset_ids=[row[0].id for row in rows]
    )
    entries = [
        CatalogEntry(
            dataset=row[0],
            owner_display_name=row[1],
            sha256=row[0].sha256 if row[0].owner_id == viewer_id or row[0].id in granted else None,
        )
        for row in rows
    ]
    return entries, total
