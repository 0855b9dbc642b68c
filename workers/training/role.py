"""The skeleton every two-sided training role follows, and the sync ELECTRA's roles send.

A role of a split job (ELECTRA's generator or discriminator, ABNet's encoder or
decoder) goes through the same stages around its own step:

1. hello: exchange a JSON description with the peer role (`RoleLoop.hello`),
2. peer check: the peer is the expected role and was given the same config and
   seed (and whatever else both must agree on),
3. resume: from the newest step both hold a checkpoint of (`RoleLoop.resume`),
4. step: `for k in loop.steps(): ...`, which ends early when the caller asks the
   role to stop (`loop.cancelled`) or the peer did (`loop.peer_stopped()`),
5. checkpoint: every `ckpt_every` steps and at the last one (`loop.finished`),
6. metrics: to the caller's hooks and the result's history (`loop.report`), and
   an evaluation's figures when one is due (`loop.eval_due(k)`, `loop.report_eval`).

`RoleLoop` holds the role's `CheckpointStore` and `RoleResult`; what a step
computes and sends stays in the role function, which reads top to bottom::

    loop = RoleLoop.of("my-role", cfg, link, hooks, ckpt_dir, channel=HELLO)
    peer = loop.hello({"config": asdict(cfg), "seed": seed}, peer_role="other-role")
    loop.resume(lambda tensors, meta: restore_training_state(tensors, meta, ...))
    for k in loop.steps():
        ...  # compute, send, receive
        loop.finished(k, lambda: training_state(...))
        loop.report(k, {"loss": ...})
    return loop.result

A role its peer drives (ABNet's decoder serves each step the encoder sends, until
the encoder's stop) does not iterate `steps()`: it checks each step it is sent
against `loop.next_step`, passes its caller's stop on to the peer when
`loop.stop_requested()`, and ends with `loop.served()`.

`StepSync` is the small message ELECTRA's discriminator sends after each optimizer
step (its step, its loss and accuracy, whether it stops there); it crosses as a
float32 tensor of four numbers, 16 bytes, or of six, 24 bytes, with the two timings
`max_lag: auto` measures the link by (workers/training/electra/pace.py). ABNet's
decoder sends its own, with the figures of its metrics (workers/training/abnet/wire.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from workers.switch.link import Link, Payload
from workers.training.checkpoints import CheckpointStore, resume_step
from workers.training.hooks import Hooks, RoleResult
from workers.training.messages import hello

TrainingState = tuple[dict[str, torch.Tensor], dict[str, Any]]


@dataclass(frozen=True)
class StepSync:
    """What the second role reports after its optimizer step `step`."""

    step: int
    loss: float
    accuracy: float
    stop: bool = False  # the role stops after this step (its caller asked it to)
    # with `max_lag: auto` only: seconds the role held the step's last batch before this
    # sync left, and seconds it waited for that batch (None: not measured, not sent)
    step_s: float | None = None
    waited_s: float | None = None

    def to_payload(self) -> torch.Tensor:
        """Four float32 numbers (a step is exact up to 2**24), six with the timings."""
        numbers = [float(self.step), self.loss, self.accuracy, float(self.stop)]
        if self.step_s is not None:
            numbers += [self.step_s, self.waited_s or 0.0]
        return torch.tensor(numbers)

    @classmethod
    def from_payload(cls, payload: Payload) -> StepSync:
        """What `to_payload` sent; anything else is an error."""
        if not isinstance(payload, torch.Tensor) or payload.shape not in ((4,), (6,)):
            raise ValueError("expected a sync tensor of four or six numbers from the peer role")
        step, loss, accuracy, stop, *timings = (float(x) for x in payload)
        if timings and not all(0.0 <= t < float("inf") for t in timings):
            raise ValueError("a sync's timings must be finite seconds")
        step_s, waited_s = timings if timings else (None, None)
        return cls(int(step), loss, accuracy, stop > 0, step_s, waited_s)


def check_peer(
    peer: Mapping[str, Any],
    mine: Mapping[str, Any],
    role: str,
    same: Sequence[str] = ("config", "seed"),
    what: str = "roles",
) -> None:
    """Refuse a peer that is not `role` or disagrees with this role on any key of `same`."""
    if peer.get("role") != role:
        raise ValueError(f"expected the {role} role at the other end, got {peer.get('role')!r}")
    if any(peer.get(key) != mine.get(key) for key in same):
        differ = " or ".join(f"{key}s" for key in same)
        raise ValueError(f"the two {what} were given different {differ}")


class LoopConfig(Protocol):
    """What `RoleLoop.of` reads of a scenario's config (`ElectraConfig`, `AbnetConfig`)."""

    @property
    def steps(self) -> int: ...
    @property
    def ckpt_every(self) -> int: ...
    @property
    def keep_checkpoints(self) -> int: ...
    @property
    def recv_timeout_s(self) -> float: ...


class RoleLoop:
    """Hello, peer check, resume, the step loop, checkpoints and metrics of one role."""

    def __init__(
        self,
        role: str,
        link: Link,
        hooks: Hooks,
        ckpt_dir: Path,
        steps: int,
        *,
        channel: str,
        ckpt_every: int,
        keep_checkpoints: int,
        timeout_s: float,
        eval_every: int = 0,
    ) -> None:
        self.role, self.link, self.hooks, self.channel = role, link, hooks, channel
        self.total, self.ckpt_every, self.timeout_s = steps, ckpt_every, timeout_s
        self.eval_every = eval_every
        self.store = CheckpointStore(ckpt_dir, keep=keep_checkpoints, key=hooks.checkpoint_key)
        self.result = RoleResult(start_step=0, last_step=0, stopped=False)
        self.peer: dict[str, Any] = {}
        self.cancelled = False  # the caller asked this role to stop (never with the peer)
        self._peer_stopped = False

    @classmethod
    def of(
        cls,
        role: str,
        cfg: LoopConfig,
        link: Link,
        hooks: Hooks,
        ckpt_dir: Path,
        *,
        channel: str,
        eval_every: int = 0,
    ) -> RoleLoop:
        """The loop of `role` with the steps, checkpoint and timeout settings of `cfg`."""
        return cls(
            role,
            link,
            hooks,
            ckpt_dir,
            cfg.steps,
            channel=channel,
            ckpt_every=cfg.ckpt_every,
            keep_checkpoints=cfg.keep_checkpoints,
            timeout_s=cfg.recv_timeout_s,
            eval_every=eval_every,
        )

    def hello(
        self,
        mine: Mapping[str, Any],
        *,
        peer_role: str,
        same: Sequence[str] = ("config", "seed"),
        what: str = "roles",
    ) -> dict[str, Any]:
        """Exchange hellos (this role's name and checkpoints added) and check the peer."""
        full = {"role": self.role, **mine, "checkpoints": self.store.steps()}
        self.peer = hello(self.link, self.channel, full, self.timeout_s)
        check_peer(self.peer, full, peer_role, same, what)
        return self.peer

    def resume(self, restore: Callable[[dict[str, torch.Tensor], dict[str, Any]], None]) -> int:
        """Load the newest checkpoint both roles hold into `restore`; the step (0: none)."""
        start = resume_step(self.store.steps(), self.peer.get("checkpoints", []))
        if start:
            tensors, meta = self.store.load(start)
            restore(tensors, meta)
        self.result.start_step = self.result.last_step = start
        return start

    def steps(self) -> Iterator[int]:
        """The steps still to run; ends early when the caller or the peer stops the role."""
        for k in range(self.result.start_step + 1, self.total + 1):
            if self._peer_stopped:
                return
            if self.stop_requested():
                self.result.stopped = True
                return
            yield k

    def stop_requested(self) -> bool:
        """Whether the caller has asked this role to stop; once asked, always (`cancelled`)."""
        self.cancelled = self.cancelled or self.hooks.stop_requested()
        return self.cancelled

    @property
    def next_step(self) -> int:
        """The step to run next: the one after the last finished."""
        return self.result.last_step + 1

    def served(self) -> RoleResult:
        """For a role its peer drives, once the peer stopped: stopped if short of `steps`."""
        self.result.stopped = self.result.last_step < self.total
        return self.result

    def peer_stopped(self) -> None:
        """The peer ends the job: no further step is run."""
        self._peer_stopped = self.result.stopped = True

    @property
    def stopped_by_peer(self) -> bool:
        """Whether `peer_stopped` was called."""
        return self._peer_stopped

    def finished(self, step: int, state: Callable[[], TrainingState]) -> None:
        """Step `step` is done: checkpoint `state()` every `ckpt_every` steps and at the end."""
        self.result.last_step = step
        if self.checkpoint_due(step):
            tensors, meta = state()
            self.hooks.checkpointed(step, self.store.save(step, tensors, {**meta, "step": step}))

    def checkpoint_due(self, step: int) -> bool:
        """Whether `finished(step)` checkpoints: every `ckpt_every` steps and the last."""
        return step % self.ckpt_every == 0 or step == self.total

    def report(self, step: int, metrics: dict[str, float]) -> None:
        """The metrics of step `step`: into the result's history and out to the caller."""
        self.result.history.append(metrics)
        self.hooks.metrics(step, metrics)

    def eval_due(self, step: int) -> bool:
        """Whether an evaluation follows step `step`: every `eval_every` steps and the last."""
        return step == self.total or (self.eval_every > 0 and step % self.eval_every == 0)

    def report_eval(self, step: int, metrics: dict[str, float]) -> None:
        """An evaluation's figures after step `step`: into that step's history entry (the
        last) and the result's `extra`, and out to the caller."""
        self.result.extra.update(metrics)
        if self.result.history:
            self.result.history[-1].update(metrics)
        self.hooks.metrics(step, metrics)
