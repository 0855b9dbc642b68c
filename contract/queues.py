"""The broker's names: one queue per cluster and the one task the control plane sends."""

from __future__ import annotations

RUN_ROLE_TASK = "nebula.run_role"


def queue_for(cluster: str) -> str:
    """The queue a cluster's workers consume."""
    return f"cluster.{cluster}"
