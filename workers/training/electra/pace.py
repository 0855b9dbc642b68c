"""How far the generator may run ahead of the discriminator: `max_lag`, fixed or `auto`.

G may compute step k while k - (D's last synced step) <= lag. After D finishes step j
its sync takes one way of the link to G, G computes step j + lag (`g` seconds) and the
batch takes the other way to D, while D works through steps j+1 .. j+lag-1. D never
waits for a batch when that round trip fits in those lag - 1 steps:

    rtt + g <= (lag - 1) * d      so      lag = ceil((rtt + g) / d) + 1

With `max_lag: auto` the generator measures all three as training runs and recomputes
the lag after every sync (`AutoLag`): `g` its own step, `d` and the round trip from
what D's sync says (`StepSync.step_s`, the seconds D held the step's last batch before
its sync went out, and `StepSync.waited_s`, how long D waited for that batch). A round
trip is the time from G handing the step's last batch to its sender to the step's sync
coming back, less the seconds D held the batch. It is measured only on a step for which
both ends waited, D for the batch and G for the sync: a batch that queued at D, or a sync
that queued at G while G computed, would add its queueing time to the link's. Until one
such step is seen (neither waits: the lag is long enough, or G is the slower role) the
lag stays where it is, 2 to begin with, the fixed default.

The cap bounds what the lead may cost: G's batches in flight (at most cap x
n_discriminators messages queued at D) and the checkpoints, since a generator more
than (keep_checkpoints - 1) x ckpt_every steps ahead could hold no checkpoint of a step
D also holds, and a restart would begin again from step 0.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

AUTO = "auto"
DEFAULT_LAG = 2  # the fixed default, and where `auto` starts before it has measured
AUTO_LAG_CAP = 16  # batches in flight per discriminator replica, at most
WAITED_S = 0.001  # D waited for a batch when its recv blocked longer than this
WINDOW = 16  # the last measurements each figure is the median of


def lead_for(rtt_s: float, generator_step_s: float, discriminator_step_s: float, cap: int) -> int:
    """The lag at which D need not wait for G's batches: ceil((rtt + g) / d) + 1, in 1..cap."""
    if discriminator_step_s <= 0:
        return cap
    need = math.ceil((rtt_s + generator_step_s) / discriminator_step_s) + 1
    return max(1, min(cap, need))


def auto_lag_cap(ckpt_every: int, keep_checkpoints: int) -> int:
    """The largest lag `auto` chooses: AUTO_LAG_CAP, and never past what the kept
    checkpoints of both roles still have in common."""
    return max(1, min(AUTO_LAG_CAP, (keep_checkpoints - 1) * ckpt_every))


@dataclass
class AutoLag:
    """G's measurements and the lag they give (see the module docstring)."""

    cap: int
    lag: int = DEFAULT_LAG
    rtt_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    generator_step_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))
    discriminator_step_s: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def __post_init__(self) -> None:
        self.lag = max(1, min(self.cap, self.lag))

    def generator_stepped(self, seconds: float) -> None:
        """G computed one step (all its micro-batches and the optimizer step) in `seconds`."""
        self.generator_step_s.append(seconds)

    def synced(
        self,
        sent_at: float,
        received_at: float,
        generator_waited_s: float,
        step_s: float,
        discriminator_waited_s: float,
    ) -> int:
        """A sync came back: the step's last batch left G at `sent_at` and its sync arrived
        at `received_at`, after G had waited `generator_waited_s` for it (G's clock); D
        held the batch `step_s` and had waited `discriminator_waited_s` for it (D's
        figures). Returns the lag to keep to from now on."""
        self.discriminator_step_s.append(step_s)
        if min(generator_waited_s, discriminator_waited_s) > WAITED_S:
            self.rtt_s.append(max(0.0, received_at - sent_at - step_s))
        if self.rtt_s and self.generator_step_s:
            self.lag = lead_for(
                statistics.median(self.rtt_s),
                statistics.median(self.generator_step_s),
                statistics.median(self.discriminator_step_s),
                self.cap,
            )
        return self.lag

    def metrics(self) -> dict[str, float]:
        """What the job reports of the choice: the lag and the medians it rests on."""
        out = {"max_lag": float(self.lag)}
        if self.rtt_s:
            out["lag.rtt_s"] = statistics.median(self.rtt_s)
        if self.discriminator_step_s:
            out["lag.discriminator_step_s"] = statistics.median(self.discriminator_step_s)
        if self.generator_step_s:
            out["lag.generator_step_s"] = statistics.median(self.generator_step_s)
        return out
