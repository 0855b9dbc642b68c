"""What a worker process knows about its cluster, set once by `nebula worker`.

Celery's prefork pool forks after `set_side`, so the pool processes inherit it.
"""

from __future__ import annotations

# where a cluster host keeps its files, defined beside the bundle folder's layout
from workers.bundle import credential_path as credential_path
from workers.bundle import switch_state_path as switch_state_path
from workers.runner import ClusterSide

_side: ClusterSide | None = None


def set_side(side: ClusterSide) -> None:
    """Tell this process which cluster it serves (before the pool forks)."""
    global _side
    _side = side


def current_side() -> ClusterSide:
    """The cluster side this worker serves."""
    if _side is None:
        raise RuntimeError("this process is not a Nebula worker (start it with `nebula worker`)")
    return _side


def main_pid() -> int:
    """The worker's main process (the pool's parent), to stop the whole worker."""
    return current_side().main_pid
