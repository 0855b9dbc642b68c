"""Which queued jobs start now: dominant-resource fairness over each cluster's role slots.

A pure decision (no database, no clock), as h11 keeps its framing decision: the
scheduler (app.jobs.dispatch) reads the queue, the jobs holding slots, each cluster's
capacity and each tenant's `roles_per_cluster`, and writes back what this returns.

Why DRF and not weighted round robin: a job asks for slots on two clusters at once, in
unequal numbers (ELECTRA: 1 generator on one, 1 + n discriminator roles on the other).
Round robin counts turns, so a tenant whose jobs take 16 slots a turn gets 16 times the
share of one whose jobs take 1. DRF counts what each tenant holds: its dominant share is
its largest fraction of any one cluster's slots, and the next job to start is the oldest
of the tenant whose dominant share is smallest. With equal weights, two tenants that
keep a full cluster busy each end up with half of it; a tenant that arrives at a full
cluster gets the first slot that frees, ahead of the queued jobs of one that holds more.

Three more rules:
- Gangs: a job starts with all its roles on every cluster it uses, or not at all, so
  that no half-placed ELECTRA holds slots while it waits for the rest.
- No starvation of large gangs: when the tenant whose turn it is cannot start its job for
  want of free slots, those clusters are reserved for it for this pass: smaller jobs of
  others do not slip in ahead and take the slots as they free.
- A tenant's own limit (`roles_per_cluster`) holds its jobs back without reserving
  anything: its jobs wait, everyone else's go on.

Within a tenant jobs start in submission order (head of line), so the positions a user
sees only move forward.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


@dataclass(frozen=True)
class SlotJob:
    """A job asking for (or holding) role slots: its tenant and slots per cluster."""

    job_id: str
    tenant: str
    demand: Mapping[str, int]  # cluster -> role slots (replicas count as roles)


class WaitKind(StrEnum):
    """Why a job has not started."""

    cluster_full = "cluster_full"  # the cluster's slots are held (or reserved) by others
    tenant_limit = "tenant_limit"  # the tenant's own roles_per_cluster is in use


@dataclass(frozen=True)
class Wait:
    """Why a queued job waits, where, behind how many, and its place in the fair order."""

    kind: WaitKind
    cluster: str
    holders: int  # other jobs holding slots of `cluster`
    position: int  # 1: the next job to start on `cluster`
    limit: int | None = None  # the tenant's roles_per_cluster, for tenant_limit

    def describe(self) -> str:
        """The sentence a user reads: `waiting: slots of cluster-b held by 3 other jobs; ...`."""
        jobs = "job" if self.holders == 1 else "jobs"
        if self.kind == WaitKind.tenant_limit:
            return (
                f"waiting: your {self.limit} role slots of {self.cluster} are held by"
                f" {self.holders} of your jobs; position {self.position}"
            )
        return (
            f"waiting: slots of {self.cluster} held by {self.holders} other {jobs};"
            f" position {self.position}"
        )


@dataclass(frozen=True)
class Decision:
    """The jobs to start now, in order, and why each other one waits."""

    start: tuple[str, ...]
    waiting: Mapping[str, Wait] = field(default_factory=dict)


def _share(held: Mapping[str, int], capacity: Mapping[str, int | None], limit: int) -> float:
    """A tenant's dominant share: its largest fraction of one cluster's slots (DRF)."""
    # an unbounded cluster is measured against the tenant's own limit there
    return max(
        (count / (capacity.get(cluster) or limit) for cluster, count in held.items()),
        default=0.0,
    )


def fair_order(
    *,
    queue: Sequence[SlotJob],
    running: Sequence[SlotJob],
    capacity: Mapping[str, int | None],
    limits: Mapping[str, int],
) -> Decision:
    """Which of `queue` (oldest first) start now, given the slots `running` jobs hold.

    `capacity`: role slots per cluster (None or absent: unbounded); `limits`: each
    tenant's roles_per_cluster (every tenant of `queue` and `running` is in it).
    """
    held: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    holders: dict[str, dict[str, str]] = defaultdict(dict)  # cluster -> job id -> tenant
    used: dict[str, int] = defaultdict(int)

    def take(job: SlotJob) -> None:
        for cluster, slots in job.demand.items():
            held[job.tenant][cluster] += slots
            holders[cluster][job.job_id] = job.tenant
            used[cluster] += slots

    for job in running:
        take(job)
    arrival = {job.job_id: index for index, job in enumerate(queue)}
    lines: dict[str, deque[SlotJob]] = defaultdict(deque)
    for job in queue:
        lines[job.tenant].append(job)

    def turn(tenant: str, shares: Mapping[str, Mapping[str, int]]) -> tuple[float, int]:
        # smallest dominant share first; between equals, the older head job
        return (_share(shares[tenant], capacity, limits[tenant]), arrival[lines[tenant][0].job_id])

    def free(cluster: str) -> float:
        cap = capacity.get(cluster)
        return float("inf") if cap is None else cap - used[cluster]

    start: list[str] = []
    blocked: dict[str, tuple[WaitKind, str]] = {}  # tenant -> why its head job waits, where
    reserved: set[str] = set()
    while True:
        turns = [t for t, line in lines.items() if line and t not in blocked]
        if not turns:
            break
        tenant = min(turns, key=lambda t: turn(t, held))
        job = lines[tenant][0]
        demand = sorted(job.demand.items())
        over_limit = [c for c, n in demand if held[tenant][c] + n > limits[tenant]]
        short = [c for c, n in demand if c in reserved or free(c) < n]
        if over_limit:
            blocked[tenant] = (WaitKind.tenant_limit, over_limit[0])
        elif short:
            blocked[tenant] = (WaitKind.cluster_full, short[0])
            reserved.update(short)
        else:
            lines[tenant].popleft()
            start.append(job.job_id)
            take(job)

    # positions: the order in which DRF would start the waiting jobs if slots freed one
    # job at a time, each start counted in its tenant's share
    shares = {t: dict(held[t]) for t in lines}
    waits: dict[str, Wait] = {}
    behind: dict[str, int] = defaultdict(int)  # cluster -> waiting jobs placed in order
    while any(lines.values()):
        tenant = min((t for t, line in lines.items() if line), key=lambda t: turn(t, shares))
        job = lines[tenant].popleft()
        for cluster, slots in job.demand.items():
            shares[tenant][cluster] = shares[tenant].get(cluster, 0) + slots
        kind, cluster = blocked.get(tenant, (WaitKind.cluster_full, min(job.demand)))
        if cluster not in job.demand:  # behind its own head job, which waits elsewhere
            cluster = min(job.demand)
        behind[cluster] += 1
        on_cluster = holders[cluster]
        mine = kind == WaitKind.tenant_limit
        waits[job.job_id] = Wait(
            kind=kind,
            cluster=cluster,
            holders=sum(1 for owner in on_cluster.values() if owner == tenant)
            if mine
            else len(on_cluster),
            position=behind[cluster],
            limit=limits[tenant] if mine else None,
        )
    return Decision(start=tuple(start), waiting=waits)
