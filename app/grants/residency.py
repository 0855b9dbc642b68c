"""Residency: which clusters a job may send a dataset, or anything derived from it, to.

A grant carries the set of clusters its owner allows (None: any). A cluster that runs any
role of a job receives something derived from every input of the job: ELECTRA's
discriminator gets the text or its corrupted copy (contract.kinds says how much of it),
ABNet's decoder gets the activations of every source sentence and the encoder the
gradients of every target one. So every cluster of a job must be allowed by every grant
its inputs rest on:

- another owner's input: the user's active grant on it;
- the user's own derived input: the user's active grants on each source whose owner has
  not released it (the terms pass along, as in app.releases.provenance), so that a model
  trained on Alice's text goes only where Alice's grant allows, intersected across all
  its sources;
- the user's own uploaded data, or a released output: no limit.

Checked at submit, at every claim and at every input read: a grant narrowed while a job
runs fails the job at its next call from a removed cluster (and in the narrowing request
itself, after its commit).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.grants.access import active_grant_ids_for
from app.grants.models import AccessRequest
from app.releases import provenance
from app.workspaces.models import Dataset


@dataclass(frozen=True)
class Allowance:
    """One grant a job input rests on, and the clusters it lets the data go to."""

    input_id: str  # the job's input
    dataset_id: str  # the dataset the grant is for: the input, or one of its sources
    grant_id: str
    clusters: frozenset[str] | None  # None: any

    def allows(self, cluster: str) -> bool:
        """Whether the grant lets the data (and what derives from it) go to `cluster`."""
        return self.clusters is None or cluster in self.clusters


@dataclass(frozen=True)
class ResidencyRefusal:
    """A cluster a job would send data to that the grant the data rests on does not allow."""

    grant_id: str
    dataset_id: str
    cluster: str

    def describe(self) -> str:
        """What refuses, naming the grant and the cluster, for an error and a failed job."""
        return (
            f"access grant {self.grant_id} to dataset {self.dataset_id} does not allow"
            f" cluster {self.cluster!r}"
        )


def _active_grant(db: Session, *, dataset_id: str, user_id: str) -> AccessRequest | None:
    ids = active_grant_ids_for(db, dataset_id=dataset_id, user_id=user_id)
    return db.get(AccessRequest, ids[0]) if ids else None


def _allowance(input_id: str, grant: AccessRequest) -> Allowance:
    clusters = frozenset(grant.clusters) if grant.clusters is not None else None
    return Allowance(
        input_id=input_id, dataset_id=grant.dataset_id, grant_id=grant.id, clusters=clusters
    )


def allowances(db: Session, *, user_id: str, dataset_ids: Iterable[str]) -> list[Allowance]:
    """The active grants a job of `user_id` on these inputs rests on, with their clusters.

    A grant that ended is not listed here: the grant checks (app.grants.access) refuse it.
    """
    found: list[Allowance] = []
    for input_id in dict.fromkeys(dataset_ids):
        dataset = db.get(Dataset, input_id)
        if dataset is None:
            continue
        if dataset.owner_id != user_id:
            grant = _active_grant(db, dataset_id=input_id, user_id=user_id)
            if grant is not None:
                found.append(_allowance(input_id, grant))
            continue
        for binding in provenance.bindings(db, dataset):
            grant = _active_grant(db, dataset_id=binding.source_id, user_id=user_id)
            if grant is not None:
                found.append(_allowance(input_id, grant))
    return found


def allowed_clusters(found: Iterable[Allowance]) -> frozenset[str] | None:
    """The clusters every one of these grants allows (their intersection); None: any."""
    allowed: frozenset[str] | None = None
    for allowance in found:
        if allowance.clusters is not None:
            allowed = allowance.clusters if allowed is None else allowed & allowance.clusters
    return allowed


def first_refusal(
    db: Session, *, user_id: str, dataset_ids: Iterable[str], clusters: Iterable[str]
) -> ResidencyRefusal | None:
    """The first cluster of `clusters` that a grant these inputs rest on does not allow."""
    return refusal_among(allowances(db, user_id=user_id, dataset_ids=dataset_ids), clusters)


def refusal_among(found: Sequence[Allowance], clusters: Iterable[str]) -> ResidencyRefusal | None:
    """The first cluster (by name) that one of these grants does not allow, and that grant."""
    for cluster in sorted(set(clusters)):
        for allowance in found:
            if not allowance.allows(cluster):
                return ResidencyRefusal(
                    grant_id=allowance.grant_id, dataset_id=allowance.dataset_id, cluster=cluster
                )
    return None
