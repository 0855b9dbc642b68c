"""Where a discriminator's replicas join its process group (plain data, no torch)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rendezvous:
    """Where a discriminator's replicas join its process group, and what they must know."""

    address: str  # host:port of rank 0's store
    world_size: int
    vocab_size: int
    start_step: int  # the checkpoint step to resume from (0: from scratch)
