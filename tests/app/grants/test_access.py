"""The dataset-use decision as a table: who may use a dataset in a job, and why not. No database.

Each row is one user and one dataset: whose it is, the user's requests on it and what
became of them, whether it derives from unreleased data. The same rule answers job
submission (`check_dataset_usable`) and every read (`open_dataset_for_job`); the
API-level tests (test_grants.py, test_residency.py) walk the same cases end to end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest

from app.db import utcnow
from app.grants.access import (
    NO_GRANT,
    UNRELEASED,
    EndedGrant,
    Usability,
    UseDecision,
    decide_use,
    grant_is_active,
    status_of,
)
from app.grants.models import AccessRequest, AccessStatus
from app.grants.residency import Allowance, allowed_clusters, refusal_among

NOW = utcnow()
PAST = NOW - timedelta(hours=1)
LATER = NOW + timedelta(hours=1)


def request(status: AccessStatus, expires_at: object = None) -> AccessRequest:
    """An access request in memory, as the decision sees it."""
    return AccessRequest(
        dataset_id="d", requester_id="bob", owner_id="alice", status=status, expires_at=expires_at
    )


@dataclass(frozen=True)
class Facts:
    """The facts of one row; `requests` are the user's requests on the dataset."""

    exists: bool = True
    owned: bool = False
    discoverable: bool = False
    requests: tuple[AccessRequest, ...] = ()
    unreleased: bool = False
    ended_grant: EndedGrant | None = None

    @property
    def granted(self) -> bool:
        return any(grant_is_active(r, NOW) for r in self.requests)

    @property
    def requested(self) -> bool:
        return bool(self.requests)


REVOKED_SOURCE = EndedGrant(grant_id="g1", dataset_id="src", state="revoked")
EXPIRED_SOURCE = EndedGrant(grant_id="g2", dataset_id="src", state="expired")
MISSING_SOURCE = EndedGrant(grant_id=None, dataset_id="src", state="missing")

OWNER, GRANTED, VISIBLE, HIDDEN = (
    Usability.owner,
    Usability.granted,
    Usability.visible,
    Usability.hidden,
)

# (case, facts, footing, refusal: None allowed, else the message)
TABLE: list[tuple[str, Facts, Usability, str | None]] = [
    ("no such dataset, or deleted", Facts(exists=False), HIDDEN, None),
    ("deleted, though once owned", Facts(exists=False, owned=True), HIDDEN, None),
    ("the owner's upload", Facts(owned=True), OWNER, None),
    ("the owner's, listed", Facts(owned=True, discoverable=True), OWNER, None),
    (
        "the owner's output, its sources' grants still active",
        Facts(owned=True, unreleased=True),
        OWNER,
        None,
    ),
    (
        "the owner's output of data whose grant was revoked",
        Facts(owned=True, ended_grant=REVOKED_SOURCE),
        OWNER,
        "this dataset derives from data used under access grant g1 to dataset src was revoked",
    ),
    (
        "the owner's output of data whose grant expired",
        Facts(owned=True, ended_grant=EXPIRED_SOURCE),
        OWNER,
        "this dataset derives from data used under access grant g2 to dataset src expired",
    ),
    (
        "the owner's output whose grant was never recorded",
        Facts(owned=True, ended_grant=MISSING_SOURCE),
        OWNER,
        "this dataset derives from data used under access grant None to dataset src is missing",
    ),
    (
        "an approved grant",
        Facts(discoverable=True, requests=(request(AccessStatus.approved),)),
        GRANTED,
        None,
    ),
    (
        "an approved grant until later",
        Facts(requests=(request(AccessStatus.approved, LATER),)),
        GRANTED,
        None,
    ),
    (
        "an approved grant on an unlisted dataset",
        Facts(discoverable=False, requests=(request(AccessStatus.approved),)),
        GRANTED,
        None,
    ),
    (
        "a grant after an earlier revoked one",
        Facts(requests=(request(AccessStatus.revoked), request(AccessStatus.approved))),
        GRANTED,
        None,
    ),
    (
        "a grant on data derived from unreleased sources",
        Facts(requests=(request(AccessStatus.approved),), unreleased=True),
        GRANTED,
        UNRELEASED,
    ),
    (
        "a grant on released derived data",
        Facts(requests=(request(AccessStatus.approved),), unreleased=False),
        GRANTED,
        None,
    ),
    (
        "a grant whose expiry passed",
        Facts(requests=(request(AccessStatus.approved, PAST),)),
        VISIBLE,
        NO_GRANT,
    ),
    ("a pending request", Facts(requests=(request(AccessStatus.pending),)), VISIBLE, NO_GRANT),
    ("a denied request", Facts(requests=(request(AccessStatus.denied),)), VISIBLE, NO_GRANT),
    ("a revoked grant", Facts(requests=(request(AccessStatus.revoked),)), VISIBLE, NO_GRANT),
    ("a withdrawn request", Facts(requests=(request(AccessStatus.withdrawn),)), VISIBLE, NO_GRANT),
    ("listed, never asked for", Facts(discoverable=True), VISIBLE, NO_GRANT),
    (
        "listed, derived, never asked for: no grant comes first",
        Facts(discoverable=True, unreleased=True),
        VISIBLE,
        NO_GRANT,
    ),
    ("unlisted, never asked for", Facts(), HIDDEN, None),
    ("unlisted, a source of the user's own output", Facts(unreleased=True), HIDDEN, None),
]


@pytest.mark.parametrize(
    ("facts", "footing", "refusal"),
    [row[1:] for row in TABLE],
    ids=[row[0] for row in TABLE],
)
def test_decide_use(facts: Facts, footing: Usability, refusal: str | None) -> None:
    decision = decide_use(facts)
    assert decision == UseDecision(footing, refusal)
    assert decision.allowed == (footing in (OWNER, GRANTED) and refusal is None)
    if not decision.allowed:
        assert decision.status == (404 if footing == HIDDEN else 403)


class Counting:
    """Facts that record what the rule reads: it reads only what it needs."""

    FACTS = ("exists", "owned", "granted", "discoverable", "requested", "unreleased", "ended_grant")

    def __init__(self, **values: object) -> None:
        self.values = values
        self.read: list[str] = []

    def __getattr__(self, name: str) -> object:
        if name not in self.FACTS:
            raise AttributeError(name)
        self.read.append(name)
        return self.values.get(name, None if name == "ended_grant" else False)


@pytest.mark.parametrize(
    ("values", "read"),
    [
        ({"exists": False}, ["exists"]),
        ({"exists": True, "owned": True}, ["exists", "owned", "ended_grant"]),
        (
            {"exists": True, "granted": True},
            ["exists", "owned", "granted", "unreleased"],
        ),
        (
            {"exists": True, "discoverable": True},
            ["exists", "owned", "granted", "discoverable"],
        ),
        (
            {"exists": True},
            ["exists", "owned", "granted", "discoverable", "requested"],
        ),
    ],
)
def test_decide_use_reads_only_what_it_needs(values: dict[str, object], read: list[str]) -> None:
    """An owner's read asks no grant query, a grant holder's no request query."""
    facts = Counting(**values)
    decide_use(facts)  # type: ignore[arg-type]
    assert facts.read == read


def test_expiry_is_a_status_of_its_own() -> None:
    assert status_of(request(AccessStatus.approved, PAST), NOW) == "expired"
    assert status_of(request(AccessStatus.approved, LATER), NOW) == "approved"
    assert status_of(request(AccessStatus.revoked, PAST), NOW) == "revoked"


def allowance(grant: str, clusters: set[str] | None) -> Allowance:
    return Allowance(
        input_id="in",
        dataset_id=f"data-{grant}",
        grant_id=grant,
        clusters=frozenset(clusters) if clusters is not None else None,
    )


# Residency: where usable data may go. (grants' clusters, job clusters, first refusal, allowed)
RESIDENCY: list[tuple[list[Allowance], list[str], tuple[str, str] | None, set[str] | None]] = [
    ([], ["a", "b"], None, None),
    ([allowance("g", None)], ["a", "b"], None, None),
    ([allowance("g", {"a", "b"})], ["a", "b"], None, {"a", "b"}),
    ([allowance("g", {"a"})], ["a", "b"], ("g", "b"), {"a"}),
    ([allowance("g", {"b"})], ["b", "a"], ("g", "a"), {"b"}),
    ([allowance("g", {"a", "b"}), allowance("h", {"b"})], ["a", "b"], ("h", "a"), {"b"}),
    ([allowance("g", {"a"}), allowance("h", {"b"})], ["c"], ("g", "c"), set()),
    ([allowance("g", set())], ["a"], ("g", "a"), set()),
]


@pytest.mark.parametrize(("found", "clusters", "refused", "allowed"), RESIDENCY)
def test_residency(
    found: list[Allowance],
    clusters: list[str],
    refused: tuple[str, str] | None,
    allowed: set[str] | None,
) -> None:
    refusal = refusal_among(found, clusters)
    got = (refusal.grant_id, refusal.cluster) if refusal is not None else None
    assert got == refused
    assert allowed_clusters(found) == (frozenset(allowed) if allowed is not None else None)
