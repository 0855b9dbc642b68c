"""A link shaper: a rate limit and an added delay, to play a WAN on one machine."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from workers.switch.protocol import Buffer

CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class ShaperConfig:
    """Rate in Mbit/s (None: unlimited) and one-way delay in milliseconds."""

    rate_mbit: float | None = None
    delay_ms: float = 0.0

    @property
    def shapes(self) -> bool:
        """Whether it changes anything: a rate, or a delay (a config of neither passes
        frames as they come, and they may skip the writer thread that keeps them)."""
        return self.rate_mbit is not None or self.delay_ms > 0


class Shaper:
    """Paces bytes to `rate_mbit` with a token bucket and holds frames back by `delay_ms`."""

    def __init__(
        self,
        config: ShaperConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.config = config
        self._clock = clock
        self._sleep = sleep
        self._bytes_per_s = None if config.rate_mbit is None else config.rate_mbit * 1e6 / 8
        self._burst = CHUNK_BYTES
        self._tokens = float(self._burst)
        self._last = clock()

    def hold(self, enqueued_at: float) -> None:
        """Wait until a frame queued at `enqueued_at` has spent the added delay."""
        due = enqueued_at + self.config.delay_ms / 1000
        now = self._clock()
        if due > now:
            self._sleep(due - now)

    def pace(self, nbytes: int) -> None:
        """Wait until the bucket holds `nbytes` tokens, then spend them."""
        if self._bytes_per_s is None:
            return
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._bytes_per_s)
        self._last = now
        self._tokens -= nbytes
        if self._tokens < 0:
            self._sleep(-self._tokens / self._bytes_per_s)

    def chunks(self, buffers: list[Buffer]) -> Iterator[memoryview]:
        """The buffers cut into paced chunks (whole buffers when the rate is unlimited)."""
        for buffer in buffers:
            view = memoryview(buffer).cast("B")
            if self._bytes_per_s is None:
                yield view
                continue
            for start in range(0, len(view), CHUNK_BYTES):
                piece = view[start : start + CHUNK_BYTES]
                self.pace(len(piece))
                yield piece
