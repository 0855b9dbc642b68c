"""The discriminator's data-parallel replicas inside its cluster (Scenario-I, n > 1).

The root discriminator (the role that talks to the generator) is replica 0.
Its replicas 1..n-1 run either as roles of their own (each a task in a worker
process of the cluster, which joins at the rendezvous the root publishes through
its hooks: `run_discriminator_replica`) or, without a publisher, as local processes
it starts itself. They join a torch.distributed process group (gloo on CPU, nccl
on GPU) and the root drives them
with a broadcast `ReplicaControl` per action (a `ReplicaCommand` and a step):
train on the micro-batch scattered to you, hand over your dropout stream for a
checkpoint, compare weights, stop.
Gradients are averaged with one all-reduce, after which every replica holds
the same bits and takes the same optimizer step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from enum import IntEnum
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from contract.cluster_api import Rendezvous
from workers.ports import free_port
from workers.training.checkpoints import CheckpointStore, restore_training_state
from workers.training.electra.config import ElectraConfig
from workers.training.electra.model import CorruptedBatch
from workers.training.electra.sides import DiscriminatorSide
from workers.training.hooks import Hooks, RoleResult


class ReplicaCommand(IntEnum):
    """What the root tells every replica to do next."""

    STOP = 0  # leave the process group
    TRAIN = 1  # train on the micro-batch scattered to you, then take the optimizer step
    GATHER_RNG = 2  # hand over your dropout stream (the root checkpoints it)
    COMPARE_WEIGHTS = 3  # hand over your weights (the root compares them with its own)


@dataclass(frozen=True)
class ReplicaControl:
    """One broadcast from the root: a command and the step it belongs to."""

    command: ReplicaCommand
    step: int = 0

    def broadcast(self, device: str) -> None:
        """Root (rank 0): send it to every replica (two int64 numbers)."""
        dist.broadcast(torch.tensor([int(self.command), self.step], device=device), 0)

    @classmethod
    def receive(cls, device: str) -> ReplicaControl:
        """Replica: wait for the root's next control."""
        words = torch.zeros(2, dtype=torch.long, device=device)
        dist.broadcast(words, 0)
        return cls(ReplicaCommand(int(words[0])), int(words[1]))


class ReplicaGroup:
    """The root's view of the n discriminator replicas (n = 1: no process group at all)."""

    def __init__(self, n: int, device: str) -> None:
        self.n = n
        self.device = "cuda:0" if device.startswith("cuda") and n > 1 else device

    def train_step(
        self, side: DiscriminatorSide, step: int, batches: list[CorruptedBatch]
    ) -> tuple[float, float, int]:
        """Train every replica on its micro-batch and average the gradients."""
        if self.n == 1:
            return side.train_micro(batches[0])
        ReplicaControl(ReplicaCommand.TRAIN, step).broadcast(self.device)
        ids = torch.empty_like(batches[0].ids, device=self.device)
        replaced = torch.empty(ids.shape, dtype=torch.uint8, device=self.device)
        dist.scatter(ids, [b.ids.to(self.device) for b in batches], src=0)
        dist.scatter(replaced, [b.replaced.to(self.device, torch.uint8) for b in batches], src=0)
        return _replica_train(side, CorruptedBatch(ids, replaced.bool()), self.n)

    def gather_rng(self, side: DiscriminatorSide) -> dict[str, torch.Tensor]:
        """Every replica's dropout stream, for the root's checkpoint."""
        if self.n == 1:
            return {}
        ReplicaControl(ReplicaCommand.GATHER_RNG).broadcast(self.device)
        states = _all_gather_rng(side, self.n)
        return {f"rng.dropout.rank{r}": s for r, s in enumerate(states)}

    def restore_rng(self, tensors: dict[str, torch.Tensor], side: DiscriminatorSide) -> None:
        """Rank 0's own dropout stream (replicas read theirs from the same file)."""
        if self.n > 1:
            side.rng_dropout.set_state(tensors["rng.dropout.rank0"])

    def replica_max_abs_diff(self, side: DiscriminatorSide) -> float:
        """Largest difference between any replica's weights and the root's (0.0 when n = 1)."""
        if self.n == 1:
            return 0.0
        ReplicaControl(ReplicaCommand.COMPARE_WEIGHTS).broadcast(self.device)
        flat = _flat_params(side.model)
        gathered = [torch.empty_like(flat) for _ in range(self.n)]
        dist.all_gather(gathered, flat)
        return max(float((g - flat).abs().max()) for g in gathered)


def _flat_params(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _all_gather_rng(side: DiscriminatorSide, n: int) -> list[torch.Tensor]:
    state = side.rng_dropout.get_state().to(side.device)
    states = [torch.empty_like(state) for _ in range(n)]
    dist.all_gather(states, state)
    return [s.cpu() for s in states]


def _replica_train(
    side: DiscriminatorSide, batch: CorruptedBatch, n: int
) -> tuple[float, float, int]:
    """One replica's share of a step: local gradient, then the average over replicas."""
    loss, acc, tokens = side.train_micro(batch)
    grads = [p.grad for p in side.model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)  # ring all-reduce: every replica ends with the same bits
    flat /= n
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
    stats = torch.tensor([loss, acc, float(tokens)], dtype=torch.float64, device=side.device)
    dist.all_reduce(stats)
    return float(stats[0]) / n, float(stats[1]) / n, int(stats[2])


@contextlib.contextmanager
def discriminator_replicas(
    cfg: ElectraConfig,
    seed: int,
    device: str,
    store: CheckpointStore,
    vocab_size: int,
    start: int,
    hooks: Hooks | None = None,
) -> Iterator[ReplicaGroup]:
    """Join replicas 1..n-1 in a process group with the root (rank 0).

    With `hooks.publish_rendezvous`, the replicas are other processes that join at the
    published address; otherwise they are started here as local processes.
    """
    n = cfg.n_discriminators
    group = ReplicaGroup(n, device)
    if n == 1:
        yield group
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    publish = hooks.publish_rendezvous if hooks is not None else None
    host = hooks.rendezvous_host if hooks is not None else "127.0.0.1"
    address = f"{host}:{free_port(host)}"
    init = f"tcp://{address}"
    procs = []
    if publish is not None:
        publish(Rendezvous(address=address, world_size=n, vocab_size=vocab_size, start_step=start))
    else:
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(
                target=_replica_main,
                args=(rank, n, backend, init, asdict(cfg), seed, device, str(store.directory)),
                kwargs={
                    "vocab_size": vocab_size,
                    "start": start,
                    "threads": torch.get_num_threads(),
                    "key": store.key,
                },
                daemon=True,
            )
            for rank in range(1, n)
        ]
        for p in procs:
            p.start()
    timeout = timedelta(seconds=cfg.recv_timeout_s)
    dist.init_process_group(backend, init_method=init, rank=0, world_size=n, timeout=timeout)
    try:
        yield group
        ReplicaControl(ReplicaCommand.STOP).broadcast(group.device)
    finally:
        dist.destroy_process_group()
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise RuntimeError(f"discriminator replicas exited with {bad}")


def run_discriminator_replica(
    cfg: ElectraConfig,
    rank: int,
    rendezvous: Rendezvous,
    ckpt_dir: Path,
    *,
    seed: int = 0,
    device: str = "cpu",
    key: bytes | None = None,
) -> RoleResult:
    """Replica `rank` as a role of its own: join the root's group, train until it says stop.

    It resumes from the root's checkpoint folder, which the cluster's workers share.
    """
    if not 1 <= rank < rendezvous.world_size or rendezvous.world_size != cfg.n_discriminators:
        raise ValueError(
            f"replica {rank} does not fit a group of {rendezvous.world_size} "
            f"({cfg.n_discriminators} discriminators configured)"
        )
    backend = "nccl" if device.startswith("cuda") else "gloo"
    _replica_main(
        rank,
        rendezvous.world_size,
        backend,
        f"tcp://{rendezvous.address}",
        asdict(cfg),
        seed,
        device,
        str(ckpt_dir),
        vocab_size=rendezvous.vocab_size,
        start=rendezvous.start_step,
        threads=torch.get_num_threads(),
        key=key,
    )
    return RoleResult(start_step=rendezvous.start_step, last_step=0, stopped=False)


def _replica_main(
    rank: int,
    n: int,
    backend: str,
    init: str,
    cfg_dict: dict[str, Any],
    seed: int,
    device: str,
    ckpt_dir: str,
    *,
    vocab_size: int,
    start: int,
    threads: int,
    key: bytes | None = None,
) -> None:
    """Replica `rank` of the discriminator: trains on what the root scatters, until told to stop."""
    torch.set_num_threads(threads)
    cfg = ElectraConfig.from_dict(cfg_dict)
    dev = f"cuda:{rank}" if device.startswith("cuda") else device
    timeout = timedelta(seconds=cfg.recv_timeout_s)
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=n, timeout=timeout)
    try:
        side = DiscriminatorSide(cfg, vocab_size, seed, dev, rank=rank)
        if start:
            tensors, meta = CheckpointStore(Path(ckpt_dir), key=key).load(start)
            restore_training_state(tensors, meta, side.model, side.opt, {})
            side.rng_dropout.set_state(tensors[f"rng.dropout.rank{rank}"])
        while (control := ReplicaControl.receive(dev)).command != ReplicaCommand.STOP:
            if control.command == ReplicaCommand.TRAIN:
                B, T = cfg.batch_size, cfg.seq_len
                ids = torch.empty(B, T, dtype=torch.long, device=dev)
                replaced = torch.empty(B, T, dtype=torch.uint8, device=dev)
                dist.scatter(ids, None, src=0)
                dist.scatter(replaced, None, src=0)
                _replica_train(side, CorruptedBatch(ids, replaced.bool()), n)
                side.step(control.step)
            elif control.command == ReplicaCommand.GATHER_RNG:
                _all_gather_rng(side, n)
            elif control.command == ReplicaCommand.COMPARE_WEIGHTS:
                flat = _flat_params(side.model)
                dist.all_gather([torch.empty_like(flat) for _ in range(n)], flat)
    finally:
        dist.destroy_process_group()
