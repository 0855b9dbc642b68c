"""What a role's caller gives it and gets back: `Hooks` in, `RoleResult` out.

`Hooks` carries the caller's callbacks (metrics, cancellation, checkpoints, the
replicas' rendezvous) and the key that seals what the role writes;
`ReportableError` is the one kind of failure whose text reaches the control plane.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from contract.cluster_api import Rendezvous


@dataclass
class Hooks:
    """How the caller follows and steers a role: metrics out, cancellation in."""

    on_metrics: Callable[[int, dict[str, float]], None] | None = None
    should_stop: Callable[[], bool] | None = None
    on_checkpoint: Callable[[int, Path], None] | None = None
    # With replicas in other processes (roles of their own): publish(rendezvous) tells them
    # where to join; None: the role starts its replicas itself, as local processes.
    publish_rendezvous: Callable[[Rendezvous], None] | None = None
    rendezvous_host: str = "127.0.0.1"  # the address other processes reach this one at
    # seals what the role leaves on disk (checkpoints, tokenizer, artifact); None: plain
    checkpoint_key: bytes | None = None

    def metrics(self, step: int, values: dict[str, float]) -> None:
        """Report the metrics of one finished step."""
        if self.on_metrics is not None:
            self.on_metrics(step, values)

    def stop_requested(self) -> bool:
        """Whether the caller asks the role to stop (checked between steps)."""
        return self.should_stop is not None and self.should_stop()

    def checkpointed(self, step: int, path: Path) -> None:
        """Tell the caller a checkpoint was written."""
        if self.on_checkpoint is not None:
            self.on_checkpoint(step, path)


class ReportableError(ValueError):
    """A failure whose message Nebula's code wrote from fixed words and numbers, never from
    data: the one kind of error text a role sends to the control plane (workers/runner.py)."""


@dataclass
class RoleResult:
    """What a role function returns once its loop ends."""

    start_step: int  # the step it resumed from (0: from scratch)
    last_step: int  # the last step it finished
    stopped: bool  # True when cancelled before `steps`
    history: list[dict[str, float]] = field(default_factory=list)  # metrics of each step run
    artifact: Path | None = None  # the role's output file, if it writes one
    extra: dict[str, float] = field(default_factory=dict)
