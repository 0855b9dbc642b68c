"""Who may use a dataset in a job: one decision, taken at submit and at every read.

`decide_use` is the rule, a pure function of the facts about one user and one dataset;
`check_dataset_usable` (job submission, claims, output checks) and `open_dataset_for_job`
(the moment a role reads) both ask it, and differ only in what they do with the answer.
The facts come from the database lazily (`DatasetUseFacts`), so each question asks only
the queries the rule reaches: an owner's read never looks for a grant of its own.

Where the data may go once usable (a grant's clusters) is app.grants.residency's question.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import cached_property
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.audit import service as audit
from app.audit.service import Actor
from app.db import utcnow
from app.errors import Forbidden, NotFound
from app.grants.models import AccessRequest, AccessStatus
from app.releases import provenance
from app.settings import Settings
from app.unit_of_work import commit_before_raising
from app.workspaces import service as workspaces
from app.workspaces.models import Dataset
from app.workspaces.storage import DatasetReader

EXPIRED = "expired"
NO_GRANT = "no active grant for this dataset"
UNRELEASED = "this dataset derives from data its sources' owners have not released"


def status_of(request: AccessRequest, now: datetime | None = None) -> str:
    """The status to report: the stored one, or `expired` for an approved request past its end."""
    if (
        request.status == AccessStatus.approved
        and request.expires_at is not None
        and request.expires_at <= (now or utcnow())
    ):
        return EXPIRED
    return request.status.value


def grant_is_active(request: AccessRequest, now: datetime | None = None) -> bool:
    """Approved and not expired."""
    return status_of(request, now) == AccessStatus.approved.value


def active_clause(now: datetime) -> Any:
    """The SQL condition of `grant_is_active`."""
    return (AccessRequest.status == AccessStatus.approved) & (
        AccessRequest.expires_at.is_(None) | (AccessRequest.expires_at > now)
    )


def active_grant_ids_for(db: Session, *, dataset_id: str, user_id: str) -> list[str]:
    """Ids of the approved, unexpired requests that let `user_id` use `dataset_id`."""
    # whole rows, not ids: a grant's seal is checked as it loads (app/seals.py)
    rows = db.scalars(
        select(AccessRequest).where(
            AccessRequest.dataset_id == dataset_id,
            AccessRequest.requester_id == user_id,
            active_clause(utcnow()),
        )
    )
    return [row.id for row in rows]


def datasets_granted_to(db: Session, *, user_id: str, dataset_ids: list[str]) -> set[str]:
    """Which of `dataset_ids` `user_id` holds an approved, unexpired grant on."""
    if not dataset_ids:
        return set()
    rows = db.scalars(
        select(AccessRequest).where(
            AccessRequest.dataset_id.in_(dataset_ids),
            AccessRequest.requester_id == user_id,
            active_clause(utcnow()),
        )
    )
    return {row.dataset_id for row in rows}


def live_dataset(db: Session, dataset_id: str) -> Dataset | None:
    """The dataset, unless it does not exist or was deleted."""
    dataset = db.get(Dataset, dataset_id)
    if dataset is None or dataset.deleted_at is not None:
        return None
    return dataset


def _has_any_request(db: Session, *, dataset_id: str, user_id: str) -> bool:
    return (
        db.scalar(
            select(AccessRequest.id)
            .where(AccessRequest.dataset_id == dataset_id, AccessRequest.requester_id == user_id)
            .limit(1)
        )
        is not None
    )


@dataclass(frozen=True)
class EndedGrant:
    """A grant that a derived dataset's use rests on, and that no longer holds."""

    grant_id: str | None
    dataset_id: str  # the source the grant was for
    state: str  # revoked, expired, withdrawn; `missing` if no grant was ever recorded

    def describe(self) -> str:
        """What ended, for an error message and a failed job."""
        verb = {EXPIRED: "expired", "missing": "is missing"}.get(self.state, f"was {self.state}")
        return f"access grant {self.grant_id} to dataset {self.dataset_id} {verb}"


def ended_grant_behind(db: Session, *, user_id: str, dataset: Dataset) -> EndedGrant | None:
    """For the user's own unreleased derived dataset: the first source grant that ended."""
    if dataset.owner_id != user_id:
        return None
    for binding in provenance.bindings(db, dataset):
        if active_grant_ids_for(db, dataset_id=binding.source_id, user_id=user_id):
            continue
        request = db.get(AccessRequest, binding.grant_id) if binding.grant_id else None
        state = status_of(request) if request is not None else "missing"
        return EndedGrant(grant_id=binding.grant_id, dataset_id=binding.source_id, state=state)
    return None


def ended_grant_for_inputs(
    db: Session, *, user_id: str, dataset_ids: Iterable[str]
) -> EndedGrant | None:
    """The first grant a job of `user_id` on these inputs rests on that no longer holds.

    For another owner's input, the user's own grant on it; for the user's own derived
    input, the grants of its unreleased sources (`ended_grant_behind`).
    """
    for dataset_id in dict.fromkeys(dataset_ids):
        dataset = db.get(Dataset, dataset_id)
        if dataset is None:
            continue
        if dataset.owner_id == user_id:
            ended = ended_grant_behind(db, user_id=user_id, dataset=dataset)
            if ended is not None:
                return ended
        elif not active_grant_ids_for(db, dataset_id=dataset_id, user_id=user_id):
            latest = db.scalar(
                select(AccessRequest)
                .where(
                    AccessRequest.dataset_id == dataset_id,
                    AccessRequest.requester_id == user_id,
                    AccessRequest.decided_at.is_not(None),
                    AccessRequest.status != AccessStatus.denied,
                )
                .order_by(AccessRequest.decided_at.desc())
                .limit(1)
            )
            return EndedGrant(
                grant_id=latest.id if latest is not None else None,
                dataset_id=dataset_id,
                state=status_of(latest) if latest is not None else "missing",
            )
    return None


# ------------------------------------------------------------------------- the decision


class Usability(StrEnum):
    """Why a user may or may not use a dataset in a job."""

    owner = "owner"
    granted = "granted"
    visible = "visible"  # discoverable, or the user asked for it: 403 rather than 404
    hidden = "hidden"


class UseFacts(Protocol):
    """What the decision reads about one user and one dataset; each read only when reached."""

    @property
    def exists(self) -> bool:
        """The dataset exists and is not deleted."""

    @property
    def owned(self) -> bool:
        """The user owns it."""

    @property
    def granted(self) -> bool:
        """The user holds an approved, unexpired grant on it."""

    @property
    def discoverable(self) -> bool:
        """Its owner lists it for others to ask for."""

    @property
    def requested(self) -> bool:
        """The user asked for it at least once, whatever became of the request."""

    @property
    def unreleased(self) -> bool:
        """It derives from sources whose owners have not released it (read for others' data)."""

    @property
    def ended_grant(self) -> EndedGrant | None:
        """For the user's own derived data: the first source grant it rests on that ended."""


@dataclass(frozen=True)
class UseDecision:
    """The answer: on what footing the user stands, and why a use is refused (None: allowed)."""

    usability: Usability
    refusal: str | None = None

    @property
    def allowed(self) -> bool:
        """The user may use the dataset in a job now."""
        return self.usability in (Usability.owner, Usability.granted) and self.refusal is None

    @property
    def status(self) -> int:
        """The HTTP status a refusal answers: 404 for a dataset the user cannot see, else 403."""
        return 404 if self.usability == Usability.hidden else 403


def decide_use(facts: UseFacts) -> UseDecision:
    """Whether a user may use a dataset in a job, and on what footing. Pure.

    Deny by default: a dataset the user can neither use nor see is hidden (404). The owner
    uses their own data, unless it derives from another owner's data under a grant that
    has ended (the terms pass along until the source's owner releases it). A grant holder
    uses the data, unless it derives from sources their owners have not released (an owner
    cannot share what is not theirs yet). Anyone else who can see the dataset (listed, or
    asked for) is refused with 403: no active grant.
    """
    if not facts.exists:
        return UseDecision(Usability.hidden)
    if facts.owned:
        ended = facts.ended_grant
        if ended is not None:
            return UseDecision(
                Usability.owner, f"this dataset derives from data used under {ended.describe()}"
            )
        return UseDecision(Usability.owner)
    if facts.granted:
        return UseDecision(Usability.granted, UNRELEASED if facts.unreleased else None)
    if facts.discoverable or facts.requested:
        return UseDecision(Usability.visible, NO_GRANT)
    return UseDecision(Usability.hidden)


class DatasetUseFacts:
    """The facts of `decide_use` read from the database, each on first use."""

    def __init__(self, db: Session, *, user_id: str, dataset_id: str) -> None:
        self._db = db
        self.user_id = user_id
        self.dataset_id = dataset_id

    @cached_property
    def dataset(self) -> Dataset | None:
        """The live dataset, or None."""
        return live_dataset(self._db, self.dataset_id)

    @property
    def exists(self) -> bool:
        """The dataset exists and is not deleted."""
        return self.dataset is not None

    @property
    def owned(self) -> bool:
        """The user owns it."""
        return self.dataset is not None and self.dataset.owner_id == self.user_id

    @cached_property
    def grant_ids(self) -> list[str]:
        """The user's active grants on it."""
        return active_grant_ids_for(self._db, dataset_id=self.dataset_id, user_id=self.user_id)

    @property
    def granted(self) -> bool:
        """The user holds an approved, unexpired grant on it."""
        return bool(self.grant_ids)

    @property
    def discoverable(self) -> bool:
        """Its owner lists it for others to ask for."""
        return self.dataset is not None and self.dataset.discoverable

    @cached_property
    def requested(self) -> bool:
        """The user asked for it at least once."""
        return _has_any_request(self._db, dataset_id=self.dataset_id, user_id=self.user_id)

    @cached_property
    def unreleased(self) -> bool:
        """It derives from sources whose owners have not released it."""
        return self.dataset is not None and provenance.needs_release(self._db, self.dataset)

    @cached_property
    def ended_grant(self) -> EndedGrant | None:
        """For the user's own derived data: the first source grant that ended."""
        if self.dataset is None:
            return None
        return ended_grant_behind(self._db, user_id=self.user_id, dataset=self.dataset)


def check_dataset_usable(db: Session, *, user_id: str, dataset_id: str) -> Dataset:
    """The dataset if `user_id` owns it or holds an active grant (for job submission; no audit).

    NotFound when the user cannot see it; Forbidden when visible without an active grant,
    or when it derives from others' data whose grant has ended (named in the message).
    """
    facts = DatasetUseFacts(db, user_id=user_id, dataset_id=dataset_id)
    decision = decide_use(facts)
    if decision.usability == Usability.hidden or facts.dataset is None:
        raise NotFound()
    if decision.refusal is not None:
        raise Forbidden(decision.refusal)
    return facts.dataset


def open_dataset_for_job(
    db: Session, *, user_id: str, dataset_id: str, job_id: str, settings: Settings
) -> DatasetReader:
    """A decrypting reader of the dataset for a job of `user_id`, checked now and audited.

    The grant is checked at the moment of use (an expired or revoked grant refuses) and
    the `dataset.use` event recorded, for the caller to commit before the first byte
    leaves (a denial is committed here, before the error); the reader holds no session.
    NotFound: not visible; Forbidden: visible, no active grant.
    """
    actor = Actor(user_id=user_id)
    facts = DatasetUseFacts(db, user_id=user_id, dataset_id=dataset_id)
    decision = decide_use(facts)
    dataset = facts.dataset
    if not decision.allowed or dataset is None:
        details: dict[str, Any] = {"job_id": job_id, "status": decision.status}
        if decision.refusal is not None:
            details["reason"] = decision.refusal
        db.rollback()
        audit.record(
            db,
            actor=actor,
            action="dataset.use",
            subject_type="dataset",
            subject_id=dataset_id,
            outcome="denied",
            details=details,
        )
        commit_before_raising(db)
        if decision.refusal is None:
            raise NotFound()
        raise Forbidden(decision.refusal)
    reader = workspaces.reader_for(db, dataset=dataset, settings=settings)
    audit.record(
        db,
        actor=actor,
        action="dataset.use",
        subject=dataset,
        details={
            "job_id": job_id,
            "owner_id": dataset.owner_id,
            "via": decision.usability.value,
            "grant_ids": active_grant_ids_for(db, dataset_id=dataset.id, user_id=user_id),
        },
    )
    return reader
