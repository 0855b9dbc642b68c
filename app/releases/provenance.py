"""What a job's output derives from, and whose terms bind it until they release it.

A job output derives from the job's inputs and, transitively, from what they derive
from. The owner of a source other than the output's owner must release the output
before it downloads (output checking). The terms pass through the owner's own
unreleased outputs (a model trained on a model trained on Alice's text is bound by
Alice) and stop at a released one, which is its owner's to use as they wish.

This module reads rows only (no grants logic, no audit), so that the grant checks,
downloads and release requests can all build on it.

Each source row is sealed (app/seals.py), but a row deleted from the database leaves no
seal to fail, and would free the derived dataset from its source's terms. So the derived
dataset's own sealed row binds `sources_digest`, a digest of its whole list of source rows,
and every read of the list here compares the two: a list that lost (or gained) a row raises
TamperedRow, refused as missing and audited as `integrity.tampered`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.errors import NotFound
from app.releases.models import DatasetSource, ReleaseRequest, ReleaseStatus
from app.seals import TamperedRow
from app.workspaces.models import Dataset


class Release(StrEnum):
    """Whether a dataset may be downloaded by its owner, as far as its sources go."""

    not_needed = "not_needed"  # uploaded, or derived from its owner's data only
    required = "required"  # derived from others' data; nobody asked yet, or they denied
    pending = "pending"  # a release request waits for its sources' owners
    released = "released"  # every source owner approved; this stays so


UNRELEASED = frozenset({Release.required, Release.pending})


@dataclass(frozen=True)
class Binding:
    """A source whose owner's terms bind a derived dataset, and the grant it was used under."""

    source_id: str
    owner_id: str
    grant_id: str | None


@dataclass(frozen=True)
class Input:
    """A dataset a job read, and the grant through which its owner used it (None: own)."""

    dataset: Dataset
    grant_id: str | None


def sources_digest(rows: Sequence[DatasetSource]) -> str | None:
    """The digest a derived dataset's row binds of its source rows (None: it has none)."""
    if not rows:
        return None
    listed = sorted(
        [r.source_id, r.source_owner_id, bool(r.direct), r.job_id, r.grant_id] for r in rows
    )
    return hashlib.sha256(json.dumps(listed, separators=(",", ":")).encode()).hexdigest()


def checked_sources(db: Session, dataset: Dataset) -> list[DatasetSource]:
    """Everything `dataset` derives from, direct inputs first; TamperedRow if a row went."""
    rows = list(
        db.scalars(
            select(DatasetSource)
            .where(DatasetSource.dataset_id == dataset.id)
            .order_by(DatasetSource.direct.desc(), DatasetSource.source_id)
        )
    )
    if sources_digest(rows) != dataset.sources_digest:
        raise TamperedRow("dataset_sources", dataset.id)
    return rows


def record_sources(db: Session, *, dataset_id: str, job_id: str, inputs: Iterable[Input]) -> None:
    """Write what `dataset_id` derives from: the inputs, and their own sources; not committed."""
    inputs = list(inputs)
    rows: dict[str, DatasetSource] = {}
    for item in inputs:
        rows[item.dataset.id] = DatasetSource(
            dataset_id=dataset_id,
            source_id=item.dataset.id,
            source_owner_id=item.dataset.owner_id,
            direct=True,
            job_id=job_id,
            grant_id=item.grant_id,
        )
    ancestry = db.scalars(
        select(DatasetSource).where(DatasetSource.dataset_id.in_([i.dataset.id for i in inputs]))
    ).all()
    for inherited in ancestry:
        rows.setdefault(
            inherited.source_id,
            DatasetSource(
                dataset_id=dataset_id,
                source_id=inherited.source_id,
                source_owner_id=inherited.source_owner_id,
                direct=False,
                job_id=job_id,
                grant_id=inherited.grant_id,
            ),
        )
    db.add_all(rows.values())
    dataset = db.get(Dataset, dataset_id)
    if dataset is None:
        raise NotFound()
    dataset.sources_digest = sources_digest(list(rows.values()))  # sealed with the dataset
    db.flush()


def derived_ids(db: Session, dataset_ids: Iterable[str]) -> set[str]:
    """Which of `dataset_ids` were derived by a job (one query), as their sealed rows say."""
    ids = list(set(dataset_ids))
    if not ids:
        return set()
    # whole rows, not ids: their seals are checked as they load (app/seals.py)
    derived = db.scalars(
        select(Dataset).where(Dataset.id.in_(ids), Dataset.sources_digest.is_not(None))
    )
    return {dataset.id for dataset in derived}


def sources_of(db: Session, dataset_id: str) -> list[DatasetSource]:
    """Everything `dataset_id` derives from, direct inputs first (checked: checked_sources)."""
    dataset = db.get(Dataset, dataset_id)
    if dataset is None:
        raise NotFound()
    return checked_sources(db, dataset)


def is_released(db: Session, dataset_id: str) -> bool:
    """Whether a release request of the dataset was approved by every source owner."""
    # the whole row, not its id: its seal is checked as it loads (app/seals.py)
    return (
        db.scalar(
            select(ReleaseRequest)
            .where(
                ReleaseRequest.dataset_id == dataset_id,
                ReleaseRequest.status == ReleaseStatus.approved,
            )
            .limit(1)
        )
        is not None
    )


def bindings(db: Session, dataset: Dataset) -> list[Binding]:
    """The sources whose owners must release `dataset` (empty once it is released)."""
    if is_released(db, dataset.id):
        return []
    found: dict[str, Binding] = {}
    stack, seen = [dataset.id], {dataset.id}
    while stack:
        current = db.get(Dataset, stack.pop())
        if current is None:
            raise NotFound()
        direct = [row for row in checked_sources(db, current) if row.direct]
        for row in direct:
            if row.source_owner_id != dataset.owner_id:
                found.setdefault(
                    row.source_id, Binding(row.source_id, row.source_owner_id, row.grant_id)
                )
            elif row.source_id not in seen and not is_released(db, row.source_id):
                # the owner's own unreleased output carries its sources' terms along
                seen.add(row.source_id)
                stack.append(row.source_id)
    return sorted(found.values(), key=lambda b: (b.owner_id, b.source_id))


def release_state(db: Session, dataset: Dataset) -> Release:
    """`not_needed`, `required`, `pending` or `released`."""
    if is_released(db, dataset.id):
        return Release.released
    if not bindings(db, dataset):
        return Release.not_needed
    pending = db.scalar(
        select(ReleaseRequest.id)
        .where(
            ReleaseRequest.dataset_id == dataset.id,
            ReleaseRequest.status == ReleaseStatus.pending,
        )
        .limit(1)
    )
    return Release.pending if pending is not None else Release.required


def needs_release(db: Session, dataset: Dataset) -> bool:
    """Whether others' terms still keep the dataset use-only (not downloadable, not shareable)."""
    return release_state(db, dataset) in UNRELEASED
