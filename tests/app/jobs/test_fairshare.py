"""The fair-order decision (DRF over role slots) as a table: queue and holdings in, starts
and waits out."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.jobs.fairshare import SlotJob, WaitKind, fair_order


def job(job_id: str, **demand: int) -> SlotJob:
    """`a1` is tenant a's job; demand by cluster, dashes written as underscores."""
    return SlotJob(
        job_id=job_id, tenant=job_id[0], demand={k.replace("_", "-"): v for k, v in demand.items()}
    )


@dataclass(frozen=True)
class Case:
    name: str
    queue: list[SlotJob]
    running: list[SlotJob]
    capacity: dict[str, int | None]
    start: tuple[str, ...]
    # job -> (kind, cluster, holders, position)
    waits: dict[str, tuple[WaitKind, str, int, int]]
    limit: int = 16


FULL, LIMIT = WaitKind.cluster_full, WaitKind.tenant_limit

CASES = [
    Case(
        "an empty cluster starts jobs oldest first until it is full",
        queue=[job("a1", cluster_b=1), job("a2", cluster_b=1), job("a3", cluster_b=1)],
        running=[],
        capacity={"cluster-b": 2},
        start=("a1", "a2"),
        waits={"a3": (FULL, "cluster-b", 2, 1)},
    ),
    Case(
        "tenant b, holding nothing, is next on a full cluster, ahead of a's older jobs",
        queue=[job("a3", cluster_b=1), job("a4", cluster_b=1), job("b1", cluster_b=1)],
        running=[job("a1", cluster_b=1), job("a2", cluster_b=1)],
        capacity={"cluster-b": 2},
        start=(),
        waits={
            "b1": (FULL, "cluster-b", 2, 1),
            "a3": (FULL, "cluster-b", 2, 2),
            "a4": (FULL, "cluster-b", 2, 3),
        },
    ),
    Case(
        "the first slot that frees goes to b, not to a's queued jobs",
        queue=[job("a3", cluster_b=1), job("a4", cluster_b=1), job("b1", cluster_b=1)],
        running=[job("a2", cluster_b=1)],
        capacity={"cluster-b": 2},
        start=("b1",),
        waits={"a3": (FULL, "cluster-b", 2, 1), "a4": (FULL, "cluster-b", 2, 2)},
    ),
    Case(
        "equal tenants share a full cluster half and half",
        queue=[job(f"a{i}", cluster_b=1) for i in range(4)]
        + [job(f"b{i}", cluster_b=1) for i in range(4)],
        running=[],
        capacity={"cluster-b": 4},
        start=("a0", "b0", "a1", "b1"),
        waits={
            "a2": (FULL, "cluster-b", 4, 1),
            "b2": (FULL, "cluster-b", 4, 2),
            "a3": (FULL, "cluster-b", 4, 3),
            "b3": (FULL, "cluster-b", 4, 4),
        },
    ),
    Case(
        "a gang that does not fit starts nothing and holds nothing",
        queue=[job("e1", cluster_a=1, cluster_b=3)],
        running=[job("x1", cluster_b=2)],
        capacity={"cluster-a": None, "cluster-b": 4},
        start=(),
        waits={"e1": (FULL, "cluster-b", 1, 1)},
    ),
    Case(
        "a waiting gang reserves its cluster: a smaller later job of another tenant waits",
        queue=[job("e1", cluster_a=1, cluster_b=3), job("s1", cluster_b=1)],
        running=[job("x1", cluster_b=2)],
        capacity={"cluster-a": None, "cluster-b": 4},
        start=(),
        waits={"e1": (FULL, "cluster-b", 1, 1), "s1": (FULL, "cluster-b", 1, 2)},
    ),
    Case(
        "the whole gang starts at once when it fits",
        queue=[job("e1", cluster_a=1, cluster_b=3)],
        running=[job("x1", cluster_b=1)],
        capacity={"cluster-a": None, "cluster-b": 4},
        start=("e1",),
        waits={},
    ),
    Case(
        "a tenant at its own limit waits and reserves nothing: others go on",
        queue=[job("a3", cluster_b=1), job("b1", cluster_b=1)],
        running=[job("a1", cluster_b=1), job("a2", cluster_b=1)],
        capacity={"cluster-b": 8},
        limit=2,
        start=("b1",),
        waits={"a3": (LIMIT, "cluster-b", 2, 1)},
    ),
    Case(
        "an unbounded cluster starts everything within the tenants' limits",
        queue=[job("a1", cluster_a=1, cluster_b=1), job("a2", cluster_a=1, cluster_b=1)],
        running=[],
        capacity={},
        start=("a1", "a2"),
        waits={},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fair_order(case: Case) -> None:
    tenants = {j.tenant for j in case.queue + case.running}
    decision = fair_order(
        queue=case.queue,
        running=case.running,
        capacity=case.capacity,
        limits={t: case.limit for t in tenants},
    )
    assert decision.start == case.start
    assert {
        job_id: (w.kind, w.cluster, w.holders, w.position) for job_id, w in decision.waiting.items()
    } == case.waits


def test_the_reason_reads_as_the_user_sees_it() -> None:
    decision = fair_order(
        queue=[job("a4", cluster_b=1), job("a5", cluster_b=1)],
        running=[job("c1", cluster_b=1), job("d1", cluster_b=1), job("e1", cluster_b=1)],
        capacity={"cluster-b": 3},
        limits={t: 16 for t in "acde"},
    )
    assert decision.waiting["a5"].describe() == (
        "waiting: slots of cluster-b held by 3 other jobs; position 2"
    )
    limited = fair_order(
        queue=[job("a2", cluster_b=1)],
        running=[job("a1", cluster_b=1)],
        capacity={"cluster-b": 3},
        limits={"a": 1},
    )
    assert limited.waiting["a2"].describe() == (
        "waiting: your 1 role slots of cluster-b are held by 1 of your jobs; position 1"
    )
